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
use redlimit::store::{LiveLimitStore, Store};
use redlimit::MemoryStore;
use tower::ServiceExt;

use crate::support::RedisServer;

/// The gateway's settings with every optional counter off.
fn settings(tokens: u32, in_flight: u32) -> example::Settings {
    example::Settings {
        tokens,
        in_flight,
        slot_ttl: Duration::from_secs(10),
        rpm: None,
        org_tokens: None,
        global_rpm: None,
        monthly: None,
        admin_token: None,
        live_every: Duration::from_millis(250),
        clock: std::sync::Arc::new(redlimit::clock::SystemClock),
    }
}

async fn gateway_with<S: Store + LiveLimitStore + Clone>(
    store: S,
    settings: &example::Settings,
) -> Router {
    example::app(store, settings, &Secret::new("test").unwrap())
        .await
        .unwrap()
}

async fn gateway<S: Store + LiveLimitStore + Clone>(
    store: S,
    tokens: u32,
    in_flight: u32,
) -> Router {
    gateway_with(store, &settings(tokens, in_flight)).await
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
    the_gateway_contract(&[gateway(MemoryStore::with_clock(clock), 1000, 3).await]).await;
}

#[tokio::test]
async fn the_gateway_as_two_instances_on_one_redis() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    // A timeout no busy machine reaches: on the default 50 ms, a loaded machine's
    // first checks failed open (or timed out after running), and the contract's
    // figures were an outage's.
    let mut apps: Vec<Router> = Vec::new();
    for _ in 0..2 {
        let store = server
            .store()
            .client_clock(clock.clone())
            .timeout(Duration::from_secs(5));
        apps.push(gateway(store, 1000, 3).await);
    }
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
    let app = gateway(store, 1000, 3).await;
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

fn of_org(mut request: Request<Body>, org: &str) -> Request<Body> {
    request.headers_mut().insert("x-org", org.parse().unwrap());
    request
}

async fn usage_of(app: &Router, request: http::request::Builder) -> String {
    text(send(app, request.body(Body::empty()).unwrap()).await).await
}

/// Two gateways on one Redis, on one standing clock, with `settings`.
async fn two_on_redis(server: &RedisServer, settings: &example::Settings) -> Vec<Router> {
    let clock = FakeClock::new(1_700_000_000_000);
    let mut apps = Vec::new();
    for _ in 0..2 {
        let store = server
            .store()
            .client_clock(clock.clone())
            .timeout(Duration::from_secs(5));
        apps.push(gateway_with(store, settings).await);
    }
    apps
}

/// `RPM=3`, `TOKENS=1000`: four completions of one key, each reserving and using 10,
/// get 200 200 200 429; the refused one takes no tokens.
async fn requests_beside_tokens(apps: &[Router]) {
    let mut statuses = Vec::new();
    for i in 0..4 {
        let response = send(&apps[i % apps.len()], complete("k", "10", Some("10"))).await;
        statuses.push(response.status().as_u16());
        text(response).await;
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    let last = &apps[apps.len() - 1];
    usage_settles(
        last,
        "k",
        "tokens_remaining=970 in_flight=0 requests_remaining=0",
    )
    .await;
}

fn with_rpm() -> example::Settings {
    example::Settings {
        rpm: Some(3),
        ..settings(1000, 4)
    }
}

#[tokio::test]
async fn requests_per_minute_beside_tokens_on_the_memory_store() {
    let store = MemoryStore::with_clock(FakeClock::new(1_700_000_000_000));
    requests_beside_tokens(&[gateway_with(store, &with_rpm()).await]).await;
}

#[tokio::test]
async fn requests_per_minute_beside_tokens_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    requests_beside_tokens(&two_on_redis(&server, &with_rpm()).await).await;
}

