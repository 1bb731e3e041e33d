//! What the lease settings come to for one policy set.

/// [`Leases`](super::Leases) resolved for one policy set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(super) lifetime_ms: u64,
    pub(super) max_units: u64,
    /// Units asked in a lifetime from which a subject leases.
    pub(super) min_units: u64,
    /// The smallest lease, and the batch a paused subject waits for (`None`: half the
    /// lease wanted).
    pub(super) batch: Option<u64>,
    pub(super) max_cost: u64,
    pub(super) max_subjects: usize,
    /// Whether unspent units go back to the store: not with a token bucket in the set.
    pub(super) gives_back: bool,
}
