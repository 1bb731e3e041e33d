//! Rules and tiers in one layer, on axum routers, on a fake clock: a rules layer makes the
//! same decisions as one `route_layer` per route; tiers pick the limit per user.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::{any, get, post};
use axum::Router;
use http::{Method, Request, StatusCode};
use redlimit::clock::FakeClock;
use redlimit::key::{ClientIp, Extension, Global, Header, Secret};
use redlimit::layer::{Rules, Tiers};
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
use tower::ServiceExt;

const MINUTE: Duration = Duration::from_secs(60);
const SECOND: Duration = Duration::from_secs(1);

/// The three limiters of the example: login 3 a minute per address, the API 10 a second
/// per key, everything else 100 a minute per address.
struct Limiters {
    login: Arc<Limiter<MemoryStore>>,
    api: Arc<Limiter<MemoryStore>>,
    rest: Arc<Limiter<MemoryStore>>,
}

impl Limiters {
    fn on(clock: &FakeClock) -> Self {
        let store = MemoryStore::with_clock(clock.clone());
        let limiter = |policy| Arc::new(Limiter::new(store.clone(), policy));
        Self {
            login: limiter(Policy::fixed_window("login", 3, MINUTE).unwrap()),
            api: limiter(Policy::sliding_window("api", 10, SECOND).unwrap()),
            rest: limiter(Policy::sliding_log("default", 100, MINUTE).unwrap()),
        }
    }
}

fn api_key() -> Header {
    Header::new("x-api-key", &Secret::new("rules test secret").unwrap()).unwrap()
}

fn routes() -> (
    axum::routing::MethodRouter,
    axum::routing::MethodRouter,
    axum::routing::MethodRouter,
) {
    (
        post(|| async { "in" }),
        any(|| async { "api" }),
        get(|| async { "page" }),
    )
}

/// One `route_layer` per route.
fn per_route(limiters: &Limiters) -> Router {
    let (login, api, page) = routes();
    let limited = |limiter: &Arc<Limiter<MemoryStore>>| {
        RateLimitLayer::from_shared(Arc::clone(limiter), ClientIp::new())
    };
    let login = Router::new()
        .route("/login", login)
        .route_layer(limited(&limiters.login));
    let api = Router::new()
        .route("/api/{*rest}", api)
        .route_layer(RateLimitLayer::from_shared(
            Arc::clone(&limiters.api),
            api_key(),
        ));
    let pages = Router::new()
        .route("/", page.clone())
        .route("/about", page)
        .route_layer(limited(&limiters.rest));
    login.merge(api).merge(pages)
}

/// One rules layer for the whole router.
fn with_rules(limiters: &Limiters) -> Router {
    let (login, api, page) = routes();
    let rules = Rules::builder()
        .route(
            Method::POST,
            "/login",
            Arc::clone(&limiters.login),
            ClientIp::new(),
        )
        .path("/api/*", Arc::clone(&limiters.api), api_key())
        .default(Arc::clone(&limiters.rest), ClientIp::new())
        .build()
        .unwrap();
    Router::new()
        .route("/login", login)
        .route("/api/{*rest}", api)
        .route("/", page.clone())
        .route("/about", page)
        .layer(RateLimitLayer::rules(rules))
}

/// One request of a script: method, path, client address, API key.
#[derive(Debug, Clone, Copy)]
struct Call {
    method: &'static str,
    path: &'static str,
    ip: u8,
    key: Option<&'static str>,
}

/// What a client sees of an answer.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: StatusCode,
    ratelimit: Option<String>,
    policy: Option<String>,
    retry_after: Option<String>,
}

async fn send(router: &Router, call: Call) -> Seen {
    let mut request = Request::builder().method(call.method).uri(call.path);
    if let Some(key) = call.key {
        request = request.header("x-api-key", key);
    }
    let mut request = request.body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from(([198, 51, 100, call.ip], 40000)));
    let response = router.clone().oneshot(request).await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Seen {
        status: response.status(),
        ratelimit: header("ratelimit"),
        policy: header("ratelimit-policy"),
        retry_after: header("retry-after"),
    }
}

