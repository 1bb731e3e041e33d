//! A Redis outage under load, on one server: while it is down every call is answered
//! in time with a store error (never a denial, never a hang); once it is back, limits
//! hold again within a second, through one new connection (no reconnect storm).

use crate::support;
use redlimit::store::StoreErrorKind;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use redlimit::{Decision, Error, Limiter, Policy, RedisStore};
use support::cluster::info_field;
use support::outage::ConnectionCounter;
use support::RedisServer;
use tokio::task::JoinSet;

/// The store's default call timeout, and how late past it a call may return.
const TIMEOUT: Duration = Duration::from_millis(50);
const MARGIN: Duration = Duration::from_millis(100);
/// Concurrent tasks calling the store.
const TASKS: usize = 16;

/// What the calls of one phase saw.
#[derive(Debug, Default, Clone)]
struct Seen {
    allowed: usize,
    timeouts: usize,
    unavailable: usize,
    max_latency: Duration,
}

impl Seen {
    fn calls(&self) -> usize {
        self.allowed + self.timeouts + self.unavailable
    }

    fn errors(&self) -> usize {
        self.timeouts + self.unavailable
    }
}

/// Phases of the run, as the load tasks see them.
const HEALTHY: usize = 0;
const DOWN: usize = 1;
const BACK: usize = 2;

/// Shared between the test and its load tasks.
struct Load {
    phase: Mutex<usize>,
    seen: Mutex<[Seen; 3]>,
    stop: AtomicBool,
}

impl Load {
    fn record(&self, phase: usize, result: Result<Decision, Error>, latency: Duration) {
        let mut seen = self.seen.lock().unwrap();
        let seen = &mut seen[phase];
        seen.max_latency = seen.max_latency.max(latency);
        match result {
            Ok(d) => {
                // The load's limit is never reached: a denial would be a store failure
                // shown as a 429.
                assert!(d.is_allowed(), "a denial during an outage: {d:?}");
                seen.allowed += 1;
            }
            Err(Error::Store(e)) if e.kind() == StoreErrorKind::Timeout => seen.timeouts += 1,
            Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable => {
                seen.unavailable += 1
            }
            Err(e) => panic!("not a store error: {e:?}"),
        }
    }
}

