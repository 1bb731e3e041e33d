//! The Redis store against real `redis-server` processes: atomicity under many
//! clients, one round trip per call, recovery from flushed Lua and restarts, hostile
//! subjects, argument errors, TTLs, timeouts, and server-clock decisions.

use crate::support;
use redlimit::internals::{LimiterInternals, RedisStoreInternals};
use redlimit::store::StoreErrorKind;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, AsyncCommands};
use redlimit::clock::{Clock, FakeClock};
use redlimit::internals::SubjectInternals;
use redlimit::{Error, Limiter, Policy, RedisStore, Subject};
use support::cluster::info_field;
use support::{hash_tag, key_of, RedisServer};
use tokio::task::JoinSet;

/// A store that tolerates a loaded CI machine: 5 s before a call times out.
fn store(server: &RedisServer) -> RedisStore {
    server.store().timeout(Duration::from_secs(5))
}

fn store_kind(result: &Result<redlimit::Decision, Error>) -> Option<StoreErrorKind> {
    match result {
        Err(Error::Store(e)) => Some(e.kind()),
        _ => None,
    }
}

/// A limiter of `policies` on `store`, in order.
fn limiter_of(store: &RedisStore, policies: &[Policy]) -> Limiter<RedisStore> {
    policies
        .iter()
        .cloned()
        .fold(Limiter::builder(store.clone()), |b, p| b.policy(p))
        .build()
        .unwrap()
}

/// The keys `limiter` writes for `subject` (a joint set's one key once).
fn keys_of(limiter: &Limiter<RedisStore>, subject: &Subject) -> HashSet<String> {
    let set = limiter.policy_set();
    set.policies()
        .iter()
        .map(|p| limiter.store().key(subject, set, p))
        .collect()
}

/// Milliseconds of the server's clock.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1_000 + us / 1_000
}

/// 8 stores (8 clients, 8 pools) x 50 tasks x 3 calls on one subject, on Redis TIME.
/// Returns how many were admitted.
async fn hammer(server: &RedisServer, policy: Policy, subject: &str) -> usize {
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let limiter = Limiter::new(store(server), policy.clone());
        for _ in 0..50 {
            let limiter = limiter.clone();
            let subject = subject.to_owned();
            tasks.spawn(async move {
                let mut admitted = 0;
                for _ in 0..3 {
                    match limiter.check(subject.as_str(), 1).await {
                        Ok(d) if d.is_allowed() => admitted += 1,
                        Ok(_) => {}
                        Err(e) => panic!("a store call failed under load: {e}"),
                    }
                }
                admitted
            });
        }
    }
    let mut admitted = 0;
    while let Some(n) = tasks.join_next().await {
        admitted += n.unwrap();
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_clients_never_admit_more_than_the_limit() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // Windows of about 11.5 days: a run cannot straddle one unnoticed.
    let w = Duration::from_millis(1_000_000_000);
    let limit = 300;

    let before = server_ms(&mut conn).await / 1_000_000_000;
    let fixed = hammer(&server, Policy::fixed_window("fw", limit, w).unwrap(), "fw").await;
    let after = server_ms(&mut conn).await / 1_000_000_000;
    if before == after {
        assert_eq!(fixed, limit as usize, "fixed window");
    } else {
        // The run straddled a boundary: at most one limit per window.
        assert!(
            fixed <= 2 * limit as usize,
            "fixed window across a boundary: {fixed}"
        );
    }

    let log = hammer(&server, Policy::sliding_log("sl", limit, w).unwrap(), "sl").await;
    assert_eq!(log, limit as usize, "sliding log");

    let sliding = hammer(
        &server,
        Policy::sliding_window("sw", limit, w).unwrap(),
        "sw",
    )
    .await;
    assert!(sliding <= limit as usize, "sliding window: {sliding}");
    if before == server_ms(&mut conn).await / 1_000_000_000 {
        assert_eq!(sliding, limit as usize, "sliding window");
    }

    // One token an hour: the run sees the capacity and nothing more.
    let hour = Duration::from_secs(3_600);
    let bucket = Policy::token_bucket("tb", limit, 1, hour).unwrap();
    assert_eq!(
        hammer(&server, bucket, "tb").await,
        limit as usize,
        "token bucket"
    );

    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn a_call_is_one_fcall_on_one_shared_connection_and_checks_that_queue_share_one() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = Limiter::builder(store(&server))
        .policy(Policy::sliding_window("a", 1_000, Duration::from_secs(60)).unwrap())
        .policy(Policy::sliding_log("b", 1_000, Duration::from_secs(60)).unwrap())
        .policy(Policy::token_bucket("c", 1_000, 10, Duration::from_secs(1)).unwrap())
        .build()
        .unwrap();
    // The first call connects and has the function library loaded, in the background
    // (the call answers with its EVAL reply at once): wait for it, within a bound.
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    support::wait_for_function_library(&mut conn).await;
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    let mut tasks = JoinSet::new();
    for i in 0..100 {
        let limiter = limiter.clone();
        tasks.spawn(async move { limiter.check(format!("s{}", i % 7), 1).await });
    }
    while let Some(result) = tasks.join_next().await {
        assert!(result.unwrap().unwrap().is_allowed());
    }

    let calls = support::command_calls(&mut conn).await;
    // The checks that queued behind calls in flight went together: at most one
    // FCALL per check, at least one per 32 (the largest batch), one TIME per call.
    let fcalls = calls.get("fcall").copied().unwrap_or(0);
    assert!((4..=100).contains(&fcalls), "{calls:?}");
    assert_eq!(calls.get("time"), Some(&fcalls), "{calls:?}");
    // Commands the script runs inside count too (GET or MGET, SET, TIME); none of them
    // may come from the client, and nothing else may run.
    let extra: Vec<_> = calls
        .iter()
        .filter(|(name, _)| {
            !matches!(
                name.as_str(),
                "fcall" | "config|resetstat" | "info" | "get" | "mget" | "set" | "time"
            )
        })
        .collect();
    assert!(
        extra.is_empty(),
        "no PING, FUNCTION LOAD or EVAL: {extra:?}"
    );
    // Every call, alone or a batch, reads all of its states with one GET (a lone
    // check) or MGET, and writes each key it changed once, whichever checks of it
    // changed it: the three policies' states share their subject's one key.
    let (reads, sets) = (
        calls.get("get").copied().unwrap_or(0) + calls.get("mget").copied().unwrap_or(0),
        calls.get("set").copied().unwrap_or(0),
    );
    assert_eq!(reads, fcalls, "{calls:?}");
    assert!(sets <= 100, "{calls:?}");

    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        clients.lines().count(),
        2,
        "the store keeps one connection (plus the test's own): {clients}"
    );
    server.assert_every_key_expires().await;
}

