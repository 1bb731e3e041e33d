//! What a decision costs Redis under load, in instructions, with the calls made from
//! Rust: `cargo bench -p redlimit-bench --bench redis_cost`.
//!
//! `lua_cost` measures one call per decision, sent by `redis-benchmark`: the cost of a
//! command. The store is more than its command: when checks queue behind the calls in
//! flight on its one multiplexed connection, the store may send them to Redis together,
//! in fewer calls that each decide many checks, and then a decision costs Redis less
//! than its own call would. Only the store itself, under load, shows how many decisions
//! its calls carry, so this bench makes its calls from Rust, through `Limiter::check`.
//! It is a binary of its own, not a part of `lua_cost`, because it needs a tokio
//! runtime and the store's connection, where `lua_cost` needs neither, and because each
//! then stays a run of a couple of minutes whose table can be rerun alone; the server
//! under callgrind is the same (`benches/callgrind`).
//!
//! Runs `redis-server` under `valgrind --tool=callgrind` on a free loopback port and,
//! in this process, a tokio runtime with one worker. Each turn makes `DECISIONS`
//! decisions (3,000) for as many subjects spread over 100,000, from `TASKS` (16) tasks
//! on ONE connection, after a `FLUSHALL`: every decision creates its subject, the path
//! that writes. The server's instructions over exactly the turn
//! (`callgrind_control --zero` before, `--dump` after) / decisions is the figure.
//! Contenders, in rotation (the first contender moves each round), `ROUNDS` (3) rounds,
//! medians:
//!
//! - the reference: the smallest fixed-window script
//!   (`benches/reference/smallest_fixed_window.lua`: `TIME`, `INCR` of
//!   `<key>:<window number>`, `PEXPIRE` when new), one call per decision, with plain
//!   redis-rs `Script::invoke_async` on a `MultiplexedConnection`;
//! - redlimit `Limiter::check` on a `RedisStore`, for each algorithm and for two
//!   policies in one limiter, with limits no call reaches: every decision must be an
//!   admission. The store's `calls_sent()` over the turn gives its decisions per Redis
//!   call, and Redis's own count of script calls (`INFO commandstats`) must agree;
//! - redlimit with an in-flight policy (`Policy::in_flight`, a limit never reached,
//!   slots of an hour), beside a fixed window and alone: each decision is a request,
//!   its check, its slot taken (`Limiter::hold`, on an `Arc<Limiter>`) and the
//!   `Permit` dropped at once, which queues the release (`Operation::Release`) to
//!   batch with the checks. The turn waits until Redis has run every release: a
//!   release deletes its holder's entry when its count reaches 0, and the key with
//!   its last entry, so the turn asks `DBSIZE` (every 5 ms, on the references'
//!   connection, inside the count: about 4,000 instructions an ask, a few asks a
//!   turn, the report gives them) until only the other policies' keys are left. The
//!   figure is per request (check + release), its target against the smallest
//!   script's per decision; the check alone (no slot held, no release) beside it;
//! - redlimit's fixed window with every task checking one hot subject: a batch reads,
//!   decides on and writes its state once, whatever the number of its checks;
//! - with `--cfg redlimit_peers` (see benches/Cargo.toml): tower-rate-limiter 0.1.6's
//!   Redis store (`Store::increment`, its script: `INCR`, `PEXPIRE` when new, `PTTL`),
//!   the HTTP section's peer, one call per decision on the references' connection,
//!   each subject's key its bare name (as its key extractor would give an API key):
//!   what its layer costs Redis a request, in instructions, where the HTTP section
//!   gives CPU seconds, which swing from run to run;
//! - the smallest fixed-window script batched
//!   (`benches/reference/smallest_fixed_window_batch.lua`: `TIME` once, then per key
//!   `INCR` and `PEXPIRE` when new), B keys per call from round(16 / B) tasks, so
//!   about as many decisions are in flight as in the other turns: B as redlimit's
//!   fixed window's decisions per call of the same round (rounded, at least 1), the
//!   least a store batching as much could cost; and B = 4 and 16, a reference that
//!   does not move with the store.
//!
//! Every reply is checked (a count of 1, an admission) and no call may fail
//! (`INFO errorstats`): a failed call costs little and would flatter its contender.
//! Redis CPU seconds mean nothing under valgrind, so only instructions are reported.
//!
//! Shorter runs (smoke tests): `REDIS_COST_DECISIONS=300 REDIS_COST_ROUNDS=1`. With
//! the peer: `RUSTFLAGS="--cfg redlimit_peers" CARGO_TARGET_DIR=target/peers cargo bench
//! -p redlimit-bench --bench redis_cost --ignore-rust-version`.
//! Needs `valgrind` (with `callgrind_control`), `redis-server` and `redis-cli`
//! (Debian: valgrind, redis-server, redis-tools). About a minute (54 s on two cores,
//! every row), and up to 20 s more for each in-flight turn that would reach a window's
//! end: its rate keys, counted at its end, would expire. `REDLIMIT_REDIS_SERVER` runs
//! another build (Redis 8: `bash .ci/redis8.sh`).

