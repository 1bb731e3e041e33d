//! The limiter: a store and the policies checked together, usable without HTTP.
//!
//! ```
//! use redlimit::{Limiter, MemoryStore, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 10 per second and 1000 per hour: both must admit, and a denial consumes nothing.
//! let limiter = Limiter::new(
//!     MemoryStore::new(),
//!     Policy::token_bucket("burst", 10, 10, Duration::from_secs(1))?,
//! )
//! .policy(Policy::sliding_window("hourly", 1000, Duration::from_secs(3600))?);
//!
//! let decision = limiter.check("tenant-7", 1).await?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 9);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::block_cache::BlockCache;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Decision, Origin};
use crate::error::Error;
use crate::lease::{DecisionFuture, LeaseError, LeaseTable, Leased, Leases};
use crate::policy::Policy;
use crate::store::{
    AdminStore, CheckNow, LeaseStore, MemoryStore, Operation, PolicySet, Store, StoreError,
};
use crate::subject::Subject;

/// A store and the policies one kind of request is checked against.
///
/// Built with at least one policy, so every check has something to decide. Wrap it in an
/// `Arc` (the layer does) to share it.
#[derive(Debug, Clone)]
pub struct Limiter<S> {
    store: S,
    set: PolicySet,
    /// What runs around the store: block cache and fallback (none by default, so the
    /// plain path costs nothing extra).
    guard: Option<Arc<Guard>>,
}

/// The limiter's local helpers, shared by every pending check.
#[derive(Debug)]
struct Guard {
    clock: Arc<dyn Clock>,
    blocks: Option<BlockCache>,
    fallback: Option<MemoryStore>,
    /// The lease settings and this limiter's leases, when on.
    leases: Option<(Leases, Arc<LeaseTable>)>,
}

impl<S: Store> Limiter<S> {
    /// A limiter on `store` with its first policy.
    pub fn new(store: S, policy: Policy) -> Self {
        Self {
            store,
            set: PolicySet::new(vec![policy]),
            guard: None,
        }
    }

    fn guard_mut(&mut self) -> &mut Guard {
        let guard = self.guard.get_or_insert_with(|| {
            Arc::new(Guard {
                clock: Arc::new(MonotonicClock::new()),
                blocks: None,
                fallback: None,
                leases: None,
            })
        });
        if Arc::get_mut(guard).is_none() {
            // Configured after cloning: give this limiter its own copy (a fresh, empty
            // block cache of the same size) and leave the other clones unchanged.
            *guard = Arc::new(Guard {
                clock: Arc::clone(&guard.clock),
                blocks: guard.blocks.as_ref().map(BlockCache::empty_like),
                fallback: guard.fallback.clone(),
                leases: guard.leases.as_ref().map(|(settings, table)| {
                    let table = table.empty_like(Arc::clone(&guard.clock), None);
                    (settings.clone(), Arc::new(table))
                }),
            });
        }
        Arc::get_mut(guard).unwrap_or_else(|| unreachable!("the guard was just made unique"))
    }

    /// Answers subjects the store denied locally until their retry time, holding at
    /// most `max_entries` of them: a flood from one over-limit subject then sends
    /// almost nothing to the store. See [`crate::block_cache`].
    pub fn block_cache(mut self, max_entries: usize) -> Self {
        self.guard_mut().blocks = Some(BlockCache::new(max_entries));
        self
    }

    /// Decides in `fallback` (this process's memory) while the store fails, instead of
    /// handing the failure to the caller. Limits then hold per process until the store
    /// returns; each call tries the store first, so no restart is needed.
    pub fn fallback(mut self, fallback: MemoryStore) -> Self {
        self.guard_mut().fallback = Some(fallback);
        self
    }

    /// The clock of the block cache and of the rates and idle times leases measure (the
    /// monotonic clock by default; a fake one in tests). Leases and their kept denials
    /// are timed on the store's clock instead ([`LeaseStore::lease_clock`]), so a local
    /// clock that runs wrong cannot carry leased units past their window.
    pub fn local_clock(mut self, clock: impl Clock) -> Self {
        let guard = self.guard_mut();
        guard.clock = Arc::new(clock);
        if let Some((_, table)) = &mut guard.leases {
            *table = Arc::new(table.empty_like(Arc::clone(&guard.clock), None));
        }
        self
    }

