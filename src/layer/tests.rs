//! The layer end to end: built with `ServiceBuilder`, driven with `oneshot`, on a fake
//! clock.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use tower::{ServiceBuilder, ServiceExt};
use tower_service::Service;

use super::*;
use crate::clock::FakeClock;
use crate::key::KeyRejection;
use crate::layer::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::store::{Operation, PolicySet, StoreError, StoreErrorKind};
use crate::{Decision, MemoryStore, Policy, Subject};

/// Keys on the `x-user` header; a request without one is rejected with 401.
struct UserHeader;

impl KeyExtractor for UserHeader {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        parts
            .headers
            .get("x-user")
            .map(|v| Subject::new(v.as_bytes()))
            .ok_or_else(|| KeyRejection::new(StatusCode::UNAUTHORIZED, "missing x-user header"))
    }
}

async fn hello(_req: Request<Empty<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::from("hello")))
}

fn request(user: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .header("x-user", user)
        .body(Empty::new())
        .unwrap()
}

fn fixed(name: &str, limit: u32, window_ms: u64) -> Policy {
    Policy::fixed_window(name, limit, Duration::from_millis(window_ms)).unwrap()
}

/// A layer over a memory store on `clock`, with the given policies.
fn layer_on(clock: &FakeClock, policies: Vec<Policy>) -> RateLimitLayer<MemoryStore, UserHeader> {
    let limiter = policies
        .into_iter()
        .fold(
            Limiter::builder(MemoryStore::with_clock(clock.clone())),
            |builder, p| builder.policy(p),
        )
        .build()
        .unwrap();
    RateLimitLayer::new(limiter, UserHeader)
}

