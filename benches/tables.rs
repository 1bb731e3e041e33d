//! The tables of BENCHMARKS.md, every figure measured in one run beside its reference.
//!
//! ```text
//! cargo bench --bench tables                      # every section
//! cargo bench --bench tables -- throughput memory # some of: throughput, memory, http
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (the test harness in
//! `tests/support`), and needs `redis-benchmark` on PATH for the throughput
//! references (Debian: package `redis-tools`). Prints the machine, then markdown
//! tables: paste them into BENCHMARKS.md with the command that made them.
//!
//! - `throughput`: each algorithm through `Limiter::check` on a `RedisStore`, beside a
//!   bare redis-rs `EVALSHA` loop of the same script with the same keys and
//!   arguments on the same kind of connection, `redis-benchmark` running that
//!   `EVALSHA`, and our own scripts of the seed's layouts (`benches/reference/`):
//!   one client, then 64 tasks against `redis-benchmark -c 50`. Contenders take turns
//!   in rounds so a noisy neighbour hurts them alike.
//! - `memory`: Redis `used_memory` delta per subject for each algorithm, beside the
//!   seed's layouts on the same server, and the seed's "1 million users at 1,000 per
//!   minute" table recomputed from those figures.
//! - `http`: see [`http`].

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use redlimit::redis::{self, aio::MultiplexedConnection, Value};
use redlimit::{Algorithm, Policy, RedisStore, Subject};
use support::RedisServer;

const SECTIONS: [&str; 4] = ["throughput", "memory", "flood", "http"];

fn main() {
    // `cargo bench` appends `--bench`; anything else not starting with '-' is a section.
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for a in &asked {
        assert!(
            SECTIONS.contains(&a.as_str()),
            "unknown section {a:?}: choose among {SECTIONS:?}"
        );
    }
    let wanted = |s: &str| asked.is_empty() || asked.iter().any(|a| a == s);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let server = RedisServer::start();
    let started = Instant::now();
    rt.block_on(async {
        let mut conn = connect(&server).await;
        machine::print(&mut conn).await;
        load_scripts(&mut conn).await;
        if wanted("throughput") {
            throughput::run(&server).await;
            machine::print_load();
        }
        if wanted("memory") {
            memory::run(&server).await;
            machine::print_load();
        }
        if wanted("flood") {
            flood::run(&server).await;
            machine::print_load();
        }
    });
    // The HTTP section runs its own runtimes (server, load generator).
    if wanted("http") {
        http::run(&server);
        machine::print_load();
    }
    println!("\nwhole run: {:.0} s", started.elapsed().as_secs_f64());
}

/// The machine facts every table is read against.
mod machine {
    use super::*;

    fn command(program: &str, args: &[&str]) -> String {
        Command::new(program)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("({program} unavailable)"))
    }

    pub(crate) fn load() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".to_owned())
    }

    /// CPU time of this whole process (every thread), in ns, from /proc.
    pub(crate) fn process_cpu_ns() -> u64 {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(|task| {
                        let stat =
                            std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
                        stat.split_whitespace().next()?.parse::<u64>().ok()
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    pub(crate) fn print_load() {
        println!("\nload average (1, 5, 15 min): {}", load());
    }

    pub(crate) async fn print(conn: &mut MultiplexedConnection) {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(conn)
            .await
            .expect("INFO server");
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
                    .map(|s| s.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".to_owned());
        println!("## Machine");
        println!();
        println!(
            "- date: {}",
            command("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
        );
        println!(
            "- cores: {} ({cpu})",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!(
            "- Redis {} ({}-bit), loopback, no persistence",
            field("redis_version"),
            field("arch_bits"),
        );
        println!("- {}", command("redis-benchmark", &["--version"]));
        println!("- {}", command("rustc", &["--version"]));
        println!("- load average (1, 5, 15 min) at start: {}", load());
    }
}

/// Our own scripts of the seed's layouts (see `benches/reference/`).
mod reference {
    use super::*;
    use std::sync::LazyLock;

    pub(crate) static FIXED_WINDOW: LazyLock<redis::Script> =
        LazyLock::new(|| redis::Script::new(include_str!("reference/fixed_window.lua")));
    pub(crate) static SLIDING_WINDOW: LazyLock<redis::Script> =
        LazyLock::new(|| redis::Script::new(include_str!("reference/sliding_window.lua")));
    pub(crate) static TOKEN_BUCKET: LazyLock<redis::Script> =
        LazyLock::new(|| redis::Script::new(include_str!("reference/token_bucket.lua")));
    pub(crate) static SLIDING_LOG: LazyLock<redis::Script> =
        LazyLock::new(|| redis::Script::new(include_str!("reference/sliding_log.lua")));

    /// The seed's layout of `algorithm`: hash-tag-free names, as the seed wrote them.
    pub(crate) fn script(algorithm: Algorithm) -> &'static redis::Script {
        match algorithm {
            Algorithm::FixedWindow => &FIXED_WINDOW,
            Algorithm::SlidingWindow => &SLIDING_WINDOW,
            Algorithm::TokenBucket => &TOKEN_BUCKET,
            _ => &SLIDING_LOG,
        }
    }

    pub(crate) fn name(algorithm: Algorithm) -> &'static str {
        match algorithm {
            Algorithm::FixedWindow => "INCR on a key per window",
            Algorithm::SlidingWindow => "two keys (previous, current window)",
            Algorithm::TokenBucket => "hash (tokens, ts)",
            _ => "sorted set of timestamps",
        }
    }

    /// `EVALSHA` of the seed's script for one call: the same key as ours (the window
    /// number is appended to it by the fixed and sliding window scripts), then clock,
    /// cost, limit (capacity) and window (refill period) in ms, and a request id for
    /// the sorted set's unique members.
    pub(crate) fn command(
        algorithm: Algorithm,
        key: &str,
        clock: &str,
        cost: u64,
        policy: &Policy,
        id: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script(algorithm).get_hash())
            .arg(1)
            .arg(key)
            .arg(clock)
            .arg(cost)
            .arg(policy.limit())
            .arg(policy.window_ms());
        if algorithm == Algorithm::SlidingLog {
            cmd.arg(id);
        }
        cmd
    }
}

/// Loads every script the bare loops and `redis-benchmark` send by SHA: they cannot
/// recover from `NOSCRIPT` as the store does. `FLUSHALL` keeps them.
async fn load_scripts(conn: &mut MultiplexedConnection) {
    for algorithm in Algorithm::ALL {
        // The store's script for a limiter of this one algorithm.
        let minute = Duration::from_secs(60);
        let policy = match algorithm {
            Algorithm::FixedWindow => Policy::fixed_window("p", 1, minute),
            Algorithm::SlidingWindow => Policy::sliding_window("p", 1, minute),
            Algorithm::TokenBucket => Policy::token_bucket("p", 1, 1, minute),
            _ => Policy::sliding_log("p", 1, minute),
        }
        .expect("policy");
        let policies = [policy];
        let ours: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RedisStore::script_source(&policies))
            .query_async(conn)
            .await
            .expect("SCRIPT LOAD of the store's script");
        assert_eq!(ours, RedisStore::script_sha1(&policies));
        let script = reference::script(algorithm);
        script
            .prepare_invoke()
            .load_async(conn)
            .await
            .expect("SCRIPT LOAD of a reference script");
    }
}

/// A connection for the bench's own commands: long answers (a `FLUSHALL` of a
/// gigabyte of sorted sets, a fill of 1000 entries) must not time out.
async fn connect(server: &RedisServer) -> MultiplexedConnection {
    let mut conn = server.conn().await;
    conn.set_response_timeout(Duration::from_secs(120));
    conn
}

async fn flushall(conn: &mut MultiplexedConnection) {
    redis::cmd("FLUSHALL")
        .query_async::<()>(conn)
        .await
        .expect("FLUSHALL");
}

/// The store's two-letter code of an algorithm, as its script takes it.
fn code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket => "tb",
        _ => "sl",
    }
}