    /// Adds a policy that must also admit every request. A policy with the same name
    /// as one already present replaces it (names key the state in Redis).
    ///
    /// With leases on ([`Limiter::leases`]), they are planned again for the new set.
    /// A sliding log never leases (exactness is its promise): adding one turns leases
    /// off for this limiter, with a warning in the log. [`Limiter::leases`] after the
    /// policies reports that as [`LeaseError::SlidingLog`] instead.
    pub fn policy(mut self, policy: Policy) -> Self {
        let mut policies: Vec<Policy> = self.set.policies().to_vec();
        match policies.iter_mut().find(|p| p.name() == policy.name()) {
            Some(existing) => *existing = policy,
            None => policies.push(policy),
        }
        self.set = PolicySet::new(policies);
        if self
            .guard
            .as_ref()
            .is_some_and(|guard| guard.leases.is_some())
        {
            let set = self.set.clone();
            let guard = self.guard_mut();
            let clock = Arc::clone(&guard.clock);
            let refused = match &mut guard.leases {
                Some((settings, table)) => match settings.resolve(&set) {
                    Ok(plan) => {
                        *table = Arc::new(table.empty_like(clock, Some((plan, set))));
                        None
                    }
                    Err(error) => Some(error),
                },
                None => None,
            };
            if let Some(error) = refused {
                tracing::warn!(%error, "a policy added after Limiter::leases: leases are off for this limiter");
                guard.leases = None;
            }
        }
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides whether `subject` may spend `cost` now, and consumes it if so.
    ///
    /// A cost of 0, or above what some policy can ever admit, is an error rather than a
    /// denial that would never end.
    #[inline]
    pub fn check(&self, subject: impl Into<Subject>, cost: u32) -> CheckFuture<S::Future> {
        let cost = match self.valid_cost(cost) {
            Ok(cost) => cost,
            Err(error) => return CheckFuture::settled(Err(error)),
        };
        let subject = subject.into();
        let Some(guard) = &self.guard else {
            return match self.store.check_now(subject, &self.set, cost) {
                CheckNow::Decided(result) => CheckFuture::settled(result.map_err(Error::from)),
                CheckNow::Later(subject) => CheckFuture {
                    state: CheckState::Store {
                        future: self.store.check(subject, &self.set, cost),
                    },
                    after: None,
                },
            };
        };
        if let Some(blocks) = &guard.blocks {
            if let Some(decision) = blocks.lookup(&subject, cost, guard.clock.now_ms()) {
                return CheckFuture::settled(Ok(decision));
            }
        }
        // What runs once the store answers: made only for a check that goes to it.
        let after = || After {
            guard: Arc::clone(guard),
            subject: subject.clone(),
            set: self.set.clone(),
            cost,
        };
        if let Some((_, leases)) = &guard.leases {
            let now = guard.clock.now_ms();
            match leases.check(&subject, cost, now) {
                // Served from a lease or a kept denial: nothing to do afterwards.
                Leased::Decided(decision) => return CheckFuture::settled(Ok(decision)),
                Leased::Pending(future) => {
                    return CheckFuture {
                        state: CheckState::Lease {
                            future: PendingLease(future),
                        },
                        after: Some(after()),
                    }
                }
                Leased::Plain => {}
            }
        }
        let after = after();
        match self.store.check_now(subject, &self.set, cost) {
            CheckNow::Decided(result) => CheckFuture::settled(after.finish(result)),
            CheckNow::Later(subject) => CheckFuture {
                state: CheckState::Store {
                    future: self.store.check(subject, &self.set, cost),
                },
                after: Some(after),
            },
        }
    }
}

impl<S: Store + LeaseStore + Clone> Limiter<S> {
    /// Serves hot subjects from leases: units taken from the store in the same call as
    /// a check and spent by this instance without a round trip, under one budget
    /// shared by every instance. See [`crate::lease`] for how, and for what leases
    /// promise (no over-admission for window counters; a token bucket's burst grows by
    /// at most its refill rate times the lease lifetime).
    ///
    /// A sliding log never leases: a set with one is refused
    /// ([`LeaseError::SlidingLog`]), and one added later turns leases off (see
    /// [`Limiter::policy`]); other policies added later are planned for. Settings
    /// that cannot work are a [`LeaseError`] too.
    pub fn leases(mut self, leases: Leases) -> Result<Self, LeaseError> {
        let plan = leases.resolve(&self.set)?;
        let store: Arc<dyn LeaseStore> = Arc::new(self.store.clone());
        let set = self.set.clone();
        let guard = self.guard_mut();
        let table = LeaseTable::new(plan, set, store, Arc::clone(&guard.clock));
        guard.leases = Some((leases, Arc::new(table)));
        Ok(self)
    }

