//! The gateway example's contract, on the memory store and on two instances of it
//! sharing one Redis: a reservation settled on the tokens used, and completions in
//! flight per key, both shown by `/v1/usage`.

#[path = "../../examples/gateway.rs"]
#[allow(dead_code)] // the example's `main` and settings
mod example;

use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use redlimit::clock::FakeClock;
use redlimit::key::Secret;
use redlimit::store::Store;
use redlimit::{MemoryStore, Policy};
use tower::ServiceExt;

use crate::support::RedisServer;

fn gateway<S: Store>(store: S, tokens: u32, in_flight: u32) -> Router {
    let policies = [
        Policy::sliding_window("tokens", tokens, Duration::from_secs(60)).unwrap(),
        Policy::in_flight("in_flight", in_flight, Duration::from_secs(10)).unwrap(),
    ];
    example::app(store, policies, &Secret::new("test").unwrap()).unwrap()
}

fn complete(key: &str, max: &str, uses: Option<&str>) -> Request<Body> {
    let mut request = Request::post("/v1/complete").header("x-max-tokens", max);
    if !key.is_empty() {
        request = request.header("x-api-key", key);
    }
    if let Some(uses) = uses {
        request = request.header("x-use-tokens", uses);
    }
    request.body(Body::empty()).unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> Response<Body> {
    app.clone().oneshot(request).await.unwrap()
}

async fn text(response: Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn usage(app: &Router, key: &str) -> String {
    let request = Request::get("/v1/usage").header("x-api-key", key);
    text(send(app, request.body(Body::empty()).unwrap()).await).await
}

/// `/v1/usage` once it reads `expected`: a settlement or release to Redis runs as a
/// task of its own, off the response's path (a bounded number of turns, no sleep).
async fn usage_settles(app: &Router, key: &str, expected: &str) {
    for _ in 0..100 {
        if usage(app, key).await.trim() == expected {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(usage(app, key).await.trim(), expected);
}

/// The done-when lines of the gateway, on `apps` (one instance, or two on one Redis):
/// requests go to them in turn, usage is read on the last.
async fn the_gateway_contract(apps: &[Router]) {
    let (first, last) = (&apps[0], &apps[apps.len() - 1]);
    // Reserve 800, use 100: 900 left once the body has ended.
    let done = send(first, complete("a", "800", Some("100"))).await;
    assert_eq!(done.status(), StatusCode::OK);
    // Each budget the policy list names is in `RateLimit`, the tightest first: the
    // slots (2 of 3 left while it runs), then the tokens (800 reserved of 1000).
    let header = |name| done.headers().get(name).and_then(|v| v.to_str().ok());
    let policy = header("ratelimit-policy").unwrap_or_default();
    assert!(
        policy.contains(r#""tokens";q=1000;w=60"#) && policy.contains(r#""in_flight";q=3;"#),
        "{policy}"
    );
    let ratelimit = header("ratelimit").unwrap_or_default().to_owned();
    let items: Vec<&str> = ratelimit.split(", ").collect();
    assert_eq!(items.len(), 2, "{ratelimit}");
    assert!(items[0].starts_with(r#""in_flight";r=2;t="#), "{ratelimit}");
    assert!(items[1].starts_with(r#""tokens";r=200;t="#), "{ratelimit}");
    assert_eq!(text(done).await.lines().last(), Some("done: 100 tokens"));
    usage_settles(last, "a", "tokens_remaining=900 in_flight=0").await;
    // Reserve 100, use 500: 500 left.
    let done = send(first, complete("b", "100", Some("500"))).await;
    assert_eq!(done.status(), StatusCode::OK);
    text(done).await;
    usage_settles(last, "b", "tokens_remaining=500 in_flight=0").await;
    // While a body streams, its reservation counts, not its use.
    let open = send(first, complete("c", "300", Some("10"))).await;
    usage_settles(last, "c", "tokens_remaining=700 in_flight=1").await;
    text(open).await;
    usage_settles(last, "c", "tokens_remaining=990 in_flight=0").await;

    // Four at once of one key, IN_FLIGHT=3: three run, one is refused and told why;
    // the refused one took no tokens.
    let mut running = Vec::new();
    let mut refused = Vec::new();
    for i in 0..4 {
        let response = send(&apps[i % apps.len()], complete("d", "10", None)).await;
        match response.status() {
            StatusCode::OK => running.push(response),
            StatusCode::TOO_MANY_REQUESTS => refused.push(text(response).await),
            other => panic!("{other}"),
        }
    }
    assert_eq!((running.len(), refused.len()), (3, 1));
    assert!(
        refused[0].contains("in-flight limit 'in_flight' reached"),
        "{}",
        refused[0]
    );
    usage_settles(last, "d", "tokens_remaining=970 in_flight=3").await;
    // One read to its end, one dropped mid-stream, one dropped unread.
    let mut bodies = running.into_iter().map(Response::into_body);
    bodies.next().unwrap().collect().await.unwrap();
    let mut mid = bodies.next().unwrap();
    mid.frame().await.unwrap().unwrap();
    drop(mid);
    drop(bodies);
    usage_settles(last, "d", "tokens_remaining=970 in_flight=0").await;

    // A reservation that never fits, and requests the gateway cannot take.
    let too_big = send(first, complete("e", "1001", None)).await;
    assert_eq!(too_big.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(too_big.headers().get("retry-after").is_none());
    for bad in ["0", "-3", "many", ""] {
        let response = send(first, complete("e", bad, None)).await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "x-max-tokens: {bad:?}"
        );
    }
    let no_key = send(first, complete("", "10", None)).await;
    assert_eq!(no_key.status(), StatusCode::UNAUTHORIZED);
    usage_settles(last, "e", "tokens_remaining=1000 in_flight=0").await;
}

#[tokio::test]
async fn the_gateway_on_the_memory_store() {
    // A clock that stands still: a sliding window's figures stay exact however long
    // the test runs.
    let clock = FakeClock::new(1_700_000_000_000);
    the_gateway_contract(&[gateway(MemoryStore::with_clock(clock), 1000, 3)]).await;
}

#[tokio::test]
async fn the_gateway_as_two_instances_on_one_redis() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    // A timeout no busy machine reaches: on the default 50 ms, a loaded machine's
    // first checks failed open (or timed out after running), and the contract's
    // figures were an outage's.
    let apps: Vec<Router> = (0..2)
        .map(|_| {
            let store = server
                .store()
                .client_clock(clock.clone())
                .timeout(Duration::from_secs(5));
            gateway(store, 1000, 3)
        })
        .collect();
    the_gateway_contract(&apps).await;
}

/// Redis stops under the gateway (`FailureMode::Open`, the layer's default): every
/// completion is still answered, streamed to its end with the use it reports (it was
/// a 500: the handler extracts a `Usage` that a request let through unchecked did not
/// get). More of them than the key's budget and its in-flight bound: unchecked is
/// unlimited. `/v1/usage`, which cannot know, says the store is unavailable. The
/// control first, on the healthy Redis: settled as the contract says.
#[tokio::test]
async fn the_gateway_answers_its_completions_with_redis_down_under_fail_open() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    // A timeout no busy machine reaches, so the control is decided, not failed open.
    let store = server
        .store()
        .client_clock(clock)
        .timeout(Duration::from_secs(5));
    let app = gateway(store, 1000, 3);
    let done = send(&app, complete("a", "800", Some("100"))).await;
    assert_eq!(done.status(), StatusCode::OK);
    assert_eq!(text(done).await.lines().last(), Some("done: 100 tokens"));
    usage_settles(&app, "a", "tokens_remaining=900 in_flight=0").await;

    server.stop();
    let mut open = Vec::new();
    for _ in 0..5 {
        let response = send(&app, complete("a", "800", None)).await;
        assert_eq!(response.status(), StatusCode::OK, "with Redis down");
        open.push(response);
    }
    for response in open {
        let body = text(response).await;
        assert_eq!(body.lines().count(), 10, "{body}");
        assert_eq!(body.lines().last(), Some("done: 800 tokens"));
    }
    let done = send(&app, complete("b", "100", Some("500"))).await;
    assert_eq!(done.status(), StatusCode::OK);
    assert_eq!(text(done).await.lines().last(), Some("done: 500 tokens"));
    let request = Request::get("/v1/usage").header("x-api-key", "a");
    let usage = send(&app, request.body(Body::empty()).unwrap()).await;
    assert_eq!(usage.status(), StatusCode::SERVICE_UNAVAILABLE);
}
