//! Latency at low load: ONE task sending one call at a time, each call awaited before
//! the next is made, so no call ever waits behind another: what a lightly loaded
//! service sees per request. redlimit's `Limiter::check` on a `RedisStore` beside the
//! least a Redis-backed fixed window can do, the smallest fixed-window script
//! (`benches/reference/smallest_fixed_window.lua`) sent with plain redis-rs
//! `Script::invoke_async` on one `MultiplexedConnection`.
//!
//! Both run a fixed window of 1 s whose limit no call reaches, over 100,000 subjects
//! in turn: a subject comes back after 100,000 calls (seconds later at one call at a
//! time), so every call of every contender starts its subject's window (a new key
//! with its expiry), the same path for all. Each call's latency is the time from
//! before its future is made to its answer (`Instant` around the await), kept per
//! call; a turn's p50 and p99 come from all of its calls.
//!
//! The table's runtime is a multi-threaded tokio runtime of 2 workers (an app's, as
//! the HTTP section's server), the task spawned on it as a request handler is; the
//! two main contenders also run on a current-thread runtime, where the task and the
//! connection's driver share one thread. Every contender on each runtime has its own
//! connection opened there (its driver task runs there).
//!
//! Below the table, where redlimit's extra time per call goes, from the same rotation:
//! the store's own command (`RedisStore::command`, the `FCALL` it sends) sent bare on a
//! `MultiplexedConnection` isolates the Lua and the command's size from the store's
//! client path; the smallest script prebuilt (one `Cmd` per subject, made before the
//! turn) isolates redis-rs's script invocation; the same inside `tokio::time::timeout`
//! isolates the timer every store call runs under. Every contender's connection
//! already runs each request under one tokio timer of its own, redis-rs's response
//! timeout (500 ms by default, as on the store's connection from the pool; 120 s on the
//! bench's connections), so that row measures a second timer, as the store has.

use crate::helpers::*;
use crate::support::RedisServer;
use redlimit::internals::{LimiterInternals, Operation, RedisStoreInternals};
use redlimit::Limiter;
use std::sync::Arc;

const SUBJECTS: usize = 100_000;
/// Each contender's turn, and how many turns each takes (in rotation).
const TURN: Duration = Duration::from_millis(2_000);
const ROUNDS: usize = 5;
/// Calls before each turn, not recorded: the connection and caches warm again after
/// the other contenders' turns.
const WARM_UP_CALLS: usize = 1_000;
/// The store's timeout, and the timeout of the timed smallest script: the HTTP
/// section's, so a slow spell of a shared machine fails no call.
const TIMEOUT: Duration = Duration::from_secs(1);
const WINDOW_MS: u64 = 1_000;
/// Never reached (each subject comes back after 100,000 calls), and under 2^25, as
/// most limits are, so the store's reply packs the outcome into one integer; 10^9, this
/// bench's limit before, took four (`client_cost` measures both).
const LIMIT: u32 = 1_000_000;
/// p50 and p99 of `Limiter::check`, at most this times the smallest script's.
const TARGET: f64 = 1.05;

fn policy() -> Policy {
    Policy::fixed_window("latency", LIMIT, Duration::from_millis(WINDOW_MS)).expect("policy")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `Limiter::check` on the `RedisStore`.
    Limiter,
    /// The smallest fixed-window script through `Script::key(..).arg(..).invoke_async`,
    /// built per call as an application would write it: the reference.
    Smallest,
    /// The store's own command (`RedisStore::command`: `FCALL` of its library), one
    /// prebuilt `Cmd` per subject, sent bare on the contender's connection.
    StoreCommand,
    /// The smallest script's `EVALSHA`, one prebuilt `Cmd` per subject.
    SmallestPrebuilt,
    /// The same inside `tokio::time::timeout(TIMEOUT, ..)`.
    SmallestTimeout,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Limiter => "redlimit `Limiter::check`, `RedisStore`",
            Kind::Smallest => "smallest fixed-window script, `Script::invoke_async`",
            Kind::StoreCommand => "the store's command (`RedisStore::command`) sent bare",
            Kind::SmallestPrebuilt => "smallest script, prebuilt `EVALSHA` `Cmd`",
            Kind::SmallestTimeout => "smallest script, prebuilt `Cmd` in `tokio::time::timeout`",
        }
    }
}

