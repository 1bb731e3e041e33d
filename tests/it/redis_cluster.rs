//! The Redis store on a real local Redis Cluster (three masters, three replicas):
//! limits hold in every slot, keys spread over every master and all expire, one
//! FCALL per call, and after a master dies its replica takes over while every call
//! is still answered in time.

use crate::support;
use redlimit::internals::{LimiterInternals, RedisStoreInternals};
use redlimit::store::StoreErrorKind;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, RedisResult};
use redlimit::clock::FakeClock;
use redlimit::{Decision, Error, Limiter, Policy, RedisStore};
use support::cluster::{NodeInfo, RedisCluster};
use support::outage::ConnectionCounter;
use support::{hash_tag, key_of};
use tokio::task::JoinSet;

/// The call timeout of the failover test, and how late past it a call may return.
const TIMEOUT: Duration = Duration::from_millis(100);
const MARGIN: Duration = Duration::from_millis(150);

/// Subjects for the limit test: enough that every master gets many.
const SUBJECTS: usize = 90;

/// Sums `cmdstat_<command>` calls over `nodes` (`INFO commandstats`).
async fn command_calls(cluster: &RedisCluster, nodes: &[NodeInfo], command: &str) -> u64 {
    let mut total = 0;
    for node in nodes {
        let mut conn = cluster.node(node.port).conn().await;
        total += support::command_calls(&mut conn)
            .await
            .get(command)
            .copied()
            .unwrap_or(0);
    }
    total
}

