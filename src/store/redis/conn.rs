//! The two kinds of Redis deployment the store runs on, as values: one server (or a
//! primary behind a proxy) through a multiplexed connection, or a Redis Cluster
//! through redis's cluster-async client. Everything above this module is the same
//! for both.

use std::fmt;

use deadpool_redis::cluster::{ClusterClient, ClusterConnection};
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use deadpool_redis::redis::{self, Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};
use deadpool_redis::{cluster, Connection, Pool};

/// How many `MOVED`/`ASK` redirects one command follows (a slot moves once per
/// resharding step; more means the topology is changing under it).
const MAX_REDIRECTS: usize = 3;

/// Where the store gets its connection: the application's own pool, of either kind,
/// or the store's own cluster client.
pub(super) enum Source {
    /// One server: `deadpool_redis::Pool`.
    Node(Pool),
    /// A Redis Cluster: `deadpool_redis::cluster::Pool`, whose client resends a
    /// command after an I/O error (it may have run) as after a redirect.
    Cluster(cluster::Pool),
    /// A Redis Cluster through a client built with no retries of its own: a command
    /// is sent again only when a node refused it (`MOVED`, `ASK`), never after an
    /// error that leaves its fate unknown.
    ClusterClient(Box<ClusterClient>),
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
            Self::ClusterClient(client) => match client.get_async_connection().await {
                Ok(conn) => Ok(Conn::Cluster(conn)),
                Err(error) => Err(error.to_string()),
            },
        }
    }

    /// Whether checks that queue behind calls in flight go as one batch: on one
    /// server, not on a cluster, whose checks of different subjects mostly lie in
    /// different slots (a batch's keys must share one).
    pub(super) fn batches(&self) -> bool {
        matches!(self, Self::Node(_))
    }

    /// The deployment's name, for logs and `Debug`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::Node(_) => "node",
            Self::Cluster(_) | Self::ClusterClient(_) => "cluster",
        }
    }
}

/// Sends `cmd` to the node a redirect named (`ASKING` first for an `ASK`), and again
/// while nodes redirect it, up to [`MAX_REDIRECTS`] times in all.
async fn follow(
    conn: &mut ClusterConnection,
    cmd: &Cmd,
    (mut ask, mut host, mut port): (bool, String, u16),
) -> RedisResult<Value> {
    let mut redirects = 0;
    loop {
        redirects += 1;
        let node = SingleNodeRoutingInfo::ByAddress { host, port };
        let reply = if ask {
            let mut asking = redis::pipe();
            asking.cmd("ASKING").add_command(cmd.clone());
            conn.route_pipeline(asking, 1, 1, node)
                .await
                .map(|mut replies| replies.pop().unwrap_or(Value::Nil))
        } else {
            conn.route_command(cmd.clone(), RoutingInfo::SingleNode(node))
                .await
        };
        match reply.as_ref().err().and_then(redirect) {
            Some(next) if redirects < MAX_REDIRECTS => (ask, host, port) = next,
            _ => return reply,
        }
    }
}

/// The node a `MOVED` (false) or `ASK` (true) error names.
fn redirect(error: &redis::RedisError) -> Option<(bool, String, u16)> {
    let ask = match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => false,
        ErrorKind::Server(ServerErrorKind::Ask) => true,
        _ => return None,
    };
    let (address, _slot) = error.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((ask, host.to_owned(), port.parse().ok()?))
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
    ///
    /// A node's `MOVED` or `ASK` is a refusal (the command did not run there), so the
    /// command goes again, to the node named; a client without retries of its own
    /// ([`Source::ClusterClient`]) returns those to this loop, and nothing else is
    /// ever sent twice.
    pub(super) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Node(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => {
                let reply = cmd.query_async(conn).await;
                match reply.as_ref().err().and_then(redirect) {
                    // Boxed: the redirect's futures are large, and every call's future
                    // would carry their size (moved on each call) for a rare path.
                    Some(first) => Box::pin(follow(conn, cmd, first)).await,
                    None => reply,
                }
            }
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
