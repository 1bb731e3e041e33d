//! The lease table: per subject, the rate this instance sees, the lease it holds and
//! the denial it keeps, in shards of their own lock. What a check with leases decides
//! here, without the store, is [`LeaseTable::try_local`].

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use super::flight::{self, Answer, Asker, Waiter};
use super::plan::Plan;
use crate::clock::{Clock, LocalMs, MonotonicClock, StoreMs};
use crate::decision::{Decision, Origin};
use crate::limiter::kept::KeptDenial;
use crate::store::{GiveBack, GiveBackFuture, LeaseAsk, LeaseStore, PolicySet};
use crate::subject::Subject;

/// What [`LeaseTable::try_local`] decided.
pub(crate) enum Local {
    /// Admitted from a lease, or denied from a kept denial: no store call.
    Decided(Decision),
    /// Ask the store with a leasing check ([`LeaseTable::ask`]); the subject's other
    /// requests wait for this asker's answer meanwhile.
    Ask(LeaseAsk, Asker<Answer>),
    /// Another request's leasing check is in flight: wait for its answer
    /// ([`LeaseTable::after_wait`]).
    Wait(Waiter<Answer>),
    /// Check as without leases.
    Plain,
}

/// How a check with leases goes on ([`LeaseTable::check`]).
pub(crate) enum Leased {
    /// Admitted from a lease, or denied from a kept denial: no store call.
    Decided(Decision),
    /// A leasing check, or a wait for the one in flight.
    Pending(DecisionFuture),
    /// Check as without leases.
    Plain,
}

/// A decision on its way from the lease table.
pub(crate) type DecisionFuture = GiveBackFuture;

/// The leases and rates of one limiter's subjects, shared by its clones.
pub(crate) struct LeaseTable {
    pub(super) plan: Plan,
    pub(super) set: PolicySet,
    pub(super) source: Arc<dyn LeaseStore>,
    /// The limiter's local clock: rates and idle times.
    clock: Arc<dyn Clock>,
    /// What leases and kept denials are timed on: the clock the store decides on
    /// ([`LeaseStore::lease_clock`]), or for a store with its own (Redis `TIME`) a
    /// monotonic clock, which runs as it does. A lease ends at the time its call was
    /// sent plus the time the store said was left of its window, so a local clock that
    /// runs slow or steps back cannot carry its units into the store's next window.
    pub(super) store_clock: Arc<dyn Clock>,
    /// Picks a subject's shard.
    hash: foldhash::fast::RandomState,
    pub(super) shards: Box<[Mutex<Shard>]>,
    /// Whether the sweeper task runs (started with the first subject tracked, on its
    /// runtime).
    pub(super) sweeping: AtomicBool,
}

impl fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseTable")
            .field("plan", &self.plan)
            .field("subjects", &self.len())
            .finish_non_exhaustive()
    }
}

pub(super) const SHARDS: usize = 16;

/// One shard's subjects, and when a full shard last made room.
#[derive(Debug, Default)]
pub(super) struct Shard {
    map: HashMap<Subject, Entry, foldhash::fast::RandomState>,
    pub(super) pruned_at: Option<LocalMs>,
}

