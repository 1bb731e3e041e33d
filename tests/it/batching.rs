//! Batched calls: checks that queue behind calls in flight on the store's connection
//! go to Redis as one call, and each is decided as its own call would be.
//!
//! `tokio::join!` polls its futures in order, so every check it holds is made before
//! any reply can arrive: with one call allowed in flight, the first goes alone and the
//! others queue, in order, for the next batch, whatever the machine's speed.

use crate::support;
use redlimit::store::StoreErrorKind;

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use redlimit::clock::FakeClock;
use redlimit::{Error, Limiter, MemoryStore, Policy, RedisStore};
use support::RedisServer;
use tokio::task::JoinSet;

/// One call in flight at a time: every check made meanwhile waits for the next batch.
fn store(server: &RedisServer) -> RedisStore {
    server
        .store()
        .timeout(Duration::from_secs(5))
        .max_pipelined(1)
}

fn fixed(limit: u32) -> Policy {
    Policy::fixed_window("b", limit, Duration::from_secs(3_600)).unwrap()
}

/// Remaining units of an admitted check, `None` for a denial.
fn remaining(result: Result<redlimit::Decision, Error>) -> Option<u64> {
    let decision = result.expect("a decision");
    decision.is_allowed().then(|| decision.remaining())
}

#[tokio::test]
async fn checks_in_one_batch_are_decided_in_order_and_apart() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server), fixed(4));
    let redis_store = limiter.store().clone();
    // Connect (and load the library) first, so the batch below is the second call.
    limiter.check("warm", 1).await.unwrap();
    support::wait_for_function_library(&mut server.conn().await).await;
    let sent = redis_store.calls_sent();

    // One subject five times: 1 goes alone; 2, 2, 1 and 1 queue in that order.
    let (a, b, c, d, e) = tokio::join!(
        limiter.check("s", 1),
        limiter.check("s", 2),
        limiter.check("s", 2),
        limiter.check("s", 1),
        limiter.check("s", 1),
    );
    // In order: 4 - 1 = 3, 3 - 2 = 1, denied (2 > 1), 1 - 1 = 0, denied. A denial
    // touches no other check, and the batch is not all or nothing.
    let got = [a, b, c, d, e].map(remaining);
    assert_eq!(got, [Some(3), Some(1), None, Some(0), None]);
    assert_eq!(
        redis_store.calls_sent() - sent,
        2,
        "one call alone, one batch"
    );
}

#[tokio::test]
async fn a_batch_mixes_limiters_subjects_and_algorithms() {
    let server = RedisServer::start();
    let shared = store(&server);
    let hour = Duration::from_secs(3_600);
    let a = Limiter::new(shared.clone(), fixed(2));
    let b = Limiter::builder(shared.clone())
        .policy(Policy::sliding_window("sw", 3, hour).unwrap())
        .policy(Policy::token_bucket("tb", 2, 1, hour).unwrap())
        .policy(Policy::sliding_log("sl", 5, hour).unwrap())
        .build()
        .unwrap();
    a.check("warm", 1).await.unwrap();
    support::wait_for_function_library(&mut server.conn().await).await;
    let sent = shared.calls_sent();

    let (a1, b1, a2, b2, a3, b3, x1) = tokio::join!(
        a.check("s", 1),
        b.check("s", 1),
        a.check("s", 1),
        b.check("s", 1),
        a.check("s", 1),
        b.check("s", 1),
        a.check("other", 2),
    );
    assert_eq!(shared.calls_sent() - sent, 2);
    // Limiter a: 2 per hour. Limiter b: the token bucket of 2 denies the third.
    assert_eq!([a1, a2, a3].map(remaining), [Some(1), Some(0), None]);
    let b: Vec<_> = [b1, b2, b3].into_iter().map(|r| r.unwrap()).collect();
    assert!(b[0].is_allowed() && b[1].is_allowed());
    assert_eq!(b[2].denied_by(), Some("tb"));
    // Limiter b's third check was denied by one policy, so it consumed from none.
    assert_eq!(b[2].policies().len(), 3);
    let peek = Limiter::builder(shared.clone())
        .policy(Policy::sliding_window("sw", 3, hour).unwrap())
        .policy(Policy::token_bucket("tb", 2, 1, hour).unwrap())
        .policy(Policy::sliding_log("sl", 5, hour).unwrap())
        .build()
        .unwrap()
        .peek("s", 1)
        .await
        .unwrap();
    assert_eq!(peek.denied_by(), Some("tb"), "the bucket is empty");
    assert_eq!(remaining(x1), Some(0));
    server.assert_every_key_expires().await;
}