/// What every contender reads, made once.
struct Data {
    subjects: Vec<Subject>,
    /// The store's key of each subject: the smallest script's key base (it appends the
    /// window number), so both send keys of one length.
    keys: Vec<String>,
    store_cmds: Vec<redis::Cmd>,
    smallest_cmds: Vec<redis::Cmd>,
}

/// One runtime and what runs on it.
struct Side {
    label: &'static str,
    rt: tokio::runtime::Runtime,
    limiter: Limiter<RedisStore>,
    conn: MultiplexedConnection,
}

impl Side {
    fn new(label: &'static str, rt: tokio::runtime::Runtime, server: &RedisServer) -> Self {
        let (limiter, conn) = rt.block_on(async {
            let store = RedisStore::new(server.pool()).timeout(TIMEOUT);
            let limiter = Limiter::new(store, policy());
            // The first call opens the store's connection, from a task of this runtime:
            // its driver task runs here.
            let first = limiter.clone();
            tokio::spawn(async move { first.check(subject(0), 1).await })
                .await
                .expect("first call's task")
                .expect("first call");
            let conn = tokio::spawn({
                let server_url = server.url();
                async move {
                    let mut conn = redis::Client::open(server_url)
                        .expect("url")
                        .get_multiplexed_async_connection()
                        .await
                        .expect("a multiplexed connection");
                    conn.set_response_timeout(Duration::from_secs(120));
                    conn
                }
            })
            .await
            .expect("connect task");
            (limiter, conn)
        });
        Self {
            label,
            rt,
            limiter,
            conn,
        }
    }
}

/// What one turn measured.
struct Turn {
    /// Nanoseconds per call, sorted.
    latencies: Vec<u32>,
    time: Duration,
    /// This process's CPU time over the turn (every thread), ns.
    client_cpu_ns: u64,
    /// Redis main-thread CPU time over the turn, s.
    redis_cpu_s: f64,
}

impl Turn {
    fn calls(&self) -> usize {
        self.latencies.len()
    }
    fn percentile_us(&self, p: f64) -> f64 {
        let sorted = &self.latencies;
        if sorted.is_empty() {
            return f64::NAN;
        }
        let i = ((sorted.len() - 1) as f64 * p).round() as usize;
        f64::from(sorted[i]) / 1_000.0
    }
}

/// One call of `kind` for subject `i`.
async fn one(
    kind: Kind,
    limiter: &Limiter<RedisStore>,
    conn: &mut MultiplexedConnection,
    data: &Data,
    i: usize,
) {
    match kind {
        Kind::Limiter => {
            let d = limiter
                .check(data.subjects[i].clone(), 1)
                .await
                .expect("Limiter::check");
            assert!(d.is_allowed(), "the limit is never reached");
        }
        Kind::Smallest => {
            let count: u64 = reference::SMALLEST_FIXED_WINDOW
                .key(&data.keys[i])
                .arg(WINDOW_MS)
                .invoke_async(conn)
                .await
                .expect("smallest script");
            assert!(count <= u64::from(LIMIT));
        }
        Kind::StoreCommand => {
            let reply: Value = data.store_cmds[i]
                .query_async(conn)
                .await
                .expect("the store's command");
            assert!(admitted(&reply), "the limit is never reached");
        }
        Kind::SmallestPrebuilt => {
            let count: u64 = data.smallest_cmds[i]
                .query_async(conn)
                .await
                .expect("smallest script");
            assert!(count <= u64::from(LIMIT));
        }
        Kind::SmallestTimeout => {
            let count: u64 = tokio::time::timeout(TIMEOUT, data.smallest_cmds[i].query_async(conn))
                .await
                .expect("an answer within the timeout")
                .expect("smallest script");
            assert!(count <= u64::from(LIMIT));
        }
    }
}

