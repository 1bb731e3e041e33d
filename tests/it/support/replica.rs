//! A primary and its replica: real `redis-server` processes replicating on loopback,
//! for the failover tests.

use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::cluster::info_field;
use super::RedisServer;

/// How long a replica may take to finish its first sync.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

impl RedisServer {
    /// Starts a server meant to have replicas: a replica's first sync starts at once,
    /// not after the default 5 s wait for more replicas to share the transfer.
    pub fn start_primary() -> Self {
        Self::start_primary_with(&[])
    }

    /// [`RedisServer::start_primary`] with extra arguments
    /// (`["--min-replicas-to-write", "1"]`).
    pub fn start_primary_with(extra_args: &[&str]) -> Self {
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend_from_slice(extra_args);
        Self::start_with(&args)
    }

    /// Starts a replica of `primary` and waits (bounded) until it is in sync.
    pub fn start_replica_of(primary: &RedisServer) -> Self {
        Self::start_replica_of_port(primary.port())
    }

    /// Starts a replica of whatever listens on `127.0.0.1:<port>` (a primary, or a
    /// forwarder in front of one) and waits (bounded) until it is in sync.
    pub fn start_replica_of_port(port: u16) -> Self {
        let port = port.to_string();
        let replica = Self::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--repl-diskless-sync-delay",
            "0",
        ]);
        replica.wait_until_in_sync();
        replica
    }

    /// `INFO replication`.
    pub fn replication(&self) -> Result<String, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .map_err(|e| e.to_string())
    }

    /// This server's role: `master` or `slave`.
    pub fn role(&self) -> String {
        let info = self
            .replication()
            .unwrap_or_else(|e| panic!("INFO replication on {}: {e}", self.port()));
        info_field(&info, "role").unwrap_or_default().to_owned()
    }

    /// Waits (bounded) until this replica's link to its primary is up.
    pub fn wait_until_in_sync(&self) {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            let info = self.replication().unwrap_or_default();
            if info_field(&info, "role") == Some("slave")
                && info_field(&info, "master_link_status") == Some("up")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica on port {} was not in sync within {SYNC_TIMEOUT:?}:\n{info}\n{}",
                self.port(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (bounded) until this primary streams its writes to a replica. A replica
    /// reports its link up once it has loaded the primary's snapshot, but the
    /// primary holds the stream back until it has reaped the snapshot's child and
    /// heard the replica's next acknowledgement (up to a second later): what it
    /// decides meanwhile waits in its own buffer, and dies with it.
    pub fn wait_until_streaming(&self) {
        let client = redis::Client::open(self.url()).expect("bad url");
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.port()));
        let marker = "redlimit-test:streaming";
        // A primary with `min-replicas-to-write` refuses the write (NOREPLICAS)
        // until then: try again.
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            let set: redis::RedisResult<()> = redis::cmd("SET")
                .arg(marker)
                .arg(1)
                .arg("PX")
                .arg(60_000)
                .query(&mut conn);
            match set {
                Ok(()) => break,
                Err(e) if e.code() == Some("NOREPLICAS") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("SET on {}: {e}\n{}", self.port(), self.log_tail()),
            }
        }
        let timeout_ms = u64::try_from(SYNC_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        let acked: u64 = redis::cmd("WAIT")
            .arg(1)
            .arg(timeout_ms)
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("WAIT on {}: {e}", self.port()));
        assert_eq!(
            acked,
            1,
            "no replica of port {} acknowledged a write within {SYNC_TIMEOUT:?}:\n{}",
            self.port(),
            self.log_tail()
        );
        let _: u64 = redis::cmd("DEL")
            .arg(marker)
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("DEL on {}: {e}", self.port()));
    }

    /// Waits (bounded) until this replica has lost its link to its primary: it
    /// has read everything the primary sent before the link closed.
    pub fn wait_until_link_down(&self) {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            let info = self.replication().unwrap_or_default();
            if info_field(&info, "master_link_status") == Some("down") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica on port {} still had its link up after {SYNC_TIMEOUT:?}:\n{info}",
                self.port(),
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits (bounded by `within`) until this server reports `role`; returns when it
    /// was seen.
    pub fn wait_for_role(&self, role: &str, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            let info = self.replication().unwrap_or_default();
            if info_field(&info, "role") == Some(role) {
                return Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "the server on port {} was not a {role} within {within:?}:\n{info}\n{}",
                self.port(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `REPLICAOF NO ONE`: this replica becomes a primary, with what it has.
    pub fn promote(&self) {
        let client = redis::Client::open(self.url()).expect("bad url");
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.port()));
        let () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("REPLICAOF NO ONE on {}: {e}", self.port()));
    }
}
