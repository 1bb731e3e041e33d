//! The connection's parts, shared by the files that implement it: the link every
//! clone of one store holds, its connection state, and the timeouts they all read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Notify};

use super::super::conn::{Conn, Source};
use super::super::queue::Queue;
use super::super::reader::{Activity, Reader};
use crate::telemetry::LogThrottle;

/// How long one attempt to get a connection from the pool may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection that answered nothing for this long while calls time out is replaced
/// (a half-open socket never reports an error); so is a cluster connection that
/// answered nothing for this long while calls fail.
pub(super) const STALL_MS: u64 = 1_000;
/// A cluster connection whose calls all fail or time out for this long is replaced,
/// sooner than a single-node one: while no node answers, the cluster client retries
/// every node at once on each call, and on a busy machine its errors do not always
/// say that it lost every node. One paced replacement attempt costs far less.
pub(super) const CLUSTER_STALL_MS: u64 = 250;

/// How long [`Link::connect`] waits for a connection, and for the library's load and
/// the first call on it.
pub(in crate::store::redis) const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// The connection shared by every clone of one store.
#[derive(Debug)]
pub(in crate::store::redis) struct Link {
    pub(super) source: Source,
    /// Where it connects (`host:port`, no password), for logs and errors.
    pub(super) address: Box<str>,
    pub(super) state: RwLock<State>,
    /// Woken when an attempt to connect ends, for calls made before the first
    /// connection exists.
    pub(super) settled: Notify,
    /// What the connection has delivered, and when last.
    pub(super) activity: Arc<Activity>,
    /// Whether calls go through the function library (until the server says it has
    /// no functions: Redis before 7.0).
    pub(super) functions: AtomicBool,
    /// Held while the library is being loaded, so the calls that all find it missing
    /// after a restart load it once, not once each; `loads` counts finished loads.
    pub(super) loading: Mutex<()>,
    pub(super) loads: AtomicU64,
    /// Calls sent (each one round trip, whatever it answered).
    pub(in crate::store::redis) calls: AtomicU64,
    /// Calls that ended without a decision, and how many of them timed out or were
    /// shed.
    pub(in crate::store::redis) failures: AtomicU64,
    pub(in crate::store::redis) timeouts: AtomicU64,
    pub(in crate::store::redis) shed: AtomicU64,
    /// When calls began to fail, so that the first answer after a failure says so
    /// once.
    pub(super) failing: Failing,
    /// This store's own pace of "cannot connect" lines.
    pub(super) unreachable_log: LogThrottle,
    /// The checks waiting for a call in flight to end, sent as the next batch.
    pub(in crate::store::redis) queue: Queue,
}

pub(super) struct State {
    pub(super) conn: Option<Conn>,
    /// What drives `conn`, when the store opened it ([`Source::Direct`]).
    pub(super) reader: Option<Arc<Reader>>,
    /// Counts installed connections, so a failure reported by a call that used an
    /// older one does not throw away its replacement.
    pub(super) generation: u64,
    pub(super) attempt: Attempt,
    pub(super) backoff: Duration,
    /// Attempts to connect that ended, and why the last one failed, for
    /// [`Link::connect`].
    pub(super) attempts: u64,
    pub(super) last_error: Option<String>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("connected", &self.conn.is_some())
            .field("generation", &self.generation)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    Idle,
    InFlight,
    /// The last attempt failed; the next may start at this instant.
    Backoff(Instant),
}

/// A connection lent to one call, with the generation to report failures against.
pub(in crate::store::redis) struct Lent {
    pub(super) conn: Conn,
    pub(super) generation: u64,
}

/// When calls (or attempts to connect) began to fail, so that the first answer after
/// a failure logs, once, that Redis answers again and for how long it did not.
#[derive(Debug)]
pub(super) struct Failing {
    epoch: Instant,
    /// 1 + ms since `epoch` of the first failure of the current spell; 0: none.
    since: AtomicU64,
}

impl Failing {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
        }
    }

    pub(super) fn begin(&self) {
        if self.since.load(Ordering::Relaxed) == 0 {
            let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
            let _ = self.since.compare_exchange(
                0,
                now.saturating_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// How long the spell that just ended lasted; `None` when none was on (one load:
    /// every answer passes here).
    pub(super) fn end(&self) -> Option<Duration> {
        if self.since.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let began = self.since.swap(0, Ordering::Relaxed).checked_sub(1)?;
        Some(
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(began)),
        )
    }
}