/// `kind`'s warm-up and turn on `side`, from subject `next` on, in a task of the side's
/// runtime; returns the turn and the next subject. The CPU readings are taken in the
/// task right before and after the timed calls (Redis's on a blocking connection of its
/// own, so the reading sends nothing on the connections measured).
fn run_turn(
    side: &Side,
    redis: redis::Connection,
    kind: Kind,
    data: &Arc<Data>,
    next: usize,
    length: Duration,
) -> (Turn, usize, redis::Connection) {
    let (limiter, mut conn, data) = (side.limiter.clone(), side.conn.clone(), Arc::clone(data));
    let task = async move {
        let mut redis = redis;
        let mut i = next;
        for _ in 0..WARM_UP_CALLS {
            one(kind, &limiter, &mut conn, &data, i % SUBJECTS).await;
            i += 1;
        }
        let mut latencies = Vec::with_capacity(1 << 17);
        let redis_before = redis_cpu_s_blocking(&mut redis);
        let cpu_before = machine::process_cpu_ns();
        let start = Instant::now();
        while start.elapsed() < length {
            let sent = Instant::now();
            one(kind, &limiter, &mut conn, &data, i % SUBJECTS).await;
            latencies.push(u32::try_from(sent.elapsed().as_nanos()).unwrap_or(u32::MAX));
            i += 1;
        }
        let time = start.elapsed();
        let client_cpu_ns = machine::process_cpu_ns().saturating_sub(cpu_before);
        let redis_cpu_s = redis_cpu_s_blocking(&mut redis) - redis_before;
        latencies.sort_unstable();
        let turn = Turn {
            latencies,
            time,
            client_cpu_ns,
            redis_cpu_s,
        };
        (turn, i, redis)
    };
    side.rt
        .block_on(async move { tokio::spawn(task).await })
        .expect("turn task")
}

/// A contender's turns.
struct Contender {
    side: usize,
    kind: Kind,
    turns: Vec<Turn>,
}

/// Median, min and max.
fn spread(values: Vec<f64>) -> (f64, f64, f64) {
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (median(values), min, max)
}

impl Contender {
    fn per_turn(&self, f: impl Fn(&Turn) -> f64) -> Vec<f64> {
        self.turns.iter().map(f).collect()
    }
    fn p(&self, p: f64) -> f64 {
        median(self.per_turn(|t| t.percentile_us(p)))
    }
    /// The per-round ratios of percentile `p` to `other`'s: median, min, max.
    fn ratio(&self, other: &Contender, p: f64) -> (f64, f64, f64) {
        spread(
            self.turns
                .iter()
                .zip(&other.turns)
                .map(|(a, b)| a.percentile_us(p) / b.percentile_us(p))
                .collect(),
        )
    }
    /// The per-round differences of percentile `p` from `other`'s, µs: median, min, max.
    fn minus(&self, other: &Contender, p: f64) -> (f64, f64, f64) {
        spread(
            self.turns
                .iter()
                .zip(&other.turns)
                .map(|(a, b)| a.percentile_us(p) - b.percentile_us(p))
                .collect(),
        )
    }
    fn rate(&self) -> f64 {
        median(self.per_turn(|t| t.calls() as f64 / t.time.as_secs_f64()))
    }
    fn client_cpu_us(&self) -> f64 {
        median(self.per_turn(|t| t.client_cpu_ns as f64 / 1_000.0 / t.calls().max(1) as f64))
    }
    fn redis_cpu_us(&self) -> f64 {
        median(self.per_turn(|t| t.redis_cpu_s * 1e6 / t.calls().max(1) as f64))
    }
}

