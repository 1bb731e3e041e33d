//! The two kinds of Redis deployment the store runs on, as values: one server (or a
//! primary behind a proxy) through a multiplexed connection, or a Redis Cluster
//! through redis's cluster-async client. Everything above this module is the same
//! for both.

use std::fmt;

use deadpool_redis::cluster::ClusterConnection;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{Cmd, RedisResult, Value};
use deadpool_redis::{cluster, Connection, Pool};

/// Where the store gets its connection: the application's own pool, of either kind.
pub(super) enum Source {
    /// One server: `deadpool_redis::Pool`.
    Node(Pool),
    /// A Redis Cluster: `deadpool_redis::cluster::Pool`.
    Cluster(cluster::Pool),
}

/// A connection of either kind. Clones share its sockets and pipeline their calls.
#[derive(Clone)]
pub(super) enum Conn {
    /// One socket to one server.
    Node(MultiplexedConnection),
    /// One multiplexed socket per cluster node, routed by each command's key slot,
    /// following `MOVED`/`ASK` and reconnecting to nodes by itself.
    Cluster(ClusterConnection),
}

impl Source {
    /// Gets a connection from the pool and takes it out for good.
    ///
    /// Taken, not borrowed: the socket is the store's alone, so nothing the
    /// application sends on pooled connections (a blocking `BLPOP`, a `SELECT`) can
    /// stall or redirect rate-limit calls, and no per-call checkout (with its recycle
    /// `PING`) is ever paid. The pool opens another connection for the application.
    pub(super) async fn connect(&self) -> Result<Conn, String> {
        match self {
            Self::Node(pool) => match pool.get().await {
                Ok(conn) => Ok(Conn::Node(Connection::take(conn))),
                Err(error) => Err(error.to_string()),
            },
            Self::Cluster(pool) => match pool.get().await {
                Ok(conn) => Ok(Conn::Cluster(cluster::Connection::take(conn))),
                Err(error) => Err(error.to_string()),
            },
        }
    }

    /// The deployment's name, for logs and `Debug`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::Node(_) => "node",
            Self::Cluster(_) => "cluster",
        }
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

impl Conn {
    /// Sends one command and reads its reply. On a cluster, the command goes to the
    /// master of its first key's slot (`EVALSHA sha numkeys key ...` is routed by
    /// `key`), so every call is one round trip to the node that holds its state.
    pub(super) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Node(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => cmd.query_async(conn).await,
        }
    }

    /// Whether the connection repairs its own broken sockets, so that a connection
    /// error must not make the store throw the whole of it away.
    ///
    /// A cluster connection reconnects to a failed node in the background, with
    /// backoff, and refreshes its slot map when a node answers `MOVED` (as the
    /// promoted replica's shard does after a failover); replacing it at every node
    /// error would drop the healthy nodes' sockets and reconnect to all of them.
    pub(super) fn repairs_itself(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}