impl Deref for Shard {
    type Target = HashMap<Subject, Entry, foldhash::fast::RandomState>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl DerefMut for Shard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

/// One subject on this instance.
#[derive(Debug)]
pub(super) struct Entry {
    /// Start of the current rate period (one lifetime long), local ms.
    period_start: LocalMs,
    /// Units asked in the current period and in the one before it.
    this_period: u64,
    last_period: u64,
    /// When the subject was last asked for, local ms.
    pub(super) last_seen: LocalMs,
    /// The leasing check in flight, if any: the subject's other requests wait for its
    /// answer here instead of asking too. Left behind by an asker that was dropped, it
    /// is closed, and counts as none.
    pub(super) flight: Option<Waiter<Answer>>,
    pub(super) lease: Option<Lease>,
    /// A leasing check the store denied, kept until the cost and a batch fit (on the
    /// store's clock, as a [`Lease`]'s times are).
    pub(super) denial: Option<KeptDenial>,
}

/// Units this instance holds for a subject.
#[derive(Debug)]
pub(super) struct Lease {
    pub(super) units: u64,
    /// When the lease is spent no more, on the store's clock as this instance reads it
    /// (`LeaseTable::store_clock`).
    pub(super) expires: StoreMs,
    /// When the call that took it was sent, on the same clock: the store decided no
    /// earlier.
    pub(super) decided_at: StoreMs,
    /// The store's decision when the lease was taken (remaining after the lease).
    pub(super) decision: Decision,
    /// The end of the lease's window on the store's clock, for the give-back.
    pub(super) window_end: Option<StoreMs>,
    /// The store's lease generation the units were taken in
    /// ([`Grant::epoch`](crate::store::Grant::epoch)).
    pub(super) epoch: u64,
}

impl Lease {
    /// What giving back the unspent units sends, if there are any and a window to
    /// give them back to.
    pub(super) fn back(&self, max_cost: u64) -> Option<GiveBack> {
        give_back_of(self.units, self.window_end, self.epoch, max_cost)
    }
}

/// The give-back of `units` unspent under generation `epoch`, at most `max_cost` (what
/// a refund takes): none without units or a window to give them back to.
pub(super) fn give_back_of(
    units: u64,
    window_end: Option<StoreMs>,
    epoch: u64,
    max_cost: u64,
) -> Option<GiveBack> {
    Some(GiveBack {
        units: units.min(max_cost),
        before_ms: window_end.filter(|_| units > 0)?.0,
        epoch,
    })
}

impl LeaseTable {
    pub(crate) fn new(
        plan: Plan,
        set: PolicySet,
        store: Arc<dyn LeaseStore>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let store_clock = store
            .lease_clock()
            .unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        Self::with_clocks(plan, set, store, clock, store_clock)
    }

    fn with_clocks(
        plan: Plan,
        set: PolicySet,
        store: Arc<dyn LeaseStore>,
        clock: Arc<dyn Clock>,
        store_clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            plan,
            set,
            source: store,
            clock,
            store_clock,
            hash: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            sweeping: AtomicBool::new(false),
        }
    }

