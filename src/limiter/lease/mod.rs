//! The lease runtime of a limiter (what leases do and promise: [`crate::lease`]).
//! Here: the settings and their plan for a policy set. Beside them: the table of
//! subjects (table.rs), the channel of the one leasing check in flight per subject
//! (flight.rs), asking, waiting and recording the answer (grant.rs), give-backs and
//! idle subjects (sweep.rs). What a store does for leases is the store's
//! (`store/lease.rs`).

mod flight;
mod grant;
mod plan;
mod sweep;
mod table;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::limiter::build_error::BuildError;
use crate::policy::{Algorithm, Policy};
use crate::store::PolicySet;

pub(crate) use plan::Plan;
pub(crate) use table::{DecisionFuture, LeaseTable, Leased};

/// Lease settings for a limiter ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)); see
/// the [module docs](crate::lease) for what they do and promise.
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
    /// longer is taken as that. Under 1 ms is [`BuildError::LeaseZeroLifetime`].
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// The most units one lease takes. Larger leases mean fewer calls, and that one
    /// instance can hold more of a subject's budget for a while (and spend it after
    /// the store lost its counts: see the module docs). At most the smallest limit of
    /// the set: more is taken as that. 0 is [`BuildError::LeaseZeroUnits`].
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
    /// lifetimes). 0 is [`BuildError::LeaseZeroSubjects`].
    pub fn max_subjects(mut self, subjects: usize) -> Self {
        self.max_subjects = subjects;
        self
    }

    /// The settings for `set`, or why it cannot lease.
    pub(crate) fn resolve(&self, set: &PolicySet) -> Result<Plan, BuildError> {
        let policies = set.policies();
        for policy in policies.iter() {
            let name = || policy.name().to_owned();
            match policy.algorithm() {
                Algorithm::SlidingLog => return Err(BuildError::LeaseSlidingLog(name())),
                Algorithm::InFlight => return Err(BuildError::LeaseInFlight(name())),
                Algorithm::FixedWindow
                | Algorithm::SlidingWindow
                | Algorithm::TokenBucket
                | Algorithm::Calendar => {}
            }
        }
        if self.max_subjects == 0 {
            return Err(BuildError::LeaseZeroSubjects);
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
            return Err(BuildError::LeaseZeroLifetime);
        }
        let smallest_limit = policies.iter().map(Policy::limit).min().unwrap_or(1);
        let max_units = self.max_units.unwrap_or((smallest_limit / 10).max(1));
        if max_units == 0 {
            return Err(BuildError::LeaseZeroUnits);
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
