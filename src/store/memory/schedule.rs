//! Where the sweep is in its pass over the shards, and when each shard's turn comes.

use super::map::SHARDS;

/// Where the sweep is in its pass over the shards.
#[derive(Debug)]
pub(super) struct Schedule {
    pub(super) pass_start_ms: u64,
    pub(super) next_shard: usize,
    /// Entries left in the shards swept so far in this pass.
    pub(super) left_in_pass: usize,
}

impl Schedule {
    /// When the next shard's turn comes: the pass's slices spread evenly over `every`.
    pub(super) fn due_ms(&self, every_ms: u64) -> u64 {
        let offset = u128::from(every_ms) * (self.next_shard as u128 + 1) / SHARDS as u128;
        self.pass_start_ms
            .saturating_add(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    /// One more shard swept at `now_ms`, with `left` entries still in it; `is_empty`
    /// tells, at the end of a pass that left nothing, whether the store is still empty
    /// (shards swept early in the pass may have filled since).
    pub(super) fn advance(
        &mut self,
        left: usize,
        now_ms: u64,
        every_ms: u64,
        is_empty: impl FnOnce() -> bool,
    ) {
        self.left_in_pass += left;
        self.next_shard += 1;
        if self.next_shard == SHARDS {
            // A pass ends; the next follows on, but never more than one pass behind:
            // after a long gap (no calls, a starved thread, a clock moved forward) one
            // whole pass is due at once, and no more. A pass that found the store empty
            // waits an interval more: an idle store costs nothing.
            self.pass_start_ms = if self.left_in_pass == 0 && is_empty() {
                now_ms.saturating_add(every_ms)
            } else {
                self.pass_start_ms
                    .saturating_add(every_ms)
                    .max(now_ms.saturating_sub(every_ms))
            };
            self.next_shard = 0;
            self.left_in_pass = 0;
        }
    }
}
