//! The store's one connection (multiplexed, to one server or to a cluster), taken
//! from the application's pool or opened by the store, and its replacement when it
//! breaks. Here: the calls on it and the watch for silence; getting and replacing
//! the connection is in connect.rs, the function library in library.rs; what the
//! store knows of its reads is ../reader.rs.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::Poll;
use std::time::Duration;

use deadpool_redis::redis::{ErrorKind, Value};
use tokio::sync::{Mutex, Notify};

use super::command::Request;
use super::conn::Source;
use super::queue::Queue;
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry::LogThrottle;

mod connect;
mod library;
mod shared;

use super::reader::{Activity, Read, Since};
use connect::MIN_BACKOFF;
use shared::{Attempt, Failing, Lent, State, CLUSTER_STALL_MS, STALL_MS};
pub(super) use shared::{Link, READY_TIMEOUT};

/// The longest a call waits for its reply while the connection keeps answering the
/// calls sent before it (Redis answers in order on one connection): a busy app or a
/// deep pipeline, not a silent Redis. Unless the store's timeout is longer.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// The shortest timeout: tokio's timer counts whole milliseconds, and a zero timeout
/// would spin.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// How long `lent`'s connection may answer nothing before it is presumed dead.
fn stall_ms(lent: &Lent) -> u64 {
    if lent.conn.repairs_itself() {
        CLUSTER_STALL_MS
    } else {
        STALL_MS
    }
}

