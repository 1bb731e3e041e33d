//! The client's instructions for a check, alone or in batches: each task sends one
//! call and awaits its answer before the next (one task by default: lone checks;
//! `TASKS=64`: the store's checks queue into batches), on a current-thread runtime (the task, the
//! connection's driver and the reactor on one thread), over 100,000 subjects in turn,
//! so that every call starts its subject's window, as in the tables bench's latency
//! section. Contenders:
//!
//! - `limiter`: `Limiter::check` on a `RedisStore` (its pool's connection);
//! - `smallest`: the reference, the smallest fixed-window script
//!   (`benches/reference/smallest_fixed_window.lua`) through redis-rs
//!   `Script::key(..).arg(..).invoke_async`, as an application writes it;
//! - `bare`: the store's own command for each subject, built before the timed calls
//!   and sent bare on a `MultiplexedConnection`: what the command's size and the
//!   reply cost the client, without the store's path.
//!
//! ```text
//! cargo build --release -p redlimit-bench --example client_cost
//! for c in limiter smallest bare; do
//!   CONTENDER=$c valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='client_cost::timed' target/release/examples/client_cost
//! done   # instructions collected / CALLS (20,000): the client's per call
//! LIMIT=1000000000 CONTENDER=limiter valgrind ...   # the same, with the wide reply
//! TASKS=64 CALLS=19200 CONTENDER=limiter valgrind ... # 64 tasks: checks in batches
//! cargo run --release -p redlimit-bench --example client_cost   # wall time, no valgrind
//! ```
//!
//! `timed` runs the calls on the runtime's one thread, so the collected instructions
//! are everything the client did for them: the store's or the script's path, the
//! connection's writes and reads, the reactor, the timers. The commands, subjects
//! and keys are made before it, and each contender warms up first (its connection
//! opened, the library or the script loaded). Starts its own `redis-server` on a free
//! loopback port.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::internals::{LimiterInternals, Operation, RedisStoreInternals};
use redlimit::redis::{self, aio::MultiplexedConnection, Value};
use redlimit::{Limiter, Policy, RedisStore, Subject};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

mod redis_server;
use redis_server::{BoxError, Server};

const SUBJECTS: usize = 100_000;
/// The window's limit, by default: never reached (each subject comes back after
/// 100,000 calls), and small enough that an outcome packs into one integer, as any
/// limit under 2^25 does. `LIMIT=1000000000` measures the wide reply (four integers)
/// that a remaining count of 2^25 and more takes.
const LIMIT: u32 = 1_000_000;
const WINDOW_MS: u64 = 1_000;
const SMALLEST: &str = include_str!("../reference/smallest_fixed_window.lua");

/// What every contender needs, made before the timed calls.
struct Setup {
    limiter: Limiter<RedisStore>,
    conn: MultiplexedConnection,
    script: redis::Script,
    subjects: Vec<Subject>,
    keys: Vec<String>,
    commands: Vec<redis::Cmd>,
    limit: u32,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("client_cost: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BoxError> {
    let calls = match std::env::var("CALLS") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("CALLS={v:?} is not a number"))?,
        Err(_) => 20_000,
    };
    let limit = match std::env::var("LIMIT") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("LIMIT={v:?} is not a number"))?,
        Err(_) => LIMIT,
    };
    let tasks = match std::env::var("TASKS") {
        Ok(v) => match v.parse() {
            Ok(n) if n >= 1 && calls % n == 0 => n,
            _ => {
                return Err(
                    format!("TASKS={v:?}: a number of at least 1 that divides CALLS").into(),
                )
            }
        },
        Err(_) => 1,
    };
    let only = std::env::var("CONTENDER").ok();
    let contenders: Vec<&'static str> = match only.as_deref() {
        Some("limiter") => vec!["limiter"],
        Some("smallest") => vec!["smallest"],
        Some("bare") => vec!["bare"],
        Some(other) => return Err(format!("CONTENDER={other:?}: limiter, smallest or bare").into()),
        None => vec!["limiter", "smallest", "bare"],
    };
    let server = Server::start()?;
    println!(
        "redis-server {} on 127.0.0.1:{}",
        server.version(),
        server.port
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let setup = Arc::new(runtime.block_on(setup(&server, limit))?);
    for contender in contenders {
        // Warm-up: the same calls on other subjects.
        runtime.block_on(calls_of(Arc::clone(&setup), contender, SUBJECTS / 2, 1_000))?;
        let took = timed(&runtime, &setup, contender, calls, tasks)?;
        println!(
            "{contender:<9} {:>8.1} µs a call (wall time, {calls} calls, {tasks} tasks)",
            took.as_secs_f64() * 1e6 / calls as f64
        );
    }
    Ok(())
}

