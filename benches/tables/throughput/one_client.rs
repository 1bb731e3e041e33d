//! One client: `Limiter::check`, the bare loop of the store's command,
//! `redis-benchmark -c 1` of it and the common layout, one call at a time.

use super::*;
use redlimit::clock::FakeClock;
use redlimit::internals::{LimiterInternals, Operation, RedisStoreInternals};
use redlimit::Limiter;

/// Subjects the calls rotate over (`redis-benchmark -r 1000`).
const SUBJECTS: usize = 1_000;
/// Each contender's turn, and how many turns each takes.
const TURN: Duration = Duration::from_millis(150);
const ROUNDS: u32 = 11;
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
    /// The clock argument of the common scripts.
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
    /// One of the four algorithms' rows: compared with the common layout, and
    /// counted in slowest / fastest.
    main: bool,
}

fn cases() -> Vec<Case> {
    let minute = Duration::from_secs(60);
    let p = |r: Result<Policy, redlimit::PolicyError>| r.expect("valid bench policy");
    let main = |label, policy| Case {
        label,
        policy,
        clock: Clock::Redis,
        prefill: None,
        admits: true,
        main: true,
    };
    vec![
        main(
            "fixed window",
            p(Policy::fixed_window("bench", 1_000_000, minute)),
        ),
        main(
            "sliding window",
            p(Policy::sliding_window("bench", 1_000_000, minute)),
        ),
        main(
            "token bucket",
            p(Policy::token_bucket("bench", 1_000_000, 1_000_000, minute)),
        ),
        main(
            "sliding log",
            p(Policy::sliding_log("bench", 1_000, minute)),
        ),
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

async fn store_sequential(
    limiter: &Limiter<RedisStore>,
    subjects: &[Subject],
    admits: bool,
) -> (u64, Duration) {
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < TURN {
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
    while start.elapsed() < TURN {
        let reply: Value = cmds[calls % SUBJECTS]
            .query_async(conn)
            .await
            .expect("bare call of the store's command");
        assert_eq!(admitted(&reply), admits);
        calls += 1;
    }
    (calls as u64, start.elapsed())
}

/// The common script, one call at a time (built per call: the sorted set needs a
/// unique request id).
async fn common_sequential(
    conn: &mut MultiplexedConnection,
    keys: &[String],
    case: &Case,
    next_id: &mut u64,
) -> (u64, Duration) {
    let clock = case.clock.arg();
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < TURN {
        *next_id += 1;
        let cmd = reference::command(
            case.policy.algorithm(),
            &keys[calls % SUBJECTS],
            &clock,
            1,
            &case.policy,
            *next_id,
        );
        let reply: Value = cmd.query_async(conn).await.expect("common EVALSHA");
        assert_eq!(admitted(&reply), case.admits);
        calls += 1;
    }
    (calls as u64, start.elapsed())
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

/// How many requests `redis-benchmark` gets for a turn of about `TURN`, from the
/// rate the bare loop just reached (redis-benchmark is usually faster).
fn bench_requests(bare: (u64, Duration)) -> u64 {
    let rate = bare.0 as f64 / bare.1.as_secs_f64();
    ((1.5 * rate * TURN.as_secs_f64()) as u64).max(10)
}

#[derive(Default)]
struct Rates {
    store: Tally,
    bare: Tally,
    bench: Tally,
    common: Option<Tally>,
}

/// Everything one case's turns need, built once.
struct Setup {
    limiter: Limiter<RedisStore>,
    keys: Vec<String>,
    /// The store's own command for each subject (`RedisStore::command`).
    cmds: Vec<redis::Cmd>,
    /// redis-benchmark's arguments: the store's command, subject `__rand_int__`.
    bench_args: Vec<String>,
    bare_conn: MultiplexedConnection,
}

async fn setup(server: &RedisServer, case: &Case, subjects: &[Subject]) -> Setup {
    let store = store(server, case.clock);
    let limiter = Limiter::new(store.clone(), case.policy.clone());
    let set = limiter.policy_set();
    let keys: Vec<String> = subjects
        .iter()
        .map(|s| store.key(s, set, &case.policy))
        .collect();
    let cmds: Vec<redis::Cmd> = subjects
        .iter()
        .map(|s| store.command(Operation::Check, s, set, 1, false))
        .collect();
    let bare_conn = connect(server).await;
    Setup {
        bench_args: bench_args(&cmds[0]),
        limiter,
        keys,
        cmds,
        bare_conn,
    }
}

pub(super) async fn run(server: &RedisServer) {
    let mut conn = connect(server).await;
    let subjects: Vec<Subject> = (0..SUBJECTS).map(subject).collect();
    let cases = cases();
    let mut setups = Vec::new();
    for case in &cases {
        let s = setup(server, case, &subjects).await;
        // A first call opens the store's connection.
        prepare(server, &mut conn, case).await;
        s.limiter.check(subject(0), 1).await.expect("first call");
        setups.push(s);
    }
    let mut rates: Vec<Rates> = cases
        .iter()
        .map(|c| Rates {
            common: c.main.then(Tally::default),
            ..Rates::default()
        })
        .collect();
    let mut common_id = 0;
    let bench = |requests| BenchRun {
        clients: 1,
        requests,
        keyspace: SUBJECTS,
        pipeline: 1,
    };

    // Every case and contender in turn, round after round.
    for round in 0..ROUNDS {
        for ((case, s), r) in cases.iter().zip(&mut setups).zip(&mut rates) {
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
            let run = bench(bench_requests(bare));
            let (n, t) = redis_benchmark(server.port(), run, s.bench_args.clone()).await;
            r.bench.add(n, t);
            if round == 0 {
                assert_same_keys(server, &s.keys).await;
            }
            if let Some(common) = &mut r.common {
                prepare(server, &mut conn, case).await;
                let (n, t) =
                    common_sequential(&mut s.bare_conn, &s.keys, case, &mut common_id).await;
                common.add(n, t);
            }
        }
        eprintln!(
            "throughput: one client, round {} of {ROUNDS} done",
            round + 1
        );
    }
    report(&cases, &rates);
}

fn report(cases: &[Case], rates: &[Rates]) {
    println!();
    println!("## Throughput (calls/s), one client");
    println!();
    println!(
        "Median of {ROUNDS} turns of {} ms per contender; the cases and contenders take their turns \
         in rotation, so a busy neighbour slows them alike, and each ratio is the median of the ratios \
         of the turns of one round (the store and the bare loop back to back, in alternating order). \
         Client CPU: this process's CPU time per call (every thread). {SUBJECTS} subjects in turn; every call on \
         the path shown. The first three columns send the same script, keys and arguments (the bare loop \
         and redis-benchmark the store's own command, `RedisStore::command`); the common layout is our own \
         script of it (`benches/reference/`), in the same bare loop.",
        TURN.as_millis()
    );
    println!();
    println!("| algorithm | redlimit `Limiter::check` | bare redis-rs loop | `redis-benchmark -c 1` | redlimit / bare | client CPU per call: redlimit / bare | redlimit / redis-benchmark | common layout, bare loop | redlimit / common layout |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (case, r) in cases.iter().zip(rates) {
        let (common, vs_common) = match &r.common {
            Some(s) => (thousands(s.rate()), format!("{:.2}x", r.store.ratio(s))),
            None => ("—".to_owned(), "—".to_owned()),
        };
        println!(
            "| {} | {} | {} | {} | {:.3}x | {:.1} / {:.1} µs | {:.2}x | {common} | {vs_common} |",
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
    println!("### Targets");
    println!();
    let main: Vec<(&Case, &Rates)> = cases.iter().zip(rates).filter(|(c, _)| c.main).collect();
    for (case, r) in &main {
        let ratio = r.store.ratio(&r.bare);
        println!(
            "- {}: one client {ratio:.3}x the bare loop (target >= 0.95x: {})",
            case.label,
            met(ratio >= 0.95),
        );
    }
    let rates: Vec<f64> = main.iter().map(|(_, r)| r.store.rate()).collect();
    let spread = rates.iter().cloned().fold(f64::MIN, f64::max)
        / rates.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "- fastest / slowest algorithm, one client: {spread:.2}x (target <= 1.15x: {}; published: 1.42x)",
        met(spread <= 1.15)
    );
}
