//! Leases: a hot subject's units taken from a shared store in batches and spent
//! locally, so a subject sending thousands of requests a second costs the store a few
//! calls a second, with one budget across every instance.
//!
//! ```
//! use redlimit::{clock::FakeClock, lease::Leases, Limiter, MemoryStore, Origin, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = FakeClock::new(0);
//! // 1000 a second per subject; subjects asking 50 a second or more of this instance
//! // spend leases of up to 100 units, each living at most 100 ms.
//! let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
//!     .policy(Policy::sliding_window("api", 1000, Duration::from_secs(1))?)
//!     .local_clock(clock.clone())
//!     .leases(Leases::new())
//!     .build()?;
//! // Below the rate, each request is one exact store call.
//! for _ in 0..4 {
//!     assert_eq!(limiter.check("key-7", 1).await?.origin(), Origin::Store);
//! }
//! // The fifth unit in a lifetime makes a leasing check: its own unit and a lease of 5
//! // (990 left in the store; what this instance may admit counts the lease too).
//! let leasing = limiter.check("key-7", 1).await?;
//! assert_eq!((leasing.origin(), leasing.remaining()), (Origin::Store, 995));
//! // The next ones are spent from the lease, with no store call.
//! let leased = limiter.check("key-7", 1).await?;
//! assert_eq!((leased.origin(), leased.remaining()), (Origin::Lease, 994));
//! # Ok(()) }
//! ```
//!
//! The memory store leases as the model of a shared store's leasing check (one
//! process's memory gains nothing from leases); with instances sharing a Redis:
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
//! subject is a *leasing check*
//! (the store's leasing check): in the one
//! atomic call a check makes, the store decides the request, and if every policy
//! admits it also takes up to `want` more units from every policy (all or nothing,
//! never more than each admits now). `want` is the units the subject asked of this
//! instance in a lifetime, at most [`Leases::max_units`]: it grows with the subject's
//! rate and shrinks when leases go unspent. The instance then admits the subject's requests
//! from the lease without a store call until the units run out or the lease expires.
//! A lease lives at most [`Leases::lifetime`] and never past the end of the current
//! window of any window policy of the set (the store says how far that is). Both are
//! measured on the store's clock as this instance reads it
//! (the store's lease clock: the memory store's
//! clock, a Redis store's client clock, or for Redis `TIME` a monotonic clock), from
//! the moment the leasing call was sent, never on the limiter's local clock. Units left
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
//! - **The request making a leasing check is cancelled** (its future dropped): the
//!   requests waiting for that check are not left waiting; the first of them asks in
//!   its place, the others wait for that one.
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

// Here: the settings and their plan for a policy set. Beside them: the table of
// subjects (table.rs), the one leasing check in flight per subject (flight.rs),
// recording its answer (grant.rs), give-backs and idle subjects (sweep.rs), and what
// a store does for leases (store.rs, public as `redlimit::store::*`).
mod flight;
mod grant;
pub(crate) mod store;
mod sweep;
mod table;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::error::debug_as_display;
use crate::policy::{Algorithm, Policy};
use crate::store::PolicySet;

pub(crate) use table::{DecisionFuture, LeaseTable, Leased};

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
        if let Some(slots) = policies.iter().find(|p| p.is_in_flight()) {
            return Err(LeaseError::InFlight(slots.name().to_owned()));
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
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A sliding log promises exact admission; a lease would spend its units later
    /// than the log records them.
    #[error("policy {0:?} is a sliding log, which never leases: exactness is its promise (use a sliding window counter or a token bucket to lease)")]
    SlidingLog(String),
    /// A slot is held by one request until it ends: there is nothing to spend ahead.
    #[error("policy {0:?} counts requests in flight, which never lease: a slot belongs to the request that holds it")]
    InFlight(String),
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

debug_as_display!(LeaseError);

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
