//! Leases: a hot subject's units taken from a shared store in batches and spent
//! locally, so a subject sending thousands of requests a second costs the store a few
//! calls a second, with one budget across every instance.
//!
//! ```no_run
//! use redlimit::{deadpool_redis, lease::Leases, Limiter, Policy, RedisStore};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379/")
//!     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
//! // 1000 a second per API key across the fleet; keys sending 50 a second or more to
//! // this instance spend leases of up to 100 units, each living at most 100 ms.
//! let limiter = Limiter::builder(RedisStore::new(pool))
//!     .policy(Policy::sliding_window("api", 1000, Duration::from_secs(1))?)
//!     .leases(Leases::new())
//!     .build()?;
//! let decision = limiter.check("key-7", 1).await?;
//! # let _ = decision; Ok(()) }
//! ```
//!
//! # How a lease works
//!
//! Each instance counts, per subject, the units asked of it in the current and the last
//! lease lifetime. A subject below [`Leases::min_rate`] is checked as without leases:
//! one store call per request, exact. Above it, the instance's next store call for the
//! subject is a *leasing check* ([`LeaseStore::check_leasing`]): in the one atomic call
//! a check makes, the store decides the request, and if every policy admits it also
//! takes up to `want` more units from every policy (all or nothing, never more than
//! each admits now). `want` is the units the subject asked of this instance in a
//! lifetime, at most [`Leases::max_units`]: it grows with the subject's rate and
//! shrinks when leases go unspent. The instance then admits the subject's requests
//! from the lease without a store call until the units run out or the lease expires.
//! A lease lives at most [`Leases::lifetime`] and never past the end of the current
//! window of any window policy of the set (the store says how far that is). Both are
//! measured on the store's clock as this instance reads it
//! ([`LeaseStore::lease_clock`]: the memory store's clock, a Redis store's client
//! clock, or for Redis `TIME` a monotonic clock), from the moment the leasing call was
//! sent, never on the limiter's local clock. Units left
//! when it expires are given back through the refund path
//! ([`Limiter::refund`](crate::Limiter::refund)): a window policy takes them back while
//! its window lasts. A set with a token bucket writes them off: its refund moves the
//! arrival time back, which after the bucket has refilled past the lease would credit
//! the same units twice; written-off units come back by refill within
//! `units x interval`.
//!
//! A leasing check admits only when the cost and a batch ([`Leases::batch`], half the
//! lease by default) fit: a sliding window or a token bucket under steady overload
//! frees units one at a time, and asking for each would cost a call per unit. A
//! denied leasing check is kept: the instance answers the subject locally with that
//! denial until the store said the cost and a batch will fit, so a denied hot subject
//! costs the store nothing.
//!
//! # What leases promise
//!
//! With `L` the lease lifetime and `n` instances:
//!
//! - **Fixed window and sliding window counter: no over-admission** while the store
//!   keeps its counts (when it loses them, see [below](#when-things-go-wrong)). A
//!   unit is counted in the store when its lease is taken, in the window the lease was
//!   taken in, and spent in that same window (a lease ends with it, on the store's
//!   clock). So the store's counts are never
//!   below what the instances admitted, and every admission satisfies the policy's own
//!   inequality: for a fixed window `admitted(window) <= limit`; for a sliding window
//!   counter, at every admission `previous * (w - elapsed) / w + current <= limit`.
//! - **Token bucket: a burst at most `L / emission interval` larger.** Units leave the
//!   bucket when leased and are spent up to `L` later; over any interval of length `d`
//!   the instances admit at most `capacity + ceil(L / interval) + d / interval`:
//!   the refill rate times the lifetime more than one store would.
//! - **Under-admission: units are stranded at most one lifetime, plus a quarter of one
//!   for the sweep.** When a subject's demand on an instance stops, its lease's units
//!   wait for the lease to expire, then go back to the store (a background task looks
//!   every `L / 4`). With a token bucket they are written off and come back by refill,
//!   within `units x interval` (at most [`Leases::max_units`] intervals).
//! - **Denials come from the store.** A leasing subject is denied by a store call on
//!   the whole budget, when the cost and a batch ([`Leases::batch`]) do not fit; the
//!   store says when they will, and the instance answers the subject locally with that
//!   denial until then, its `Retry-After` counting down to that time: the store's
//!   retry time for the request plus, at most, the time a batch takes to free up. A
//!   fixed window needs no batch: its denials and retry times are exactly those of a
//!   limiter without leases (the window's end).
//! - **Headers:** a decision from a lease reports the binding policy's remaining as the
//!   store last said it, plus the lease's unspent units: what this instance knows.
//!   Other instances' spending since is not in it.
//!
//! # When things go wrong
//!
//! - **The store loses the subject's counts** (`FLUSHALL`, a restart without
//!   persistence, a failover that lost writes, or [`Limiter::reset`](crate::Limiter::reset)
//!   from any instance). An instance cannot see it before its next call, and until
//!   then spends the lease it holds, whose units the store no longer counts. Bound:
//!   in the window of the loss, the instances admit at most **the limit plus the
//!   units they held in leases at that moment** (for a token bucket, those units on
//!   top of its burst). Each instance holds at most [`Leases::max_units`] (a tenth
//!   of the smallest limit by default) and at most what the subject asked of it in a
//!   lifetime, and spends it within one lifetime. Give-backs do not add to it: a
//!   leasing check that grants units also names the subject's *lease generation*
//!   (made by the first grant, kept as long as the states, forgotten with them), the
//!   lease and its give-back carry it, and the store gives units back only while its
//!   generation is still theirs. Measured (`tests/it/leases.rs`): four instances, 2,000
//!   per 2 s at twice the limit, a flush 300 ms into a window: 2,200 admitted after it
//!   with 204 units held (2,101 with 102 held when two instances are drained), 2,000
//!   without leases; a sliding window counter 2,023 (27 held). A reset costs the
//!   same, less the units of the instance that reset: it forgets its own lease.
//! - **An admin operation on this instance.** [`Limiter::reset`](crate::Limiter::reset)
//!   forgets the subject's lease and kept denial here (the units are gone with the
//!   state), so its next check asks the store; [`Limiter::refund`](crate::Limiter::refund)
//!   forgets the kept denial (the store may admit again) and keeps the lease (the
//!   store still counts its units, so a refund on every failed request, as the
//!   layer's refund rules make, costs no lease). Other instances keep a denial they
//!   were given until its time: fewer admissions, never more.
//! - **The limiter's local clock runs wrong** (slow, fast, or stepped back as
//!   `SystemClock` is by an NTP step). Leases and kept denials are timed on the
//!   store's clock, so it cannot carry units into the store's next window; the local
//!   clock only measures rates and idle time, so at worst a subject leases later or
//!   its idle entry is swept later. (A Redis store's client clock *is* the store's
//!   clock: instances whose client clocks disagree disagree on windows, leases or
//!   not.)
//! - **The store fails** during a leasing check: the request and those waiting for
//!   the same check answer with the failure (the limiter's fallback or failure mode);
//!   a lease held keeps being spent until it expires (its units are counted).
//! - **More subjects than [`Leases::max_subjects`]**: the others are checked without
//!   leases until idle subjects (two lifetimes without a request, holding nothing)
//!   make room: the sweep looks every quarter lifetime from the first subject
//!   tracked, and a full shard makes room itself when a new subject arrives.
//! - **Settings out of range** are a [`LeaseError`] (a lifetime under 1 ms, 0 units,
//!   0 subjects) or are taken at the largest value that works (a lifetime past the
//!   shortest window, more units than the smallest limit, a batch larger than a
//!   lease): never a panic, never another limit.
//!
//! A sliding log never leases: exactness is its promise, and
//! [`LimiterBuilder::leases`](crate::LimiterBuilder::leases) refuses it ([`LeaseError::SlidingLog`]).

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Decision, Origin};
use crate::policy::{Algorithm, Policy};
use crate::store::{
    GiveBack, GiveBackFuture, Grant, LeaseAsk, LeaseStore, PolicySet, StoreError, StoreErrorKind,
};
use crate::subject::Subject;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// Lease settings for a limiter ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)); see
/// the [module docs](self) for what they do and promise.
#[derive(Debug, Clone)]
pub struct Leases {
    lifetime: Option<Duration>,
    max_units: Option<u64>,
    min_rate: u32,
    batch: Option<u64>,
    max_subjects: usize,
}

