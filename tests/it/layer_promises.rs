//! The layer's promises on a real `redis-server`, through the handler pattern the README
//! recommends (`Extension<Decision>`): a stopped Redis never turns into a 500, and a cost
//! chosen by the client never gets past an exhausted limit, on either store and in every
//! failure mode.

use crate::support;
use redlimit::internals::Store;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use redlimit::key::ClientIp;
use redlimit::layer::FailureMode;
use redlimit::{
    Decision, Limiter, LimiterBuilder, MemoryStore, Policy, RateLimitLayer, RedisStore,
};
use support::RedisServer;
use tower::ServiceExt;

/// The README's handler: runs as written in every failure mode.
async fn handler(Extension(decision): Extension<Decision>) -> String {
    if decision.is_checked() {
        format!("{} left", decision.remaining())
    } else {
        format!("unchecked ({:?})", decision.origin())
    }
}

fn get_from(path: &str, client: [u8; 4]) -> Request<Body> {
    let mut request = Request::get(path).body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from((client, 40_000)));
    request
}

fn items_from(client: [u8; 4], items: &str) -> Request<Body> {
    let mut request = get_from("/", client);
    request
        .headers_mut()
        .insert("x-items", items.parse().unwrap());
    request
}

async fn body(response: http::Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn redis_limiter(server: &RedisServer, policy: Policy) -> LimiterBuilder<RedisStore> {
    Limiter::builder(server.store()).policy(policy)
}

#[tokio::test]
async fn a_stopped_redis_lets_extension_handlers_run_under_layer_and_route_layer() {
    let mut server = RedisServer::start();
    // Two limiters with their own state in the one Redis.
    let policy = |name| Policy::sliding_window(name, 2, Duration::from_secs(10)).unwrap();
    let app = Router::new()
        .route("/", get(handler))
        .layer(RateLimitLayer::new(
            redis_limiter(&server, policy("index")).build().unwrap(),
            ClientIp::new(),
        ))
        .merge(
            Router::new()
                .route("/route", get(handler))
                .route_layer(RateLimitLayer::new(
                    redis_limiter(&server, policy("route")).build().unwrap(),
                    ClientIp::new(),
                )),
        );
    let client = [198, 51, 100, 1];
    for path in ["/", "/route"] {
        let ok = app.clone().oneshot(get_from(path, client)).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK, "{path}");
        assert!(ok.headers().contains_key("ratelimit"));
        assert_eq!(body(ok).await, "1 left", "{path}");
    }

    server.stop();
    for path in ["/", "/route"] {
        for _ in 0..5 {
            let ok = app.clone().oneshot(get_from(path, client)).await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK, "{path} while Redis is down");
            assert!(
                !ok.headers().contains_key("ratelimit"),
                "no made-up figures"
            );
            assert!(!ok.headers().contains_key("ratelimit-policy"));
            assert_eq!(body(ok).await, "unchecked (FailOpen)", "{path}");
        }
    }

    // Back (empty: no persistence): limits hold again.
    server.restart();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    for path in ["/", "/route"] {
        loop {
            let response = app.clone().oneshot(get_from(path, client)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            if body(response).await == "1 left" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path}: still unchecked 2 s after Redis came back\n{}",
                server.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = app.clone().oneshot(get_from(path, client)).await.unwrap();
        let denied = app.clone().oneshot(get_from(path, client)).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
}

/// The three failure modes, as a layer on `limiter`.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Open,
    Closed,
    Fallback,
}

fn app_with_client_cost<S: Store>(limiter: LimiterBuilder<S>, mode: Mode) -> Router {
    let limiter = match mode {
        Mode::Fallback => limiter.fallback(MemoryStore::new()),
        _ => limiter,
    };
    let limiter = limiter.build().unwrap();
    let failure_mode = match mode {
        Mode::Closed => FailureMode::Closed,
        _ => FailureMode::Open,
    };
    let layer = RateLimitLayer::new(limiter, ClientIp::new())
        .failure_mode(failure_mode)
        // A cost read from the request: the client's input.
        .cost_fn(|parts| {
            parts
                .headers
                .get("x-items")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        });
    Router::new().route("/", get(handler)).layer(layer)
}

