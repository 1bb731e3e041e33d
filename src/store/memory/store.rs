//! The memory store's parts: the map of states, the sweep's schedule and thread, and
//! the lease generations, shared by every clone.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use super::epochs::Epochs;
use super::map::Map;
use super::schedule::Schedule;
use crate::clock::Clock;

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
/// its own (when, `schedule` says); `ops` runs the decisions (check, peek, refund,
/// reset, the lease ops) on the one entry each finds, with the lease generations of
/// `epochs`.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) map: Map,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) sweep_every_ms: AtomicU64,
    /// When the next slice is due, read by every call that sweeps; the schedule itself
    /// is behind a lock only sweepers take.
    pub(super) next_slice_ms: AtomicU64,
    pub(super) schedule: Mutex<Schedule>,
    /// Set once a background thread sweeps: calls then leave housekeeping alone.
    pub(super) swept_in_background: AtomicBool,
    pub(super) sweeper: OnceLock<Sweeper>,
    /// The lease generations of subjects that leased
    /// ([`Grant::epoch`](crate::store::Grant::epoch)), apart from the states so that checks
    /// never pay for them.
    pub(super) epochs: Mutex<Epochs>,
    /// Held through every operation of a scoped set (policies of several subjects):
    /// its counters sit in entries of their own (an org's is shared by its users), so
    /// one decision reads and writes several entries, all or nothing, one at a time.
    pub(super) scoped: Mutex<()>,
    /// Live limits kept in this store ([`crate::Limiter::set_limit`]): the
    /// memory store's side of [`LimitStore`](crate::store::limits::LimitStore).
    pub(super) limits: Mutex<crate::store::limits::StoredLimits>,
}

impl Inner {
    pub(super) fn lock_schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The background sweeping thread, to wake it (a new interval, or the store dropped).
#[derive(Debug)]
pub(super) struct Sweeper {
    pub(super) thread: std::thread::Thread,
    /// Dropped when the thread has ended (only the tests look).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) alive: Weak<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.get() {
            sweeper.thread.unpark();
        }
    }
}
