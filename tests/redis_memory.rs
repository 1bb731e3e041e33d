//! Redis memory per subject, measured as published figures are: the `used_memory`
//! delta over many subjects, one policy each (less what the clients hold, and on a
//! fresh Lua VM each time, so that the figure is the keys', on a busy machine too). Asserts the budgets (token bucket and
//! sliding window no larger than fixed window; a full sliding log at limit 1000 under
//! 8.5 KB) and prints the figures.
//!
//! `REDLIMIT_MEMORY_SUBJECTS=100000 cargo test --all-features --test redis_memory -- --nocapture`
//! measures over more subjects (default 2 000, to keep CI fast).

#[path = "it/support/mod.rs"]
mod support;

use redlimit::internals::{LimiterInternals, RedisStoreInternals};
use std::time::Duration;

use deadpool_redis::redis;
use redlimit::clock::FakeClock;
use redlimit::{Limiter, Policy, RedisStore};
use support::RedisServer;
use tokio::task::JoinSet;

/// 2026-01-01T00:00:00Z: realistic numbers in the states, aligned to every window.
const START_MS: u64 = 1_767_225_600_000;

/// Redis `used_memory` less what its clients hold (`tot-mem` in `CLIENT LIST`), read
/// in one transaction: a client keeps buffers as large as what it last sent or was
/// sent until Redis shrinks them at moments of its own (the store's first call once
/// sent its script, some 50 KB, and the baseline held it or not).
///
/// Read until two reads a few server ticks apart agree. Redis allocates a latency
/// histogram for each command the first time it runs one (some 37 KB), so the first
/// read only makes sure every command here has run. And Redis finishes some work in
/// its timer (at `hz` 10, every 100 ms): Redis 8 frees some 15 KB a tick after
/// `FUNCTION FLUSH SYNC`, and a key table's rehash ends there (10 000 subjects read
/// 129 B a subject on Redis 8 before the tick, 114 after it).
///
/// Returns the figure and the number of clients: a client costs some 25 KB more than
/// its `tot-mem`, so a figure is only compared with one read beside the same clients.
async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> (i64, usize) {
    const TICKS: Duration = Duration::from_millis(250);
    let mut last = None;
    for _ in 0..40 {
        let (clients, info): (String, String) = redis::pipe()
            .atomic()
            .cmd("CLIENT")
            .arg("LIST")
            .cmd("INFO")
            .arg("server")
            .arg("memory")
            .query_async(conn)
            .await
            .unwrap();
        let field = |name: &str| -> Option<i64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().split('.').next()?.parse().ok())
        };
        let used = field("used_memory").expect("INFO memory has used_memory");
        // Redis 8 counts the function VM in used_memory, and a VM loaded afresh is not
        // always the same size: 159,744 B after one load, 122,880 after another
        // (the whole 36,864 B moved used_memory_overhead, 18.4 B a subject here, the
        // figure read 90 B, not 109). The VM is no subject's, so it is left out.
        let vm = match field("redis_version") {
            Some(major) if major >= 8 => field("used_memory_vm_functions").unwrap_or(0),
            _ => 0,
        };
        let used = used - vm;
        let held: i64 = clients
            .lines()
            .map(|client| {
                client
                    .split(' ')
                    .find_map(|field| field.strip_prefix("tot-mem="))
                    .and_then(|v| v.parse::<i64>().ok())
                    .expect("CLIENT LIST has tot-mem")
            })
            .sum();
        let figure = (used - held, clients.lines().count());
        if last == Some(figure) {
            return figure;
        }
        last = Some(figure);
        tokio::time::sleep(TICKS).await;
    }
    panic!("used_memory did not settle over 40 reads {TICKS:?} apart: last {last:?}");
}