/// Calls `limiter` `calls` times at once for `subject`; returns how many it admitted.
async fn burst(limiter: &Limiter<RedisStore>, subject: String, calls: usize) -> usize {
    let mut tasks = JoinSet::new();
    for _ in 0..calls {
        let limiter = limiter.clone();
        let subject = subject.clone();
        tasks.spawn(async move { limiter.check(subject.as_str(), 1).await });
    }
    let mut admitted = 0;
    while let Some(result) = tasks.join_next().await {
        match result.unwrap() {
            Ok(d) if d.is_allowed() => admitted += 1,
            Ok(_) => {}
            Err(e) => panic!("a call on the cluster failed: {e}"),
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_in_every_slot_and_keys_spread_over_every_master_with_ttls() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), 3, "{masters:?}");
    let store = RedisStore::cluster(cluster.pool())
        .timeout(Duration::from_secs(5))
        .client_clock(FakeClock::new(1_000_000));
    let minute = Duration::from_secs(60);
    // (limiter, its tightest limit, calls per subject)
    let limiters = [
        (
            Limiter::new(
                store.clone(),
                Policy::fixed_window("fw", 5, minute).unwrap(),
            ),
            5,
            9,
        ),
        (
            Limiter::new(store.clone(), Policy::sliding_log("sl", 7, minute).unwrap()),
            7,
            10,
        ),
        // Two keys in one script: they share the subject's slot, so no CROSSSLOT.
        (
            Limiter::builder(store.clone())
                .policy(Policy::fixed_window("both-fw", 10, minute).unwrap())
                .policy(Policy::sliding_log("both-sl", 4, minute).unwrap())
                .build()
                .unwrap(),
            4,
            8,
        ),
    ];

    // Warm up: the function library is loaded (on every master at once), then forget
    // the warm-up's keys and stats (FLUSHALL keeps functions).
    for (limiter, _, _) in &limiters {
        for i in 0..30 {
            limiter
                .check(format!("warm:{i}").as_str(), 1)
                .await
                .unwrap();
        }
    }
    for master in &masters {
        let mut conn = cluster.node(master.port).conn().await;
        // The library is loaded in the background: on every master before the reset.
        support::wait_for_function_library(&mut conn).await;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(command_calls(&cluster, &masters, "fcall").await, 0);

    let started = Instant::now();
    let mut calls = 0;
    let mut bursts = JoinSet::new();
    for (limiter, limit, n) in &limiters {
        for i in 0..SUBJECTS {
            let limiter = limiter.clone();
            let (limit, n) = (*limit, *n);
            calls += n;
            bursts.spawn(async move {
                let admitted = burst(&limiter, format!("user:{i}"), n).await;
                (limiter.policies()[0].name().to_owned(), i, limit, admitted)
            });
        }
    }
    while let Some(result) = bursts.join_next().await {
        let (policy, subject, limit, admitted) = result.unwrap();
        assert_eq!(
            admitted, limit,
            "{policy}: subject user:{subject} admitted {admitted}, limit {limit}"
        );
    }
    eprintln!(
        "{calls} calls over {} subjects in {:?}",
        3 * SUBJECTS,
        started.elapsed()
    );

    // One FCALL per call, each to its slot's master, and nothing else.
    let fcall = command_calls(&cluster, &masters, "fcall").await;
    let loads = command_calls(&cluster, &masters, "function|load").await;
    assert_eq!(fcall, calls as u64, "FCALL calls on the masters");
    assert_eq!(
        loads, 0,
        "FUNCTION LOAD calls on the masters, with the library loaded"
    );

    // Every master holds keys, each subject's keys on one master only, and every
    // key expires.
    let mut tag_owner: HashMap<Vec<u8>, u16> = HashMap::new();
    let mut total = 0;
    for master in &masters {
        let node = cluster.node(master.port);
        let keys = node.keys().await;
        let mut conn = node.conn().await;
        let dbsize: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        assert_eq!(dbsize, keys.len());
        assert!(
            dbsize >= 3 * SUBJECTS / 10,
            "master {} holds only {dbsize} keys of {}",
            master.port,
            3 * SUBJECTS
        );
        total += dbsize;
        for key in &keys {
            let tag = hash_tag(key).to_vec();
            if let Some(other) = tag_owner.insert(tag.clone(), master.port) {
                assert_eq!(
                    other,
                    master.port,
                    "subject {} has keys on two masters",
                    String::from_utf8_lossy(&tag)
                );
            }
        }
        node.assert_every_key_expires().await;
    }
    // Three keys per subject: fw, sl, and both-fw + both-sl's joint key.
    assert_eq!(total, 3 * SUBJECTS, "keys on the masters");
    assert_eq!(tag_owner.len(), SUBJECTS, "subjects with keys");
}

/// A decision for `subject` while the store connects: the first calls wait for the
/// connection to the cluster within their timeout, which a loaded machine may not
/// meet, so this asks again, within a bound.
async fn first_decision(limiter: &Limiter<RedisStore>, subject: &str) -> Decision {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.check(subject, 1).await {
            Ok(d) => return d,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{subject}: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{subject}: no decision within 5 s: {e}"),
        }
    }
}

/// Subjects (`<prefix>:<i>`) whose state `policy` keeps on `master`.
async fn subjects_on(
    cluster: &RedisCluster,
    store: &RedisStore,
    policy: &Policy,
    master: &NodeInfo,
    prefix: &str,
    count: usize,
) -> Vec<String> {
    let mut subjects = Vec::new();
    for i in 0.. {
        let subject = format!("{prefix}:{i}");
        let key = key_of(store, subject.as_str(), policy);
        if master.serves(cluster.slot(&key).await) {
            subjects.push(subject);
            if subjects.len() == count {
                break;
            }
        }
    }
    subjects
}

/// What the calls made during a failover saw.
#[derive(Debug, Default)]
struct Seen {
    ok: usize,
    timeouts: usize,
    unavailable: usize,
    max_latency: Duration,
    /// When the first and the last failed call ended.
    failing: Option<(Instant, Instant)>,
    /// The first few distinct failures, for the message of a test that fails.
    errors: Vec<String>,
}

impl Seen {
    /// How long calls kept failing, first failure to last.
    fn failing_for(&self) -> Duration {
        self.failing
            .map_or(Duration::ZERO, |(first, last)| last - first)
    }
}