impl Default for Leases {
    fn default() -> Self {
        Self::new()
    }
}

impl Leases {
    /// The default settings: a lifetime of a tenth of the shortest window (for a token
    /// bucket, of the time it takes to fill), at most 1 s; leases of at most a tenth of
    /// the smallest limit; subjects lease from 50 units a second on one instance; at
    /// most 10,000 subjects tracked per limiter.
    pub fn new() -> Self {
        Self {
            lifetime: None,
            max_units: None,
            min_rate: 50,
            batch: None,
            max_subjects: 10_000,
        }
    }

    /// How long a lease may live (it never outlives its window either). Longer means
    /// fewer store calls and, for a token bucket, a larger possible burst. At most the
    /// shortest window of the set (for a token bucket, the time it takes to fill):
    /// longer is taken as that. Under 1 ms is [`LeaseError::ZeroLifetime`].
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// The most units one lease takes. Larger leases mean fewer calls, and that one
    /// instance can hold more of a subject's budget for a while (and spend it after
    /// the store lost its counts: see the module docs). At most the smallest limit of
    /// the set: more is taken as that. 0 is [`LeaseError::ZeroUnits`].
    pub fn max_units(mut self, units: u64) -> Self {
        self.max_units = Some(units);
        self
    }

    /// The rate, in units a second asked of one instance, from which a subject leases.
    /// Below it every request is one exact store call. 0 leases from two units a
    /// lifetime, the least a lease can save a call with.
    pub fn min_rate(mut self, units_per_second: u32) -> Self {
        self.min_rate = units_per_second;
        self
    }