/// Flushes the server's Lua between calls and under load: no call may fail, on a
/// server with functions (the store loads its library again) and on one without
/// (`FCALL` renamed away, as on Redis before 7.0: the store sends scripts, and the
/// script in full after `NOSCRIPT`).
async fn lua_flush_mid_run_fails_no_call(server: &RedisServer, flush: &str) {
    let limiter = Limiter::new(
        store(server),
        Policy::fixed_window("p", 1_000_000, Duration::from_secs(3_600)).unwrap(),
    );
    // Flush between two calls, again and again: each next call finds no Lua.
    for i in 0..20 {
        redis::cmd(flush)
            .arg("FLUSH")
            .query_async::<()>(&mut server.conn().await)
            .await
            .unwrap();
        let decision = limiter.check("s", 1).await;
        assert!(
            decision.is_ok(),
            "call {i} after {flush} FLUSH: {decision:?}"
        );
    }
    // And flush continuously while 4 tasks call.
    let mut tasks = JoinSet::new();
    for t in 0..4 {
        let limiter = limiter.clone();
        tasks.spawn(async move {
            for i in 0..200 {
                let result = limiter.check(format!("t{t}"), 1).await;
                assert!(result.is_ok(), "task {t} call {i}: {result:?}");
            }
        });
    }
    let mut conn = server.conn().await;
    let mut flushes = 0;
    while !tasks.is_empty() {
        redis::cmd(flush)
            .arg("FLUSH")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        flushes += 1;
        while let Some(done) = tasks.try_join_next() {
            done.unwrap();
        }
    }
    assert!(flushes > 1);
    server.assert_every_key_expires().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_mid_run_fails_no_call() {
    let server = RedisServer::start();
    lua_flush_mid_run_fails_no_call(&server, "FUNCTION").await;
    let calls = support::command_calls(&mut server.conn().await).await;
    assert!(
        calls.contains_key("fcall") && !calls.contains_key("evalsha"),
        "{calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_functions_gets_scripts() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    lua_flush_mid_run_fails_no_call(&server, "SCRIPT").await;
    let calls = support::command_calls(&mut server.conn().await).await;
    assert!(calls.contains_key("evalsha"), "{calls:?}");
    assert!(!calls.contains_key("function|load"), "{calls:?}");
}

#[tokio::test]
async fn a_restart_is_an_error_then_calls_succeed_again() {
    let mut server = RedisServer::start();
    let limiter = Limiter::new(
        store(&server),
        Policy::sliding_window("p", 1_000, Duration::from_secs(60)).unwrap(),
    );
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());

    server.stop();
    for _ in 0..3 {
        let result = limiter.check("s", 1).await;
        assert_eq!(
            store_kind(&result),
            Some(StoreErrorKind::Unavailable),
            "during the outage: {result:?}"
        );
    }

    server.restart();
    let restarted = Instant::now();
    let result = loop {
        let result = limiter.check("s", 1).await;
        if result.is_ok() || restarted.elapsed() > Duration::from_secs(5) {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(result.unwrap().is_allowed(), "{}", server.log_tail());
    assert!(
        restarted.elapsed() < Duration::from_secs(1),
        "calls succeeded only {:?} after the restart",
        restarted.elapsed()
    );
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn a_slow_server_is_a_timeout_not_a_denial() {
    let server = RedisServer::start();
    let limiter = Limiter::new(
        server.store().timeout(Duration::from_millis(50)),
        Policy::fixed_window("p", 10, Duration::from_secs(60)).unwrap(),
    );
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    // Every other client's commands wait 300 ms.
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .query_async::<()>(&mut server.conn().await)
        .await
        .unwrap();
    let result = limiter.check("s", 1).await;
    assert_eq!(
        store_kind(&result),
        Some(StoreErrorKind::Timeout),
        "{result:?}"
    );
    let started = Instant::now();
    let result = loop {
        let result = limiter.check("s", 1).await;
        if result.is_ok() || started.elapsed() > Duration::from_secs(5) {
            break result;
        }
    };
    assert!(result.unwrap().is_allowed());
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn hostile_subjects_reach_only_their_own_state() {
    let server = RedisServer::start();
    let store = store(&server);
    let policies = [
        Policy::fixed_window("a", 1, Duration::from_secs(3_600)).unwrap(),
        Policy::sliding_log("b", 1, Duration::from_secs(3_600)).unwrap(),
    ];
    let limiter = Limiter::builder(store.clone())
        .policy(policies[0].clone())
        .policy(policies[1].clone())
        .build()
        .unwrap();
    let subjects: Vec<Subject> = [
        b"{".to_vec(),
        b"}".to_vec(),
        b":".to_vec(),
        b"%7B".to_vec(), // the escaped form of "{"
        b"%7D".to_vec(),
        b"a}:b:{c".to_vec(),
        b"user:1}:a:fw".to_vec(),
        b"user:1".to_vec(),
        b"".to_vec(),
        vec![0xff, 0xfe, b'{', 0x00],
        vec![b'x'; 1 << 20],
        vec![b'y'; 1 << 20],
    ]
    .into_iter()
    .map(Subject::new)
    .collect();
    for subject in &subjects {
        let first = limiter.check(subject.clone(), 1).await.unwrap();
        assert!(
            first.is_allowed(),
            "{subject:?} saw another subject's state"
        );
        let second = limiter.check(subject.clone(), 1).await.unwrap();
        assert!(!second.is_allowed(), "{subject:?} lost its own state");
    }

    let keys: HashSet<Vec<u8>> = server.keys().await.into_iter().collect();
    assert_eq!(keys.len(), subjects.len(), "one key per subject");
    let mut tags = HashSet::new();
    for subject in &subjects {
        let mut escaped = String::new();
        subject.write_key_part(&mut escaped);
        let own: Vec<String> = policies
            .iter()
            .map(|p| store.key(subject, limiter.policy_set(), p))
            .collect();
        for key in &own {
            assert!(keys.contains(key.as_bytes()), "{key} missing");
            assert!(
                key.len() < 200,
                "a long subject makes a short key: {}",
                key.len()
            );
            assert_eq!(key.matches('{').count(), 1, "{key}");
            assert_eq!(key.matches('}').count(), 1, "{key}");
            let tag = std::str::from_utf8(hash_tag(key.as_bytes())).unwrap();
            // The slot is chosen by the escaped subject and nothing else.
            if escaped.is_empty() {
                assert_eq!(tag, "%");
            } else {
                assert_eq!(tag, escaped);
            }
        }
        assert_eq!(hash_tag(own[0].as_bytes()), hash_tag(own[1].as_bytes()));
        assert!(
            tags.insert(hash_tag(own[0].as_bytes()).to_vec()),
            "{subject:?}"
        );
    }
    server.assert_every_key_expires().await;
}

/// One policy of each algorithm: their script holds all four.
fn every_algorithm() -> Vec<Policy> {
    let s = Duration::from_secs(1);
    vec![
        Policy::fixed_window("fw", 10, s).unwrap(),
        Policy::sliding_window("sw", 10, s).unwrap(),
        Policy::token_bucket("tb", 10, 10, s).unwrap(),
        Policy::sliding_log("sl", 10, s).unwrap(),
    ]
}

/// Sends the script of `policies` by hand with `args` after KEYS, and returns the
/// error message.
async fn script_error(
    conn: &mut redis::aio::MultiplexedConnection,
    policies: &[Policy],
    keys: &[&str],
    args: &[&[u8]],
) -> String {
    let result: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
        .arg(RedisStore::script_sha1(policies))
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await;
    match result {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?} was accepted: {v:?}"),
    }
}

#[tokio::test]
async fn bad_arguments_fail_with_an_error_that_names_them() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let every = every_algorithm();
    let fixed_only = &every[..1];
    for policies in [&every[..], fixed_only] {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RedisStore::script_source(policies))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(sha, RedisStore::script_sha1(policies));
    }

    // The crate builds every argument valid (the policies check their numbers when
    // built), so the script checks only what is cheap, and names it.
    let one = ["rl:{s}:p:fw"];
    let two = ["rl:{s}:p:fw", "rl:{s}:q:sl"];
    let head = "a batch starts with its head";
    let keys = "the batch's records (1) take";
    let arguments = "a batch of 1 sets takes its records, then as many costs and times as records";
    // (keys, arguments, what the error says)
    type Case<'a> = (&'a [&'a str], &'a [&'a [u8]], &'a str);
    let cases: &[Case] = &[
        (&[], &[], head),
        (&one, &[b"x@\x01fw:10:1000;", b"\x01"], head),
        (&one, &[b"t@\x00fw:10:1000;", b"\x01"], head),
        (&one, &[b"t\x01\x01fw:10:1000;", b"\x01"], head),
        (&one, &[b"t@\x02fw:10:1000;"], head),
        (
            &one,
            &[b"t@\x02fw:10:1000;", b"fw:10:1000;", b""],
            "a batch without records has one set",
        ),
        (
            &one,
            &[b"t@\x01fw:10:1000;", b"\x02"],
            "record 1 of the batch names no set",
        ),
        (&two, &[b"t@\x01fw:10:1000;", b"\x01"], keys),
        (
            &one,
            &[b"t@\x01fw:10:1000;sw:10:1000;"],
            "checks of 2 policies each take their keys, got 1",
        ),
        (&one, &[b"t@\x01fw:10:1000;", b"\x01", b"5"], arguments),
        (&one, &[b"tD\x01fw:10:1000;", b"\x01"], arguments),
        (
            &one,
            &[b"tD\x01fw:10:1000;", b"\x01", b"1", b"1"],
            "the batch's records (1) take",
        ),
        (
            &one,
            &[b"tE\x01fw:10:1000;", b"\x01\x01\x01\x01", b"1"],
            "record 2 of the batch names no set, or has no cost or clock",
        ),
        (
            &one,
            &[b"tD\x01fw:10:1000;", b"\x01", b"one"],
            "record 1 of the batch names no set, or has no cost or clock",
        ),
        (
            &one,
            &[b"c@\x01fw:10:1000;", b"\x01", b"yesterday"],
            "record 1 of the batch names no set, or has no cost or clock",
        ),
        (
            &one,
            &[b"tB\x01fw:10:1000;", b"q\x01"],
            "record 1 of the batch has no operation",
        ),
        (
            &one,
            &[b"tA\x01fw:10:1000;", b"\x01\x02"],
            "record 1 of the batch names a key it has not",
        ),
        (
            &one,
            &[b"t@\x01xx:10:1000;", b"\x01"],
            "policy 1 must be one of this script's algorithms (fw, sl, sw, tb)",
        ),
        (&one, &[b"t@\x01fw:ten:1000;", b"\x01"], "no policy set in"),
        (&one, &[b"t@\x01fw:10:0;", b"\x01"], "policy 1 must be"),
        (
            &two,
            &[b"t@\x01fw:10:1000;sx:1:1000;", b"\x01"],
            "policy 2 must be",
        ),
    ];
    for (keys, args, expected) in cases {
        let message = script_error(&mut conn, &every, keys, args).await;
        assert!(
            message.contains(&format!("redlimit: {expected}")),
            "{args:?}: {message:?} does not contain {expected:?}"
        );
    }
    // A fixed window's script knows no other algorithm, and says which it knows.
    let args: [&[u8]; 2] = [b"t@\x01sl:10:1000;", b"\x01"];
    let message = script_error(&mut conn, fixed_only, &["rl:{s}:p:sl"], &args).await;
    assert!(
        message.contains(r#"redlimit: policy 1 must be one of this script's algorithms (fw) with a limit and a window or interval, got "sl:10:1000;""#),
        "{message:?}"
    );
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 0, "a refused call writes nothing");
}

#[tokio::test]
async fn every_write_sets_the_ttl_its_state_needs() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let clock = FakeClock::new(10_250);
    let store = store(&server).client_clock(clock.clone());
    let cases = [
        (
            Policy::fixed_window("fw", 5, Duration::from_secs(1)).unwrap(),
            750,
        ),
        (
            Policy::sliding_window("sw", 5, Duration::from_secs(1)).unwrap(),
            1_750,
        ),
        (
            Policy::token_bucket("tb", 5, 1, Duration::from_secs(1)).unwrap(),
            1_000,
        ),
        (
            Policy::sliding_log("sl", 5, Duration::from_secs(1)).unwrap(),
            1_000,
        ),
    ];
    for (policy, ttl) in cases {
        clock.set_ms(10_250);
        let limiter = Limiter::new(store.clone(), policy.clone());
        let decision = limiter.check("s", 1).await.unwrap();
        assert_eq!(
            decision.reset_after(),
            Duration::from_millis(ttl),
            "{policy:?}"
        );
        let key = key_of(&store, "s", &policy);
        let pttl: i64 = conn.pttl(&key).await.unwrap();
        assert!(
            (ttl as i64 - 200..=ttl as i64).contains(&pttl),
            "{policy:?}: PTTL {pttl}, expected about {ttl}"
        );
        // The clock goes back 1.5 s: the state must live until it decays on the clock
        // that is now behind.
        if policy.algorithm() != redlimit::Algorithm::TokenBucket {
            clock.set_ms(8_750);
            assert!(limiter.check("s", 1).await.unwrap().is_allowed());
            let pttl: i64 = conn.pttl(&key).await.unwrap();
            let needed = ttl as i64 + 1_500;
            assert!(
                (needed - 200..=needed).contains(&pttl),
                "{policy:?} after going back: PTTL {pttl}, expected about {needed}"
            );
        }
    }
    server.assert_every_key_expires().await;
}

/// On Redis TIME a new key's expiry is the time its state ends: a window's key ends
/// with its window (the sliding window's, and a joint key holding one, a window
/// later), an in-flight key a slot lifetime after the decision; alone and in batches,
/// for a key of its own, keys of one subject's set, and a joint key. On Redis 8 it is
/// written as that time (`SET .. PXAT`), exactly; on Redis 7 as a TTL (`PX`), which
/// Redis counts from when the write runs, up to the call's time later.
#[tokio::test]
async fn a_new_key_on_redis_time_expires_when_its_state_ends() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let major: u32 = info_field(&info, "redis_version")
        .and_then(|version| version.split('.').next()?.parse().ok())
        .unwrap();
    let w: u64 = 60_000;
    let minute = Duration::from_millis(w);
    let sets: [Vec<Policy>; 4] = [
        vec![Policy::fixed_window("fw", 1_000, minute).unwrap()],
        vec![Policy::sliding_window("sw", 1_000, minute).unwrap()],
        vec![
            Policy::fixed_window("fw", 1_000, minute).unwrap(),
            Policy::sliding_window("sw", 1_000, minute).unwrap(),
        ],
        vec![
            Policy::fixed_window("rate", 1_000, minute).unwrap(),
            Policy::in_flight("running", 1_000, minute).unwrap(),
        ],
    ];
    for (n, policies) in sets.iter().enumerate() {
        let store = store(&server);
        let limiter = limiter_of(&store, policies);
        // One check alone, then 24 at once: those behind the calls in flight go in batches.
        for (round, checks) in [(0, 1), (1, 24)] {
            let before = server_ms(&mut conn).await;
            let mut tasks = JoinSet::new();
            for i in 0..checks {
                let limiter = limiter.clone();
                tasks.spawn(async move { limiter.check(format!("ends-{n}-{round}-{i}"), 1).await });
            }
            while let Some(decision) = tasks.join_next().await {
                assert!(decision.unwrap().unwrap().is_allowed(), "{policies:?}");
            }
            let after = server_ms(&mut conn).await;
            for i in 0..checks {
                let subject = Subject::new(format!("ends-{n}-{round}-{i}"));
                for key in keys_of(&limiter, &subject) {
                    let ends: u64 = redis::cmd("PEXPIRETIME")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    // Written in before..=after: a TTL runs from then.
                    let late = if major >= 8 { 0 } else { after - before };
                    if key.ends_with(":if") {
                        // A slot's lifetime from the decision.
                        assert!(
                            (before + w..=after + w).contains(&ends),
                            "{key}: ends at {ends}, decided in {before}..={after}"
                        );
                    } else {
                        // The window's end (a sliding window's state, a window later).
                        let windows = if key.ends_with(":fw") { 1 } else { 2 };
                        let end = ends - ends % w;
                        assert!(
                            ends - end <= late,
                            "{key}: ends at {ends}, {} ms past a window's end",
                            ends - end
                        );
                        assert!(
                            (before / w + windows..=after / w + windows).contains(&(end / w)),
                            "{key}: ends at {ends}, decided in {before}..={after}"
                        );
                    }
                }
            }
        }
    }
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn server_clock_mode_shares_one_time_between_stores() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let w = 1_000_000_000u64;
    let policy = Policy::fixed_window("fw", 5, Duration::from_millis(w)).unwrap();
    let a = Limiter::new(store(&server), policy.clone());
    let b = Limiter::new(store(&server), policy.clone());
    let before = server_ms(&mut conn).await;
    let mut admitted = 0;
    for i in 0..8 {
        let limiter = if i % 2 == 0 { &a } else { &b };
        let decision = limiter.check("shared", 1).await.unwrap();
        if decision.is_allowed() {
            admitted += 1;
        } else {
            // Reset at the end of the server's current window.
            let after = server_ms(&mut conn).await;
            let reset = decision.retry_after().unwrap().as_millis() as u64;
            assert!(
                (w - after % w..=w - before % w).contains(&reset),
                "retry after {reset} ms does not end the server's window"
            );
        }
    }
    assert_eq!(admitted, 5, "both stores count on one budget");
    let raw: Vec<u8> = conn
        .get(key_of(a.store(), "shared", &policy))
        .await
        .unwrap();
    let set = redlimit::Limiter::new(a.store().clone(), policy.clone());
    let stored = RedisStore::stored_state(set.policy_set(), &policy, &raw).unwrap();
    let index: u64 = stored.split(':').next().unwrap().parse().unwrap();
    assert!((before / w..=server_ms(&mut conn).await / w).contains(&index));
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn states_are_compact_strings() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let clock = FakeClock::new(1_767_225_600_000);
    let store = store(&server).client_clock(clock.clone());
    let second = Duration::from_secs(1);

    // The sliding log: a 4-byte head, then 6-byte big-endian stamps, built with
    // Redis Lua's `struct` library (checked on the server the tests run).
    let log = Policy::sliding_log("sl", 4, second).unwrap();
    let limiter = Limiter::new(store.clone(), log.clone());
    let key = key_of(&store, "s", &log);
    let mut admitted = Vec::new();
    for step in 0..7u64 {
        clock.advance(Duration::from_millis(300));
        let cost = if step == 5 { 2 } else { 1 };
        if limiter.check("s", cost).await.unwrap().is_allowed() {
            admitted.extend(std::iter::repeat_n(clock.now_ms(), cost as usize));
        }
    }
    let raw: Vec<u8> = conn.get(&key).await.unwrap();
    assert_eq!(raw.len(), 4 + 6 * 4, "a full ring of 4 stamps");
    let head = u32::from_be_bytes(raw[..4].try_into().unwrap()) as usize;
    let stamps: Vec<u64> = (0..4)
        .map(|i| {
            let at = 4 + 6 * ((head + i) % 4);
            raw[at..at + 6]
                .iter()
                .fold(0u64, |n, b| n << 8 | u64::from(*b))
        })
        .collect();
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let version = version
        .lines()
        .find(|l| l.starts_with("redis_version"))
        .unwrap_or("?");
    assert_eq!(stamps, admitted[admitted.len() - 4..], "on {version}");

    // The token bucket: one integer, which Redis keeps without a string buffer.
    let bucket = Policy::token_bucket("tb", 5, 1, second).unwrap();
    Limiter::new(store.clone(), bucket.clone())
        .check("s", 1)
        .await
        .unwrap();
    let key = key_of(&store, "s", &bucket);
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(encoding, "int");
    let tat: u64 = conn.get(&key).await.unwrap();
    assert_eq!(tat, clock.now_ms() * 1_000 + 1_000_000);

    // The windows: the index and the count in 6 bytes each, the index and the
    // previous and current counts in 4 bytes each (big-endian): 12 bytes, the most a
    // Redis 7 string value holds in the memory of an empty one.
    let index = clock.now_ms() / 1_000;
    for (policy, expected) in [
        (
            Policy::fixed_window("fw", 5, second).unwrap(),
            [&index.to_be_bytes()[2..], &1u64.to_be_bytes()[2..]].concat(),
        ),
        (
            Policy::sliding_window("sw", 5, second).unwrap(),
            [
                &(index as u32).to_be_bytes()[..],
                &[0, 0, 0, 0],
                &[0, 0, 0, 1],
            ]
            .concat(),
        ),
    ] {
        Limiter::new(store.clone(), policy.clone())
            .check("s", 1)
            .await
            .unwrap();
        let raw: Vec<u8> = conn.get(key_of(&store, "s", &policy)).await.unwrap();
        assert_eq!(raw, expected, "{policy:?}");
    }
    // In flight: one holder with one slot, its id and its expiry in 6 bytes each.
    let running = Policy::in_flight("if", 5, second).unwrap();
    let limiter = std::sync::Arc::new(Limiter::new(store.clone(), running.clone()));
    let decision = limiter.check("s", 1).await.unwrap();
    let _permit = limiter.hold("s", &decision).unwrap();
    let raw: Vec<u8> = conn.get(key_of(&store, "s", &running)).await.unwrap();
    assert_eq!(raw.len(), 12);
    assert_eq!(&raw[6..], &(clock.now_ms() + 1_000).to_be_bytes()[2..]);

    // Two policies of one subject: their states in one key, the first's after its
    // length (one byte), the last's after it: 1 + 12 + 16 bytes.
    let window = Policy::fixed_window("fw", 5, second).unwrap();
    let both = Limiter::builder(store.clone())
        .policy(window.clone())
        .policy(bucket.clone())
        .build()
        .unwrap();
    both.check("s", 1).await.unwrap();
    let set = both.policy_set();
    let key = store.key(&Subject::new("s"), set, &window);
    assert_eq!(key, store.key(&Subject::new("s"), set, &bucket), "one key");
    let raw: Vec<u8> = conn.get(&key).await.unwrap();
    assert_eq!(raw.len(), 1 + 12 + 16, "{raw:?}");
    assert_eq!(raw[0], 12);
    assert_eq!(
        RedisStore::stored_state(set, &window, &raw).as_deref(),
        Some(format!("{index}:1").as_str())
    );
    assert_eq!(
        RedisStore::stored_state(set, &bucket, &raw),
        Some((clock.now_ms() * 1_000 + 1_000_000).to_string())
    );
    server.assert_every_key_expires().await;
}

/// The sliding log's state in Redis, read back through the Rust twin of its ring
/// layout, holds exactly the stamps the model keeps: the newest `limit` admitted ones,
/// a clock that went back clamped to the newest, through the ring filling, turning
/// and being rewritten by a refund.
#[tokio::test]
async fn a_sliding_log_state_in_redis_is_the_model_s_stamps() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let clock = FakeClock::new(50_000);
    let store = store(&server).client_clock(clock.clone());
    let limit = 4;
    let policy = Policy::sliding_log("sl", limit, Duration::from_secs(1)).unwrap();
    let key = key_of(&store, "s", &policy);
    let limiter = Limiter::new(store, policy);
    let mut expected: std::collections::VecDeque<u64> = Default::default();
    // (ms to move the clock, negative for back; cost)
    let steps: [(i64, u32); 12] = [
        (0, 1),
        (100, 2),
        (100, 1),
        (50, 1),
        (900, 1),
        (150, 2),
        (-400, 1),
        (1_000, 3),
        (10, 1),
        (2_000, 4),
        (1, 1),
        (1_500, 2),
    ];
    let mut turned = false;
    for (i, (step, cost)) in steps.into_iter().enumerate() {
        let now = clock.now_ms().checked_add_signed(step).unwrap();
        clock.set_ms(now);
        let decision = limiter.check("s", cost).await.unwrap();
        if decision.is_allowed() {
            let stamp = expected.back().map_or(now, |newest| now.max(*newest));
            for _ in 0..cost {
                expected.push_back(stamp);
            }
            while expected.len() > limit as usize {
                expected.pop_front();
                turned = true;
            }
        }
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let stamps = RedisStore::sliding_log_stamps(&raw, u64::from(limit));
        assert_eq!(
            stamps.as_deref(),
            Some(Vec::from(expected.clone()).as_slice()),
            "step {i} at {now} ms ({decision:?}): {raw:?}"
        );
    }
    assert!(turned, "the steps must fill and turn the ring");
    // A refund rewrites the ring in order: still the same stamps, less the newest.
    limiter.refund("s", 1).await.unwrap();
    expected.pop_back();
    let raw: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        RedisStore::sliding_log_stamps(&raw, u64::from(limit)),
        Some(Vec::from(expected))
    );
}

