//! The memory store: [`MemoryStore`](crate::MemoryStore).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};

mod epochs;
mod map;
mod ops;
mod schedule;
mod store;
mod sweep;
#[cfg(test)]
mod tests;

pub use store::MemoryStore;

use map::{Map, SHARDS};
use schedule::Schedule;
use store::{Inner, Sweeper};

impl MemoryStore {
    /// A memory store on the monotonic clock, swept by a background thread.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new()).sweep_in_background()
    }

    /// A memory store reading time from `clock` (a [`FakeClock`](crate::clock::FakeClock)
    /// in tests), swept one shard at a time by the calls that find a slice due.
    pub fn with_clock(clock: impl Clock) -> Self {
        let now = clock.now_ms();
        let schedule = Schedule {
            pass_start_ms: now,
            next_shard: 0,
            left_in_pass: 0,
        };
        let every_ms = 1_000;
        Self {
            inner: Arc::new(Inner {
                map: Map::new(),
                clock: Arc::new(clock),
                sweep_every_ms: AtomicU64::new(every_ms),
                next_slice_ms: AtomicU64::new(schedule.due_ms(every_ms)),
                schedule: Mutex::new(schedule),
                swept_in_background: AtomicBool::new(false),
                sweeper: OnceLock::new(),
                epochs: Mutex::default(),
                scoped: Mutex::default(),
                limits: Mutex::default(),
            }),
        }
    }

    /// Sets how long a pass over every entry takes (default one second): each expired
    /// entry is gone within about this long after it expired.
    pub fn sweep_every(self, every: Duration) -> Self {
        let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        let inner = &*self.inner;
        inner.sweep_every_ms.store(every_ms, Ordering::Relaxed);
        let schedule = inner.lock_schedule();
        inner
            .next_slice_ms
            .store(schedule.due_ms(every_ms), Ordering::Relaxed);
        drop(schedule);
        if let Some(sweeper) = inner.sweeper.get() {
            sweeper.thread.unpark();
        }
        self
    }

    /// Sweeps in a background thread of the store's own, so that memory comes back
    /// without traffic and no decision does housekeeping (what [`MemoryStore::new`]
    /// does). Use it with a real clock only: the thread sleeps in wall time.
    ///
    /// If the thread cannot be started, calls go on sweeping, one shard each.
    pub fn sweep_in_background(self) -> Self {
        if self.inner.sweeper.get().is_some() {
            return self;
        }
        if let Some(sweeper) = Sweeper::spawn(Arc::downgrade(&self.inner)) {
            if self.inner.sweeper.set(sweeper).is_ok() {
                self.inner
                    .swept_in_background
                    .store(true, Ordering::Relaxed);
            }
        }
        self
    }

    /// How many subjects (per policy set) hold state now, expired or not.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Whether no subject holds state.
    pub fn is_empty(&self) -> bool {
        self.inner.map.is_empty()
    }

    /// Drops every entry whose state has decayed, and gives memory back: the whole
    /// map now, one shard locked at a time.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_ms();
        for index in 0..SHARDS {
            self.inner.map.sweep_shard(index, now);
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}
