//! Dropping decayed entries, one shard at a time: on the calls that find a slice due,
//! or in a background thread of the store's own.

use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError, Weak};
use std::time::Duration;

use super::store::{Inner, Sweeper};

/// How many times per pass the background sweeper wakes, sweeping the slices due each
/// time. Each wake takes a core from whatever ran there (a decision, on a busy machine):
/// a few dozen a second keep those rare, yet each short (a few shards).
const WAKES_PER_PASS: u64 = 50;

impl Sweeper {
    /// Starts the thread that sweeps `store` until it is dropped; `None` if no thread
    /// could be started.
    pub(super) fn spawn(store: Weak<Inner>) -> Option<Self> {
        let alive = Arc::new(());
        let token = Arc::downgrade(&alive);
        let handle = std::thread::Builder::new()
            .name("redlimit-sweep".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let _alive = alive;
                sweep_until_dropped(&store);
            })
            .ok()?;
        Some(Sweeper {
            thread: handle.thread().clone(),
            alive: token,
        })
    }
}

/// The background sweeper's life: every slice that is due, then sleep until the next
/// one; ends once the store is gone (its last clone dropped wakes the thread).
fn sweep_until_dropped(store: &Weak<Inner>) {
    while let Some(inner) = store.upgrade() {
        let wait = inner.sweep_due_slices(inner.clock.now_ms());
        // Not holding the store while asleep: dropping it must be able to end it.
        drop(inner);
        std::thread::park_timeout(wait);
    }
}

impl Inner {
    /// The time of a call, after sweeping the next shard if a call must and its turn
    /// has come (one relaxed load when not).
    #[inline]
    pub(super) fn now_and_sweep(&self) -> u64 {
        let now = self.clock.now_ms();
        if !self.swept_in_background.load(Ordering::Relaxed)
            && now >= self.next_slice_ms.load(Ordering::Relaxed)
        {
            self.sweep_next_slice(now);
        }
        now
    }

    /// Sweeps the next shard if its turn has come at `now`; false when none was due,
    /// or another caller is sweeping (a call never waits for housekeeping).
    fn sweep_next_slice(&self, now: u64) -> bool {
        if now < self.next_slice_ms.load(Ordering::Relaxed) {
            return false;
        }
        let mut schedule = match self.schedule.try_lock() {
            Ok(schedule) => schedule,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let every_ms = self.sweep_every_ms.load(Ordering::Relaxed);
        if now < schedule.due_ms(every_ms) {
            return false;
        }
        let left = self.map.sweep_shard(schedule.next_shard, now);
        schedule.advance(left, now, every_ms, || self.map.is_empty());
        self.next_slice_ms
            .store(schedule.due_ms(every_ms), Ordering::Relaxed);
        true
    }

    /// The background sweeper's step: every slice due at `now`, one shard locked at a
    /// time; returns how long to sleep before the next step.
    pub(super) fn sweep_due_slices(&self, now: u64) -> Duration {
        // Bounded: at most the rest of this pass and one whole pass are due.
        while self.sweep_next_slice(now) {}
        let next = self.next_slice_ms.load(Ordering::Relaxed);
        let every_ms = self.sweep_every_ms.load(Ordering::Relaxed);
        let wait_ms = next
            .saturating_sub(now)
            .max(every_ms / WAKES_PER_PASS)
            .clamp(1, 60_000);
        Duration::from_millis(wait_ms)
    }
}