impl Seen {
    /// Counts one call's result; a panic for anything but a decision or a store
    /// error. Returns the decision, if any.
    fn record(&mut self, result: Result<Decision, Error>, latency: Duration) -> Option<Decision> {
        self.max_latency = self.max_latency.max(latency);
        if let Err(e) = &result {
            let e = e.to_string();
            if self.errors.len() < 4 && !self.errors.contains(&e) {
                self.errors.push(e);
            }
        }
        match result {
            Ok(d) => {
                self.ok += 1;
                return Some(d);
            }
            Err(Error::Store(e)) if e.kind() == StoreErrorKind::Timeout => self.timeouts += 1,
            Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable => {
                self.unavailable += 1
            }
            Err(e) => panic!("not a store error: {e:?}"),
        }
        let now = Instant::now();
        let first = self.failing.map_or(now, |(first, _)| first);
        self.failing = Some((first, now));
        None
    }
}

/// With Redis's default `cluster-require-full-coverage yes`, every node refuses
/// every command (`CLUSTERDOWN`) from the moment the lost master is flagged failed
/// until its replica is promoted: the other masters' subjects fail for that moment too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_master_dies_its_replica_decides_within_seconds_and_every_call_is_answered() {
    failover(RedisCluster::start(), true).await;
}

/// With `cluster-require-full-coverage no`, the other masters keep deciding throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_full_coverage_a_failover_leaves_the_other_masters_subjects_alone() {
    let cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    failover(cluster, false).await;
}