    /// Gives back the units of every expired lease now and waits for the store, as the
    /// background sweep does every quarter lifetime; returns how many calls it made.
    /// For tests on a fake clock and for a clean shutdown.
    #[doc(hidden)]
    pub async fn sweep_leases(&self) -> usize {
        match self.guard.as_ref().and_then(|g| g.leases.as_ref()) {
            Some((_, table)) => table.sweep_now().await,
            None => 0,
        }
    }

    /// Units this instance holds now in unexpired leases, over all subjects: what it
    /// could admit without the store. For tests that bound what a lost store costs.
    #[doc(hidden)]
    pub fn held_units(&self) -> u64 {
        self.guard
            .as_ref()
            .and_then(|g| g.leases.as_ref())
            .map_or(0, |(_, table)| table.held_units())
    }

    /// Subjects whose rate or lease this limiter tracks.
    #[doc(hidden)]
    pub fn leased_subjects(&self) -> usize {
        self.guard
            .as_ref()
            .and_then(|g| g.leases.as_ref())
            .map_or(0, |(_, table)| table.len())
    }
}

impl<S> Limiter<S> {
    /// The policies checked, in order.
    pub fn policies(&self) -> &[Policy] {
        self.set.policies()
    }

    /// The policies with their fingerprint, as stores see them.
    pub fn policy_set(&self) -> &PolicySet {
        &self.set
    }

    /// `cost` as the stores take it, or why no policy set could ever admit it.
    #[inline]
    pub(crate) fn valid_cost(&self, cost: u32) -> Result<u64, Error> {
        let cost = u64::from(cost);
        if cost == 0 {
            return Err(Error::ZeroCost);
        }
        if cost > self.set.max_cost() {
            let policy = self
                .set
                .policies()
                .iter()
                .find(|p| p.max_cost() < cost)
                .map(|p| p.name().to_owned())
                .unwrap_or_default();
            return Err(Error::CostTooHigh {
                cost,
                max: self.set.max_cost(),
                policy,
            });
        }
        Ok(cost)
    }
}

/// Admin operations: what a check would decide, giving back, forgetting.
///
/// They go through the same per-algorithm code as the check (one script in Redis,
/// the model in memory), bypass the block cache (and clear the subject's entry in
/// it when they give back), and are not counted as decisions.
///
/// ```
/// use redlimit::{clock::FakeClock, Limiter, MemoryStore, Policy};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(
///     MemoryStore::with_clock(FakeClock::new(0)),
///     Policy::fixed_window("api", 2, Duration::from_secs(60))?,
/// );
/// limiter.check("u1", 2).await?;
/// // What a check would say now, consuming nothing.
/// assert!(!limiter.peek("u1", 1).await?.is_allowed());
/// // The handler failed: give the cost back, and the next check admits again.
/// limiter.refund("u1", 1).await?;
/// assert!(limiter.check("u1", 1).await?.is_allowed());
/// // Forget the subject altogether.
/// limiter.reset("u1").await?;
/// assert_eq!(limiter.peek("u1", 1).await?.remaining(), 1);
/// # Ok(()) }
/// ```
impl<S: AdminStore> Limiter<S> {
    /// The decision [`Limiter::check`] would make now for `cost`, consuming nothing.
    ///
    /// Goes to the store (not the block cache); the fallback answers while the store
    /// fails, as for a check.
    pub async fn peek(&self, subject: impl Into<Subject>, cost: u32) -> Result<Decision, Error> {
        let cost = self.valid_cost(cost)?;
        self.admin(Operation::Peek, subject.into(), cost).await
    }

