//! 64 tasks over 100,000 subjects on one multiplexed connection: `Limiter::check`, the
//! bare loop of the store's own command, and the smallest script of each algorithm, with
//! the Redis CPU per decision of every turn, all against the smallest fixed-window
//! script of the same run. The store may send the checks that queue behind its calls in
//! flight together, in one call: its decisions per Redis call are measured in every turn
//! (`calls_sent()`), and beside the fixed window runs the smallest fixed-window script
//! batched as many decisions a call as the store's fixed window carried in the same
//! round, the least a store batching as much could cost; beside the two policies, the
//! same script with two keys a decision, the least any store that writes two counters
//! a decision could cost. Then
//! `redis-benchmark -c 20 -P 16` of each script: the server's cost per call with the
//! network nearly out of the picture.

use super::*;
use redlimit::internals::{LimiterInternals, Operation, PolicySet, RedisStoreInternals};
use redlimit::Limiter;

const SUBJECTS: usize = 100_000;
const TASKS: usize = 64;
/// Each contender's turn, and how many turns each takes.
const TURN: Duration = Duration::from_millis(250);
const ROUNDS: u32 = 7;
/// The server's cost per call: `redis-benchmark` runs of each script, in rotation.
const BENCH: BenchRun = BenchRun {
    clients: 20,
    requests: 100_000,
    keyspace: SUBJECTS,
    pipeline: 16,
};
const BENCH_ROUNDS: u32 = 3;
/// Decisions/s of every algorithm against the smallest fixed-window script (BENCHMARKS.md's target).
const THROUGHPUT_TARGET: f64 = 1.2;

/// The smallest script that makes a case's decision.
#[derive(Clone, Copy, PartialEq)]
enum Smallest {
    /// `TIME`, `INCR` of a key per window, `PEXPIRE` when new: the reference of every ratio.
    FixedWindow,
    /// The common layout of the algorithm (`benches/reference/<algorithm>.lua`).
    Common(Algorithm),
    /// The common sliding window and token bucket in one script.
    SlidingWindowTokenBucket,
}

struct Case {
    label: &'static str,
    policies: Vec<Policy>,
    smallest: Smallest,
    /// What the smallest script of the case is, for the table.
    smallest_label: &'static str,
    /// Redis CPU per decision, at most this times the smallest fixed-window script's.
    cpu_target: f64,
}

fn cases() -> Vec<Case> {
    let minute = Duration::from_secs(60);
    let p = |r: Result<Policy, redlimit::PolicyError>| r.expect("valid bench policy");
    vec![
        Case {
            label: "fixed window",
            policies: vec![p(Policy::fixed_window("bench", 1_000_000, minute))],
            smallest: Smallest::FixedWindow,
            smallest_label: "`TIME` + `INCR` + `PEXPIRE` when new",
            cpu_target: 1.3,
        },
        Case {
            label: "sliding window",
            policies: vec![p(Policy::sliding_window("bench", 1_000_000, minute))],
            smallest: Smallest::Common(Algorithm::SlidingWindow),
            smallest_label: "common two keys",
            cpu_target: 1.6,
        },
        Case {
            label: "token bucket",
            policies: vec![p(Policy::token_bucket(
                "bench", 1_000_000, 1_000_000, minute,
            ))],
            smallest: Smallest::Common(Algorithm::TokenBucket),
            smallest_label: "common hash",
            cpu_target: 1.3,
        },
        Case {
            label: "sliding log (limit 100)",
            policies: vec![p(Policy::sliding_log("bench", 100, minute))],
            smallest: Smallest::Common(Algorithm::SlidingLog),
            smallest_label: "common sorted set",
            cpu_target: 1.6,
        },
        Case {
            label: "sliding window + token bucket, one call",
            policies: vec![
                p(Policy::sliding_window("minute", 1_000_000, minute)),
                p(Policy::token_bucket("burst", 1_000_000, 1_000_000, minute)),
            ],
            smallest: Smallest::SlidingWindowTokenBucket,
            smallest_label: "common two layouts in one script",
            cpu_target: 2.2,
        },
    ]
}

