//! Test support: real `redis-server` processes on free loopback ports (Redis is never
//! mocked), pools for them, and the check that every key expires.
#![allow(dead_code, unreachable_pub)]

use redlimit::internals::{LimiterInternals, RedisStoreInternals};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, AsyncCommands};
use deadpool_redis::{Config, Pool, Runtime};
use redlimit::Policy;
use tempfile::TempDir;

/// `CLIENT KILL TYPE normal SKIPME yes`: closes every client connection but the
/// sender's own, as a network fault would; the reply is how many it closed.
pub fn kill_other_clients() -> redis::Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes");
    cmd
}

/// Calls per command since the last `CONFIG RESETSTAT`, from `INFO commandstats`
/// (`evalsha`, `get`, `config|resetstat`, ...).
pub async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Waits (at most 2 s) until the server holds a function library: the store loads
/// its library in the background after a call that met "Function not found", so a
/// test that measures the server after a warm-up call waits for that load first.
pub async fn wait_for_function_library(conn: &mut redis::aio::MultiplexedConnection) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .query_async(conn)
            .await
            .expect("FUNCTION LIST");
        if !libraries.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the function library was not loaded within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A real local Redis Cluster (six nodes), for the cluster tests.
pub mod cluster;
/// A loopback TCP forwarder: a proxy or link a test can move, cut or stall.
pub mod forward;
/// The layer's tests' key, services, requests and stores that fail or answer late.
pub mod layer;
/// Counting reconnection attempts while a server is down.
pub mod outage;
/// The memory and Redis stores side by side on one fake clock.
pub mod props;
/// A primary and its replica, for the failover tests.
pub mod replica;

/// A `tracing` writer into a shared buffer, to read the log lines a test caused (with
/// `tracing::subscriber::set_default` on a current-thread runtime).
#[derive(Clone, Default)]
pub struct Captured(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How long a server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the test's own commands wait for a reply: a bound for a hung server, not
/// for a slow one.
pub const TEST_REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// A `redis-server` on a loopback port, in its own temporary directory, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port, with no persistence.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments (`["--maxmemory", "10mb"]`).
    pub fn start_with(extra_args: &[&str]) -> Self {
        let mut last_failure = String::new();
        // A free port can be taken by someone else between probing and binding: retry.
        for _ in 0..5 {
            let mut server = Self {
                port: free_port(),
                dir: tempfile::Builder::new()
                    .prefix("redlimit-redis-")
                    .tempdir()
                    .expect("cannot create a temporary directory for redis-server"),
                child: None,
                extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("redis-server did not start: {last_failure}");
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A deadpool-redis pool on this server, as an application would build it.
    pub fn pool(&self) -> Pool {
        Config::from_url(self.url())
            .create_pool(Some(Runtime::Tokio1))
            .expect("cannot build a deadpool-redis pool")
    }

    /// A store on this server, on a socket of its own (`RedisStore::from_url`): what
    /// the docs lead with, and the one whose calls are written before they may time
    /// out and read however starved the test's runtime. Tests of a pool's connection
    /// build `RedisStore::new(server.pool())` themselves.
    pub fn store(&self) -> redlimit::RedisStore {
        redlimit::RedisStore::from_url(&self.url()).expect("the server's own URL parses")
    }

    /// A fresh multiplexed connection, for the test's own commands. It waits up to
    /// [`TEST_REPLY_TIMEOUT`] for a reply: redis-rs gives up after 500 ms by default,
    /// which a large pipeline or a scan outlasts on a busy machine.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(START_TIMEOUT))
            .set_response_timeout(Some(TEST_REPLY_TIMEOUT));
        redis::Client::open(self.url())
            .expect("bad url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap_or_else(|e| {
                panic!("cannot connect to {}: {e}\n{}", self.url(), self.log_tail())
            })
    }

    /// Kills the server (SIGKILL: no goodbye to clients).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (`SIGSTOP`): its sockets stay open and accept, nothing
    /// answers. It runs again when the guard is dropped or resumed.
    pub fn pause(&self) -> Paused<'_> {
        let pid = self.child.as_ref().expect("the server is not running").id();
        signal(pid, "-STOP");
        Paused {
            pid: Some(pid),
            _server: std::marker::PhantomData,
        }
    }

    /// Starts the server again on the same port (its data is gone: no persistence).
    pub fn restart(&mut self) {
        self.stop();
        if let Err(failure) = self.spawn() {
            panic!("redis-server did not restart: {failure}");
        }
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        format!(
            "--- redis-server log ({}) ---\n{tail}",
            self.log_path().display()
        )
    }

    /// Every key on the server.
    pub async fn keys(&self) -> Vec<Vec<u8>> {
        let mut conn = self.conn().await;
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("SCAN failed");
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    /// Fails the test if any key on the server has no TTL: no state may live forever.
    pub async fn assert_every_key_expires(&self) {
        let mut conn = self.conn().await;
        let mut eternal = Vec::new();
        for key in self.keys().await {
            let ttl: i64 = conn.pttl(&key).await.expect("PTTL failed");
            if ttl == -1 {
                eternal.push(String::from_utf8_lossy(&key).into_owned());
            }
        }
        assert!(
            eternal.is_empty(),
            "keys without a TTL: {eternal:?}\n{}",
            self.log_tail()
        );
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut command = Command::new(redis_server_binary());
        command
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server was not found on PATH: the Redis tests start real servers. \
                 Install it (Debian/Ubuntu: `sudo apt-get install redis-server`, macOS: \
                 `brew install redis`) or set REDLIMIT_REDIS_SERVER to its path."
            ),
            Err(e) => return Err(format!("cannot run redis-server: {e}")),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                return Err(format!(
                    "redis-server exited with {status} on port {port}\n{stderr}\n{}",
                    self.log_tail()
                ));
            }
            if ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "redis-server did not answer PING on port {port} within {START_TIMEOUT:?}\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A server frozen by [`RedisServer::pause`]: resumed (`SIGCONT`) on drop, so a
/// failing test never leaves it stopped.
#[derive(Debug)]
pub struct Paused<'a> {
    pid: Option<u32>,
    _server: std::marker::PhantomData<&'a RedisServer>,
}