pub(crate) fn run(server: &RedisServer) {
    let turn = scaled(TURN);
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("multi-thread runtime");
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("current-thread runtime");
    let sides = [
        Side::new("multi-thread, 2 workers", multi, server),
        Side::new("current-thread", current, server),
    ];
    let subjects: Vec<Subject> = (0..SUBJECTS).map(subject).collect();
    let (store, set) = (sides[0].limiter.store(), sides[0].limiter.policy_set());
    let keys: Vec<String> = subjects
        .iter()
        .map(|s| store.key(s, set, &policy()))
        .collect();
    let data = Arc::new(Data {
        store_cmds: subjects
            .iter()
            .map(|s| store.command(Operation::Check, s, set, 1, false))
            .collect(),
        smallest_cmds: keys
            .iter()
            .map(|k| reference::smallest_fixed_window(k, WINDOW_MS))
            .collect(),
        subjects,
        keys,
    });
    let mut contenders: Vec<Contender> = [
        (0, Kind::Limiter),
        (0, Kind::Smallest),
        (0, Kind::StoreCommand),
        (0, Kind::SmallestPrebuilt),
        (0, Kind::SmallestTimeout),
        (1, Kind::Limiter),
        (1, Kind::Smallest),
    ]
    .into_iter()
    .map(|(side, kind)| Contender {
        side,
        kind,
        turns: Vec::new(),
    })
    .collect();
    let mut redis = blocking_conn(server);
    let mut next = 0;
    for round in 0..ROUNDS {
        // Each round starts at another contender, so none is always first or last.
        let n = contenders.len();
        for k in 0..n {
            let c = &mut contenders[(k + round) % n];
            let (t, after, back) = run_turn(&sides[c.side], redis, c.kind, &data, next, turn);
            (next, redis) = (after, back);
            c.turns.push(t);
        }
        eprintln!("latency: round {} of {ROUNDS} done", round + 1);
    }
    report(&sides, &contenders, turn);
}

