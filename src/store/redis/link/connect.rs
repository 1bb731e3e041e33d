//! Getting and keeping a connection: the first connect, lending the current connection
//! to a call, and replacing one that failed or went silent, one attempt at a time with
//! backoff (an attempt settles even when its task is dropped).

use std::pin::pin;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{ErrorKind, RedisError, ServerErrorKind};

use super::super::conn::Connected;
use super::shared::{Attempt, Lent, Link, State, CLUSTER_STALL_MS, CONNECT_TIMEOUT, READY_TIMEOUT};
use crate::error::{StoreError, StoreErrorKind};

/// The first wait after a failed attempt; it doubles up to [`MAX_BACKOFF`].
pub(super) const MIN_BACKOFF: Duration = Duration::from_millis(25);
/// The longest wait between two attempts while Redis is unreachable.
const MAX_BACKOFF: Duration = Duration::from_millis(250);

impl Link {
    /// Gets a connection now (or waits, within [`READY_TIMEOUT`], for the attempt
    /// in flight), whatever the backoff: the start-up check of
    /// [`RedisStore::connect`](super::RedisStore::connect). Its error names the
    /// address and why the attempt failed.
    pub(in crate::store::redis) async fn connect(self: &Arc<Self>) -> Result<Lent, StoreError> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let before = {
            let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
            if let Attempt::Backoff(_) = state.attempt {
                state.attempt = Attempt::Idle;
            }
            state.attempts
        };
        loop {
            let mut settled = pin!(self.settled.notified());
            settled.as_mut().enable();
            if let Some(lent) = self.current() {
                return Ok(lent);
            }
            let (started, failed) = {
                let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
                let failed = (state.attempts > before && state.conn.is_none())
                    .then(|| state.last_error.clone().unwrap_or_default());
                (failed.is_none() && claim_attempt(&mut state), failed)
            };
            if let Some(error) = failed {
                return Err(self.unreachable(&error));
            }
            if started {
                self.spawn_attempt();
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return Err(self.unreachable(&format!("no connection within {READY_TIMEOUT:?}")));
            }
        }
    }

    /// The error of a store that cannot reach Redis, naming the address.
    pub(super) fn unreachable(&self, why: &str) -> StoreError {
        StoreError::new(
            StoreErrorKind::Unavailable,
            format!("cannot connect to Redis at {}: {why}", self.address),
        )
    }

    /// The connection when [`Link::current`] found none (a cheap clone sharing its
    /// socket).
    ///
    /// Before the first connection exists, waits for the attempt in flight (the
    /// caller's timeout bounds the wait). Once one has existed, a call that finds it
    /// being replaced fails at once: during an outage calls must not queue.
    pub(in crate::store::redis) async fn lend(self: &Arc<Self>) -> Result<Lent, StoreError> {
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
                    format!("no connection to Redis at {} (reconnecting)", self.address),
                ));
            }
            settled.await;
        }
    }

    /// The connection, if there is one now: the path of every call while connected,
    /// a read lock and no waiter (enabling a `Notified` first would take the
    /// `Notify`'s mutex twice per call, shared by every task).
    pub(in crate::store::redis) fn current(&self) -> Option<Lent> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.conn.as_ref().map(|conn| Lent {
            conn: conn.clone(),
            generation: state.generation,
        })
    }

    pub(super) fn failed(self: &Arc<Self>, lent: &Lent, error: RedisError) -> StoreError {
        let kind = match error.kind() {
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreErrorKind::Protocol,
            _ => StoreErrorKind::Unavailable,
        };
        let broken =
            error.is_io_error() || error.is_connection_dropped() || error.is_unrecoverable_error();
        let demoted = error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        let replace_because = if !lent.conn.repairs_itself() {
            if demoted {
                // A primary demoted by a failover: whatever moves the address (a proxy,
                // DNS, Sentinel) leads a new connection to the promoted one. Paced:
                // until it moves, every new connection meets the replica again.
                Some("Redis answered READONLY (it is a replica now)")
            } else {
                broken.then_some("Redis connection lost")
            }
        } else if error.kind() == ErrorKind::ClusterConnectionNotFound {
            // The cluster client has no socket to the call's node. With every node
            // lost it would retry every node at once, again and again, for as long as
            // calls keep coming: drop it for one paced attempt at a time. With one
            // node lost (the store's client never retries, so each call to that node
            // says so) the others keep answering, and the client repairs it.
            (self.activity.silent_ms() >= CLUSTER_STALL_MS)
                .then_some("Redis Cluster connection lost every node")
        } else {
            // A cluster connection repairs a failed node by itself, with backoff, while
            // the other nodes keep answering; one that answers nothing at all for a
            // while (its background task gone, half-open sockets) is started afresh.
            (broken && self.activity.silent_ms() >= CLUSTER_STALL_MS)
                .then_some("Redis Cluster connection answered nothing for a while")
        };
        if let Some(reason) = replace_because {
            if self.replace(lent.generation, demoted) {
                tracing::warn!(address = %self.address, %error, "{reason}; replaced it");
            }
        }
        StoreError::new(kind, error)
    }

    /// Drops connection `generation` (if still current) and starts its replacement,
    /// or with `pace`, lets the next call start it once the backoff has passed;
    /// whether it did (so only the first of many failing calls reports it).
    pub(super) fn replace(self: &Arc<Self>, generation: u64, pace: bool) -> bool {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.generation != generation || state.conn.take().is_none() {
            return false;
        }
        state.reader = None;
        if pace && state.attempt == Attempt::Idle {
            state.attempt = Attempt::Backoff(Instant::now() + state.backoff);
            state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
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
    pub(super) fn spawn_attempt(self: &Arc<Self>) {
        let guard = AttemptGuard {
            link: Arc::clone(self),
            outcome: None,
        };
        tokio::spawn(async move {
            let link = &guard.link;
            let got =
                tokio::time::timeout(CONNECT_TIMEOUT, link.source.connect(&link.activity)).await;
            guard.finish(got.unwrap_or_else(|_| Err("timed out".to_owned())));
        });
    }

    pub(super) fn settle(&self, outcome: Result<Connected, String>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.attempts += 1;
        match outcome {
            Ok(Connected { conn, reader }) => {
                state.conn = Some(conn);
                state.reader = reader;
                state.generation += 1;
                state.attempt = Attempt::Idle;
                // The backoff starts over once a call is answered on it (`answered`):
                // a connection that only answers READONLY keeps the pace.
                state.last_error = None;
                self.activity.reset_silence();
                tracing::debug!(
                    address = %self.address,
                    generation = state.generation,
                    kind = self.source.kind(),
                    "Redis connection ready"
                );
            }
            Err(error) => {
                crate::telemetry::redis_unreachable(
                    &self.unreachable_log,
                    &self.address,
                    &error,
                    state.backoff,
                );
                state.attempt = Attempt::Backoff(Instant::now() + state.backoff);
                state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
                state.last_error = Some(error);
                self.failing.begin();
            }
        }
        drop(state);
        self.settled.notify_waiters();
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
    outcome: Option<Result<Connected, String>>,
}

impl AttemptGuard {
    fn finish(mut self, outcome: Result<Connected, String>) {
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