impl Case {
    /// The smallest script's command for one subject (`id`: the sorted set's request id).
    fn smallest_command(
        &self,
        store: &RedisStore,
        set: &PolicySet,
        subject: &Subject,
        id: u64,
    ) -> redis::Cmd {
        let first = &self.policies[0];
        let key = reference_key(store, set, subject, first);
        match self.smallest {
            Smallest::FixedWindow => reference::smallest_fixed_window(&key, first.window_ms()),
            Smallest::Common(algorithm) => reference::command(algorithm, &key, "s", 1, first, id),
            Smallest::SlidingWindowTokenBucket => {
                let second = &self.policies[1];
                reference::sliding_window_token_bucket(
                    &key,
                    &reference_key(store, set, subject, second),
                    first,
                    second,
                )
            }
        }
    }
}

/// A reference's key of `policy` for `subject`: the store's, and for a set of several
/// policies (whose states the store keeps in one key) one a policy beside it.
fn reference_key(
    store: &RedisStore,
    set: &PolicySet,
    subject: &Subject,
    policy: &Policy,
) -> String {
    let key = store.key(subject, set, policy);
    if set.policies().len() > 1 {
        format!("{key}{}", policy.name())
    } else {
        key
    }
}

impl Smallest {
    /// Checks a reply of the smallest script: every call is admitted.
    fn assert_admitted(self, reply: &Value) {
        match (self, reply) {
            (Smallest::FixedWindow, Value::Int(count)) => assert!(*count >= 1, "a count"),
            (Smallest::FixedWindow, other) => panic!("unexpected reply {other:?}"),
            _ => assert!(admitted(reply), "the reference admits every call"),
        }
    }
}

/// Who sends the decisions in a turn.
#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Store,
    Bare,
    Smallest,
}

const CONTENDERS: [Contender; 3] = [Contender::Store, Contender::Bare, Contender::Smallest];

/// Everything one case's turns need, built once.
struct Setup {
    limiter: Limiter<RedisStore>,
    /// The limiter's store, for its count of calls sent.
    store: RedisStore,
    /// The fixed window's and the two policies' cases: the key of each of the case's
    /// policies for each subject, subject after subject, for the batched smallest
    /// script (one key a decision, or two).
    batch_keys: Option<Arc<Vec<String>>>,
    /// The store's own command for each subject (`RedisStore::command`).
    store_cmds: Arc<Vec<redis::Cmd>>,
    /// The smallest script's command for each subject.
    smallest_cmds: Arc<Vec<redis::Cmd>>,
    /// redis-benchmark's arguments for the store's command and the smallest script's.
    store_args: Vec<String>,
    smallest_args: Vec<String>,
}

async fn setup(server: &RedisServer, case: &Case, subjects: &[Subject]) -> Setup {
    // REDLIMIT_STORE=from_url: the store on its own socket instead of the pool's.
    let store = match std::env::var("REDLIMIT_STORE").as_deref() {
        Ok("from_url") => RedisStore::from_url(&server.url()).expect("the server's URL"),
        _ => RedisStore::new(server.pool()),
    };
    let store = store
        .timeout(Duration::from_secs(5))
        .max_pipelined(env_usize("REDLIMIT_MAX_PIPELINED", 2))
        .max_batch(env_usize("REDLIMIT_MAX_BATCH", 32));
    let limiter = case
        .policies
        .iter()
        .fold(Limiter::builder(store.clone()), |l, p| l.policy(p.clone()))
        .build()
        .expect("policies named apart");
    let set = limiter.policy_set();
    let store_cmds: Vec<redis::Cmd> = subjects
        .iter()
        .map(|s| store.command(Operation::Check, s, set, 1, false))
        .collect();
    let smallest_cmds: Vec<redis::Cmd> = subjects
        .iter()
        .zip(0..)
        .map(|(s, id)| case.smallest_command(&store, set, s, id))
        .collect();
    let batched = matches!(
        case.smallest,
        Smallest::FixedWindow | Smallest::SlidingWindowTokenBucket
    );
    let batch_keys = batched.then(|| {
        let keys = subjects
            .iter()
            .flat_map(|s| {
                case.policies
                    .iter()
                    .map(|p| reference_key(&store, set, s, p))
            })
            .collect();
        Arc::new(keys)
    });
    // A first call opens the store's connection.
    limiter.check(subject(0), 1).await.expect("first call");
    let mut smallest_args = bench_args(&smallest_cmds[0]);
    if case.smallest == Smallest::Common(Algorithm::SlidingLog) {
        if let Some(id) = smallest_args.last_mut() {
            *id = "__rand_int__".to_owned();
        }
    }
    Setup {
        store_args: bench_args(&store_cmds[0]),
        smallest_args,
        limiter,
        store,
        batch_keys,
        store_cmds: Arc::new(store_cmds),
        smallest_cmds: Arc::new(smallest_cmds),
    }
}