fn report(sides: &[Side], contenders: &[Contender], turn: Duration) {
    let at = |side: usize, kind: Kind| {
        contenders
            .iter()
            .find(|c| c.side == side && c.kind == kind)
            .unwrap_or_else(|| panic!("no contender {kind:?} on side {side}"))
    };
    println!();
    println!("## Latency at low load: one task, one call at a time");
    println!();
    println!(
        "One task sends one call, awaits its answer, then sends the next: nothing ever waits behind \
         another call. A fixed window of {WINDOW_MS} ms, limit {} (never reached), over {} subjects in \
         turn: every call starts its subject's window. {ROUNDS} rounds; each contender's turn is {} ms \
         after {WARM_UP_CALLS} calls of warm-up, in rotation (each round starting at the next contender). \
         Latency: `Instant` around each call's await, every call kept; p50 and p99 are the medians over \
         the rounds of each turn's own, a ratio the median (min-max) of the rounds' ratios to the \
         smallest script's turn of the same round and runtime. Client CPU: this process's CPU per call (every \
         thread); Redis CPU: the main thread's `used_cpu_user_main_thread` + `used_cpu_sys_main_thread` \
         delta over the turn, per call; both read right before and after the timed calls. Store timeout \
         {} ms.",
        thousands(f64::from(LIMIT)),
        thousands(SUBJECTS as f64),
        turn.as_millis(),
        TIMEOUT.as_millis(),
    );
    for (s, side) in sides.iter().enumerate() {
        println!();
        println!(
            "{}: {}",
            if s == 0 {
                "Table, tokio runtime"
            } else {
                "The same on a tokio runtime"
            },
            side.label
        );
        println!();
        println!("| contender | p50 | p99 | p50 / smallest | p99 / smallest | calls/s | client CPU per call | Redis CPU per call |");
        println!("|---|---|---|---|---|---|---|---|");
        let reference = at(s, Kind::Smallest);
        for c in contenders.iter().filter(|c| c.side == s) {
            let ratio = |p| {
                if c.kind == Kind::Smallest {
                    "1 (reference)".to_owned()
                } else {
                    let (m, lo, hi) = c.ratio(reference, p);
                    format!("{m:.3}x ({lo:.3}-{hi:.3})")
                }
            };
            println!(
                "| {} | {:.1} µs | {:.1} µs | {} | {} | {} | {:.2} µs | {:.2} µs |",
                c.kind.label(),
                c.p(0.50),
                c.p(0.99),
                ratio(0.50),
                ratio(0.99),
                thousands(c.rate()),
                c.client_cpu_us(),
                c.redis_cpu_us(),
            );
        }
    }

    println!();
    println!("### Targets");
    println!();
    for (s, side) in sides.iter().enumerate() {
        let (ours, smallest) = (at(s, Kind::Limiter), at(s, Kind::Smallest));
        let (p50, lo50, hi50) = ours.ratio(smallest, 0.50);
        let (p99, lo99, hi99) = ours.ratio(smallest, 0.99);
        println!(
            "- {}{}: `Limiter::check` p50 {p50:.3}x the smallest script's ({lo50:.3}-{hi50:.3}; target <= \
             {TARGET}x: {}), p99 {p99:.3}x ({lo99:.3}-{hi99:.3}; target <= {TARGET}x: {})",
            side.label,
            if s == 0 { " (the table)" } else { "" },
            met(p50 <= TARGET),
            met(p99 <= TARGET),
        );
    }
    let runtimes = |kind: Kind| {
        let (a, b) = (at(1, kind), at(0, kind));
        (a.p(0.50) / b.p(0.50), a.p(0.99) / b.p(0.99))
    };
    let ((ours50, ours99), (small50, small99)) =
        (runtimes(Kind::Limiter), runtimes(Kind::Smallest));
    println!(
        "- current-thread / multi-thread runtime: `Limiter::check` p50 {ours50:.3}x, p99 {ours99:.3}x; \
         the smallest script p50 {small50:.3}x, p99 {small99:.3}x"
    );

    println!();
    println!(
        "### Where `Limiter::check`'s extra time per call goes (one task, {})",
        sides[0].label
    );
    println!();
    println!(
        "Each line: the median (min-max) over the rounds of the difference of two contenders' p50 in \
         one round, and the difference of their client and Redis CPU per call. The first line is the \
         whole gap; the next three add up to it (each p50 difference is taken in the same round); \
         the last is a part of the second."
    );
    println!();
    let line = |what: &str, a: Kind, b: Kind| {
        let (a, b) = (at(0, a), at(0, b));
        let (m, lo, hi) = a.minus(b, 0.50);
        println!(
            "- {what}: p50 {m:+.1} µs ({lo:+.1} to {hi:+.1}); client CPU {:+.2} µs, Redis CPU {:+.2} µs per call",
            a.client_cpu_us() - b.client_cpu_us(),
            a.redis_cpu_us() - b.redis_cpu_us(),
        );
    };
    line(
        "the whole gap: `Limiter::check` - smallest script through `Script::invoke_async`",
        Kind::Limiter,
        Kind::Smallest,
    );
    line(
        "the store's client path (limiter, link, timer, command built per call, reply read): \
         `Limiter::check` - its command sent bare",
        Kind::Limiter,
        Kind::StoreCommand,
    );
    line(
        "the Lua and the command's size (Redis's side, bytes each way): the store's command bare - \
         the smallest script prebuilt",
        Kind::StoreCommand,
        Kind::SmallestPrebuilt,
    );
    line(
        "the reference's own invocation (the `EVALSHA` built per call, the script's hash): prebuilt - \
         `Script::invoke_async` (negative: the reference pays it)",
        Kind::SmallestPrebuilt,
        Kind::Smallest,
    );
    line(
        "a second tokio timer around the call (the store's timeout, beside redis-rs's response \
         timeout that every contender has): the smallest script prebuilt in `tokio::time::timeout` - \
         without",
        Kind::SmallestTimeout,
        Kind::SmallestPrebuilt,
    );
}