    /// Gives back `cost` units a check consumed, for instance when the handler
    /// answered 5xx, and answers as [`Limiter::peek`] of `cost` would afterwards.
    /// With leases, this instance forgets the subject's kept denial; its lease stays
    /// (the store still counts its units).
    ///
    /// Per policy (shadow ones included): a fixed or sliding window lowers its current
    /// window's count (not below 0; nothing if the window has changed since); a token
    /// bucket moves its theoretical arrival time back by `cost` intervals (not before
    /// now); a sliding log removes its `cost` most recent stamps still in the window.
    /// The state only shrinks and keeps its expiry. The subject's cached denial, if
    /// any, is dropped. While the store fails, the fallback (if any) is refunded.
    ///
    /// To give back what a check took, use [`Limiter::refund_decision`]: it refunds
    /// where that check's cost went, which this admin operation does not know.
    pub async fn refund(&self, subject: impl Into<Subject>, cost: u32) -> Result<Decision, Error> {
        let cost = self.valid_cost(cost)?;
        let subject = subject.into();
        if let Some(guard) = &self.guard {
            if let Some(blocks) = &guard.blocks {
                blocks.forget(&subject);
            }
            if let Some((_, table)) = &guard.leases {
                table.forget_denial(&subject);
            }
        }
        self.admin(Operation::Refund, subject, cost).await
    }

    /// Gives back `cost` units where `decision` (this limiter's allowed check of
    /// `subject`) took them, and answers as [`Limiter::refund`] does; `None` when
    /// there was nothing to give back.
    ///
    /// A decision of the store (or of a lease) is refunded in the store, and only
    /// there: if the store fails now, the refund is an error, since the fallback never
    /// counted the request. A decision of the fallback is refunded in the fallback,
    /// which counted it, never in the store, which did not. A request let through
    /// unchecked ([`Origin::FailOpen`]: a store that failed, or timed out after the
    /// call may have run) and a denial consumed nothing here: nothing is given back.
    /// The layer's [`refund_on`](crate::RateLimitLayer::refund_on) refunds this way.
    pub async fn refund_decision(
        &self,
        decision: &Decision,
        subject: impl Into<Subject>,
        cost: u32,
    ) -> Result<Option<Decision>, Error> {
        if !decision.is_allowed() {
            return Ok(None);
        }
        self.refund_from(decision.origin(), subject.into(), cost)
            .await
    }

    /// [`Limiter::refund_decision`] of an allowed decision from `origin`.
    pub(crate) async fn refund_from(
        &self,
        origin: Origin,
        subject: Subject,
        cost: u32,
    ) -> Result<Option<Decision>, Error> {
        let cost = self.valid_cost(cost)?;
        let guard = self.guard.as_ref();
        match origin {
            Origin::FailOpen | Origin::BlockCache => Ok(None),
            Origin::Fallback => Ok(guard.and_then(|g| g.fallback.as_ref()).map(|fallback| {
                fallback
                    .run_op(Operation::Refund, subject, &self.set, cost)
                    .with_origin(Origin::Fallback)
            })),
            Origin::Store | Origin::Lease => {
                if let Some(blocks) = guard.and_then(|g| g.blocks.as_ref()) {
                    blocks.forget(&subject);
                }
                match self
                    .store
                    .run(Operation::Refund, subject, &self.set, cost)
                    .await
                {
                    Ok(decision) => Ok(Some(decision)),
                    Err(error) => {
                        crate::telemetry::store_failed(&error, false);
                        Err(Error::Store(error))
                    }
                }
            }
        }
    }

    /// Forgets `subject`'s state for every policy of this limiter (deletes its keys),
    /// its cached denial, its lease and kept denial on this instance, and its state in
    /// the fallback. Other instances' leases of the subject are not spent twice: see
    /// [`crate::lease`] for what a reset costs while they hold some.
    ///
    /// A store failure is an error even with a fallback: the store's state is unchanged.
    pub async fn reset(&self, subject: impl Into<Subject>) -> Result<(), Error> {
        let subject = subject.into();
        if let Some(guard) = &self.guard {
            if let Some(blocks) = &guard.blocks {
                blocks.forget(&subject);
            }
            if let Some((_, table)) = &guard.leases {
                table.forget(&subject);
            }
            if let Some(fallback) = &guard.fallback {
                fallback.run_op(Operation::Reset, subject.clone(), &self.set, 1);
            }
        }
        self.store
            .run(Operation::Reset, subject, &self.set, 1)
            .await
            .map(drop)
            .map_err(|error| {
                crate::telemetry::store_failed(&error, false);
                Error::Store(error)
            })
    }

