//! A reply that arrived is a decision: a burst queued behind the calls in flight is
//! decided while Redis answers, however long the line ahead of a check (it fails for
//! Redis's silence alone); a check that finds the queue full is shed, and the layer
//! never lets it through unchecked; the queue gives its memory back after a burst.

use crate::support::{check_at_once, RedisServer};

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use deadpool_redis::redis;
use http::{Request, StatusCode};
use redlimit::internals::RedisStoreInternals;
use redlimit::key::Header;
use redlimit::layer::FailureMode;
use redlimit::store::StoreErrorKind;
use redlimit::{Decision, Error, Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore};
use tokio::task::JoinSet;
use tower::ServiceExt;

fn policy() -> Policy {
    Policy::fixed_window("burst", 1_000, Duration::from_secs(3_600)).unwrap()
}

/// Both ways to give the store its server: the application's pool (replies read by
/// redis's task) and the store's own socket (replies read by the call that waits).
fn stores(server: &RedisServer) -> [(&'static str, RedisStore); 2] {
    [
        ("pool", RedisStore::new(server.pool())),
        ("from_url", RedisStore::from_url(&server.url()).unwrap()),
    ]
}

/// 30,000 checks at once on a healthy Redis, at the default 50 ms timeout: every one
/// decided (the whole burst takes far longer than any timeout, in a debug build), and
/// the queue's memory back afterwards. Before, checks that queued more than 1 s before
/// their turn failed, and the queue kept its capacity. On the store's own socket: a
/// pool's connection is read by redis's task, which a machine busy enough runs too
/// late (see `a_deep_pipeline_on_a_healthy_redis_is_decided_not_timed_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_decided_while_redis_answers_and_the_queue_gives_its_memory_back() {
    const CHECKS: usize = 30_000;
    let server = RedisServer::start();
    for (kind, store) in [("from_url", RedisStore::from_url(&server.url()).unwrap())] {
        store.connect().await.unwrap();
        let limiter = Arc::new(Limiter::new(store.clone(), policy()));
        let (sent, failed) = (store.calls_sent(), store.calls_failed());
        let started = Instant::now();
        let subjects = (0..CHECKS).map(|i| format!("{kind}:{i}"));
        let (allowed, errors) = check_at_once(&limiter, subjects).await;
        let took = started.elapsed();
        let calls = store.calls_sent() - sent;
        eprintln!("{kind}: {CHECKS} checks at once in {took:?}, {calls} calls");
        assert!(
            errors.is_empty(),
            "{kind}: {} of {CHECKS} checks failed on a healthy Redis, e.g. {:?}",
            errors.len(),
            errors.first()
        );
        assert_eq!(allowed, CHECKS);
        assert_eq!(store.calls_failed(), failed);
        // They queued: batches carried them, not one call each.
        assert!(
            calls * 4 < CHECKS as u64,
            "{kind}: {calls} calls for {CHECKS} checks"
        );
        assert!(
            store.queue_capacity() <= 1_024,
            "{kind}: the queue kept room for {} checks",
            store.queue_capacity()
        );
    }
}

/// The queue's memory is back by the time the burst's last answer is. On one
/// thread, with the checks awaited in the test's own task: the task that sent the
/// last batch yields before it looks at the queue again, and the test, woken by
/// that batch's answers, runs first. A queue given back at that next look, as
/// before, was still full when the caller looked (the multi-thread test above saw
/// it too, beside busy loops).
#[tokio::test(flavor = "current_thread")]
async fn a_burst_s_queue_gives_its_memory_back_by_its_last_answer() {
    const CHECKS: usize = 4_000;
    let server = RedisServer::start();
    // One call in flight: with two, one sending task's look at the empty queue came
    // while the other's last batch was out, and hid the order that matters here.
    let store = RedisStore::from_url(&server.url())
        .unwrap()
        .max_pipelined(1);
    store.connect().await.unwrap();
    let limiter = Limiter::new(store.clone(), policy());
    let mut checks: Vec<_> = (0..CHECKS)
        .map(|i| Some(Box::pin(limiter.check(format!("one thread:{i}"), 1))))
        .collect();
    let mut allowed = 0;
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for slot in &mut checks {
            let Some(check) = slot else { continue };
            match check.as_mut().poll(cx) {
                Poll::Ready(decided) => {
                    allowed += usize::from(decided.expect("a decision").is_allowed());
                    *slot = None;
                }
                Poll::Pending => waiting = true,
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    assert_eq!(allowed, CHECKS);
    assert!(
        store.queue_capacity() <= 1_024,
        "the queue kept room for {} checks",
        store.queue_capacity()
    );
}

/// Clients that keep Redis busy with `DEBUG SLEEP`s of `ms` (wall time, whatever
/// the machine's load), two waiting each, until `stop`: Redis answers everyone in
/// turn, each after a wait of a sleep or more.
async fn keep_redis_busy(
    server: &RedisServer,
    clients: usize,
    ms: u64,
    stop: &Arc<AtomicBool>,
) -> JoinSet<()> {
    let mut busy = JoinSet::new();
    for _ in 0..clients {
        let mut conn = server.conn().await;
        let stop = Arc::clone(stop);
        // Two at a time, so that one always waits in Redis while the client reads
        // the other's reply.
        let mut twice = redis::pipe();
        for _ in 0..2 {
            twice
                .cmd("DEBUG")
                .arg("SLEEP")
                .arg(format!("{:.3}", ms as f64 / 1_000.0));
        }
        busy.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let () = twice.query_async(&mut conn).await.unwrap();
            }
        });
    }
    busy
}