/// Kills a master under load and checks every call made meanwhile, the recovery time,
/// and that the replica kept what the master had acknowledged.
async fn failover(mut cluster: RedisCluster, full_coverage: bool) {
    const LIMIT: u32 = 5;
    // The store's own client (no retries after I/O errors), as the docs recommend.
    let store = RedisStore::cluster_from_urls(cluster.urls())
        .unwrap()
        .timeout(TIMEOUT);
    // Exact, on Redis TIME (the default), and a window no run can outlast.
    let policy = Policy::sliding_log("sl", LIMIT, Duration::from_secs(3_600)).unwrap();
    let limiter = Limiter::new(store.clone(), policy.clone());
    // The background load: a limit it never reaches, so any denial is a bug.
    let load = Limiter::new(
        store.clone(),
        Policy::fixed_window("load", 1_000_000, Duration::from_secs(3_600)).unwrap(),
    );

    let masters = cluster.masters().await;
    let victim = masters[0].clone();
    // Enough fresh subjects for a probe every 20 ms or so until the promotion: a call
    // to a dead node fails at once (the store's client never retries it).
    let doomed = subjects_on(&cluster, &store, &policy, &victim, "doomed", 400).await;
    let (exhausted, fresh) = doomed.split_at(5);
    // Load subjects: 10 on each master, the victim's first.
    let mut load_subjects = Vec::new();
    for master in &masters {
        let policy = &load.policies()[0];
        load_subjects.extend(subjects_on(&cluster, &store, policy, master, "load", 10).await);
    }
    let load_subjects: Arc<[String]> = load_subjects.into();

    // Every master is connected and has the library before the test starts.
    for subject in load_subjects.iter() {
        assert!(first_decision(&load, subject).await.is_allowed());
    }

    // Subjects on the victim, exhausted before it dies.
    for subject in exhausted {
        let admitted = burst(&limiter, subject.clone(), LIMIT as usize + 2).await;
        assert_eq!(admitted, LIMIT as usize, "{subject}");
    }
    // Make sure the replica has those writes: replication is asynchronous.
    let mut conn = cluster.node(victim.port).conn().await;
    let acked: u64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        acked, 1,
        "the victim's replica did not acknowledge its writes"
    );

    // Load: 8 tasks calling over subjects on every master, each call timed; what the
    // victim's subjects saw and what the others saw, apart.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new([Seen::default(), Seen::default()]));
    let mut tasks = JoinSet::new();
    for t in 0..8 {
        let (load, stop, seen) = (load.clone(), Arc::clone(&stop), Arc::clone(&seen));
        let subjects = Arc::clone(&load_subjects);
        tasks.spawn(async move {
            let mut i = t * 7;
            while !stop.load(Ordering::Relaxed) {
                let n = i % subjects.len();
                let started = Instant::now();
                let result = load.check(subjects[n].as_str(), 1).await;
                let side = usize::from(n >= 10);
                if let Some(d) = seen.lock().unwrap()[side].record(result, started.elapsed()) {
                    assert!(
                        d.is_allowed(),
                        "a denial under a limit never reached: {d:?}"
                    );
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (replica, killed) = cluster.kill_master(victim.port).await;
    let cluster = Arc::new(cluster);
    let promotion = tokio::spawn({
        let cluster = Arc::clone(&cluster);
        async move { cluster.wait_for_promotion(replica).await }
    });

    // Probe the victim's slots with fresh subjects until one is decided exactly:
    // LIMIT admitted, then denied, every call answered.
    let deadline = killed + Duration::from_secs(20);
    let mut probe = Seen::default();
    let mut fresh = fresh.iter();
    let recovered = 'probe: loop {
        assert!(
            Instant::now() < deadline,
            "no correct decision on the victim's slots 20 s after the kill: {probe:?}\n{}",
            cluster.log_tails()
        );
        let subject = fresh.next().expect("ran out of fresh subjects");
        let mut admitted = 0;
        for _ in 0..LIMIT + 2 {
            let started = Instant::now();
            let result = limiter.check(subject.as_str(), 1).await;
            match probe.record(result, started.elapsed()) {
                Some(d) => admitted += u32::from(d.is_allowed()),
                None => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue 'probe;
                }
            }
        }
        assert_eq!(admitted, LIMIT, "{subject} after the failover");
        break Instant::now();
    };
    let promoted = promotion.await.unwrap();

    // The load keeps running a little past recovery, then stops.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    let [victims, others] = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!(
        "failover: promoted {:?} after the kill, decisions correct {:?} after the kill \
         ({:?} after the promotion was seen)\n  load on the victim's slots {victims:?}\n  \
         load elsewhere {others:?}\n  probe {probe:?}",
        promoted - killed,
        recovered - killed,
        recovered.saturating_duration_since(promoted),
    );
    let bound = TIMEOUT + MARGIN;
    for (what, seen) in [("victim", &victims), ("others", &others), ("probe", &probe)] {
        assert!(
            seen.max_latency <= bound,
            "{what}: a call took {:?}, over {bound:?}",
            seen.max_latency
        );
    }
    assert!(
        recovered.saturating_duration_since(promoted) < Duration::from_secs(3),
        "decisions were correct only {:?} after the promotion",
        recovered - promoted
    );
    assert!(victims.timeouts + victims.unavailable > 0, "{victims:?}");
    assert!(victims.ok > 0, "{victims:?}");
    let others_failed = others.timeouts + others.unavailable;
    if full_coverage {
        // Refused while the cluster is down: from the moment the lost master is
        // flagged failed until its replica is promoted. That is Redis's election,
        // about a second on an idle machine and two on a busy one (it runs on each
        // node's cron), so the bound is on the store: decided again as soon as every
        // node reports the cluster whole, within a call's timeout and margin.
        let last_failure = others.failing.map(|(_, last)| last);
        assert!(
            others.ok > 0 && last_failure.is_some_and(|last| last <= promoted + bound),
            "{others:?}: failing for {:?}, until {:?} after the promotion was seen",
            others.failing_for(),
            last_failure.map(|last| last.saturating_duration_since(promoted))
        );
    } else {
        // None refused; allow a rare call late on a loaded machine.
        assert!(
            others.ok > 0 && others_failed <= others.ok / 50,
            "{others:?}"
        );
    }

    // Nothing acknowledged was lost: the exhausted subjects are still denied. (A call
    // that meets a late slot refresh may fail: ask again, within a bound.)
    for subject in exhausted {
        let deadline = Instant::now() + Duration::from_secs(2);
        let d = loop {
            match limiter.check(subject.as_str(), 1).await {
                Ok(d) => break d,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("{subject}: {e}; asking again");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{subject}: {e}"),
            }
        };
        assert!(!d.is_allowed(), "{subject} was forgotten by the failover");
    }
    cluster.node(replica).assert_every_key_expires().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_store_works_again_after_the_whole_cluster_restarts() {
    const LIMIT: u32 = 3;
    let mut cluster = RedisCluster::start();
    let limiter = Limiter::new(
        RedisStore::cluster_from_urls(cluster.urls())
            .unwrap()
            .timeout(TIMEOUT),
        Policy::sliding_log("sl", LIMIT, Duration::from_secs(3_600)).unwrap(),
    );
    assert!(first_decision(&limiter, "before").await.is_allowed());

    let ports: Vec<u16> = cluster.live_nodes().map(|n| n.port()).collect();
    cluster.stop_all();
    // Down: every call is answered in time, with a store error, and the store tries
    // the nodes again at a measured pace (the cluster client alone would retry every
    // node at once, again and again, while calls keep failing).
    let counter = ConnectionCounter::listen(ports);
    let mut down = Seen::default();
    let until = Instant::now() + Duration::from_millis(1_500);
    let mut i = 0;
    let mut settled = None;
    while Instant::now() < until {
        if settled.is_none() && until - Instant::now() <= Duration::from_secs(1) {
            settled = Some(counter.count());
        }
        i += 1;
        let started = Instant::now();
        let result = limiter.check(format!("down:{i}").as_str(), 1).await;
        assert!(
            down.record(result, started.elapsed()).is_none(),
            "a decision with every node down"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let attempts = counter.count();
    let last_second = attempts - settled.unwrap_or(0);
    drop(counter);
    assert!(down.max_latency <= TIMEOUT + MARGIN, "{down:?}");
    // The cluster client's own burst until the store replaces the connection (after
    // 250 ms without an answer; about 80 attempts on an idle machine, up to ~300 on a
    // machine whose two cores are saturated), then one paced attempt (to six nodes)
    // per 250 ms at most: the storm is bounded in time, and the steady state is paced.
    assert!(
        last_second <= 6 * 6 && attempts <= 600,
        "{attempts} connection attempts in 1.5 s down, {last_second} in the last second: \
         a reconnect storm"
    );

    tokio::task::block_in_place(|| cluster.restart_stopped());
    let back = Instant::now();
    let mut probe = Seen::default();
    let recovered = 'probe: loop {
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "no correct decision 5 s after the cluster was back: {probe:?}\n{}",
            cluster.log_tails()
        );
        i += 1;
        let subject = format!("back:{i}");
        let mut admitted = 0;
        for _ in 0..LIMIT + 2 {
            let started = Instant::now();
            match probe.record(limiter.check(subject.as_str(), 1).await, started.elapsed()) {
                Some(d) => admitted += u32::from(d.is_allowed()),
                None => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue 'probe;
                }
            }
        }
        assert_eq!(admitted, LIMIT, "{subject} after the restart");
        break back.elapsed();
    };
    eprintln!("whole-cluster restart: down {down:?}, {attempts} connection attempts \
         ({last_second} in the last second); decisions correct {recovered:?} after the cluster was whole again; probe {probe:?}");
    assert!(probe.max_latency <= TIMEOUT + MARGIN, "{probe:?}");
}

/// A check whose connection breaks after the master ran it, before its reply was
/// read: its fate is unknown, so it must never be sent again (a second count). The
/// master is frozen (SIGSTOP) with the store's `FCALL` and then a `CLIENT KILL` of
/// the store's connections waiting in its sockets; once it runs again it executes
/// the call, then kills the connection before the reply goes out. Control: the
/// client of a `deadpool_redis` cluster pool resends the call after that I/O error
/// and counts it twice; the store's own client (`cluster_from_urls`) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_may_have_run_is_never_sent_again() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters().await;
    let master = &masters[0];
    let policy = Policy::fixed_window("once", 100, Duration::from_secs(3_600)).unwrap();
    let pooled = RedisStore::cluster(cluster.pool()).timeout(Duration::from_secs(3));
    let own = RedisStore::cluster_from_urls(cluster.urls())
        .unwrap()
        .timeout(Duration::from_secs(3));
    // The control needs the master to run the call before it reads the kill, a race
    // the machine's scheduling does not always deal the same way: up to 3 rounds, the
    // store's own client checked in every one, until the control shows its resend.
    const ROUNDS: usize = 3;
    let all = subjects_on(&cluster, &own, &policy, master, "once", 4 * ROUNDS).await;
    let mut rounds = Vec::new();
    for round in all.chunks_exact(4) {
        let mut counted = Vec::new();
        for (store, subjects) in [(pooled.clone(), &round[..2]), (own.clone(), &round[2..])] {
            let limiter = Arc::new(Limiter::new(store, policy.clone()));
            // The store's socket to the master exists and the library is loaded.
            let (warm, subject) = (&subjects[0], subjects[1].clone());
            assert!(first_decision(&limiter, warm).await.is_allowed());
            let mut control = cluster.node(master.port).conn().await;

            let paused = cluster.node(master.port).pause();
            let check = tokio::spawn({
                let (limiter, subject) = (Arc::clone(&limiter), subject.clone());
                async move { limiter.check(subject, 1).await }
            });
            // The call is written to the frozen master's socket within a few
            // milliseconds (a local write); then the kill goes after it.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let kill = tokio::spawn(async move {
                let killed: RedisResult<u64> = support::kill_other_clients()
                    .query_async(&mut control)
                    .await;
                killed
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            paused.resume();
            let killed = kill.await.unwrap().expect("CLIENT KILL");
            assert!(killed >= 1, "the store's connection was not killed");
            let checked = check.await.unwrap();

            // How many times the master counted the one check.
            let peek = first_decision_of(&limiter, &subject).await;
            counted.push((100 - 1 - peek.remaining(), checked.is_ok()));
        }
        eprintln!(
            "counted (count, check answered): pooled {:?}, own {:?}",
            counted[0], counted[1]
        );
        assert!(
            counted[1].0 <= 1,
            "the store's client counted one check twice"
        );
        rounds.push(counted[0].0);
        if counted[0].0 == 2 {
            break;
        }
    }
    assert!(
        rounds.contains(&2),
        "control: the pool's client never resent the call ({rounds:?}), so this test shows nothing"
    );
}