/// One case's tallies, by contender; `bench_*`: the redis-benchmark runs.
#[derive(Default)]
struct Rates {
    store: Tally,
    /// The store's decisions per Redis call in each of its turns.
    store_per_call: Vec<f64>,
    bare: Tally,
    smallest: Tally,
    /// The fixed window's and the two policies' cases: the smallest script batched,
    /// and its decisions per call in each round.
    batched: Tally,
    batches: Vec<usize>,
    bench_store: Tally,
    bench_smallest: Tally,
}

impl Rates {
    fn of(&mut self, contender: Contender) -> &mut Tally {
        match contender {
            Contender::Store => &mut self.store,
            Contender::Bare => &mut self.bare,
            Contender::Smallest => &mut self.smallest,
        }
    }
}

/// One turn of `contender` on `case`: decisions, time, client CPU (ns).
async fn turn(
    case: &Case,
    s: &Setup,
    bare_conn: &MultiplexedConnection,
    subjects: &Arc<Vec<Subject>>,
    contender: Contender,
) -> (u64, Duration, u64) {
    match contender {
        Contender::Store => {
            let (limiter, subjects) = (s.limiter.clone(), Arc::clone(subjects));
            concurrent_turn(TASKS, SUBJECTS, TURN, move |i| {
                let check = limiter.check(subjects[i].clone(), 1);
                async move {
                    let d = check.await.expect("store call");
                    assert!(d.is_allowed(), "every call is admitted");
                }
            })
            .await
        }
        Contender::Bare => {
            bare_turn(bare_conn, &s.store_cmds, |reply| {
                assert!(admitted(reply), "every call is admitted");
            })
            .await
        }
        Contender::Smallest => {
            let smallest = case.smallest;
            bare_turn(bare_conn, &s.smallest_cmds, move |reply| {
                smallest.assert_admitted(reply);
            })
            .await
        }
    }
}

/// A turn of prebuilt commands, one per subject, sent on one connection; `check`
/// looks at every reply.
async fn bare_turn(
    conn: &MultiplexedConnection,
    cmds: &Arc<Vec<redis::Cmd>>,
    check: impl Fn(&Value) + Copy + Send + Sync + 'static,
) -> (u64, Duration, u64) {
    let (conn, cmds) = (conn.clone(), Arc::clone(cmds));
    concurrent_turn(TASKS, SUBJECTS, TURN, move |i| {
        let (mut conn, cmds) = (conn.clone(), Arc::clone(&cmds));
        async move {
            let reply: Value = cmds[i].query_async(&mut conn).await.expect("bare call");
            check(&reply);
        }
    })
    .await
}

/// A turn of the smallest fixed-window script batched, `batch` subjects a call and
/// `per_subject` keys a subject (`keys`: subject after subject), from
/// round(`TASKS` / `batch`) tasks on one connection (about as many decisions in
/// flight as in the other turns): decisions, time, client CPU (ns).
async fn batched_turn(
    conn: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    per_subject: usize,
    window_ms: u64,
    batch: usize,
) -> (u64, Duration, u64) {
    let (conn, keys) = (conn.clone(), Arc::clone(keys));
    let tasks = (TASKS as f64 / batch as f64).round().max(1.0) as usize;
    let (calls, time, cpu) = concurrent_turn_by(tasks, SUBJECTS, batch, TURN, move |i| {
        let (mut conn, keys) = (conn.clone(), Arc::clone(&keys));
        async move {
            let first = (i % SUBJECTS) * per_subject;
            let subjects =
                (0..batch * per_subject).map(|j| keys[(first + j) % keys.len()].as_str());
            let cmd = reference::smallest_fixed_window_batch(subjects, window_ms);
            let counts: Vec<i64> = cmd.query_async(&mut conn).await.expect("batched call");
            assert_eq!(counts.len(), batch * per_subject, "one count per key");
            assert!(counts.iter().all(|&c| c >= 1), "counts");
        }
    })
    .await;
    (calls * batch as u64, time, cpu)
}

