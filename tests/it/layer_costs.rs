//! What a request costs through the layer: a fixed cost no limiter could take is
//! refused when the layer is built; a cost the client chooses that no policy can take
//! is refused and counts nothing, in every failure mode and while the store fails.

use http::Request;
use http::StatusCode;
use http_body_util::Empty;
use redlimit::clock::FakeClock;
use redlimit::layer::{FailureMode, Rules, Tiers};
use redlimit::{Error, Limiter, MemoryStore, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

use crate::support::layer::*;

#[test]
fn a_fixed_cost_no_limiter_can_take_is_refused_when_the_layer_is_built() {
    let clock = FakeClock::new(0);
    let layer = || {
        layer_on(
            &clock,
            vec![fixed("default", 5, 1_000), fixed("wide", 50, 1_000)],
        )
    };
    assert!(matches!(layer().cost(0), Err(Error::ZeroCost)));
    match layer().cost(6) {
        Err(Error::CostTooHigh { cost, max, policy }) => {
            assert_eq!((cost, max, policy.as_str()), (6, 5, "default"));
        }
        other => panic!("expected CostTooHigh, got {other:?}"),
    }
    assert!(layer().cost(5).is_ok());

    // Every limiter a plan can pick is checked, the default included.
    let store = MemoryStore::with_clock(clock.clone());
    let small = Limiter::new(store.clone(), fixed("small", 2, 1_000));
    let big = Limiter::new(store, fixed("big", 10, 1_000));
    let rules = Rules::builder()
        .path("/big", big.clone(), UserHeader)
        .default(small.clone(), UserHeader)
        .build()
        .unwrap();
    assert!(matches!(
        RateLimitLayer::rules(rules).cost(3),
        Err(Error::CostTooHigh { max: 2, .. })
    ));
    let tiers = Tiers::new(UserHeader, |_| None)
        .tier("pro", big)
        .tier("free", small);
    assert!(matches!(
        RateLimitLayer::tiers(tiers).cost(3),
        Err(Error::CostTooHigh { max: 2, .. })
    ));
}

/// A client-chosen cost that no policy can take never passes and never counts, in every
/// failure mode: 0 is a 400, above the limit a 429 that no wait cures.
#[tokio::test]
async fn impossible_client_costs_are_refused_in_every_failure_mode() {
    let clock = FakeClock::new(0);
    let memory = MemoryStore::with_clock(clock.clone());
    let modes = [
        ("open", FailureMode::Open),
        ("closed", FailureMode::Closed),
        ("fallback", FailureMode::Open),
    ];
    for (mode, failure_mode) in modes {
        let mut limiter = Limiter::builder(memory.clone()).policy(fixed(mode, 5, 10_000));
        if mode == "fallback" {
            limiter = limiter.fallback(MemoryStore::with_clock(clock.clone()));
        }
        let limiter = limiter.build().unwrap();
        let layer = RateLimitLayer::new(limiter, UserHeader).failure_mode(failure_mode);
        let svc = ServiceBuilder::new()
            .layer(cost_from_header(layer))
            .service_fn(hello);
        // Exhaust the limit, then try every impossible cost.
        let first = svc.clone().oneshot(with_items("a", 5)).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK, "{mode}");
        for _ in 0..3 {
            let zero = svc.clone().oneshot(with_items("a", 0)).await.unwrap();
            assert_eq!(zero.status(), StatusCode::BAD_REQUEST, "{mode}");
            assert!(zero.headers().get("retry-after").is_none());
            assert_eq!(
                body_text(zero).await,
                "Bad Request: this request costs 0; every request must cost at least 1"
            );
            for items in [6, u32::MAX] {
                let big = svc.clone().oneshot(with_items("a", items)).await.unwrap();
                assert_eq!(
                    big.status(),
                    StatusCode::TOO_MANY_REQUESTS,
                    "{mode} {items}"
                );
                assert!(big.headers().get("retry-after").is_none(), "no wait helps");
                assert_eq!(
                    header(big.headers(), RATELIMIT_POLICY),
                    Some(format!("\"{mode}\";q=5;w=10").as_str())
                );
                assert!(big.headers().get(RATELIMIT).is_none());
                assert_eq!(
                    body_text(big).await,
                    format!("Too Many Requests: this request costs {items}, more than rate limit '{mode}' ever admits at once (5); send less at a time")
                );
            }
        }
        // Still exhausted, and a fresh subject's impossible costs consumed nothing.
        let denied = svc.clone().oneshot(request("a")).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS, "{mode}");
        assert!(denied.headers().get("retry-after").is_some());
        for items in [0, 6] {
            svc.clone().oneshot(with_items("b", items)).await.unwrap();
        }
        let fresh = svc.clone().oneshot(with_items("b", 5)).await.unwrap();
        assert_eq!(
            fresh.status(),
            StatusCode::OK,
            "{mode}: b's budget is whole"
        );
    }
}

/// The same on a store that has failed: the cost is refused before the store is asked,
/// so an outage does not turn it into a pass (open) or a 503 (closed).
#[tokio::test]
async fn impossible_client_costs_are_refused_while_the_store_fails() {
    for mode in [FailureMode::Open, FailureMode::Closed] {
        let svc = ServiceBuilder::new()
            .layer(cost_from_header(broken_layer()).failure_mode(mode))
            .service_fn(hello);
        let zero = svc.clone().oneshot(with_items("a", 0)).await.unwrap();
        assert_eq!(zero.status(), StatusCode::BAD_REQUEST, "{mode:?}");
        let big = svc.clone().oneshot(with_items("a", 2)).await.unwrap();
        assert_eq!(big.status(), StatusCode::TOO_MANY_REQUESTS, "{mode:?}");
        let grpc = Request::builder()
            .header("x-user", "a")
            .header("x-items", "0")
            .header("content-type", "application/grpc")
            .body(Empty::new())
            .unwrap();
        let grpc = svc.oneshot(grpc).await.unwrap();
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(header(grpc.headers(), "grpc-status"), Some("3"));
    }
}

#[tokio::test]
async fn cost_per_request() {
    let svc = ServiceBuilder::new()
        .layer(
            layer_on(&FakeClock::new(0), vec![fixed("default", 10, 1_000)]).cost_fn(|parts| {
                parts
                    .headers
                    .get("x-items")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            }),
        )
        .service_fn(hello);
    let mut bulk = request("a");
    bulk.headers_mut().insert("x-items", "4".parse().unwrap());
    let ok = svc.clone().oneshot(bulk).await.unwrap();
    assert_eq!(
        header(ok.headers(), RATELIMIT),
        Some(r#""default";r=6;t=1"#)
    );
    let ok = svc.oneshot(request("a")).await.unwrap();
    assert_eq!(
        header(ok.headers(), RATELIMIT),
        Some(r#""default";r=5;t=1"#)
    );
}
