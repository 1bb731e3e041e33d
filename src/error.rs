//! Errors of [`Limiter::check`](crate::Limiter::check).

use crate::store::StoreError;

/// Why a check could not be decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cost of zero would consume nothing; use a peek instead.
    #[error("the cost of a request must be at least 1")]
    ZeroCost,
    /// A cost larger than some policy can ever admit would be denied forever.
    #[error("cost {cost} exceeds {max}, the most policy {policy:?} can ever admit")]
    CostTooHigh {
        /// The cost asked for.
        cost: u64,
        /// The largest admissible cost.
        max: u64,
        /// The policy that could never admit it.
        policy: String,
    },
    /// The store failed; this is never a denial.
    #[error(transparent)]
    Store(#[from] StoreError),
}
