//! gRPC answers: the builders alone, then through the layer on a fake clock.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, Empty, Full};
use tower::{ServiceBuilder, ServiceExt};

use super::*;
use crate::clock::FakeClock;
use crate::key::{from_fn, KeyExtractor, KeyRejection};
use crate::layer::headers::{RATELIMIT, RATELIMIT_POLICY};
use crate::layer::tests::BrokenStore;
use crate::layer::FailureMode;
use crate::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};

fn head(content_type: Option<&str>) -> Parts {
    let mut builder = Request::post("/grpc.health.v1.Health/Check");
    if let Some(content_type) = content_type {
        builder = builder.header(CONTENT_TYPE, content_type);
    }
    builder.body(()).unwrap().into_parts().0
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn grpc_is_told_by_the_content_type_prefix() {
    for grpc in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc; charset=utf-8",
        "Application/GRPC",
        "application/grpc-web+proto",
    ] {
        assert!(is_grpc(&head(Some(grpc))), "{grpc}");
    }
    for other in ["application/json", "application/grp", "text/plain", ""] {
        assert!(!is_grpc(&head(Some(other))), "{other}");
    }
    assert!(!is_grpc(&head(None)));
}

#[test]
fn http_statuses_map_to_grpc_codes() {
    let cases = [
        (StatusCode::BAD_REQUEST, INVALID_ARGUMENT),
        (StatusCode::UNAUTHORIZED, UNAUTHENTICATED),
        (StatusCode::FORBIDDEN, PERMISSION_DENIED),
        (StatusCode::NOT_FOUND, NOT_FOUND),
        (StatusCode::TOO_MANY_REQUESTS, RESOURCE_EXHAUSTED),
        (StatusCode::INTERNAL_SERVER_ERROR, INTERNAL),
        (StatusCode::NOT_IMPLEMENTED, UNIMPLEMENTED),
        (StatusCode::BAD_GATEWAY, UNAVAILABLE),
        (StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE),
        (StatusCode::GATEWAY_TIMEOUT, UNAVAILABLE),
        (StatusCode::IM_A_TEAPOT, UNKNOWN),
        (StatusCode::OK, UNKNOWN),
    ];
    for (status, code) in cases {
        assert_eq!(code_for(status), code, "{status}");
    }
}

#[test]
fn messages_are_percent_encoded_as_the_spec_says() {
    assert_eq!(percent_encode("plain text ~!"), "plain text ~!");
    assert_eq!(percent_encode("100% sure"), "100%25 sure");
    assert_eq!(percent_encode("a\r\nb\t"), "a%0D%0Ab%09");
    assert_eq!(percent_encode("über ✓"), "%C3%BCber %E2%9C%93");
    assert_eq!(percent_encode("\u{7f}"), "%7F");
}

#[test]
fn trailers_only_is_200_with_the_status_in_the_headers() {
    let response = trailers_only(
        &head(Some("application/grpc+proto")),
        RESOURCE_EXHAUSTED,
        "rate limit 'ü' exceeded",
        Some(250),
    );
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.body().is_empty());
    let headers = response.headers();
    assert_eq!(
        header(headers, "content-type"),
        Some("application/grpc+proto")
    );
    assert_eq!(header(headers, "grpc-status"), Some("8"));
    assert_eq!(
        header(headers, "grpc-message"),
        Some("rate limit '%C3%BC' exceeded")
    );
    assert_eq!(header(headers, "grpc-retry-pushback-ms"), Some("250"));

    let no_pushback = trailers_only(&head(None), UNAUTHENTICATED, "who?", None);
    assert_eq!(
        header(no_pushback.headers(), "content-type"),
        Some("application/grpc")
    );
    assert_eq!(header(no_pushback.headers(), "grpc-status"), Some("16"));
    assert!(no_pushback.headers().get(GRPC_RETRY_PUSHBACK_MS).is_none());
}

// Through the layer.

/// Keys on `x-user`; without one, the status in `x-reject` (default 401) rejects it.
fn user_key() -> impl KeyExtractor {
    from_fn(|parts| match parts.headers.get("x-user") {
        Some(user) => Ok(Subject::new(user.as_bytes())),
        None => {
            let status = parts
                .headers
                .get("x-reject")
                .and_then(|v| StatusCode::from_bytes(v.as_bytes()).ok())
                .unwrap_or(StatusCode::UNAUTHORIZED);
            Err(KeyRejection::new(status, "no user: 100% anonymous"))
        }
    })
}

fn grpc_request(user: Option<&str>) -> Request<Empty<Bytes>> {
    let mut builder = Request::post("/demo.Echo/Say").header(CONTENT_TYPE, "application/grpc");
    if let Some(user) = user {
        builder = builder.header("x-user", user);
    }
    builder.body(Empty::new()).unwrap()
}

