//! Housekeeping off the request path: `cargo bench -p redlimit-bench --bench housekeeping`.
//!
//! (a) The memory store's sweep: 1,000,000 live subjects, then decisions from 2 threads
//! for 6 s (six sweep intervals of the default one second), each decision timed alone.
//! Beside them, the same decisions on a store that never sweeps, and the same 2 threads
//! timing a loop that does no store work (two clock reads) for as long: the machine's
//! own noise, which no decision can beat. The last three columns count the stalls.
//!
//! (b) The block cache: 1,000,000 distinct denied subjects through a cache of 100,000
//! entries, the time per check (cache lookup, a store that always denies, cache insert)
//! for each slice of 100,000; beside it the same through a cache that never fills.
//!
//! Bounded: each block-cache slice stops after 2 s, so the whole run ends in well
//! under two minutes even with a cache that scans itself on every insert.

use redlimit::internals::{AdminStore, Backend, Operation, PolicySet};
use redlimit::store::StoreError;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use redlimit::{Decision, Limiter, MemoryStore, Policy, Subject};

const LIVE_SUBJECTS: usize = 1_000_000;
const THREADS: u64 = 2;
const RUN: Duration = Duration::from_secs(6);
const DENIED_SUBJECTS: usize = 1_000_000;
const CACHE_ENTRIES: usize = 100_000;
const SLICE_BUDGET: Duration = Duration::from_secs(2);

/// Polls a future that is ready at once (the memory store's).
fn now<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory store's future is always ready"),
    }
}

/// Exact latency percentiles: one counter per nanosecond up to 64 µs, and every
/// slower sample kept as it is (they are few).
struct Latencies {
    per_ns: Vec<u64>,
    slow: Vec<u64>,
    count: u64,
}

const FINE_NS: usize = 1 << 16;

impl Latencies {
    fn new() -> Self {
        Self {
            per_ns: vec![0; FINE_NS],
            slow: Vec::new(),
            count: 0,
        }
    }

    fn record(&mut self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        match self.per_ns.get_mut(ns as usize) {
            Some(slot) => *slot += 1,
            None => self.slow.push(ns),
        }
        self.count += 1;
    }

    fn merge(mut self, other: Self) -> Self {
        for (a, b) in self.per_ns.iter_mut().zip(&other.per_ns) {
            *a += b;
        }
        self.slow.extend(other.slow);
        self.count += other.count;
        self
    }

    /// The smallest sample at or above the `q` quantile.
    fn quantile(&mut self, q: f64) -> u64 {
        let rank = ((self.count as f64 * q).ceil() as u64).clamp(1, self.count.max(1));
        let mut seen = 0;
        for (ns, n) in self.per_ns.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return ns as u64;
            }
        }
        self.slow.sort_unstable();
        let index = (rank - seen - 1) as usize;
        self.slow.get(index).copied().unwrap_or(0)
    }

    fn line(mut self, what: &str) {
        let (p50, p99, p9999, max) = (
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(0.9999),
            self.quantile(1.0),
        );
        let over = |ns: u64| self.slow.iter().filter(|&&s| s > ns).count();
        println!(
            "| {what} | {} | {p50} ns | {p99} ns | {p9999} ns ({:.1}x median) | {:.3} ms | {} | {} | {} |",
            self.count,
            p9999 as f64 / p50.max(1) as f64,
            max as f64 / 1e6,
            over(100_000),
            over(1_000_000),
            over(8_000_000),
        );
    }
}

/// A tiny xorshift: which subject each decision picks, without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A store on the monotonic clock holding 1,000,000 live subjects.
fn filled(sweep_every: Duration, subjects: &[Subject]) -> (MemoryStore, Limiter<MemoryStore>) {
    let store = MemoryStore::new().sweep_every(sweep_every);
    let limiter = Limiter::new(
        store.clone(),
        Policy::sliding_window("p", 1_000_000, Duration::from_secs(60)).expect("valid policy"),
    );
    for subject in subjects {
        now(limiter.check(subject.clone(), 1)).expect("decided");
    }
    assert_eq!(store.len(), subjects.len());
    (store, limiter)
}

/// `work` from `THREADS` threads for `RUN`, each call timed (`work` gets the thread's
/// own random state).
fn timed_on_threads(work: impl Fn(&mut u64) + Sync) -> Latencies {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let work = &work;
                scope.spawn(move || {
                    let mut latencies = Latencies::new();
                    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    let end = Instant::now() + RUN;
                    loop {
                        let start = Instant::now();
                        work(&mut rng);
                        let done = Instant::now();
                        latencies.record(done - start);
                        if done >= end {
                            return latencies;
                        }
                    }
                })
            })
            .collect();
        merged(handles.into_iter().map(|h| h.join().expect("bench thread")))
    })
}

