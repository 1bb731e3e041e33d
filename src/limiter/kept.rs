//! A denial kept until a time: the one rule by which the block cache and a lease's
//! kept denial answer a subject without a store call.
//!
//! A kept denial answers the costs its time was given for: the cost the store denied
//! and, when the store also said when a larger one fits (a lease's cost and batch),
//! the costs up to that one (a larger cost is denied whenever a smaller one is, and
//! fits by that time). It answers only from the time it was decided until its time,
//! and counts both of its waits down to the fixed times the store gave. Anything else
//! (a smaller cost, which may fit sooner, a larger one, which may fit later, a time
//! past it, a clock that went back) asks the store, whose answer replaces it.

use crate::decision::{Decision, Origin};

/// The store's denial of `cost`, made at `since_ms` and kept until `until_ms` (on
/// the clock of whoever keeps it) for the costs from `cost` to `up_to`.
#[derive(Debug, Clone)]
pub(crate) struct KeptDenial {
    since_ms: u64,
    until_ms: u64,
    cost: u64,
    up_to: u64,
    decision: Decision,
}

impl KeptDenial {
    /// `decision`, the denial of `cost` made at `since_ms`, kept for `wait_ms`: the
    /// store's wait for `cost`, so it answers that cost alone.
    pub(crate) fn new(cost: u64, decision: &Decision, since_ms: u64, wait_ms: u64) -> Self {
        Self {
            since_ms,
            until_ms: since_ms.saturating_add(wait_ms),
            cost,
            up_to: cost,
            decision: decision.clone(),
        }
    }

    /// `decision`, the store's denial of `cost` made at `since_ms`, kept for its retry
    /// time; `None` when there is no time to keep it for: it admits, or an in-flight
    /// policy denied, whose denial lasts until some request ends, not a known time.
    pub(crate) fn of(cost: u64, decision: &Decision, since_ms: u64) -> Option<Self> {
        let wait_ms = decision.retry_after().map_or(0, |wait| {
            u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
        });
        let held = decision.policy().is_in_flight();
        (wait_ms > 0 && !held).then(|| Self::new(cost, decision, since_ms, wait_ms))
    }

    /// The same, with a wait the store gave for `largest`: it answers the costs up to
    /// it too.
    pub(crate) fn up_to(mut self, largest: u64) -> Self {
        self.up_to = largest.max(self.cost);
        self
    }

    /// When it stops answering.
    pub(crate) fn until_ms(&self) -> u64 {
        self.until_ms
    }

    /// Whether its time is over at `now_ms`: it answers nothing more, and can go.
    pub(crate) fn is_over(&self, now_ms: u64) -> bool {
        now_ms >= self.until_ms
    }

    /// The kept denial as seen at `now_ms` for a request of `cost`, from `origin`;
    /// `None` when the store must decide.
    pub(crate) fn answer(&self, cost: u64, now_ms: u64, origin: Origin) -> Option<Decision> {
        if cost < self.cost || cost > self.up_to || self.is_over(now_ms) {
            return None;
        }
        if now_ms < self.since_ms {
            // The clock went back since the denial (a `SystemClock` after an NTP step):
            // the store may now read the state as written by a clock ahead of it and
            // decide afresh, which the kept wait cannot know.
            return None;
        }
        let mut decision = self.decision.clone();
        let reset_at = self
            .since_ms
            .saturating_add(decision.outcome().reset_after_ms);
        decision.rebase(
            self.until_ms - now_ms,
            reset_at.saturating_sub(now_ms),
            origin,
        );
        Some(decision)
    }
}
