//! Failover while a steady stream of checks runs against one subject, on real
//! primaries and replicas: one server behind an address that moves (a proxy, a DNS
//! name, Sentinel), and a Redis Cluster.
//!
//! Replication is asynchronous: a primary that dies takes with it the decisions its
//! replica had not received, and the promoted replica admits those units again. Each
//! admission reports its unit's number in the window (`limit - remaining`), so a
//! unit admitted twice is a decision the failover lost. The tests measure how many
//! admissions past the limit a failover cost (the stream's admissions, then the
//! subject exhausted), show that it is bounded by what the replica lacked, that
//! every check got an answer in time and none was refused for the failure, and how
//! long checks failed. docs/failures.md states what they measured.

use crate::support;
use redlimit::internals::RedisStoreInternals;
use redlimit::store::StoreErrorKind;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use redlimit::{Decision, Error, Limiter, Policy, RedisStore};
use support::cluster::RedisCluster;
use support::forward::Forwarder;
use support::{key_of, RedisServer};
use tokio::task::JoinSet;

/// The subject's limit: more than the stream reaches before the test exhausts it
/// (two tasks, at most one check per 2 ms each, for the few seconds a run takes).
const LIMIT: u32 = 10_000;
/// The subject every check is for.
const SUBJECT: &str = "steady";
/// The store's call timeout, and how late past it a stream's check may return.
const TIMEOUT: Duration = Duration::from_millis(100);
const MARGIN: Duration = Duration::from_millis(250);
/// Tasks checking the subject, one check at a time each, pausing between checks.
const TASKS: usize = 2;
const PAUSE: Duration = Duration::from_millis(2);
/// The bound of every wait for the stream to show something, or for a server.
const WITHIN: Duration = Duration::from_secs(5);
/// How soon after the address moved (or the cluster promoted the replica) checks
/// are decided again: the store's reconnection backs off 250 ms at most.
const RESUME_WITHIN: Duration = Duration::from_secs(2);
/// How long the control's `WAIT 1` waits for the replica to acknowledge an admission.
const ACK_WAIT_MS: u64 = 50;

/// What one check came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Admitted: `cost` units, the last of them the subject's `last`th in its window.
    Admitted { last: u64, cost: u64 },
    /// Denied with nothing left: the subject was at its limit.
    Denied,
    /// A store failure (timeout, unavailable): the layer's failure mode answers it.
    Failed,
}

/// One check of the stream (or of the exhaustion that ends a run).
#[derive(Debug, Clone, Copy)]
struct Call {
    started: Instant,
    ended: Instant,
    outcome: Outcome,
    /// For the control: whether a replica acknowledged the admission (`WAIT 1`).
    acked: Option<bool>,
}

impl Call {
    /// The last unit this call admitted (the only one, for the stream's checks).
    fn unit(&self) -> Option<u64> {
        match self.outcome {
            Outcome::Admitted { last, .. } => Some(last),
            _ => None,
        }
    }

    /// Every unit this call admitted.
    fn units(&self) -> std::ops::Range<u64> {
        match self.outcome {
            Outcome::Admitted { last, cost } => last + 1 - cost..last + 1,
            _ => 0..0,
        }
    }
}

/// The result of a check of `cost` units as an [`Outcome`]; a panic for a denial
/// with units left (a failure shown as a 429) or for anything but a store failure.
fn outcome(result: Result<Decision, Error>, cost: u64) -> Outcome {
    match result {
        Ok(d) if d.is_allowed() => Outcome::Admitted {
            last: u64::from(LIMIT) - d.remaining(),
            cost,
        },
        Ok(d) => {
            assert_eq!(d.remaining(), 0, "a denial with units left: {d:?}");
            Outcome::Denied
        }
        Err(Error::Store(e))
            if matches!(
                e.kind(),
                StoreErrorKind::Timeout | StoreErrorKind::Unavailable
            ) =>
        {
            Outcome::Failed
        }
        Err(e) => panic!("not a store failure: {e:?}"),
    }
}

/// A connection for the control's acknowledgements: `WAIT` blocks the connection
/// it is sent on, so each task has its own.
struct Acks {
    conn: redis::aio::MultiplexedConnection,
}