/// `ORG_TOKENS=1000`: key A of org X uses 600; key B of X then reserves 600 and is
/// refused, its own budget untouched and the org's at 400.
#[tokio::test]
async fn an_orgs_tokens_beside_its_keys_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    let settings = example::Settings {
        org_tokens: Some(1000),
        ..settings(1000, 4)
    };
    let apps = two_on_redis(&server, &settings).await;
    let a = send(&apps[0], of_org(complete("a", "600", Some("600")), "x")).await;
    assert_eq!(a.status(), StatusCode::OK);
    text(a).await;
    let b = send(&apps[1], of_org(complete("b", "600", None), "x")).await;
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    let why = text(b).await;
    assert!(why.contains("org_tokens"), "{why}");
    let usage_b = || {
        Request::get("/v1/usage")
            .header("x-api-key", "b")
            .header("x-org", "x")
    };
    assert_eq!(
        usage_of(&apps[0], usage_b()).await.trim(),
        "tokens_remaining=1000 in_flight=0 org_tokens_remaining=400"
    );
    // Another org has its own tokens.
    let c = send(&apps[1], of_org(complete("c", "1000", None), "y")).await;
    assert_eq!(c.status(), StatusCode::OK);
    // Without x-org: 400, on either route.
    let no_org = send(&apps[0], complete("a", "10", None)).await;
    assert_eq!(no_org.status(), StatusCode::BAD_REQUEST);
    let no_org = send(
        &apps[0],
        Request::get("/v1/usage")
            .header("x-api-key", "a")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(no_org.status(), StatusCode::BAD_REQUEST);
}

/// `GLOBAL_RPM=5` on two instances: five keys pass, a sixth is refused.
#[tokio::test]
async fn everyones_requests_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    let settings = example::Settings {
        global_rpm: Some(5),
        ..settings(1000, 4)
    };
    let apps = two_on_redis(&server, &settings).await;
    for i in 0..5 {
        let response = send(&apps[i % 2], complete(&format!("key-{i}"), "10", None)).await;
        assert_eq!(response.status(), StatusCode::OK, "key-{i}");
        text(response).await;
    }
    let sixth = send(&apps[1], complete("key-5", "10", None)).await;
    assert_eq!(sixth.status(), StatusCode::TOO_MANY_REQUESTS);
    text(sixth).await;
    usage_settles(
        &apps[0],
        "key-5",
        "tokens_remaining=1000 in_flight=0 global_requests_remaining=0",
    )
    .await;
}