use redlimit::internals::{LimiterInternals, RedisStoreInternals};
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::redis::{self, aio::MultiplexedConnection, AsyncConnectionConfig};
use redlimit::{Limiter, Policy, PolicyError, RedisStore, Subject};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

mod callgrind;
use callgrind::Server;

/// Decisions per turn: enough that the figure is stable to a few tens of instructions
/// per decision, few enough that callgrind's slowdown keeps the run short.
const DECISIONS: usize = 3_000;
/// The subjects the decisions are spread over.
const SUBJECTS: usize = 100_000;
/// Tasks making the decisions, all on one connection.
const TASKS: usize = 16;
const ROUNDS: usize = 3;
/// The batch sizes of the batched reference that do not follow the store.
const FIXED_BATCHES: [usize; 2] = [4, 16];
/// Every policy's window, and the smallest scripts' window argument.
const WINDOW: Duration = Duration::from_secs(60);
/// Calls under callgrind are tens of times slower than natively; no call may time out.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The in-flight policy's slot lifetime: its renewals (every third of it) never come
/// during a run, and no slot expires.
const SLOT_LIFETIME: Duration = Duration::from_secs(3600);
/// How often a [`Kind::Hold`] turn asks Redis (`DBSIZE`) whether its releases have all
/// run. Each ask is counted with the turn: a `DBSIZE` is about 4,000 instructions,
/// and a turn asks a few times, against millions for the turn (the table's notes give
/// the asks per turn).
const RELEASE_POLL: Duration = Duration::from_millis(5);

/// The time a [`Kind::Hold`] turn takes at most, under callgrind: its rate keys are
/// counted at its end, and those written before a window's end would be gone after it.
const HOLD_TURN: Duration = Duration::from_secs(20);

/// Waits, before the count starts, until a window's end is at least [`HOLD_TURN`] away.
fn clear_of_a_window_end() {
    let window = WINDOW.as_millis();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let left = window - now % window;
    if left < HOLD_TURN.as_millis() {
        std::thread::sleep(Duration::from_millis(left as u64 + 100));
    }
}

/// A count from the environment (for short runs), or the default.
fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{name}={v:?}: a positive count"))
    })
}

/// A limiter's policies, what each of its turn's decisions does, and its target:
/// instructions per decision (per request, for [`Kind::Hold`]) at most this times the
/// one-call smallest script's per decision.
struct Case {
    label: &'static str,
    policies: Vec<Policy>,
    kind: Kind,
    target: Option<f64>,
}

/// What a case's turn does with each decision.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// A check of the decision's own subject.
    Check,
    /// A request with an in-flight policy: the check, its slot taken
    /// (`Limiter::hold`) and its `Permit` dropped at once, which queues the release
    /// (`Operation::Release`) with the checks. The turn ends when Redis has run every
    /// release: the subjects' in-flight keys are gone (a holder's entry goes when its
    /// count reaches 0, and the key with its last entry).
    Hold,
    /// A check of one subject, the same for every decision of the turn: a hot subject
    /// whose state each batch reads, decides on and writes once.
    Hot,
}