    pub(super) fn shard(&self, subject: &Subject) -> MutexGuard<'_, Shard> {
        let hash = self.hash.hash_one(subject.as_bytes());
        // The high bits: the map inside uses the low ones of its own hash.
        lock(&self.shards[(hash >> 60) as usize % SHARDS])
    }

    /// Subjects tracked now.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Units held in leases that have not expired.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn held_units(&self) -> u64 {
        let now = self.store_now();
        self.shards
            .iter()
            .map(|shard| {
                lock(shard)
                    .values()
                    .filter_map(|entry| entry.lease.as_ref())
                    .filter(|lease| now < lease.expires)
                    .map(|lease| lease.units)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Now on the limiter's local clock: rates and idle times.
    pub(crate) fn local_now(&self) -> LocalMs {
        LocalMs(self.clock.now_ms())
    }

    /// Now on the store's clock, as this instance reads it: leases and kept denials.
    pub(super) fn store_now(&self) -> StoreMs {
        StoreMs(self.store_clock.now_ms())
    }

    /// A check of `cost` with leases at local time `now`: decided here, on its way
    /// from the store (a leasing check, or a wait for the one in flight), or to be
    /// checked as without leases.
    pub(crate) fn check(self: &Arc<Self>, subject: &Subject, cost: u64, now: LocalMs) -> Leased {
        match self.try_local(subject, cost, now) {
            Local::Decided(decision) => Leased::Decided(decision),
            Local::Ask(ask, asker) => Leased::Pending(self.ask(subject.clone(), cost, ask, asker)),
            Local::Wait(waiter) => Leased::Pending(self.after_wait(waiter, subject.clone(), cost)),
            Local::Plain => Leased::Plain,
        }
    }

    /// Decides from what this instance holds, or says how to ask the store. Gives back
    /// an expired lease's units on the way.
    pub(crate) fn try_local(self: &Arc<Self>, subject: &Subject, cost: u64, now: LocalMs) -> Local {
        let plan = self.plan;
        let at = self.store_now();
        let mut shard = self.shard(subject);
        if !shard.contains_key(subject) {
            if shard.len().saturating_mul(SHARDS) >= plan.max_subjects
                && !self.make_room(&mut shard, now, at)
            {
                return Local::Plain;
            }
            self.start_sweeping();
            shard.insert(
                subject.clone(),
                Entry {
                    period_start: now,
                    this_period: 0,
                    last_period: 0,
                    last_seen: now,
                    flight: None,
                    lease: None,
                    denial: None,
                },
            );
        }
        let Some(entry) = shard.get_mut(subject) else {
            return Local::Plain;
        };
        entry.last_seen = now;
        let since = now.since(entry.period_start);
        if since >= plan.lifetime_ms {
            entry.last_period = if since >= plan.lifetime_ms.saturating_mul(2) {
                0
            } else {
                entry.this_period
            };
            entry.this_period = 0;
            entry.period_start = now;
        }
        entry.this_period = entry.this_period.saturating_add(cost);

        if let Some(denial) = &entry.denial {
            if let Some(decision) = denial.answer(cost, at.0, Origin::Lease) {
                return Local::Decided(decision);
            }
            if denial.is_over(at.0) {
                entry.denial = None;
            }
        }

        let mut expired = None;
        if let Some(lease) = &mut entry.lease {
            if at < lease.expires {
                if lease.units >= cost {
                    lease.units -= cost;
                    let elapsed = at.since(lease.decided_at);
                    let mut decision = lease.decision.clone();
                    let remaining = decision.remaining().saturating_add(lease.units);
                    let reset = decision.outcome().reset_after_ms.saturating_sub(elapsed);
                    decision.rebase_allowed(remaining, reset, Origin::Lease);
                    return Local::Decided(decision);
                }
            } else {
                expired = entry
                    .lease
                    .take()
                    .and_then(|lease| lease.back(plan.max_cost));
            }
        }

        let rate = entry.this_period.max(entry.last_period);
        let local = if let Some(flight) = entry.flight.as_ref().filter(|f| f.in_flight()) {
            // Joined under the lock, which the asker records its answer under: this
            // waiter sees that answer, or the asker leaving without one, whenever it
            // comes.
            Local::Wait(flight.clone())
        } else if rate >= plan.min_units {
            let (asker, waiter) = flight::flight();
            entry.flight = Some(waiter);
            let room = plan.max_cost.saturating_sub(cost);
            let batch = plan
                .batch
                .unwrap_or((rate.clamp(1, plan.max_units) / 2).max(1))
                .min(room);
            // At least a batch: less could never be granted.
            let want = rate.clamp(1, plan.max_units).max(batch);
            Local::Ask(LeaseAsk { want, batch }, asker)
        } else {
            // An asker that left has nothing more to say.
            entry.flight = None;
            Local::Plain
        };
        drop(shard);
        if let Some(back) = expired {
            self.give_back(subject.clone(), back);
        }
        local
    }

    /// Forgets `subject` here, for a reset: its lease's units are gone with the state
    /// (nothing to give back), and its kept denial is no longer the store's word.
    /// Requests waiting for its leasing check in flight still get that check's answer,
    /// then look again, on a fresh entry.
    pub(crate) fn forget(&self, subject: &Subject) {
        self.shard(subject).remove(subject);
    }

    /// Forgets `subject`'s kept denial, for a refund: the store may admit again. Its
    /// lease stays: the store still counts its units.
    pub(crate) fn forget_denial(&self, subject: &Subject) {
        if let Some(entry) = self.shard(subject).get_mut(subject) {
            entry.denial = None;
        }
    }
}

/// Locks a shard; a panic elsewhere while it was held leaves plain data behind, still
/// usable.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