/// A peek, asked again while the cluster repairs the socket the test killed.
async fn first_decision_of(limiter: &Limiter<RedisStore>, subject: &str) -> Decision {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.peek(subject, 1).await {
            Ok(d) => return d,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{subject}: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{subject}: no decision within 5 s: {e}"),
        }
    }
}

/// Subjects (`<prefix>:<i>`) whose state for `policy` lies in `slot`, found with
/// one pipeline of `CLUSTER KEYSLOT`s.
async fn subjects_in_slot(
    cluster: &RedisCluster,
    store: &RedisStore,
    policy: &Policy,
    slot: u16,
    prefix: &str,
) -> Vec<String> {
    let candidates: Vec<String> = (0..60_000).map(|i| format!("{prefix}:{i}")).collect();
    let set = Limiter::new(store.clone(), policy.clone());
    let set = set.policy_set();
    let mut pipe = redis::pipe();
    for subject in &candidates {
        pipe.cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(store.key(&subject.as_str().into(), set, policy));
    }
    let node = cluster.live_nodes().next().expect("a live node");
    let slots: Vec<u16> = pipe.query_async(&mut node.conn().await).await.unwrap();
    candidates
        .into_iter()
        .zip(slots)
        .filter(|(_, s)| *s == slot)
        .map(|(subject, _)| subject)
        .collect()
}