/// Redis CPU per call, in µs, of `redis-benchmark` sending `args`; and its rate.
async fn bench_cpu(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    args: &[String],
    tally: &mut Tally,
) {
    flushall(conn).await;
    let errors = error_replies(conn).await;
    let before = redis_cpu_s(conn).await;
    let (n, t) = redis_benchmark(server.port(), BENCH, args.to_vec()).await;
    let after = redis_cpu_s(conn).await;
    // redis-benchmark does not look at replies: an error (NOSCRIPT, a bad argument)
    // would pass for a very cheap call.
    assert_eq!(
        error_replies(conn).await,
        errors,
        "redis-benchmark's calls failed: {args:?}"
    );
    tally.add(n, t);
    tally.redis_cpu.push((after - before) * 1e6 / n as f64);
}

/// Error replies Redis has sent since it started.
async fn error_replies(conn: &mut MultiplexedConnection) -> u64 {
    info_field(&info(conn, "stats").await, "total_error_replies")
        .and_then(|v| v.parse().ok())
        .expect("INFO stats has total_error_replies")
}

pub(super) async fn run(server: &RedisServer) {
    let mut conn = connect(server).await;
    let bare_conn = connect(server).await;
    let subjects: Arc<Vec<Subject>> = Arc::new((0..SUBJECTS).map(subject).collect());
    let cases = cases();
    let mut setups = Vec::new();
    for case in &cases {
        setups.push(setup(server, case, &subjects).await);
    }
    let mut rates: Vec<Rates> = cases.iter().map(|_| Rates::default()).collect();

    for round in 0..ROUNDS as usize {
        for ((case, s), r) in cases.iter().zip(&setups).zip(&mut rates) {
            // In rotation, starting from a different contender each round.
            for k in 0..CONTENDERS.len() {
                let contender = CONTENDERS[(k + round) % CONTENDERS.len()];
                flushall(&mut conn).await;
                let before = redis_cpu_s(&mut conn).await;
                let sent = s.store.calls_sent();
                let (n, t, cpu) = turn(case, s, &bare_conn, &subjects, contender).await;
                let sent = s.store.calls_sent() - sent;
                let after = redis_cpu_s(&mut conn).await;
                let tally = r.of(contender);
                tally.add(n, t);
                tally.cpu(n, cpu);
                tally.redis_cpu.push((after - before) * 1e6 / n as f64);
                if contender != Contender::Store {
                    continue;
                }
                let per_call = n as f64 / sent.max(1) as f64;
                r.store_per_call.push(per_call);
                // Right after the store's turn: the smallest script batched as many
                // decisions a call as the store's calls carried in it.
                let Some(keys) = &s.batch_keys else {
                    continue;
                };
                let batch = (per_call.round() as usize).max(1);
                flushall(&mut conn).await;
                let before = redis_cpu_s(&mut conn).await;
                let window_ms = case.policies[0].window_ms();
                let per_subject = case.policies.len();
                let (n, t, cpu) =
                    batched_turn(&bare_conn, keys, per_subject, window_ms, batch).await;
                let after = redis_cpu_s(&mut conn).await;
                r.batched.add(n, t);
                r.batched.cpu(n, cpu);
                r.batched.redis_cpu.push((after - before) * 1e6 / n as f64);
                r.batches.push(batch);
            }
        }
        eprintln!(
            "throughput: {TASKS} tasks, round {} of {ROUNDS} done",
            round + 1
        );
    }

    for round in 0..BENCH_ROUNDS {
        for (s, r) in setups.iter().zip(&mut rates) {
            bench_cpu(server, &mut conn, &s.store_args, &mut r.bench_store).await;
            bench_cpu(server, &mut conn, &s.smallest_args, &mut r.bench_smallest).await;
        }
        eprintln!(
            "throughput: redis-benchmark, round {} of {BENCH_ROUNDS} done",
            round + 1
        );
    }
    flushall(&mut conn).await;
    report(&cases, &setups, &rates);
}

