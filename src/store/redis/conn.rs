//! The two kinds of Redis deployment the store runs on, as values: one server (or a
//! primary behind a proxy) through a multiplexed connection, or a Redis Cluster
//! through redis's cluster-async client. Everything above this module is the same
//! for both.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::cluster::{ClusterClient, ClusterConnection};
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisResult,
    ServerErrorKind, Value,
};
use deadpool_redis::{cluster, Connection, Pool};
use tokio::io::{AsyncRead, AsyncWrite};

use super::reader::{Activity, Heard, Reader};

/// How many `MOVED`/`ASK` redirects one command follows (a slot moves once per
/// resharding step; more means the topology is changing under it).
const MAX_REDIRECTS: usize = 3;

/// Where the store gets its connection: the application's own pool, of either kind,
/// a socket of its own, or its own cluster client.
pub(super) enum Source {
    /// One server: `deadpool_redis::Pool`. Its connection's replies are read by a
    /// task that redis spawns.
    Node(Pool),
    /// One server, on a socket the store opens itself: the store drives the
    /// connection, so a call whose timer fired reads what arrived before it judges
    /// Redis silent ([`Reader`]).
    Direct(Box<ConnectionInfo>),
    /// A Redis Cluster: `deadpool_redis::cluster::Pool`, whose client resends a
    /// command after an I/O error (it may have run) as after a redirect.
    Cluster(cluster::Pool),
    /// A Redis Cluster through a client built with no retries of its own: a command
    /// is sent again only when a node refused it (`MOVED`, `ASK`), never after an
    /// error that leaves its fate unknown.
    ClusterClient(Box<ClusterClient>),
}

/// A new connection, with what drives it when the store opened it itself.
pub(super) struct Connected {
    pub(super) conn: Conn,
    pub(super) reader: Option<Arc<Reader>>,
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
    ///
    /// A socket of the store's own ([`Source::Direct`]) comes with its [`Reader`];
    /// what it reads is told to `activity`.
    pub(super) async fn connect(&self, activity: &Arc<Activity>) -> Result<Connected, String> {
        match self {
            Self::Node(pool) => match pool.get().await {
                Ok(conn) => {
                    let mut conn = Connection::take(conn);
                    // redis's own response timeout (500 ms by default) would fail a
                    // call that waits behind a deep pipeline, as a broken socket:
                    // the store's timeout is the one that measures Redis.
                    conn.set_response_timeout(NO_RESPONSE_TIMEOUT);
                    Ok(Connected {
                        conn: Conn::Node(conn),
                        reader: None,
                    })
                }
                Err(error) => Err(error.to_string()),
            },
            Self::Direct(info) => direct(info, activity).await,
            Self::Cluster(pool) => match pool.get().await {
                Ok(conn) => Ok(Connected {
                    conn: Conn::Cluster(cluster::Connection::take(conn)),
                    reader: None,
                }),
                Err(error) => Err(error.to_string()),
            },
            Self::ClusterClient(client) => match client.get_async_connection().await {
                Ok(conn) => Ok(Connected {
                    conn: Conn::Cluster(conn),
                    reader: None,
                }),
                Err(error) => Err(error.to_string()),
            },
        }
    }

    /// Whether checks that queue behind calls pipelined go as one batch: on one
    /// server, not on a cluster, whose checks of different subjects mostly lie in
    /// different slots (a batch's keys must share one).
    pub(super) fn batches(&self) -> bool {
        matches!(self, Self::Node(_) | Self::Direct(_))
    }

    /// Whether keys live in slots on several nodes.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_) | Self::ClusterClient(_))
    }

    /// The deployment's name, for logs and `Debug`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::Node(_) | Self::Direct(_) => "node",
            Self::Cluster(_) | Self::ClusterClient(_) => "cluster",
        }
    }

    /// Where the store connects, for its logs and errors: `host:port` (or a socket's
    /// path), never a password.
    pub(super) fn address(&self) -> String {
        match self {
            // The pool keeps its client's address private; its `Debug` shows it
            // (with the password redacted), and nothing else does.
            Self::Node(pool) => addresses_in(&format!("{:?}", pool.manager()))
                .unwrap_or_else(|| "the Redis of the application's pool".to_owned()),
            Self::Direct(info) => info.addr().to_string(),
            Self::Cluster(_) => "the Redis Cluster of the application's pool".to_owned(),
            Self::ClusterClient(client) => addresses_in(&format!("{client:?}"))
                .unwrap_or_else(|| "the Redis Cluster".to_owned()),
        }
    }
}

/// Long enough never to fire: redis's per-call timeout, turned off.
const NO_RESPONSE_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3_600);

/// Opens the store's own connection to `info`'s server: the socket, redis's
/// handshake on it (`AUTH`, `SELECT`, ...), and the [`Reader`] that drives it.
async fn direct(info: &ConnectionInfo, activity: &Arc<Activity>) -> Result<Connected, String> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let socket = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| e.to_string())?;
            // Calls are small and pipelined: Nagle's wait for an ACK would hold them.
            socket.set_nodelay(true).map_err(|e| e.to_string())?;
            // A second handle on the same socket, to peek at what waits in it.
            let peek = std::os::fd::AsFd::as_fd(&socket)
                .try_clone_to_owned()
                .map(std::net::TcpStream::from)
                .ok();
            drive(info, Heard::new(socket, Arc::clone(activity)), peek).await
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => {
            let socket = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| e.to_string())?;
            drive(info, Heard::new(socket, Arc::clone(activity)), None).await
        }
        _ => Err("RedisStore::from_url does not speak TLS (rediss://): give \
                  RedisStore::new a deadpool-redis pool built with TLS"
            .to_owned()),
    }
}

async fn drive<S>(
    info: &ConnectionInfo,
    socket: S,
    peek: Option<std::net::TcpStream>,
) -> Result<Connected, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(None);
    let (conn, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), socket, config)
            .await
            .map_err(|e| e.to_string())?;
    Ok(Connected {
        conn: Conn::Node(conn),
        reader: Some(Reader::spawn(driver, peek)),
    })
}

/// The server addresses in redis's `Debug` of a client (`addr: Tcp("host", 6379)`,
/// `addr: Unix("/path")`), joined by commas; `None` when it shows none.
fn addresses_in(debug: &str) -> Option<String> {
    let found: Vec<String> = debug
        .split("addr: ")
        .skip(1)
        .filter_map(|rest| {
            if let Some(rest) = rest.strip_prefix("Tcp(\"") {
                let (host, rest) = rest.split_once("\", ")?;
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                Some(format!("{host}:{port}"))
            } else if let Some(rest) = rest.strip_prefix("TcpTls { host: \"") {
                let (host, rest) = rest.split_once("\", port: ")?;
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                Some(format!("{host}:{port}"))
            } else {
                let rest = rest.strip_prefix("Unix(\"")?;
                Some(rest.split_once("\")")?.0.to_owned())
            }
        })
        .collect();
    (!found.is_empty()).then(|| found.join(","))
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
        // Routed commands hand a server's error back as a value, where `query_async`
        // makes it the error it is: the callers' handling (`Function not found`, a
        // redirect) looks at errors.
        let reply = if ask {
            let mut asking = redis::pipe();
            asking.cmd("ASKING").add_command(cmd.clone());
            conn.route_pipeline(asking, 1, 1, node)
                .await
                .map(|mut replies| replies.pop().unwrap_or(Value::Nil))
        } else {
            conn.route_command(cmd.clone(), RoutingInfo::SingleNode(node))
                .await
        }
        .and_then(Value::extract_error);
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