/// What a limiter under a changed policy sees, on one store: the old configuration
/// spends the limit, then the new one (same name, a window 3 600 times longer) counts.
/// Returns the new one's denial after its own limit and the old one's next answer.
async fn after_a_policy_change<S: redlimit::store::Store + Clone>(
    store: S,
    old: Policy,
    new: Policy,
    subject: &str,
) -> (redlimit::Decision, redlimit::Decision) {
    let old = Limiter::new(store.clone(), old);
    for i in 0..5 {
        assert!(old.check(subject, 1).await.unwrap().is_allowed(), "old {i}");
    }
    let new = Limiter::new(store, new);
    for i in 0..5 {
        let fresh = new.check(subject, 1).await.unwrap();
        assert!(fresh.is_allowed(), "new {i}: counts from zero: {fresh:?}");
    }
    let denied = new.check(subject, 1).await.unwrap();
    (denied, old.check(subject, 1).await.unwrap())
}

/// A policy changed under the same name (a rolling deploy that lengthened the window,
/// or a second service on the same Redis that also calls its policy "api") never reads
/// the other's state: it counts from zero, its denial names a wait within two of its
/// own windows (a sliding window waits into the next one), its key expires within that window, and the old configuration keeps its own
/// count. The memory store, the control, does the same.
#[tokio::test]
async fn a_policy_changed_under_its_name_counts_apart_and_never_locks_out() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let clock = FakeClock::new(1_800_000_000_000);
    let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3_600));
    let pairs = [
        (
            Policy::fixed_window("api", 5, second),
            Policy::fixed_window("api", 5, hour),
        ),
        (
            Policy::sliding_window("api", 5, second),
            Policy::sliding_window("api", 5, hour),
        ),
        (
            Policy::sliding_log("api", 5, second),
            Policy::sliding_log("api", 5, hour),
        ),
        (
            Policy::token_bucket("api", 5, 5, second),
            Policy::token_bucket("api", 5, 5, hour),
        ),
    ];
    for (old, new) in pairs {
        let (old, new) = (old.unwrap(), new.unwrap());
        let subject = format!("deploy-{}", old.algorithm());
        let redis = store(&server).client_clock(clock.clone());
        let memory = redlimit::MemoryStore::with_clock(clock.clone());
        let (on_redis, old_on_redis) =
            after_a_policy_change(redis.clone(), old.clone(), new.clone(), &subject).await;
        let (in_memory, old_in_memory) =
            after_a_policy_change(memory, old.clone(), new.clone(), &subject).await;
        for (what, denied, old_next) in [
            ("redis", &on_redis, &old_on_redis),
            ("memory", &in_memory, &old_in_memory),
        ] {
            let retry = denied.retry_after().expect("a denial names a wait");
            assert!(
                !denied.is_allowed() && retry <= 2 * hour && denied.reset_after() <= 2 * hour,
                "{what} {new:?}: {denied:?}"
            );
            assert!(!old_next.is_allowed(), "{what} {old:?}: its own count");
        }
        assert_eq!(on_redis.retry_after(), in_memory.retry_after(), "{new:?}");
        let pttl: i64 = conn
            .pttl(key_of(&redis, subject.as_str(), &new))
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= 2 * 3_600_000, "{new:?}: PTTL {pttl} ms");
    }
    server.assert_every_key_expires().await;
}

