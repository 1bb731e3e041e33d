//! What building a limiter refuses: one error for every setting, whatever the order
//! the settings came in.

use crate::error::debug_as_display;

/// Why [`LimiterBuilder::build`](crate::LimiterBuilder::build) refused its settings.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Every check must have something to decide.
    #[error("a limiter needs at least one policy")]
    NoPolicy,
    /// Two policies under one name would share their state's name in the store.
    #[error("two policies are named {0:?}: a name keys its policy's state, so names must be unique in a limiter")]
    DuplicateName(String),
    /// A shadow in-flight policy beside another in-flight policy: a request's slot is
    /// one for all of its limiter's in-flight policies, held, renewed and released in
    /// all at once, and a shadow one that would deny takes none, so the two counts
    /// would part. A shadow in-flight policy goes in a limiter of its own.
    #[error("in-flight policy {0:?} is a shadow beside another in-flight policy: a request's slot is held and released in all of a limiter's in-flight policies at once, and a shadow one that would deny takes none, so their counts would part; shadow it in a limiter of its own")]
    ShadowInFlight(String),
    /// A sliding log promises exact admission; a lease would spend its units later
    /// than the log records them ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases) on a set with one).
    #[error("policy {0:?} is a sliding log, which never leases: exactness is its promise (use a sliding window counter or a token bucket to lease)")]
    LeaseSlidingLog(String),
    /// A slot is held by one request until it ends: there is nothing to spend ahead
    /// ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases) on a set with an in-flight policy).
    #[error("policy {0:?} counts requests in flight, which never lease: a slot belongs to the request that holds it")]
    LeaseInFlight(String),
    /// Leases are units of the key's cost taken ahead: a policy of another subject
    /// (an org's, a global one) or one counting requests has none to lease yet
    /// ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases) on a set with one).
    #[error("policy {0:?} counts another subject than the key, or requests: leases take the key's cost units ahead, so a limiter with it does not lease")]
    LeaseScoped(String),
    /// An instance's slots are counted per subject it holds them for; a policy of
    /// requests in flight counts the request's key only.
    #[error("policy {0:?} counts requests in flight for another subject than the key: in-flight policies count the request's key")]
    ScopedInFlight(String),
    /// On a Redis Cluster a check's keys share one slot (the key's or its org's); a
    /// global counter has a slot of its own, so it is checked by a limiter of its own
    /// there (in sequence with the others; see docs/hierarchies.md).
    #[error("policy {0:?} is global, and on a Redis Cluster a global counter cannot be decided in one call with another subject's: give it a limiter of its own")]
    ClusterGlobal(String),
    /// A lease that lives 0 ms would never be spent ([`Leases::lifetime`](crate::lease::Leases::lifetime)).
    #[error("a lease lifetime must be at least 1 ms")]
    LeaseZeroLifetime,
    /// A lease of 0 units would never admit anything ([`Leases::max_units`](crate::lease::Leases::max_units)).
    #[error("leases must be at least 1 unit (Leases::max_units)")]
    LeaseZeroUnits,
    /// A table of 0 subjects would never lease ([`Leases::max_subjects`](crate::lease::Leases::max_subjects)).
    #[error("a limiter must track at least 1 subject to lease (Leases::max_subjects)")]
    LeaseZeroSubjects,
}

debug_as_display!(BuildError);