async fn setup(server: &Server, limit: u32) -> Result<Setup, BoxError> {
    let pool = redlimit::deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))?;
    let policy = Policy::fixed_window("latency", limit, Duration::from_millis(WINDOW_MS))?;
    let limiter = Limiter::new(
        RedisStore::new(pool).timeout(Duration::from_secs(1)),
        policy.clone(),
    );
    // The store's first check loads its function library, which `bare` calls.
    limiter.check(Subject::new("warm-up"), 1).await?;
    let conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let subjects: Vec<Subject> = (0..SUBJECTS)
        .map(|i| Subject::new(format!("{i:012}")))
        .collect();
    let (store, set) = (limiter.store(), limiter.policy_set());
    let keys = subjects
        .iter()
        .map(|s| store.key(s, set, &policy))
        .collect();
    let commands = subjects
        .iter()
        .map(|s| store.command(Operation::Check, s, set, 1, false))
        .collect();
    Ok(Setup {
        limiter,
        conn,
        script: redis::Script::new(SMALLEST),
        subjects,
        keys,
        commands,
        limit,
    })
}

/// The timed calls, `tasks` tasks sharing them out, on the runtime's thread: what
/// callgrind collects.
#[inline(never)]
fn timed(
    runtime: &Runtime,
    setup: &Arc<Setup>,
    contender: &'static str,
    calls: usize,
    tasks: usize,
) -> Result<Duration, BoxError> {
    let start = Instant::now();
    runtime.block_on(async {
        let mut running = JoinSet::new();
        for t in 0..tasks {
            let first = t * SUBJECTS / tasks;
            running.spawn(calls_of(Arc::clone(setup), contender, first, calls / tasks));
        }
        while let Some(done) = running.join_next().await {
            done??;
        }
        Ok::<_, BoxError>(())
    })?;
    Ok(start.elapsed())
}

/// `calls` calls of `contender`, one at a time, from subject `first` on. Each
/// contender's loop is a function of its own, so that one's future never sizes
/// another's.
async fn calls_of(
    setup: Arc<Setup>,
    contender: &'static str,
    first: usize,
    calls: usize,
) -> Result<(), BoxError> {
    let subjects = (first..first + calls).map(|i| i % SUBJECTS);
    let admitted = match contender {
        "limiter" => limiter_calls(&setup, subjects).await?,
        "smallest" => smallest_calls(&setup, subjects).await?,
        _ => bare_calls(&setup, subjects).await?,
    };
    if admitted {
        Ok(())
    } else {
        Err(format!("{contender}: a call was denied, or failed").into())
    }
}

/// `Limiter::check` of each subject: whether every one was admitted.
async fn limiter_calls(
    setup: &Setup,
    subjects: impl Iterator<Item = usize>,
) -> Result<bool, BoxError> {
    let mut admitted = true;
    for i in subjects {
        let decision = setup.limiter.check(setup.subjects[i].clone(), 1).await?;
        admitted &= decision.is_allowed();
    }
    Ok(admitted)
}

/// The smallest script on each subject's key, invoked as an application writes it.
async fn smallest_calls(
    setup: &Setup,
    subjects: impl Iterator<Item = usize>,
) -> Result<bool, BoxError> {
    let mut conn = setup.conn.clone();
    let mut admitted = true;
    for i in subjects {
        let count: u64 = setup
            .script
            .key(&setup.keys[i])
            .arg(WINDOW_MS)
            .invoke_async(&mut conn)
            .await?;
        admitted &= count <= u64::from(setup.limit);
    }
    Ok(admitted)
}

/// The store's prebuilt command for each subject, sent bare.
async fn bare_calls(
    setup: &Setup,
    subjects: impl Iterator<Item = usize>,
) -> Result<bool, BoxError> {
    let mut conn = setup.conn.clone();
    let mut admitted = true;
    for i in subjects {
        let reply: Value = setup.commands[i].query_async(&mut conn).await?;
        admitted &= !matches!(reply, Value::ServerError(_));
    }
    Ok(admitted)
}