fn cases() -> Vec<Case> {
    let p = |r: Result<Policy, PolicyError>| r.expect("a valid bench policy");
    let bucket = |name| p(Policy::token_bucket(name, 1_000_000, 1_000_000, WINDOW));
    let fixed = || p(Policy::fixed_window("p", 1_000_000, WINDOW));
    let in_flight = || p(Policy::in_flight("f", 1_000_000, SLOT_LIFETIME));
    vec![
        Case {
            label: "fixed window",
            policies: vec![fixed()],
            kind: Kind::Check,
            target: Some(1.0),
        },
        Case {
            label: "token bucket",
            policies: vec![bucket("p")],
            kind: Kind::Check,
            target: Some(1.0),
        },
        Case {
            label: "sliding window",
            policies: vec![p(Policy::sliding_window("p", 1_000_000, WINDOW))],
            kind: Kind::Check,
            target: Some(1.0),
        },
        Case {
            label: "sliding log (limit 100)",
            policies: vec![p(Policy::sliding_log("p", 100, WINDOW))],
            kind: Kind::Check,
            target: Some(1.0),
        },
        Case {
            label: "sliding window + token bucket",
            policies: vec![
                p(Policy::sliding_window("p", 1_000_000, WINDOW)),
                bucket("q"),
            ],
            kind: Kind::Check,
            target: Some(1.6),
        },
        Case {
            label: "fixed window + in-flight, per request: its check and its release",
            policies: vec![fixed(), in_flight()],
            kind: Kind::Hold,
            target: Some(2.0),
        },
        Case {
            label: "fixed window + in-flight, the check alone (no slot held: no release)",
            policies: vec![fixed(), in_flight()],
            kind: Kind::Check,
            target: None,
        },
        Case {
            label: "in-flight alone, per request: its check and its release",
            policies: vec![in_flight()],
            kind: Kind::Hold,
            target: None,
        },
        Case {
            label: "fixed window, one hot subject (every task checks the same)",
            policies: vec![fixed()],
            kind: Kind::Hot,
            target: None,
        },
    ]
}

/// Who makes a turn's decisions.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Contender {
    /// The smallest fixed-window script, one call per decision.
    Smallest,
    /// `Limiter::check` of the case at this index of [`cases`].
    Store(usize),
    /// The smallest fixed-window script, batched.
    Batch(BatchSize),
    /// tower-rate-limiter's Redis store, one call per decision: on distinct subjects,
    /// or (`hot`) every decision on one, as redlimit's [`Kind::Hot`] case.
    #[cfg(redlimit_peers)]
    Peer { hot: bool },
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum BatchSize {
    /// redlimit's fixed window's decisions per call in the same round.
    AsStore,
    Fixed(usize),
}

/// What one turn measured.
#[derive(Clone, Copy)]
struct Turn {
    instructions: f64,
    /// The store's records (a [`Kind::Hold`] request makes two: its check and its
    /// release) per Redis call.
    decisions_per_call: f64,
    /// The keys per call of a batched turn.
    batch: usize,
    /// The `DBSIZE` asks of a [`Kind::Hold`] turn, waiting for its releases.
    polls: u64,
}