/// Decisions on random live subjects from `THREADS` threads for `RUN`, each timed.
fn decisions(limiter: &Limiter<MemoryStore>, subjects: &[Subject]) -> Latencies {
    timed_on_threads(|rng| {
        let subject = subjects[next(rng) as usize % subjects.len()].clone();
        black_box(now(limiter.check(subject, 1)).expect("decided"));
    })
}

fn sweep_under_load() {
    let subjects: Vec<Subject> = (0..LIVE_SUBJECTS)
        .map(|i| Subject::new(format!("ip=10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)))
        .collect();
    // Both stores are filled first, on fresh memory alike; the reference is the same
    // decisions on a store that never sweeps.
    let (store, limiter) = filled(Duration::from_secs(1), &subjects);
    let (_, unswept_limiter) = filled(Duration::from_secs(1 << 30), &subjects);
    // What one pass over the map costs, all at once (the old code made one request
    // pay for it every second).
    let pass = Instant::now();
    store.sweep();
    let pass = pass.elapsed();
    println!(
        "{} live subjects; one explicit sweep of them all: {:.1} ms; decisions for {} s on \
         {THREADS} threads",
        store.len(),
        pass.as_secs_f64() * 1e3,
        RUN.as_secs()
    );
    let swept = decisions(&limiter, &subjects);
    drop((store, limiter));

    // References, same run, same threads: the same decisions on a store that never
    // sweeps, and a loop that does no store work at all.
    let unswept = decisions(&unswept_limiter, &subjects);
    drop(unswept_limiter);
    let noise = timed_on_threads(|_| black_box(()));
    println!(
        "| loop ({THREADS} threads, {} s each) | samples | median | p99 | p99.99 | max | > 100 µs | > 1 ms | > 8 ms |",
        RUN.as_secs()
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    swept.line("decision, 1,000,000 live subjects, swept every second");
    unswept.line("decision, the same on a store that never sweeps (reference)");
    noise.line("no store work (two clock reads): the noise");
}

fn merged(all: impl Iterator<Item = Latencies>) -> Latencies {
    all.reduce(Latencies::merge).expect("at least one thread")
}

/// A store that denies every request with the same long wait: what is measured is the
/// block cache, not a store.
struct Denies(Decision);

impl Backend for Denies {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _: Subject, _: &PolicySet, _: u64) -> Self::Future {
        ready(Ok(self.0.clone()))
    }
}

/// Its admin operations decide as its checks do.
impl AdminStore for Denies {
    fn run(&self, _: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.check(subject, set, cost)
    }
}

fn block_cache_flood() {
    // One token an hour: the second request is denied for about an hour, so every
    // block stays live for the whole run.
    let policy = Policy::token_bucket("p", 1, 1, Duration::from_secs(3_600)).expect("valid");
    let probe = Limiter::new(MemoryStore::new(), policy.clone());
    now(probe.check("probe", 1)).expect("decided");
    let denied = now(probe.check("probe", 1)).expect("decided");
    assert!(!denied.is_allowed() && denied.retry_after() > Some(Duration::from_secs(60)));
    let subjects: Vec<Subject> = (0..DENIED_SUBJECTS)
        .map(|i| Subject::new(format!("flood-{i}")))
        .collect();
    println!(
        "\n{DENIED_SUBJECTS} distinct denied subjects, ns per check (lookup, store, insert) \
         per slice of 100,000; a slice stops after {} s",
        SLICE_BUDGET.as_secs()
    );
    println!(
        "| slice | cache of {CACHE_ENTRIES} | cache of 2,000,000 (never full: the reference) |"
    );
    println!("|---|---|---|");
    let run = |entries: usize| -> Vec<String> {
        let limiter = Limiter::builder(Denies(denied.clone()))
            .policy(policy.clone())
            .block_cache(entries)
            .build()
            .expect("one policy");
        subjects
            .chunks(100_000)
            .map(|slice| {
                let start = Instant::now();
                let mut done = 0;
                for chunk in slice.chunks(256) {
                    for subject in chunk {
                        black_box(now(limiter.check(subject.clone(), 1)).expect("decided"));
                    }
                    done += chunk.len();
                    if start.elapsed() > SLICE_BUDGET {
                        break;
                    }
                }
                let ns = start.elapsed().as_nanos() as f64 / done as f64;
                if done < slice.len() {
                    format!("{ns:.0} ns (stopped after {done})")
                } else {
                    format!("{ns:.0} ns")
                }
            })
            .collect()
    };
    let bounded = run(CACHE_ENTRIES);
    let unbounded = run(2_000_000);
    for (i, (b, u)) in bounded.iter().zip(&unbounded).enumerate() {
        println!("| {}-{}k | {b} | {u} |", i * 100, (i + 1) * 100);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks one part.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |part: &str| filter.as_deref().is_none_or(|f| part.contains(f));
    if wants("sweep") {
        sweep_under_load();
    }
    if wants("block_cache") {
        block_cache_flood();
    }
}