/// Exactly the `EVALSHA` the store sends for one subject and one policy (see
/// `src/store/redis/script.rs`): one key, then the clock ("s" for Redis `TIME`, or
/// ms), the cost, the operation (`c`, a check), and the policy's code, limit, window,
/// emission interval and shadow flag.
fn store_command(
    store: &RedisStore,
    subject: &Subject,
    policy: &Policy,
    clock: &str,
) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(RedisStore::script_sha1(std::slice::from_ref(policy)))
        .arg(1)
        .arg(store.key(subject, policy))
        .arg(clock)
        .arg(1)
        .arg("c")
        .arg(code(policy.algorithm()))
        .arg(policy.limit())
        .arg(policy.window_ms())
        .arg(policy.emission_interval_us())
        .arg(if policy.is_shadow() { "1" } else { "0" });
    cmd
}

/// The subjects: 12-digit numbers, as `redis-benchmark -r` writes `__rand_int__`.
fn subject(i: usize) -> Subject {
    Subject::new(format!("{i:012}"))
}

/// A script reply's first integer: 1 admitted, 0 denied.
fn admitted(reply: &Value) -> bool {
    match reply {
        Value::Array(items) => matches!(items.first(), Some(Value::Int(1))),
        other => panic!("unexpected script reply {other:?}"),
    }
}

fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

mod throughput {
    use super::*;
    use redlimit::clock::FakeClock;
    use redlimit::Limiter;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::task::JoinSet;

    /// Subjects the calls rotate over (`redis-benchmark -r 1000`).
    const SUBJECTS: usize = 1_000;
    /// One client: each contender's turn, and how many turns each takes.
    const SEQ_TURN: Duration = Duration::from_millis(150);
    const SEQ_ROUNDS: u32 = 11;
    /// Concurrent: each contender's turn, and how many turns each takes.
    const CONC_TURN: Duration = Duration::from_millis(250);
    const CONC_ROUNDS: u32 = 5;
    const TASKS: usize = 64;
    const BENCH_CLIENTS: usize = 50;
    /// The server CPU measurement: calls per run, pipeline depth, runs (the least
    /// counts: a busy neighbour only ever adds).
    const CPU_CALLS: u64 = 20_000;
    const CPU_PIPELINE: usize = 16;
    const CPU_ROUNDS: u32 = 5;
    /// 2026-01-01T00:00:00Z, for the client-clock case.
    const T0_MS: u64 = 1_767_225_600_000;

    #[derive(Clone, Copy, PartialEq)]
    enum Clock {
        /// Redis `TIME`, the store's default.
        Redis,
        /// A client clock stopped at this ms (the arguments of every call are fixed,
        /// so `redis-benchmark` can send them too).
        Fixed(u64),
    }

    impl Clock {
        fn arg(self) -> String {
            match self {
                Clock::Redis => "s".to_owned(),
                Clock::Fixed(ms) => ms.to_string(),
            }
        }
    }

    struct Case {
        label: &'static str,
        policy: Policy,
        clock: Clock,
        /// Fill every subject's state (cost = limit) on this clock before each turn.
        prefill: Option<Clock>,
        /// Whether every call is admitted (else every call is denied).
        admits: bool,
        /// One of the four algorithms' rows: compared with the seed's layout, and
        /// counted in slowest / fastest.
        main: bool,
    }

    fn cases() -> Vec<Case> {
        let minute = Duration::from_secs(60);
        let p = |r: Result<Policy, redlimit::PolicyError>| r.expect("valid bench policy");
        vec![
            Case {
                label: "fixed window",
                policy: p(Policy::fixed_window("bench", 1_000_000, minute)),
                clock: Clock::Redis,
                prefill: None,
                admits: true,
                main: true,
            },
            Case {
                label: "sliding window",
                policy: p(Policy::sliding_window("bench", 1_000_000, minute)),
                clock: Clock::Redis,
                prefill: None,
                admits: true,
                main: true,
            },
            Case {
                label: "token bucket",
                policy: p(Policy::token_bucket("bench", 1_000_000, 1_000_000, minute)),
                clock: Clock::Redis,
                prefill: None,
                admits: true,
                main: true,
            },
            Case {
                label: "sliding log",
                policy: p(Policy::sliding_log("bench", 1_000, minute)),
                clock: Clock::Redis,
                prefill: None,
                admits: true,
                main: true,
            },
            Case {
                label: "sliding log, full ring of 1000, admitted",
                policy: p(Policy::sliding_log("bench", 1_000, Duration::from_secs(1))),
                clock: Clock::Fixed(T0_MS + 1_000),
                prefill: Some(Clock::Fixed(T0_MS)),
                admits: true,
                main: false,
            },
            Case {
                label: "sliding log, full ring of 1000, denied",
                policy: p(Policy::sliding_log("bench", 1_000, minute)),
                clock: Clock::Redis,
                prefill: Some(Clock::Redis),
                admits: false,
                main: false,
            },
        ]
    }

    fn store(server: &RedisServer, clock: Clock) -> RedisStore {
        let store = RedisStore::new(server.pool()).timeout(Duration::from_secs(5));
        match clock {
            Clock::Redis => store,
            Clock::Fixed(ms) => store.client_clock(FakeClock::new(ms)),
        }
    }

    /// Empties Redis and fills the states the case starts from.
    async fn prepare(server: &RedisServer, conn: &mut MultiplexedConnection, case: &Case) {
        flushall(conn).await;
        if let Some(clock) = case.prefill {
            let limiter = Limiter::new(store(server, clock), case.policy.clone());
            let cost = u32::try_from(case.policy.limit()).expect("small limit");
            for i in 0..SUBJECTS {
                let d = limiter.check(subject(i), cost).await.expect("prefill");
                assert!(d.is_allowed(), "prefill admitted");
            }
        }
    }

    fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        match values.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        }
    }

    /// A contender's rate in each of its turns.
    #[derive(Default, Clone)]
    struct Tally {
        rates: Vec<f64>,
        calls: u64,
        cpu_ns: u64,
    }

    impl Tally {
        /// Adds this process's CPU time over a turn of `calls` calls.
        fn cpu(&mut self, calls: u64, cpu_ns: u64) {
            self.calls += calls;
            self.cpu_ns += cpu_ns;
        }
        /// This process's CPU per call over the turns, in µs.
        fn cpu_us(&self) -> f64 {
            self.cpu_ns as f64 / 1_000.0 / self.calls.max(1) as f64
        }
        fn add(&mut self, calls: u64, time: Duration) {
            self.rates.push(calls as f64 / time.as_secs_f64());
        }
        /// The median turn: a turn that a neighbour's burst slowed does not count
        /// more than any other.
        fn rate(&self) -> f64 {
            median(self.rates.clone())
        }
        /// The median of the per-round ratios to `other`'s turns of the same rounds.
        fn ratio(&self, other: &Tally) -> f64 {
            median(
                self.rates
                    .iter()
                    .zip(&other.rates)
                    .map(|(a, b)| a / b)
                    .collect(),
            )
        }
    }

    async fn store_sequential(
        limiter: &Limiter<RedisStore>,
        subjects: &[Subject],
        admits: bool,
    ) -> (u64, Duration) {
        let start = Instant::now();
        let mut calls = 0;
        while start.elapsed() < SEQ_TURN {
            let s = subjects[calls % SUBJECTS].clone();
            let d = limiter.check(s, 1).await.expect("store call");
            assert_eq!(d.is_allowed(), admits);
            calls += 1;
        }
        (calls as u64, start.elapsed())
    }

    async fn bare_sequential(
        conn: &mut MultiplexedConnection,
        cmds: &[redis::Cmd],
        admits: bool,
    ) -> (u64, Duration) {
        let start = Instant::now();
        let mut calls = 0;
        while start.elapsed() < SEQ_TURN {
            let reply: Value = cmds[calls % SUBJECTS]
                .query_async(conn)
                .await
                .expect("bare EVALSHA");
            assert_eq!(admitted(&reply), admits);
            calls += 1;
        }
        (calls as u64, start.elapsed())
    }

    /// The seed's script, one call at a time (built per call: the sorted set needs a
    /// unique request id).
    async fn seed_sequential(
        conn: &mut MultiplexedConnection,
        keys: &[String],
        case: &Case,
        next_id: &mut u64,
    ) -> (u64, Duration) {
        let clock = case.clock.arg();
        let start = Instant::now();
        let mut calls = 0;
        while start.elapsed() < SEQ_TURN {
            *next_id += 1;
            let cmd = reference::command(
                case.policy.algorithm(),
                &keys[calls % SUBJECTS],
                &clock,
                1,
                &case.policy,
                *next_id,
            );
            let reply: Value = cmd.query_async(conn).await.expect("seed EVALSHA");
            assert_eq!(admitted(&reply), case.admits);
            calls += 1;
        }
        (calls as u64, start.elapsed())
    }

    /// Runs `TASKS` copies of `call` until the turn ends: the number of calls made,
    /// the time, and this process's CPU time meanwhile (ns).
    async fn concurrent<F, Fut>(call: F) -> (u64, Duration, u64)
    where
        F: Fn(usize) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let done = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let cpu = machine::process_cpu_ns();
        let start = Instant::now();
        let mut tasks = JoinSet::new();
        for t in 0..TASKS {
            let (done, calls, call) = (Arc::clone(&done), Arc::clone(&calls), call.clone());
            tasks.spawn(async move {
                let mut i = t * (SUBJECTS / TASKS);
                let mut made = 0;
                while !done.load(Ordering::Relaxed) {
                    call(i % SUBJECTS).await;
                    i += 1;
                    made += 1;
                }
                calls.fetch_add(made, Ordering::Relaxed);
            });
        }
        tokio::time::sleep(CONC_TURN).await;
        done.store(true, Ordering::Relaxed);
        // The calls in flight when the turn ends count, and so does their time.
        while let Some(finished) = tasks.join_next().await {
            finished.expect("task");
        }
        let time = start.elapsed();
        let cpu = machine::process_cpu_ns().saturating_sub(cpu);
        (calls.load(Ordering::Relaxed), time, cpu)
    }

    /// `redis-benchmark` sending `args` (with `__rand_int__` in the key) from
    /// `clients` connections, `pipeline` requests at a time (1: no pipelining): its
    /// requests and its own time for them.
    async fn redis_benchmark(
        port: u16,
        clients: usize,
        requests: u64,
        pipeline: usize,
        args: Vec<String>,
    ) -> (u64, Duration) {
        let out = tokio::task::spawn_blocking(move || {
            Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
                .args([
                    "-r",
                    &SUBJECTS.to_string(),
                    "-P",
                    &pipeline.to_string(),
                    "--csv",
                ])
                .args(&args)
                .output()
        })
        .await
        .expect("redis-benchmark task")
        .expect("redis-benchmark on PATH (Debian: apt-get install redis-tools)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("\"EVALSHA"))
            .unwrap_or_else(|| {
                panic!(
                    "redis-benchmark printed no result: {stdout}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        let rps: f64 = line
            .split(',')
            .nth(1)
            .map(|f| f.trim_matches('"'))
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("cannot read redis-benchmark's rps in {line:?}"));
        (requests, Duration::from_secs_f64(requests as f64 / rps))
    }

    /// Checks that `redis-benchmark` wrote the same keys as ours: every key it left
    /// is one of the subjects' keys (a token bucket's keys expire within a
    /// millisecond, so there may be none left to see).
    async fn assert_same_keys(server: &RedisServer, keys: &[String]) {
        let ours: std::collections::HashSet<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        for key in server.keys().await {
            assert!(
                ours.contains(key.as_slice()),
                "redis-benchmark wrote a key that is not a subject's: {}",
                String::from_utf8_lossy(&key)
            );
        }
    }

    /// How many requests `redis-benchmark` gets for a turn of about `turn`, from the
    /// rate the bare loop just reached (redis-benchmark is usually faster).
    fn bench_requests(bare: (u64, Duration), turn: Duration, clients: usize) -> u64 {
        let rate = bare.0 as f64 / bare.1.as_secs_f64();
        ((1.5 * rate * turn.as_secs_f64()) as u64).max(10 * clients as u64)
    }

    #[derive(Default)]
    struct Rates {
        store: Tally,
        bare: Tally,
        bench: Tally,
        seed: Option<Tally>,
    }

    /// Everything one case's turns need, built once.
    struct Setup {
        limiter: Limiter<RedisStore>,
        keys: Vec<String>,
        cmds: Arc<Vec<redis::Cmd>>,
        /// redis-benchmark's arguments: the store's command, subject `__rand_int__`.
        bench_args: Vec<String>,
        /// The same for the seed's script (its request id `__rand_int__` too).
        seed_args: Option<Vec<String>>,
        bare_conn: MultiplexedConnection,
    }

    async fn setup(server: &RedisServer, case: &Case, subjects: &[Subject]) -> Setup {
        let store = store(server, case.clock);
        let limiter = Limiter::new(store.clone(), case.policy.clone());
        let keys: Vec<String> = subjects
            .iter()
            .map(|s| store.key(s, &case.policy))
            .collect();
        let cmds: Vec<redis::Cmd> = subjects
            .iter()
            .map(|s| store_command(&store, s, &case.policy, &case.clock.arg()))
            .collect();
        let random_key = |args: Vec<String>| -> Vec<String> {
            args.into_iter()
                .map(|a| a.replace(&keys[0], &keys[0].replace(&"0".repeat(12), "__rand_int__")))
                .collect()
        };
        let bench_args = random_key(resp_args(&cmds[0].get_packed_command()));
        let seed_args = case.main.then(|| {
            let cmd = reference::command(
                case.policy.algorithm(),
                &keys[0],
                &case.clock.arg(),
                1,
                &case.policy,
                0,
            );
            let mut args = random_key(resp_args(&cmd.get_packed_command()));
            if case.policy.algorithm() == Algorithm::SlidingLog {
                if let Some(id) = args.last_mut() {
                    *id = "__rand_int__".to_owned();
                }
            }
            args
        });
        Setup {
            limiter,
            keys,
            cmds: Arc::new(cmds),
            bench_args,
            seed_args,
            bare_conn: connect(server).await,
        }
    }

    /// The Redis main thread's user CPU time, in seconds.
    async fn main_thread_cpu(conn: &mut MultiplexedConnection) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(conn)
            .await
            .expect("INFO cpu");
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
        };
        field("used_cpu_user_main_thread")
            .or_else(|| field("used_cpu_user"))
            .expect("INFO cpu has used_cpu_user")
    }

    /// The server's CPU per call of `args`: `redis-benchmark -P 16` (pipelined, so
    /// that little of it is network) against the main thread's user time.
    async fn server_cpu_us(
        server: &RedisServer,
        conn: &mut MultiplexedConnection,
        args: &[String],
    ) -> f64 {
        let before = main_thread_cpu(conn).await;
        let (n, _) =
            redis_benchmark(server.port(), 1, CPU_CALLS, CPU_PIPELINE, args.to_vec()).await;
        let after = main_thread_cpu(conn).await;
        (after - before) * 1e6 / n as f64
    }

    pub(crate) async fn run(server: &RedisServer) {
        let mut conn = connect(server).await;
        let subjects: Arc<Vec<Subject>> = Arc::new((0..SUBJECTS).map(subject).collect());
        let cases = cases();
        let mut setups = Vec::new();
        for case in &cases {
            let s = setup(server, case, &subjects).await;
            // A first call opens the store's connection.
            prepare(server, &mut conn, case).await;
            s.limiter.check(subject(0), 1).await.expect("first call");
            setups.push(s);
        }
        let mut sequential: Vec<Rates> = cases
            .iter()
            .map(|c| Rates {
                seed: c.main.then(Tally::default),
                ..Rates::default()
            })
            .collect();
        let mut concurrent_rates: Vec<Rates> = cases.iter().map(|_| Rates::default()).collect();
        let mut seed_id = 0;

        // One client: every case and contender in turn, round after round.
        for round in 0..SEQ_ROUNDS {
            for ((case, s), r) in cases.iter().zip(&mut setups).zip(&mut sequential) {
                // Store and bare loop back to back, in alternating order: their
                // ratio is taken per round, so a slow spell hits both sides.
                let mut bare = (0, Duration::ZERO);
                for side in [round % 2, 1 - round % 2] {
                    prepare(server, &mut conn, case).await;
                    let cpu = machine::process_cpu_ns();
                    if side == 0 {
                        let (n, t) = store_sequential(&s.limiter, &subjects, case.admits).await;
                        r.store.add(n, t);
                        r.store
                            .cpu(n, machine::process_cpu_ns().saturating_sub(cpu));
                    } else {
                        bare = bare_sequential(&mut s.bare_conn, &s.cmds, case.admits).await;
                        r.bare.add(bare.0, bare.1);
                        r.bare
                            .cpu(bare.0, machine::process_cpu_ns().saturating_sub(cpu));
                    }
                }
                prepare(server, &mut conn, case).await;
                let requests = bench_requests(bare, SEQ_TURN, 1);
                let (n, t) =
                    redis_benchmark(server.port(), 1, requests, 1, s.bench_args.clone()).await;
                r.bench.add(n, t);
                if round == 0 {
                    assert_same_keys(server, &s.keys).await;
                }
                if let Some(seed) = &mut r.seed {
                    prepare(server, &mut conn, case).await;
                    let (n, t) =
                        seed_sequential(&mut s.bare_conn, &s.keys, case, &mut seed_id).await;
                    seed.add(n, t);
                }
            }
            eprintln!(
                "throughput: one client, round {} of {SEQ_ROUNDS} done",
                round + 1
            );
        }

        // 64 tasks on one store, 64 tasks on one bare connection, 50 clients.
        for round in 0..CONC_ROUNDS {
            for ((case, s), r) in cases.iter().zip(&setups).zip(&mut concurrent_rates) {
                prepare(server, &mut conn, case).await;
                let (limiter, subjects, admits) =
                    (s.limiter.clone(), Arc::clone(&subjects), case.admits);
                let (n, t, cpu) = concurrent(move |i| {
                    let check = limiter.check(subjects[i].clone(), 1);
                    async move {
                        let d = check.await.expect("store call");
                        assert_eq!(d.is_allowed(), admits);
                    }
                })
                .await;
                r.store.add(n, t);
                r.store.cpu(n, cpu);
                prepare(server, &mut conn, case).await;
                let (bare, cmds) = (s.bare_conn.clone(), Arc::clone(&s.cmds));
                let (n, t, cpu) = concurrent(move |i| {
                    let (mut bare, cmds) = (bare.clone(), Arc::clone(&cmds));
                    async move {
                        let reply: Value =
                            cmds[i].query_async(&mut bare).await.expect("bare EVALSHA");
                        assert_eq!(admitted(&reply), admits);
                    }
                })
                .await;
                r.bare.add(n, t);
                r.bare.cpu(n, cpu);
                prepare(server, &mut conn, case).await;
                let requests = bench_requests((n, t), CONC_TURN, BENCH_CLIENTS);
                let (n, t) = redis_benchmark(
                    server.port(),
                    BENCH_CLIENTS,
                    requests,
                    1,
                    s.bench_args.clone(),
                )
                .await;
                r.bench.add(n, t);
            }
            eprintln!(
                "throughput: 64 tasks, round {} of {CONC_ROUNDS} done",
                round + 1
            );
        }

        // The server's CPU per call, the least of several pipelined runs.
        let mut cpu: Vec<(f64, Option<f64>)> = cases
            .iter()
            .map(|c| (f64::MAX, c.main.then_some(f64::MAX)))
            .collect();
        for _ in 0..CPU_ROUNDS {
            for ((case, s), best) in cases.iter().zip(&setups).zip(&mut cpu) {
                prepare(server, &mut conn, case).await;
                best.0 = best
                    .0
                    .min(server_cpu_us(server, &mut conn, &s.bench_args).await);
                if let (Some(seed_best), Some(args)) = (&mut best.1, &s.seed_args) {
                    prepare(server, &mut conn, case).await;
                    *seed_best = seed_best.min(server_cpu_us(server, &mut conn, args).await);
                }
            }
        }
        eprintln!("throughput: server CPU done");
        report(&cases, &sequential, &concurrent_rates, &cpu);
    }

    /// The arguments of a packed RESP command (`*N\r\n$len\r\narg\r\n...`).
    fn resp_args(packed: &[u8]) -> Vec<String> {
        let text = String::from_utf8_lossy(packed);
        let mut lines = text.split("\r\n");
        let _count = lines.next();
        let mut args = Vec::new();
        while let (Some(len), Some(arg)) = (lines.next(), lines.next()) {
            if len.starts_with('$') {
                args.push(arg.to_owned());
            }
        }
        args
    }

    fn report(
        cases: &[Case],
        sequential: &[Rates],
        concurrent: &[Rates],
        cpu: &[(f64, Option<f64>)],
    ) {
        println!();
        println!("## Throughput (calls/s), one client");
        println!();
        println!(
            "Median of {SEQ_ROUNDS} turns of {} ms per contender; the cases and contenders take their turns \
             in rotation, so a busy neighbour slows them alike, and each ratio is the median of the ratios \
             of the turns of one round (the store and the bare loop back to back, in alternating order). \
             Client CPU: this process's CPU time per call (every thread). {SUBJECTS} subjects in turn; every call on \
             the path shown. The first three columns send the same script, keys and arguments; the seed's \
             layout is our own script of it (`benches/reference/`), in the same bare loop.",
            SEQ_TURN.as_millis()
        );
        println!();
        println!("| algorithm | redlimit `Limiter::check` | bare redis-rs EVALSHA loop | `redis-benchmark -c 1` | redlimit / bare | client CPU per call: redlimit / bare | redlimit / redis-benchmark | seed's layout, bare loop | redlimit / seed's layout |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for (case, r) in cases.iter().zip(sequential) {
            let (seed, vs_seed) = match &r.seed {
                Some(s) => (thousands(s.rate()), format!("{:.2}x", r.store.ratio(s))),
                None => ("—".to_owned(), "—".to_owned()),
            };
            println!(
                "| {} | {} | {} | {} | {:.3}x | {:.1} / {:.1} µs | {:.2}x | {seed} | {vs_seed} |",
                case.label,
                thousands(r.store.rate()),
                thousands(r.bare.rate()),
                thousands(r.bench.rate()),
                r.store.ratio(&r.bare),
                r.store.cpu_us(),
                r.bare.cpu_us(),
                r.store.ratio(&r.bench),
            );
        }
        println!();
        println!("## Throughput (calls/s), concurrent");
        println!();
        println!(
            "Median of {CONC_ROUNDS} turns of {} ms per contender, in rotation, ratios per round as above: {TASKS} tokio tasks on one \
             `RedisStore` (one multiplexed connection), {TASKS} tasks on one bare multiplexed connection, \
             `redis-benchmark -c {BENCH_CLIENTS}` (no pipelining). Client CPU: this process's CPU time \
             (every thread) per call over the turns.",
            CONC_TURN.as_millis()
        );
        println!();
        println!("| algorithm | redlimit, {TASKS} tasks | bare loop, {TASKS} tasks | `redis-benchmark -c {BENCH_CLIENTS}` | redlimit / redis-benchmark | redlimit / bare | client CPU per call: redlimit / bare |");
        println!("|---|---|---|---|---|---|---|");
        for (case, r) in cases.iter().zip(concurrent) {
            println!(
                "| {} | {} | {} | {} | {:.2}x | {:.3}x | {:.1} / {:.1} µs |",
                case.label,
                thousands(r.store.rate()),
                thousands(r.bare.rate()),
                thousands(r.bench.rate()),
                r.store.ratio(&r.bench),
                r.store.ratio(&r.bare),
                r.store.cpu_us(),
                r.bare.cpu_us(),
            );
        }
        println!();
        println!("## Redis CPU per call (µs)");
        println!();
        println!(
            "The Redis main thread's user CPU time over `redis-benchmark -c 1 -P {CPU_PIPELINE} -n {CPU_CALLS}` \
             of each script (pipelined, so little of it is network), the least of {CPU_ROUNDS} runs: \
             what the script itself costs the server, which the round trip hides in the tables above."
        );
        println!();
        println!("| algorithm | redlimit script | seed's layout script | redlimit / seed's |");
        println!("|---|---|---|---|");
        for (case, (ours, seed)) in cases.iter().zip(cpu) {
            let (seed, ratio) = match seed {
                Some(s) => (format!("{s:.1}"), format!("{:.2}x", ours / s)),
                None => ("—".to_owned(), "—".to_owned()),
            };
            println!("| {} | {ours:.1} | {seed} | {ratio} |", case.label);
        }
        println!();
        println!("### Targets");
        println!();
        let main: Vec<(&Case, &Rates, &Rates)> = cases
            .iter()
            .zip(sequential)
            .zip(concurrent)
            .map(|((c, s), k)| (c, s, k))
            .filter(|(c, _, _)| c.main)
            .collect();
        for (case, s, k) in &main {
            let seq = s.store.ratio(&s.bare);
            let conc = k.store.ratio(&k.bench);
            println!(
                "- {}: one client {seq:.3}x the bare loop (target >= 0.95x: {}); {TASKS} tasks {conc:.2}x \
                 `redis-benchmark -c {BENCH_CLIENTS}` (target >= 1.5x: {})",
                case.label,
                met(seq >= 0.95),
                met(conc >= 1.5)
            );
        }
        let spread = |values: Vec<f64>| {
            let max = values.iter().cloned().fold(f64::MIN, f64::max);
            let min = values.iter().cloned().fold(f64::MAX, f64::min);
            max / min
        };
        let seq_spread = spread(main.iter().map(|(_, s, _)| s.store.rate()).collect());
        let conc_spread = spread(main.iter().map(|(_, _, k)| k.store.rate()).collect());
        let cpu_spread = spread(
            cases
                .iter()
                .zip(cpu)
                .filter(|(c, _)| c.main)
                .map(|(_, (ours, _))| *ours)
                .collect(),
        );
        println!(
            "- fastest / slowest algorithm: {seq_spread:.2}x one client, {conc_spread:.2}x {TASKS} tasks \
             (target <= 1.15x: {}, {}; the seed: 1.42x); {cpu_spread:.2}x in Redis CPU per call",
            met(seq_spread <= 1.15),
            met(conc_spread <= 1.15)
        );
    }
}

