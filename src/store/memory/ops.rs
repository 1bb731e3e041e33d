//! The store's operations on one entry each, under its shard's lock: the check (the
//! request path), peek, refund, reset and charge, and the leasing check with its
//! give-back.

use std::future::{ready, Ready};
use std::sync::{Arc, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::epochs::Epochs;
use super::map::Entry;
use super::store::{Inner, MemoryStore};
use crate::algorithm::in_flight::Hold;
use crate::algorithm::{self, Grant, State};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::policy::Policy;
use crate::store::backend::{AdminStore, Backend, CheckNow, Operation, PolicySet};
use crate::store::lease::{GiveBack, GiveBackFuture, LeaseAsk, LeaseFuture, LeaseStore};
use crate::subject::Subject;

impl MemoryStore {
    /// A check: the request path, kept short (one clock read, one hash, one lock, and
    /// for one policy no collection of steps or outcomes). Inlined into the caller, so
    /// the decision is built where it is wanted rather than copied out.
    #[inline]
    pub(crate) fn decide(&self, subject: Subject, set: &PolicySet, cost: u64) -> Decision {
        let inner = &*self.inner;
        let now = inner.now_and_sweep();
        let policies = set.policies();
        let mut shard = inner.map.lock(set.fingerprint(), subject.as_bytes());
        let entry = shard.find_or_insert(policies.len(), now);
        if let ([policy], [state]) = (&policies[..], entry.states.as_mut_slice()) {
            let (outcome, keep) = algorithm::decide_one(policy, state, now, cost);
            entry.keep(now, keep);
            drop(shard);
            return Decision::from_outcome(policies, outcome);
        }
        let decision = decide_many(entry, policies, now, cost);
        drop(shard);
        decision
    }

    /// Every operation on one entry, under its shard's lock: the model's steps, then
    /// what the operation keeps of them.
    pub(crate) fn run_op(
        &self,
        op: Operation,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        if op == Operation::Check {
            return self.decide(subject, set, cost);
        }
        let inner = &*self.inner;
        let now = inner.now_and_sweep();
        let policies = set.policies();
        let mut shard = inner.map.lock(set.fingerprint(), subject.as_bytes());
        if op == Operation::Reset {
            shard.remove();
            lock_epochs(inner).forget(set.fingerprint(), subject.as_bytes());
        }
        if let Some(change) = hold_of(op, cost) {
            // A renewal writes its holder's entry back even after the state was lost.
            let entry = match change {
                Hold::Renew { .. } => Some(shard.find_or_insert(policies.len(), now)),
                Hold::Release => shard.find(policies.len(), now),
            };
            let Some(entry) = entry else {
                drop(shard);
                let states: SmallVec<[Option<State>; 1]> =
                    SmallVec::from_elem(None, policies.len());
                return peek(policies, &states, now, 1);
            };
            let mut keep = None;
            for (policy, state) in policies.iter().zip(entry.states.as_mut_slice()) {
                keep = keep.max(algorithm::hold(policy, state, now, change));
            }
            entry.keep(now, keep);
            return peek(policies, entry.states.as_slice(), now, 1);
        }
        if op == Operation::Charge {
            // A charge creates the entry too: its debt is state the checks after it see.
            let entry = shard.find_or_insert(policies.len(), now);
            let mut keep = 1;
            for (policy, state) in policies.iter().zip(entry.states.as_mut_slice()) {
                if let Some((next, ttl)) = algorithm::charge(policy, state.as_ref(), now, cost) {
                    *state = Some(next);
                    keep = keep.max(ttl);
                }
            }
            entry.keep(now, Some(keep));
            return peek(policies, entry.states.as_slice(), now, 1);
        }
        // Only a check and a charge create an entry.
        let Some(entry) = shard.find(policies.len(), now) else {
            drop(shard);
            let states: SmallVec<[Option<State>; 1]> = SmallVec::from_elem(None, policies.len());
            return peek(policies, &states, now, cost);
        };
        if op == Operation::Refund {
            for (policy, state) in policies.iter().zip(entry.states.as_mut_slice()) {
                if let Some(next) = algorithm::refund(policy, state.as_ref(), now, cost) {
                    *state = Some(next);
                }
            }
        }
        // A peek, or what a check would now make of the refunded state.
        peek(policies, entry.states.as_slice(), now, cost)
    }

    /// A leasing check on one entry, under its shard's lock (the model of the Redis
    /// store's; see [`crate::lease`]).
    pub(crate) fn decide_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> (Decision, Grant) {
        let inner = &*self.inner;
        let now = inner.now_and_sweep();
        let policies = set.policies();
        let mut shard = inner.map.lock(set.fingerprint(), subject.as_bytes());
        let entry = shard.find_or_insert(policies.len(), now);
        let (outcomes, keep, grant) = algorithm::decide_leasing(
            policies,
            entry.states.as_mut_slice(),
            now,
            cost,
            ask.want,
            ask.batch,
        );
        entry.keep(now, keep);
        let expires = entry.expires_at_ms;
        drop(shard);
        let mut grant = grant;
        if grant.units > 0 {
            let subject = subject.as_bytes();
            grant.epoch = lock_epochs(inner).keep(set.fingerprint(), subject, now, expires);
        }
        (Decision::from_outcomes(policies, outcomes, cost), grant)
    }
}

/// A check of several policies on the entry `decide` found and renewed, all or nothing
/// (out of line: the one-policy path stays small enough to inline).
#[inline(never)]
fn decide_many(entry: &mut Entry, policies: &Arc<[Policy]>, now: u64, cost: u64) -> Decision {
    let (outcomes, keep) = algorithm::decide_all(policies, entry.states.as_mut_slice(), now, cost);
    entry.keep(now, keep);
    Decision::from_outcomes(policies, outcomes, cost)
}

/// What `op` does to in-flight entries, if it is a release or a renewal (of `cost`
/// requests held).
fn hold_of(op: Operation, cost: u64) -> Option<Hold> {
    match op {
        Operation::Release => Some(Hold::Release),
        Operation::Renew => Some(Hold::Renew { held: cost }),
        _ => None,
    }
}

/// The decision a check would make on `states`, changing nothing.
fn peek(policies: &Arc<[Policy]>, states: &[Option<State>], now: u64, cost: u64) -> Decision {
    let outcomes: Arc<[_]> = policies
        .iter()
        .zip(states)
        .map(|(policy, state)| algorithm::decide(policy, state.as_ref(), now, cost).outcome)
        .collect();
    Decision::from_outcomes(policies, outcomes.iter().copied(), cost).with_each(outcomes)
}

/// The lease generations' lock; a panic elsewhere while it was held leaves plain data.
fn lock_epochs(inner: &Inner) -> MutexGuard<'_, Epochs> {
    inner.epochs.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Backend for MemoryStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        ready(Ok(self.decide(subject, set, cost)))
    }

    #[inline]
    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        CheckNow::Decided(Ok(self.decide(subject, set, cost)))
    }
}

impl AdminStore for MemoryStore {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        ready(Ok(self.run_op(op, subject, set, cost)))
    }
}

/// Leases from one process's memory gain nothing over its checks; the memory store
/// leases as the model of the Redis store's leasing check, for tests that run leases
/// on a fake clock and compare the two.
impl LeaseStore for MemoryStore {
    fn check_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> LeaseFuture {
        Box::pin(ready(Ok(self.decide_leasing(subject, set, cost, ask))))
    }

    fn give_back(&self, subject: Subject, set: &PolicySet, back: GiveBack) -> GiveBackFuture {
        let now = self.inner.clock.now_ms();
        let epoch = lock_epochs(&self.inner).get(set.fingerprint(), subject.as_bytes(), now);
        let op = if now < back.before_ms && epoch == Some(back.epoch) {
            Operation::Refund
        } else {
            Operation::Peek
        };
        Box::pin(ready(Ok(self.run_op(op, subject, set, back.units))))
    }

    fn lease_clock(&self) -> Option<Arc<dyn Clock>> {
        Some(Arc::clone(&self.inner.clock))
    }
}
