//! A real local Redis Cluster: six `redis-server --cluster-enabled yes` processes on
//! free loopback ports (three masters, three replicas), joined by
//! `redis-cli --cluster create`, killed on drop; and the failover of one master.

use std::io::Read;
use std::ops::RangeInclusive;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::{free_port, RedisServer};

/// Masters in the cluster; each gets one replica.
const MASTERS: usize = 3;
/// Small, so a failover takes a couple of seconds: a master unreachable for this long
/// is flagged as failing, and its replica is elected soon after.
const NODE_TIMEOUT_MS: u64 = 1_000;
/// How long `redis-cli --cluster create` plus the cluster's agreement may take.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failover may take before the test fails.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);

/// One node, as the cluster sees it (a line of `CLUSTER NODES`).
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// Flagged `fail` or `fail?` by the node that was asked.
    pub failing: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    pub slots: Vec<RangeInclusive<u16>>,
}

impl NodeInfo {
    /// Whether this node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }
}

/// Six cluster-enabled servers joined into one cluster; every process is killed on
/// drop (through each [`RedisServer`]).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six nodes, joins them into a cluster of three masters with one replica
    /// each, and waits until every node reports `cluster_state:ok` and every replica
    /// is in sync with its master.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a cluster whose nodes get extra arguments
    /// (`["--cluster-require-full-coverage", "no"]`).
    pub fn start_with(extra_args: &[&str]) -> Self {
        let nodes = (0..2 * MASTERS).map(|_| start_node(extra_args)).collect();
        let cluster = Self { nodes };
        let started = Instant::now();
        let deadline = started + FORM_TIMEOUT;
        cluster.create(deadline);
        let created = started.elapsed();
        cluster.wait_until_formed(deadline);
        eprintln!(
            "cluster on ports {:?}: created in {created:?}, whole in {:?}",
            cluster
                .nodes
                .iter()
                .map(RedisServer::port)
                .collect::<Vec<_>>(),
            started.elapsed()
        );
        cluster
    }

    /// The nodes' URLs, `redis://127.0.0.1:<port>/`, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A deadpool-redis cluster pool on every node, as an application would build it.
    pub fn pool(&self) -> deadpool_redis::cluster::Pool {
        deadpool_redis::cluster::Config::from_urls(self.urls())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("cannot build a deadpool-redis cluster pool")
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// The nodes still running.
    pub fn live_nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.child.is_some())
    }

    /// The cluster's topology as a live node sees it.
    pub async fn topology(&self) -> Vec<NodeInfo> {
        let node = self.live_nodes().next().expect("every node is dead");
        let mut conn = node.conn().await;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("CLUSTER NODES failed: {e}\n{}", self.log_tails()));
        parse_nodes(&text)
    }

    /// The masters that serve slots, as a live node sees them.
    pub async fn masters(&self) -> Vec<NodeInfo> {
        let mut masters: Vec<NodeInfo> = self
            .topology()
            .await
            .into_iter()
            .filter(|n| n.master && !n.failing && !n.slots.is_empty())
            .collect();
        masters.sort_by_key(|n| n.port);
        masters
    }

    /// The slot of `key`, as the cluster computes it.
    pub async fn slot(&self, key: &str) -> u16 {
        let node = self.live_nodes().next().expect("every node is dead");
        let mut conn = node.conn().await;
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("CLUSTER KEYSLOT failed")
    }

    /// Kills the master on `port` (SIGKILL) and returns its replica's port and the
    /// moment of the kill. [`RedisCluster::wait_for_promotion`] then waits for the
    /// replica to take over.
    pub async fn kill_master(&mut self, port: u16) -> (u16, Instant) {
        let topology = self.topology().await;
        let master = topology
            .iter()
            .find(|n| n.port == port && n.master)
            .unwrap_or_else(|| panic!("no master on port {port}: {topology:?}"));
        let replica = topology
            .iter()
            .find(|n| n.master_id.as_deref() == Some(master.id.as_str()))
            .unwrap_or_else(|| panic!("master {port} has no replica: {topology:?}"))
            .port;
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("the master is one of the nodes");
        node.stop();
        (replica, Instant::now())
    }

    /// Waits (bounded) until the replica on `port` is a master serving slots and
    /// every live node reports `cluster_state:ok`; returns when that was seen.
    pub async fn wait_for_promotion(&self, port: u16) -> Instant {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            if self.promoted(port).await {
                return Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "the replica on port {port} was not promoted within {FAILOVER_TIMEOUT:?}\n{}",
                self.log_tails()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills every node (SIGKILL).
    pub fn stop_all(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
    }

    /// Starts every stopped node again on its port, from its `nodes.conf` (so with
    /// its old role and peers, and no data), and waits until the cluster is whole.
    pub fn restart_stopped(&mut self) {
        for node in self.nodes.iter_mut().filter(|n| n.child.is_none()) {
            if let Err(failure) = node.spawn() {
                panic!("a cluster node did not restart: {failure}");
            }
        }
        self.wait_until_formed(Instant::now() + FORM_TIMEOUT);
    }

    /// The last lines of every node's log, for failure messages.
    pub fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("node {}: {}", n.port(), n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn promoted(&self, port: u16) -> bool {
        let Ok(mut conn) = connect(self.node(port)).await else {
            return false;
        };
        let role: Result<Vec<redis::Value>, _> = redis::cmd("ROLE").query_async(&mut conn).await;
        let is_master =
            matches!(role.as_deref(), Ok([redis::Value::BulkString(r), ..]) if r == b"master");
        if !is_master {
            return false;
        }
        for node in self.live_nodes() {
            let Ok(mut conn) = connect(node).await else {
                return false;
            };
            let info: Result<String, _> = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await;
            if !info.is_ok_and(|i| info_field(&i, "cluster_state") == Some("ok")) {
                return false;
            }
        }
        true
    }

    /// Runs `redis-cli --cluster create`, bounded by `deadline`.
    fn create(&self, deadline: Instant) {
        let mut command = Command::new(redis_cli_binary());
        command.args(["--cluster", "create"]);
        for node in &self.nodes {
            command.arg(format!("127.0.0.1:{}", node.port()));
        }
        command
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-cli was not found on PATH: the cluster tests join their servers with \
                 `redis-cli --cluster create`. Install it (Debian/Ubuntu: `sudo apt-get install \
                 redis-tools`, macOS: `brew install redis`) or set REDLIMIT_REDIS_CLI to its path."
            ),
            Err(e) => panic!("cannot run redis-cli: {e}"),
        };
        let status = loop {
            if let Some(status) = child.try_wait().expect("cannot wait for redis-cli") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut output = String::new();
        if let Some(mut pipe) = child.stdout.take() {
            let _ = pipe.read_to_string(&mut output);
        }
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut output);
        }
        match status {
            Some(status) if status.success() => {}
            Some(status) => panic!(
                "redis-cli --cluster create exited with {status}:\n{output}\n{}",
                self.log_tails()
            ),
            None => panic!(
                "redis-cli --cluster create did not finish within {FORM_TIMEOUT:?}:\n{output}\n{}",
                self.log_tails()
            ),
        }
    }

    /// Polls every node until the cluster is whole: all slots served, every node
    /// knows every other and every replica, `cluster_state:ok`, and each replica's
    /// link to its master is up (so a failover has a replica in sync to promote).
    fn wait_until_formed(&self, deadline: Instant) {
        loop {
            let Err(last) = self.formed() else {
                return;
            };
            assert!(
                Instant::now() < deadline,
                "the cluster did not form within {FORM_TIMEOUT:?}: {last}\n{}",
                self.log_tails()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn formed(&self) -> Result<(), String> {
        let nodes = self.nodes.len().to_string();
        for node in &self.nodes {
            let port = node.port();
            let client = redis::Client::open(node.url()).map_err(|e| e.to_string())?;
            let mut conn = client
                .get_connection_with_timeout(Duration::from_secs(1))
                .map_err(|e| format!("node {port}: {e}"))?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .map_err(|e| format!("node {port}: {e}"))?;
            for (field, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", nodes.as_str()),
            ] {
                let got = info_field(&info, field);
                if got != Some(want) {
                    return Err(format!("node {port}: {field} is {got:?}, not {want}"));
                }
            }
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut conn)
                .map_err(|e| format!("node {port}: {e}"))?;
            if info_field(&replication, "role") == Some("slave")
                && info_field(&replication, "master_link_status") != Some("up")
            {
                return Err(format!("replica {port} is not in sync with its master yet"));
            }
            // `redis-cli --cluster create` makes the replicas last, and word of them
            // spreads by gossip: a node may still see an empty master where there is
            // a replica, and a master without one.
            let text: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut conn)
                .map_err(|e| format!("node {port}: {e}"))?;
            let replicas = parse_nodes(&text)
                .iter()
                .filter(|n| n.master_id.is_some())
                .count();
            if replicas != self.nodes.len() / 2 {
                return Err(format!("node {port} knows {replicas} replicas so far"));
            }
        }
        Ok(())
    }
}