/// A batch of checks of one set at cost 1 on Redis TIME, each of another subject:
/// the common call, which the Lua decides on a path of its own (a joint set's key a
/// check). Each subject's state stays in its own key.
#[tokio::test]
async fn a_batch_of_subjects_each_checked_once_keeps_each_state_in_its_own_key() {
    let server = RedisServer::start();
    let shared = store(&server);
    let hour = Duration::from_secs(3_600);
    // Sliding windows: a window's end between two rounds changes no figure here.
    let one = Limiter::new(
        shared.clone(),
        Policy::sliding_window("one", 3, hour).unwrap(),
    );
    // Two policies of one subject: both states in one key.
    let joint = Limiter::builder(shared.clone())
        .policy(Policy::sliding_window("sw", 3, hour).unwrap())
        .policy(Policy::token_bucket("tb", 5, 1, hour).unwrap())
        .build()
        .unwrap();
    one.check("warm", 1).await.unwrap();
    support::wait_for_function_library(&mut server.conn().await).await;
    for (limiter, what) in [(&one, "one policy"), (&joint, "two policies")] {
        for round in 1..=3u64 {
            let sent = shared.calls_sent();
            // "a" goes alone (or queues too); "b", "c" and "d" queue, in that order,
            // for one batch.
            let (a, b, c, d) = tokio::join!(
                limiter.check("a", 1),
                limiter.check("b", 1),
                limiter.check("c", 1),
                limiter.check("d", 1),
            );
            // At most two calls: after the first round the sending task may still hold
            // the one place in flight, and then all four wait for one batch.
            let calls = shared.calls_sent() - sent;
            assert!(calls <= 2, "{what}, round {round}: {calls} calls");
            for (subject, decided) in ["a", "b", "c", "d"].into_iter().zip([a, b, c, d]) {
                // Three a subject an hour: each check of a subject counts in its own
                // state alone.
                assert_eq!(
                    remaining(decided),
                    Some(3 - round),
                    "{subject}, round {round}, {what}"
                );
            }
        }
        let denied = limiter.check("c", 1).await.unwrap();
        assert!(!denied.is_allowed(), "the fourth check of c");
    }
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn many_tasks_batched_admit_exactly_what_the_memory_store_admits() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let redis_store = server
        .store()
        .timeout(Duration::from_secs(5))
        .client_clock(clock.clone());
    let policies = || {
        (
            Policy::sliding_window("sw", 9, Duration::from_secs(60)).unwrap(),
            Policy::token_bucket("tb", 5, 1, Duration::from_secs(10)).unwrap(),
        )
    };
    let (sw, tb) = policies();
    let on_redis = Limiter::builder(redis_store.clone())
        .policy(sw)
        .policy(tb)
        .build()
        .unwrap();
    let (sw, tb) = policies();
    let in_memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(sw)
        .policy(tb)
        .build()
        .unwrap();
    on_redis.check("warm", 1).await.unwrap();
    let sent = redis_store.calls_sent();

    // 64 tasks x 7 checks over 20 subjects at one instant, four times, 20 s apart.
    // Every check costs 1, so what a subject is admitted in a step does not depend on
    // the order its checks arrive in: the memory store, checked one at a time, says
    // what the batched Redis store must admit.
    let subject_of = |t: u64, i: u64| format!("user{}", (t * 7 + i) % 20);
    for step in 0..4 {
        let mut tasks = JoinSet::new();
        for t in 0..64u64 {
            let on_redis = on_redis.clone();
            tasks.spawn(async move {
                let mut admitted = Vec::new();
                for i in 0..7 {
                    let subject = subject_of(t, i);
                    if on_redis
                        .check(subject.as_str(), 1)
                        .await
                        .unwrap()
                        .is_allowed()
                    {
                        admitted.push(subject);
                    }
                }
                admitted
            });
        }
        let mut on_redis_admitted = std::collections::BTreeMap::<String, u32>::new();
        while let Some(admitted) = tasks.join_next().await {
            for subject in admitted.unwrap() {
                *on_redis_admitted.entry(subject).or_default() += 1;
            }
        }
        let mut in_memory_admitted = std::collections::BTreeMap::<String, u32>::new();
        for t in 0..64u64 {
            for i in 0..7 {
                let subject = subject_of(t, i);
                if in_memory
                    .check(subject.as_str(), 1)
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    *in_memory_admitted.entry(subject).or_default() += 1;
                }
            }
        }
        assert_eq!(on_redis_admitted, in_memory_admitted, "step {step}");
        clock.advance(Duration::from_secs(20));
    }
    let calls = redis_store.calls_sent() - sent;
    assert!(
        calls < 4 * 64 * 7 / 2,
        "{calls} calls for {} checks: few batches formed",
        4 * 64 * 7
    );
}