/// `total_connections_received` of the server since it started.
async fn connections_received(server: &RedisServer) -> u64 {
    let mut conn = server.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info_field(&info, "total_connections_received")
        .and_then(|n| n.parse().ok())
        .expect("INFO stats has total_connections_received")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_under_load_every_call_is_answered_and_limits_return_within_a_second() {
    const LIMIT: u32 = 5;
    let mut server = RedisServer::start();
    let store = server.store().timeout(TIMEOUT);
    let load_limiter = Limiter::new(
        store.clone(),
        Policy::fixed_window("load", 1_000_000, Duration::from_secs(3_600)).unwrap(),
    );
    // Exact, on Redis TIME, and a window no run can outlast.
    let limiter = Limiter::new(
        store,
        Policy::sliding_log("probe", LIMIT, Duration::from_secs(3_600)).unwrap(),
    );
    // The first call waits for the connection within its timeout, which a loaded
    // machine may not meet: ask again, within a bound.
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = load_limiter.check("warm", 1).await {
        assert!(Instant::now() < deadline, "no connection within 5 s: {e}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let load = Arc::new(Load {
        phase: Mutex::new(HEALTHY),
        seen: Mutex::new(Default::default()),
        stop: AtomicBool::new(false),
    });
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (limiter, load) = (load_limiter.clone(), Arc::clone(&load));
        tasks.spawn(async move {
            let mut i = 0;
            while !load.stop.load(Ordering::Relaxed) {
                let phase = *load.phase.lock().unwrap();
                let subject = format!("load:{t}:{}", i % 10);
                let started = Instant::now();
                let result = limiter.check(subject.as_str(), 1).await;
                load.record(phase, result, started.elapsed());
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }
    let enter = |phase| *load.phase.lock().unwrap() = phase;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Down: SIGKILL, no goodbye to clients, with calls in flight. Something on the
    // port accepts and drops every connection (a proxy with no server behind it): it
    // counts how often the store tries again.
    enter(DOWN);
    server.stop();
    let counter = ConnectionCounter::listen([server.port()]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts = counter.count();
    drop(counter);

    // Back, on the same port, with no data. Calls made while it starts count as
    // outage calls; the phase turns once it answers PING.
    tokio::task::block_in_place(|| server.restart());
    let restarted = Instant::now();
    enter(BACK);

    // Probe with fresh subjects until one is decided exactly: LIMIT admitted, then
    // denied, every call answered.
    let mut probes = 0;
    let enforced = 'probe: loop {
        assert!(
            restarted.elapsed() < Duration::from_secs(1),
            "limits were not enforced 1 s after the restart ({probes} probes)\n{}",
            server.log_tail()
        );
        probes += 1;
        let subject = format!("probe:{probes}");
        let mut admitted = 0;
        for _ in 0..LIMIT + 2 {
            let started = Instant::now();
            let result = limiter.check(subject.as_str(), 1).await;
            assert!(
                started.elapsed() <= TIMEOUT + MARGIN,
                "a probe took {:?}",
                started.elapsed()
            );
            match result {
                Ok(d) => admitted += u32::from(d.is_allowed()),
                Err(Error::Store(_)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue 'probe;
                }
                Err(e) => panic!("not a store error: {e:?}"),
            }
        }
        assert_eq!(admitted, LIMIT, "{subject} after the restart");
        break restarted.elapsed();
    };

    // The load runs on through a recovery period, then stops.
    tokio::time::sleep(Duration::from_millis(1_000).saturating_sub(restarted.elapsed())).await;
    load.stop.store(true, Ordering::Relaxed);
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    let recovery = restarted.elapsed();
    // The harness's PING when the server started, and this INFO, are two of them.
    let connections = connections_received(&server).await;

    let seen = load.seen.lock().unwrap().clone();
    eprintln!(
        "outage: {TASKS} tasks; healthy {:?}\n  down {:?}\n  back {:?}\n  limits enforced \
         {enforced:?} after the restart ({probes} probes); {attempts} connection attempts \
         in the 500 ms down, {connections} connections received in {recovery:?} after it",
        seen[HEALTHY], seen[DOWN], seen[BACK]
    );
    for (phase, seen) in ["healthy", "down", "back"].iter().zip(&seen) {
        assert!(
            seen.max_latency <= TIMEOUT + MARGIN,
            "{phase}: a call took {:?}, over {:?}",
            seen.max_latency,
            TIMEOUT + MARGIN
        );
    }
    assert!(seen[HEALTHY].allowed > 0, "{:?}", seen[HEALTHY]);
    assert!(
        seen[DOWN].errors() > 0 && seen[DOWN].errors() >= seen[DOWN].calls() * 9 / 10,
        "while the server was down: {:?}",
        seen[DOWN]
    );
    assert!(seen[BACK].allowed > 0, "{:?}", seen[BACK]);
    // Attempts back off from 25 ms to 250 ms: about six in 500 ms, however many
    // calls fail meanwhile.
    assert!(
        attempts <= 10,
        "{attempts} connection attempts in 500 ms down: a reconnect storm"
    );
    // One for the store (the attempt that found the server back), at most one more
    // for an attempt racing the restart, and the harness's two.
    assert!(
        connections <= 4,
        "{connections} connections in {recovery:?} after the restart: a reconnect storm\n{}",
        server.log_tail()
    );
    server.assert_every_key_expires().await;
}

/// A healthy Redis behind a deep pipeline (what a flood of connections makes of the
/// store's one connection): 2,000 checks of seventeen policies each sent at once take
/// many timeouts to be answered in all, but Redis answers all the while, in order, so
/// every check is decided and none is counted as failed, also on a machine so busy
/// that the app reads its replies late (beside two busy loops per core). On the
/// store's own socket (`RedisStore::from_url`), whose call reads what arrived, writes
/// what waited and looks into the socket before it judges Redis silent; a pool's
/// connection is read by a task of redis's, which such a machine runs too late (the
/// `RedisStore::new` docs say so). The control: the same store on the same server,
/// paused (SIGSTOP), times out within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_pipeline_on_a_healthy_redis_is_decided_not_timed_out() {
    const CALLS: usize = 2_000;
    let server = RedisServer::start();
    let kind = "from_url";
    let store = RedisStore::from_url(&server.url())
        .unwrap()
        .timeout(TIMEOUT);
    let window = Duration::from_secs(3_600);
    let mut limiter =
        Limiter::builder(store.clone()).policy(Policy::sliding_log("a", 100, window).unwrap());
    for i in 0..4 {
        limiter = limiter
            .policy(Policy::sliding_log(format!("log{i}"), 100, window).unwrap())
            .policy(Policy::sliding_window(format!("sw{i}"), 100, window).unwrap())
            .policy(Policy::fixed_window(format!("fw{i}"), 100, window).unwrap())
            .policy(
                Policy::token_bucket(format!("tb{i}"), 100, 1, Duration::from_secs(1)).unwrap(),
            );
    }
    let limiter = Arc::new(limiter.build().unwrap());
    store.connect().await.unwrap();
    let (failed_before, sent_before) = (store.calls_failed(), store.calls_sent());

    // The checks start on the runtime's workers, as a server's requests do.
    let started = Instant::now();
    let subjects = (0..CALLS).map(|i| format!("{kind}:{i}"));
    let (allowed, errors) = support::check_at_once(&limiter, subjects).await;
    let took = started.elapsed();
    eprintln!(
        "{kind}: {CALLS} checks at once: answered in {took:?}; {allowed} allowed, {} failed",
        errors.len()
    );
    // Without a pipeline deeper than the timeout, this test would show nothing.
    assert!(
        took >= 3 * TIMEOUT,
        "{kind}: the pipeline drained in {took:?}"
    );
    assert!(
        errors.is_empty(),
        "{kind}: {} of {CALLS} checks failed on a healthy Redis, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(allowed, CALLS);
    assert_eq!(store.calls_failed(), failed_before);
    // A batch makes at most 64 policy decisions: 3 checks of 17 policies, so that a
    // reply never waits for many of Redis's time slices on a contended CPU.
    let calls = store.calls_sent() - sent_before;
    assert!(
        calls >= (CALLS / 3) as u64,
        "{calls} calls for {CALLS} checks"
    );

    // Control: a Redis that answers nobody still times out, within the bound.
    let timed_out = store.calls_timed_out();
    let paused = server.pause();
    let asked = Instant::now();
    let result = limiter.check(format!("{kind}:paused"), 1).await;
    let waited = asked.elapsed();
    drop(paused);
    match result {
        Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
        other => panic!("{kind}: a paused Redis decided: {other:?}"),
    }
    assert!(
        waited >= TIMEOUT && waited <= TIMEOUT + MARGIN,
        "{kind}: timed out after {waited:?}"
    );
    assert_eq!(store.calls_timed_out(), timed_out + 1);
    assert_eq!(store.calls_failed(), failed_before + 1);
}
