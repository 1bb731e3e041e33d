//! What a leasing check got beyond its decision: worked out with the decision by
//! [`super::decide_leasing`] (and `lua/main.lua`), carried by the store's lease
//! protocol (`store/lease.rs`).

/// What a leasing check got beyond its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    /// Units taken from every policy beyond the cost (0 when denied).
    pub units: u64,
    /// Milliseconds to the end of the shortest current window among the set's window
    /// policies, from the time the store decided at; `None` when no policy has
    /// windows (a token bucket). A lease never outlives it.
    pub window_left_ms: Option<u64>,
    /// The end of that window on the store's clock (ms): what
    /// [`LeaseStore::give_back`](crate::store::LeaseStore::give_back) takes, so that units are never given back to a later
    /// window than the one they were taken from.
    pub window_end_ms: Option<u64>,
    /// When denied: milliseconds until the cost and [`LeaseAsk::batch`](crate::store::LeaseAsk::batch) more units
    /// would fit (0 when allowed).
    pub ask_again_ms: u64,
    /// The generation of the subject's lease state the units were taken in (0 when
    /// none were): made by the first grant, kept as long as the states, forgotten
    /// with them (a reset, a flush, a restart). A give-back carries it
    /// ([`GiveBack::epoch`](crate::store::GiveBack::epoch)) and changes nothing once the store's differs, so units
    /// counted before a loss are never subtracted from counts made after it.
    pub epoch: u64,
}