/// Loads the store's function library into a fresh Lua VM (`FUNCTION FLUSH`, then
/// `LOAD`): Redis 8 counts the VM in `used_memory`, and the garbage of the calls
/// before a measurement, collected when Lua sees fit, moved the figures by 30 bytes a
/// subject. On the measuring connection: a connection of its own, dropped, is a client
/// that Redis frees only when it reads the close, and a client costs some 25 KB that
/// `tot-mem` does not count.
async fn fresh_library(loader: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .arg("SYNC")
        .query_async(loader)
        .await
        .unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(RedisStore::function_library())
        .query_async(loader)
        .await
        .unwrap();
}

/// Bytes per subject after `subjects` subjects each spent `cost` under `policy`.
async fn bytes_per_subject(policy: Policy, cost: u32, subjects: usize) -> f64 {
    // No slow log: on a busy machine calls run past its 10 ms and it keeps them.
    let server = RedisServer::start_with(&["--slowlog-log-slower-than", "-1"]);
    // A client clock at the start of a window: every key lives a whole window (or
    // more) in real time, so none expires while the figures are taken.
    let limiter = Limiter::new(
        server
            .store()
            .timeout(Duration::from_secs(10))
            .client_clock(FakeClock::new(START_MS)),
        policy,
    );
    // One call before the baseline, for the histogram of its command; then a fresh VM.
    let mut conn = server.conn().await;
    fresh_library(&mut conn).await;
    limiter.check("warm-up", 1).await.unwrap();
    redis::cmd("DEL")
        .arg(limiter.store().key(
            &"warm-up".into(),
            limiter.policy_set(),
            &limiter.policies()[0],
        ))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    fresh_library(&mut conn).await;
    let before = used_memory(&mut conn).await;
    let mut tasks = JoinSet::new();
    let workers = 32;
    for w in 0..workers {
        let limiter = limiter.clone();
        tasks.spawn(async move {
            for i in (w..subjects).step_by(workers) {
                let decision = limiter.check(format!("user:{i}"), cost).await.unwrap();
                assert!(decision.is_allowed());
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    fresh_library(&mut conn).await;
    let after = used_memory(&mut conn).await;
    assert_eq!(
        after.1, before.1,
        "clients at the baseline and at the figure"
    );
    let keys: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(keys, subjects);
    server.assert_every_key_expires().await;
    (after.0 - before.0) as f64 / subjects as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_per_subject_stays_within_budget() {
    let subjects: usize = std::env::var("REDLIMIT_MEMORY_SUBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let minute = Duration::from_secs(60);
    let fixed = bytes_per_subject(
        Policy::fixed_window("api", 1_000, minute).unwrap(),
        1,
        subjects,
    )
    .await;
    let sliding = bytes_per_subject(
        Policy::sliding_window("api", 1_000, minute).unwrap(),
        1,
        subjects,
    )
    .await;
    // An emptied bucket: its state lives the minute it takes to refill.
    let bucket = bytes_per_subject(
        Policy::token_bucket("api", 1_000, 1_000, minute).unwrap(),
        1_000,
        subjects,
    )
    .await;
    // A full log: 1 000 admitted stamps in the window.
    let log = bytes_per_subject(
        Policy::sliding_log("api", 1_000, minute).unwrap(),
        1_000,
        subjects,
    )
    .await;
    println!("Redis memory per subject over {subjects} subjects, one policy, limit 1000/min:");
    println!("  fixed window    {fixed:>8.0} B");
    println!("  sliding window  {sliding:>8.0} B");
    println!("  token bucket    {bucket:>8.0} B");
    println!("  sliding log     {log:>8.0} B (full: 1000 stamps)");
    // Allocator rounding makes small figures jitter by a few bytes.
    assert!(
        sliding <= fixed + 16.0,
        "sliding window {sliding} vs fixed {fixed}"
    );
    assert!(
        bucket <= fixed + 16.0,
        "token bucket {bucket} vs fixed {fixed}"
    );
    assert!(fixed < 200.0, "fixed window {fixed}");
    assert!(log < 8_500.0, "sliding log {log}");
}
