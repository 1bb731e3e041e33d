//! Keys and layers as a user writes them: an integer id from an `Extension`, the
//! missing extension named in the log, and a layer's type named in a signature.

use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::Empty;
use redlimit::clock::FakeClock;
use redlimit::key::{ClientIp, Extension, KeyExtractor, KeyExtractorExt};
use redlimit::layer::KeyedLayer;
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
use tower::{ServiceBuilder, ServiceExt};

use crate::support::layer::{body_text, hello};
use crate::support::Captured;

#[derive(Clone)]
struct User {
    id: u64,
}

fn limiter(clock: &FakeClock, limit: u32) -> Limiter<MemoryStore> {
    let policy = Policy::fixed_window("api", limit, Duration::from_secs(60)).unwrap();
    Limiter::new(MemoryStore::with_clock(clock.clone()), policy)
}

fn signed_in(id: u64) -> Request<Empty<bytes::Bytes>> {
    let mut request = Request::new(Empty::new());
    request.extensions_mut().insert(User { id });
    request
}

/// `Extension::new(|u: &User| u.id)` with `id: u64` compiles and keys each id on its
/// own, as the decimal text of the id.
#[tokio::test]
async fn an_integer_id_is_a_subject() {
    let clock = FakeClock::new(0);
    let limiter = limiter(&clock, 1);
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::from_shared(
            std::sync::Arc::new(limiter),
            Extension::new(|user: &User| user.id),
        ))
        .service_fn(hello);
    let first = svc.clone().oneshot(signed_in(7)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let again = svc.clone().oneshot(signed_in(7)).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = svc.clone().oneshot(signed_in(8)).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "another id counts apart");
    let anonymous = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
}

/// The count lives under the id's decimal text: what `Subject::from(7u64)` names.
#[tokio::test]
async fn an_integer_id_counts_under_its_decimal_text() {
    let clock = FakeClock::new(0);
    let limiter = std::sync::Arc::new(limiter(&clock, 3));
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::from_shared(
            std::sync::Arc::clone(&limiter),
            Extension::new(|user: &User| user.id),
        ))
        .service_fn(hello);
    svc.oneshot(signed_in(7)).await.unwrap();
    assert_eq!(limiter.peek("7", 1).await.unwrap().remaining(), 1);
    assert_eq!(
        limiter
            .peek(Subject::from(7u32), 1)
            .await
            .unwrap()
            .remaining(),
        1
    );
    assert_eq!(limiter.peek("8", 1).await.unwrap().remaining(), 2);
}

/// A request without the extension: the 401 says only "not authenticated" (it goes to
/// every client that is not signed in), and a debug line names the type the key
/// looked for, for the developer whose layers are in the wrong order.
#[tokio::test(flavor = "current_thread")]
async fn a_missing_extension_is_named_in_the_log_not_the_body() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let clock = FakeClock::new(0);
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter(&clock, 5),
            Extension::new(|user: &User| user.id),
        ))
        .service_fn(hello);
    let anonymous = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let body = body_text(anonymous).await;
    assert_eq!(body, "not authenticated");
    let log = captured.text();
    let user = std::any::type_name::<User>();
    assert!(
        log.contains("DEBUG") && log.contains(&format!("the request has no {user} extension")),
        "{log}"
    );
    assert!(log.contains("answered 401"), "{log}");
}

/// The layer's type, written in a signature and a struct field: `KeyedLayer<S, K>`. A
/// key made with a closure has a type no one can write, so it is boxed.
fn api_limit(clock: &FakeClock) -> KeyedLayer<MemoryStore, Box<dyn KeyExtractor>> {
    let key = Extension::new(|user: &User| user.id).or(ClientIp::new());
    RateLimitLayer::new(limiter(clock, 1), key.boxed())
}

struct AppState {
    limit: KeyedLayer<MemoryStore, Box<dyn KeyExtractor>>,
}

#[tokio::test]
async fn a_layer_s_type_can_be_named() {
    let clock = FakeClock::new(0);
    let state = AppState {
        limit: api_limit(&clock),
    };
    let svc = ServiceBuilder::new()
        .layer(state.limit.clone())
        .service_fn(hello);
    let first = svc.clone().oneshot(signed_in(1)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let again = svc.clone().oneshot(signed_in(1)).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = svc.oneshot(signed_in(2)).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
}