impl Acks {
    /// Whether a replica has everything the primary executed up to now: a write of
    /// this connection's own (`WAIT` counts from the sender's last write), then
    /// `WAIT 1`.
    async fn acked(&mut self) -> bool {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg("failover:ack")
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .ignore()
            .cmd("WAIT")
            .arg(1)
            .arg(ACK_WAIT_MS);
        let wait = pipe.query_async::<(u64,)>(&mut self.conn);
        let bound = Duration::from_millis(ACK_WAIT_MS) + TIMEOUT;
        matches!(tokio::time::timeout(bound, wait).await, Ok(Ok((n,))) if n >= 1)
    }
}

/// `TASKS` tasks checking one subject until stopped, every call recorded.
struct Stream {
    calls: Arc<Mutex<Vec<Call>>>,
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl Stream {
    /// Starts the stream; with `acks` (the control), each admission is then
    /// confirmed with `WAIT 1` on the primary at that URL while `acking` is set.
    async fn start(limiter: &Limiter<RedisStore>, acks: Option<(String, Arc<AtomicBool>)>) -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for _ in 0..TASKS {
            let mut acks = match &acks {
                Some((url, acking)) => {
                    let client = redis::Client::open(url.as_str()).expect("bad url");
                    let conn =
                        tokio::time::timeout(WITHIN, client.get_multiplexed_async_connection())
                            .await
                            .expect("a connection for the acknowledgements, in time")
                            .expect("a connection for the acknowledgements");
                    Some((Acks { conn }, Arc::clone(acking)))
                }
                None => None,
            };
            let (limiter, calls, stop) = (limiter.clone(), Arc::clone(&calls), Arc::clone(&stop));
            tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let outcome = outcome(limiter.check(SUBJECT, 1).await, 1);
                    let ended = Instant::now();
                    let acked = match (&mut acks, outcome) {
                        (Some((acks, acking)), Outcome::Admitted { .. })
                            if acking.load(Ordering::SeqCst) =>
                        {
                            Some(acks.acked().await)
                        }
                        _ => None,
                    };
                    let call = Call {
                        started,
                        ended,
                        outcome,
                        acked,
                    };
                    calls
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(call);
                    tokio::time::sleep(PAUSE).await;
                }
            });
        }
        Self { calls, stop, tasks }
    }

    /// Waits (bounded) until `n` checks that started at `since` or later were
    /// admitted; returns when the first of them ended.
    async fn admitted_since(&self, since: Instant, n: usize, what: &str) -> Instant {
        let deadline = Instant::now() + WITHIN;
        loop {
            let first = {
                let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
                let admitted: Vec<&Call> = calls
                    .iter()
                    .filter(|c| c.started >= since && c.unit().is_some())
                    .collect();
                (admitted.len() >= n).then(|| admitted.iter().map(|c| c.ended).min())
            };
            if let Some(first) = first {
                return first.expect("n > 0 admissions");
            }
            let so_far = self.summary();
            assert!(
                Instant::now() < deadline,
                "fewer than {n} checks admitted {what} within {WITHIN:?}: {so_far}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits (bounded) until the stream's last 10 checks all failed: the primary
    /// refuses. Returns when the last check admitted before them ended.
    async fn refused(&self, what: &str) -> Instant {
        let deadline = Instant::now() + REFUSED_WITHIN + Duration::from_secs(1);
        loop {
            let last_admitted = {
                let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
                let tail = calls.len().saturating_sub(10);
                let refusing =
                    calls.len() >= 10 && calls[tail..].iter().all(|c| c.outcome == Outcome::Failed);
                refusing.then(|| {
                    calls
                        .iter()
                        .filter(|c| c.unit().is_some())
                        .map(|c| c.ended)
                        .max()
                })
            };
            if let Some(last_admitted) = last_admitted {
                return last_admitted.expect("admissions before the refusal");
            }
            let so_far = self.summary();
            assert!(
                Instant::now() < deadline,
                "the primary was not refusing {what} in time: {so_far}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn summary(&self) -> String {
        let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let mut by_outcome = HashMap::new();
        for call in calls.iter() {
            let kind = match call.outcome {
                Outcome::Admitted { .. } => "admitted",
                Outcome::Denied => "denied",
                Outcome::Failed => "failed",
            };
            *by_outcome.entry(kind).or_insert(0) += 1;
        }
        format!("{by_outcome:?}")
    }

    /// Stops the stream; every call it made.
    async fn stop(mut self) -> Vec<Call> {
        self.stop.store(true, Ordering::SeqCst);
        while let Some(result) = self.tasks.join_next().await {
            result.expect("a stream task panicked");
        }
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Takes what the store has left of the subject in one check, then checks once
/// more to see it denied: the units the store still admits after the stream, up to
/// the limit as it now counts it. A store failure asks again, within a bound.
async fn exhaust(limiter: &Limiter<RedisStore>) -> Vec<Call> {
    let deadline = Instant::now() + WITHIN;
    let mut all = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "the subject was not exhausted within {WITHIN:?}: {all:?}"
        );
        let left = match limiter.peek(SUBJECT, 1).await {
            Ok(d) if d.is_allowed() => d.remaining() + 1,
            Ok(_) => 0,
            Err(Error::Store(e)) => {
                eprintln!("exhaust: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => panic!("not a store failure: {e:?}"),
        };
        let cost = left.max(1);
        let started = Instant::now();
        let checked = limiter
            .check(SUBJECT, u32::try_from(cost).expect("at most the limit"))
            .await;
        let call = Call {
            started,
            ended: Instant::now(),
            outcome: outcome(checked, cost),
            acked: None,
        };
        all.push(call);
        if call.outcome == Outcome::Denied {
            return all;
        }
    }
}

/// What a run's calls add up to.
#[derive(Debug)]
struct Tally {
    /// Every check answered, stream and exhaustion.
    admitted: usize,
    /// Admissions past the limit: `admitted - LIMIT` (negative when calls whose
    /// fate is unknown ran without their admission being seen).
    past_limit: i64,
    /// Units admitted twice: decisions the failover lost, given again.
    twice: usize,
    /// Checks that ended with a store failure.
    failed: usize,
    /// When the first and the last failed check ended.
    failing: Option<(Instant, Instant)>,
    /// The stream's slowest check.
    slowest: Duration,
    /// The stream's denials (it never reaches the limit: each would be a 429 for
    /// a failure).
    stream_denials: usize,
}

impl Tally {
    fn of(stream: &[Call], exhaustion: &[Call]) -> Self {
        let all = || stream.iter().chain(exhaustion);
        let admitted = all().map(|c| c.units().count()).sum();
        let mut units: HashMap<u64, usize> = HashMap::new();
        for unit in all().flat_map(Call::units) {
            *units.entry(unit).or_insert(0) += 1;
        }
        let failures: Vec<Instant> = all()
            .filter(|c| c.outcome == Outcome::Failed)
            .map(|c| c.ended)
            .collect();
        Self {
            admitted,
            past_limit: admitted as i64 - i64::from(LIMIT),
            twice: units.values().filter(|&&n| n > 1).count(),
            failed: failures.len(),
            failing: failures
                .iter()
                .min()
                .zip(failures.iter().max())
                .map(|(a, b)| (*a, *b)),
            slowest: stream
                .iter()
                .map(|c| c.ended - c.started)
                .max()
                .unwrap_or_default(),
            stream_denials: stream
                .iter()
                .filter(|c| c.outcome == Outcome::Denied)
                .count(),
        }
    }

    /// How long checks kept failing, first failure to last.
    fn failing_for(&self) -> Duration {
        self.failing.map_or(Duration::ZERO, |(a, b)| b - a)
    }

    /// The promises every run keeps: every check answered in time, none refused for
    /// the failure, and the limit held to within what the failover lost.
    fn assert_answered(&self) {
        assert!(
            self.slowest <= TIMEOUT + MARGIN,
            "a check took {:?}, over {:?}: {self:?}",
            self.slowest,
            TIMEOUT + MARGIN
        );
        assert_eq!(
            self.stream_denials, 0,
            "a check refused for the failover: {self:?}"
        );
        // Every admission past the limit is a unit admitted twice; the units the
        // store ran without their caller seeing the admission are among the failures.
        assert!(
            self.past_limit <= self.twice as i64,
            "more admissions past the limit than units admitted twice: {self:?}"
        );
        assert!(
            self.twice as i64 - self.past_limit <= self.failed as i64,
            "units the store counted but nobody saw admitted, beyond the failures: {self:?}"
        );
    }
}

/// A first decision, asked again while the store connects (a loaded machine may
/// not meet the first call's timeout), within a bound.
async fn warm(limiter: &Limiter<RedisStore>) {
    let deadline = Instant::now() + WITHIN;
    loop {
        match limiter.check("warm", 1).await {
            Ok(d) => {
                assert!(d.is_allowed(), "{d:?}");
                return;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("warm: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("no decision within {WITHIN:?}: {e}"),
        }
    }
}

/// The units of the subject a server's state holds, read with a plain `GET` (a
/// replica answers it too): the unit the server admits next is one more.
async fn units_on(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    let raw: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET the subject's state");
    raw.map_or(0, |raw| {
        let stamps =
            RedisStore::sliding_log_stamps(&raw, u64::from(LIMIT)).expect("a sliding log's state");
        stamps.len() as u64
    })
}

/// The sliding log every test checks: exact, on Redis `TIME`, and a window no run
/// can outlast.
fn policy() -> Policy {
    Policy::sliding_log("fo", LIMIT, Duration::from_secs(3_600)).unwrap()
}

/// A primary and its replica, the replication stream through a forwarder the test
/// can stall (a link that lags) or straight, and the address the application knows: a
/// proxy in front of whichever is primary.
struct Pair {
    primary: RedisServer,
    replica: RedisServer,
    link: Option<Forwarder>,
    proxy: Forwarder,
}

impl Pair {
    /// A pair whose primary gets `primary_args`, its replication through a forwarder.
    fn start(primary_args: &[&str]) -> Self {
        Self::start_linked(primary_args, true)
    }

    /// A pair whose replica reads its primary straight (`linked` false): the test's
    /// own forwarder runs on the test's runtime, and on a loaded machine it holds the
    /// replication stream back by itself.
    fn start_linked(primary_args: &[&str], linked: bool) -> Self {
        let primary = RedisServer::start_primary_with(primary_args);
        let link = linked.then(|| Forwarder::start(primary.port()));
        let replica = match &link {
            Some(link) => RedisServer::start_replica_of_port(link.port()),
            None => RedisServer::start_replica_of(&primary),
        };
        primary.wait_until_streaming();
        let proxy = Forwarder::start(primary.port());
        Self {
            primary,
            replica,
            link,
            proxy,
        }
    }

    /// Stalls the replication stream (it goes through the forwarder).
    fn hold_link(&self) {
        self.link
            .as_ref()
            .expect("a pair started with its link through a forwarder")
            .hold();
    }

    /// Bytes the stalled link kept.
    fn held(&self) -> usize {
        self.link.as_ref().map_or(0, Forwarder::held)
    }
}

/// How the replica stands when its primary dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replica {
    /// Its link up: it has everything the primary wrote out.
    InSync,
    /// Its link held for the primary's last moments (a replica that lags).
    Lagging,
    /// Lagging, and each admission confirmed by `WAIT 1` before it counts.
    LaggingAcked,
    /// Lagging, its primary set to stop writes once no replica has acknowledged
    /// anything for `MAX_LAG_S` (`min-replicas-to-write 1`).
    LaggingRefused,
}

/// The control's `min-replicas-max-lag`, in seconds (Redis counts it in whole seconds).
const MAX_LAG_S: u64 = 1;
/// How soon a primary with `min-replicas-max-lag` stops writes after its replica
/// falls silent: the lag counts in whole seconds from the last acknowledgement, which
/// a replica sends once a second, and the primary looks again once a second (1.9 s
/// measured, 2.9 s beside busy loops).
const REFUSED_WITHIN: Duration = Duration::from_secs(MAX_LAG_S + 4);

/// The primary dies (SIGKILL) while checks run; the replica is promoted
/// (`REPLICAOF NO ONE`) and the proxy moved to it, as Sentinel or an operator would.
/// The replication link is held for the primary's last moments (a replica that
/// lags), so it dies with decisions its replica never received: every one of them
/// is lost and comes back as one admission past the limit, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_costs_the_admissions_its_replica_had_not_received() {
    kill_and_promote(Replica::Lagging).await;
}

/// Control: the same failover, with each admission then confirmed by `WAIT 1` on
/// the primary: the decisions lost are exactly those no replica acknowledged, so an
/// application that counted only acknowledged ones admitted nothing past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_a_replica_acknowledged_survive_the_failover() {
    kill_and_promote(Replica::LaggingAcked).await;
}

/// The same failover with the replica in sync: the primary writes a decision's
/// replication out in the same event-loop turn as its reply, so at most the checks
/// in flight at the kill (one per task) can be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_with_its_replica_in_sync_costs_at_most_the_checks_in_flight() {
    kill_and_promote(Replica::InSync).await;
}

/// `min-replicas-to-write 1` with `min-replicas-max-lag 1`: once the replica has
/// been silent past the max lag, the primary refuses every check (`NOREPLICAS`, a
/// store failure the layer's failure mode answers, never a 429). What the primary
/// decided before that, since its replica last heard from it, is still lost at the
/// failover: the setting bounds the loss by time, it does not close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_to_write_bounds_the_loss_to_the_max_lag() {
    kill_and_promote(Replica::LaggingRefused).await;
}

async fn kill_and_promote(replica: Replica) {
    let ack = replica == Replica::LaggingAcked;
    let max_lag = MAX_LAG_S.to_string();
    let refusing = [
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        &max_lag,
    ];
    let args: &[&str] = if replica == Replica::LaggingRefused {
        &refusing
    } else {
        &[]
    };
    // In sync: the replica reads its primary straight, as a replica on its own
    // machine does; the others stall it through the forwarder.
    let mut pair = Pair::start_linked(args, replica != Replica::InSync);
    let store = RedisStore::new(pair.proxy.pool()).timeout(TIMEOUT);
    let policy = policy();
    let limiter = Limiter::new(store.clone(), policy.clone());
    let key = key_of(&store, SUBJECT, &policy);
    warm(&limiter).await;
    let mut replica_conn = pair.replica.conn().await;

    let acking = Arc::new(AtomicBool::new(ack));
    let acks = ack.then(|| (pair.primary.url(), Arc::clone(&acking)));
    let stream = Stream::start(&limiter, acks).await;
    let began = Instant::now();
    stream.admitted_since(began, 20, "at first").await;

    // The link stalls: what the primary decides from now on never reaches its replica.
    let held_at = Instant::now();
    if replica != Replica::InSync {
        pair.hold_link();
    }
    stream
        .admitted_since(held_at, 10, "in the primary's last moments")
        .await;
    // With min-replicas-to-write, the primary refuses once its replica has been
    // silent past the max lag: when did it decide last?
    let decided_last = if replica == Replica::LaggingRefused {
        Some(stream.refused("once its replica fell silent").await)
    } else {
        None
    };

    // The primary dies; once the replica sees its link close (it has read all it
    // was sent), it is promoted with what it has, then the address moves to it.
    // Calls made meanwhile fail (the proxy still points at the dead one).
    acking.store(false, Ordering::SeqCst);
    let killed_at = Instant::now();
    pair.primary.stop();
    tokio::task::block_in_place(|| {
        pair.replica.wait_until_link_down();
        pair.replica.promote();
    });
    let on_replica = units_on(&mut replica_conn, &key).await;
    // Taken before the move: whatever the replica answers ends after it.
    let switched_at = Instant::now();
    pair.proxy.switch_to(pair.replica.port());
    let resumed = stream
        .admitted_since(switched_at, 20, "after the switch")
        .await;
    let calls = stream.stop().await;
    let exhaustion = exhaust(&limiter).await;
    let tally = Tally::of(&calls, &exhaustion);

    // What the primary decided that its replica lacked. The primary is dead before
    // the address moves, and the replica is reached only after: every admission seen
    // before the switch is the primary's.
    let by_primary: Vec<&Call> = calls
        .iter()
        .filter(|c| c.ended < switched_at && c.unit().is_some())
        .collect();
    let lost: Vec<&Call> = by_primary
        .iter()
        .copied()
        .filter(|c| c.unit().is_some_and(|n| n > on_replica))
        .collect();
    let held: Vec<&Call> = by_primary
        .iter()
        .copied()
        .filter(|c| c.started >= held_at)
        .collect();
    eprintln!(
        "primary killed ({replica:?}): the replica had {on_replica} units; the primary admitted {} \
         ({} in its last moments), {} of them lost; {tally:?}; checks failed for \
         {:?}, decided again {:?} after the kill ({:?} after the switch); held {} bytes",
        by_primary.len(),
        held.len(),
        lost.len(),
        tally.failing_for(),
        resumed.saturating_duration_since(killed_at),
        resumed.saturating_duration_since(switched_at),
        pair.held(),
    );
    tally.assert_answered();
    assert!(
        resumed.saturating_duration_since(switched_at) <= RESUME_WITHIN,
        "checks were decided again only {:?} after the address moved",
        resumed.saturating_duration_since(switched_at)
    );
    // What was lost is bounded by what the replica lacked: no unit past it was
    // admitted twice, and the replica's state is a prefix of the primary's.
    assert!(
        tally.twice <= lost.len(),
        "{} units admitted twice, {} decisions lost",
        tally.twice,
        lost.len()
    );
    assert!(
        lost.len() as i64 - tally.past_limit <= tally.failed as i64,
        "{} decisions lost, {} past the limit",
        lost.len(),
        tally.past_limit
    );
    match replica {
        Replica::InSync => {
            // A decision's replication leaves the primary in the same event-loop turn
            // as its reply: only the checks in flight at the kill may be lost.
            assert!(
                lost.len() <= TASKS,
                "{} decisions lost with the replica in sync",
                lost.len()
            );
        }
        Replica::Lagging | Replica::LaggingAcked | Replica::LaggingRefused => {
            // Every decision made while the link was held was lost: the fault is real.
            // (The hold cannot race a check that started after it: that check's
            // replication comes later.)
            assert!(
                held.iter()
                    .all(|c| c.unit().is_some_and(|n| n > on_replica)),
                "a decision made while the link was held reached the replica"
            );
            assert!(held.len() >= 10, "{} admissions while held", held.len());
        }
    }
    if let Some(decided_last) = decided_last {
        // The loss is bounded by time: the primary stopped deciding (and so losing)
        // within the max lag, give or take Redis's whole seconds.
        let for_how_long = decided_last.saturating_duration_since(held_at);
        eprintln!("min-replicas-to-write: the primary decided {for_how_long:?} past the stall");
        assert!(
            for_how_long <= REFUSED_WITHIN,
            "the primary went on deciding {for_how_long:?} after its replica fell silent"
        );
    }
    if ack {
        // No acknowledged admission was lost: the lost ones were unacknowledged.
        assert!(
            by_primary
                .iter()
                .filter(|c| c.acked == Some(true))
                .all(|c| c.unit().is_some_and(|n| n <= on_replica)),
            "an admission a replica acknowledged was lost"
        );
        let unacked = by_primary.iter().filter(|c| c.acked != Some(true)).count();
        let counted = tally.admitted - unacked;
        assert!(
            counted <= LIMIT as usize,
            "counting acknowledged admissions only, {counted} admitted, limit {LIMIT}"
        );
    } else if replica != Replica::InSync {
        assert!(
            tally.past_limit >= 1,
            "the failover cost nothing: {tally:?}"
        );
    }
    pair.replica.assert_every_key_expires().await;
}

/// `FAILOVER` (Redis 6.2+) demotes the primary gracefully while checks run: it stops
/// writes, waits until its replica has everything, and hands over. The proxy then
/// moves and closes the sessions to the old primary (HAProxy's `on-marked-down
/// shutdown-sessions`; Sentinel kills the demoted node's clients the same way), so
/// the store reconnects to the new one. Nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_loses_nothing() {
    failover_command(true).await;
}

/// The same failover, with the store's session to the old primary left open (a
/// proxy that keeps established sessions, a DNS name resolved once): the demoted
/// primary stays connected and answers every call `READONLY`. The store must take
/// that as a connection to replace, and its new one reaches the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_to_a_demoted_primary_is_replaced() {
    failover_command(false).await;
}

async fn failover_command(cut: bool) {
    let pair = Pair::start(&[]);
    let store = RedisStore::new(pair.proxy.pool()).timeout(TIMEOUT);
    let policy = policy();
    let limiter = Limiter::new(store.clone(), policy.clone());
    let key = key_of(&store, SUBJECT, &policy);
    warm(&limiter).await;
    let mut replica_conn = pair.replica.conn().await;

    let stream = Stream::start(&limiter, None).await;
    let began = Instant::now();
    stream
        .admitted_since(began, 20, "before the failover")
        .await;

    let asked_at = Instant::now();
    let () = redis::cmd("FAILOVER")
        .arg("TIMEOUT")
        .arg(WITHIN.as_millis() as u64)
        .query_async(&mut pair.primary.conn().await)
        .await
        .expect("FAILOVER");
    let demoted_at = tokio::task::block_in_place(|| {
        pair.replica.wait_for_role("master", WITHIN);
        pair.primary.wait_for_role("slave", WITHIN)
    });
    let on_replica = units_on(&mut replica_conn, &key).await;
    let switched_at = Instant::now();
    pair.proxy.switch_to(pair.replica.port());
    if cut {
        pair.proxy.cut();
    }
    let deadline = switched_at + RESUME_WITHIN;
    let resumed = loop {
        let admitted = stream
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|c| c.started >= switched_at && c.unit().is_some())
            .map(|c| c.ended)
            .min();
        if let Some(resumed) = admitted {
            break resumed;
        }
        assert!(
            Instant::now() < deadline,
            "no check decided {RESUME_WITHIN:?} after the address moved ({}): the store \
             kept its connection to the demoted primary, which answers READONLY",
            stream.summary()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    stream
        .admitted_since(switched_at, 20, "after the switch")
        .await;
    let calls = stream.stop().await;
    let exhaustion = exhaust(&limiter).await;
    let tally = Tally::of(&calls, &exhaustion);

    let lost = calls
        .iter()
        .filter(|c| c.ended < switched_at && c.unit().is_some_and(|n| n > on_replica))
        .count();
    eprintln!(
        "FAILOVER (sessions {}): demoted {:?} after it was asked; the replica had \
         {on_replica} units, {lost} decisions lost; {tally:?}; checks failed for {:?}, \
         decided again {:?} after the switch",
        if cut { "cut" } else { "kept" },
        demoted_at - asked_at,
        tally.failing_for(),
        resumed.saturating_duration_since(switched_at),
    );
    tally.assert_answered();
    assert_eq!(lost, 0, "a graceful failover lost decisions");
    assert_eq!(tally.twice, 0, "a unit admitted twice: {tally:?}");
    assert!(tally.past_limit <= 0, "{tally:?}");
    pair.replica.assert_every_key_expires().await;
}

/// A subject on a given master, and that master's replica, on a cluster.
struct Shard {
    master: u16,
    replica: u16,
}

/// The master that holds `key`'s slot, and its replica.
async fn shard_of(cluster: &RedisCluster, key: &str) -> Shard {
    let slot = cluster.slot(key).await;
    let topology = cluster.topology().await;
    let master = topology
        .iter()
        .find(|n| n.master && n.serves(slot))
        .unwrap_or_else(|| panic!("no master serves slot {slot}: {topology:?}"));
    let replica = topology
        .iter()
        .find(|n| n.master_id.as_deref() == Some(master.id.as_str()))
        .unwrap_or_else(|| panic!("master {} has no replica: {topology:?}", master.port));
    Shard {
        master: master.port,
        replica: replica.port,
    }
}

/// `CLUSTER FAILOVER` on the replica of the subject's master while checks run: the
/// master stops writes until its replica has everything, the replica takes over,
/// and the old master answers `MOVED` to it. Nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_cluster_failover_loses_nothing() {
    cluster_failover(false).await;
}

/// `CLUSTER FAILOVER FORCE`: the replica takes over without waiting for its master,
/// which goes on deciding until the new master's first cluster-bus message reaches
/// it. What it decided meanwhile is lost: each such unit is admitted twice, and every
/// one was decided by a check that started before the old master was seen demoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_cluster_failover_loses_only_the_old_masters_last_decisions() {
    cluster_failover(true).await;
}