/// A deterministic mix of calls (xorshift), so both routers see the very same traffic.
fn script(len: usize) -> Vec<(Call, u64)> {
    const CALLS: [(&str, &str); 6] = [
        ("POST", "/login"),
        ("GET", "/api/users"),
        ("POST", "/api/users/7/orders"),
        ("GET", "/"),
        ("GET", "/about"),
        ("GET", "/api/users"),
    ];
    const KEYS: [Option<&str>; 3] = [Some("k1"), Some("k2"), None];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..len)
        .map(|_| {
            let (method, path) = CALLS[(next() % 6) as usize];
            let call = Call {
                method,
                path,
                ip: (next() % 3) as u8 + 1,
                key: KEYS[(next() % 3) as usize],
            };
            // Mostly bursts, now and then a pause long enough to free some quota.
            let advance_ms = match next() % 20 {
                0 => 61_000,
                1..=3 => 400,
                _ => 7,
            };
            (call, advance_ms)
        })
        .collect()
}

#[tokio::test]
async fn rules_decide_as_route_layers_do() {
    let clock = FakeClock::new(1_000_000);
    let (a, b) = (Limiters::on(&clock), Limiters::on(&clock));
    let (per_route, rules) = (per_route(&a), with_rules(&b));
    let mut statuses = std::collections::BTreeMap::new();
    for (i, (call, advance_ms)) in script(2_000).into_iter().enumerate() {
        let expected = send(&per_route, call).await;
        let seen = send(&rules, call).await;
        assert_eq!(seen, expected, "call {i}: {call:?}");
        *statuses.entry(expected.status.as_u16()).or_insert(0) += 1;
        clock.advance(Duration::from_millis(advance_ms));
    }
    // The script reaches every kind of answer, so the comparison means something.
    for status in [200, 401, 429] {
        assert!(
            statuses.get(&status).copied().unwrap_or(0) > 20,
            "{statuses:?}"
        );
    }
}

