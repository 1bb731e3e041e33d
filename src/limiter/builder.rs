//! Building a [`Limiter`]: every setting is given first and checked once, so no setting
//! depends on the order it was given in, and a setting that cannot work is an error
//! rather than a panic or a feature quietly turned off.

use std::sync::Arc;

use super::block_cache::BlockCache;
use super::build_error::BuildError;
use super::lease::{LeaseTable, Leases};
use super::limits::LiveLimits;
use super::parts::{Guard, Limiter};
use super::slots::{in_flight, SlotTable};
use crate::clock::{Clock, MonotonicClock};
use crate::policy::Policy;
use crate::policy::Unit;
use crate::store::limits::LimitStore;
use crate::store::{LeaseStore, LiveLimitStore, MemoryStore, PolicySet, Store};

/// The settings of a [`Limiter`] before it is built: from [`Limiter::builder`].
///
/// ```
/// use redlimit::{Limiter, MemoryStore, Policy};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::builder(MemoryStore::new())
///     .policy(Policy::token_bucket("burst", 10, 10, Duration::from_secs(1))?)
///     .policy(Policy::sliding_window("hourly", 1000, Duration::from_secs(3600))?)
///     .block_cache(10_000)
///     .build()?;
/// assert_eq!(limiter.policies().len(), 2);
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct LimiterBuilder<S> {
    store: S,
    policies: Vec<Policy>,
    block_cache: Option<usize>,
    fallback: Option<MemoryStore>,
    clock: Option<Arc<dyn Clock>>,
    leases: Option<(Leases, Arc<dyn LeaseStore>)>,
    live_limits: Option<(std::time::Duration, Arc<dyn LimitStore>)>,
}

impl<S: Store> LimiterBuilder<S> {
    pub(super) fn new(store: S) -> Self {
        Self {
            store,
            policies: Vec::new(),
            block_cache: None,
            fallback: None,
            clock: None,
            leases: None,
            live_limits: None,
        }
    }

    /// Adds a policy that must also admit every request. All policies of a limiter are
    /// decided together: a request one of them denies consumes from none.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Answers subjects the store denied locally until their retry time, holding at
    /// most `max_entries` of them (0 is read as 1): a flood from one over-limit subject
    /// then costs the store one call per retry period instead of one per request.
    ///
    /// Exact, not a heuristic: the store said the request would not be admitted before
    /// its retry time. The cache answers only the cost that was denied (another cost has
    /// another retry time) and forgets a subject once the store admits it again.
    ///
    /// ```
    /// use redlimit::{clock::FakeClock, Limiter, MemoryStore, Origin, Policy};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = FakeClock::new(0);
    /// let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
    ///     .policy(Policy::fixed_window("p", 1, Duration::from_secs(1))?)
    ///     .block_cache(10_000)
    ///     .local_clock(clock.clone())
    ///     .build()?;
    /// limiter.check("flooder", 1).await?;
    /// assert!(!limiter.check("flooder", 1).await?.is_allowed());
    /// // Answered from the cache until the retry time.
    /// assert_eq!(limiter.check("flooder", 1).await?.origin(), Origin::BlockCache);
    /// # Ok(()) }
    /// ```
    pub fn block_cache(mut self, max_entries: usize) -> Self {
        self.block_cache = Some(max_entries);
        self
    }