async fn cluster_failover(force: bool) {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster_from_urls(cluster.urls())
        .unwrap()
        .timeout(TIMEOUT);
    let policy = policy();
    let limiter = Limiter::new(store.clone(), policy.clone());
    let key = key_of(&store, SUBJECT, &policy);
    let shard = shard_of(&cluster, &key).await;
    warm(&limiter).await;
    // The first check loads the library on every master, in the background; it
    // reaches the replicas by replication.
    support::wait_for_function_library(&mut cluster.node(shard.master).conn().await).await;

    let stream = Stream::start(&limiter, None).await;
    let began = Instant::now();
    stream
        .admitted_since(began, 20, "before the failover")
        .await;

    let asked_at = Instant::now();
    let mut failover = redis::cmd("CLUSTER");
    failover.arg("FAILOVER");
    if force {
        failover.arg("FORCE");
    }
    let () = failover
        .query_async(&mut cluster.node(shard.replica).conn().await)
        .await
        .expect("CLUSTER FAILOVER");
    let demoted_at =
        tokio::task::block_in_place(|| cluster.node(shard.master).wait_for_role("slave", WITHIN));
    let promoted_at = cluster.wait_for_promotion(shard.replica).await;
    let resumed = stream
        .admitted_since(promoted_at, 20, "after the promotion")
        .await;
    let calls = stream.stop().await;
    let exhaustion = exhaust(&limiter).await;
    let tally = Tally::of(&calls, &exhaustion);

    // The checks that admitted each unit.
    let mut by_unit: HashMap<u64, Vec<&Call>> = HashMap::new();
    for call in calls.iter().chain(&exhaustion) {
        for unit in call.units() {
            by_unit.entry(unit).or_default().push(call);
        }
    }
    // The old master's lost decisions: the first admission of each unit admitted twice.
    let lost: Vec<Instant> = by_unit
        .values()
        .filter(|calls| calls.len() > 1)
        .filter_map(|calls| calls.iter().map(|c| c.ended).min())
        .collect();
    let lost_over = lost
        .iter()
        .max()
        .zip(lost.iter().min())
        .map_or(Duration::ZERO, |(last, first)| *last - *first);
    eprintln!(
        "CLUSTER FAILOVER{}: old master demoted {:?} after it was asked, replica promoted \
         {:?} after; {} decisions lost, made over {lost_over:?}; {tally:?}; checks failed \
         for {:?}, decided again {:?} after the promotion was seen",
        if force { " FORCE" } else { "" },
        demoted_at - asked_at,
        promoted_at - asked_at,
        lost.len(),
        tally.failing_for(),
        resumed.saturating_duration_since(promoted_at),
    );
    tally.assert_answered();
    assert!(
        resumed.saturating_duration_since(promoted_at) <= RESUME_WITHIN,
        "checks were decided again only {:?} after the promotion",
        resumed.saturating_duration_since(promoted_at)
    );
    if force {
        // Only the old master's last decisions, made before it learned of the
        // takeover, can be lost.
        let late: Vec<_> = by_unit
            .values()
            .filter(|calls| calls.len() > 1 && calls.iter().all(|c| c.started >= demoted_at))
            .collect();
        assert!(
            late.is_empty(),
            "units admitted twice, none of them by a check that started before the old \
             master was demoted: {late:?}"
        );
    } else {
        assert_eq!(
            tally.twice, 0,
            "a graceful failover lost decisions: {tally:?}"
        );
        assert!(tally.past_limit <= 0, "{tally:?}");
    }
    cluster.node(shard.replica).assert_every_key_expires().await;
}

