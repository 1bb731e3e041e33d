//! How a call reaches the server's Lua: `FCALL` of the function library, the
//! call's script in full when the server lacks the library (then the library loaded
//! in the background), `EVALSHA` on a server without functions.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use deadpool_redis::redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::shared::{Lent, Link, CONNECT_TIMEOUT, READY_TIMEOUT};
use crate::error::{StoreError, StoreErrorKind};
use crate::store::redis::command::Request;
use crate::store::redis::conn::Conn;
use crate::store::redis::script::{Library, Via};

impl Link {
    /// Sends one call on a lent connection, by the way the server takes it (see
    /// [`Link::eval`]).
    pub(super) async fn send<R: Request + ?Sized>(
        self: &Arc<Self>,
        lent: &mut Lent,
        call: &R,
    ) -> RedisResult<Value> {
        let mut via = if self.functions.load(Ordering::Relaxed) {
            Via::Function
        } else {
            Via::Script
        };
        let mut reload = false;
        // One send in a loop, not one per way: each would give this future (moved and
        // boxed with every call) room of its own.
        loop {
            let reply = lent.conn.query(&call.command(via)).await;
            via = match (via, reply) {
                (Via::Function, Err(e)) if server_says(&e, "Function not found") => {
                    // This call goes again as the script in full, which runs it
                    // whatever the server forgets meanwhile, and its reply is its
                    // answer at once: waiting for the library's load too would let the
                    // timeout report a call that ran as one that failed. The library
                    // is loaded in the background for the calls to come (a failed load
                    // only means the next call tries again).
                    reload = true;
                    Via::ScriptSource
                }
                (Via::Function, Err(e)) if server_says(&e, "unknown command") => {
                    tracing::info!("Redis has no functions (before 7.0): calling scripts");
                    self.functions.store(false, Ordering::Relaxed);
                    Via::Script
                }
                (Via::Script, Err(e))
                    if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    Via::ScriptSource
                }
                (_, other) => {
                    if reload {
                        self.load_library_later(&lent.conn);
                    }
                    return other;
                }
            };
        }
    }

    /// Loads the function library on `lent` now (a server without functions needs
    /// none): [`RedisStore::connect`](crate::RedisStore::connect)'s warm-up.
    pub(in crate::store::redis) async fn load_library_now(
        &self,
        lent: &mut Lent,
    ) -> Result<(), StoreError> {
        let before = self.loads.load(Ordering::Acquire);
        let load = tokio::time::timeout(READY_TIMEOUT, self.load_library(&mut lent.conn, before));
        let failed = match load.await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if server_says(&e, "unknown command") => {
                tracing::info!("Redis has no functions (before 7.0): calling scripts");
                self.functions.store(false, Ordering::Relaxed);
                return Ok(());
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {READY_TIMEOUT:?}"),
        };
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "cannot load the redlimit function library on Redis at {}: {failed}",
                self.address()
            ),
        ))
    }

    /// Loads the function library on `conn` in a task of its own, unless another
    /// load finishes first.
    fn load_library_later(self: &Arc<Self>, conn: &Conn) {
        let before = self.loads.load(Ordering::Acquire);
        let (link, mut conn) = (Arc::clone(self), conn.clone());
        tokio::spawn(async move {
            // Bounded, so a load that hangs cannot hold the lock for the loads to come.
            let load = tokio::time::timeout(CONNECT_TIMEOUT, link.load_library(&mut conn, before));
            match load.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, "could not load the redlimit function library");
                }
                Err(_) => tracing::debug!("loading the redlimit function library timed out"),
            }
        });
    }

    /// Loads the function library, unless a load finished since `loads` was `before`.
    async fn load_library(&self, conn: &mut Conn, before: u64) -> RedisResult<()> {
        let _loading = self.loading.lock().await;
        if self.loads.load(Ordering::Acquire) == before {
            conn.query(&Library::get().load_command()).await?;
            self.loads.fetch_add(1, Ordering::Release);
            tracing::debug!("loaded the redlimit function library");
        }
        Ok(())
    }
}

/// Whether `error` is the server's reply and its message starts with `message` (after
/// the `ERR` code).
fn server_says(error: &RedisError, message: &str) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.starts_with(message))
}
