//! Where time comes from.
//!
//! Every algorithm works on milliseconds from a [`Clock`]. The memory store always uses
//! one; the Redis store uses one only in client-clock mode (by default its scripts read
//! Redis `TIME`, so instances with skewed clocks agree).
//!
//! ```
//! use redlimit::clock::{Clock, FakeClock};
//! use std::time::Duration;
//!
//! let clock = FakeClock::new(1_000);
//! clock.advance(Duration::from_millis(250));
//! assert_eq!(clock.now_ms(), 1_250);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time in milliseconds.
///
/// Implementations must be cheap: the memory store reads the clock once per decision.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since an epoch that every user of one store agrees on.
    fn now_ms(&self) -> u64;
}

/// Wall-clock time since the Unix epoch, made monotonic.
///
/// Reads the system time once, then advances with a monotonic counter, so a wall-clock
/// step (NTP, a manual change) can never move decisions backwards. Windows stay aligned
/// to the Unix epoch, as they are in Redis.
///
/// The counter is the CPU's time-stamp counter where it is invariant (x86-64) or the
/// system counter (aarch64), read through [`quanta`] and scaled to nanoseconds by the
/// ratio quanta measures once per process against the OS monotonic clock (about 10 to
/// 20 ms, spent by the first clock made); elsewhere quanta reads the OS monotonic clock
/// itself. Why: the memory store reads the clock once per decision, and
/// [`std::time::Instant::now`] (`clock_gettime` through the vDSO) cost about three
/// times a counter read on the benchmark machine, a fifth to a third of a whole decision
/// (BENCHMARKS.md, "Memory store"). governor reads time the same way.
///
/// The ratio is measured, not told: quanta stops once its mean error is under 10 ns,
/// over a few milliseconds, so this clock may drift from the wall clock by parts per
/// million (a second or so a day at most), as a monotonic clock that NTP does not steer
/// would. That moves where windows start by as much, never the decisions of one store
/// against each other: they all read the same clock.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    anchor_unix_ms: u64,
    clock: quanta::Clock,
    /// The counter's raw value at `anchor_unix_ms`.
    anchor_raw: u64,
}

impl MonotonicClock {
    /// A clock anchored at the current system time.
    ///
    /// The first clock a process makes waits while quanta measures the counter's rate
    /// (about 10 to 20 ms, at most 200 ms); later ones reuse it.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        Self {
            anchor_unix_ms: unix_ms_now(),
            anchor_raw: clock.raw(),
            clock,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        // `delta_as_nanos` reads 0 for a counter behind the anchor (another core's
        // counter a few cycles behind): never before the anchor.
        let elapsed_ns = self.clock.delta_as_nanos(self.anchor_raw, self.clock.raw());
        self.anchor_unix_ms.saturating_add(elapsed_ns / 1_000_000)
    }
}

/// Milliseconds on this instance's own clock (a limiter's [`Clock`]): what it measures
/// of its own, a subject's rate or idle time. A distinct type from [`StoreMs`], so the
/// two clocks' times are never compared or subtracted by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LocalMs(pub(crate) u64);

/// Milliseconds on the clock the store decides on, as this instance reads it: when a
/// lease or a denial the store gave ends. It runs on its own (Redis `TIME` is not the
/// local clock); see [`LocalMs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StoreMs(pub(crate) u64);

impl LocalMs {
    /// The milliseconds from `earlier` to this time (0 for a time before it).
    pub(crate) fn since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl StoreMs {
    /// The milliseconds from `earlier` to this time (0 for a time before it).
    pub(crate) fn since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// This time `ms` later.
    pub(crate) fn after(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }
}

/// The system's wall clock, milliseconds since the Unix epoch.
///
/// Use it for the Redis store's client-clock mode when several processes must share an
/// epoch and their clocks are kept in sync; prefer Redis `TIME` (the default) otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        unix_ms_now()
    }
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A clock that only moves when told to, for exact and instant tests.
///
/// Clones share the same time, so a test keeps one handle and gives another to a store.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now_ms: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock that reads `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Moves the clock forward by `by` (rounded down to whole milliseconds).
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms`; it may go backwards, as a failed-over server's clock can.
    pub fn set_ms(&self, ms: u64) {
        self.now_ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_clones_share_time() {
        let a = FakeClock::new(10);
        let b = a.clone();
        a.advance(Duration::from_millis(5));
        assert_eq!(b.now_ms(), 15);
        b.set_ms(3);
        assert_eq!(a.now_ms(), 3);
    }

    #[test]
    fn monotonic_clock_is_near_wall_time_and_never_goes_back() {
        let clock = MonotonicClock::new();
        let first = clock.now_ms();
        let wall = SystemClock.now_ms();
        assert!(wall.abs_diff(first) < 5_000, "{wall} vs {first}");
        assert!(clock.now_ms() >= first);
    }
}