/// Until the address moves, every new connection meets the demoted primary again:
/// the store replaces the connection that answers `READONLY` at the backoff's pace
/// (25 ms doubling to 250 ms), not once a call, and answers each check as a store
/// failure, never a denial. The control: once the address leads to the promoted
/// replica, checks are decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_at_the_address_is_retried_at_the_backoff_s_pace() {
    let pair = Pair::start(&[]);
    let store = RedisStore::new(pair.proxy.pool()).timeout(TIMEOUT);
    let limiter = Limiter::new(store.clone(), policy());
    warm(&limiter).await;
    let () = redis::cmd("FAILOVER")
        .arg("TIMEOUT")
        .arg(WITHIN.as_millis() as u64)
        .query_async(&mut pair.primary.conn().await)
        .await
        .expect("FAILOVER");
    tokio::task::block_in_place(|| {
        pair.replica.wait_for_role("master", WITHIN);
        pair.primary.wait_for_role("slave", WITHIN)
    });

    let accepted = pair.proxy.accepted();
    let (started, mut checks) = (Instant::now(), 0);
    while started.elapsed() < Duration::from_secs(1) {
        match limiter.check(SUBJECT, 1).await {
            Err(Error::Store(_)) => {}
            other => panic!("a demoted primary decided: {other:?}"),
        }
        checks += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let connections = pair.proxy.accepted() - accepted;
    eprintln!("{checks} checks in 1 s against a demoted primary: {connections} new connections");
    assert!(checks > 100, "only {checks} checks");
    // 25, 50, 100, 250, 250, 250 ms...: at most 8 in a second, with room for a
    // loaded machine's late timers, far from one a check.
    assert!(
        connections <= 10,
        "{connections} connections for {checks} checks"
    );

    pair.proxy.switch_to(pair.replica.port());
    let deadline = Instant::now() + RESUME_WITHIN;
    while limiter.check(SUBJECT, 1).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "not decided on the promoted replica"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