/// Starts one cluster-enabled node, with its cluster bus on a free port of its own
/// (the default, port + 10000, may be taken or out of range).
fn start_node(extra_args: &[&str]) -> RedisServer {
    let mut last_failure = String::new();
    for _ in 0..5 {
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::Builder::new()
                .prefix("redlimit-cluster-")
                .tempdir()
                .expect("cannot create a temporary directory for redis-server"),
            child: None,
            extra_args: vec![
                "--cluster-enabled".into(),
                "yes".into(),
                // Relative to --dir: each node keeps its own.
                "--cluster-config-file".into(),
                "nodes.conf".into(),
                "--cluster-node-timeout".into(),
                NODE_TIMEOUT_MS.to_string(),
                "--cluster-port".into(),
                free_port().to_string(),
                // A replica's first sync starts at once, not after the default 5 s
                // wait for more replicas to share the transfer.
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ]
            .into_iter()
            .chain(extra_args.iter().map(|s| s.to_string()))
            .collect(),
        };
        match server.spawn() {
            Ok(()) => return server,
            Err(failure) => last_failure = failure,
        }
    }
    panic!("a cluster node did not start: {last_failure}");
}

/// A connection to one node (not cluster-aware), failing fast when it is down.
async fn connect(node: &RedisServer) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(node.url()).map_err(|e| e.to_string())?;
    match tokio::time::timeout(
        Duration::from_millis(500),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("connect timed out".to_owned()),
    }
}

fn redis_cli_binary() -> String {
    std::env::var("REDLIMIT_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// The value of `field` in an `INFO`-style `field:value` text.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch>
/// <link> <slot or range>...`.
fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() >= 8, "odd CLUSTER NODES line: {line:?}");
        let address = fields[1].split('@').next().unwrap_or_default();
        let port = address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in CLUSTER NODES line: {line:?}"));
        let flags: Vec<&str> = fields[2].split(',').collect();
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('[')) // slots being migrated
            .map(|s| {
                let (start, end) = s.split_once('-').unwrap_or((s, s));
                let start: u16 = start.parse().expect("slot number");
                let end: u16 = end.parse().expect("slot number");
                start..=end
            })
            .collect();
        nodes.push(NodeInfo {
            id: fields[0].to_owned(),
            port,
            master: flags.contains(&"master"),
            failing: flags.contains(&"fail") || flags.contains(&"fail?"),
            master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
            slots,
        });
    }
    nodes
}