/// `CLUSTER SETSLOT <slot> <how...>` on the node on `port`.
async fn set_slot(cluster: &RedisCluster, port: u16, slot: u16, how: &[&str]) {
    let mut conn = cluster.node(port).conn().await;
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(how)
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {how:?} on {port}: {e}"));
}

/// A slot moved from one master to another under the store's feet: while it
/// migrates, a new subject's call meets `ASK` (the call did not run) and goes to
/// the importing master; once moved, an old subject's call meets `MOVED` and goes to
/// the new owner, its count intact. The store's own client has no retries, so the
/// store follows both itself: every call decided, none counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_follow_a_slot_that_moves_to_another_master() {
    follow_a_moving_slot(false).await;
}

/// The same move onto a master without the function library (a replica promoted
/// before the library reached it, a `FUNCTION FLUSH`): a redirected call the node
/// cannot run is sent as its script in full, as on the node the slot map names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_redirected_to_a_master_without_the_library_is_decided() {
    follow_a_moving_slot(true).await;
}

async fn follow_a_moving_slot(library_flushed_on_target: bool) {
    const LIMIT: u32 = 5;
    let cluster = RedisCluster::start();
    let masters = cluster.masters().await;
    let (from, to) = (&masters[0], &masters[1]);
    let policy = Policy::fixed_window("moving", LIMIT, Duration::from_secs(3_600)).unwrap();
    let store = RedisStore::cluster_from_urls(cluster.urls())
        .unwrap()
        .timeout(Duration::from_secs(2));
    let limiter = Limiter::new(store.clone(), policy.clone());
    let slot = from.slots[0].start().to_owned();
    let subjects = subjects_in_slot(&cluster, &store, &policy, slot, "moving").await;
    assert!(
        subjects.len() >= 2,
        "two subjects in slot {slot}: {subjects:?}"
    );
    let (old, new) = (&subjects[0], &subjects[1]);
    for _ in 0..3 {
        assert!(first_decision(&limiter, old).await.is_allowed());
    }

    if library_flushed_on_target {
        let mut conn = cluster.node(to.port).conn().await;
        let () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("FUNCTION FLUSH");
    }
    set_slot(&cluster, to.port, slot, &["IMPORTING", &from.id]).await;
    set_slot(&cluster, from.port, slot, &["MIGRATING", &to.id]).await;
    // A key the migrating master lacks: ASK, answered by the importing one.
    let asked = limiter.check(new.as_str(), 1).await;
    assert!(
        asked.as_ref().is_ok_and(Decision::is_allowed),
        "during the migration: {asked:?}"
    );

    // Move the old subject's state, then the slot itself.
    let key = key_of(&store, old.as_str(), &policy);
    let mut conn = cluster.node(from.port).conn().await;
    let () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(to.port)
        .arg(&key)
        .arg(0)
        .arg(5_000)
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("MIGRATE {key}: {e}"));
    for master in &masters {
        set_slot(&cluster, master.port, slot, &["NODE", &to.id]).await;
    }
    // MOVED, followed: the old subject's count went with it (3 of 5 used).
    let mut admitted = 0;
    for _ in 0..3 {
        match limiter.check(old.as_str(), 1).await {
            Ok(d) => admitted += u32::from(d.is_allowed()),
            Err(e) => panic!("after the move: {e}"),
        }
    }
    assert_eq!(admitted, LIMIT - 3);
    let second = limiter.check(new.as_str(), 1).await.unwrap();
    assert_eq!(second.remaining(), u64::from(LIMIT) - 2, "{second:?}");
}