impl Link {
    /// One round trip on the connection within `timeout` from `since` (see
    /// [`RedisStore::timeout`](super::RedisStore::timeout); `None`: from now), carrying `checks` checks: every check
    /// that ends without a reply is counted. An `async` block, not an `async fn`
    /// (which keeps its arguments twice): every check's future carries this one.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    pub(in crate::store::redis) fn exchange<'a, R: Request + ?Sized>(
        self: &'a Arc<Self>,
        request: &'a R,
        timeout: Duration,
        since: Option<Since>,
        checks: u64,
    ) -> impl Future<Output = Result<Value, StoreError>> + Send + 'a {
        async move {
            // While connected, the connection is lent at once: no timer for that.
            let mut lent = match self.current() {
                Some(lent) => lent,
                None => {
                    let lent = match tokio::time::Instant::now().checked_add(timeout) {
                        Some(deadline) => tokio::time::timeout_at(deadline, self.lend())
                            .await
                            .unwrap_or_else(|_| Err(StoreError::timeout())),
                        None => self.lend().await,
                    };
                    match lent {
                        Ok(lent) => lent,
                        Err(error) => {
                            self.count_failures(&error, checks);
                            return Err(error);
                        }
                    }
                }
            };
            let since = since.unwrap_or_else(|| self.since());
            let reply = self.eval_within(&mut lent, request, timeout, since).await;
            if let Err(error) = &reply {
                self.count_failures(error, checks);
            }
            reply
        }
    }

    pub(super) fn new(source: Source) -> Self {
        Self {
            address: source.address().into(),
            source,
            state: RwLock::new(State {
                conn: None,
                reader: None,
                generation: 0,
                attempt: Attempt::Idle,
                backoff: MIN_BACKOFF,
                attempts: 0,
                last_error: None,
            }),
            settled: Notify::new(),
            activity: Arc::new(Activity::new()),
            functions: AtomicBool::new(true),
            loading: Mutex::new(()),
            loads: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            failing: Failing::new(),
            unreachable_log: LogThrottle::new(),
            queue: Queue::default(),
        }
    }

    /// Where the store connects, as its logs and errors name it.
    pub(super) fn address(&self) -> &str {
        &self.address
    }

    /// Sends one call on a lent connection: `FCALL` of the library's function. When the
    /// server lacks the library (a restart, a `FUNCTION FLUSH`, a new cluster node), the
    /// call is sent again as its script in full (`EVAL`, which runs and caches it, so
    /// no flush can race it), then the library is loaded. A server without functions
    /// gets the call's script instead: `EVALSHA`, and `EVAL` only after `NOSCRIPT`.
    pub(super) async fn eval<R: Request + ?Sized>(
        self: &Arc<Self>,
        lent: &mut Lent,
        call: &R,
    ) -> Result<Value, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match self.send(lent, call).await {
            Ok(value) => {
                self.answered();
                Ok(value)
            }
            Err(error) => {
                // An error reply is an answer too: Redis is there.
                if matches!(error.kind(), ErrorKind::Server(_) | ErrorKind::Extension) {
                    self.activity.heard_now();
                }
                Err(self.failed(lent, error))
            }
        }
    }

    /// [`Link::eval`] within `timeout`, which measures how long Redis stays silent,
    /// not how long this task takes to read its reply.
    ///
    /// Redis answers in order on one connection, so while the connection keeps
    /// delivering (replies to the calls sent before this one), Redis is answering and
    /// this call is behind a deep pipeline or a busy app: it waits on, up to
    /// [`MAX_WAIT`] (or `timeout`, if longer) from its send. It times out when nothing
    /// at all arrived during the last `timeout`, counted from `since` (the send, or
    /// for a batch of checks that queued behind a call in flight, when its first
    /// check queued, with what had arrived by then): what a stopped, paused or
    /// unreachable Redis looks like. On a cluster the timeout runs from `since` alone.
    ///
    /// Before it judges, a call on the store's own connection drives it itself
    /// ([`Link::read_now`]): it reads what has arrived, writes what waited unwritten,
    /// and looks for bytes in the socket that the runtime has not seen yet. A reply
    /// that arrived is a decision, however starved the app that reads it; a call
    /// that had to write its own request, or found bytes waiting, was held up by the
    /// app, not by Redis, and waits on. A `timeout` too large to add to the clock
    /// (`Duration::MAX`) means no timeout.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    pub(super) fn eval_within<'a, R: Request + ?Sized>(
        self: &'a Arc<Self>,
        lent: &'a mut Lent,
        call: &'a R,
        timeout: Duration,
        since: Since,
    ) -> impl Future<Output = Result<Value, StoreError>> + Send + 'a {
        // An `async` block, not an `async fn`, as `exchange`'s.
        async move {
            let timeout = timeout.max(MIN_TIMEOUT);
            let limits = since
                .at
                .checked_add(timeout)
                .zip(tokio::time::Instant::now().checked_add(timeout.max(MAX_WAIT)));
            let (generation, stall) = (lent.generation, stall_ms(lent));
            let repairs_itself = lent.conn.repairs_itself();
            let mut heard = since.heard;
            // One call's future for either way below: this future would carry a second
            // one's room beside it (hundreds of bytes, moved and boxed with every call).
            let mut eval = pin!(self.eval(lent, call));
            let Some((mut deadline, bound)) = limits else {
                return eval.await;
            };
            loop {
                if let Ok(reply) = tokio::time::timeout_at(deadline, eval.as_mut()).await {
                    return reply;
                }
                // The timer may run before the connection's reads (a busy runtime wakes
                // both at once; a starved host runs either late): read what arrived,
                // then look for this call's reply once more.
                tokio::task::yield_now().await;
                let silent = self.heard_nothing(generation, heard);
                let polled = std::future::poll_fn(|cx| Poll::Ready(eval.as_mut().poll(cx))).await;
                if let Poll::Ready(reply) = polled {
                    return reply;
                }
                let now = tokio::time::Instant::now();
                // A cluster connection multiplexes several nodes: one node's replies say
                // nothing of another's, so there the timeout runs from `since` alone.
                if silent || now >= bound || repairs_itself {
                    self.timed_out(generation, stall);
                    return Err(self.silent_error(timeout));
                }
                heard = self.activity.heard();
                deadline = (now + timeout).min(bound);
            }
        }
    }

    /// Whether Redis has said nothing since `since` for `timeout` or longer (having
    /// read what arrived first): a batch that queued that long ago is not sent.
    pub(super) fn silent_since(&self, since: Since, timeout: Duration) -> bool {
        let Some(deadline) = since.at.checked_add(timeout.max(MIN_TIMEOUT)) else {
            return false;
        };
        if tokio::time::Instant::now() < deadline || self.activity.heard() != since.heard {
            return false;
        }
        let generation = self
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .generation;
        self.heard_nothing(generation, since.heard)
    }

    /// Whether connection `generation` has delivered nothing since it had delivered
    /// `heard`, once driven on the caller's task ([`Link::read_now`]). Not silent when
    /// the call found requests unwritten, or bytes waiting that the runtime has not
    /// read: then the app was late, not Redis.
    fn heard_nothing(&self, generation: u64, heard: u64) -> bool {
        self.read_now(generation) == Read::Done && self.activity.heard() == heard
    }

    /// Drives connection `generation` once on the caller's task, if the store drives
    /// it ([`Reader::read_now`]).
    fn read_now(&self, generation: u64) -> Read {
        let reader = {
            let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
            match &state.reader {
                Some(reader) if state.generation == generation => Arc::clone(reader),
                _ => return Read::Done,
            }
        };
        reader.read_now(&self.activity)
    }

    /// The timeout of a call that heard nothing for `timeout`.
    pub(super) fn silent_error(&self, timeout: Duration) -> StoreError {
        StoreError::new(
            StoreErrorKind::Timeout,
            format!("Redis at {} said nothing for {timeout:?}", self.address),
        )
    }

    /// Called when a call on connection `generation` timed out: a connection silent for a while is
    /// presumed dead and replaced.
    fn timed_out(self: &Arc<Self>, generation: u64, stall_ms: u64) {
        let silent = self.activity.silent_ms();
        if silent >= stall_ms && self.replace(generation, false) {
            tracing::warn!(
                address = %self.address,
                silent_ms = silent,
                "Redis connection stalled; replaced it"
            );
        }
    }

    /// Counts a queued check whose batch went with the runtime that was to send it:
    /// it ended without a decision, but Redis was never asked, so no spell of
    /// failure begins (its end would be logged as Redis answering again).
    pub(super) fn count_dropped_batch(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `checks` calls (or checks of a batch) that ended without a decision.
    pub(super) fn count_failures(&self, error: &StoreError, checks: u64) {
        self.failures.fetch_add(checks, Ordering::Relaxed);
        match error.kind() {
            StoreErrorKind::Timeout => {
                self.timeouts.fetch_add(checks, Ordering::Relaxed);
            }
            StoreErrorKind::Overloaded => {
                // Shed before Redis saw them: not a failure of Redis.
                self.shed.fetch_add(checks, Ordering::Relaxed);
                return;
            }
            _ => {}
        }
        self.failing.begin();
    }

    /// Now, for a call's bounds ([`Link::eval_within`]).
    pub(super) fn since(&self) -> Since {
        Since {
            at: tokio::time::Instant::now(),
            heard: self.activity.heard(),
        }
    }

    /// Whether checks that queue behind calls in flight go as one batch
    /// ([`Source::batches`]).
    pub(super) fn batches(&self) -> bool {
        self.source.batches()
    }

    /// Whether the store is a Redis Cluster ([`Source::is_cluster`]).
    pub(in crate::store::redis) fn is_cluster(&self) -> bool {
        self.source.is_cluster()
    }

    fn answered(&self) {
        self.activity.heard_now();
        if let Some(failing) = self.failing.end() {
            crate::telemetry::redis_answers_again(&self.address, failing);
            self.state
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .backoff = MIN_BACKOFF;
        }
    }
}
