//! gRPC answers: a gRPC client cannot read an HTTP 429, so a denied gRPC request gets
//! what gRPC calls a trailers-only response.
//!
//! A request is gRPC when its `content-type` starts with `application/grpc` (so
//! `application/grpc+proto` and gRPC-Web's `application/grpc-web` too). The layer then
//! answers HTTP 200 with an empty body and the status in the headers:
//!
//! ```text
//! content-type: application/grpc
//! grpc-status: 8
//! grpc-message: rate limit 'per-peer' exceeded; retry after 1500 ms
//! grpc-retry-pushback-ms: 1500
//! ratelimit-policy: "per-peer";q=5;w=10
//! ratelimit: "per-peer";r=0;t=2
//! ```
//!
//! `8` is `RESOURCE_EXHAUSTED`; `grpc-retry-pushback-ms` is the wait a gRPC client's retry
//! policy honours. Key rejections and a closed-mode store failure get the gRPC status
//! nearest their HTTP one ([`code_for`]).

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Response, StatusCode};

/// `grpc-status`: the call's status code, a decimal number.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the status's description, percent-encoded.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`: how long a retrying client should wait, in milliseconds
/// (gRFC A6, the retry design).
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// `INVALID_ARGUMENT` (3): the request itself is malformed (an HTTP 400).
pub(crate) const INVALID_ARGUMENT: u8 = 3;
/// `NOT_FOUND` (5): an HTTP 404.
pub(crate) const NOT_FOUND: u8 = 5;
/// `PERMISSION_DENIED` (7): the caller is known but not allowed (an HTTP 403).
pub(crate) const PERMISSION_DENIED: u8 = 7;
/// `RESOURCE_EXHAUSTED` (8): the rate limit is exceeded (an HTTP 429).
pub(crate) const RESOURCE_EXHAUSTED: u8 = 8;
/// `UNIMPLEMENTED` (12): an HTTP 501.
pub(crate) const UNIMPLEMENTED: u8 = 12;
/// `INTERNAL` (13): an HTTP 500.
pub(crate) const INTERNAL: u8 = 13;
/// `UNAVAILABLE` (14): try again later; the limiter cannot decide (an HTTP 502, 503, 504).
pub(crate) const UNAVAILABLE: u8 = 14;
/// `UNAUTHENTICATED` (16): no valid credentials (an HTTP 401).
pub(crate) const UNAUTHENTICATED: u8 = 16;
/// `UNKNOWN` (2): any HTTP status without a closer gRPC one.
pub(crate) const UNKNOWN: u8 = 2;

const GRPC_PREFIX: &[u8] = b"application/grpc";

/// Whether a request speaks gRPC: its `content-type` starts with `application/grpc`
/// (compared without regard to ASCII case, as media types are).
pub(crate) fn is_grpc(head: &Parts) -> bool {
    head.headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.as_bytes().get(..GRPC_PREFIX.len()))
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(GRPC_PREFIX))
}

/// The gRPC status code for one of the layer's HTTP statuses, so a [`KeyRejection`]
/// written with HTTP in mind reads right to a gRPC client too.
///
/// [`KeyRejection`]: crate::key::KeyRejection
pub(crate) fn code_for(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => INVALID_ARGUMENT,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => NOT_FOUND,
        429 => RESOURCE_EXHAUSTED,
        500 => INTERNAL,
        501 => UNIMPLEMENTED,
        502..=504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

/// A trailers-only gRPC response: HTTP 200, an empty body, the status in the headers.
///
/// The `content-type` repeats the request's (it starts with `application/grpc`), so a
/// gRPC-Web client gets its own media type back.
pub(crate) fn trailers_only(
    head: &Parts,
    code: u8,
    message: &str,
    pushback_ms: Option<u64>,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    let content_type = head
        .headers
        .get(CONTENT_TYPE)
        .filter(|_| is_grpc(head))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("application/grpc"));
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    // Percent-encoding leaves only visible ASCII and spaces, which a header value takes.
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    if let Some(ms) = pushback_ms {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
    }
    response
}

/// `grpc-message` encoding (gRPC over HTTP/2 spec): the UTF-8 bytes, with `%` and every
/// byte outside space..`~` written as `%XX`.
fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    out
}

#[cfg(test)]
mod tests;
