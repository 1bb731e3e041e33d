//! The auth layer and the rate limit on one axum router, in the order docs/rules.md and
//! docs/keys.md show: the auth middleware added after the rate limit (axum runs the
//! last-added layer first), so the user it inserts is there when the key is read.
//! Signed-in users are limited per user in their plan's tier, anonymous callers per
//! address in the default tier; in the other order the key never sees the user.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use redlimit::clock::FakeClock;
use redlimit::key::{ClientIp, Extension, KeyExtractor, KeyExtractorExt};
use redlimit::layer::Tiers;
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
use tower::ServiceExt;

const MINUTE: Duration = Duration::from_secs(60);

/// What the auth middleware puts in the request's extensions.
#[derive(Clone)]
struct User {
    id: u64,
    plan: String,
}

/// A stand-in for a session check: `x-session: <id>:<plan>` signs the caller in; no
/// header, no user (the request goes on anonymous).
async fn auth(mut request: Request, next: Next) -> Response {
    let session = request
        .headers()
        .get("x-session")
        .and_then(|v| v.to_str().ok());
    if let Some((id, plan)) = session.and_then(|s| s.split_once(':')) {
        let user = User {
            id: id.parse().unwrap(),
            plan: plan.to_owned(),
        };
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

/// The tiers of docs/rules.md (smaller): pro 3 a minute per user, anonymous callers
/// 2 a minute per address.
fn tiers(
    store: &MemoryStore,
) -> RateLimitLayer<MemoryStore, Tiers<MemoryStore, impl KeyExtractor>> {
    let tiers = Tiers::new(
        Extension::new(|u: &User| Subject::new(format!("user:{}", u.id))).or(ClientIp::new()),
        |parts| parts.extensions.get::<User>().map(|u| u.plan.as_str()),
    )
    .tier(
        "pro",
        Limiter::new(
            store.clone(),
            Policy::fixed_window("pro", 3, MINUTE).unwrap(),
        ),
    )
    .default(Limiter::new(
        store.clone(),
        Policy::fixed_window("anonymous", 2, MINUTE).unwrap(),
    ));
    RateLimitLayer::tiers(tiers)
}

fn routes() -> Router {
    Router::new().route("/", get(|| async { "hi" }))
}

/// A request from `peer`, signed in as `session` (`"7:pro"`) or anonymous; the peer
/// address where `into_make_service_with_connect_info` puts it.
async fn call(router: &Router, peer: [u8; 4], session: Option<&str>) -> Response {
    let mut request = Request::get("/");
    if let Some(session) = session {
        request = request.header("x-session", session);
    }
    let mut request = request.body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((peer, 40000))));
    router.clone().oneshot(request).await.unwrap()
}

fn policy(response: &Response) -> &str {
    response.headers()["ratelimit-policy"].to_str().unwrap()
}

#[tokio::test]
async fn auth_added_after_the_limit_runs_first_users_per_user_anonymous_per_address() {
    let store = MemoryStore::with_clock(FakeClock::new(0));
    // Added last, so it runs first: the user is in the extensions when the key is read.
    let app = routes()
        .layer(tiers(&store))
        .layer(middleware::from_fn(auth));
    let (a, b) = ([203, 0, 113, 1], [203, 0, 113, 2]);

    // A signed-in user: their plan's limit, per user, whatever address they call from.
    for peer in [a, b, a] {
        let ok = call(&app, peer, Some("7:pro")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(policy(&ok), r#""pro";q=3;w=60"#);
    }
    let denied = call(&app, b, Some("7:pro")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another user on the same plan and address has a budget of their own.
    assert_eq!(call(&app, a, Some("8:pro")).await.status(), StatusCode::OK);

    // No credentials: the anonymous tier, per address, untouched by the users' counts.
    for _ in 0..2 {
        let ok = call(&app, a, None).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(policy(&ok), r#""anonymous";q=2;w=60"#);
    }
    let denied = call(&app, a, None).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy(&denied), r#""anonymous";q=2;w=60"#);
    assert_eq!(call(&app, b, None).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn auth_added_before_the_limit_runs_after_it_and_the_key_never_sees_the_user() {
    let store = MemoryStore::with_clock(FakeClock::new(0));

    // Keyed by the user alone, as a plain layer: every request is refused 401, signed in
    // or not, because the limit runs before the auth middleware has inserted anything.
    let by_user = Limiter::new(
        store.clone(),
        Policy::fixed_window("users", 3, MINUTE).unwrap(),
    );
    let key = Extension::new(|u: &User| Subject::new(format!("user:{}", u.id)));
    let wrong = routes()
        .layer(middleware::from_fn(auth))
        .layer(RateLimitLayer::new(by_user.clone(), key.clone()));
    let refused = call(&wrong, [203, 0, 113, 1], Some("7:pro")).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    // The same layers the other way round limit the user.
    let right = routes()
        .layer(RateLimitLayer::new(by_user, key))
        .layer(middleware::from_fn(auth));
    let ok = call(&right, [203, 0, 113, 1], Some("7:pro")).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(policy(&ok), r#""users";q=3;w=60"#);

    // With tiers whose key falls back to the address, the wrong order fails quietly:
    // a signed-in user is counted as anonymous (the RateLimit-Policy header says so).
    let quiet = routes()
        .layer(middleware::from_fn(auth))
        .layer(tiers(&store));
    let anonymous = call(&quiet, [203, 0, 113, 9], Some("7:pro")).await;
    assert_eq!(anonymous.status(), StatusCode::OK);
    assert_eq!(policy(&anonymous), r#""anonymous";q=2;w=60"#);
}
