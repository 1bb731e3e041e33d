//! The store's one connection (multiplexed, to one server or to a cluster), taken
//! from the application's pool, and its replacement when it breaks.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool_redis::redis::{ErrorKind, RedisError, Value};
use tokio::sync::{Mutex, Notify};

use super::batch::Queue;
use super::conn::{Conn, Source};
use super::contract::args::Request;
use crate::store::{StoreError, StoreErrorKind};

mod library;

/// How long one attempt to get a connection from the pool may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The first wait after a failed attempt; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(25);
/// The longest wait between two attempts while Redis is unreachable.
const MAX_BACKOFF: Duration = Duration::from_millis(250);
/// A connection that answered nothing for this long while calls time out is replaced
/// (a half-open socket never reports an error); so is a cluster connection that
/// answered nothing for this long while calls fail.
const STALL_MS: u64 = 1_000;
/// A cluster connection whose calls all fail or time out for this long is replaced,
/// sooner than a single-node one: while no node answers, the cluster client retries
/// every node at once on each call, and on a busy machine its errors do not always
/// say that it lost every node. One paced replacement attempt costs far less.
const CLUSTER_STALL_MS: u64 = 250;
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

/// The connection shared by every clone of one store.
#[derive(Debug)]
pub(super) struct Link {
    source: Source,
    state: RwLock<State>,
    /// Woken when an attempt to connect ends, for calls made before the first
    /// connection exists.
    settled: Notify,
    /// Time origin of `last_answer_ms`.
    epoch: Instant,
    /// When the current connection last answered, in ms since `epoch`.
    last_answer_ms: AtomicU64,
    /// Whether calls go through the function library (until the server says it has
    /// no functions: Redis before 7.0).
    functions: AtomicBool,
    /// Held while the library is being loaded, so the calls that all find it missing
    /// after a restart load it once, not once each; `loads` counts finished loads.
    loading: Mutex<()>,
    loads: AtomicU64,
    /// Calls sent (each one round trip, whatever it answered).
    pub(super) calls: AtomicU64,
    /// Replies received: a call that finds this unchanged over its timeout met a
    /// connection that answered nobody.
    replies: AtomicU64,
    /// Calls that ended without a decision, and how many of them timed out.
    pub(super) failures: AtomicU64,
    pub(super) timeouts: AtomicU64,
    /// The checks waiting for a call in flight to end, sent as the next batch.
    pub(super) queue: Queue,
}

struct State {
    conn: Option<Conn>,
    /// Counts installed connections, so a failure reported by a call that used an
    /// older one does not throw away its replacement.
    generation: u64,
    attempt: Attempt,
    backoff: Duration,
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
enum Attempt {
    Idle,
    InFlight,
    /// The last attempt failed; the next may start at this instant.
    Backoff(Instant),
}

/// When a call's time started, and how many replies the connection had delivered by
/// then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Since {
    at: tokio::time::Instant,
    replies: u64,
}

/// A connection lent to one call, with the generation to report failures against.
pub(super) struct Lent {
    conn: Conn,
    generation: u64,
}

impl Link {
    pub(super) fn new(source: Source) -> Self {
        Self {
            source,
            state: RwLock::new(State {
                conn: None,
                generation: 0,
                attempt: Attempt::Idle,
                backoff: MIN_BACKOFF,
            }),
            settled: Notify::new(),
            epoch: Instant::now(),
            last_answer_ms: AtomicU64::new(0),
            functions: AtomicBool::new(true),
            loading: Mutex::new(()),
            loads: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            replies: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            queue: Queue::default(),
        }
    }