/// `connect` on a cluster: the library on every master before the first check, so the
/// first check of a subject on any master is one `FCALL` and no load; and a cluster
/// that cannot be reached fails naming its nodes. The control: the masters had no
/// library before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_loads_the_library_on_every_master() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters().await;
    let libraries = |port: u16| {
        let node = cluster.node(port);
        async move {
            let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
                .arg("LIST")
                .query_async(&mut node.conn().await)
                .await
                .unwrap();
            listed.len()
        }
    };
    for master in &masters {
        assert_eq!(libraries(master.port).await, 0, "master {}", master.port);
    }
    let store = RedisStore::cluster_from_urls(cluster.urls()).unwrap();
    store.connect().await.unwrap();
    for master in &masters {
        assert_eq!(libraries(master.port).await, 1, "master {}", master.port);
    }
    let limiter = Limiter::new(
        store.timeout(Duration::from_secs(2)),
        Policy::fixed_window("connect", 5, Duration::from_secs(60)).unwrap(),
    );
    for i in 0..30 {
        assert!(limiter
            .check(format!("user:{i}"), 1)
            .await
            .unwrap()
            .is_allowed());
    }
    assert_eq!(
        command_calls(&cluster, &masters, "function|load").await,
        masters.len() as u64
    );

    let unreachable = RedisStore::cluster_from_urls(["redis://127.0.0.1:1"]).unwrap();
    let message = unreachable.connect().await.unwrap_err().to_string();
    assert!(message.contains("127.0.0.1:1"), "{message}");
}