    async fn admin(&self, op: Operation, subject: Subject, cost: u64) -> Result<Decision, Error> {
        let fallback = self.guard.as_ref().and_then(|g| g.fallback.as_ref());
        let key = fallback.map(|_| subject.clone());
        match self.store.run(op, subject, &self.set, cost).await {
            Ok(decision) => Ok(decision),
            Err(error) => {
                crate::telemetry::store_failed(&error, fallback.is_some());
                match (fallback, key) {
                    (Some(fallback), Some(subject)) => Ok(fallback
                        .run_op(op, subject, &self.set, cost)
                        .with_origin(Origin::Fallback)),
                    _ => Err(Error::Store(error)),
                }
            }
        }
    }
}

/// What a guarded check needs once the store has answered.
#[derive(Debug)]
struct After {
    guard: Arc<Guard>,
    subject: Subject,
    set: PolicySet,
    cost: u64,
}

impl After {
    fn finish(self, result: Result<Decision, StoreError>) -> Result<Decision, Error> {
        let Self {
            guard,
            subject,
            set,
            cost,
        } = self;
        match result {
            Ok(decision) => {
                if let Some(blocks) = &guard.blocks {
                    if decision.is_allowed() {
                        blocks.forget(&subject);
                    } else {
                        blocks.insert(subject, cost, &decision, guard.clock.now_ms());
                    }
                }
                Ok(decision)
            }
            Err(error) => match &guard.fallback {
                Some(fallback) => {
                    crate::telemetry::store_failed(&error, true);
                    Ok(fallback
                        .decide(subject, &set, cost)
                        .with_origin(Origin::Fallback))
                }
                None => Err(Error::Store(error)),
            },
        }
    }
}

pin_project! {
    /// The pending result of [`Limiter::check`].
    #[derive(Debug)]
    pub struct CheckFuture<F> {
        #[pin]
        state: CheckState<F>,
        after: Option<After>,
    }
}

pin_project! {
    #[project = CheckStateProj]
    #[derive(Debug)]
    enum CheckState<F> {
        Store { #[pin] future: F },
        Lease { future: PendingLease },
        Ready { result: Option<Result<Decision, Error>> },
    }
}

/// A leasing check, or a wait for one, on its way (boxed: it holds the store's call).
struct PendingLease(DecisionFuture);

impl std::fmt::Debug for PendingLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingLease")
    }
}

impl<F> CheckFuture<F> {
    /// A check decided already (by the block cache, a store that decides at once, or a
    /// refused cost), reported as a completed one is.
    #[inline]
    fn settled(result: Result<Decision, Error>) -> Self {
        report(&result);
        CheckFuture {
            state: CheckState::Ready {
                result: Some(result),
            },
            after: None,
        }
    }

    /// The result, if the check was decided without waiting: the layer's fast path,
    /// which then needs no future at all.
    pub(crate) fn take_settled(&mut self) -> Option<Result<Decision, Error>> {
        match &mut self.state {
            CheckState::Ready { result } => result.take(),
            CheckState::Store { .. } | CheckState::Lease { .. } => None,
        }
    }
}

/// Logs and counts a check's result.
#[inline]
fn report(outcome: &Result<Decision, Error>) {
    match outcome {
        Ok(decision) => crate::telemetry::decided(decision),
        Err(Error::Store(error)) => crate::telemetry::store_failed(error, false),
        Err(_) => {}
    }
}

