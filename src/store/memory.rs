//! The in-process store: the reference algorithms in a sharded concurrent map.
//!
//! ```
//! use redlimit::{clock::FakeClock, Limiter, MemoryStore, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = FakeClock::new(0);
//! let limiter = Limiter::new(
//!     MemoryStore::with_clock(clock.clone()),
//!     Policy::fixed_window("jobs", 2, Duration::from_secs(1))?,
//! );
//! assert!(limiter.check("queue-a", 1).await?.is_allowed());
//! assert!(limiter.check("queue-a", 1).await?.is_allowed());
//! assert!(!limiter.check("queue-a", 1).await?.is_allowed());
//! clock.advance(Duration::from_secs(1));
//! assert!(limiter.check("queue-a", 1).await?.is_allowed());
//! # Ok(()) }
//! ```

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use smallvec::SmallVec;

use super::{AdminStore, CheckNow, Operation, PolicySet, Store, StoreError};
use crate::algorithm::{self, State};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::subject::Subject;

/// Limit state in this process's memory.
///
/// Sharded (no global lock); each subject's entry is locked only while one decision
/// runs on it. Entries whose state has decayed to "unused" are swept at most once per
/// sweep interval (one second by default) by whichever call notices the interval has
/// passed, and the map shrinks back when it has emptied, so a flood of one-off
/// subjects costs memory only for about one window.
///
/// Cloning is cheap and shares the state.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    map: DashMap<(u64, Subject), Entry>,
    clock: Arc<dyn Clock>,
    sweep_every_ms: u64,
    next_sweep_ms: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    states: SmallVec<[Option<State>; 1]>,
    expires_at_ms: u64,
}

impl MemoryStore {
    /// A memory store on the monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }

    /// A memory store reading time from `clock` (a [`FakeClock`](crate::clock::FakeClock)
    /// in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            inner: Arc::new(Inner {
                map: DashMap::new(),
                clock: Arc::new(clock),
                sweep_every_ms: 1_000,
                next_sweep_ms: AtomicU64::new(0),
            }),
        }
    }

    /// Sets how often expired entries are swept (default one second).
    ///
    /// Must be called before the store is cloned or shared.
    pub fn sweep_every(mut self, every: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.sweep_every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        }
        self
    }

    /// How many subjects (per policy set) hold state now, expired or not.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Whether no subject holds state.
    pub fn is_empty(&self) -> bool {
        self.inner.map.is_empty()
    }

    /// Drops every entry whose state has decayed, and gives memory back.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_ms();
        self.inner.sweep(now);
    }

    pub(crate) fn decide(&self, subject: Subject, set: &PolicySet, cost: u64) -> Decision {
        self.run_op(Operation::Check, subject, set, cost)
    }

    /// Every operation on one entry, under its lock: the model's steps, then what the
    /// operation keeps of them.
    pub(crate) fn run_op(
        &self,
        op: Operation,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        let inner = &*self.inner;
        let now = inner.clock.now_ms();
        inner.maybe_sweep(now);
        let policies = set.policies();
        let key = (set.fingerprint(), subject);
        if op == Operation::Reset {
            inner.map.remove(&key);
        }
        let fresh = || Entry {
            states: SmallVec::new(),
            expires_at_ms: 0,
        };
        let mut entry = match op {
            Operation::Check => inner.map.entry(key).or_insert_with(fresh),
            // The others never create an entry.
            _ => match inner.map.get_mut(&key) {
                Some(entry) => entry,
                None => {
                    let states: SmallVec<[Option<State>; 1]> =
                        SmallVec::from_elem(None, policies.len());
                    return peek(policies, &states, now, cost);
                }
            },
        };
        if entry.expires_at_ms <= now || entry.states.len() != policies.len() {
            entry.states.clear();
            entry.states.resize(policies.len(), None);
        }
        match op {
            Operation::Check => {}
            Operation::Refund => {
                for (policy, state) in policies.iter().zip(entry.states.iter_mut()) {
                    if let Some(next) = algorithm::refund(policy, state.as_ref(), now, cost) {
                        *state = Some(next);
                    }
                }
                return peek(policies, &entry.states, now, cost);
            }
            _ => return peek(policies, &entry.states, now, cost),
        }
        let (outcomes, keep) = algorithm::decide_all(policies, &mut entry.states, now, cost);
        if let Some(keep) = keep {
            entry.expires_at_ms = entry.expires_at_ms.max(now.saturating_add(keep));
        }
        drop(entry);
        Decision::from_outcomes(policies, outcomes)
    }
}

/// The decision a check would make on `states`, changing nothing.
fn peek(policies: &Arc<[Policy]>, states: &[Option<State>], now: u64, cost: u64) -> Decision {
    let outcomes = policies
        .iter()
        .zip(states)
        .map(|(policy, state)| algorithm::decide(policy, state.as_ref(), now, cost).outcome);
    Decision::from_outcomes(policies, outcomes)
}

impl Inner {
    fn maybe_sweep(&self, now: u64) {
        let due = self.next_sweep_ms.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        let next = now.saturating_add(self.sweep_every_ms);
        if self
            .next_sweep_ms
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.sweep(now);
        }
    }

    fn sweep(&self, now: u64) {
        self.map.retain(|_, entry| entry.expires_at_ms > now);
        if self.map.capacity() > 4 * self.map.len() + 1_024 {
            self.map.shrink_to_fit();
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Store for MemoryStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        ready(Ok(self.decide(subject, set, cost)))
    }

    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        CheckNow::Decided(Ok(self.decide(subject, set, cost)))
    }
}

impl AdminStore for MemoryStore {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        ready(Ok(self.run_op(op, subject, set, cost)))
    }
}