    /// The smallest lease worth a call. A leasing check admits only if the request's
    /// cost and this many more units fit; otherwise it is denied, consuming nothing,
    /// with the time until they will fit, and this instance answers the subject
    /// locally with that denial until then. Without it, a sliding window or a token
    /// bucket under steady overload, which frees units one by one, would cost a store
    /// call for every unit.
    ///
    /// Half the lease wanted by default (0 for sets of fixed windows only, whose units
    /// do not pile up while a subject waits: they lease what is left, to the last
    /// unit; a set of fixed windows only always leases so, whatever this says). With
    /// `1`, a leasing check admits whenever one more unit than the cost fits. Larger
    /// batches mean fewer calls and later answers. At most [`Leases::max_units`]: a
    /// batch larger than any lease could never be granted, so more is taken as that,
    /// and a leasing check always wants at least a batch.
    pub fn batch(mut self, units: u64) -> Self {
        self.batch = Some(units);
        self
    }

    /// How many subjects one limiter tracks the rate of (10,000 by default). Subjects
    /// past it are checked without leases until idle ones are swept out (idle two
    /// lifetimes). 0 is [`LeaseError::ZeroSubjects`].
    pub fn max_subjects(mut self, subjects: usize) -> Self {
        self.max_subjects = subjects;
        self
    }

    /// The settings for `set`, or why it cannot lease.
    pub(crate) fn resolve(&self, set: &PolicySet) -> Result<Plan, LeaseError> {
        let policies = set.policies();
        if let Some(log) = policies
            .iter()
            .find(|p| p.algorithm() == Algorithm::SlidingLog)
        {
            return Err(LeaseError::SlidingLog(log.name().to_owned()));
        }
        if self.max_subjects == 0 {
            return Err(LeaseError::ZeroSubjects);
        }
        let shortest_ms = policies.iter().map(span_ms).min().unwrap_or(1_000).max(1);
        let lifetime_ms = match self.lifetime {
            // Past the shortest span a lease gains nothing (it ends with its window), and
            // a token bucket's burst grows with it.
            Some(lifetime) => u64::try_from(lifetime.as_millis())
                .unwrap_or(u64::MAX)
                .min(shortest_ms),
            None => (shortest_ms / 10).clamp(1, 1_000),
        };
        if lifetime_ms == 0 {
            return Err(LeaseError::ZeroLifetime);
        }
        let smallest_limit = policies.iter().map(Policy::limit).min().unwrap_or(1);
        let max_units = self.max_units.unwrap_or((smallest_limit / 10).max(1));
        if max_units == 0 {
            return Err(LeaseError::ZeroUnits);
        }
        // No policy admits more than its limit at once.
        let max_units = max_units.min(smallest_limit.max(1));

        // Units a lifetime at the threshold rate; a subject needs two to gain anything.
        let min_units = u64::from(self.min_rate)
            .saturating_mul(lifetime_ms)
            .div_ceil(1_000)
            .max(2);
        Ok(Plan {
            lifetime_ms,
            max_units,
            min_units,
            // A fixed window's units do not pile up while a subject waits: whatever is
            // left of the window is leased, down to the last unit.
            batch: if policies
                .iter()
                .all(|p| p.algorithm() == Algorithm::FixedWindow)
            {
                Some(0)
            } else {
                self.batch.map(|batch| batch.min(max_units))
            },
            max_cost: set.max_cost(),
            max_subjects: self.max_subjects,
            // A token bucket's refund moves its arrival time back by the units; once
            // the bucket has refilled past them meanwhile, that would credit units
            // twice. Its unspent units are written off instead: they come back by
            // refill within `units x interval`.
            gives_back: policies
                .iter()
                .all(|p| p.algorithm() != Algorithm::TokenBucket),
        })
    }
}

