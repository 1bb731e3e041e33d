//! Property tests over random policies and random traces (proptest).
//!
//! - The memory store and the Redis store (one real `redis-server` for the file) make
//!   identical decisions at every step.
//! - Each algorithm keeps its promise, checked against the full admitted history with
//!   independent bookkeeping: the sliding log never admits more than its limit in any
//!   window of its length, the windows never more than the limit per aligned window,
//!   the token bucket never more than capacity + rate x time in any interval.
//! - Retry-After is exact: the same request is denied until it, admitted at it.
//! - A denial changes no state; a denial by one policy consumes from none; the block
//!   cache changes no decision.
//! - Any bytes map injectively to Redis keys, the subject alone inside the hash tag.
//!
//! Traces are walked on a fake clock: steps of 0 ms, of up to three windows, onto exact
//! window boundaries and retry times (and one millisecond either side), and backwards.

use crate::support;
use redlimit::internals::{LimiterInternals, RedisStoreInternals};

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use redlimit::clock::FakeClock;
use redlimit::internals::traces::Spec;
use redlimit::internals::SubjectInternals;
use redlimit::key::Secret;
use redlimit::{Algorithm, Decision, Limiter, MemoryStore, Policy, RedisStore, Subject};
use support::props::{limiter, SideBySide};
use support::{hash_tag, RedisServer};

// ---------------------------------------------------------------------------------
// Random policies and traces.

/// Policy names, by position in the set (names must be unique).
const NAMES: [&str; 3] = ["a", "b", "c"];

/// A policy's numbers: limits 1..=20, windows and periods 10..=2000 ms.
fn spec(name: &'static str, only: Option<Algorithm>) -> BoxedStrategy<Spec> {
    let limit = 1u32..=20;
    let window = 10u64..=2_000;
    let windowed = (limit.clone(), window.clone());
    match only {
        Some(Algorithm::FixedWindow) => windowed
            .prop_map(move |(l, w)| Spec::Fixed(name, l, w))
            .boxed(),
        Some(Algorithm::SlidingWindow) => windowed
            .prop_map(move |(l, w)| Spec::Sliding(name, l, w))
            .boxed(),
        Some(Algorithm::SlidingLog) => windowed
            .prop_map(move |(l, w)| Spec::Log(name, l, w))
            .boxed(),
        Some(Algorithm::TokenBucket) => (limit, 1u32..=20, window)
            .prop_map(move |(c, r, p)| Spec::Bucket(name, c, r, p))
            .boxed(),
        _ => prop_oneof![
            spec(name, Some(Algorithm::FixedWindow)),
            spec(name, Some(Algorithm::SlidingWindow)),
            spec(name, Some(Algorithm::SlidingLog)),
            spec(name, Some(Algorithm::TokenBucket)),
        ]
        .boxed(),
    }
}

/// One to three policies with unique names; the first of algorithm `first` if given.
fn specs(first: Option<Algorithm>) -> impl Strategy<Value = Vec<Spec>> {
    specs_from(1, first)
}

/// `at_least` (1 to 3) to three policies with unique names.
fn specs_from(at_least: usize, first: Option<Algorithm>) -> impl Strategy<Value = Vec<Spec>> {
    (
        spec(NAMES[0], first),
        at_least..=3,
        spec(NAMES[1], None),
        spec(NAMES[2], None),
    )
        .prop_map(|(a, n, b, c)| [a, b, c][..n].to_vec())
}

fn built(specs: &[Spec]) -> Vec<Policy> {
    specs.iter().map(|s| s.policy()).collect()
}

/// How the clock moves before a step.
#[derive(Debug, Clone, Copy)]
enum Move {
    /// Not at all: the same millisecond.
    Stay,
    /// Forward by `permille` thousandths of a policy's window (up to three windows).
    Forward { policy: usize, permille: u64 },
    /// To a policy's next aligned window boundary, plus `offset` (-1, 0 or 1) ms.
    Boundary { policy: usize, offset: i64 },
    /// To the previous decision's retry time (its reset time if it admitted), plus
    /// `offset` (-1, 0 or 1) ms.
    Retry { offset: i64 },
    /// Backwards by `permille` thousandths of a policy's window (up to one window).
    Back { policy: usize, permille: u64 },
}

/// The cost of a step.
#[derive(Debug, Clone, Copy)]
enum Cost {
    One,
    /// The previous step's cost: the same request again.
    Same,
    /// 1 + n % the largest cost every policy admits.
    Any(u32),
}

type Step = (Move, Cost);

