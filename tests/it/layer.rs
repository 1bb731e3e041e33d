//! The layer end to end on the memory store and a fake clock, built with
//! `ServiceBuilder` and driven with `oneshot`, on axum, hyper and tonic: the headers and
//! bodies of its answers, what the handler and the inner service see, and what a store
//! that answers later or fails makes of a request.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use redlimit::clock::FakeClock;
use redlimit::layer::{BodyStyle, FailureMode, HeaderStyle, OverLimit, Rules, Tiers};
use redlimit::{Decision, Limiter, MemoryStore, RateLimitLayer};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_service::Service;

use crate::support::layer::*;

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
        "Too Many Requests: rate limit 'default' exceeded; retry after 7 s"
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
async fn policy_header_lists_every_policy_and_ratelimit_each_one_the_binding_first() {
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
    // Every policy, the tightest first: "second" has 2 left, "minute" 4.
    assert_eq!(
        header(ok.headers(), RATELIMIT),
        Some(r#""second";r=2;t=1, "minute";r=4;t=60"#)
    );

    for _ in 0..2 {
        svc.clone().oneshot(request("a")).await.unwrap();
    }
    let denied = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(
        header(denied.headers(), RATELIMIT),
        // Denied: nothing was taken, so "minute" still has 2.
        Some(r#""second";r=0;t=1, "minute";r=2;t=60"#)
    );

    clock.advance(Duration::from_secs(1));
    svc.clone().oneshot(request("a")).await.unwrap();
    let last = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(last.status(), StatusCode::OK);
    assert_eq!(
        header(last.headers(), RATELIMIT),
        Some(r#""minute";r=0;t=59, "second";r=1;t=1"#)
    );
    let denied = svc.oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(denied.headers(), "retry-after"), Some("59"));
    assert_eq!(
        header(denied.headers(), RATELIMIT),
        Some(r#""minute";r=0;t=59, "second";r=1;t=1"#)
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
struct OpensLater {
    open: Arc<AtomicBool>,
}

impl Service<Request<Empty<Bytes>>> for OpensLater {
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
        .service(OpensLater {
            open: Arc::clone(&open),
        });
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_pending());
    open.store(true, Ordering::SeqCst);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let ok = svc.ready().await.unwrap().call(request("a")).await.unwrap();
    assert_eq!(body_text(ok).await, "through the gate");
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
    let expected = "Too Many Requests: rate limit 'default' exceeded; retry after 1 s";
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

/// An inner service that counts its clones: the layer clones it only for a check that
/// is still pending when `call` returns.
struct CountsClones(Arc<AtomicUsize>);

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
    let rules = Rules::builder()
        .path("/limited", limiter(), UserHeader)
        .build()
        .unwrap();
    let tiers = Tiers::new(UserHeader, |_| Some("one")).tier("one", limiter());
    let clones = Arc::new(AtomicUsize::new(0));
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

/// The handler of a degrading layer: says whether the request was within its limit.
async fn within_limit(req: Request<Empty<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let decision = req
        .extensions()
        .get::<Decision>()
        .expect("every request carries one");
    let body = if decision.is_allowed() {
        "full answer".to_owned()
    } else {
        format!("lesser answer, retry in {:?}", decision.retry_after())
    };
    Ok(Response::new(Full::from(body)))
}

#[tokio::test]
async fn over_the_limit_a_degrading_layer_passes_every_request_and_the_handler_sees_which() {
    // 10 a second, 20 at once: 10 within the limit, 10 over it, all answered by the
    // handler; nothing the degraded ones did counts, so the next window admits 10 again.
    let clock = FakeClock::new(0);
    let layer =
        layer_on(&clock, vec![fixed("per-second", 10, 1_000)]).over_limit(OverLimit::Degrade);
    let refusing = layer.clone().over_limit(OverLimit::Refuse);
    let svc = ServiceBuilder::new().layer(layer).service_fn(within_limit);
    for window in 0..2 {
        clock.set_ms(window * 1_000 + 250);
        let mut over = 0;
        for i in 0..20 {
            let response = svc.clone().oneshot(request("alice")).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "request {i}");
            assert!(
                response.headers().get("retry-after").is_none(),
                "request {i}"
            );
            let remaining = if i < 10 { 9 - i } else { 0 };
            assert_eq!(
                header(response.headers(), RATELIMIT),
                Some(format!("\"per-second\";r={remaining};t=1").as_str()),
                "request {i}"
            );
            let body = body_text(response).await;
            if i < 10 {
                assert_eq!(body, "full answer", "request {i}");
            } else {
                assert_eq!(body, "lesser answer, retry in Some(750ms)", "request {i}");
                over += 1;
            }
        }
        assert_eq!(over, 10, "window {window}");
        // The same limiter behind a refusing layer: the 21st request of the window is a 429.
        let refused = ServiceBuilder::new()
            .layer(refusing.clone())
            .service_fn(within_limit)
            .oneshot(request("alice"))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}