/// The time a policy takes to forget a subject: its window, or for a token bucket the
/// time to fill from empty.
fn span_ms(policy: &Policy) -> u64 {
    match policy.algorithm() {
        Algorithm::TokenBucket => policy
            .limit()
            .saturating_mul(policy.emission_interval_us())
            .div_ceil(1_000)
            .max(1),
        _ => policy.window_ms(),
    }
}

/// Why a limiter cannot lease as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A sliding log promises exact admission; a lease would spend its units later
    /// than the log records them.
    #[error("policy {0:?} is a sliding log, which never leases: exactness is its promise (use a sliding window counter or a token bucket to lease)")]
    SlidingLog(String),
    /// A lease that lives 0 ms would never be spent.
    #[error("a lease lifetime must be at least 1 ms")]
    ZeroLifetime,
    /// A lease of 0 units would never admit anything.
    #[error("leases must be at least 1 unit (Leases::max_units)")]
    ZeroUnits,
    /// A table of 0 subjects would never lease.
    #[error("a limiter must track at least 1 subject to lease (Leases::max_subjects)")]
    ZeroSubjects,
}

/// [`Leases`] resolved for one policy set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    lifetime_ms: u64,
    max_units: u64,
    /// Units asked in a lifetime from which a subject leases.
    min_units: u64,
    /// The smallest lease, and the batch a paused subject waits for (`None`: half the
    /// lease wanted).
    batch: Option<u64>,
    max_cost: u64,
    max_subjects: usize,
    /// Whether unspent units go back to the store: not with a token bucket in the set.
    gives_back: bool,
}

/// What [`LeaseTable::try_local`] decided.
pub(crate) enum Local {
    /// Admitted from a lease, or denied from a kept denial: no store call.
    Decided(Decision),
    /// Ask the store with a leasing check ([`LeaseTable::ask`]).
    Ask(LeaseAsk),
    /// Another request's leasing check (this number) is in flight: wait for its
    /// answer ([`LeaseTable::after_wait`]).
    Wait(Pin<Box<OwnedNotified>>, u64),
    /// Check as without leases.
    Plain,
}

/// A decision on its way from the lease table.
pub(crate) type DecisionFuture = GiveBackFuture;

/// The leases and rates of one limiter's subjects, shared by its clones.
pub(crate) struct LeaseTable {
    plan: Plan,
    set: PolicySet,
    source: Arc<dyn LeaseStore>,
    /// The limiter's local clock: rates and idle times.
    clock: Arc<dyn Clock>,
    /// What leases and kept denials are timed on: the clock the store decides on
    /// ([`LeaseStore::lease_clock`]), or for a store with its own (Redis `TIME`) a
    /// monotonic clock, which runs as it does. A lease ends at the time its call was
    /// sent plus the time the store said was left of its window, so a local clock that
    /// runs slow or steps back cannot carry its units into the store's next window.
    store_clock: Arc<dyn Clock>,
    /// Picks a subject's shard.
    hash: foldhash::fast::RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// Whether the sweeper task runs (started with the first subject tracked, on its
    /// runtime).
    sweeping: AtomicBool,
}

impl fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseTable")
            .field("plan", &self.plan)
            .field("subjects", &self.len())
            .finish_non_exhaustive()
    }
}

const SHARDS: usize = 16;

/// One shard's subjects, and when a full shard last made room.
#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Subject, Entry, foldhash::fast::RandomState>,
    pruned_at: Option<u64>,
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

impl Entry {
    /// Holds nothing and waits for nothing, and was last asked for `idle_after` ms ago
    /// (`now` local, `at` on the store's clock).
    fn is_idle(&self, now: u64, at: u64, idle_after: u64) -> bool {
        self.asked.is_none()
            && self.lease.is_none()
            && self.denial.as_ref().is_none_or(|denial| at >= denial.until)
            && now.saturating_sub(self.last_seen) >= idle_after
    }
}

/// One subject on this instance.
#[derive(Debug)]
struct Entry {
    /// Start of the current rate period (one lifetime long), local ms.
    period_start: u64,
    /// Units asked in the current period and in the one before it.
    this_period: u64,
    last_period: u64,
    /// When the subject was last asked for, local ms.
    last_seen: u64,
    /// A leasing check is in flight: the subject's other requests wait for it here
    /// (woken when it is answered, fails or is dropped) instead of asking too.
    asked: Option<Arc<Notify>>,
    /// Counts the leasing checks sent, so a waiter knows whether the one it waited
    /// for failed.
    asks: u64,
    /// The last failed leasing check: its number and its error's kind and text. Its
    /// waiters answer with the same failure at once, rather than each asking a
    /// store that just failed and waiting out another timeout.
    failed: Option<(u64, StoreErrorKind, String)>,
    lease: Option<Lease>,
    denial: Option<Denial>,
}