/// Redis answers, but slowly: another client keeps it asleep 10 ms at a time
/// (`DEBUG SLEEP`, two waiting), and the store sends one call (of at most 2 checks)
/// at a time, so 200 checks at once take well over a second to get through.
/// Every one is decided: a queued check waits for its turn while Redis answers, and
/// fails for Redis's silence alone. The control: the same line with the server
/// paused fails, each check within its timeout of Redis's silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_check_waits_its_turn_while_redis_answers_however_long_the_line() {
    const CHECKS: usize = 200;
    const TIMEOUT: Duration = Duration::from_millis(500);
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    for (kind, store) in stores(&server) {
        let store = store.max_batch(2).max_pipelined(1).timeout(TIMEOUT);
        store.connect().await.unwrap();
        let limiter = Arc::new(Limiter::new(store.clone(), policy()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut busy = keep_redis_busy(&server, 1, 10, &stop).await;
        let started = Instant::now();
        let subjects = (0..CHECKS).map(|i| format!("{kind}:slow:{i}"));
        let (allowed, errors) = check_at_once(&limiter, subjects).await;
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        while let Some(done) = busy.join_next().await {
            done.unwrap();
        }
        eprintln!(
            "{kind}: {CHECKS} checks through a busy Redis in {took:?}, {} calls",
            store.calls_sent()
        );
        assert!(
            errors.is_empty(),
            "{kind}: {} of {CHECKS} checks failed while Redis answered, e.g. {:?}",
            errors.len(),
            errors.first()
        );
        assert_eq!(allowed, CHECKS);
        // Without a line longer than the old 1 s bound, this test would show nothing.
        assert!(
            took > Duration::from_millis(1_200),
            "{kind}: the line drained in {took:?}"
        );

        // Control: a Redis that answers nobody fails the whole line, each check
        // within its timeout of silence (plus a margin for a loaded machine).
        let paused = server.pause();
        let started = Instant::now();
        let mut checks = JoinSet::new();
        for i in 0..20 {
            let limiter = Arc::clone(&limiter);
            checks.spawn(async move {
                let asked = Instant::now();
                (
                    limiter.check(format!("{kind}:paused:{i}"), 1).await,
                    asked.elapsed(),
                )
            });
        }
        while let Some(checked) = checks.join_next().await {
            let (result, waited) = checked.unwrap();
            match result {
                Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
                other => panic!("{kind}: a paused Redis decided: {other:?}"),
            }
            assert!(waited < TIMEOUT * 3, "{kind}: a check waited {waited:?}");
        }
        assert!(started.elapsed() < TIMEOUT * 4, "{:?}", started.elapsed());
        drop(paused);
    }
}

/// The README's handler: the decision from the request's extensions.
async fn handler(Extension(decision): Extension<Decision>) -> String {
    decision.origin().as_str().to_owned()
}

/// A check that finds the queue full is shed: answered 503 by a layer that fails
/// open (never let through unchecked), or by the limiter's fallback; counted in
/// `calls_shed`. The server is paused so the line cannot drain: one call in flight,
/// four checks waiting, the rest shed. The control: a queue with room sheds nothing,
/// and a fail-open layer lets those requests through as its failure mode says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_finds_the_queue_full_is_shed_never_let_through() {
    const REQUESTS: usize = 12;
    const QUEUE: usize = 4;
    let server = RedisServer::start();
    for (max_queue, fallback) in [(QUEUE, false), (QUEUE, true), (usize::MAX, false)] {
        let store = RedisStore::from_url(&server.url())
            .unwrap()
            .max_pipelined(1)
            .max_queue(max_queue)
            .timeout(Duration::from_millis(300));
        store.connect().await.unwrap();
        let mut limiter = Limiter::builder(store.clone()).policy(policy());
        if fallback {
            limiter = limiter.fallback(MemoryStore::new());
        }
        let layer = RateLimitLayer::new(
            limiter.build().unwrap(),
            Header::plain("x-subject").unwrap(),
        )
        .failure_mode(FailureMode::Open);
        let app = Router::new().route("/", get(handler)).layer(layer);

        let paused = server.pause();
        let mut requests = JoinSet::new();
        for i in 0..REQUESTS {
            let app = app.clone();
            requests.spawn(async move {
                let request = Request::builder()
                    .uri("/")
                    .header("x-subject", format!("shed:{i}"))
                    .body(Body::empty())
                    .unwrap();
                let response = app.oneshot(request).await.unwrap();
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1024)
                    .await
                    .unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            });
            // In order, so the first takes the call and the next ones the queue.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut answers = std::collections::BTreeMap::new();
        while let Some(answered) = requests.join_next().await {
            *answers.entry(answered.unwrap()).or_insert(0) += 1;
        }
        drop(paused);
        let shed = store.calls_shed();
        eprintln!("max_queue {max_queue}, fallback {fallback}: {answers:?}, {shed} shed");
        let count = |status: StatusCode, body: &str| -> usize {
            answers
                .iter()
                .filter(|((s, b), _)| *s == status && (body.is_empty() || b == body))
                .map(|(_, n)| n)
                .sum()
        };
        if max_queue == usize::MAX {
            assert_eq!(shed, 0);
            assert_eq!(count(StatusCode::OK, "fail_open"), REQUESTS, "{answers:?}");
            continue;
        }
        let waited = 1 + QUEUE;
        assert_eq!(shed, (REQUESTS - waited) as u64);
        if fallback {
            assert_eq!(count(StatusCode::OK, "fallback"), REQUESTS, "{answers:?}");
        } else {
            assert_eq!(
                count(StatusCode::SERVICE_UNAVAILABLE, ""),
                REQUESTS - waited,
                "{answers:?}"
            );
            assert_eq!(count(StatusCode::OK, "fail_open"), waited, "{answers:?}");
        }
    }
}
