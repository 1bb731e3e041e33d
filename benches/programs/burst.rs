//! Bursts and a busy host: how many checks a burst leaves unchecked (a store error,
//! which a fail-open layer lets through), and the memory it leaves behind.
//!
//! ```text
//! cargo run --release -p redlimit-bench --example burst                 # both sections, 3 rounds
//! cargo run --release -p redlimit-bench --example burst -- burst        # 50,000 checks at once, Redis healthy
//! cargo run --release -p redlimit-bench --example burst -- deep         # 2,000 checks of 17 policies, beside busy loops
//! BURST=50000 DEEP=2000 ROUNDS=3 cargo run --release -p redlimit-bench --example burst
//! BUSY=0 cargo run --release -p redlimit-bench --example burst -- deep  # the control: no busy loops
//! ```
//!
//! Starts its own `redis-server` on a free loopback port. In each round, in turn:
//!
//! - `from_url`: a `RedisStore::from_url` store (the store drives its own socket) at
//!   the default 50 ms timeout, after `connect`;
//! - `pool`: a `RedisStore::new(pool)` store (the pool's connection, read by redis's
//!   task), the same;
//! - `smallest`: the reference, the smallest script that makes a fixed-window decision
//!   (`benches/reference/smallest_fixed_window.lua`), one `EVALSHA` per check on one
//!   multiplexed connection, each within 50 ms of its send (`tokio::time::timeout`):
//!   what a client with a plain per-call timeout leaves unchecked.
//!
//! The burst is `BURST` checks (50,000) of one fixed window each, on distinct
//! subjects, spawned at once on a two-worker runtime; the live heap (a counting
//! allocator) is read before the burst and after its tasks are gone, and its most
//! during the burst (less before, a check: what each check holds while it waits,
//! its task and subject included). The deep pipeline
//! is `DEEP` checks (2,000) of 17 policies each (the shape of
//! `a_deep_pipeline_on_a_healthy_redis_is_decided_not_timed_out`), beside two busy
//! loops per core (`BUSY`, 2) that this program starts and stops (`sh -c 'while :; do :; done'`);
//! `smallest` sends its one-policy script per check at the same depth.

use std::process::{Child, Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::redis::{self, aio::MultiplexedConnection};
use redlimit::{Limiter, Policy, RedisStore};
use tokio::task::JoinSet;

mod redis_server;
use redis_server::{BoxError, Server};

/// Counts live heap bytes: what a burst leaves allocated.
#[path = "../../tests/it/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{live, peak, reset_peak, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const TIMEOUT: Duration = Duration::from_millis(50);
const SMALLEST: &str = include_str!("../reference/smallest_fixed_window.lua");

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("burst: {error}");
            ExitCode::FAILURE
        }
    }
}

fn setting(name: &str, default: usize) -> Result<usize, BoxError> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a number").into()),
        Err(_) => Ok(default),
    }
}

async fn run() -> Result<(), BoxError> {
    let only = std::env::args().nth(1);
    let (burst, deep, rounds) = (
        setting("BURST", 50_000)?,
        setting("DEEP", 2_000)?,
        setting("ROUNDS", 3)?,
    );
    let server = Server::start()?;
    println!(
        "redis-server {} on 127.0.0.1:{}",
        server.version(),
        server.port
    );
    if only.as_deref().is_none_or(|s| s == "burst") {
        println!("\n{burst} checks at once, Redis healthy, 50 ms timeout");
        println!("round  client     unchecked           took      calls   heap after - before   most a check");
        for round in 1..=rounds {
            for kind in rotate(&["from_url", "pool", "smallest"], round) {
                let row = measure(&server, kind, burst, false, &format!("b{round}")).await?;
                println!("{round:>5}  {kind:<9} {row}");
            }
        }
    }
    if only.as_deref().is_none_or(|s| s == "deep") {
        let per_core = setting("BUSY", 2)?;
        let loops = per_core * std::thread::available_parallelism().map_or(2, |n| n.get());
        println!(
            "\n{deep} checks at once, 17 policies each, beside {loops} busy loops, 50 ms timeout"
        );
        println!("round  client     unchecked           took      calls   heap after - before   most a check");
        for round in 1..=rounds {
            for kind in rotate(&["from_url", "pool", "smallest"], round) {
                let busy = Busy::start(loops)?;
                let row = measure(&server, kind, deep, true, &format!("d{round}")).await;
                drop(busy);
                println!("{round:>5}  {kind:<9} {}", row?);
            }
        }
    }
    Ok(())
}