mod memory {
    use super::*;
    use redlimit::clock::FakeClock;
    use redlimit::Limiter;
    use std::sync::Arc;
    use tokio::task::JoinSet;

    /// 2026-01-01T00:00:00Z: realistic numbers in the states, aligned to every window.
    const START_MS: u64 = 1_767_225_600_000;
    const SUBJECTS: usize = 100_000;
    const LOG_SUBJECTS: usize = 10_000;
    /// The seed's sorted sets: 2 000 subjects of 1 000 entries. The figure per subject
    /// does not depend on the count (a key costs under 100 B of the 96 KB), and
    /// 10 000 took 90 s to fill on a 2-core machine: Redis inserts each entry.
    const SEED_LOG_SUBJECTS: usize = 2_000;
    const WORKERS: usize = 32;
    /// `MB` as the seed counts it (its 53.4 MB is 56 B x 1 million in MiB).
    const MB: f64 = 1_048_576.0;

    async fn used_memory(conn: &mut MultiplexedConnection) -> i64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(conn)
            .await
            .expect("INFO memory");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("INFO memory has used_memory")
    }

    async fn dbsize(conn: &mut MultiplexedConnection) -> usize {
        redis::cmd("DBSIZE")
            .query_async(conn)
            .await
            .expect("DBSIZE")
    }

    /// Bytes and keys per subject after each pass (pass k one window after pass k-1).
    #[derive(Debug, Clone, Copy)]
    struct Figure {
        bytes: f64,
        keys: f64,
    }

    /// Which layout is measured.
    #[derive(Clone, Copy, PartialEq)]
    enum Layout {
        Ours,
        Seed,
    }

    /// `subjects` subjects each spend `cost` under `policy`, `passes` times one window
    /// apart, on a client clock starting at a window boundary: every key lives at
    /// least a window in real time, so none expires while the figures are taken.
    async fn measure(
        server: &RedisServer,
        layout: Layout,
        policy: &Policy,
        cost: u64,
        subjects: usize,
        passes: u64,
    ) -> Vec<Figure> {
        let mut conn = connect(server).await;
        let clock = FakeClock::new(START_MS);
        let store = RedisStore::new(server.pool())
            .timeout(Duration::from_secs(30))
            .client_clock(clock.clone());
        let limiter = Limiter::new(store.clone(), policy.clone());
        let seed_conn = connect(server).await;
        // Open the store's connection before the baseline.
        limiter.check("warm-up", 1).await.expect("warm-up");
        flushall(&mut conn).await;
        let before = used_memory(&mut conn).await;
        let mut figures = Vec::new();
        let next_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for pass in 0..passes {
            let now = START_MS + pass * policy.window_ms();
            clock.set_ms(now);
            let mut tasks = JoinSet::new();
            for w in 0..WORKERS {
                let limiter = limiter.clone();
                let mut seed_conn = seed_conn.clone();
                let policy = policy.clone();
                let store = store.clone();
                let next_id = Arc::clone(&next_id);
                tasks.spawn(async move {
                    for i in (w..subjects).step_by(WORKERS) {
                        let allowed = match layout {
                            Layout::Ours => limiter
                                .check(subject(i), u32::try_from(cost).expect("small cost"))
                                .await
                                .expect("store call")
                                .is_allowed(),
                            Layout::Seed => {
                                let id = next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let cmd = reference::command(
                                    policy.algorithm(),
                                    &store.key(&subject(i), &policy),
                                    &now.to_string(),
                                    cost,
                                    &policy,
                                    id,
                                );
                                let reply: Value =
                                    cmd.query_async(&mut seed_conn).await.expect("seed call");
                                admitted(&reply)
                            }
                        };
                        assert!(allowed, "every fill call is admitted");
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("fill task");
            }
            let after = used_memory(&mut conn).await;
            let keys = dbsize(&mut conn).await;
            figures.push(Figure {
                bytes: (after - before) as f64 / subjects as f64,
                keys: keys as f64 / subjects as f64,
            });
        }
        flushall(&mut conn).await;
        figures
    }

    struct Row {
        label: &'static str,
        subjects: usize,
        seed_subjects: usize,
        ours: Figure,
        seed: Figure,
        seed_layout: &'static str,
    }

    pub(crate) async fn run(server: &RedisServer) {
        let started = Instant::now();
        let minute = Duration::from_secs(60);
        let fixed = Policy::fixed_window("api", 1_000, minute).expect("policy");
        let sliding = Policy::sliding_window("api", 1_000, minute).expect("policy");
        let bucket = Policy::token_bucket("api", 1_000, 1_000, minute).expect("policy");
        let log = Policy::sliding_log("api", 1_000, minute).expect("policy");

        let mut rows = Vec::new();
        for (policy, label_one, label_two) in [
            (
                &fixed,
                "fixed window, one window",
                "fixed window, two consecutive windows",
            ),
            (
                &sliding,
                "sliding window, one window",
                "sliding window, two consecutive windows",
            ),
        ] {
            let ours = measure(server, Layout::Ours, policy, 1, SUBJECTS, 2).await;
            let seed = measure(server, Layout::Seed, policy, 1, SUBJECTS, 2).await;
            let layout = reference::name(policy.algorithm());
            rows.push(Row {
                label: label_one,
                subjects: SUBJECTS,
                seed_subjects: SUBJECTS,
                ours: ours[0],
                seed: seed[0],
                seed_layout: layout,
            });
            rows.push(Row {
                label: label_two,
                subjects: SUBJECTS,
                seed_subjects: SUBJECTS,
                ours: ours[1],
                seed: seed[1],
                seed_layout: layout,
            });
            eprintln!(
                "memory: {label_two} done at {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        // An emptied bucket (cost 1000): its state lives the minute it takes to refill.
        let ours = measure(server, Layout::Ours, &bucket, 1_000, SUBJECTS, 1).await;
        let seed = measure(server, Layout::Seed, &bucket, 1_000, SUBJECTS, 1).await;
        rows.push(Row {
            label: "token bucket, emptied (cost 1000)",
            subjects: SUBJECTS,
            seed_subjects: SUBJECTS,
            ours: ours[0],
            seed: seed[0],
            seed_layout: reference::name(Algorithm::TokenBucket),
        });
        eprintln!(
            "memory: token bucket done at {:.0} s",
            started.elapsed().as_secs_f64()
        );
        // A full log: 1 000 admitted requests in the window.
        let ours = measure(server, Layout::Ours, &log, 1_000, LOG_SUBJECTS, 1).await;
        eprintln!(
            "memory: our sliding log done at {:.0} s",
            started.elapsed().as_secs_f64()
        );
        let seed = measure(server, Layout::Seed, &log, 1_000, SEED_LOG_SUBJECTS, 1).await;
        rows.push(Row {
            label: "sliding log, full (1000 admitted in the window)",
            subjects: LOG_SUBJECTS,
            seed_subjects: SEED_LOG_SUBJECTS,
            ours: ours[0],
            seed: seed[0],
            seed_layout: reference::name(Algorithm::SlidingLog),
        });
        eprintln!(
            "memory: sliding log done at {:.0} s",
            started.elapsed().as_secs_f64()
        );
        report(&rows);
    }

    fn report(rows: &[Row]) {
        println!();
        println!("## Redis memory per subject");
        println!();
        println!(
            "`used_memory` delta / subjects, one policy per subject at 1000 per minute, `FLUSHALL` between \
             measurements; keys named `rl:{{<12-digit subject>}}:api:<code>` for both layouts (the seed's \
             window scripts append the window number)."
        );
        println!();
        println!("| state | subjects | redlimit B/subject | keys/subject | seed's layout | subjects | B/subject | keys/subject | redlimit / seed's |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {} | {:.1} | {:.0} | {} | {} | {:.1} | {:.0} | {:.2}x |",
                r.label,
                thousands(r.subjects as f64),
                r.ours.bytes,
                r.ours.keys,
                r.seed_layout,
                thousands(r.seed_subjects as f64),
                r.seed.bytes,
                r.seed.keys,
                r.ours.bytes / r.seed.bytes,
            );
        }
        let find = |label: &str| {
            rows.iter()
                .find(|r| r.label.starts_with(label))
                .expect("row")
        };
        let fixed = find("fixed window, one").ours.bytes;
        let sliding = find("sliding window, one").ours.bytes;
        let bucket = find("token bucket").ours.bytes;
        let log = find("sliding log").ours.bytes;
        println!();
        println!("### Targets");
        println!();
        // `used_memory` moves by a few bytes per 100 000 keys between identical runs.
        let jitter = 1.0;
        println!(
            "- token bucket {bucket:.1} B <= fixed window {fixed:.1} B (within {jitter} B of jitter): {}",
            met(bucket <= fixed + jitter)
        );
        println!(
            "- sliding window {sliding:.1} B <= fixed window {fixed:.1} B (within {jitter} B of jitter): {}",
            met(sliding <= fixed + jitter)
        );
        println!(
            "- sliding log at limit 1000 {} B < 8,500 B: {} ({:.1} B per admitted request; the seed's sorted set here: {:.1} B)",
            thousands(log),
            met(log < 8_500.0),
            log / 1_000.0,
            find("sliding log").seed.bytes / 1_000.0
        );

        println!();
        println!("## 1 million users at 1,000 per minute");
        println!();
        println!("The per-subject figures above x 1,000,000, in MB as the seed counts them (MiB).");
        println!();
        println!("| algorithm | the seed's document | seed's layout, measured here | redlimit, measured here | redlimit / seed's layout |");
        println!("|---|---|---|---|---|");
        let mb = |b: f64| {
            let v = b * 1e6 / MB;
            if v >= 1_000.0 {
                thousands(v)
            } else {
                format!("{v:.1}")
            }
        };
        for (label, row, doc) in [
            ("fixed window (one window)", "fixed window, one", "53.4"),
            (
                "fixed window (steady: two windows)",
                "fixed window, two",
                "—",
            ),
            ("sliding window (one window)", "sliding window, one", "—"),
            (
                "sliding window (steady: two windows)",
                "sliding window, two",
                "—",
            ),
            ("token bucket", "token bucket", "68.7"),
            ("sliding log (full)", "sliding log", "87,913.5"),
        ] {
            let r = find(row);
            println!(
                "| {label} | {doc} | {} | {} | {:.2}x |",
                mb(r.seed.bytes),
                mb(r.ours.bytes),
                r.ours.bytes / r.seed.bytes
            );
        }
    }
}

/// A flood from one subject beside everyone else's traffic: what the block cache keeps
/// for the others (issue 5: at least 0.9x their throughput without the flood).
mod flood {
    use super::*;
    use redlimit::Limiter;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::task::JoinSet;

    /// Everyone else: 64 tasks over 10,000 subjects, as many calls as they get answered.
    const OTHERS: usize = 64;
    const SUBJECTS: usize = 10_000;
    /// The flood: 64 tasks, each sending a burst of the one subject's calls every
    /// millisecond, sized so that the flood is a multiple of everyone else's rate.
    const FLOODERS: usize = 64;
    const TURN: Duration = Duration::from_millis(500);
    const ROUNDS: u32 = 5;
    /// 100 per minute: the others stay far below it, the flooder is over it from the
    /// start of each turn.
    const LIMIT: u32 = 100;

    #[derive(Clone, Copy, PartialEq)]
    struct Variant {
        /// The flood's rate as a multiple of everyone else's rate without it (0: none).
        times: u32,
        block_cache: bool,
    }

    impl Variant {
        fn label(self) -> String {
            match (self.times, self.block_cache) {
                (0, _) => "no flood".to_owned(),
                (n, true) => format!("flood of {n}x everyone else's rate, block cache on"),
                (n, false) => format!("flood of {n}x everyone else's rate, no block cache"),
            }
        }
    }

    struct Turn {
        others: u64,
        flood: u64,
        redis_calls: u64,
        time: Duration,
    }

    async fn evalsha_calls(conn: &mut MultiplexedConnection) -> u64 {
        support::command_calls(conn)
            .await
            .get("evalsha")
            .copied()
            .unwrap_or(0)
    }

    /// One turn of `variant`; `burst` is each flood task's calls per millisecond.
    async fn turn(
        server: &RedisServer,
        conn: &mut MultiplexedConnection,
        variant: Variant,
        burst: u64,
    ) -> Turn {
        flushall(conn).await;
        let policy =
            Policy::sliding_window("flood", LIMIT, Duration::from_secs(60)).expect("policy");
        let store = RedisStore::new(server.pool()).timeout(Duration::from_secs(5));
        let mut limiter = Limiter::new(store, policy);
        if variant.block_cache {
            limiter = limiter.block_cache(10_000);
        }
        let limiter = Arc::new(limiter);
        let flooder = Subject::new("flooder");
        // Over the limit before the turn starts.
        for _ in 0..=LIMIT {
            limiter
                .check(flooder.clone(), 1)
                .await
                .expect("fill the flooder");
        }
        let done = Arc::new(AtomicBool::new(false));
        let (others, flood) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let before = evalsha_calls(conn).await;
        let start = Instant::now();
        let mut tasks = JoinSet::new();
        for t in 0..OTHERS {
            let (limiter, done, others) =
                (Arc::clone(&limiter), Arc::clone(&done), Arc::clone(&others));
            tasks.spawn(async move {
                let mut i = t * (SUBJECTS / OTHERS);
                while !done.load(Ordering::Relaxed) {
                    let d = limiter
                        .check(subject(i % SUBJECTS), 1)
                        .await
                        .expect("check");
                    assert!(d.is_allowed(), "everyone else stays under the limit");
                    i += 1;
                    others.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        if variant.times > 0 {
            for _ in 0..FLOODERS {
                let (limiter, done, flood, flooder) = (
                    Arc::clone(&limiter),
                    Arc::clone(&done),
                    Arc::clone(&flood),
                    flooder.clone(),
                );
                tasks.spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(1));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    while !done.load(Ordering::Relaxed) {
                        tick.tick().await;
                        for _ in 0..burst {
                            let d = limiter.check(flooder.clone(), 1).await.expect("check");
                            assert!(!d.is_allowed(), "the flooder is over its limit");
                            flood.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        }
        tokio::time::sleep(TURN).await;
        done.store(true, Ordering::Relaxed);
        while let Some(finished) = tasks.join_next().await {
            finished.expect("task");
        }
        let time = start.elapsed();
        let redis_calls = evalsha_calls(conn).await - before;
        let others = others.load(Ordering::Relaxed);
        Turn {
            others,
            flood: flood.load(Ordering::Relaxed),
            // The flood's share: every call of the others is one EVALSHA.
            redis_calls: redis_calls.saturating_sub(others),
            time,
        }
    }

    fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }

    fn rate(n: u64, t: Duration) -> f64 {
        n as f64 / t.as_secs_f64()
    }

    pub async fn run(server: &RedisServer) {
        let mut conn = connect(server).await;
        let quiet = Variant {
            times: 0,
            block_cache: true,
        };
        // Everyone else's rate without a flood sizes the floods.
        let calibration = turn(server, &mut conn, quiet, 0).await;
        let others_rate = rate(calibration.others, calibration.time);
        let variants = [
            quiet,
            Variant {
                times: 1,
                block_cache: true,
            },
            Variant {
                times: 10,
                block_cache: true,
            },
            Variant {
                times: 1,
                block_cache: false,
            },
        ];
        let burst = |v: &Variant| {
            (f64::from(v.times) * others_rate / 1_000.0 / FLOODERS as f64).ceil() as u64
        };
        let mut turns: Vec<Vec<Turn>> = variants.iter().map(|_| Vec::new()).collect();
        for round in 0..ROUNDS {
            // In rotation, starting from a different variant each round.
            for k in 0..variants.len() {
                let v = (k + round as usize) % variants.len();
                let t = turn(server, &mut conn, variants[v], burst(&variants[v])).await;
                turns[v].push(t);
            }
            eprintln!("flood: round {} of {ROUNDS} done", round + 1);
        }
        let quiet_rates: Vec<f64> = turns[0].iter().map(|t| rate(t.others, t.time)).collect();
        println!("\n## Flood from one subject\n");
        println!(
            "{OTHERS} tasks over {SUBJECTS} subjects (everyone else) on one `RedisStore`, sliding window {LIMIT} per minute, as many calls as they get answered. A flood: {FLOODERS} more tasks, each sending a burst of the one over-limit subject's calls every millisecond, sized from everyone else's rate in a first turn without flood ({} calls/s). {ROUNDS} turns of {} ms per variant, in rotation; rates are medians of turns, a ratio the median of each round's ratio to that round's turn without flood. The flood's calls reaching Redis: `INFO commandstats` EVALSHA calls in the turn minus those of everyone else.\n",
            thousands(others_rate),
            TURN.as_millis()
        );
        println!("| variant | everyone else, calls/s | vs no flood | flood, calls/s | flood's calls reaching Redis, per s |");
        println!("|---|---|---|---|---|");
        let mut targets = Vec::new();
        for (v, variant) in variants.iter().enumerate() {
            let others = median(turns[v].iter().map(|t| rate(t.others, t.time)).collect());
            let ratio = median(
                turns[v]
                    .iter()
                    .zip(&quiet_rates)
                    .map(|(t, q)| rate(t.others, t.time) / q)
                    .collect(),
            );
            let flood = median(turns[v].iter().map(|t| rate(t.flood, t.time)).collect());
            let redis = median(
                turns[v]
                    .iter()
                    .map(|t| rate(t.redis_calls, t.time))
                    .collect(),
            );
            if variant.times > 0 && variant.block_cache {
                targets.push((variant.times, ratio));
            }
            println!(
                "| {} | {} | {ratio:.3}x | {} | {} |",
                variant.label(),
                thousands(others),
                thousands(flood),
                thousands(redis)
            );
        }
        println!("\n### Target\n");
        for (times, ratio) in targets {
            println!(
                "- everyone else under a flood of {times}x their rate, block cache on: {ratio:.3}x their rate without it (target >= 0.9x: {})",
                met(ratio >= 0.9)
            );
        }
    }
}

/// HTTP end to end: a hello-world axum app bare, with `RateLimitLayer` on the memory
/// store, on the Redis store, and with `tower_governor`, under one load generator.
///
/// The server runs on its own tokio runtime (two workers, as an app would); the load
/// generator on another thread with a current-thread runtime: `CONNECTIONS` HTTP/1.1
/// keep-alive connections, each sending its next request when the last answer is
/// read, for a fixed time. Every variant keys on the client IP (all requests come from
/// 127.0.0.1: one hot subject) with a limit no request reaches, so every request takes
/// the allowed path; the generator checks the status and, for the layers, that the
/// decision's headers are there (no store failure let a request pass unchecked).
mod http {
    use super::*;
    use axum::routing::get;
    use axum::Router;
    use http_body_util::{BodyExt, Empty};
    use redlimit::key::ClientIp;
    use redlimit::{Limiter, MemoryStore, RateLimitLayer};
    use std::net::SocketAddr;

    const CONNECTIONS: usize = 32;
    const TURN: Duration = Duration::from_millis(1_000);
    const WARM_UP: Duration = Duration::from_millis(150);
    const ROUNDS: u32 = 5;
    /// Two variants closer than this are a tie: turns of one variant differ by more.
    const TIE: f64 = 0.02;

    fn app() -> Router {
        Router::new().route("/", get(|| async { "Hello, World!" }))
    }

    fn policy() -> Policy {
        Policy::sliding_window("http", 1_000_000_000, Duration::from_secs(1)).expect("policy")
    }

    /// The variants: name, whether responses carry the layer's headers, and the app.
    fn variants(server: &RedisServer) -> Vec<(&'static str, bool, Router)> {
        let mut governor = tower_governor::governor::GovernorConfigBuilder::default();
        governor.per_nanosecond(1).burst_size(u32::MAX);
        let governor = governor.finish().expect("tower_governor config");
        vec![
            ("bare axum", false, app()),
            (
                "RateLimitLayer, memory store",
                true,
                app().layer(RateLimitLayer::new(
                    Limiter::new(MemoryStore::new(), policy()),
                    ClientIp::new(),
                )),
            ),
            (
                "RateLimitLayer, memory store, headers_on_allowed(false)",
                false,
                app().layer(
                    RateLimitLayer::new(
                        Limiter::new(MemoryStore::new(), policy()),
                        ClientIp::new(),
                    )
                    .headers_on_allowed(false),
                ),
            ),
            (
                "RateLimitLayer, Redis store",
                true,
                app().layer(RateLimitLayer::new(
                    Limiter::new(
                        RedisStore::new(server.pool()).timeout(Duration::from_secs(1)),
                        policy(),
                    ),
                    ClientIp::new(),
                )),
            ),
            (
                "tower_governor 0.8",
                false,
                app().layer(tower_governor::GovernorLayer::new(governor)),
            ),
        ]
    }

    /// What one turn of load measured.
    #[derive(Default)]
    struct Load {
        requests: u64,
        time: Duration,
        /// Microseconds per request, unsorted.
        latencies: Vec<u32>,
        /// Answers without the layer's headers where they were expected.
        unchecked: u64,
    }

    /// `CONNECTIONS` connections sending requests to `addr` for `turn`.
    fn load(addr: SocketAddr, turn: Duration, headers: bool) -> Load {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("generator runtime");
            rt.block_on(async move {
                let start = Instant::now();
                let deadline = start + turn;
                let mut tasks = tokio::task::JoinSet::new();
                for _ in 0..CONNECTIONS {
                    tasks.spawn(async move {
                        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
                        stream.set_nodelay(true).expect("nodelay");
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                            .await
                            .expect("handshake");
                        tokio::spawn(conn);
                        let mut latencies = Vec::with_capacity(16_384);
                        let mut unchecked = 0;
                        while Instant::now() < deadline {
                            let sent = Instant::now();
                            sender.ready().await.expect("connection ready");
                            let request = ::http::Request::builder()
                                .uri("/")
                                .header("host", "127.0.0.1")
                                .body(Empty::<bytes::Bytes>::new())
                                .expect("request");
                            let response = sender.send_request(request).await.expect("response");
                            assert_eq!(response.status(), ::http::StatusCode::OK);
                            if headers && !response.headers().contains_key("ratelimit") {
                                unchecked += 1;
                            }
                            response.into_body().collect().await.expect("body");
                            latencies.push(
                                u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX),
                            );
                        }
                        (latencies, unchecked)
                    });
                }
                let mut total = Load::default();
                while let Some(done) = tasks.join_next().await {
                    let (latencies, unchecked) = done.expect("connection task");
                    total.requests += latencies.len() as u64;
                    total.latencies.extend(latencies);
                    total.unchecked += unchecked;
                }
                total.time = start.elapsed();
                total
            })
        })
        .join()
        .expect("generator thread")
    }

    fn percentile(sorted: &[u32], p: f64) -> f64 {
        if sorted.is_empty() {
            return f64::NAN;
        }
        let i = ((sorted.len() - 1) as f64 * p).round() as usize;
        f64::from(sorted[i]) / 1_000.0
    }

    pub(crate) fn run(server: &RedisServer) {
        let server_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        let mut served = Vec::new();
        for (name, headers, router) in variants(server) {
            let listener = server_rt
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .expect("bind a loopback port");
            let addr = listener.local_addr().expect("local address");
            server_rt.spawn(async move {
                axum::serve(
                    listener,
                    router.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .await
                .expect("serve");
            });
            served.push((name, headers, addr));
        }
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); served.len()];
        let mut latencies: Vec<Vec<u32>> = vec![Vec::new(); served.len()];
        let mut unchecked = vec![0; served.len()];
        for round in 0..ROUNDS {
            for (i, (_, headers, addr)) in served.iter().enumerate() {
                load(*addr, WARM_UP, *headers);
                let turn = load(*addr, TURN, *headers);
                rates[i].push(turn.requests as f64 / turn.time.as_secs_f64());
                latencies[i].extend(turn.latencies);
                unchecked[i] += turn.unchecked;
            }
            eprintln!("http: round {} of {ROUNDS} done", round + 1);
        }
        drop(server_rt);

        println!();
        println!("## HTTP end to end");
        println!();
        println!(
            "A hello-world axum 0.8 app on loopback, served with connect info on a 2-worker tokio runtime; \
             a Rust load generator in the same process (hyper 1 client, one thread): {CONNECTIONS} keep-alive \
             connections, one request in flight each, {ROUNDS} turns of {} ms per variant in rotation. \
             Requests/s is the median turn, a ratio the median of the ratios of one round's turns; latencies over every request of the variant. Every variant keys \
             on the client IP; the limits admit everything.",
            TURN.as_millis()
        );
        println!();
        println!("| variant | requests/s (median) | slowest / fastest turn | vs bare | p50 latency | p99 latency | answers without the layer's headers |");
        println!("|---|---|---|---|---|---|---|");
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        // The median of the per-round ratios of variant `a` to variant `b`.
        let ratio = |a: usize, b: usize| {
            let per_round: Vec<f64> = rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect();
            median(&per_round)
        };
        for (i, (name, headers, _)) in served.iter().enumerate() {
            latencies[i].sort_unstable();
            let rate = median(&rates[i]);
            let slowest = rates[i].iter().cloned().fold(f64::MAX, f64::min);
            let fastest = rates[i].iter().cloned().fold(f64::MIN, f64::max);
            println!(
                "| {name} | {} | {} / {} | {:.3}x | {:.2} ms | {:.2} ms | {} |",
                thousands(rate),
                thousands(slowest),
                thousands(fastest),
                ratio(i, 0),
                percentile(&latencies[i], 0.50),
                percentile(&latencies[i], 0.99),
                if *headers {
                    unchecked[i].to_string()
                } else {
                    "—".to_owned()
                },
            );
        }
        let (memory, quiet, redis, governor) = (ratio(1, 0), ratio(2, 0), ratio(3, 0), ratio(4, 0));
        let (memory_vs_governor, quiet_vs_governor) = (ratio(1, 4), ratio(2, 4));
        println!();
        println!("### Targets");
        println!();
        println!(
            "- memory store {memory:.3}x bare (target >= 0.95x: {}); {memory_vs_governor:.3}x tower_governor \
             (target: not behind it, a tie within {:.0}%: {}); tower_governor itself: {governor:.3}x bare",
            met(memory >= 0.95),
            TIE * 100.0,
            met(memory_vs_governor >= 1.0 - TIE)
        );
        println!(
            "- memory store without headers on allowed answers (as tower_governor by default): {quiet:.3}x bare, \
             {quiet_vs_governor:.3}x tower_governor"
        );
        println!(
            "- Redis store {redis:.3}x bare (target >= 0.6x: {})",
            met(redis >= 0.6)
        );
    }
}