/// Every timeout the setter accepts has a meaning, and none panics: `Duration::MAX`
/// (or any timeout too large to add to the clock) is no timeout, a huge one as good
/// as none, zero is read as 1 ms (a decision or a timeout error, never a denial).
#[tokio::test]
async fn every_timeout_is_a_defined_meaning_never_a_panic() {
    let server = RedisServer::start();
    let window = Duration::from_secs(3_600);
    let huge = [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_nanos(u64::MAX),
        Duration::from_secs(10u64.pow(15)),
    ];
    for (i, timeout) in huge.into_iter().enumerate() {
        let store = server.store().timeout(timeout);
        let limiter = Limiter::new(store, Policy::fixed_window("p", 2, window).unwrap());
        let subject = format!("huge:{i}");
        for n in 0..3 {
            let decision = limiter
                .check(subject.as_str(), 1)
                .await
                .unwrap_or_else(|e| panic!("timeout {timeout:?}: {e}"));
            assert_eq!(
                decision.is_allowed(),
                n < 2,
                "timeout {timeout:?}, check {n}"
            );
        }
    }
    let store = server.store().timeout(Duration::ZERO);
    let limiter = Limiter::new(store, Policy::fixed_window("p", 2, window).unwrap());
    for n in 0..20 {
        match limiter.check(format!("zero:{n}"), 1).await {
            Ok(decision) => assert!(decision.is_allowed()),
            Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
            Err(e) => panic!("not a store error: {e}"),
        }
    }
}