async fn ok(_req: Request<Empty<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::from("served")))
}

#[tokio::test]
async fn a_denied_grpc_request_is_resource_exhausted_with_the_pushback() {
    let clock = FakeClock::new(0);
    let policy = Policy::fixed_window("per-peer", 2, Duration::from_secs(10)).unwrap();
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()), policy);
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, user_key()))
        .service_fn(ok);

    for _ in 0..2 {
        let allowed = svc.clone().oneshot(grpc_request(Some("a"))).await.unwrap();
        assert_eq!(allowed.status(), StatusCode::OK);
        assert!(allowed.headers().get(GRPC_STATUS).is_none());
        assert_eq!(
            allowed.into_body().collect().await.unwrap().to_bytes(),
            "served"
        );
    }

    clock.advance(Duration::from_millis(1_500));
    let denied = svc.clone().oneshot(grpc_request(Some("a"))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::OK);
    let headers = denied.headers().clone();
    assert_eq!(header(&headers, "content-type"), Some("application/grpc"));
    assert_eq!(header(&headers, "grpc-status"), Some("8"));
    assert_eq!(header(&headers, "grpc-retry-pushback-ms"), Some("8500"));
    assert_eq!(
        header(&headers, "grpc-message"),
        Some("rate limit 'per-peer' exceeded; retry after 8500 ms")
    );
    assert_eq!(
        header(&headers, RATELIMIT_POLICY.as_str()),
        Some(r#""per-peer";q=2;w=10"#)
    );
    assert_eq!(
        header(&headers, RATELIMIT.as_str()),
        Some(r#""per-peer";r=0;t=9"#)
    );
    assert!(headers.get("retry-after").is_none());
    // Trailers-only: the headers end the stream, no body and no trailers follow.
    let body = denied.into_body();
    assert!(body.is_end_stream());
    let collected = body.collect().await.unwrap();
    assert!(collected.trailers().is_none());
    assert!(collected.to_bytes().is_empty());

    // Another peer, and plain HTTP, are not affected by the gRPC branch.
    let other = svc.clone().oneshot(grpc_request(Some("b"))).await.unwrap();
    assert!(other.headers().get(GRPC_STATUS).is_none());
    let http = Request::get("/")
        .header("x-user", "a")
        .body(Empty::new())
        .unwrap();
    let http = svc.clone().oneshot(http).await.unwrap();
    assert_eq!(http.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(http.headers().get(GRPC_STATUS).is_none());
}

#[tokio::test]
async fn grpc_key_rejections_carry_the_nearest_grpc_status() {
    let limiter = Limiter::new(
        MemoryStore::with_clock(FakeClock::new(0)),
        Policy::fixed_window("d", 5, Duration::from_secs(1)).unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, user_key()))
        .service_fn(ok);
    for (status, code) in [("401", "16"), ("403", "7"), ("400", "3"), ("503", "14")] {
        let mut request = grpc_request(None);
        request
            .headers_mut()
            .insert("x-reject", HeaderValue::from_static(status));
        let rejected = svc.clone().oneshot(request).await.unwrap();
        assert_eq!(rejected.status(), StatusCode::OK, "{status}");
        let headers = rejected.headers();
        assert_eq!(header(headers, "grpc-status"), Some(code), "{status}");
        assert_eq!(
            header(headers, "grpc-message"),
            Some("no user: 100%25 anonymous")
        );
        assert!(headers.get(GRPC_RETRY_PUSHBACK_MS).is_none());
        assert!(rejected.into_body().is_end_stream());
    }
}

#[tokio::test]
async fn a_closed_store_failure_is_unavailable_for_grpc() {
    let limiter = Limiter::new(
        BrokenStore,
        Policy::fixed_window("d", 5, Duration::from_secs(1)).unwrap(),
    );
    let layer = RateLimitLayer::new(limiter, user_key());
    let closed = ServiceBuilder::new()
        .layer(layer.clone().failure_mode(FailureMode::Closed))
        .service_fn(ok);
    let unavailable = closed.oneshot(grpc_request(Some("a"))).await.unwrap();
    assert_eq!(unavailable.status(), StatusCode::OK);
    let headers = unavailable.headers();
    assert_eq!(header(headers, "grpc-status"), Some("14"));
    assert_eq!(header(headers, "grpc-retry-pushback-ms"), Some("1000"));
    assert!(unavailable.into_body().is_end_stream());

    // Open mode lets the call through untouched.
    let open = ServiceBuilder::new().layer(layer).service_fn(ok);
    let served = open.oneshot(grpc_request(Some("a"))).await.unwrap();
    assert!(served.headers().get(GRPC_STATUS).is_none());
    assert_eq!(
        served.into_body().collect().await.unwrap().to_bytes(),
        "served"
    );
}