#[tokio::test]
async fn a_check_whose_caller_went_away_before_its_batch_left_is_not_sent() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server), fixed(10));
    limiter.check("warm", 1).await.unwrap();
    let first = limiter.check("s", 1);
    let gone = limiter.check("s", 5);
    let kept = limiter.check("s", 1);
    let (mut first, mut gone, mut kept) = (pin!(first), Box::pin(gone), pin!(kept));
    // Each made (polled once) in turn: the first in flight, the others queued.
    std::future::poll_fn(|cx| {
        assert!(first.as_mut().poll(cx).is_pending());
        assert!(gone.as_mut().poll(cx).is_pending());
        assert!(kept.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    })
    .await;
    drop(gone);
    assert_eq!(remaining(first.await), Some(9));
    assert_eq!(
        remaining(kept.await),
        Some(8),
        "the 5 units went with their caller"
    );
}

#[tokio::test]
async fn queued_checks_fail_within_the_timeout_of_a_paused_redis() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(400);
    let limiter = Limiter::new(store(&server).timeout(timeout), fixed(10));
    limiter.check("warm", 1).await.unwrap();
    let paused = server.pause();
    let started = Instant::now();
    let results = tokio::join!(
        limiter.check("a", 1),
        limiter.check("b", 1),
        limiter.check("c", 1),
        limiter.check("d", 1),
    );
    let elapsed = started.elapsed();
    paused.resume();
    for result in [results.0, results.1, results.2, results.3] {
        match result {
            Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
            other => panic!("a store timeout, not {other:?}"),
        }
    }
    // The batch's timeout ran from when its checks queued, beside the first call's:
    // one timeout in all, not one for the call ahead and one for the batch.
    assert!(
        elapsed < timeout * 2 - Duration::from_millis(100),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn batches_survive_a_flushed_library_and_a_server_without_functions() {
    for args in [&[][..], &["--rename-command", "FCALL", ""][..]] {
        let server = RedisServer::start_with(args);
        let limiter = Limiter::new(store(&server), fixed(3));
        let redis_store = limiter.store().clone();
        limiter.check("warm", 1).await.unwrap();
        for round in 0..3 {
            let _: () = redis::cmd("FUNCTION")
                .arg("FLUSH")
                .query_async(&mut server.conn().await)
                .await
                .unwrap_or(());
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut server.conn().await)
                .await
                .unwrap();
            let subject = format!("s{round}");
            let sent = redis_store.calls_sent();
            let results = tokio::join!(
                limiter.check(subject.as_str(), 1),
                limiter.check(subject.as_str(), 1),
                limiter.check(subject.as_str(), 1),
                limiter.check(subject.as_str(), 1),
            );
            let got = [results.0, results.1, results.2, results.3].map(remaining);
            assert_eq!(
                got,
                [Some(2), Some(1), Some(0), None],
                "{args:?} round {round}"
            );
            assert_eq!(redis_store.calls_sent() - sent, 2, "{args:?}");
        }
    }
}