/// Units this instance holds for a subject.
#[derive(Debug)]
struct Lease {
    units: u64,
    /// When the lease is spent no more, on the store's clock as this instance reads it
    /// (`LeaseTable::store_clock`).
    expires: u64,
    /// When the call that took it was sent, on the same clock: the store decided no
    /// earlier.
    decided_at: u64,
    /// The store's decision when the lease was taken (remaining after the lease).
    decision: Decision,
    /// The end of the lease's window on the store's clock, for the give-back.
    window_end: Option<u64>,
    /// The store's lease generation the units were taken in ([`Grant::epoch`]).
    epoch: u64,
}

impl Lease {
    /// What giving back the unspent units sends, if there are any and a window to
    /// give them back to.
    fn back(&self, max_cost: u64) -> Option<GiveBack> {
        give_back_of(self.units, self.window_end, self.epoch, max_cost)
    }
}

/// The give-back of `units` unspent under generation `epoch`, at most `max_cost` (what
/// a refund takes): none without units or a window to give them back to.
fn give_back_of(
    units: u64,
    window_end: Option<u64>,
    epoch: u64,
    max_cost: u64,
) -> Option<GiveBack> {
    Some(GiveBack {
        units: units.min(max_cost),
        before_ms: window_end.filter(|_| units > 0)?,
        epoch,
    })
}

/// A leasing check the store denied, answered locally until `until` (on the store's
/// clock, as a [`Lease`]'s times are).
#[derive(Debug)]
struct Denial {
    until: u64,
    cost: u64,
    decided_at: u64,
    decision: Decision,
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