/// A limiter of two policies keeps both states in one key: a flushed Redis costs each
/// policy at most its limit again, a policy changed under the same name starts in
/// another key while the old one keeps its count, and a clock that went back keeps
/// deciding on the stored state, never locked out for longer than the stored window.
#[tokio::test]
async fn a_joint_key_survives_a_flush_a_changed_policy_and_a_clock_gone_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let clock = FakeClock::new(1_767_225_600_000);
    let store = store(&server).client_clock(clock.clone());
    let second = Duration::from_secs(1);
    let joint = |window: Duration| {
        Limiter::builder(store.clone())
            .policy(Policy::fixed_window("fw", 3, window).unwrap())
            .policy(Policy::sliding_window("sw", 10, second * 10).unwrap())
            .build()
            .unwrap()
    };
    let limiter = joint(second);
    for _ in 0..3 {
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    }
    assert!(!limiter.check("s", 1).await.unwrap().is_allowed());
    assert_eq!(server.keys().await.len(), 1, "one key for both policies");

    // Flushed: the subject starts afresh, its limit once more and no more.
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let fresh = limiter.check("s", 1).await.unwrap();
    assert!(fresh.is_allowed());
    assert_eq!(fresh.remaining(), 2);
    assert!(limiter.check("s", 2).await.unwrap().is_allowed());
    assert!(!limiter.check("s", 1).await.unwrap().is_allowed());

    // The window changed under the same name: another key, counted afresh; the old
    // limiter's count stands.
    let changed = joint(second * 2);
    let subject = Subject::new("s");
    assert_ne!(
        store.key(&subject, changed.policy_set(), &changed.policies()[0]),
        store.key(&subject, limiter.policy_set(), &limiter.policies()[0])
    );
    let other = changed.check("s", 1).await.unwrap();
    assert!(other.is_allowed(), "{other:?}");
    assert_eq!(other.remaining(), 2);
    assert!(!limiter.check("s", 1).await.unwrap().is_allowed());

    // The clock goes back half a window after the window turned: the stored window
    // still counts (one more fits), and the wait never runs past its end.
    clock.advance(Duration::from_millis(1_500));
    assert!(limiter.check("s", 2).await.unwrap().is_allowed());
    clock.set_ms(clock.now_ms() - 1_000);
    let back = limiter.check("s", 1).await.unwrap();
    assert!(back.is_allowed(), "{back:?}");
    let denied = limiter.check("s", 1).await.unwrap();
    assert!(!denied.is_allowed());
    let wait = denied.retry_after().unwrap();
    assert!(wait <= Duration::from_millis(1_500), "{wait:?}");
    server.assert_every_key_expires().await;
}