fn step(backwards: bool) -> impl Strategy<Value = Step> {
    let offset = -1i64..=1;
    let policy = 0usize..3;
    let forward = prop_oneof![
        3 => Just(Move::Stay),
        4 => (policy.clone(), 0u64..=3_000)
            .prop_map(|(policy, permille)| Move::Forward { policy, permille }),
        2 => (policy.clone(), offset.clone())
            .prop_map(|(policy, offset)| Move::Boundary { policy, offset }),
        3 => offset.prop_map(|offset| Move::Retry { offset }),
    ];
    let moves = if backwards {
        prop_oneof![
            12 => forward,
            1 => (policy, 1u64..=1_000)
                .prop_map(|(policy, permille)| Move::Back { policy, permille }),
        ]
        .boxed()
    } else {
        forward.boxed()
    };
    let cost = prop_oneof![
        5 => Just(Cost::One),
        3 => Just(Cost::Same),
        2 => any::<u32>().prop_map(Cost::Any),
    ];
    (moves, cost)
}

fn trace(backwards: bool, max_len: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(backwards), 1..=max_len)
}

/// The clock before the first step: near zero, or near today's epoch milliseconds.
fn start_ms() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..5_000, 1_600_000_000_000u64..1_900_000_000_000]
}

/// Turns steps into (time, cost), following the decisions as they come.
struct Walk {
    windows: Vec<u64>,
    max_cost: u64,
    now: u64,
    last: Option<(u32, Decision)>,
    /// Whether the clock has gone back at some step.
    went_back: bool,
    /// The latest time reached so far.
    high: u64,
}

impl Walk {
    fn new(policies: &[Policy], start_ms: u64) -> Self {
        Self {
            // A bucket's fill time rounded down: its `window_ms` is rounded up, and the
            // foreign bound below counts in exact fill times (2.2 ms, not 3).
            windows: policies
                .iter()
                .map(|p| match p.algorithm() {
                    redlimit::Algorithm::TokenBucket => {
                        (p.limit() * p.emission_interval_us() / 1_000).max(1)
                    }
                    _ => p.window_ms(),
                })
                .collect(),
            max_cost: policies.iter().map(Policy::max_cost).min().unwrap_or(1),
            now: start_ms,
            last: None,
            went_back: false,
            high: start_ms,
        }
    }

    /// The time and cost of the next step.
    fn next(&mut self, (how, cost): Step) -> (u64, u32) {
        let window = |policy: usize| self.windows[policy % self.windows.len()];
        let now = self.now;
        let forward_to = |target: i64| u64::try_from(target).unwrap_or(0).max(now);
        self.now = match how {
            Move::Stay => now,
            Move::Forward { policy, permille } => now + window(policy) * permille / 1_000,
            Move::Boundary { policy, offset } => {
                let w = window(policy);
                forward_to(((now / w + 1) * w) as i64 + offset)
            }
            Move::Retry { offset } => match &self.last {
                Some((_, d)) => {
                    let o = d.outcome();
                    let wait = if d.is_allowed() {
                        o.reset_after_ms
                    } else {
                        o.retry_after_ms
                    };
                    forward_to((now + wait) as i64 + offset)
                }
                None => now,
            },
            // Never more than 3 of the smallest windows behind the latest time: stores
            // decide on stored state for a clock up to 4 windows back (4 fill times
            // for a bucket); state further ahead is foreign and starts fresh, which
            // the traces and the algorithms' own tests cover.
            Move::Back { policy, permille } => now
                .saturating_sub((window(policy) * permille / 1_000).max(1))
                .max(
                    self.high
                        .saturating_sub(3 * self.windows.iter().min().copied().unwrap_or(1)),
                ),
        };
        self.went_back |= self.now < now;
        self.high = self.high.max(self.now);
        let cost = match cost {
            Cost::One => 1,
            Cost::Same => self.last.as_ref().map_or(1, |(c, _)| u64::from(*c)),
            Cost::Any(n) => 1 + u64::from(n) % self.max_cost,
        };
        (self.now, u32::try_from(cost).expect("costs are at most 20"))
    }

    fn record(&mut self, cost: u32, decision: Decision) {
        self.last = Some((cost, decision));
    }
}

// ---------------------------------------------------------------------------------
// The memory store on a fake clock, driven without an async runtime.

/// A limiter on a fresh memory store with its own fake clock, for one subject.
struct Local {
    clock: FakeClock,
    limiter: Limiter<MemoryStore>,
    subject: Subject,
}

impl Local {
    fn new(policies: &[Policy]) -> Self {
        let clock = FakeClock::new(0);
        Self {
            limiter: limiter(MemoryStore::with_clock(clock.clone()), policies),
            clock,
            subject: Subject::new("s"),
        }
    }

    fn with_limiter(f: impl FnOnce(FakeClock) -> Limiter<MemoryStore>) -> Self {
        let clock = FakeClock::new(0);
        Self {
            limiter: f(clock.clone()),
            clock,
            subject: Subject::new("s"),
        }
    }

    fn at(&self, now: u64, cost: u32) -> Decision {
        self.for_subject(&self.subject, now, cost)
    }

