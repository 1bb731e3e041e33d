//! Refunds through the layer (`refund_on`, `refund_when`): a server's failure gives the
//! cost back to the limiter and the cost that checked the request, a client's error
//! does not, and only what was consumed is given back when the store fails.

use redlimit::internals::{AdminStore, Backend, Operation, PolicySet};
use redlimit::store::StoreError;
use std::future::Ready;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use redlimit::clock::FakeClock;
use redlimit::{Decision, Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
use tower::{ServiceBuilder, ServiceExt};

use crate::support::layer::*;

fn every_algorithm(limit: u32) -> Vec<Policy> {
    let s = Duration::from_secs(1);
    vec![
        Policy::fixed_window("fw", limit, s).unwrap(),
        Policy::sliding_window("sw", limit, s).unwrap(),
        Policy::token_bucket("tb", limit, limit, s).unwrap(),
        Policy::sliding_log("sl", limit, s).unwrap(),
    ]
}

#[tokio::test]
async fn server_errors_are_refunded_and_client_errors_are_not() {
    let clock = FakeClock::new(1_000_000);
    let layer = layer_on(&clock, every_algorithm(2)).refund_on(|s| s.is_server_error());
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(status_from_header);

    // Ten failures in a row: each passed the limiter and each was given back.
    for _ in 0..10 {
        let failed = svc
            .clone()
            .oneshot(answered_with("a", "x-status", "503"))
            .await
            .unwrap();
        assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            header(failed.headers(), RATELIMIT),
            Some(r#""fw";r=1;t=1, "sw";r=1;t=2, "tb";r=1;t=1, "sl";r=1;t=1"#)
        );
    }
    // The budget is whole: two client errors pass, the third request is denied.
    for status in ["404", "400"] {
        let client_error = svc
            .clone()
            .oneshot(answered_with("a", "x-status", status))
            .await
            .unwrap();
        assert_eq!(client_error.status().as_str(), status);
    }
    let denied = svc
        .clone()
        .oneshot(answered_with("a", "x-status", "503"))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // A denial refunds nothing: the handler never ran, so the subject stays denied.
    let still = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(still.status(), StatusCode::TOO_MANY_REQUESTS);
    // Two windows on (the sliding window still weighs the last one), every algorithm
    // starts afresh.
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        svc.oneshot(request("a")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn refunds_can_decide_on_the_response_headers() {
    let clock = FakeClock::new(0);
    let layer = layer_on(&clock, vec![fixed("grpc", 1, 1_000)]).refund_when(|status, headers| {
        status.is_server_error() || headers.get("grpc-status").is_some_and(|v| v == "14")
    });
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(status_from_header);

    // gRPC UNAVAILABLE comes with HTTP 200: refunded by its header.
    for _ in 0..3 {
        let unavailable = svc
            .clone()
            .oneshot(answered_with("g", "x-grpc-status", "14"))
            .await
            .unwrap();
        assert_eq!(unavailable.status(), StatusCode::OK);
    }
    // NOT_FOUND (5) is the caller's: it keeps its cost, and the next call is denied.
    let not_found = svc
        .clone()
        .oneshot(answered_with("g", "x-grpc-status", "5"))
        .await
        .unwrap();
    assert_eq!(not_found.status(), StatusCode::OK);
    let denied = svc.oneshot(request("g")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_refund_goes_to_the_limiter_and_cost_that_checked_the_request() {
    let clock = FakeClock::new(0);
    let limiter = Arc::new(Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        fixed("bulk", 10, 1_000),
    ));
    let layer = RateLimitLayer::from_shared(Arc::clone(&limiter), UserHeader)
        .cost_fn(|parts| {
            if parts.headers.contains_key("x-status") {
                4
            } else {
                1
            }
        })
        .refund_on(|s| s == StatusCode::INTERNAL_SERVER_ERROR);
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(status_from_header);

    svc.clone().oneshot(request("u")).await.unwrap();
    let failed = svc
        .clone()
        .oneshot(answered_with("u", "x-status", "500"))
        .await
        .unwrap();
    // The headers tell what the check left (10 - 1 - 4); the refund came after.
    assert_eq!(
        header(failed.headers(), RATELIMIT),
        Some(r#""bulk";r=5;t=1"#)
    );
    assert_eq!(limiter.peek("u", 1).await.unwrap().remaining(), 8);
    // A 502 is not what this layer refunds: its cost of 4 stays spent.
    svc.oneshot(answered_with("u", "x-status", "502"))
        .await
        .unwrap();
    assert_eq!(limiter.peek("u", 1).await.unwrap().remaining(), 4);
}

/// A failing store that counts the admin operations sent to it.
struct BrokenAdmin(Arc<AtomicUsize>);

impl Backend for BrokenAdmin {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        BrokenStore.check(subject, set, cost)
    }
}

impl AdminStore for BrokenAdmin {
    fn run(&self, _op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        BrokenStore.check(subject, set, cost)
    }
}

#[tokio::test]
async fn only_what_was_consumed_is_refunded_when_the_store_fails() {
    let clock = FakeClock::new(0);
    let runs = Arc::new(AtomicUsize::new(0));
    let store = || BrokenAdmin(Arc::clone(&runs));
    let failing = |user| answered_with(user, "x-status", "500");

    // Failed open: nothing was consumed, so nothing is sent back to the store.
    let open = RateLimitLayer::new(Limiter::new(store(), fixed("p", 1, 1_000)), UserHeader)
        .refund_on(|s| s.is_server_error());
    let svc = ServiceBuilder::new()
        .layer(open)
        .service_fn(status_from_header);
    for _ in 0..3 {
        let passed = svc.clone().oneshot(failing("o")).await.unwrap();
        assert_eq!(passed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Decided by the fallback: the refund goes to the fallback, which consumed, and
    // never to the store, which did not.
    let limiter = Limiter::builder(store())
        .policy(fixed("p", 1, 1_000))
        .fallback(MemoryStore::with_clock(clock.clone()))
        .local_clock(clock.clone())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, UserHeader).refund_on(|s| s.is_server_error());
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(status_from_header);
    for _ in 0..3 {
        let failed = svc.clone().oneshot(failing("f")).await.unwrap();
        assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(header(failed.headers(), RATELIMIT), Some(r#""p";r=0;t=1"#));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        svc.clone().oneshot(request("f")).await.unwrap().status(),
        StatusCode::OK
    );
    let denied = svc.oneshot(request("f")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}