/// `kinds` starting at a different one each round.
fn rotate<'a>(kinds: &[&'a str], round: usize) -> Vec<&'a str> {
    let mut kinds = kinds.to_vec();
    let by = round % kinds.len();
    kinds.rotate_left(by);
    kinds
}

fn policies(deep: bool) -> Result<Vec<Policy>, BoxError> {
    let window = Duration::from_secs(3_600);
    let mut policies = vec![Policy::fixed_window("burst", 100, window)?];
    if deep {
        policies[0] = Policy::sliding_log("a", 100, window)?;
        for i in 0..4 {
            policies.push(Policy::sliding_log(format!("log{i}"), 100, window)?);
            policies.push(Policy::sliding_window(format!("sw{i}"), 100, window)?);
            policies.push(Policy::fixed_window(format!("fw{i}"), 100, window)?);
            policies.push(Policy::token_bucket(
                format!("tb{i}"),
                100,
                1,
                Duration::from_secs(1),
            )?);
        }
    }
    Ok(policies)
}

/// One burst of `checks` by `kind`; its row.
async fn measure(
    server: &Server,
    kind: &str,
    checks: usize,
    deep: bool,
    tag: &str,
) -> Result<String, BoxError> {
    let url = server.url();
    let (unchecked, took, calls, heap, most) = if kind == "smallest" {
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let script = redis::Script::new(SMALLEST);
        script.prepare_invoke().load_async(&mut conn).await?;
        let before = live();
        reset_peak();
        let started = Instant::now();
        let unchecked = smallest_burst(&conn, script.get_hash(), checks, tag).await;
        let took = started.elapsed();
        let most = peak() - before;
        drop(conn);
        tokio::time::sleep(Duration::from_millis(100)).await;
        (unchecked, took, checks as u64, live() - before, most)
    } else {
        let store = if kind == "from_url" {
            RedisStore::from_url(&url)?
        } else {
            let pool = redlimit::deadpool_redis::Config::from_url(url.as_str())
                .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))?;
            RedisStore::new(pool)
        };
        store.connect().await?;
        let limiter = policies(deep)?
            .into_iter()
            .fold(Limiter::builder(store.clone()), |b, p| b.policy(p))
            .build()?;
        let limiter = Arc::new(limiter);
        // One check before the count, so what the store keeps for good (its
        // connection, the composed Lua) is in the heap before, not in the delta.
        limiter.check(format!("{tag}:{kind}:warm"), 1).await?;
        let sent = store.calls_sent();
        let before = live();
        reset_peak();
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for i in 0..checks {
            let limiter = Arc::clone(&limiter);
            let subject = format!("{tag}:{kind}:{i}");
            tasks.spawn(async move { limiter.check(subject, 1).await.is_err() });
        }
        let mut unchecked = 0;
        while let Some(failed) = tasks.join_next().await {
            unchecked += usize::from(failed?);
        }
        let took = started.elapsed();
        let most = peak() - before;
        drop(tasks);
        // The answers of calls that timed out may still be on their way.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let heap = live() - before;
        (unchecked, took, store.calls_sent() - sent, heap, most)
    };
    Ok(format!(
        "{unchecked:>6} ({:>6.3}%)  {:>9.1?}  {calls:>7}   {:>+10} B   {:>7} B",
        100.0 * unchecked as f64 / checks as f64,
        took,
        heap,
        most / checks as isize
    ))
}

/// `checks` smallest-script calls at once, each within [`TIMEOUT`] of its send; how
/// many timed out or failed.
async fn smallest_burst(
    conn: &MultiplexedConnection,
    sha: &str,
    checks: usize,
    tag: &str,
) -> usize {
    let mut tasks = JoinSet::new();
    for i in 0..checks {
        let mut conn = conn.clone();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha)
            .arg(1)
            .arg(format!("{tag}:smallest:{i}"))
            .arg(3_600_000);
        tasks.spawn(async move {
            let call = cmd.query_async::<u64>(&mut conn);
            !matches!(tokio::time::timeout(TIMEOUT, call).await, Ok(Ok(_)))
        });
    }
    let mut unchecked = 0;
    while let Some(failed) = tasks.join_next().await {
        unchecked += usize::from(failed.unwrap_or(true));
    }
    unchecked
}

/// Busy loops in processes of their own, killed on drop.
struct Busy(Vec<Child>);

impl Busy {
    fn start(loops: usize) -> Result<Self, BoxError> {
        let children = (0..loops)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(children))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