    fn shard(&self, subject: &Subject) -> MutexGuard<'_, Shard> {
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
        let now = self.store_clock.now_ms();
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

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Decides from what this instance holds, or says how to ask the store. Gives back
    /// an expired lease's units on the way.
    pub(crate) fn try_local(self: &Arc<Self>, subject: &Subject, cost: u64, now: u64) -> Local {
        let plan = self.plan;
        let at = self.store_clock.now_ms();
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
                    asked: None,
                    asks: 0,
                    failed: None,
                    lease: None,
                    denial: None,
                },
            );
        }
        let Some(entry) = shard.get_mut(subject) else {
            return Local::Plain;
        };
        entry.last_seen = now;
        let since = now.saturating_sub(entry.period_start);
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
            if at < denial.until && cost >= denial.cost {
                let mut decision = denial.decision.clone();
                let waited = at.saturating_sub(denial.decided_at);
                decision.rebase(
                    denial.until - at,
                    decision.outcome().reset_after_ms.saturating_sub(waited),
                    Origin::Lease,
                );
                return Local::Decided(decision);
            }
            if at >= denial.until {
                entry.denial = None;
            }
        }

        let mut expired = None;
        if let Some(lease) = &mut entry.lease {
            if at < lease.expires {
                if lease.units >= cost {
                    lease.units -= cost;
                    let elapsed = at.saturating_sub(lease.decided_at);
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
        let local = if let Some(asked) = &entry.asked {
            // Registered before the lock is released, so no wake-up can be missed.
            let mut answered = Box::pin(Arc::clone(asked).notified_owned());
            answered.as_mut().enable();
            Local::Wait(answered, entry.asks)
        } else if rate >= plan.min_units {
            entry.asked = Some(Arc::new(Notify::new()));
            entry.asks += 1;
            let room = plan.max_cost.saturating_sub(cost);
            let batch = plan
                .batch
                .unwrap_or((rate.clamp(1, plan.max_units) / 2).max(1))
                .min(room);
            // At least a batch: less could never be granted.
            let want = rate.clamp(1, plan.max_units).max(batch);
            Local::Ask(LeaseAsk { want, batch })
        } else {
            Local::Plain
        };
        drop(shard);
        if let Some(back) = expired {
            self.give_back(subject.clone(), back);
        }
        local
    }

    /// The store's leasing check for `ask`, recorded when it is answered. If the
    /// future is dropped first, the subject's waiters are woken to ask for themselves.
    pub(crate) fn ask(
        self: &Arc<Self>,
        subject: Subject,
        cost: u64,
        ask: LeaseAsk,
    ) -> DecisionFuture {
        // Read before the call is made: the store decides no earlier.
        let sent = self.store_clock.now_ms();
        let call = self
            .source
            .check_leasing(subject.clone(), &self.set, cost, ask);
        let mut pending = Asking {
            table: Arc::clone(self),
            subject: Some(subject),
        };
        Box::pin(async move {
            let result = call.await;
            let table = Arc::clone(&pending.table);
            match pending.subject.take() {
                Some(subject) => table.granted(&subject, cost, sent, result),
                None => result.map(|(decision, _)| decision),
            }
        })
    }

    /// Waits for the subject's leasing check in flight, then decides as
    /// [`LeaseTable::try_local`] says (asking the store itself if it must).
    pub(crate) fn after_wait(
        self: &Arc<Self>,
        mut answered: Pin<Box<OwnedNotified>>,
        mut awaited: u64,
        subject: Subject,
        cost: u64,
    ) -> DecisionFuture {
        let table = Arc::clone(self);
        Box::pin(async move {
            loop {
                answered.as_mut().await;
                if let Some(error) = table.failure_of(&subject, awaited) {
                    return Err(error);
                }
                let now = table.now_ms();
                match table.try_local(&subject, cost, now) {
                    Local::Decided(decision) => return Ok(decision),
                    Local::Ask(ask) => return table.ask(subject, cost, ask).await,
                    Local::Wait(next, number) => (answered, awaited) = (next, number),
                    Local::Plain => {
                        let plain = LeaseAsk { want: 0, batch: 0 };
                        let call = table.source.check_leasing(subject, &table.set, cost, plain);
                        return call.await.map(|(decision, _)| decision);
                    }
                }
            }
        })
    }

    /// The failure of leasing check number `ask` of `subject`, if it failed.
    fn failure_of(&self, subject: &Subject, ask: u64) -> Option<StoreError> {
        let shard = self.shard(subject);
        let (number, kind, text) = shard.get(subject)?.failed.as_ref()?;
        (*number == ask).then(|| {
            StoreError::new(
                *kind,
                format!("the leasing check this request waited for failed: {text}"),
            )
        })
    }

    /// Makes room in a full shard by forgetting its idle subjects, at most once a
    /// quarter lifetime (a scan of the shard); whether there is room now. The sweep
    /// does the same in the background; this is for a table filled faster than it
    /// sweeps, so that a subject turning hot behind a crowd of cold ones still leases.
    fn make_room(&self, shard: &mut Shard, now: u64, at: u64) -> bool {
        let every = (self.plan.lifetime_ms / 4).max(1);
        if shard
            .pruned_at
            .is_some_and(|at| now >= at && now - at < every)
        {
            return false;
        }
        shard.pruned_at = Some(now);
        let idle_after = self.plan.lifetime_ms.saturating_mul(2);
        shard.retain(|_, entry| !entry.is_idle(now, at, idle_after));
        shard.len().saturating_mul(SHARDS) < self.plan.max_subjects
    }

    /// Forgets `subject` here, for a reset: its lease's units are gone with the state
    /// (nothing to give back), and its kept denial is no longer the store's word.
    pub(crate) fn forget(&self, subject: &Subject) {
        if let Some(entry) = self.shard(subject).remove(subject) {
            if let Some(asked) = &entry.asked {
                // Its waiters ask again, on a fresh entry.
                asked.notify_waiters();
            }
        }
    }

    /// Forgets `subject`'s kept denial, for a refund: the store may admit again. Its
    /// lease stays: the store still counts its units.
    pub(crate) fn forget_denial(&self, subject: &Subject) {
        if let Some(entry) = self.shard(subject).get_mut(subject) {
            entry.denial = None;
        }
    }

    /// Records what a leasing check sent at `sent` (on the store's clock) got, and
    /// returns the decision for the request that asked: its remaining counts the new
    /// lease.
    pub(crate) fn granted(
        self: &Arc<Self>,
        subject: &Subject,
        cost: u64,
        sent: u64,
        result: Result<(Decision, Grant), StoreError>,
    ) -> Result<Decision, StoreError> {
        let now = self.store_clock.now_ms();
        let mut shard = self.shard(subject);
        let entry = shard.get_mut(subject);
        let (mut decision, grant) = match result {
            Ok(answer) => answer,
            Err(error) => {
                if let Some(entry) = entry {
                    entry.failed = Some((entry.asks, error.kind(), error.to_string()));
                    if let Some(asked) = entry.asked.take() {
                        asked.notify_waiters();
                    }
                }
                return Err(error);
            }
        };
        let Some(entry) = entry else {
            // Swept out meanwhile: the units cannot be spent here; give them back.
            drop(shard);
            let back = give_back_of(
                grant.units,
                grant.window_end_ms,
                grant.epoch,
                self.plan.max_cost,
            );
            if let Some(back) = back {
                self.give_back(subject.clone(), back);
            }
            return Ok(decision);
        };
        entry.failed = None;
        if let Some(asked) = entry.asked.take() {
            // The waiters find the new lease or denial once this lock is released.
            asked.notify_waiters();
        }
        if !decision.is_allowed() {
            let wait = decision
                .outcome()
                .retry_after_ms
                .max(grant.ask_again_ms)
                .max(1);
            entry.denial = Some(Denial {
                until: sent.saturating_add(wait),
                cost,
                decided_at: sent,
                decision: decision.clone(),
            });
            return Ok(decision);
        }
        if grant.units == 0 {
            return Ok(decision);
        }
        // The lease starts when the call was sent, so it ends no later than the window
        // the store decided in, whatever the round trip took.
        let life = grant.window_left_ms.map_or(self.plan.lifetime_ms, |left| {
            left.min(self.plan.lifetime_ms)
        });
        let expires = sent.saturating_add(life);
        let mut stale = None;
        match &mut entry.lease {
            // Two leases of one generation at once: one, ending with the earlier. (A
            // lease of an older generation is dropped below: the store no longer
            // counts its units, so they are neither spent nor given back.)
            Some(lease) if now < lease.expires && lease.epoch == grant.epoch => {
                lease.units += grant.units;
                lease.expires = lease.expires.min(expires);
                lease.window_end = lease.window_end.min(grant.window_end_ms);
                lease.decided_at = sent;
                lease.decision = decision.clone();
            }
            slot => {
                stale = slot
                    .take()
                    .filter(|lease| lease.epoch == grant.epoch)
                    .and_then(|lease| lease.back(self.plan.max_cost));
                *slot = Some(Lease {
                    units: grant.units,
                    expires,
                    decided_at: sent,
                    decision: decision.clone(),
                    window_end: grant.window_end_ms,
                    epoch: grant.epoch,
                });
            }
        }
        let held = entry.lease.as_ref().map_or(0, |lease| lease.units);
        drop(shard);
        if let Some(back) = stale {
            self.give_back(subject.clone(), back);
        }
        self.start_sweeping();
        let remaining = decision.remaining().saturating_add(held);
        let reset = decision.outcome().reset_after_ms;
        decision.rebase_allowed(remaining, reset, Origin::Store);
        Ok(decision)
    }

    /// Gives `units` back to the store in the background (written off without a
    /// runtime, when the store fails, or when the set has a token bucket).
    /// Only units of a window that has not ended on the store's clock, and of the
    /// lease generation the store still has, go back: the store checks both, so a late
    /// give-back, or one after the store lost its counts, changes nothing.
    fn give_back(self: &Arc<Self>, subject: Subject, back: GiveBack) {
        if !self.plan.gives_back {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let units = back.units;
        let call = self.source.give_back(subject, &self.set, back);
        runtime.spawn(async move {
            if let Err(error) = call.await {
                tracing::debug!(%error, units, "could not give back a lease's units: written off");
            }
        });
    }

    /// Gives back the units of every expired lease and forgets subjects idle for two
    /// lifetimes. Returns the give-back calls, for callers that wait for them.
    pub(crate) fn sweep(&self, now: u64) -> Vec<GiveBackFuture> {
        let at = self.store_clock.now_ms();
        let idle_after = self.plan.lifetime_ms.saturating_mul(2);
        let mut returns = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.retain(|subject, entry| {
                if entry
                    .lease
                    .as_ref()
                    .is_some_and(|lease| at >= lease.expires)
                {
                    let back = entry.lease.take().and_then(|l| l.back(self.plan.max_cost));
                    if let (true, Some(back)) = (self.plan.gives_back, back) {
                        returns.push(self.source.give_back(subject.clone(), &self.set, back));
                    }
                }
                if entry
                    .denial
                    .as_ref()
                    .is_some_and(|denial| at >= denial.until)
                {
                    entry.denial = None;
                }
                !entry.is_idle(now, at, idle_after)
            });
        }
        returns
    }

    /// Starts the background sweep on the current runtime, once.
    fn start_sweeping(self: &Arc<Self>) {
        if self.sweeping.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let table: Weak<Self> = Arc::downgrade(self);
        let every = Duration::from_millis((self.plan.lifetime_ms / 4).max(1));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(table) = table.upgrade() else {
                    return;
                };
                let returns = table.sweep(table.now_ms());
                drop(table);
                for call in returns {
                    if let Err(error) = call.await {
                        tracing::debug!(%error, "could not give back a lease's units: written off");
                    }
                }
            }
        });
    }
}