/// A key and its org on the cluster: each check is one `FCALL`, its keys in the org's
/// slot, all or nothing, for orgs spread over every master. A global counter beside
/// them is refused when built: its slot is its own.
#[tokio::test]
async fn a_key_and_its_org_are_one_call_in_one_slot_all_or_nothing() {
    use redlimit::{Scope, Subject};
    let cluster = RedisCluster::start();
    let masters = cluster.masters().await;
    let store = RedisStore::cluster_from_urls(cluster.urls()).unwrap();
    store.connect().await.unwrap();
    let minute = Duration::from_secs(60);
    let org_policy = || {
        Policy::sliding_window("org_tokens", 1000, minute)
            .unwrap()
            .per(Scope::named("org").unwrap())
    };
    let limiter = Limiter::builder(store.clone().timeout(Duration::from_secs(2)))
        .policy(Policy::sliding_window("tokens", 1000, minute).unwrap())
        .policy(org_policy())
        .build()
        .unwrap();
    let of = |key: &str, org: &str| Subject::new(key).within("org", &Subject::new(org));
    let before = command_calls(&cluster, &masters, "fcall").await;
    let orgs = 24;
    for o in 0..orgs {
        let org = format!("org-{o}");
        let a = limiter.check(of("a", &org), 600).await.unwrap();
        assert!(a.is_allowed(), "{org}");
        let b = limiter.check(of("b", &org), 600).await.unwrap();
        assert!(!b.is_allowed(), "{org}");
        assert_eq!(b.policy().name(), "org_tokens");
        let peek = limiter.peek(of("b", &org), 1).await.unwrap();
        let each = peek.each_policy().unwrap();
        assert_eq!((each[0].remaining, each[1].remaining), (999, 399), "{org}");
    }
    assert_eq!(
        command_calls(&cluster, &masters, "fcall").await - before,
        3 * orgs as u64,
        "one call per check and per peek"
    );
    // Every key of an org shares its slot; the orgs spread over the masters.
    let mut slots_of_org: HashMap<Vec<u8>, std::collections::HashSet<u16>> = HashMap::new();
    let mut masters_used = std::collections::HashSet::new();
    for master in &masters {
        for key in cluster.node(master.port).keys().await {
            let slot = cluster.slot(std::str::from_utf8(&key).unwrap()).await;
            slots_of_org
                .entry(hash_tag(&key).to_vec())
                .or_default()
                .insert(slot);
            masters_used.insert(master.port);
        }
    }
    assert_eq!(slots_of_org.len(), orgs, "{slots_of_org:?}");
    assert!(slots_of_org.values().all(|slots| slots.len() == 1));
    assert!(masters_used.len() > 1, "orgs on one master only");

    let global = Limiter::builder(store)
        .policy(Policy::sliding_window("tokens", 1000, minute).unwrap())
        .policy(
            Policy::fixed_window("everyone", 10, minute)
                .unwrap()
                .per(Scope::global()),
        )
        .build();
    assert!(matches!(global, Err(redlimit::BuildError::ClusterGlobal(name)) if name == "everyone"));
}