#[tokio::test]
async fn each_route_gets_its_own_limit() {
    let clock = FakeClock::new(0);
    let router = with_rules(&Limiters::on(&clock));
    let login = |ip| Call {
        method: "POST",
        path: "/login",
        ip,
        key: None,
    };
    for _ in 0..3 {
        assert_eq!(send(&router, login(1)).await.status, StatusCode::OK);
    }
    let denied = send(&router, login(1)).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.policy.as_deref(), Some(r#""login";q=3;w=60"#));
    assert_eq!(denied.retry_after.as_deref(), Some("60"));
    // Another address, and the rest of the site, are not affected.
    assert_eq!(send(&router, login(2)).await.status, StatusCode::OK);
    let page = send(
        &router,
        Call {
            method: "GET",
            path: "/about",
            ip: 1,
            key: None,
        },
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.ratelimit.as_deref(), Some(r#""default";r=99;t=60"#));

    let api = |path, key| Call {
        method: "GET",
        path,
        ip: 1,
        key: Some(key),
    };
    // Ten a second per key, over every path under /api.
    for i in 0..10 {
        let path = if i % 2 == 0 { "/api/a" } else { "/api/b/c" };
        assert_eq!(send(&router, api(path, "k1")).await.status, StatusCode::OK);
    }
    assert_eq!(
        send(&router, api("/api/a", "k1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&router, api("/api/a", "k2")).await.status,
        StatusCode::OK
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        send(&router, api("/api/a", "k1")).await.status,
        StatusCode::OK
    );
    // A request the rule's key extractor cannot key is rejected, not passed.
    let anonymous = Call {
        method: "GET",
        path: "/api/a",
        ip: 1,
        key: None,
    };
    assert_eq!(
        send(&router, anonymous).await.status,
        StatusCode::UNAUTHORIZED
    );
}

/// A gRPC call as a client sends it: `POST /package.Service/Method`.
fn grpc(path: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn grpc_rules_match_service_and_method_and_others_pass() {
    let clock = FakeClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let place = Limiter::new(
        store.clone(),
        Policy::fixed_window("place", 2, MINUTE).unwrap(),
    );
    let orders = Limiter::new(store, Policy::fixed_window("orders", 5, MINUTE).unwrap());
    let rules = Rules::builder()
        .grpc("shop.v1.Orders", Some("Place"), place, Global)
        .grpc("shop.v1.Orders", None, orders, Global)
        .build()
        .unwrap();
    let router = Router::new()
        .route("/{*path}", post(|| async { "" }))
        .layer(RateLimitLayer::rules(rules));
    let call = |path: &'static str| {
        let router = router.clone();
        async move { router.oneshot(grpc(path)).await.unwrap() }
    };

    for _ in 0..2 {
        assert_eq!(call("/shop.v1.Orders/Place").await.status(), StatusCode::OK);
    }
    let denied = call("/shop.v1.Orders/Place").await;
    // Denied: a 429, or RESOURCE_EXHAUSTED where the layer answers gRPC in kind.
    let exhausted = denied
        .headers()
        .get("grpc-status")
        .is_some_and(|s| s == "8");
    assert!(denied.status() == StatusCode::TOO_MANY_REQUESTS || exhausted);
    assert_eq!(denied.headers()["ratelimit-policy"], r#""place";q=2;w=60"#);
    // The service's other methods have their own limit, first match first.
    let cancel = call("/shop.v1.Orders/Cancel").await;
    assert_eq!(cancel.status(), StatusCode::OK);
    assert_eq!(cancel.headers()["ratelimit"], r#""orders";r=4;t=60"#);
    // No rule and no default: passed untouched, without rate-limit headers.
    for _ in 0..10 {
        let other = call("/grpc.health.v1.Health/Check").await;
        assert_eq!(other.status(), StatusCode::OK);
        assert!(other.headers().get("ratelimit-policy").is_none());
    }
}

/// What an authentication layer would put in the extensions.
#[derive(Clone)]
struct User {
    id: u32,
    plan: &'static str,
}

#[tokio::test]
async fn tiers_give_free_and_pro_users_their_own_limits_on_one_layer() {
    let clock = FakeClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let tiers = Tiers::new(
        Extension::new(|user: &User| Subject::new(format!("user:{}", user.id))),
        |parts| parts.extensions.get::<User>().map(|user| user.plan),
    )
    .tier(
        "free",
        Limiter::new(
            store.clone(),
            Policy::sliding_log("free", 60, MINUTE).unwrap(),
        ),
    )
    .tier(
        "pro",
        Limiter::new(
            store.clone(),
            Policy::sliding_log("pro", 600, MINUTE).unwrap(),
        ),
    );
    let router = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(RateLimitLayer::tiers(tiers));
    let call = |user: Option<User>| {
        let router = router.clone();
        async move {
            let mut request = Request::get("/").body(Body::empty()).unwrap();
            if let Some(user) = user {
                request.extensions_mut().insert(user);
            }
            router.oneshot(request).await.unwrap()
        }
    };
    let free = User {
        id: 1,
        plan: "free",
    };
    let pro = User { id: 2, plan: "pro" };

    for _ in 0..60 {
        assert_eq!(call(Some(free.clone())).await.status(), StatusCode::OK);
    }
    let denied = call(Some(free.clone())).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit-policy"], r#""free";q=60;w=60"#);

    for i in 0..600 {
        let response = call(Some(pro.clone())).await;
        assert_eq!(response.status(), StatusCode::OK, "pro call {i}");
    }
    let denied = call(Some(pro.clone())).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit-policy"], r#""pro";q=600;w=60"#);

    // Another free user has a quota of their own.
    let other = User {
        id: 3,
        plan: "free",
    };
    assert_eq!(call(Some(other)).await.status(), StatusCode::OK);
    // No tier and no default: not limited by this layer.
    let anonymous = call(None).await;
    assert_eq!(anonymous.status(), StatusCode::OK);
    assert!(anonymous.headers().get("ratelimit").is_none());

    clock.advance(MINUTE);
    assert_eq!(call(Some(free)).await.status(), StatusCode::OK);
    assert_eq!(call(Some(pro)).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn unlisted_tiers_take_the_default() {
    let clock = FakeClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let tiers = Tiers::new(Global, |parts| {
        parts.headers.get("x-plan").and_then(|v| v.to_str().ok())
    })
    .tier(
        "pro",
        Limiter::new(
            store.clone(),
            Policy::fixed_window("pro", 5, MINUTE).unwrap(),
        ),
    )
    .default(Limiter::new(
        store,
        Policy::fixed_window("basic", 1, MINUTE).unwrap(),
    ));
    let router = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(RateLimitLayer::tiers(tiers));
    let call = |plan: Option<&'static str>| {
        let router = router.clone();
        async move {
            let mut request = Request::get("/");
            if let Some(plan) = plan {
                request = request.header("x-plan", plan);
            }
            router
                .oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap()
        }
    };
    assert_eq!(call(Some("enterprise")).await.status(), StatusCode::OK);
    let denied = call(None).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit-policy"], r#""basic";q=1;w=60"#);
    assert_eq!(call(Some("pro")).await.status(), StatusCode::OK);
}