#[tokio::test]
async fn the_batch_settings_bound_what_one_call_decides() {
    let server = RedisServer::start();
    // (max_batch, max_pipelined) -> calls for 7 checks made at once.
    for (max_batch, max_pipelined, calls) in [
        (1, 1, 7),           // batching off: every check alone
        (0, 1, 7),           // 0 is read as 1
        (2, 1, 4),           // 1 alone, then 2 + 2 + 2
        (32, 1, 2),          // 1 alone, then the other 6 together
        (32, 3, 4),          // 3 alone, then 4 together
        (32, usize::MAX, 7), // never queues
        (usize::MAX, 1, 2),  // read as the largest batch, 255
    ] {
        let store = server
            .store()
            .timeout(Duration::from_secs(5))
            .max_batch(max_batch)
            .max_pipelined(max_pipelined);
        let limiter = Limiter::new(store.clone(), fixed(100));
        limiter.check("warm", 1).await.unwrap();
        support::wait_for_function_library(&mut server.conn().await).await;
        let sent = store.calls_sent();
        let subject = format!("s{max_batch}-{max_pipelined}");
        let s = subject.as_str();
        let results = tokio::join!(
            limiter.check(s, 1),
            limiter.check(s, 1),
            limiter.check(s, 1),
            limiter.check(s, 1),
            limiter.check(s, 1),
            limiter.check(s, 1),
            limiter.check(s, 1),
        );
        let remaining = [
            results.0, results.1, results.2, results.3, results.4, results.5, results.6,
        ]
        .map(remaining);
        // However they went, in order: 99 down to 93.
        assert_eq!(
            remaining,
            [99, 98, 97, 96, 95, 94, 93].map(Some),
            "{max_batch}, {max_pipelined}"
        );
        assert_eq!(
            store.calls_sent() - sent,
            calls,
            "{max_batch}, {max_pipelined}"
        );
    }
}

/// A hot subject's checks in one batch: its state is read once (the batch's one MGET),
/// decided once per check, and written once, whatever the algorithm; the decisions
/// are those of checks one after the other.
#[tokio::test]
async fn a_hot_subject_s_batch_reads_and_writes_its_state_once() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let hour = Duration::from_secs(3_600);
    let cases = [
        fixed(12),
        Policy::sliding_window("sw", 12, hour).unwrap(),
        Policy::token_bucket("tb", 12, 1, hour).unwrap(),
        Policy::sliding_log("sl", 12, hour).unwrap(),
    ];
    for policy in cases {
        let limiter = Limiter::new(store(&server), policy.clone());
        limiter.check("warm", 1).await.unwrap();
        support::wait_for_function_library(&mut conn).await;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        // 1 goes alone, the next 15 queue for one batch.
        let checks: Vec<_> = (0..16).map(|_| limiter.check("hot", 1)).collect();
        let decisions = futures_join_all(checks).await;
        let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(admitted, 12, "{policy:?}");
        let remaining: Vec<u64> = decisions
            .iter()
            .filter(|d| d.is_allowed())
            .map(|d| d.remaining())
            .collect();
        assert_eq!(remaining, (0..12).rev().collect::<Vec<_>>(), "{policy:?}");
        let calls = support::command_calls(&mut conn).await;
        assert_eq!(calls.get("fcall"), Some(&2), "{policy:?}: {calls:?}");
        // One write for the lone check, one for the batch's eleven admissions.
        assert_eq!(calls.get("set"), Some(&2), "{policy:?}: {calls:?}");
        let reads = calls.get("get").unwrap_or(&0) + calls.get("mget").unwrap_or(&0);
        assert_eq!(reads, 2, "{policy:?}: {calls:?}");
    }
}