/// Runs `tasks` tasks that share decisions `0..n`, each taking the next `per_call`
/// of them from a common cursor and making one `call` for them, until none is left:
/// the number of calls made.
async fn share<F, Fut>(tasks: usize, n: usize, per_call: usize, call: F) -> u64
where
    F: Fn(Range<usize>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let cursor = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let (cursor, calls, call) = (Arc::clone(&cursor), Arc::clone(&calls), call.clone());
        set.spawn(async move {
            loop {
                let start = cursor.fetch_add(per_call, Ordering::Relaxed);
                if start >= n {
                    break;
                }
                call(start..(start + per_call).min(n)).await;
                calls.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("a task of the turn");
    }
    calls.load(Ordering::Relaxed)
}

struct Bench {
    server: Server,
    rt: Runtime,
    /// The references' connection.
    conn: MultiplexedConnection,
    /// One store for every limiter (clones share its connection and its counters).
    store: RedisStore,
    limiters: Vec<Arc<Limiter<RedisStore>>>,
    kinds: Vec<Kind>,
    /// The `DBSIZE` asks of the last [`Kind::Hold`] turn.
    polls: AtomicU64,
    /// Decision d's subject, and the key the smallest scripts use for it: the key
    /// redlimit's fixed window keeps that subject's state under.
    subjects: Arc<Vec<Subject>>,
    keys: Arc<Vec<String>>,
    smallest: Arc<redis::Script>,
    batch: Arc<redis::Script>,
    decisions: usize,
    /// tower-rate-limiter's store on the references' connection, and decision d's
    /// subject by its bare name, the key it is given.
    #[cfg(redlimit_peers)]
    peer: (tower_rate_limiter::RedisStore, Arc<Vec<String>>),
}

impl Bench {
    fn new(decisions: usize) -> Self {
        let server = Server::start("redis-cost");
        let loaded = server.cli(&[
            "FUNCTION",
            "LOAD",
            "REPLACE",
            RedisStore::function_library(),
        ]);
        assert!(
            loaded.trim().starts_with("redlimit_"),
            "FUNCTION LOAD: {loaded}"
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let smallest = Arc::new(redis::Script::new(include_str!(
            "reference/smallest_fixed_window.lua"
        )));
        let batch = Arc::new(redis::Script::new(include_str!(
            "reference/smallest_fixed_window_batch.lua"
        )));
        let conn = rt.block_on(async {
            let config = AsyncConnectionConfig::new().set_response_timeout(Some(CALL_TIMEOUT));
            let mut conn = redis::Client::open(server.url())
                .expect("a redis URL")
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("a connection to redis-server");
            for script in [&smallest, &batch] {
                script
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .expect("SCRIPT LOAD");
            }
            conn
        });
        let pool = redlimit::deadpool_redis::Config::from_url(server.url())
            .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))
            .expect("a pool");
        let store = RedisStore::new(pool)
            .timeout(CALL_TIMEOUT)
            .max_pipelined(env_usize("REDLIMIT_MAX_PIPELINED", 2))
            .max_batch(env_usize("REDLIMIT_MAX_BATCH", 32));
        let kinds = cases().iter().map(|case| case.kind).collect();
        let limiters: Vec<Arc<Limiter<RedisStore>>> = cases()
            .into_iter()
            .map(|case| {
                let limiter = case
                    .policies
                    .into_iter()
                    .fold(Limiter::builder(store.clone()), |l, p| l.policy(p))
                    .build()
                    .expect("policies named apart");
                Arc::new(limiter)
            })
            .collect();
        let stride = (SUBJECTS / decisions).max(1);
        let names: Vec<String> = (0..decisions)
            .map(|d| format!("{:012}", (d * stride) % SUBJECTS))
            .collect();
        let subjects: Vec<Subject> = names.iter().map(Subject::new).collect();
        let fixed_window = &limiters[0];
        let policy = &fixed_window.policy_set().policies()[0];
        let keys = subjects
            .iter()
            .map(|s| store.key(s, fixed_window.policy_set(), policy))
            .collect();
        Self {
            #[cfg(redlimit_peers)]
            peer: (
                tower_rate_limiter::RedisStore::new(conn.clone()),
                Arc::new(names),
            ),
            server,
            rt,
            conn,
            store,
            limiters,
            kinds,
            polls: AtomicU64::new(0),
            subjects: Arc::new(subjects),
            keys: Arc::new(keys),
            smallest,
            batch,
            decisions,
        }
    }

    /// `n` decisions of `contender` (batches of `batch` keys): the calls made.
    async fn turn(&self, contender: Contender, batch: usize, n: usize) -> u64 {
        let window_ms = WINDOW.as_millis() as u64;
        match contender {
            Contender::Smallest => {
                let (conn, script, keys) = (
                    self.conn.clone(),
                    Arc::clone(&self.smallest),
                    Arc::clone(&self.keys),
                );
                share(TASKS, n, 1, move |d| {
                    let (mut conn, script, keys) =
                        (conn.clone(), Arc::clone(&script), Arc::clone(&keys));
                    async move {
                        let count: i64 = script
                            .key(&keys[d.start])
                            .arg(window_ms)
                            .invoke_async(&mut conn)
                            .await
                            .expect("a call of the smallest script");
                        // Each subject's first decision of the turn creates its key.
                        assert_eq!(count, 1, "the smallest script's count");
                    }
                })
                .await
            }
            Contender::Store(case) => {
                let (limiter, subjects) =
                    (Arc::clone(&self.limiters[case]), Arc::clone(&self.subjects));
                let kind = self.kinds[case];
                let hot = Subject::new("hot");
                let calls = share(TASKS, n, 1, move |d| {
                    let limiter = Arc::clone(&limiter);
                    let subject = match kind {
                        Kind::Hot => hot.clone(),
                        Kind::Check | Kind::Hold => subjects[d.start].clone(),
                    };
                    async move {
                        let decision = limiter
                            .check(subject.clone(), 1)
                            .await
                            .expect("a store call");
                        assert!(decision.is_allowed(), "every decision is an admission");
                        if kind == Kind::Hold {
                            // Dropped at once: the release queues.
                            let permit = limiter.hold(subject, &decision);
                            assert!(permit.is_some(), "an admission takes a slot");
                        }
                    }
                })
                .await;
                if kind == Kind::Hold {
                    self.released(case, n).await;
                }
                calls
            }
            Contender::Batch(_) => {
                let (conn, script, keys) = (
                    self.conn.clone(),
                    Arc::clone(&self.batch),
                    Arc::clone(&self.keys),
                );
                let tasks = (TASKS as f64 / batch as f64).round().max(1.0) as usize;
                share(tasks, n, batch, move |d| {
                    let (mut conn, script, keys) =
                        (conn.clone(), Arc::clone(&script), Arc::clone(&keys));
                    async move {
                        let mut call = script.prepare_invoke();
                        for key in &keys[d.clone()] {
                            call.key(key.as_str());
                        }
                        call.arg(window_ms);
                        let counts: Vec<i64> = call
                            .invoke_async(&mut conn)
                            .await
                            .expect("a call of the batched smallest script");
                        assert_eq!(counts.len(), d.len(), "one count per key");
                        assert!(
                            counts.iter().all(|&c| c == 1),
                            "every subject's first decision: {counts:?}"
                        );
                    }
                })
                .await
            }
            #[cfg(redlimit_peers)]
            Contender::Peer { hot } => {
                use tower_rate_limiter::Store as _;
                let (store, names) = (self.peer.0.clone(), Arc::clone(&self.peer.1));
                share(TASKS, n, 1, move |d| {
                    let (store, names) = (store.clone(), Arc::clone(&names));
                    async move {
                        let name = if hot { "hot" } else { names[d.start].as_str() };
                        let usage = store
                            .increment(name, WINDOW)
                            .await
                            .expect("a call of tower-rate-limiter's store");
                        // Each subject's first decision of the turn creates its key;
                        // the hot subject's count goes up to the turn's decisions.
                        let most = if hot { n as u64 } else { 1 };
                        assert!(
                            (1..=most).contains(&usage.used),
                            "tower-rate-limiter's count: {}",
                            usage.used
                        );
                    }
                })
                .await
            }
        }
    }

    /// Waits until Redis has run the release of every decision `0..n` of case `case`
    /// (a [`Kind::Hold`] turn's): until its in-flight keys are gone, and only its
    /// other policies' keys are left, one per subject and policy (`DBSIZE`, every
    /// [`RELEASE_POLL`]). The asks are kept in `polls`.
    async fn released(&self, case: usize, n: usize) {
        let policies = self.limiters[case].policy_set().policies();
        let others = policies
            .iter()
            .filter(|p| p.algorithm() != redlimit::Algorithm::InFlight)
            .count();
        let subjects: std::collections::HashSet<&Subject> = self.subjects[..n].iter().collect();
        let expected = subjects.len() * others;
        let mut conn = self.conn.clone();
        let (mut polls, mut last, mut since) = (0, usize::MAX, Instant::now());
        loop {
            let keys: usize = redis::cmd("DBSIZE")
                .query_async(&mut conn)
                .await
                .expect("DBSIZE");
            polls += 1;
            if keys == expected {
                break;
            }
            assert!(
                keys > expected,
                "{keys} keys, fewer than the {expected} the checks leave"
            );
            if keys != last {
                (last, since) = (keys, Instant::now());
            }
            assert!(
                since.elapsed() < CALL_TIMEOUT,
                "the releases stopped: {keys} keys left, {expected} expected"
            );
            tokio::time::sleep(RELEASE_POLL).await;
        }
        self.polls.store(polls, Ordering::Relaxed);
    }

    /// One measured turn of `contender`.
    fn measure(&self, contender: Contender, batch: usize) -> Turn {
        if matches!(contender, Contender::Store(case) if self.kinds[case] == Kind::Hold) {
            clear_of_a_window_end();
        }
        let (sent, failed) = (self.store.calls_sent(), self.store.calls_failed());
        self.polls.store(0, Ordering::Relaxed);
        let n = self.decisions;
        let (total, calls) = self
            .server
            .instructions(|| self.rt.block_on(self.turn(contender, batch, n)));
        let redis_calls = self.server.script_calls();
        let polls = self.polls.swap(0, Ordering::Relaxed);
        let records = match contender {
            Contender::Store(case) if self.kinds[case] == Kind::Hold => 2 * n,
            _ => n,
        };
        let calls = match contender {
            Contender::Store(_) => {
                assert_eq!(self.store.calls_failed(), failed, "store calls failed");
                let store_calls = self.store.calls_sent() - sent;
                assert_eq!(
                    store_calls, redis_calls,
                    "calls_sent() counted {store_calls} calls over the turn, Redis ran \
                     {redis_calls} script calls: decisions per call would be misread"
                );
                store_calls
            }
            _ => {
                assert_eq!(calls, redis_calls, "calls made and calls Redis ran");
                calls
            }
        };
        Turn {
            instructions: total as f64 / n as f64,
            decisions_per_call: records as f64 / calls as f64,
            batch,
            polls,
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

fn thousands(x: f64) -> String {
    let digits = (x.round() as u64).to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "1 task", "4 tasks".
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn main() {
    let started = Instant::now();
    let decisions = setting("REDIS_COST_DECISIONS", DECISIONS);
    let rounds = setting("REDIS_COST_ROUNDS", ROUNDS);
    let bench = Bench::new(decisions);
    let cases = cases();

    let mut base: Vec<Contender> = vec![Contender::Smallest];
    #[cfg(redlimit_peers)]
    base.extend([
        Contender::Peer { hot: false },
        Contender::Peer { hot: true },
    ]);
    base.extend((0..cases.len()).map(Contender::Store));
    base.extend(
        FIXED_BATCHES
            .iter()
            .map(|&b| Contender::Batch(BatchSize::Fixed(b))),
    );
    let mut rows: Vec<(Contender, Vec<Turn>)> = base.iter().map(|&c| (c, Vec::new())).collect();
    rows.insert(
        base.len() - FIXED_BATCHES.len(),
        (Contender::Batch(BatchSize::AsStore), Vec::new()),
    );

    // One unmeasured turn of each contender first: the store connects, and every
    // path has run once (callgrind translates code the first time it runs).
    for &contender in &base {
        bench.server.cli(&["FLUSHALL"]);
        bench
            .rt
            .block_on(bench.turn(contender, 4, (4 * TASKS).min(decisions)));
    }

    for round in 0..rounds {
        let mut order = base.clone();
        let first = round % order.len();
        order.rotate_left(first);
        // The store's fixed window sets the batch of the turn right after it.
        let at = order
            .iter()
            .position(|&c| c == Contender::Store(0))
            .expect("the fixed window");
        order.insert(at + 1, Contender::Batch(BatchSize::AsStore));
        let mut store_batch = 1;
        for contender in order {
            let batch = match contender {
                Contender::Batch(BatchSize::AsStore) => store_batch,
                Contender::Batch(BatchSize::Fixed(b)) => b,
                _ => 1,
            };
            let turn = bench.measure(contender, batch);
            if contender == Contender::Store(0) {
                store_batch = (turn.decisions_per_call.round() as usize).max(1);
            }
            let row = rows
                .iter_mut()
                .find(|(c, _)| *c == contender)
                .expect("a row");
            row.1.push(turn);
        }
        eprintln!("redis_cost: round {} of {rounds} done", round + 1);
    }

    let info = bench.server.cli(&["INFO", "server"]);
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    report(&cases, &rows, decisions, rounds, &version);
    println!("\nwhole run: {:.0} s", started.elapsed().as_secs_f64());
}

fn report(
    cases: &[Case],
    rows: &[(Contender, Vec<Turn>)],
    decisions: usize,
    rounds: usize,
    version: &str,
) {
    let turns =
        |who: Contender| -> &[Turn] { &rows.iter().find(|(c, _)| *c == who).expect("a row").1 };
    let reference = turns(Contender::Smallest);
    // The median of each round's ratio to that round's `other` turn.
    let ratio = |of: &[Turn], to: &[Turn]| -> f64 {
        median(
            of.iter()
                .zip(to)
                .map(|(a, b)| a.instructions / b.instructions)
                .collect(),
        )
    };
    let median_of = |of: &[Turn], f: fn(&Turn) -> f64| median(of.iter().map(f).collect());

    println!("## Redis instructions per decision under load, calls made from Rust (callgrind)");
    println!();
    println!(
        "`cargo bench -p redlimit-bench --bench redis_cost`: Redis {} under `valgrind --tool=callgrind`; {} decisions \
         per turn for as many subjects spread over {} (every decision creates its subject), made by \
         {TASKS} tokio tasks (one worker thread) on one connection, Redis flushed before every turn. \
         The server's instructions over exactly the turn (`callgrind_control --zero`, then `--dump`) \
         / decisions. {}, contenders in rotation; figures are medians of the rounds, \
         ratios the median of each round's ratio to that round's one-call smallest script. \
         Decisions per Redis call: the store's `calls_sent()` over the turn (Redis's own count \
         of script calls agrees), the batched script's keys per call. The batched script at \
         redlimit's B runs right after redlimit's fixed window, with B its decisions per call \
         rounded (at least 1), from round({TASKS} / B) tasks. In-flight rows (a fixed window and \
         an in-flight policy, or the in-flight policy alone, limits never reached, slots of an \
         hour): each decision is a request, its check, its slot taken (`Limiter::hold`) and its \
         `Permit` dropped at once, whose release (`Operation::Release`) queues and batches with \
         the checks; the turn ends when Redis has run every release (its in-flight keys gone: \
         `DBSIZE` asked every {} ms, counted with the turn; such a turn starts {} s or more \
         before a window ends, so that none of its rate keys expires before it is counted), its \
         figure per request (check + release) and its records (checks and releases) per Redis \
         call. The hot subject's row: \
         every decision of the turn checks one subject (its key created once).",
        version,
        thousands(decisions as f64),
        thousands(SUBJECTS as f64),
        count(rounds, "round"),
        RELEASE_POLL.as_millis(),
        HOLD_TURN.as_secs(),
    );
    println!();
    println!("| contender | decisions (records) per Redis call | Redis instructions per decision (request) | range over rounds | / one-call smallest script | target | met |");
    println!("|---|---|---|---|---|---|---|");
    let line = |label: String, of: &[Turn], target: Option<f64>| {
        let r = ratio(of, reference);
        let (lo, hi) = of
            .iter()
            .map(|t| t.instructions)
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let (target, met) = match target {
            Some(t) => (
                format!("<= {t:.1}x"),
                if r <= t { "met" } else { "NOT met" }.to_owned(),
            ),
            None => (String::new(), String::new()),
        };
        println!(
            "| {label} | {:.2} | {} | {}-{} | {r:.2}x | {target} | {met} |",
            median_of(of, |t| t.decisions_per_call),
            thousands(median_of(of, |t| t.instructions)),
            thousands(lo),
            thousands(hi),
        );
    };
    line(
        "smallest fixed-window script, one call per decision (`Script::invoke_async`), the reference"
            .to_owned(),
        reference,
        None,
    );
    #[cfg(redlimit_peers)]
    for (hot, label) in [
        (false, ""),
        (true, ", one hot subject (every task increments the same)"),
    ] {
        line(
            format!(
                "tower-rate-limiter 0.1.6's Redis store (`Store::increment`), one call per decision{label}"
            ),
            turns(Contender::Peer { hot }),
            None,
        );
    }
    for (i, case) in cases.iter().enumerate() {
        line(
            format!("redlimit `Limiter::check`, {}", case.label),
            turns(Contender::Store(i)),
            case.target,
        );
    }
    let as_store = turns(Contender::Batch(BatchSize::AsStore));
    let batches: Vec<String> = as_store.iter().map(|t| t.batch.to_string()).collect();
    line(
        format!(
            "smallest script batched, B = redlimit fixed window's decisions per call (B by round: {})",
            batches.join(", ")
        ),
        as_store,
        None,
    );
    for b in FIXED_BATCHES {
        let tasks = (TASKS as f64 / b as f64).round().max(1.0) as usize;
        line(
            format!(
                "smallest script batched, B = {b} ({})",
                count(tasks, "task")
            ),
            turns(Contender::Batch(BatchSize::Fixed(b))),
            None,
        );
    }
    println!();
    println!(
        "- redlimit's fixed window / the smallest script batched at redlimit's B (the limit of \
         this design is 1.00x): {:.2}x",
        ratio(turns(Contender::Store(0)), as_store)
    );
    #[cfg(redlimit_peers)]
    {
        let hot = cases
            .iter()
            .position(|case| case.kind == Kind::Hot)
            .expect("the hot subject's case");
        println!(
            "- redlimit's fixed window / tower-rate-limiter's store, round by round (the HTTP \
             targets ask <= 0.8x its Redis CPU a request): on distinct subjects, each decision \
             creating its key (100,000 API keys) {:.2}x; on one hot subject (one client IP) {:.2}x",
            ratio(
                turns(Contender::Store(0)),
                turns(Contender::Peer { hot: false })
            ),
            ratio(
                turns(Contender::Store(hot)),
                turns(Contender::Peer { hot: true })
            ),
        );
    }
    for (i, case) in cases.iter().enumerate() {
        let of = turns(Contender::Store(i));
        match case.kind {
            Kind::Hold => println!(
                "- {}: {} instructions per request / {} per decision of the one-call smallest \
                 script = {:.2}x{}; {:.2} records per Redis call; `DBSIZE` asks per turn, \
                 waiting for the releases: {}",
                case.label,
                thousands(median_of(of, |t| t.instructions)),
                thousands(median_of(reference, |t| t.instructions)),
                ratio(of, reference),
                case.target.map_or(String::new(), |t| format!(
                    " (target <= {t:.1}x: {})",
                    if ratio(of, reference) <= t {
                        "met"
                    } else {
                        "NOT met"
                    }
                )),
                median_of(of, |t| t.decisions_per_call),
                of.iter()
                    .map(|t| t.polls.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            Kind::Hot => println!(
                "- {}: {} instructions per decision, {:.2} decisions per Redis call; the \
                 fixed window on distinct subjects, same rounds: {} per decision, {:.2} per call",
                case.label,
                thousands(median_of(of, |t| t.instructions)),
                median_of(of, |t| t.decisions_per_call),
                thousands(median_of(turns(Contender::Store(0)), |t| t.instructions)),
                median_of(turns(Contender::Store(0)), |t| t.decisions_per_call),
            ),
            Kind::Check => {}
        }
    }
}

/// A store setting from the environment, to measure other settings than the
/// defaults: `REDLIMIT_MAX_PIPELINED`, `REDLIMIT_MAX_BATCH`.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