/// A leasing check in flight: dropped unanswered (the request was cancelled), it
/// wakes the subject's waiters so that one of them asks instead.
struct Asking {
    table: Arc<LeaseTable>,
    /// Taken when the answer is recorded.
    subject: Option<Subject>,
}

impl Drop for Asking {
    fn drop(&mut self) {
        if let Some(subject) = self.subject.take() {
            let mut shard = self.table.shard(&subject);
            if let Some(asked) = shard.get_mut(&subject).and_then(|e| e.asked.take()) {
                asked.notify_waiters();
            }
        }
    }
}

/// Locks a shard; a panic elsewhere while it was held leaves plain data behind, still
/// usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::MemoryStore;

    fn set(policies: Vec<Policy>) -> PolicySet {
        PolicySet::new(policies)
    }

    fn sliding(limit: u32, window_ms: u64) -> Policy {
        Policy::sliding_window("s", limit, Duration::from_millis(window_ms)).unwrap()
    }

    #[test]
    fn defaults_follow_the_shortest_window_and_the_smallest_limit() {
        let plan = Leases::new()
            .resolve(&set(vec![sliding(1_000, 1_000)]))
            .unwrap();
        assert_eq!(plan.lifetime_ms, 100, "a tenth of the window");
        assert_eq!(plan.max_units, 100, "a tenth of the limit");
        assert_eq!(plan.min_units, 5, "50 a second over 100 ms");
        assert_eq!(plan.batch, None, "half the lease, decided per ask");
        assert!(plan.gives_back);

        // A token bucket of 10 refilled at 1 a second fills in 10 s: the lifetime is
        // capped at 1 s; its units are written off, not given back.
        let bucket = Policy::token_bucket("b", 10, 1, Duration::from_secs(1)).unwrap();
        let plan = Leases::new().resolve(&set(vec![bucket])).unwrap();
        assert_eq!((plan.lifetime_ms, plan.max_units), (1_000, 1));
        assert!(!plan.gives_back);

        // Fixed windows lease down to the last unit: no batch.
        let fixed = Policy::fixed_window("f", 100, Duration::from_secs(60)).unwrap();
        let plan = Leases::new().resolve(&set(vec![fixed])).unwrap();
        assert_eq!(plan.batch, Some(0));

        // A subject needs two units a lifetime to gain anything from a lease.
        let plan = Leases::new()
            .min_rate(1)
            .resolve(&set(vec![sliding(10, 100)]))
            .unwrap();
        assert_eq!((plan.lifetime_ms, plan.min_units), (10, 2));
    }

    fn table(clock: &FakeClock, policy: Policy, leases: Leases) -> Arc<LeaseTable> {
        let set = set(vec![policy]);
        let plan = leases.resolve(&set).unwrap();
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        Arc::new(LeaseTable::new(plan, set, store, Arc::new(clock.clone())))
    }

    #[tokio::test]
    async fn a_subject_asks_for_its_rate_and_spends_the_grant_here() {
        let clock = FakeClock::new(1_000_000);
        let table = table(&clock, sliding(1_000, 1_000), Leases::new());
        let subject = Subject::new("s");
        for _ in 0..4 {
            assert!(matches!(
                table.try_local(&subject, 1, 1_000_000),
                Local::Plain
            ));
        }
        let Local::Ask(ask) = table.try_local(&subject, 1, 1_000_000) else {
            panic!("the fifth unit in a lifetime asks for a lease");
        };
        assert_eq!(ask, LeaseAsk { want: 5, batch: 2 });
        let answer = table
            .source
            .check_leasing(subject.clone(), &table.set, 1, ask)
            .await;
        let decision = table.granted(&subject, 1, 1_000_000, answer).unwrap();
        // 1 for this request and 5 leased: 994 left in the store, 999 here.
        assert_eq!(decision.remaining(), 999);
        for left in (0..5).rev() {
            let Local::Decided(decision) = table.try_local(&subject, 1, 1_000_010) else {
                panic!("served from the lease");
            };
            assert_eq!(decision.origin(), Origin::Lease);
            assert_eq!(decision.remaining(), 994 + left);
        }
        // The lease is spent: the next unit asks again, for the rate seen (11 units).
        let Local::Ask(ask) = table.try_local(&subject, 1, 1_000_020) else {
            panic!("asks again");
        };
        assert_eq!(ask.want, 11);
        // Meanwhile the subject's other requests wait for that answer.
        assert!(matches!(
            table.try_local(&subject, 1, 1_000_020),
            Local::Wait(_, 2)
        ));
    }

    #[test]
    fn subjects_past_the_bound_are_checked_without_leases() {
        let clock = FakeClock::new(0);
        let table = table(
            &clock,
            sliding(1_000, 1_000),
            Leases::new().max_subjects(32),
        );
        for i in 0..1_000 {
            let _ = table.try_local(&Subject::new(format!("s{i}")), 1, 0);
        }
        assert!(table.len() <= 32, "{} tracked", table.len());
        // Idle subjects are swept after two lifetimes, which makes room again.
        assert!(table.sweep(200).is_empty());
        assert_eq!(table.len(), 0);
    }
}