/// Every future of `futures`, made in order before any is polled twice, awaited
/// together (`tokio::join!` of a list).
async fn futures_join_all<F: Future<Output = Result<redlimit::Decision, Error>>>(
    futures: Vec<F>,
) -> Vec<redlimit::Decision> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<redlimit::Decision>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (future, out) in futures.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                if let Poll::Ready(result) = future.as_mut().poll(cx) {
                    *out = Some(result.expect("a decision"));
                }
            }
        }
        if done.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter().map(Option::unwrap).collect()
}

/// Releases, refunds and peeks queue with the checks beside them and go in their
/// batch: an in-flight policy's check and release cost the store fewer calls than
/// one each, and every slot comes back.
#[tokio::test]
async fn releases_and_refunds_batch_with_checks() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = std::sync::Arc::new(
        Limiter::builder(store(&server))
            .policy(fixed(1_000))
            .policy(Policy::in_flight("running", 100, Duration::from_secs(30)).unwrap())
            .build()
            .unwrap(),
    );
    limiter.check("warm", 1).await.unwrap();
    support::wait_for_function_library(&mut conn).await;
    let sent = limiter.store().calls_sent();
    let mut tasks = JoinSet::new();
    for i in 0..64 {
        let limiter = std::sync::Arc::clone(&limiter);
        tasks.spawn(async move {
            let subject = format!("s{}", i % 4);
            let decision = limiter.check(subject.as_str(), 2).await.unwrap();
            assert!(decision.is_allowed());
            let permit = limiter.hold(subject.as_str(), &decision).expect("a slot");
            limiter.refund(subject.as_str(), 1).await.unwrap();
            drop(permit);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // The releases run off the response's path: wait until every slot is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let peeks =
            futures_join_all((0..4).map(|i| limiter.peek(format!("s{i}"), 1)).collect()).await;
        // A peek of 1 leaves limit - used - 1.
        let used = |policy: usize| -> Vec<u64> {
            peeks
                .iter()
                .map(|d| {
                    let o = d.each_policy().expect("a peek's outcomes")[policy];
                    o.limit - o.remaining - 1
                })
                .collect()
        };
        if used(1).iter().all(|&n| n == 0) {
            // Each subject's 16 checks of 2 units, each refunded 1: 16 of 1,000 used.
            let counted = used(0);
            assert_eq!(counted, [16; 4]);
            break;
        }
        assert!(Instant::now() < deadline, "slots still held: {:?}", used(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // 64 checks, 64 refunds and 64 releases (and the peeks): far fewer calls.
    let calls = limiter.store().calls_sent() - sent;
    assert!(calls < 150, "{calls} calls for 192 operations");
}

/// Outcomes too wide for one packed integer (a remaining of 2^25 or more, a reset of
/// 2^27 ms or more) come spelled out, and decide as the memory store does.
#[tokio::test]
async fn outcomes_too_wide_to_pack_are_exact() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let redis = server.store().client_clock(clock.clone());
    let memory = MemoryStore::with_clock(clock.clone());
    let day = Duration::from_secs(86_400);
    for policy in [
        Policy::fixed_window("wide", 4_000_000_000, Duration::from_secs(2)).unwrap(),
        Policy::fixed_window("long", 10, 3 * day).unwrap(),
        Policy::sliding_window("both", 40_000_000, 2 * day).unwrap(),
    ] {
        let (r, m) = (
            Limiter::new(redis.clone(), policy.clone()),
            Limiter::new(memory.clone(), policy.clone()),
        );
        for cost in [1, 5, 3_000_000_000] {
            let (a, b) = (r.check("s", cost).await, m.check("s", cost).await);
            match (a, b) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{policy:?} cost {cost}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                (a, b) => panic!("{policy:?} cost {cost}: {a:?} against {b:?}"),
            }
        }
    }
}

/// A runtime of one thread: the tests where one goes away make two.
fn one_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime that stays, and a limiter on [`store`] whose connection it made (the
/// connection's reader runs there).
fn connected_on_a_runtime_that_stays(
    server: &RedisServer,
) -> (tokio::runtime::Runtime, std::sync::Arc<Limiter<RedisStore>>) {
    let kept = one_thread();
    let limiter = std::sync::Arc::new(Limiter::new(store(server), fixed(1_000)));
    kept.block_on(limiter.check("warm", 1)).unwrap();
    (kept, limiter)
}

/// Polls `check` once, on the task (and so the runtime) that awaits this: a check
/// sent, or queued, and not answered yet.
async fn polled_once_and_pending<F: Future + Unpin>(check: &mut F, why: &str) {
    std::future::poll_fn(|cx| {
        assert!(Pin::new(&mut *check).poll(cx).is_pending(), "{why}");
        Poll::Ready(())
    })
    .await
}

/// Drops `held` with the runtime `gone`: on it as it shuts down (a task of it holds
/// `held`), or after it, with no runtime at all.
fn drop_with<T: Send + 'static>(gone: tokio::runtime::Runtime, held: T, on_its_runtime: bool) {
    if on_its_runtime {
        gone.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        gone.block_on(tokio::task::yield_now());
        drop(gone);
    } else {
        drop(gone);
        drop(held);
    }
}

/// A runtime that goes away with checks queued on a store that outlives it (the
/// check in flight and every queued one dropped with it) leaves the store's place
/// free: the store decides on another runtime at once, whether the checks were
/// dropped on their runtime as it shut down or after it, with no runtime at all.
#[test]
fn checks_queued_on_a_runtime_that_goes_away_leave_the_store_working() {
    let server = RedisServer::start();
    let (kept, limiter) = connected_on_a_runtime_that_stays(&server);
    for dropped_on_its_runtime in [true, false] {
        let gone = one_thread();
        let checks = gone.block_on(async {
            let mut checks: Vec<_> = (0..64)
                .map(|i| Box::pin(limiter.check(format!("q{i}"), 1)))
                .collect();
            // Each polled once: the first takes the one place and is sent, the
            // others queue behind it.
            for check in &mut checks {
                polled_once_and_pending(check, "no reply yet").await;
            }
            checks
        });
        drop_with(gone, checks, dropped_on_its_runtime);
        let after = kept.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), limiter.check("after", 1)).await
        });
        let decision = after
            .expect("decided at once, not queued behind a place never given up")
            .expect("a decision");
        assert!(decision.is_allowed(), "{dropped_on_its_runtime}");
    }
}

