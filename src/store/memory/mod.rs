//! The memory store: [`MemoryStore`](crate::MemoryStore).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};

mod map;
mod ops;
mod sweep;
#[cfg(test)]
mod tests;

use map::{Map, SHARDS};
use ops::Epochs;
use sweep::{Schedule, Sweeper};

/// Limit state in this process's memory.
///
/// Sharded (no global lock); each subject's shard is locked only while one decision
/// runs on it. Entries whose state has decayed to "unused" are swept, and shards shrink
/// back when they have emptied, so a flood of one-off subjects costs memory only for
/// about one window.
///
/// # Housekeeping, off the request path
///
/// Sweeping goes one shard at a time: a pass over the whole map is spread evenly over
/// the sweep interval (one second by default), so no decision ever waits for more than
/// one shard's sweep, and decisions on other shards do not wait at all.
///
/// - [`MemoryStore::new`] (a real clock) sweeps in a background thread the store owns:
///   memory comes back without traffic, and decisions do no housekeeping at all. The
///   thread holds only a weak reference and stops when the last clone is dropped; it
///   needs no async runtime.
/// - [`MemoryStore::with_clock`] sweeps on calls instead: a call that finds a slice due
///   sweeps that one shard. A [`FakeClock`](crate::clock::FakeClock) only moves when a
///   test moves it, so a thread woken by wall time would sweep at moments the test does
///   not choose; on calls, the same test always sweeps the same entries. A store on a
///   real clock can opt into the thread with [`MemoryStore::sweep_in_background`].
/// - [`MemoryStore::sweep`] reclaims everything expired at once, for whoever wants it.
///
/// Cloning is cheap and shares the state.
///
/// The in-process store: the reference algorithms in a sharded concurrent map.
///
/// ```
/// use redlimit::{clock::FakeClock, Limiter, MemoryStore, Policy};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new(0);
/// let limiter = Limiter::new(
///     MemoryStore::with_clock(clock.clone()),
///     Policy::fixed_window("jobs", 2, Duration::from_secs(1))?,
/// );
/// assert!(limiter.check("queue-a", 1).await?.is_allowed());
/// assert!(limiter.check("queue-a", 1).await?.is_allowed());
/// assert!(!limiter.check("queue-a", 1).await?.is_allowed());
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.check("queue-a", 1).await?.is_allowed());
/// # Ok(()) }
/// ```
///
/// The store in three parts: `map` keeps the states, one entry per subject and policy
/// set in a sharded table; `sweep` drops the decayed ones, on calls or in a thread of
/// its own; `ops` runs the decisions (check, peek, refund, reset, the lease ops) on the
/// one entry each finds.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    map: Map,
    clock: Arc<dyn Clock>,
    sweep_every_ms: AtomicU64,
    /// When the next slice is due, read by every call that sweeps; the schedule itself
    /// is behind a lock only sweepers take.
    next_slice_ms: AtomicU64,
    schedule: Mutex<Schedule>,
    /// Set once a background thread sweeps: calls then leave housekeeping alone.
    swept_in_background: AtomicBool,
    sweeper: OnceLock<Sweeper>,
    /// The lease generations of subjects that leased
    /// ([`Grant::epoch`](crate::store::Grant::epoch)), apart from the states so that checks
    /// never pay for them.
    epochs: Mutex<Epochs>,
}

impl Inner {
    fn lock_schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.get() {
            sweeper.thread.unpark();
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}