impl Paused<'_> {
    /// Lets the server run again.
    pub fn resume(mut self) {
        self.resume_now();
    }

    fn resume_now(&mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, "-CONT");
        }
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.resume_now();
    }
}

/// Sends a signal to a process with `kill`, which every Unix has.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill {signal} {pid}: {e}"));
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn redis_server_binary() -> String {
    std::env::var("REDLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A free loopback port for a server this run starts, kept for it alone: the same
/// port is never handed out twice in one run, and it lies below the kernel's range of
/// ephemeral ports. A server stopped for a restart leaves its ports unbound for a
/// while; a port from the ephemeral range can meanwhile become another connection's
/// local port or another `bind(0)`'s pick, and the restart fails with "Address
/// already in use" (seen in CI for a cluster node's bus port).
fn free_port() -> u16 {
    static HANDED_OUT: AtomicUsize = AtomicUsize::new(0);
    const LOWEST: usize = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<usize>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_start.saturating_sub(LOWEST);
    if span >= 1_000 {
        // Two test processes at once start apart; a port that is busy is skipped.
        let offset = std::process::id() as usize * 7_919 % span;
        for _ in 0..span {
            let next = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
            let port = LOWEST + (offset + next) % span;
            let port = u16::try_from(port).expect("below the ephemeral range");
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return port;
            }
        }
    }
    // An odd ephemeral range: the kernel's pick, which a restart may lose.
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Whether a server answers `PING` on `port` now.
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// Checks `subjects` once each through `limiter`, all at once, each in a task of its
/// own on the runtime's workers as a server's requests are: how many were allowed,
/// and the errors' texts.
pub async fn check_at_once<S: redlimit::store::Store + Send + Sync + 'static>(
    limiter: &std::sync::Arc<redlimit::Limiter<S>>,
    subjects: impl IntoIterator<Item = String>,
) -> (usize, Vec<String>)
where
    S::Future: Send,
{
    let mut checks = tokio::task::JoinSet::new();
    for subject in subjects {
        let limiter = std::sync::Arc::clone(limiter);
        checks.spawn(async move { limiter.check(subject, 1).await });
    }
    let (mut allowed, mut errors) = (0, Vec::new());
    while let Some(checked) = checks.join_next().await {
        match checked.expect("a check panicked") {
            Ok(decision) => allowed += usize::from(decision.is_allowed()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    (allowed, errors)
}

/// The Redis Cluster hash tag of `key`: what Redis hashes to choose its slot.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The Redis key of `subject` under a limiter of `policy` alone on `store` (keys carry
/// the tag of their policy set).
pub fn key_of(
    store: &redlimit::RedisStore,
    subject: impl Into<redlimit::Subject>,
    policy: &Policy,
) -> String {
    let limiter = redlimit::Limiter::new(store.clone(), policy.clone());
    store.key(&subject.into(), limiter.policy_set(), policy)
}