    /// The connection when [`Link::current`] found none (a cheap clone sharing its
    /// socket).
    ///
    /// Before the first connection exists, waits for the attempt in flight (the
    /// caller's timeout bounds the wait). Once one has existed, a call that finds it
    /// being replaced fails at once: during an outage calls must not queue.
    pub(super) async fn lend(self: &Arc<Self>) -> Result<Lent, StoreError> {
        loop {
            let mut settled = pin!(self.settled.notified());
            settled.as_mut().enable();
            // Checked again once registered, so a connection that settles in between
            // is not missed.
            if let Some(lent) = self.current() {
                return Ok(lent);
            }
            let (started, wait) = {
                let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
                if state.conn.is_some() {
                    continue;
                }
                let started = claim_attempt(&mut state);
                (
                    started,
                    state.generation == 0 && state.attempt == Attempt::InFlight,
                )
            };
            if started {
                self.spawn_attempt();
            }
            if !wait {
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "no connection to Redis (reconnecting)",
                ));
            }
            settled.await;
        }
    }

    /// The connection, if there is one now: the path of every call while connected,
    /// a read lock and no waiter (enabling a `Notified` first would take the
    /// `Notify`'s mutex twice per call, shared by every task).
    pub(super) fn current(&self) -> Option<Lent> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.conn.as_ref().map(|conn| Lent {
            conn: conn.clone(),
            generation: state.generation,
        })
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
            Err(error) => Err(self.failed(lent, error)),
        }
    }

    /// [`Link::eval`] within `timeout`, which measures how long the connection stays
    /// silent, not how long this task takes to read its reply.
    ///
    /// Redis answers in order on one connection, so while replies keep arriving (to the
    /// calls sent before this one), Redis is answering and this call is behind a busy
    /// app or a deep pipeline: it waits on, up to [`MAX_WAIT`] (or `timeout`, if
    /// longer) in all. It times out when no reply at all arrived during the last
    /// `timeout`, which is what a stopped, paused or unreachable Redis looks like. On a
    /// cluster the timeout runs from the send. Either way the call's own reply is
    /// looked for once more after the timer fires, once the connection's task has had
    /// a turn. A `timeout` too large to add to the clock (`Duration::MAX`) means no
    /// timeout.
    ///
    /// Every bound counts from `since`: the send, or for a batch of checks that
    /// queued behind a call in flight, when its first check queued (with the replies
    /// seen by then), so a check waits no longer for being batched.
    pub(super) async fn eval_within<R: Request + ?Sized>(
        self: &Arc<Self>,
        lent: &mut Lent,
        call: &R,
        timeout: Duration,
        since: Since,
    ) -> Result<Value, StoreError> {
        let timeout = timeout.max(MIN_TIMEOUT);
        let sent = since.at;
        let (Some(mut deadline), Some(bound)) = (
            sent.checked_add(timeout),
            sent.checked_add(timeout.max(MAX_WAIT)),
        ) else {
            return self.eval(lent, call).await;
        };
        let (generation, stall) = (lent.generation, stall_ms(lent));
        let repairs_itself = lent.conn.repairs_itself();
        let mut replies = since.replies;
        let mut eval = pin!(self.eval(lent, call));
        loop {
            if let Ok(reply) = tokio::time::timeout_at(deadline, eval.as_mut()).await {
                return reply;
            }
            // The timer may run before the connection's task has read what arrived
            // (a busy runtime wakes both at once): let it run, then look again.
            tokio::task::yield_now().await;
            let polled = std::future::poll_fn(|cx| Poll::Ready(eval.as_mut().poll(cx))).await;
            if let Poll::Ready(reply) = polled {
                return reply;
            }
            let now = tokio::time::Instant::now();
            let seen = self.replies.load(Ordering::Relaxed);
            // A cluster connection multiplexes several nodes: one node's replies say
            // nothing of another's, so there the timeout runs from the send.
            if seen == replies || now >= bound || repairs_itself {
                self.timed_out(generation, stall);
                return Err(StoreError::timeout());
            }
            replies = seen;
            deadline = (now + timeout).min(bound);
        }
    }

    /// Called when a call on connection `generation` timed out: a connection silent for a while is
    /// presumed dead and replaced.
    fn timed_out(self: &Arc<Self>, generation: u64, stall_ms: u64) {
        let silent = self.silent_ms();
        if silent >= stall_ms && self.replace(generation) {
            tracing::warn!(silent_ms = silent, "Redis connection stalled; replaced it");
        }
    }

    /// Counts `checks` calls (or checks of a batch) that ended without a decision.
    pub(super) fn count_failures(&self, error: &StoreError, checks: u64) {
        self.failures.fetch_add(checks, Ordering::Relaxed);
        if error.kind() == StoreErrorKind::Timeout {
            self.timeouts.fetch_add(checks, Ordering::Relaxed);
        }
    }

    /// Now, for a call's bounds ([`Link::eval_within`]).
    pub(super) fn since(&self) -> Since {
        Since {
            at: tokio::time::Instant::now(),
            replies: self.replies.load(Ordering::Relaxed),
        }
    }

    /// Whether checks that queue behind calls in flight go as one batch
    /// ([`Source::batches`]).
    pub(super) fn batches(&self) -> bool {
        self.source.batches()
    }

    fn answered(&self) {
        self.replies.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        // Write only when it changes: every call passes here.
        if self.last_answer_ms.load(Ordering::Relaxed) != now {
            self.last_answer_ms.store(now, Ordering::Relaxed);
        }
    }

    /// Milliseconds since the current connection last answered a call.
    fn silent_ms(&self) -> u64 {
        self.now_ms()
            .saturating_sub(self.last_answer_ms.load(Ordering::Relaxed))
    }

    fn failed(self: &Arc<Self>, lent: &Lent, error: RedisError) -> StoreError {
        let kind = match error.kind() {
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreErrorKind::Protocol,
            _ => StoreErrorKind::Unavailable,
        };
        let broken =
            error.is_io_error() || error.is_connection_dropped() || error.is_unrecoverable_error();
        let replace_because = if !lent.conn.repairs_itself() {
            broken.then_some("Redis connection lost")
        } else if error.kind() == ErrorKind::ClusterConnectionNotFound {
            // The cluster client has no socket to the call's node. With every node
            // lost it would retry every node at once, again and again, for as long as
            // calls keep coming: drop it for one paced attempt at a time. With one
            // node lost (the store's client never retries, so each call to that node
            // says so) the others keep answering, and the client repairs it.
            (self.silent_ms() >= CLUSTER_STALL_MS)
                .then_some("Redis Cluster connection lost every node")
        } else {
            // A cluster connection repairs a failed node by itself, with backoff, while
            // the other nodes keep answering; one that answers nothing at all for a
            // while (its background task gone, half-open sockets) is started afresh.
            (broken && self.silent_ms() >= CLUSTER_STALL_MS)
                .then_some("Redis Cluster connection answered nothing for a while")
        };
        if let Some(reason) = replace_because {
            if self.replace(lent.generation) {
                tracing::warn!(%error, "{reason}; replaced it");
            }
        }
        StoreError::new(kind, error)
    }

    /// Drops connection `generation` (if still current) and starts its replacement;
    /// whether it did (so only the first of many failing calls reports it).
    fn replace(self: &Arc<Self>, generation: u64) -> bool {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.generation != generation || state.conn.take().is_none() {
            return false;
        }
        let started = claim_attempt(&mut state);
        drop(state);
        if started {
            self.spawn_attempt();
        }
        true
    }

    /// Runs one attempt to get a connection in the background (claimed beforehand
    /// with [`claim_attempt`]). Spawned, not awaited: a call's timeout must not
    /// cancel it.
    fn spawn_attempt(self: &Arc<Self>) {
        let guard = AttemptGuard {
            link: Arc::clone(self),
            outcome: None,
        };
        tokio::spawn(async move {
            let got = tokio::time::timeout(CONNECT_TIMEOUT, guard.link.source.connect()).await;
            guard.finish(got.unwrap_or_else(|_| Err("timed out".to_owned())));
        });
    }

    fn settle(&self, outcome: Result<Conn, String>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(conn) => {
                state.conn = Some(conn);
                state.generation += 1;
                state.attempt = Attempt::Idle;
                state.backoff = MIN_BACKOFF;
                self.last_answer_ms.store(self.now_ms(), Ordering::Relaxed);
                tracing::debug!(
                    generation = state.generation,
                    kind = self.source.kind(),
                    "Redis connection ready"
                );
            }
            Err(error) => {
                tracing::warn!(%error, kind = self.source.kind(), retry_in = ?state.backoff,
                    "cannot get a Redis connection");
                state.attempt = Attempt::Backoff(Instant::now() + state.backoff);
                state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
            }
        }
        drop(state);
        self.settled.notify_waiters();
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Claims the right to start an attempt: none is in flight and the last failure is
/// old enough. The caller spawns it after releasing the lock.
fn claim_attempt(state: &mut State) -> bool {
    match state.attempt {
        Attempt::InFlight => false,
        Attempt::Backoff(until) if Instant::now() < until => false,
        _ => {
            state.attempt = Attempt::InFlight;
            true
        }
    }
}

/// Settles an attempt when its task ends, or is dropped unfinished (its runtime shut
/// down), so that a later call can always start another.
struct AttemptGuard {
    link: Arc<Link>,
    outcome: Option<Result<Conn, String>>,
}

impl AttemptGuard {
    fn finish(mut self, outcome: Result<Conn, String>) {
        self.outcome = Some(outcome);
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| Err("the connecting task was dropped".to_owned()));
        self.link.settle(outcome);
    }
}
