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
        if set.is_scoped() {
            return self.run_scoped(Operation::Check, &subject, set, now, cost);
        }
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
        if set.is_scoped() {
            return self.run_scoped(op, &subject, set, now, cost);
        }
        let mut shard = inner.map.lock(set.fingerprint(), subject.as_bytes());
        if op == Operation::Reset {
            shard.remove();
            lock_epochs(inner).forget(set.fingerprint(), subject.as_bytes());
        }
        // A charge creates the entry (its debt is state the checks after it see), a
        // renewal too (it writes its holder's entry back even after the state was
        // lost); the others act on the entry there is, or on none.
        let entry = match op {
            Operation::Charge | Operation::Renew => Some(shard.find_or_insert(policies.len(), now)),
            _ => shard.find(policies.len(), now),
        };
        let Some(entry) = entry else {
            drop(shard);
            let mut states: SmallVec<[Option<State>; 1]> =
                SmallVec::from_elem(None, policies.len());
            return apply(op, set, &mut states, now, cost).0;
        };
        let (decision, keep) = apply(op, set, entry.states.as_mut_slice(), now, cost);
        entry.keep(now, keep);
        decision
    }

    /// Any operation of a scoped set: each scope's subject has an entry of its own (an
    /// org's shared by its users, a global one by everyone), keyed by the set's
    /// fingerprint and the scope. Under the store's scoped lock, the states are read
    /// from every entry, the operation runs on them as on one entry's, and what it
    /// wrote goes back: all or nothing, as one entry's.
    fn run_scoped(
        &self,
        op: Operation,
        subject: &Subject,
        set: &PolicySet,
        now: u64,
        cost: u64,
    ) -> Decision {
        let inner = &*self.inner;
        let policies = set.policies();
        let _one_at_a_time = inner.scoped.lock().unwrap_or_else(PoisonError::into_inner);
        let groups = scope_groups(set, subject);
        let mut states: SmallVec<[Option<State>; 4]> = SmallVec::from_elem(None, policies.len());
        for group in &groups {
            let mut shard = inner.map.lock(group.fingerprint, group.part);
            if op == Operation::Reset {
                shard.remove();
            } else if let Some(entry) = shard.find(group.policies.len(), now) {
                for (&i, state) in group.policies.iter().zip(entry.states.as_slice()) {
                    states[i].clone_from(state);
                }
            }
        }
        let before = states.clone();
        let (decision, keep) = apply(op, set, &mut states, now, cost);
        for group in &groups {
            let changed = group.policies.iter().any(|&i| states[i] != before[i]);
            if !changed {
                continue;
            }
            let mut shard = inner.map.lock(group.fingerprint, group.part);
            let entry = shard.find_or_insert(group.policies.len(), now);
            for (&i, state) in group.policies.iter().zip(entry.states.as_mut_slice()) {
                state.clone_from(&states[i]);
            }
            entry.keep(now, keep);
        }
        decision
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

/// `op` on the states of one subject's policies (`None` where there is none), as one
/// entry's: what it answers, and how long (ms from `now`) what it wrote must be kept.
/// The one writing of every operation's rule, for an entry and for a scoped set's
/// entries alike.
fn apply(
    op: Operation,
    set: &PolicySet,
    states: &mut [Option<State>],
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let policies = set.policies();
    if let Some(change) = hold_of(op, cost) {
        let mut keep = None;
        for (policy, state) in policies.iter().zip(states.iter_mut()) {
            keep = keep.max(algorithm::hold(policy, state, now, change));
        }
        // A holder's change answers for the in-flight policies alone.
        let (held, at) = set.held();
        return (
            peek(held, at.iter().map(|&i| states[i].as_ref()), now, 1),
            keep,
        );
    }
    match op {
        Operation::Check => {
            let (outcomes, keep) = algorithm::decide_all(policies, states, now, cost);
            (Decision::from_outcomes(policies, outcomes, cost), keep)
        }
        Operation::Charge => {
            let mut keep = 1;
            for (policy, state) in policies.iter().zip(states.iter_mut()) {
                if let Some((next, ttl)) = algorithm::charge(policy, state.as_ref(), now, cost) {
                    *state = Some(next);
                    keep = keep.max(ttl);
                }
            }
            (
                peek(policies, states.iter().map(Option::as_ref), now, 1),
                Some(keep),
            )
        }
        Operation::Refund => {
            for (policy, state) in policies.iter().zip(states.iter_mut()) {
                if let Some(next) = algorithm::refund(policy, state.as_ref(), now, cost) {
                    *state = Some(next);
                }
            }
            (
                peek(policies, states.iter().map(Option::as_ref), now, cost),
                None,
            )
        }
        // A peek, or a reset's answer on the fresh state its caller left.
        _ => (
            peek(policies, states.iter().map(Option::as_ref), now, cost),
            None,
        ),
    }
}

/// The entries of a scoped set's check: one per scope, with its policies' indexes.
struct ScopeGroup<'s> {
    /// The set's fingerprint mixed with the scope: entries no other set reads.
    fingerprint: u64,
    /// The scope's subject.
    part: &'s [u8],
    policies: SmallVec<[usize; 2]>,
}

/// `set`'s policies grouped by the subject they count in a check of `subject`.
fn scope_groups<'s>(set: &PolicySet, subject: &'s Subject) -> SmallVec<[ScopeGroup<'s>; 3]> {
    let mut groups: SmallVec<[ScopeGroup<'s>; 3]> = SmallVec::new();
    for (i, policy) in set.policies().iter().enumerate() {
        let scope = policy.scope();
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            set.fingerprint().hash(&mut h);
            scope.hash(&mut h);
            h.finish()
        };
        match groups.iter_mut().find(|g| g.fingerprint == fingerprint) {
            Some(group) => group.policies.push(i),
            None => groups.push(ScopeGroup {
                fingerprint,
                part: set.part_of(policy, subject),
                policies: smallvec::smallvec![i],
            }),
        }
    }
    groups
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

/// The decision a check would make on `states` (one a policy, in order), changing
/// nothing.
fn peek<'s>(
    policies: &Arc<[Policy]>,
    states: impl Iterator<Item = Option<&'s State>>,
    now: u64,
    cost: u64,
) -> Decision {
    let outcomes: Arc<[_]> = policies
        .iter()
        .zip(states)
        .map(|(policy, state)| algorithm::decide(policy, state, now, cost).outcome)
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

/// The memory store keeps live limits for the limiters of this process.
impl crate::store::limits::LimitStore for MemoryStore {
    fn limits_version(&self) -> crate::store::limits::LimitFuture<u64> {
        let version = self.lock_limits().version();
        Box::pin(ready(Ok(version)))
    }

    fn read_limits(&self) -> crate::store::limits::LimitFuture<crate::store::limits::LimitsAt> {
        let limits = self.lock_limits().read();
        Box::pin(ready(Ok(limits)))
    }

    fn write_limit(
        &self,
        field: String,
        limit: Option<u64>,
    ) -> crate::store::limits::LimitFuture<()> {
        self.lock_limits().write(field, limit);
        Box::pin(ready(Ok(())))
    }
}

impl MemoryStore {
    fn lock_limits(&self) -> MutexGuard<'_, crate::store::limits::StoredLimits> {
        self.inner
            .limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
