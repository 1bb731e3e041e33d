//! Criterion benchmarks: `cargo bench -p redlimit-bench --bench redlimit`.
//!
//! One entry file, one module per subject. The memory store's futures are ready at once,
//! so they are polled in place with a no-op waker: what is measured is the decision, not
//! an executor.

use redlimit::internals::{Backend, CheckNow, LimiterInternals};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{criterion_group, criterion_main};

/// Polls a future that is ready at once (the memory store's).
fn now<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory store's future is always ready"),
    }
}

mod memory {
    use super::*;
    use criterion::{BenchmarkId, Criterion, Throughput};
    use redlimit::clock::FakeClock;
    use redlimit::{Algorithm, Limiter, MemoryStore, Policy, Subject};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn policy(algorithm: Algorithm) -> Policy {
        let w = Duration::from_secs(60);
        match algorithm {
            Algorithm::FixedWindow => Policy::fixed_window("p", 1_000_000, w),
            Algorithm::SlidingWindow => Policy::sliding_window("p", 1_000_000, w),
            Algorithm::TokenBucket => Policy::token_bucket("p", 1_000_000, 1_000_000, w),
            _ => Policy::sliding_log("p", 1_000, w),
        }
        .expect("valid bench policy")
    }

    /// One decision on one thread, over 10,000 subjects in turn (the map is warm).
    ///
    /// Each algorithm twice: through `Limiter::check` and its future (what a caller
    /// awaits), and `, store only`: the store's own `check_now` with the limiter's policy
    /// set, the same decision without the limiter's future around it. Before them, the
    /// fixed window on `MemoryStore::new` (the monotonic clock, read once per decision).
    pub fn single_thread(c: &mut Criterion) {
        let mut group = c.benchmark_group("memory_store/decision");
        group.throughput(Throughput::Elements(1));
        let subjects: Vec<Subject> = (0..10_000)
            .map(|i| Subject::new(format!("ip=10.0.{}.{}", i / 256, i % 256)))
            .collect();
        // First: the sliding log's rows leave 80 MB of logs behind, which slows what
        // follows them. The store (and its sweeping thread) is dropped after its row.
        {
            let limiter = Limiter::new(MemoryStore::new(), policy(Algorithm::FixedWindow));
            let mut i = 0;
            group.bench_function(
                BenchmarkId::from_parameter("fixed_window, monotonic clock"),
                |b| {
                    b.iter(|| {
                        i = (i + 1) % subjects.len();
                        black_box(now(limiter.check(subjects[i].clone(), 1)).expect("decided"))
                    })
                },
            );
        }
        // Calendar quotas need the `calendar` feature, which this package leaves off.
        for algorithm in Algorithm::ALL
            .into_iter()
            .filter(|a| *a != Algorithm::Calendar)
        {
            let clock = FakeClock::new(1_000_000);
            let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()), policy(algorithm));
            let mut i = 0;
            group.bench_function(BenchmarkId::from_parameter(algorithm), |b| {
                b.iter(|| {
                    i = (i + 1) % subjects.len();
                    if i == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                    black_box(now(limiter.check(subjects[i].clone(), 1)).expect("decided"))
                })
            });
            let mut i = 0;
            let id = format!("{algorithm}, store only");
            group.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| {
                    i = (i + 1) % subjects.len();
                    if i == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                    let (store, set) = (limiter.store(), limiter.policy_set());
                    match store.check_now(subjects[i].clone(), set, 1) {
                        CheckNow::Decided(decision) => black_box(decision.expect("decided")),
                        CheckNow::Later(_) => unreachable!("the memory store decides at once"),
                    }
                })
            });
        }
        // The reference, same run: governor's keyed GCRA limiter (a DashMap too), as
        // tower_governor uses it; its natural call borrows the key, ours takes a
        // `Subject` by value, so ours pays for the clone.
        let quota =
            governor::Quota::per_minute(std::num::NonZeroU32::new(1_000_000).expect("non-zero"));
        let keys: Vec<String> = (0..10_000)
            .map(|i| format!("ip=10.0.{}.{}", i / 256, i % 256))
            .collect();
        let reference = governor::RateLimiter::dashmap(quota);
        let mut i = 0;
        group.bench_function(
            BenchmarkId::from_parameter("governor keyed (reference)"),
            |b| {
                b.iter(|| {
                    i = (i + 1) % keys.len();
                    black_box(reference.check_key(&keys[i]).is_ok())
                })
            },
        );
        group.finish();
    }

    /// The same decisions from 1 and 2 threads on one store: does it scale? Each
    /// thread has its own 10,000 subjects, made before the clock starts.
    pub fn threads(c: &mut Criterion) {
        let mut group = c.benchmark_group("memory_store/threads");
        let subjects: Vec<Vec<Subject>> = (0..2)
            .map(|t| {
                (0..10_000)
                    .map(|i| Subject::new(format!("t{t}-{i}")))
                    .collect()
            })
            .collect();
        for threads in [1usize, 2] {
            group.throughput(Throughput::Elements(threads as u64));
            let limiter = Arc::new(Limiter::new(
                MemoryStore::new(),
                policy(Algorithm::SlidingWindow),
            ));
            group.bench_function(BenchmarkId::from_parameter(threads), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    std::thread::scope(|scope| {
                        for t in 0..threads {
                            let (limiter, subjects) = (Arc::clone(&limiter), &subjects[t]);
                            scope.spawn(move || {
                                for i in 0..iters {
                                    let subject = subjects[i as usize % subjects.len()].clone();
                                    black_box(now(limiter.check(subject, 1)).expect("decided"));
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, memory::single_thread, memory::threads);
criterion_main!(benches);