    /// Decides in `fallback` (this process's memory) while the store fails, instead of
    /// handing the failure to the caller. Limits then hold per process until the store
    /// returns; each call tries the store first, so no restart is needed.
    pub fn fallback(mut self, fallback: MemoryStore) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// The clock of the block cache and of the rates and idle times leases measure (the
    /// monotonic clock by default; a fake one in tests). Leases and their kept denials
    /// are timed on the store's clock instead (Redis `TIME`, or its client clock), so a local
    /// clock that runs wrong cannot carry leased units past their window.
    pub fn local_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The limiter, or why these settings cannot work.
    pub fn build(self) -> Result<Limiter<S>, BuildError> {
        let Self {
            store,
            policies,
            block_cache,
            fallback,
            clock,
            leases,
            live_limits,
        } = self;
        if policies.is_empty() {
            return Err(BuildError::NoPolicy);
        }
        for (i, policy) in policies.iter().enumerate() {
            if policies[..i].iter().any(|p| p.name() == policy.name()) {
                return Err(BuildError::DuplicateName(policy.name().to_owned()));
            }
        }
        if in_flight(&policies).nth(1).is_some() {
            if let Some((_, shadow)) = in_flight(&policies).find(|(_, p)| p.is_shadow()) {
                return Err(BuildError::ShadowInFlight(shadow.name().to_owned()));
            }
        }
        if let Some(p) = policies
            .iter()
            .find(|p| p.is_in_flight() && !p.scope().is_key())
        {
            return Err(BuildError::ScopedInFlight(p.name().to_owned()));
        }
        let global = policies.iter().find(|p| p.scope().is_global());
        if let Some(global) = global.filter(|_| store.is_cluster()) {
            if policies.iter().any(|p| !p.scope().is_global()) {
                return Err(BuildError::ClusterGlobal(global.name().to_owned()));
            }
        }
        let set = PolicySet::new(policies);
        if leases.is_some() {
            if let Some(p) = set
                .policies()
                .iter()
                .find(|p| !p.scope().is_key() || p.unit() != Unit::Cost)
            {
                return Err(BuildError::LeaseScoped(p.name().to_owned()));
            }
        }
        let live = live_limits.map(|(every, store)| LiveLimits::new(store, every, set.clone()));
        let (clock, leases) = match leases {
            Some((settings, lease_store)) => {
                let plan = settings.resolve(&set)?;
                let clock = clock.unwrap_or_else(|| Arc::new(MonotonicClock::new()));
                let table = LeaseTable::new(plan, set.clone(), lease_store, Arc::clone(&clock));
                (Some(clock), Some(Arc::new(table)))
            }
            None => (clock, None),
        };
        let mut limiter = assemble(store, set, block_cache, fallback, clock, leases);
        limiter.limits = live;
        Ok(limiter)
    }
}

/// The limiter of settings already checked (`clock`: the local clock, when one was
/// given or leases made one). Without a block cache, a fallback, leases
/// or in-flight policies nothing runs around the store: the plain path, with no guard
/// to consult (the one-policy shorthand, [`Limiter::new`], comes here too).
pub(super) fn assemble<S: Store>(
    store: S,
    set: PolicySet,
    block_cache: Option<usize>,
    fallback: Option<MemoryStore>,
    clock: Option<Arc<dyn Clock>>,
    leases: Option<Arc<LeaseTable>>,
) -> Limiter<S> {
    let store = Arc::new(store);
    let slots = SlotTable::of(&set, &store, fallback.as_ref());
    if block_cache.is_none() && fallback.is_none() && leases.is_none() && slots.is_none() {
        return Limiter {
            store,
            set,
            guard: None,
            limits: None,
        };
    }
    let clock = clock.unwrap_or_else(|| Arc::new(MonotonicClock::new()));
    Limiter {
        store,
        set,
        guard: Some(Arc::new(Guard {
            clock,
            blocks: block_cache.map(BlockCache::new),
            fallback,
            leases,
            slots,
        })),
        limits: None,
    }
}

impl<S: Store + LeaseStore + Clone> LimiterBuilder<S> {
    /// Serves hot subjects from leases: units taken from the store in the same call as
    /// a check and spent by this instance without a round trip, under one budget
    /// shared by every instance. See [`crate::lease`] for how, and for what leases
    /// promise (no over-admission for window counters; a token bucket's burst grows by
    /// at most its refill rate times the lease lifetime).
    ///
    /// A sliding log never leases: [`LimiterBuilder::build`] refuses a set with one
    /// ([`BuildError::LeaseSlidingLog`]), as it refuses settings that cannot work.
    pub fn leases(mut self, leases: Leases) -> Self {
        let store: Arc<dyn LeaseStore> = Arc::new(self.store.clone());
        self.leases = Some((leases, store));
        self
    }
}

impl<S: Store + LiveLimitStore + Clone> LimiterBuilder<S> {
    /// Live limits: a limit per policy and subject, set at runtime
    /// ([`Limiter::set_limit`]) and kept in the store, so that every instance sharing
    /// it applies the change within `every` (and a round trip) of it, and this one at
    /// once. A changed limit keeps the count: the state reads the same under it.
    ///
    /// Each instance polls the store every `every` (one `HGET` in Redis; the whole
    /// table, one `HGETALL`, only after a change) on the Tokio runtime the limiter is
    /// built in; a check reads only this instance's copy. `Duration::ZERO` polls as
    /// often as the store answers.
    pub fn live_limits(mut self, every: std::time::Duration) -> Self {
        let store: Arc<dyn LimitStore> = Arc::new(self.store.clone());
        self.live_limits = Some((every.max(std::time::Duration::from_millis(1)), store));
        self
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for LimiterBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("store", &self.store)
            .field("policies", &self.policies)
            .field("block_cache", &self.block_cache)
            .field("fallback", &self.fallback.is_some())
            .field(
                "leases",
                &self.leases.as_ref().map(|(settings, _)| settings),
            )
            .finish_non_exhaustive()
    }
}