/// A check queued on a runtime that stays, behind the check in flight on one that
/// goes away: the task that was to send its batch goes with that runtime, so it gets
/// an error of its own (not a decision, not a denial, at once rather than at its
/// timeout), and it is counted in `calls_failed` like every call that ends without a
/// decision, whether the check in flight was dropped on its runtime as it shut down
/// or after it, with no runtime at all.
#[test]
fn a_check_whose_batch_goes_with_another_runtime_fails_and_is_counted() {
    let server = RedisServer::start();
    let (kept, limiter) = connected_on_a_runtime_that_stays(&server);
    for dropped_on_its_runtime in [true, false] {
        let gone = one_thread();
        // Sent at once: it holds the store's one place until it is dropped.
        let mut in_flight = Box::pin(limiter.check("in flight", 1));
        gone.block_on(polled_once_and_pending(&mut in_flight, "no reply yet"));
        let failed = limiter.store().calls_failed();
        let mut queued = Box::pin(limiter.check("queued", 1));
        kept.block_on(polled_once_and_pending(
            &mut queued,
            "queued behind the place",
        ));
        drop_with(gone, in_flight, dropped_on_its_runtime);
        let answer = kept
            .block_on(async { tokio::time::timeout(Duration::from_secs(2), queued).await })
            .expect("answered at once, not at the store's 5 s timeout");
        match answer {
            Err(Error::Store(e)) => {
                assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
                assert!(e.to_string().contains("runtime shut down"), "{e}");
            }
            other => panic!("{dropped_on_its_runtime}: {other:?}"),
        }
        assert_eq!(
            limiter.store().calls_failed(),
            failed + 1,
            "{dropped_on_its_runtime}: the queued check counted"
        );
        // And the store's place is free again.
        let after = kept
            .block_on(limiter.check("after", 1))
            .expect("a decision");
        assert!(after.is_allowed());
    }
}