async fn body_text<B>(response: Response<B>) -> String
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn header(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> Option<&str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn denial_is_a_429_with_exact_headers_and_body() {
    // 5 per 10 s, 3 s into the window: 7 s until it resets.
    let clock = FakeClock::new(3_000);
    let svc = ServiceBuilder::new()
        .layer(layer_on(&clock, vec![fixed("default", 5, 10_000)]))
        .service_fn(hello);

    for remaining in (0..5).rev() {
        let ok = svc.clone().oneshot(request("alice")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            header(ok.headers(), RATELIMIT),
            Some(format!("\"default\";r={remaining};t=7").as_str())
        );
    }
    let denied = svc.clone().oneshot(request("alice")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = denied.headers();
    assert_eq!(header(h, "retry-after"), Some("7"));
    assert_eq!(header(h, RATELIMIT_POLICY), Some(r#""default";q=5;w=10"#));
    assert_eq!(header(h, RATELIMIT), Some(r#""default";r=0;t=7"#));
    assert_eq!(header(h, "content-type"), Some("text/plain; charset=utf-8"));
    assert!(h.get(X_RATELIMIT_LIMIT).is_none());
    assert_eq!(
        body_text(denied).await,
        "Too Many Requests: retry after 7 s"
    );

    // Another subject is untouched.
    let bob = svc.oneshot(request("bob")).await.unwrap();
    assert_eq!(bob.status(), StatusCode::OK);
    assert_eq!(body_text(bob).await, "hello");
}

#[tokio::test]
async fn retry_after_is_rounded_up_and_at_least_one() {
    for (window_ms, now_ms, expected) in [(1_000, 800, "1"), (10_000, 8_999, "2")] {
        let clock = FakeClock::new(now_ms);
        let svc = ServiceBuilder::new()
            .layer(layer_on(&clock, vec![fixed("w", 1, window_ms)]))
            .service_fn(hello);
        assert_eq!(
            svc.clone().oneshot(request("a")).await.unwrap().status(),
            StatusCode::OK
        );
        let denied = svc.oneshot(request("a")).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(denied.headers(), "retry-after"), Some(expected));
        assert_eq!(
            header(denied.headers(), RATELIMIT),
            Some(format!("\"w\";r=0;t={expected}").as_str())
        );
    }
}

#[tokio::test]
async fn policy_header_lists_every_policy_and_ratelimit_names_the_binding_one() {
    let clock = FakeClock::new(0);
    let svc = ServiceBuilder::new()
        .layer(layer_on(
            &clock,
            vec![fixed("second", 3, 1_000), fixed("minute", 5, 60_000)],
        ))
        .service_fn(hello);
    let ok = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(
        header(ok.headers(), RATELIMIT_POLICY),
        Some(r#""second";q=3;w=1, "minute";q=5;w=60"#)
    );
    // The tightest policy after one request: "second" has 2 left, "minute" 4.
    assert_eq!(header(ok.headers(), RATELIMIT), Some(r#""second";r=2;t=1"#));

    for _ in 0..2 {
        svc.clone().oneshot(request("a")).await.unwrap();
    }
    let denied = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(
        header(denied.headers(), RATELIMIT),
        Some(r#""second";r=0;t=1"#)
    );

    clock.advance(Duration::from_secs(1));
    svc.clone().oneshot(request("a")).await.unwrap();
    let last = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(last.status(), StatusCode::OK);
    assert_eq!(
        header(last.headers(), RATELIMIT),
        Some(r#""minute";r=0;t=59"#)
    );
    let denied = svc.oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(denied.headers(), "retry-after"), Some("59"));
    assert_eq!(
        header(denied.headers(), RATELIMIT),
        Some(r#""minute";r=0;t=59"#)
    );
}

#[tokio::test]
async fn allowed_responses_can_go_without_headers() {
    let clock = FakeClock::new(0);
    let svc = ServiceBuilder::new()
        .layer(layer_on(&clock, vec![fixed("default", 1, 1_000)]).headers_on_allowed(false))
        .service_fn(hello);
    let ok = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(ok.headers().get(RATELIMIT).is_none());
    assert!(ok.headers().get(RATELIMIT_POLICY).is_none());
    // Denials still explain themselves.
    let denied = svc.oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(denied.headers().get(RATELIMIT).is_some());
}

#[tokio::test]
async fn legacy_style() {
    let clock = FakeClock::new(2_500);
    let svc = ServiceBuilder::new()
        .layer(
            layer_on(&clock, vec![fixed("default", 2, 10_000)]).header_style(HeaderStyle::Legacy),
        )
        .service_fn(hello);
    let ok = svc.clone().oneshot(request("a")).await.unwrap();
    let h = ok.headers();
    assert_eq!(header(h, X_RATELIMIT_LIMIT), Some("2"));
    assert_eq!(header(h, X_RATELIMIT_REMAINING), Some("1"));
    assert_eq!(header(h, X_RATELIMIT_RESET), Some("8"));
    assert!(h.get(RATELIMIT).is_none() && h.get(RATELIMIT_POLICY).is_none());

    svc.clone().oneshot(request("a")).await.unwrap();
    let denied = svc.oneshot(request("a")).await.unwrap();
    let h = denied.headers();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(h, "retry-after"), Some("8"));
    assert_eq!(header(h, X_RATELIMIT_LIMIT), Some("2"));
    assert_eq!(header(h, X_RATELIMIT_REMAINING), Some("0"));
    assert_eq!(header(h, X_RATELIMIT_RESET), Some("8"));
    assert!(h.get(RATELIMIT).is_none());
}

#[tokio::test]
async fn both_styles_and_no_style() {
    let clock = FakeClock::new(0);
    let both = ServiceBuilder::new()
        .layer(layer_on(&clock, vec![fixed("b", 1, 1_000)]).header_style(HeaderStyle::Both))
        .service_fn(hello);
    let ok = both.oneshot(request("a")).await.unwrap();
    assert_eq!(header(ok.headers(), RATELIMIT), Some(r#""b";r=0;t=1"#));
    assert_eq!(header(ok.headers(), X_RATELIMIT_REMAINING), Some("0"));

    let none = ServiceBuilder::new()
        .layer(layer_on(&clock, vec![fixed("n", 1, 1_000)]).header_style(HeaderStyle::None))
        .service_fn(hello);
    let ok = none.clone().oneshot(request("a")).await.unwrap();
    assert!(ok.headers().is_empty());
    let denied = none.oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let names: Vec<_> = denied.headers().keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type", "retry-after"]);
}

#[tokio::test]
async fn problem_json_bodies() {
    let clock = FakeClock::new(0);
    let svc = ServiceBuilder::new()
        .layer(
            layer_on(&clock, vec![fixed("default", 1, 3_000)]).body_style(BodyStyle::ProblemJson),
        )
        .service_fn(hello);
    svc.clone().oneshot(request("a")).await.unwrap();
    let denied = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(denied.headers(), "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        body_text(denied).await,
        r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit 'default' exceeded; retry after 3 s","retry_after":3}"#
    );

    let rejected = svc
        .oneshot(Request::new(Empty::<Bytes>::new()))
        .await
        .unwrap();
    assert_eq!(rejected.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        body_text(rejected).await,
        r#"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"missing x-user header"}"#
    );
}

#[tokio::test]
async fn key_rejection_is_answered_with_its_status_and_the_inner_is_not_called() {
    let called = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&called);
    let svc = ServiceBuilder::new()
        .layer(layer_on(
            &FakeClock::new(0),
            vec![fixed("default", 1, 1_000)],
        ))
        .service_fn(move |req| {
            seen.store(true, Ordering::SeqCst);
            hello(req)
        });
    let rejected = svc
        .oneshot(Request::new(Empty::<Bytes>::new()))
        .await
        .unwrap();
    assert_eq!(rejected.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(body_text(rejected).await, "missing x-user header");
    assert!(!called.load(Ordering::SeqCst));
}

#[tokio::test]
async fn the_handler_sees_the_decision() {
    let svc = ServiceBuilder::new()
        .layer(layer_on(
            &FakeClock::new(0),
            vec![fixed("default", 5, 1_000)],
        ))
        .service_fn(|req: Request<Empty<Bytes>>| async move {
            let remaining = req
                .extensions()
                .get::<Decision>()
                .map(|d| d.remaining().to_string())
                .unwrap_or_default();
            Ok::<_, Infallible>(Response::new(Full::from(remaining)))
        });
    svc.clone().oneshot(request("a")).await.unwrap();
    let ok = svc.oneshot(request("a")).await.unwrap();
    assert_eq!(body_text(ok).await, "3");
}

#[derive(Debug, PartialEq)]
struct InnerFailed(u32);

#[tokio::test]
async fn the_inner_error_type_passes_through() {
    let svc = ServiceBuilder::new()
        .layer(layer_on(
            &FakeClock::new(0),
            vec![fixed("default", 5, 1_000)],
        ))
        .service_fn(|_req: Request<Empty<Bytes>>| async {
            Err::<Response<Full<Bytes>>, _>(InnerFailed(7))
        });
    // The error type is `InnerFailed` itself, not a box.
    let error: InnerFailed = svc.oneshot(request("a")).await.unwrap_err();
    assert_eq!(error, InnerFailed(7));
}

/// An inner service that is ready only when the test says so.
#[derive(Clone)]
struct Gate {
    open: Arc<AtomicBool>,
}

impl Service<Request<Empty<Bytes>>> for Gate {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.open.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _req: Request<Empty<Bytes>>) -> Self::Future {
        ready(Ok(Response::new(Full::from("through the gate"))))
    }
}

#[tokio::test]
async fn poll_ready_follows_the_inner_service() {
    let open = Arc::new(AtomicBool::new(false));
    let mut svc = ServiceBuilder::new()
        .layer(layer_on(
            &FakeClock::new(0),
            vec![fixed("default", 5, 1_000)],
        ))
        .service(Gate {
            open: Arc::clone(&open),
        });
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_pending());
    open.store(true, Ordering::SeqCst);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let ok = svc.ready().await.unwrap().call(request("a")).await.unwrap();
    assert_eq!(body_text(ok).await, "through the gate");
}

/// A store that always fails, as an unreachable Redis would.
pub(crate) struct BrokenStore;

impl Store for BrokenStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _subject: Subject, _set: &PolicySet, _cost: u64) -> Self::Future {
        ready(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

fn broken_layer() -> RateLimitLayer<BrokenStore, UserHeader> {
    RateLimitLayer::new(
        Limiter::new(BrokenStore, fixed("default", 1, 1_000)),
        UserHeader,
    )
}

#[tokio::test]
async fn a_failing_store_fails_open_by_default() {
    let svc = ServiceBuilder::new().layer(broken_layer()).service_fn(
        |req: Request<Empty<Bytes>>| async move {
            let decision = req.extensions().get::<Decision>().map(|d| {
                let policy = d.policy().name();
                format!(
                    "{:?} checked={} allowed={} {policy}",
                    d.origin(),
                    d.is_checked(),
                    d.is_allowed()
                )
            });
            Ok::<_, Infallible>(Response::new(Full::from(format!("{decision:?}"))))
        },
    );
    for _ in 0..3 {
        let ok = svc.clone().oneshot(request("a")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        // No figures to send, so no made-up headers.
        assert!(ok.headers().get(RATELIMIT).is_none());
        assert!(ok.headers().get(RATELIMIT_POLICY).is_none());
        assert_eq!(
            body_text(ok).await,
            r#"Some("FailOpen checked=false allowed=true default")"#
        );
    }
}

#[tokio::test]
async fn a_failing_store_fails_closed_with_a_503_never_a_429() {
    let svc = ServiceBuilder::new()
        .layer(broken_layer().failure_mode(FailureMode::Closed))
        .service_fn(hello);
    let unavailable = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(unavailable.headers(), "retry-after"), Some("1"));
    assert_eq!(
        body_text(unavailable).await,
        "Service Unavailable: rate limiter unavailable"
    );

    let json = ServiceBuilder::new()
        .layer(
            broken_layer()
                .failure_mode(FailureMode::Closed)
                .body_style(BodyStyle::ProblemJson),
        )
        .service_fn(hello);
    let unavailable = json.oneshot(request("a")).await.unwrap();
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body_text(unavailable).await,
        r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the rate limiter cannot decide; retry after 1 s","retry_after":1}"#
    );
}

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
    let rules = crate::layer::rules::Rules::builder()
        .path("/big", big.clone(), UserHeader)
        .default(small.clone(), UserHeader)
        .build()
        .unwrap();
    assert!(matches!(
        RateLimitLayer::rules(rules).cost(3),
        Err(Error::CostTooHigh { max: 2, .. })
    ));
    let tiers = crate::layer::tiers::Tiers::new(UserHeader, |_| None)
        .tier("pro", big)
        .tier("free", small);
    assert!(matches!(
        RateLimitLayer::tiers(tiers).cost(3),
        Err(Error::CostTooHigh { max: 2, .. })
    ));
}

/// A layer whose cost is read from the client's `x-items` header (1 without one).
fn cost_from_header<S: Store, K: Plan<S>>(layer: RateLimitLayer<S, K>) -> RateLimitLayer<S, K> {
    layer.cost_fn(|parts| {
        parts
            .headers
            .get("x-items")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
}

fn with_items(user: &str, items: u32) -> Request<Empty<Bytes>> {
    let mut request = request(user);
    request.headers_mut().insert("x-items", items.into());
    request
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

/// A store whose answers arrive one poll late, as a network store's would.
struct SlowStore<S>(S);

struct OnePollLate<F> {
    inner: F,
    waited: bool,
}

impl<F: Future + Unpin> Future for OnePollLate<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if !self.waited {
            self.waited = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl<S> Store for SlowStore<S>
where
    S: Store<Future = Ready<Result<Decision, StoreError>>>,
{
    type Future = OnePollLate<Ready<Result<Decision, StoreError>>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        OnePollLate {
            inner: self.0.check(subject, set, cost),
            waited: false,
        }
    }
}

#[tokio::test]
async fn a_store_that_answers_later_is_awaited() {
    let limiter = Limiter::new(
        SlowStore(MemoryStore::with_clock(FakeClock::new(0))),
        fixed("default", 1, 1_000),
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, UserHeader))
        .service_fn(hello);
    let ok = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        header(ok.headers(), RATELIMIT),
        Some(r#""default";r=0;t=1"#)
    );
    let denied = svc.oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_store_that_fails_later_follows_the_failure_mode() {
    let limiter = Arc::new(Limiter::new(
        SlowStore(BrokenStore),
        fixed("default", 1, 1_000),
    ));
    let open = ServiceBuilder::new()
        .layer(RateLimitLayer::from_shared(
            Arc::clone(&limiter),
            UserHeader,
        ))
        .service_fn(hello);
    let passed = open.oneshot(request("a")).await.unwrap();
    assert_eq!(passed.status(), StatusCode::OK);
    assert!(passed.headers().get(RATELIMIT).is_none());

    let closed = ServiceBuilder::new()
        .layer(RateLimitLayer::from_shared(limiter, UserHeader).failure_mode(FailureMode::Closed))
        .service_fn(hello);
    let unavailable = closed.oneshot(request("a")).await.unwrap();
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(unavailable.headers(), "retry-after"), Some("1"));
}

/// Answers with the status named in the request's `x-status` header (200 without one),
/// and `grpc-status` from `x-grpc-status` when there is one.
async fn status_from_header(
    req: Request<Empty<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let wanted = |name| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let mut response = Response::new(Full::from("answered"));
    if let Some(status) = wanted("x-status") {
        *response.status_mut() = StatusCode::from_bytes(status.as_bytes()).unwrap();
    }
    if let Some(grpc) = wanted("x-grpc-status") {
        response
            .headers_mut()
            .insert("grpc-status", grpc.parse().unwrap());
    }
    Ok(response)
}

fn answered_with(user: &str, header: &str, value: &str) -> Request<Empty<Bytes>> {
    let mut request = request(user);
    request.headers_mut().insert(
        http::HeaderName::from_bytes(header.as_bytes()).unwrap(),
        value.parse().unwrap(),
    );
    request
}

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
        assert_eq!(header(failed.headers(), RATELIMIT), Some(r#""fw";r=1;t=1"#));
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
struct BrokenAdmin(Arc<std::sync::atomic::AtomicUsize>);

impl Store for BrokenAdmin {
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
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
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

#[test]
fn layer_is_clone_and_debug_and_configures_a_copy() {
    let layer = layer_on(&FakeClock::new(0), vec![fixed("default", 1, 1_000)]);
    let legacy = layer.clone().header_style(HeaderStyle::Legacy);
    assert_eq!(layer.shared.config.header_style, HeaderStyle::Ietf);
    assert_eq!(legacy.shared.config.header_style, HeaderStyle::Legacy);
    assert!(Arc::ptr_eq(layer.limiter(), legacy.limiter()));
    let debug = format!("{legacy:?}");
    assert!(
        debug.contains("RateLimitLayer") && debug.contains("Legacy"),
        "{debug}"
    );
}

mod axum_router {
    use super::*;
    use axum::routing::get;
    use axum::{Extension, Router};

    async fn remaining(decision: Option<Extension<Decision>>) -> String {
        match decision {
            Some(Extension(d)) => format!("{} left", d.remaining()),
            None => "undecided".to_owned(),
        }
    }

    /// The README's handler pattern: `Extension<Decision>`, no `Option`.
    async fn readme_handler(Extension(decision): Extension<Decision>) -> String {
        if decision.is_checked() {
            format!("{} left", decision.remaining())
        } else {
            "unchecked".to_owned()
        }
    }

    #[tokio::test]
    async fn the_readme_handler_runs_while_the_store_fails() {
        let app = Router::new()
            .route("/", get(readme_handler))
            .layer(broken_layer())
            .merge(
                Router::new()
                    .route("/route", get(readme_handler))
                    .route_layer(broken_layer()),
            );
        for path in ["/", "/route"] {
            let ok = app.clone().oneshot(get_as(path, "a")).await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK, "{path}");
            assert_eq!(body_text(ok).await, "unchecked", "{path}");
        }
    }

    fn get_as(path: &str, user: &str) -> Request<axum::body::Body> {
        Request::builder()
            .uri(path)
            .header("x-user", user)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn router_layer_limits_every_route() {
        let clock = FakeClock::new(0);
        let app = Router::new()
            .route("/", get(remaining))
            .layer(layer_on(&clock, vec![fixed("default", 2, 1_000)]));
        let ok = app.clone().oneshot(get_as("/", "a")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            header(ok.headers(), RATELIMIT),
            Some(r#""default";r=1;t=1"#)
        );
        assert_eq!(body_text(ok).await, "1 left");
        // The fallback (404) is limited too.
        let missing = app.clone().oneshot(get_as("/nope", "a")).await.unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        let denied = app.oneshot(get_as("/", "a")).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(denied.headers(), "retry-after"), Some("1"));
    }

    #[tokio::test]
    async fn route_layer_limits_only_its_routes() {
        let clock = FakeClock::new(0);
        let app = Router::new()
            .route("/login", get(remaining))
            .route_layer(layer_on(&clock, vec![fixed("login", 1, 60_000)]))
            .route("/", get(remaining));
        let ok = app.clone().oneshot(get_as("/login", "a")).await.unwrap();
        assert_eq!(body_text(ok).await, "0 left");
        let denied = app.clone().oneshot(get_as("/login", "a")).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(denied.headers(), "retry-after"), Some("60"));
        let free = app.clone().oneshot(get_as("/", "a")).await.unwrap();
        assert_eq!(free.status(), StatusCode::OK);
        assert_eq!(body_text(free).await, "undecided");
        // A missing key is the extractor's 401, not a 500.
        let anonymous = app
            .oneshot(
                Request::builder()
                    .uri("/login")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn a_bare_hyper_connection_serves_the_layer() {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;

    let svc = ServiceBuilder::new()
        .layer(layer_on(
            &FakeClock::new(0),
            vec![fixed("default", 1, 1_000)],
        ))
        .service_fn(|_req: Request<hyper::body::Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::from("hello")))
        });
    let (client_io, server_io) = tokio::io::duplex(4096);
    let server = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), TowerToHyperService::new(svc)),
    );
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .unwrap();
    let client = tokio::spawn(connection);

    let send = |user: &str| {
        Request::builder()
            .uri("/")
            .header("host", "test")
            .header("x-user", user)
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let ok = sender.send_request(send("a")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(body_text(ok).await, "hello");
    let denied = sender.send_request(send("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // The layer's own body has an exact size, so hyper sends a Content-Length.
    let expected = "Too Many Requests: retry after 1 s";
    assert_eq!(
        header(denied.headers(), "content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(body_text(denied).await, expected);

    drop(sender);
    client.await.unwrap().unwrap();
    server.await.unwrap().unwrap();
}

/// tonic's server accepts the layer: this only has to compile.
#[cfg(feature = "tonic")]
#[test]
fn tonic_server_accepts_the_layer() {
    let svc = tower::service_fn(|_req: Request<tonic::body::Body>| async {
        Ok::<_, Infallible>(Response::new(tonic::body::Body::empty()))
    });
    let serving = tonic::transport::Server::builder()
        .layer(layer_on(
            &FakeClock::new(0),
            vec![fixed("default", 1, 1_000)],
        ))
        .serve_with_shutdown(([127, 0, 0, 1], 0).into(), svc, std::future::pending());
    drop(serving);
}

#[tokio::test]
async fn decisions_made_at_once_take_the_fast_path() {
    // The fast path (no clone of the inner service, no future kept) is taken when the
    // store says it decided at once, and for the block cache's answers on any store.
    let clock = FakeClock::new(0);
    let memory = Limiter::new(MemoryStore::with_clock(clock.clone()), fixed("d", 1, 1_000));
    assert!(memory.check("a", 1).take_settled().is_some());
    assert!(
        memory.check("a", 0).take_settled().is_some(),
        "a refused cost"
    );
    // A store that answers later, as Redis does: no fast path for its own answers...
    let slow = Limiter::builder(SlowStore(MemoryStore::with_clock(clock.clone())))
        .policy(fixed("d", 1, 1_000))
        .block_cache(16)
        .local_clock(clock)
        .build()
        .unwrap();
    let mut first = slow.check("a", 1);
    assert!(first.take_settled().is_none());
    assert!(first.await.unwrap().is_allowed());
    let mut denied = slow.check("a", 1);
    assert!(denied.take_settled().is_none());
    assert!(!denied.await.unwrap().is_allowed());
    // ...but its block cache's answers take it.
    let cached = slow.check("a", 1).take_settled().unwrap().unwrap();
    assert_eq!(cached.origin(), crate::Origin::BlockCache);
}

/// An inner service that counts its clones: the layer clones it only for a check that
/// is still pending when `call` returns.
struct CountsClones(Arc<std::sync::atomic::AtomicUsize>);

impl Clone for CountsClones {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(&self.0))
    }
}

impl Service<Request<Empty<Bytes>>> for CountsClones {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Empty<Bytes>>) -> Self::Future {
        ready(Ok(Response::new(Full::from("hello"))))
    }
}

#[test]
fn every_plan_on_the_memory_store_takes_the_synchronous_path() {
    let clock = FakeClock::new(0);
    let limiter = || Limiter::new(MemoryStore::with_clock(clock.clone()), fixed("d", 1, 1_000));
    let rules = crate::layer::rules::Rules::builder()
        .path("/limited", limiter(), UserHeader)
        .build()
        .unwrap();
    let tiers = crate::layer::tiers::Tiers::new(UserHeader, |_| Some("one")).tier("one", limiter());
    let clones = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = || CountsClones(Arc::clone(&clones));
    type Call = Box<dyn FnMut(Request<Empty<Bytes>>) -> StatusCode>;
    let mut services: Vec<Call> = vec![
        {
            let mut service = RateLimitLayer::new(limiter(), UserHeader).layer(inner());
            Box::new(move |req| poll_once(service.call(req)))
        },
        {
            let mut service = RateLimitLayer::rules(rules).layer(inner());
            Box::new(move |req| poll_once(service.call(req)))
        },
        {
            let mut service = RateLimitLayer::tiers(tiers).layer(inner());
            Box::new(move |req| poll_once(service.call(req)))
        },
    ];
    for call in &mut services {
        let limited = || {
            let mut req = request("u1");
            *req.uri_mut() = "/limited".parse().unwrap();
            req
        };
        assert_eq!(call(limited()), StatusCode::OK);
        assert_eq!(call(limited()), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(clones.load(Ordering::Relaxed), 0);
}

/// The response of a future that must be ready at its first poll.
fn poll_once<F, B>(future: F) -> StatusCode
where
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Ok(response)) => response.status(),
        Poll::Ready(Err(never)) => match never {},
        Poll::Pending => panic!("the memory store's check was not decided inside call"),
    }
}