/// A new key is written with SET's GET option, which fails on a key of another type
/// (MGET reads one as absent, and so does a lone check's GET): such a key is
/// overwritten with a new state, as a plain SET always did, on Redis TIME (a lone
/// check's path) and on the client's clock (a batch's), for one policy, a joint key and
/// a set whose policies keep a key each. Never an error, never a lockout.
#[tokio::test]
async fn a_key_of_another_type_is_taken_as_no_state_and_overwritten() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let minute = Duration::from_secs(60);
    let sets: [Vec<Policy>; 6] = [
        vec![Policy::fixed_window("fw", 5, minute).unwrap()],
        vec![Policy::sliding_window("sw", 5, minute).unwrap()],
        vec![Policy::token_bucket("tb", 5, 1, minute).unwrap()],
        vec![Policy::sliding_log("sl", 5, minute).unwrap()],
        vec![
            Policy::sliding_window("sw", 5, minute).unwrap(),
            Policy::token_bucket("tb", 5, 1, minute).unwrap(),
        ],
        vec![
            Policy::fixed_window("rate", 5, minute).unwrap(),
            Policy::in_flight("running", 5, minute).unwrap(),
        ],
    ];
    let clock = FakeClock::new(1_767_225_600_000);
    for (n, policies) in sets.iter().enumerate() {
        for client_clock in [false, true] {
            let store = if client_clock {
                store(&server).client_clock(clock.clone())
            } else {
                store(&server)
            };
            let limiter = limiter_of(&store, policies);
            let subject = Subject::new(format!("typed-{n}-{client_clock}"));
            let keys = keys_of(&limiter, &subject);
            for key in &keys {
                let _: () = conn.hset(key, "field", "value").await.unwrap();
            }
            for expected in [4, 3] {
                let decision = limiter.check(subject.clone(), 1).await;
                let decision = decision.unwrap_or_else(|e| panic!("{policies:?}: {e}"));
                assert!(decision.is_allowed(), "{policies:?}: {decision:?}");
                assert_eq!(decision.remaining(), expected, "{policies:?}");
            }
            for key in &keys {
                let kind: String = redis::cmd("TYPE")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(kind, "string", "{policies:?}: {key}");
            }
        }
    }
    server.assert_every_key_expires().await;
}