/// A key that used 800 of 1000, raised to 5000 on one instance: the other shows 4200
/// within 1 s. The admin route wants its token.
#[tokio::test]
async fn a_keys_budget_raised_live_on_one_instance_shows_on_the_other_within_a_second() {
    let server = RedisServer::start();
    let settings = example::Settings {
        admin_token: Some("admin-secret".to_owned()),
        ..settings(1000, 4)
    };
    let apps = two_on_redis(&server, &settings).await;
    let used = send(&apps[0], complete("k", "800", Some("800"))).await;
    assert_eq!(used.status(), StatusCode::OK);
    text(used).await;
    usage_settles(&apps[1], "k", "tokens_remaining=200 in_flight=0").await;

    let limits = |method: &str, token: Option<&str>| {
        let mut request = Request::builder()
            .method(method)
            .uri("/v1/limits/k?tokens=5000");
        if let Some(token) = token {
            request = request.header("x-admin-token", token);
        }
        request.body(Body::empty()).unwrap()
    };
    assert_eq!(
        send(&apps[0], limits("PUT", None)).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&apps[0], limits("PUT", Some("nope"))).await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        usage(&apps[1], "k").await.trim(),
        "tokens_remaining=200 in_flight=0"
    );
    let raised = send(&apps[0], limits("PUT", Some("admin-secret"))).await;
    assert_eq!(raised.status(), StatusCode::OK);
    let changed = std::time::Instant::now();
    // This instance at once; the other once it has polled (every 250 ms).
    assert_eq!(
        usage(&apps[0], "k").await.trim(),
        "tokens_remaining=4200 in_flight=0"
    );
    loop {
        if usage(&apps[1], "k").await.trim() == "tokens_remaining=4200 in_flight=0" {
            break;
        }
        assert!(changed.elapsed() < Duration::from_secs(1), "not within 1 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Removed: the key's own 1000 again, its use kept.
    let removed = send(&apps[1], limits("DELETE", Some("admin-secret"))).await;
    assert_eq!(removed.status(), StatusCode::OK);
    assert_eq!(
        usage(&apps[1], "k").await.trim(),
        "tokens_remaining=200 in_flight=0"
    );
    let bad = Request::put("/v1/limits/k?tokens=0").header("x-admin-token", "admin-secret");
    assert_eq!(
        send(&apps[0], bad.body(Body::empty()).unwrap())
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn without_an_admin_token_there_is_no_admin_route() {
    let app = gateway(MemoryStore::new(), 1000, 4).await;
    let put = Request::put("/v1/limits/k?tokens=5000").header("x-admin-token", "x");
    assert_eq!(
        send(&app, put.body(Body::empty()).unwrap()).await.status(),
        StatusCode::NOT_FOUND
    );
}

/// `MONTHLY_TOKENS=100000`, `QUOTA_TZ=America/New_York`, `QUOTA_ANCHOR_DAY=15`: the
/// usage line names the next 15th, 00:00 New York time; a completion that uses 100
/// leaves 99,900; past the 15th (after the end of daylight time) the quota is fresh
/// and names the next one. A spent quota is a 402, a spent rate a 429.
async fn a_monthly_quota(apps: &[Router], clock: &FakeClock) {
    let (first, last) = (&apps[0], &apps[apps.len() - 1]);
    let done = send(first, complete("q", "300", Some("100"))).await;
    assert_eq!(done.status(), StatusCode::OK);
    text(done).await;
    usage_settles(
        last,
        "q",
        "tokens_remaining=900 in_flight=0 quota_remaining=99900 \
         quota_resets=2026-11-15T00:00:00-05:00",
    )
    .await;
    // The rest of the month's tokens but 50, charged past the tokens per minute: the
    // quota refuses the next 100 with 402, told apart from a rate's 429.
    let big = send(first, complete("q", "900", Some("99850"))).await;
    assert_eq!(big.status(), StatusCode::OK);
    text(big).await;
    // Two days on: the tokens per minute are whole again, the month's are not.
    clock.advance(Duration::from_secs(3600 * 24 * 2));
    let spent = send(last, complete("q", "100", None)).await;
    assert_eq!(spent.status(), StatusCode::PAYMENT_REQUIRED);
    assert!(spent.headers().get("retry-after").is_some());
    text(spent).await;
    // 15 November 00:00 in New York is 05:00 UTC (standard time since 1 November).
    use redlimit::clock::Clock;
    clock.advance(Duration::from_millis(1_794_718_800_000 - clock.now_ms()));
    usage_settles(
        last,
        "q",
        "tokens_remaining=1000 in_flight=0 quota_remaining=100000 \
         quota_resets=2026-12-15T00:00:00-05:00",
    )
    .await;
}

fn with_quota(clock: &FakeClock) -> example::Settings {
    example::Settings {
        monthly: Some(example::Quota {
            tokens: 100_000,
            zone: "America/New_York".to_owned(),
            anchor_day: 15,
        }),
        clock: std::sync::Arc::new(clock.clone()),
        ..settings(1000, 4)
    }
}

/// 2026-10-20 12:00 in New York (16:00 UTC).
const OCTOBER_20: u64 = 1_792_512_000_000;

#[tokio::test]
async fn a_monthly_quota_from_the_15th_in_new_york_on_the_memory_store() {
    let clock = FakeClock::new(OCTOBER_20);
    let app = gateway_with(MemoryStore::with_clock(clock.clone()), &with_quota(&clock)).await;
    a_monthly_quota(&[app], &clock).await;
}

#[tokio::test]
async fn a_monthly_quota_from_the_15th_in_new_york_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    let clock = FakeClock::new(OCTOBER_20);
    let mut apps = Vec::new();
    for _ in 0..2 {
        let store = server
            .store()
            .client_clock(clock.clone())
            .timeout(Duration::from_secs(5));
        apps.push(gateway_with(store, &with_quota(&clock)).await);
    }
    a_monthly_quota(&apps, &clock).await;
}