impl<F> Future for CheckFuture<F>
where
    F: Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Decision, Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            CheckStateProj::Store { future } => {
                let result = std::task::ready!(future.poll(cx));
                let outcome = match this.after.take() {
                    Some(after) => after.finish(result),
                    None => result.map_err(Error::from),
                };
                report(&outcome);
                Poll::Ready(outcome)
            }
            CheckStateProj::Lease { future } => {
                let result = std::task::ready!(future.0.as_mut().poll(cx));
                let outcome = match this.after.take() {
                    Some(after) => after.finish(result),
                    None => result.map_err(Error::from),
                };
                report(&outcome);
                Poll::Ready(outcome)
            }
            CheckStateProj::Ready { result } => match result.take() {
                Some(result) => Poll::Ready(result),
                None => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::MemoryStore;
    use std::time::Duration;

    fn two_policies(clock: &FakeClock) -> Limiter<MemoryStore> {
        Limiter::new(
            MemoryStore::with_clock(clock.clone()),
            Policy::fixed_window("second", 3, Duration::from_secs(1)).unwrap(),
        )
        .policy(Policy::fixed_window("minute", 5, Duration::from_secs(60)).unwrap())
    }

    #[tokio::test]
    async fn a_denial_by_one_policy_consumes_from_none() {
        let clock = FakeClock::new(0);
        let limiter = two_policies(&clock);
        for _ in 0..3 {
            assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        }
        let denied = limiter.check("s", 1).await.unwrap();
        assert_eq!(denied.denied_by(), Some("second"));
        assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
        clock.advance(Duration::from_secs(1));
        // "minute" saw 3, not 4: two more pass, then it denies.
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        let last = limiter.check("s", 1).await.unwrap();
        assert!(last.is_allowed());
        assert_eq!(last.policy().name(), "minute");
        assert_eq!(last.remaining(), 0);
        let denied = limiter.check("s", 1).await.unwrap();
        assert_eq!(denied.denied_by(), Some("minute"));
    }

    #[tokio::test]
    async fn impossible_costs_are_errors_not_denials() {
        let limiter = two_policies(&FakeClock::new(0));
        assert!(matches!(limiter.check("s", 0).await, Err(Error::ZeroCost)));
        match limiter.check("s", 4).await {
            Err(Error::CostTooHigh { max, policy, .. }) => {
                assert_eq!((max, policy.as_str()), (3, "second"));
            }
            other => panic!("expected CostTooHigh, got {other:?}"),
        }
        assert!(limiter.check("s", 3).await.unwrap().is_allowed());
    }

    #[test]
    fn same_name_replaces() {
        let limiter = two_policies(&FakeClock::new(0))
            .policy(Policy::sliding_log("second", 9, Duration::from_secs(1)).unwrap());
        assert_eq!(limiter.policies().len(), 2);
        assert_eq!(limiter.policies()[0].limit(), 9);
    }

    /// A store that always fails, to exercise the fallback.
    #[derive(Debug)]
    struct Broken;

    impl Store for Broken {
        type Future = std::future::Ready<Result<Decision, StoreError>>;
        fn check(&self, _: Subject, _: &PolicySet, _: u64) -> Self::Future {
            std::future::ready(Err(StoreError::timeout()))
        }
    }

    /// Counts calls that reach the store.
    #[derive(Debug)]
    struct Counting(MemoryStore, std::sync::atomic::AtomicUsize);

    impl Store for Counting {
        type Future = <MemoryStore as Store>::Future;
        fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.0.check(subject, set, cost)
        }
    }

    #[tokio::test]
    async fn the_block_cache_answers_a_flood_without_the_store() {
        let clock = FakeClock::new(0);
        let store = Arc::new(Counting(
            MemoryStore::with_clock(clock.clone()),
            Default::default(),
        ));
        let limiter = Limiter::new(
            Arc::clone(&store),
            Policy::sliding_window("p", 10, Duration::from_secs(1)).unwrap(),
        )
        .block_cache(100)
        .local_clock(clock.clone());
        let mut first_denial = None;
        for i in 0..1_000 {
            let d = limiter.check("flooder", 1).await.unwrap();
            if !d.is_allowed() && first_denial.is_none() {
                first_denial = Some((i, d.clone()));
            }
            assert_eq!(d.is_allowed(), i < 10, "request {i}");
        }
        let (_, denial) = first_denial.unwrap();
        assert_eq!(store.1.load(std::sync::atomic::Ordering::SeqCst), 11);
        let cached = limiter.check("flooder", 1).await.unwrap();
        assert_eq!(cached.origin(), Origin::BlockCache);
        assert_eq!(cached.retry_after(), denial.retry_after());
        // Others still reach the store, and so does the flooder once its wait is over.
        assert!(limiter.check("someone-else", 1).await.unwrap().is_allowed());
        clock.advance(denial.retry_after().unwrap());
        let after = limiter.check("flooder", 1).await.unwrap();
        assert!(after.is_allowed());
        assert_eq!(after.origin(), Origin::Store);
    }

    #[tokio::test]
    async fn the_block_cache_answers_only_the_denied_cost_until_the_subject_is_admitted() {
        let clock = FakeClock::new(0);
        let limiter = Limiter::new(
            MemoryStore::with_clock(clock.clone()),
            Policy::sliding_log("p", 3, Duration::from_secs(1)).unwrap(),
        )
        .block_cache(10)
        .local_clock(clock.clone());
        for t in [0, 100, 200] {
            clock.set_ms(t);
            assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        }
        clock.set_ms(300);
        let one = limiter.check("s", 1).await.unwrap();
        assert_eq!(one.retry_after(), Some(Duration::from_millis(700)));
        // Two units wait for the stamp at 100 to leave, not the one at 0.
        let two = limiter.check("s", 2).await.unwrap();
        assert_eq!(two.origin(), Origin::Store);
        assert_eq!(two.retry_after(), Some(Duration::from_millis(800)));
        let again = limiter.check("s", 2).await.unwrap();
        assert_eq!(again.origin(), Origin::BlockCache);
        // One unit fits at 1 000 and consumes: two units now wait for 1 200, not 1 100.
        clock.set_ms(1_000);
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        let two = limiter.check("s", 2).await.unwrap();
        assert_eq!(two.origin(), Origin::Store);
        assert_eq!(two.retry_after(), Some(Duration::from_millis(200)));
    }

    #[tokio::test]
    async fn the_block_cache_survives_a_local_clock_that_goes_back() {
        let clock = FakeClock::new(10_000);
        let limiter = Limiter::new(
            MemoryStore::with_clock(clock.clone()),
            Policy::fixed_window("p", 1, Duration::from_secs(1)).unwrap(),
        )
        .block_cache(10)
        .local_clock(clock.clone());
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        assert!(!limiter.check("s", 1).await.unwrap().is_allowed());
        clock.set_ms(9_500);
        let cached = limiter.check("s", 1).await.unwrap();
        assert_eq!(cached.origin(), Origin::BlockCache);
        // Still blocked until 11 000, now 1.5 s away; the store says the same.
        assert_eq!(cached.retry_after(), Some(Duration::from_millis(1_500)));
        let store = limiter.store().decide(Subject::new("s"), &limiter.set, 1);
        assert_eq!(store, cached.with_origin(Origin::Store));
    }

    #[tokio::test]
    async fn the_block_cache_shortens_its_wait_as_time_passes_and_stays_bounded() {
        let clock = FakeClock::new(0);
        let limiter = Limiter::new(
            MemoryStore::with_clock(clock.clone()),
            Policy::fixed_window("p", 2, Duration::from_secs(10)).unwrap(),
        )
        .block_cache(3)
        .local_clock(clock.clone());
        for subject in ["a", "b", "c", "d", "e"] {
            for _ in 0..3 {
                limiter.check(subject, 1).await.unwrap();
            }
        }
        let blocks = limiter.guard.as_ref().unwrap().blocks.as_ref().unwrap();
        assert_eq!(blocks.len(), 3, "bounded to its size");
        clock.advance(Duration::from_secs(4));
        let cached = limiter.check("a", 1).await.unwrap();
        assert_eq!(cached.origin(), Origin::BlockCache);
        assert_eq!(cached.retry_after(), Some(Duration::from_secs(6)));
        // A cost smaller than the denied one may fit sooner: the cache lets it through
        // to the store.
        clock.advance(Duration::from_secs(6));
        assert!(limiter.check("f", 1).await.unwrap().is_allowed());
        assert!(!limiter.check("f", 2).await.unwrap().is_allowed());
        let small = limiter.check("f", 1).await.unwrap();
        assert!(small.is_allowed());
        assert_eq!(small.origin(), Origin::Store);
    }

    #[tokio::test]
    async fn the_fallback_decides_while_the_store_fails() {
        let clock = FakeClock::new(0);
        let limiter = Limiter::new(
            Broken,
            Policy::fixed_window("p", 2, Duration::from_secs(1)).unwrap(),
        )
        .fallback(MemoryStore::with_clock(clock.clone()));
        let a = limiter.check("s", 1).await.unwrap();
        assert!(a.is_allowed());
        assert_eq!(a.origin(), Origin::Fallback);
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        assert!(!limiter.check("s", 1).await.unwrap().is_allowed());
        // Without a fallback the failure is an error, never a denial.
        let bare = Limiter::new(
            Broken,
            Policy::fixed_window("p", 2, Duration::from_secs(1)).unwrap(),
        );
        assert!(matches!(bare.check("s", 1).await, Err(Error::Store(_))));
    }
}
