//! Throughput: each algorithm through `Limiter::check` on a `RedisStore`, beside a bare
//! redis-rs loop sending the store's own command (`RedisStore::command`, so the bench
//! cannot drift from the store's wire format) and beside the smallest scripts that make
//! the same decision (`benches/reference/`).
//!
//! - [`one_client`]: one call at a time, with `redis-benchmark -c 1` and the common's
//!   layouts.
//! - [`concurrent`]: 64 tasks on one multiplexed connection over 100,000 subjects, with
//!   Redis CPU per decision, against the smallest fixed-window script of the same run
//!   (and that script batched as many decisions a call as the store's calls carry),
//!   and `redis-benchmark -c 20 -P 16` of each script for the server's cost.

mod concurrent;
mod one_client;

use crate::helpers::*;
use crate::support::RedisServer;
use redlimit::internals::SubjectInternals;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::task::JoinSet;

pub(crate) async fn run(server: &RedisServer) {
    one_client::run(server).await;
    machine::print_load();
    concurrent::run(server).await;
}

/// A contender's rate in each of its turns, and what each turn cost.
#[derive(Default, Clone)]
struct Tally {
    rates: Vec<f64>,
    /// Redis main-thread CPU per call of each turn, in µs (when measured).
    redis_cpu: Vec<f64>,
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
    /// The median turn's Redis CPU per call, in µs.
    fn redis_cpu_us(&self) -> f64 {
        median(self.redis_cpu.clone())
    }
    /// The median of the per-round ratios of Redis CPU per call to `other`'s.
    fn redis_cpu_ratio(&self, other: &Tally) -> f64 {
        median(
            self.redis_cpu
                .iter()
                .zip(&other.redis_cpu)
                .map(|(a, b)| a / b)
                .collect(),
        )
    }
}

/// Runs `tasks` copies of `call` for `turn`, task `t` starting at subject
/// `t * subjects / tasks`: the number of calls made, the time, and this process's CPU
/// time meanwhile (ns).
async fn concurrent_turn<F, Fut>(
    tasks: usize,
    subjects: usize,
    turn: Duration,
    call: F,
) -> (u64, Duration, u64)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    concurrent_turn_by(tasks, subjects, 1, turn, call).await
}

/// [`concurrent_turn`] for calls of `stride` subjects each: a task's next call starts
/// `stride` subjects after its last one (`call(i)` decides subjects `i..i + stride`).
async fn concurrent_turn_by<F, Fut>(
    tasks: usize,
    subjects: usize,
    stride: usize,
    turn: Duration,
    call: F,
) -> (u64, Duration, u64)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let cpu = machine::process_cpu_ns();
    let start = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let (done, calls, call) = (Arc::clone(&done), Arc::clone(&calls), call.clone());
        set.spawn(async move {
            let mut i = t * (subjects / tasks);
            let mut made = 0;
            while !done.load(Ordering::Relaxed) {
                call(i % subjects).await;
                i += stride;
                made += 1;
            }
            calls.fetch_add(made, Ordering::Relaxed);
        });
    }
    tokio::time::sleep(turn).await;
    done.store(true, Ordering::Relaxed);
    // The calls in flight when the turn ends count, and so does their time.
    while let Some(finished) = set.join_next().await {
        finished.expect("task");
    }
    let time = start.elapsed();
    let cpu = machine::process_cpu_ns().saturating_sub(cpu);
    (calls.load(Ordering::Relaxed), time, cpu)
}

/// How `redis-benchmark` runs: connections, requests, keyspace of `__rand_int__`,
/// pipeline depth (1: none).
#[derive(Clone, Copy)]
struct BenchRun {
    clients: usize,
    requests: u64,
    keyspace: usize,
    pipeline: usize,
}

impl BenchRun {
    /// The command line, for the tables.
    fn describe(self) -> String {
        let mut s = format!(
            "redis-benchmark -c {} -n {} -r {}",
            self.clients, self.requests, self.keyspace
        );
        if self.pipeline > 1 {
            s.push_str(&format!(" -P {}", self.pipeline));
        }
        s
    }
}

/// `redis-benchmark` sending `args` (with `__rand_int__` in the keys): its requests
/// and its own time for them.
async fn redis_benchmark(port: u16, run: BenchRun, args: Vec<String>) -> (u64, Duration) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-c", &run.clients.to_string()])
            .args(["-n", &run.requests.to_string()])
            .args(["-r", &run.keyspace.to_string()])
            .args(["-P", &run.pipeline.to_string(), "--csv"])
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
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
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
    (
        run.requests,
        Duration::from_secs_f64(run.requests as f64 / rps),
    )
}

/// The arguments of a command, for `redis-benchmark`, with the subject
/// `000000000000` of every key (`{000000000000}`) as `__rand_int__`. `redis-benchmark`
/// draws each `__rand_int__` on its own: a command with two keys gets two subjects.
fn bench_args(cmd: &redis::Cmd) -> Vec<String> {
    let mut zero = "{".to_owned();
    subject(0).write_key_part(&mut zero);
    zero.push('}');
    let args: Vec<String> = resp_args(&cmd.get_packed_command())
        .into_iter()
        .map(|a| a.replace(&zero, "{__rand_int__}"))
        .collect();
    // Else every call would hit one key: far cheaper than a subject's first call.
    assert!(
        args.iter().any(|a| a.contains("__rand_int__")),
        "no key of subject {zero} in {args:?}"
    );
    args
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

/// The Redis main thread's CPU time (user + system), in seconds.
async fn redis_cpu_s(conn: &mut MultiplexedConnection) -> f64 {
    redis_cpu_s_of(&info(conn, "cpu").await)
}