/// Exhausts the limit of 5, then sends impossible costs: none may pass or count.
async fn impossible_costs_never_pass(app: Router, what: &str) {
    let client = [198, 51, 100, 7];
    let spent = app.clone().oneshot(items_from(client, "5")).await.unwrap();
    assert_eq!(spent.status(), StatusCode::OK, "{what}");
    for _ in 0..5 {
        for items in ["0", "6", "1000000", &u32::MAX.to_string()] {
            let response = app
                .clone()
                .oneshot(items_from(client, items))
                .await
                .unwrap();
            let expected = if items == "0" {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            assert_eq!(response.status(), expected, "{what}: cost {items}");
            assert!(
                !response.headers().contains_key("retry-after"),
                "{what}: cost {items}: no wait makes it fit"
            );
        }
    }
    let denied = app.clone().oneshot(items_from(client, "1")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
    assert!(denied.headers().contains_key("retry-after"), "{what}");

    // A fresh client's impossible costs took nothing from it.
    let fresh = [198, 51, 100, 8];
    for items in ["0", "6", "1000000"] {
        app.clone().oneshot(items_from(fresh, items)).await.unwrap();
    }
    let whole = app.oneshot(items_from(fresh, "1")).await.unwrap();
    assert_eq!(whole.status(), StatusCode::OK, "{what}");
    assert_eq!(body(whole).await, "4 left", "{what}");
}

fn five_per_10s() -> Policy {
    Policy::fixed_window("batch", 5, Duration::from_secs(10)).unwrap()
}

#[tokio::test]
async fn client_costs_never_pass_an_exhausted_limit_on_redis() {
    let server = RedisServer::start();
    for mode in [Mode::Open, Mode::Closed, Mode::Fallback] {
        // A fresh Redis state per mode: each mode's limiter has its own policy name.
        let policy =
            Policy::fixed_window(format!("batch-{mode:?}"), 5, Duration::from_secs(10)).unwrap();
        let app = app_with_client_cost(redis_limiter(&server, policy), mode);
        impossible_costs_never_pass(app, &format!("redis, {mode:?}")).await;
    }
}

#[tokio::test]
async fn client_costs_never_pass_an_exhausted_limit_in_memory() {
    for mode in [Mode::Open, Mode::Closed, Mode::Fallback] {
        let app = app_with_client_cost(
            Limiter::builder(MemoryStore::new()).policy(five_per_10s()),
            mode,
        );
        impossible_costs_never_pass(app, &format!("memory, {mode:?}")).await;
    }
}

/// While Redis is down the cost is still refused, before the failure mode or the
/// fallback is consulted: a zero or oversized cost is never an outage.
#[tokio::test]
async fn client_costs_are_refused_while_redis_is_down() {
    let mut server = RedisServer::start();
    let apps = [Mode::Open, Mode::Closed, Mode::Fallback].map(|mode| {
        (
            mode,
            app_with_client_cost(redis_limiter(&server, five_per_10s()), mode),
        )
    });
    server.stop();
    let client = [198, 51, 100, 9];
    for (mode, app) in apps {
        for (items, status) in [
            ("0", StatusCode::BAD_REQUEST),
            ("6", StatusCode::TOO_MANY_REQUESTS),
            ("1000000", StatusCode::TOO_MANY_REQUESTS),
        ] {
            let response = app
                .clone()
                .oneshot(items_from(client, items))
                .await
                .unwrap();
            assert_eq!(response.status(), status, "{mode:?}: cost {items}");
        }
        // And a possible cost follows the failure mode.
        let response = app.oneshot(items_from(client, "1")).await.unwrap();
        let (status, text) = match mode {
            Mode::Open => (StatusCode::OK, Some("unchecked (FailOpen)")),
            Mode::Closed => (StatusCode::SERVICE_UNAVAILABLE, None),
            Mode::Fallback => (StatusCode::OK, Some("4 left")),
        };
        assert_eq!(response.status(), status, "{mode:?}");
        if let Some(text) = text {
            assert_eq!(body(response).await, text, "{mode:?}");
        }
    }
}
