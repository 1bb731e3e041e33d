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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time in milliseconds.
///
/// Implementations must be cheap: the memory store reads the clock once per decision.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since an epoch that every user of one store agrees on.
    fn now_ms(&self) -> u64;
}

/// Wall-clock time since the Unix epoch, made monotonic.
///
/// Reads the system time once, then advances with [`Instant`], so a wall-clock step
/// (NTP, a manual change) can never move decisions backwards. Windows stay aligned to
/// the Unix epoch, as they are in Redis.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    anchor_unix_ms: u64,
    anchor: Instant,
}

impl MonotonicClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        Self {
            anchor_unix_ms: unix_ms_now(),
            anchor: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.anchor.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.anchor_unix_ms.saturating_add(elapsed)
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