fn report(cases: &[Case], setups: &[Setup], rates: &[Rates]) {
    let fw = &rates[0].smallest;
    let bench_fw = &rates[0].bench_smallest;
    println!();
    println!("## Decisions/s and Redis CPU per decision, {TASKS} tasks, against the smallest fixed-window script");
    println!();
    println!(
        "{TASKS} tokio tasks over {} subjects (task t starts at subject t x {}), every decision admitted, \
         Redis flushed before every turn. Contenders: redlimit `Limiter::check` on one `RedisStore` (one \
         multiplexed connection); a bare loop sending the store's own command (`RedisStore::command`, \
         prebuilt per subject) on one redis-rs `MultiplexedConnection`; the smallest script of the \
         algorithm on that same connection (`benches/reference/`; the fixed window's: `TIME`, `INCR` of \
         `<key>:<window number>`, `PEXPIRE` when new, the count as reply). {ROUNDS} turns of {} ms per \
         contender in rotation; figures are medians of turns, ratios the median of each round's ratio to \
         that round's smallest fixed-window turn. Redis CPU: the main thread's `used_cpu_sys_main_thread` + \
         `used_cpu_user_main_thread` delta over the turn / decisions. Client CPU: this process's CPU time \
         (every thread) per decision over the turns. Decisions per Redis call: the store's decisions / its \
         `calls_sent()` delta over the turn (the median turn); the others send one call per decision, but \
         the smallest script batched (`benches/reference/smallest_fixed_window_batch.lua`: `TIME` once, then \
         per key `INCR` of `<key>:<window number>` and `PEXPIRE` when new, the counts as reply), which runs \
         right after the store's fixed-window turn with as many decisions per call (B) as the store's \
         decisions per call in that turn, rounded (at least 1), from round({TASKS} / B) tasks, task t \
         starting at subject t x {} / round({TASKS} / B); and right after the store's two-policy turn, \
         the same with both policies' keys of each subject, two counters a decision: what any store that \
         writes two keys a decision could at least cost.",
        thousands(SUBJECTS as f64),
        SUBJECTS / TASKS,
        TURN.as_millis(),
        thousands(SUBJECTS as f64),
    );
    println!();
    println!("| algorithm | contender | decisions per Redis call | decisions/s | / smallest fixed window (target >= {THROUGHPUT_TARGET}x) | Redis CPU per decision | / smallest fixed window (target) | client CPU per decision |");
    println!("|---|---|---|---|---|---|---|---|");
    for (case, r) in cases.iter().zip(rates) {
        let batched_label = format!(
            "`TIME` once + `INCR` + `PEXPIRE` when new per key, {} a decision, B decisions per call (B by round: {})",
            if case.policies.len() == 1 { "one key" } else { "two keys" },
            r.batches
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut rows = vec![
            (
                "redlimit `Limiter::check`",
                &r.store,
                median(r.store_per_call.clone()),
            ),
            ("bare loop, the store's command", &r.bare, 1.0),
            (case.smallest_label, &r.smallest, 1.0),
        ];
        if !r.batches.is_empty() {
            let per_call = median(r.batches.iter().map(|&b| b as f64).collect());
            rows.push((batched_label.as_str(), &r.batched, per_call));
        }
        for (contender, tally, per_call) in rows {
            let is_store = std::ptr::eq(tally, &r.store);
            let (rate_ratio, cpu_ratio) = (tally.ratio(fw), tally.redis_cpu_ratio(fw));
            let (rate_target, cpu_target) = if is_store {
                (
                    format!(": {}", met(rate_ratio >= THROUGHPUT_TARGET)),
                    format!(
                        " (<= {}x: {})",
                        case.cpu_target,
                        met(cpu_ratio <= case.cpu_target)
                    ),
                )
            } else {
                (String::new(), String::new())
            };
            println!(
                "| {} | {contender} | {per_call:.2} | {} | {rate_ratio:.3}x{rate_target} | {:.2} µs | {cpu_ratio:.2}x{cpu_target} | {:.1} µs |",
                case.label,
                thousands(tally.rate()),
                tally.redis_cpu_us(),
                tally.cpu_us(),
            );
        }
    }

    println!();
    println!("## Redis CPU per call, `{}`", BENCH.describe());
    println!();
    println!(
        "Each script's command with its subjects as `__rand_int__` (`redis-benchmark` draws each on its \
         own, so the two keys of the two-policy call belong to two subjects), Redis flushed before each \
         run, {BENCH_ROUNDS} runs of each in rotation: the main thread's CPU (user + sys) delta / calls, \
         the median run, ratios the median of each round's ratio to that round's smallest fixed-window \
         script. Pipelined from 20 connections, so little of it is network: the server's cost of the \
         script itself. redlimit's command:"
    );
    println!();
    for (case, s) in cases.iter().zip(setups) {
        println!("- {}: `{}`", case.label, s.store_args.join(" "));
    }
    println!();
    println!("| algorithm | redlimit's script | smallest script of the algorithm | redlimit / smallest fixed window (target) | smallest of the algorithm / smallest fixed window | redlimit / smallest of the algorithm |");
    println!("|---|---|---|---|---|---|");
    for (case, r) in cases.iter().zip(rates) {
        let ratio = r.bench_store.redis_cpu_ratio(bench_fw);
        println!(
            "| {} | {:.2} µs | {:.2} µs ({}) | {ratio:.2}x (<= {}x: {}) | {:.2}x | {:.2}x |",
            case.label,
            r.bench_store.redis_cpu_us(),
            r.bench_smallest.redis_cpu_us(),
            case.smallest_label,
            case.cpu_target,
            met(ratio <= case.cpu_target),
            r.bench_smallest.redis_cpu_ratio(bench_fw),
            r.bench_store.redis_cpu_ratio(&r.bench_smallest),
        );
    }

    println!();
    println!("### Targets");
    println!();
    for (case, r) in cases.iter().zip(rates) {
        let (rate, cpu, bench) = (
            r.store.ratio(fw),
            r.store.redis_cpu_ratio(fw),
            r.bench_store.redis_cpu_ratio(bench_fw),
        );
        println!(
            "- {}: {rate:.3}x the smallest fixed-window script's decisions/s at {TASKS} tasks (target >= {THROUGHPUT_TARGET}x: {}); \
             Redis CPU per decision {cpu:.2}x at {TASKS} tasks, {bench:.2}x under redis-benchmark (target <= {}x: {}, {})",
            case.label,
            met(rate >= THROUGHPUT_TARGET),
            case.cpu_target,
            met(cpu <= case.cpu_target),
            met(bench <= case.cpu_target),
        );
    }
    let single: Vec<f64> = rates[..4].iter().map(|r| r.store.rate()).collect();
    let spread = single.iter().cloned().fold(f64::MIN, f64::max)
        / single.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "- fastest / slowest algorithm at {TASKS} tasks (the four single-policy rows): {spread:.2}x (target <= 1.15x: {}; published: 1.42x)",
        met(spread <= 1.15)
    );
    if let Some(two) = rates
        .iter()
        .zip(cases)
        .find_map(|(r, c)| (c.policies.len() == 2 && !r.batches.is_empty()).then_some(r))
    {
        let floor = two.batched.ratio(fw);
        println!(
            "- two policies against the smallest script batched with two keys a decision ({:.2} decisions \
             per Redis call): {:.3}x its decisions/s, {:.2}x its Redis CPU per decision; that batched \
             script itself, the floor of any store that writes two keys a decision: {floor:.3}x the \
             smallest one-call script's decisions/s ({} the {THROUGHPUT_TARGET}x target), {:.2}x its Redis CPU",
            median(two.store_per_call.clone()),
            two.store.ratio(&two.batched),
            two.store.redis_cpu_ratio(&two.batched),
            if floor >= THROUGHPUT_TARGET { "reaches" } else { "short of" },
            two.batched.redis_cpu_ratio(fw),
        );
    }
    let fixed = &rates[0];
    if !fixed.batches.is_empty() {
        println!(
            "- fixed window against the smallest script batched as many decisions a call as the store's \
             ({:.2} decisions per Redis call), the limit of this design at 1.00x: {:.3}x its decisions/s, \
             {:.2}x its Redis CPU per decision",
            median(fixed.store_per_call.clone()),
            fixed.store.ratio(&fixed.batched),
            fixed.store.redis_cpu_ratio(&fixed.batched),
        );
    }
}