    fn for_subject(&self, subject: &Subject, now: u64, cost: u32) -> Decision {
        self.clock.set_ms(now);
        let mut check = pin!(self.limiter.check(subject.clone(), cost));
        match check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(decision)) => decision,
            Poll::Ready(Err(e)) => panic!("the memory store failed at {now} ms: {e}"),
            Poll::Pending => panic!("the memory store answers at once"),
        }
    }
}

/// Redis cases: each up to 60 steps, two round trips per step.
const REDIS_CASES: u32 = 128;
/// Memory-store cases: each up to 80 steps, a few microseconds per step.
const MEMORY_CASES: u32 = 600;
/// Limiter cases, which run two or more stores side by side.
const LIMITER_CASES: u32 = 400;
/// Key cases: each up to 40 subjects of up to 2000 bytes.
const KEY_CASES: u32 = 400;

/// `cases` cases, or as many as `PROPTEST_CASES` says (to run many more, say
/// overnight); failing cases are saved in `tests/properties.proptest-regressions`.
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// Runs `test` on `cases` random values (a proptest runner, shrinking on failure) and
/// returns the sum of what the cases counted, for the caller to check that they
/// exercised what they claim to.
fn run_counting<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<u64, TestCaseError>,
) -> u64 {
    let total = Cell::new(0);
    let mut runner = TestRunner::new(config(cases));
    let result = runner.run(&strategy, |value| {
        total.set(total.get() + test(value)?);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    total.get()
}

// ---------------------------------------------------------------------------------
// 1. The memory store and the Redis store agree.

/// How one run of a trace on both stores went.
#[derive(Debug, Default)]
struct Compared {
    admitted: u64,
    denied: u64,
    /// Steps whose state Redis lost to a real-time expiry and the runner put back
    /// (see `support::props`).
    restored: u64,
}

/// Runs one trace on both stores for `subject`; fails on the first step where their
/// decisions differ.
async fn compare(
    server: &RedisServer,
    policies: &[Policy],
    start: u64,
    steps: &[Step],
    subject: Subject,
) -> Result<Compared, TestCaseError> {
    let mut run = SideBySide::new(server, policies, start, subject).await;
    let mut walk = Walk::new(policies, start);
    let mut compared = Compared::default();
    for (i, &step) in steps.iter().enumerate() {
        let (now, cost) = walk.next(step);
        let pair = run.step(now, cost).await.map_err(TestCaseError::fail)?;
        prop_assert_eq!(
            &pair.redis,
            &pair.memory,
            "step {} at {} ms, cost {}: Redis (left) and memory (right) differ",
            i,
            now,
            cost
        );
        if pair.redis.is_allowed() {
            compared.admitted += 1;
        } else {
            compared.denied += 1;
        }
        compared.restored += u64::from(pair.restored);
        walk.record(cost, pair.memory);
    }
    Ok(compared)
}

#[test]
fn memory_and_redis_stores_agree_on_random_policies_and_traces() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    let (runs, admitted, denied, restored) =
        (Cell::new(0u64), Cell::new(0), Cell::new(0), Cell::new(0));
    let mut runner = TestRunner::new(config(REDIS_CASES));
    // Random bytes in every subject (braces, colons, percents), after a unique prefix.
    let subject = prop::collection::vec(any::<u8>(), 0..24);
    let result = runner.run(
        &(specs(None), start_ms(), trace(true, 60), subject),
        |(specs, start, steps, raw)| {
            let policies = built(&specs);
            runs.set(runs.get() + 1);
            let mut bytes = format!("run-{}:", runs.get()).into_bytes();
            bytes.extend(&raw);
            let subject = Subject::new(bytes);
            let run = runtime.block_on(compare(&server, &policies, start, &steps, subject))?;
            admitted.set(admitted.get() + run.admitted);
            denied.set(denied.get() + run.denied);
            restored.set(restored.get() + run.restored);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}\n{}", server.log_tail());
    }
    eprintln!(
        "memory = Redis: {REDIS_CASES} cases in {} runs, {} admitted and {} denied steps, \
         {} steps whose state was lost to a real-time expiry and put back, in {:?}",
        runs.get(),
        admitted.get(),
        denied.get(),
        restored.get(),
        started.elapsed()
    );
    // The traces must exercise both answers.
    assert!(
        admitted.get() > 1_000 && denied.get() > 300,
        "{admitted:?} admitted, {denied:?} denied"
    );
    runtime.block_on(server.assert_every_key_expires());
}

// ---------------------------------------------------------------------------------
// 2. Each algorithm's promise, on its full admitted history.

/// What one policy has admitted, stamped with the time the store decided it at: a
/// clock that went back is clamped by the store (to the stored window's start, or to
/// the newest stamp of a sliding log), and the bookkeeping does the same.
struct History {
    policy: Policy,
    admitted: Vec<(u64, u64)>,
}

impl History {
    fn new(policy: Policy) -> Self {
        Self {
            policy,
            admitted: Vec::new(),
        }
    }

    /// The time the store decides this policy at when asked at `now`.
    fn effective(&self, now: u64) -> u64 {
        let w = self.policy.window_ms();
        match (self.policy.algorithm(), self.admitted.last()) {
            (Algorithm::FixedWindow | Algorithm::SlidingWindow, Some(&(t, _)))
                if now / w < t / w =>
            {
                t / w * w
            }
            (Algorithm::SlidingLog, Some(&(t, _))) => now.max(t),
            _ => now,
        }
    }

    fn sum(&self, range: impl Fn(u64) -> bool) -> u64 {
        self.admitted
            .iter()
            .filter(|(t, _)| range(*t))
            .map(|(_, c)| c)
            .sum()
    }

    /// Whether the algorithm's definition admits `cost` at `at`, from the history
    /// alone (for the token bucket, on a clock that only moved forward).
    fn admits(&self, at: u64, cost: u64) -> Option<bool> {
        let (limit, w) = (self.policy.limit(), self.policy.window_ms());
        let window = at / w;
        match self.policy.algorithm() {
            Algorithm::FixedWindow => Some(self.sum(|t| t / w == window) + cost <= limit),
            Algorithm::SlidingWindow => {
                let cur = self.sum(|t| t / w == window);
                let prev = self.sum(|t| t / w + 1 == window);
                Some((cur + cost) * w + prev * (w - at % w) <= limit * w)
            }
            Algorithm::SlidingLog => Some(self.sum(|t| t + w > at) + cost <= limit),
            Algorithm::TokenBucket => {
                // The bucket as a debt of microseconds that drains one per microsecond:
                // each admission adds cost x interval, and the debt may never pass the
                // capacity's worth.
                let e = self.policy.emission_interval_us();
                let (mut debt, mut last) = (0u64, 0u64);
                for &(t, c) in &self.admitted {
                    debt = debt.saturating_sub(t.saturating_sub(last) * 1_000) + c * e;
                    last = t;
                }
                let debt = debt.saturating_sub(at.saturating_sub(last) * 1_000);
                Some(debt + cost * e <= limit * e)
            }
            _ => None,
        }
    }

    /// The algorithm's promise over the whole history.
    fn check_promise(&self) -> Result<(), TestCaseError> {
        let (limit, w) = (self.policy.limit(), self.policy.window_ms());
        let p = &self.policy;
        match p.algorithm() {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let mut per_window = BTreeMap::new();
                for &(t, c) in &self.admitted {
                    *per_window.entry(t / w).or_insert(0) += c;
                }
                for (window, n) in per_window {
                    prop_assert!(n <= limit, "{:?}: {} admitted in window {}", p, n, window);
                }
            }
            Algorithm::SlidingLog => {
                // Every window of length w that holds stamps is (t - w, t] for the
                // stamp t at its end.
                for &(end, _) in &self.admitted {
                    let n = self.sum(|t| t <= end && t + w > end);
                    prop_assert!(
                        n <= limit,
                        "{:?}: {} admitted in ({}, {}]",
                        p,
                        n,
                        end.saturating_sub(w),
                        end
                    );
                }
            }
            Algorithm::TokenBucket => {
                // In [a, b] at most capacity + (b - a) / emission interval: the bucket
                // holds the capacity at a and refills one token per interval.
                let t = p.emission_interval_us();
                for (i, &(a, _)) in self.admitted.iter().enumerate() {
                    let mut n = 0;
                    for &(b, c) in &self.admitted[i..] {
                        n += c;
                        let bound = limit + (b - a) * 1_000 / t;
                        prop_assert!(
                            n <= bound,
                            "{:?}: {} admitted in [{}, {}], bound {}",
                            p,
                            n,
                            a,
                            b,
                            bound
                        );
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Runs a trace on the memory store and checks every policy's promise, and that the
/// store decides exactly as each definition says (admitted: every policy admits;
/// denied: the policy named as binding denies).
fn keeps_promises(specs: &[Spec], start: u64, steps: &[Step]) -> Result<(), TestCaseError> {
    let policies = built(specs);
    let local = Local::new(&policies);
    let mut histories: Vec<History> = policies.iter().cloned().map(History::new).collect();
    let mut walk = Walk::new(&policies, start);
    for (i, &step) in steps.iter().enumerate() {
        let (now, cost) = walk.next(step);
        let decision = local.at(now, cost);
        let c = u64::from(cost);
        for (p, history) in histories.iter().enumerate() {
            let bucket = history.policy.algorithm() == Algorithm::TokenBucket;
            if bucket && walk.went_back {
                continue;
            }
            let at = history.effective(now);
            let what = format!("step {i} at {now} ms (store time {at}), cost {cost}");
            if let Some(admits) = history.admits(at, c) {
                if decision.is_allowed() {
                    prop_assert!(
                        admits,
                        "{}: {:?} admitted, its definition denies",
                        what,
                        history.policy
                    );
                } else if decision.policy_index() == p {
                    prop_assert!(
                        !admits,
                        "{}: {:?} denied, its definition admits",
                        what,
                        history.policy
                    );
                }
            }
        }
        if decision.is_allowed() {
            for history in &mut histories {
                let at = history.effective(now);
                history.admitted.push((at, c));
            }
        }
        walk.record(cost, decision);
    }
    for history in &histories {
        if history.policy.algorithm() != Algorithm::TokenBucket || !walk.went_back {
            history.check_promise()?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(MEMORY_CASES))]

    #[test]
    fn sliding_log_never_admits_more_than_its_limit_in_any_window(
        specs in specs(Some(Algorithm::SlidingLog)),
        start in start_ms(),
        steps in trace(true, 80),
    ) {
        keeps_promises(&specs, start, &steps)?;
    }

    #[test]
    fn fixed_window_never_admits_more_than_its_limit_per_aligned_window(
        specs in specs(Some(Algorithm::FixedWindow)),
        start in start_ms(),
        steps in trace(true, 80),
    ) {
        keeps_promises(&specs, start, &steps)?;
    }

    #[test]
    fn sliding_window_never_admits_more_than_its_limit_per_aligned_window(
        specs in specs(Some(Algorithm::SlidingWindow)),
        start in start_ms(),
        steps in trace(true, 80),
    ) {
        keeps_promises(&specs, start, &steps)?;
    }

    /// On a clock that only moves forward: going back, the bucket is clamped to the
    /// moment it was last empty, which the interval bound does not describe.
    #[test]
    fn token_bucket_never_admits_more_than_capacity_plus_refill_in_any_interval(
        specs in specs(Some(Algorithm::TokenBucket)),
        start in start_ms(),
        steps in trace(false, 80),
    ) {
        keeps_promises(&specs, start, &steps)?;
    }
}

// ---------------------------------------------------------------------------------
// Retry-After, and what a denial leaves behind.

/// After a denial at `t` with retry time `t + r`, the next step (nothing else happens
/// in between) asks again at `now`:
/// - with a cost at least as large, it is denied while `now < t + r` (what the block
///   cache relies on);
/// - the same request, asked no earlier than `t`, is admitted at any `now >= t + r`,
///   and when denied before, it names the same retry time.
///
/// Returns how many steps checked exactness.
fn checks_retry_after(specs: &[Spec], start: u64, steps: &[Step]) -> Result<u64, TestCaseError> {
    let policies = built(specs);
    let local = Local::new(&policies);
    let mut walk = Walk::new(&policies, start);
    let mut denied: Option<(u64, u32, u64)> = None;
    let mut exact_checks = 0;
    for (i, &step) in steps.iter().enumerate() {
        let (now, cost) = walk.next(step);
        let decision = local.at(now, cost);
        let retry = decision.outcome().retry_after_ms;
        if let Some((t, c, at)) = denied {
            let what = format!(
                "step {i} at {now} ms, cost {cost}, after a denial at {t} ms, cost {c}, \
                 retry at {at} ms"
            );
            if cost >= c && now < at {
                prop_assert!(
                    !decision.is_allowed(),
                    "{}: admitted before the retry time",
                    what
                );
            }
            if cost == c && now >= t {
                exact_checks += 1;
                if now < at {
                    prop_assert_eq!(now + retry, at, "{}: the retry time moved", what);
                } else {
                    prop_assert!(
                        decision.is_allowed(),
                        "{}: denied at the retry time: {:?}",
                        what,
                        decision
                    );
                }
            }
        }
        if decision.is_allowed() {
            prop_assert_eq!(retry, 0);
            denied = None;
        } else {
            prop_assert!(retry > 0, "step {}: denied with no wait: {:?}", i, decision);
            denied = Some((now, cost, now + retry));
        }
        walk.record(cost, decision);
    }
    Ok(exact_checks)
}

/// Runs the trace on two stores: one sees every request, the other only those the
/// first admitted. If denials change nothing, both decide every admitted request
/// identically (remaining, reset and all).
fn denials_change_nothing(specs: &[Spec], start: u64, steps: &[Step]) -> Result<(), TestCaseError> {
    let policies = built(specs);
    let every = Local::new(&policies);
    let admitted_only = Local::new(&policies);
    let mut walk = Walk::new(&policies, start);
    for (i, &step) in steps.iter().enumerate() {
        let (now, cost) = walk.next(step);
        let decision = every.at(now, cost);
        if decision.is_allowed() {
            let without_denials = admitted_only.at(now, cost);
            prop_assert_eq!(
                &without_denials,
                &decision,
                "step {} at {} ms, cost {}: without the denied requests (left) and with \
                 them (right)",
                i,
                now,
                cost
            );
        }
        walk.record(cost, decision);
    }
    Ok(())
}

#[test]
fn retry_after_is_exact_on_a_clock_that_moves_forward() {
    let checked = run_counting(
        MEMORY_CASES,
        (specs(None), start_ms(), trace(false, 80)),
        |(specs, start, steps)| checks_retry_after(&specs, start, &steps),
    );
    eprintln!("{checked} requests repeated after a denial");
    assert!(
        checked > 1_000,
        "only {checked} steps asked again after a denial"
    );
}

/// After a clock that went back the store decides on its stored time, and the waits
/// it names must still count from the time asked.
#[test]
fn retry_after_is_exact_after_the_clock_went_back() {
    let checked = run_counting(
        MEMORY_CASES,
        (specs(None), start_ms(), trace(true, 80)),
        |(specs, start, steps)| checks_retry_after(&specs, start, &steps),
    );
    eprintln!("{checked} requests repeated after a denial");
    assert!(
        checked > 1_000,
        "only {checked} steps asked again after a denial"
    );
}

proptest! {
    #![proptest_config(config(MEMORY_CASES))]

    #[test]
    fn a_denial_changes_no_state(
        specs in specs(None),
        start in start_ms(),
        steps in trace(true, 80),
    ) {
        denials_change_nothing(&specs, start, &steps)?;
    }
}

// ---------------------------------------------------------------------------------
// 3. The limiter: several policies, and the block cache.

/// The binding policy as `Decision` documents it: when denied, the denier with the
/// longest wait (the first of equals); when admitted, the policy with the fewest units
/// left (the first of equals).
fn binding(outcomes: &[Decision]) -> usize {
    let allowed = outcomes.iter().all(Decision::is_allowed);
    let mut best = 0;
    for (i, d) in outcomes.iter().enumerate() {
        let (o, b) = (d.outcome(), outcomes[best].outcome());
        let better = if allowed {
            o.remaining < b.remaining
        } else {
            !o.allowed && (b.allowed || o.retry_after_ms > b.retry_after_ms)
        };
        if better {
            best = i;
        }
    }
    best
}

/// Compares the limiter with several policies against one limiter per policy, each
/// fed only the requests the combined limiter admitted.
fn consumes_from_none(specs: &[Spec], start: u64, steps: &[Step]) -> Result<(), TestCaseError> {
    let policies = built(specs);
    let combined = Local::new(&policies);
    let mut separate: Vec<Local> = policies
        .iter()
        .map(|p| Local::new(std::slice::from_ref(p)))
        .collect();
    let mut history: Vec<(u64, u32)> = Vec::new();
    let mut walk = Walk::new(&policies, start);
    for (i, &step) in steps.iter().enumerate() {
        let (now, cost) = walk.next(step);
        let decision = combined.at(now, cost);
        let alone: Vec<Decision> = separate.iter().map(|s| s.at(now, cost)).collect();
        let what = format!("step {i} at {now} ms, cost {cost}");
        prop_assert_eq!(
            decision.is_allowed(),
            alone.iter().all(Decision::is_allowed),
            "{}: combined {:?}, alone {:?}",
            what,
            decision,
            alone
        );
        let expected = binding(&alone);
        prop_assert_eq!(
            decision.policy_index(),
            expected,
            "{}: the binding policy",
            what
        );
        prop_assert_eq!(
            decision.outcome(),
            alone[expected].outcome(),
            "{}: the binding outcome",
            what
        );
        if decision.is_allowed() {
            history.push((now, cost));
        } else {
            // The combined limiter consumed nothing: undo what single policies admitted
            // by replaying only the admitted requests.
            for (p, d) in alone.iter().enumerate() {
                if d.is_allowed() {
                    let fresh = Local::new(std::slice::from_ref(&policies[p]));
                    for &(t, c) in &history {
                        fresh.at(t, c);
                    }
                    separate[p] = fresh;
                }
            }
        }
        walk.record(cost, decision);
    }
    Ok(())
}

/// Runs the trace (over a few subjects) with and without a block cache of
/// `entries`: the decisions must be the same but for where they came from. Returns
/// how many the cache answered.
fn block_cache_changes_nothing(
    specs: &[Spec],
    start: u64,
    steps: &[(Step, usize)],
    entries: usize,
) -> Result<u64, TestCaseError> {
    let policies = built(specs);
    // The cache spares the store calls, and the memory store sweeps expired entries on
    // calls: when the clock then goes back, a swept subject starts afresh where an
    // unswept one is clamped to its old state. No sweeping, so both stores keep the same
    // state and only the cache differs.
    let unswept = |clock: &FakeClock| {
        MemoryStore::with_clock(clock.clone()).sweep_every(std::time::Duration::from_secs(1 << 40))
    };
    let plain = Local::with_limiter(|clock| limiter(unswept(&clock), &policies));
    let cached = Local::with_limiter(|clock| {
        support::props::builder(unswept(&clock), &policies)
            .block_cache(entries)
            .local_clock(clock)
            .build()
            .unwrap()
    });
    let subjects: Vec<Subject> = (0..3).map(|i| Subject::new(format!("s{i}"))).collect();
    let mut walk = Walk::new(&policies, start);
    let mut from_cache = 0;
    for (i, &(step, who)) in steps.iter().enumerate() {
        let (now, cost) = walk.next(step);
        let subject = &subjects[who];
        let store = plain.for_subject(subject, now, cost);
        let local = cached.for_subject(subject, now, cost);
        let what = format!(
            "step {i} at {now} ms, cost {cost}, {subject:?}: store (left), with a block \
             cache (right)"
        );
        prop_assert_eq!(store.is_allowed(), local.is_allowed(), "{}", what);
        prop_assert_eq!(store.policy_index(), local.policy_index(), "{}", what);
        let (s, l) = (store.outcome(), local.outcome());
        if local.origin() == redlimit::Origin::BlockCache {
            from_cache += 1;
            // The cache repeats the units left at the denial; the store counts those
            // that have come back since (never enough for the request). A clock that
            // went back can show fewer (a window clamped to its start), so compare only
            // on a clock that moved forward.
            if !walk.went_back {
                prop_assert!(l.remaining <= s.remaining, "{}: {:?}, {:?}", what, s, l);
            }
            prop_assert_eq!(
                (l.allowed, l.limit, l.reset_after_ms, l.retry_after_ms),
                (s.allowed, s.limit, s.reset_after_ms, s.retry_after_ms),
                "{}",
                what
            );
        } else {
            prop_assert_eq!(s, l, "{}", what);
        }
        walk.record(cost, store);
    }
    Ok(from_cache)
}

proptest! {
    #![proptest_config(config(LIMITER_CASES))]

    #[test]
    fn a_denial_by_one_policy_consumes_from_none(
        specs in specs_from(2, None),
        start in start_ms(),
        steps in trace(true, 60),
    ) {
        consumes_from_none(&specs, start, &steps)?;
    }
}

fn block_cache_cases(backwards: bool) -> u64 {
    // Mostly one subject, so its denials repeat; sometimes others, to fill the cache.
    let subject = prop_oneof![6 => Just(0usize), 1 => Just(1), 1 => Just(2)];
    let steps = prop::collection::vec((step(backwards), subject), 1..=80);
    run_counting(
        LIMITER_CASES,
        (specs(None), start_ms(), steps, 1usize..=3),
        |(specs, start, steps, entries)| {
            block_cache_changes_nothing(&specs, start, &steps, entries)
        },
    )
}

#[test]
fn the_block_cache_changes_no_decision() {
    let cached = block_cache_cases(false);
    eprintln!("the block cache answered {cached} requests");
    assert!(cached > 200, "the cache answered only {cached} requests");
}

#[test]
fn the_block_cache_changes_no_decision_when_the_clock_goes_back() {
    let cached = block_cache_cases(true);
    eprintln!("the block cache answered {cached} requests (the clock going back)");
    assert!(cached > 200, "the cache answered only {cached} requests");
}

// ---------------------------------------------------------------------------------
// 4. Keys.

/// What a subject is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Input {
    Raw(Vec<u8>),
    Secret(Vec<u8>),
    Pair(Vec<u8>, Vec<u8>),
}

impl Input {
    fn subject(&self) -> Subject {
        match self {
            Input::Raw(bytes) => Subject::new(bytes),
            Input::Secret(bytes) => Secret::new("server-side secret")
                .expect("a secret that is not empty")
                .subject(bytes),
            Input::Pair(a, b) => Subject::pair(&Subject::new(a), &Subject::new(b)),
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Input::Raw(_) => 0,
            Input::Secret(_) => 1,
            Input::Pair(..) => 2,
        }
    }
}

/// Bytes rich in the characters that matter to keys: braces, colons, percents.
fn hostile_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        3 => any::<u8>(),
        2 => prop::sample::select(b"{}:%#$".to_vec()),
        1 => prop::sample::select(b"aZ09._=/@-".to_vec()),
    ];
    prop::collection::vec(byte, 0..=max)
}

/// Up to 140 hostile bytes (around the 128 where values start to be hashed), or up to
/// 2000 of any kind (cheaper to generate, and hashed whatever they hold).
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => hostile_bytes(140),
        1 => prop::collection::vec(any::<u8>(), 0..=2_000),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        6 => bytes().prop_map(Input::Raw),
        1 => bytes().prop_map(Input::Secret),
        1 => (bytes(), bytes()).prop_map(|(a, b)| Input::Pair(a, b)),
    ]
}

/// The escaping the subject documents: `[A-Za-z0-9._=:/@-]` kept, every other byte
/// as `%XX` (upper-case hex).
fn escaped(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"._=:/@-".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The text between the first `{` and the next `}`.
fn tag_of(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    Some(&key[open + 1..open + 1 + len])
}

fn keys_are_injective(inputs: Vec<Input>, prefix: &str) -> Result<(), TestCaseError> {
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1/")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("a pool (it connects lazily)");
    let store = RedisStore::new(pool)
        .prefix(prefix)
        .expect("a valid prefix");
    let ms = std::time::Duration::from_millis;
    let policies = [
        Policy::fixed_window("a", 1, ms(1_000)).expect("valid"),
        Policy::token_bucket("a.b-c_9", 3, 1, ms(100)).expect("valid"),
    ];
    let set = redlimit::Limiter::builder(store.clone())
        .policy(policies[0].clone())
        .policy(policies[1].clone())
        .build()
        .unwrap();
    // Lookalikes: each raw value's escaped text as a raw value, and small edits.
    let mut all = inputs.clone();
    for input in &inputs {
        if let Input::Raw(bytes) = input {
            all.push(Input::Raw(escaped(bytes).into_bytes()));
            all.push(Input::Raw([bytes.as_slice(), b"%"].concat()));
            all.push(Input::Raw(
                bytes
                    .iter()
                    .map(|&b| if b == b'{' { b'}' } else { b })
                    .collect(),
            ));
            let mut tag = String::new();
            input.subject().write_key_part(&mut tag);
            all.push(Input::Raw(tag.into_bytes()));
        }
    }
    let mut by_key: HashMap<String, Subject> = HashMap::new();
    let mut by_subject: HashMap<Subject, Input> = HashMap::new();
    for input in all {
        let subject = input.subject();
        prop_assert!(
            subject.as_bytes().len() <= 129,
            "{:?} keeps {} bytes",
            input,
            subject.as_bytes().len()
        );
        if let Input::Raw(bytes) = &input {
            // Short raw values are kept as they are (the tag byte, then the value).
            prop_assert_eq!(
                bytes.len() <= 128,
                subject.as_bytes() == [b"r", bytes.as_slice()].concat()
            );
        }
        if let Some(other) = by_subject.insert(subject.clone(), input.clone()) {
            if other.kind() == input.kind() {
                prop_assert_eq!(&other, &input, "two inputs give the same subject");
            }
        }
        let mut expected = String::new();
        subject.write_key_part(&mut expected);
        if expected.is_empty() {
            expected.push('%');
        }
        // A pair is a raw value too (the lengths-prefixed join of both).
        match subject.as_bytes().split_first() {
            Some((b'r', [])) => prop_assert_eq!(&expected, "%"),
            Some((b'r', value)) => prop_assert_eq!(&expected, &escaped(value)),
            // Long values and secrets: '#' or '$' and a 128-bit hash in hex.
            _ => prop_assert!(
                expected.len() == 33
                    && expected[1..].bytes().all(|b| b.is_ascii_hexdigit())
                    && (expected.starts_with('#') || expected.starts_with('$')),
                "{:?} has tag {}",
                input,
                expected
            ),
        }
        for policy in &policies {
            let key = store.key(&subject, set.policy_set(), policy);
            let tag = tag_of(&key);
            prop_assert_eq!(tag, Some(expected.as_str()), "{:?}: key {}", input, key);
            prop_assert!(
                !expected.contains(['{', '}']),
                "{:?}: tag {}",
                input,
                expected
            );
            // What Redis Cluster hashes: every policy of a subject in one slot.
            prop_assert_eq!(hash_tag(key.as_bytes()), expected.as_bytes());
            prop_assert!(
                key.len() <= 32 + 2 + 3 * 128 + 2 + 13 + 64 + 3,
                "{} bytes",
                key.len()
            );
            if let Some(other) = by_key.insert(key.clone(), subject.clone()) {
                prop_assert_eq!(&other, &subject, "two subjects share the key {}", key);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(KEY_CASES))]

    #[test]
    fn subjects_map_injectively_to_keys_inside_their_hash_tag(
        inputs in prop::collection::vec(input(), 1..8),
        prefix in "[A-Za-z0-9_.:-]{1,32}",
    ) {
        keys_are_injective(inputs, &prefix)?;
    }
}

/// The smallest trace the random walk found where the cache denied what the store
/// admitted: a token bucket of 1 is denied, then the clock goes back further than the
/// store reads the bucket's state as its own, so the store starts it afresh.
#[test]
fn the_block_cache_asks_the_store_once_the_clock_is_behind_a_denial() {
    let specs = [Spec::Fixed("a", 3, 10), Spec::Bucket("b", 1, 9, 10)];
    let steps = [
        (
            (
                Move::Forward {
                    policy: 0,
                    permille: 500,
                },
                Cost::One,
            ),
            0,
        ),
        ((Move::Stay, Cost::One), 0),
        (
            (
                Move::Back {
                    policy: 2,
                    permille: 500,
                },
                Cost::One,
            ),
            0,
        ),
    ];
    block_cache_changes_nothing(&specs, 0, &steps, 1).unwrap();
}
