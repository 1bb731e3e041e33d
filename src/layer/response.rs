//! The responses the layer writes itself (429, 503, key rejections) and the body type
//! that carries either those or the inner service's own.
//!
//! Every answer the layer makes is built here from the request head, so a new kind of
//! answer (gRPC's `RESOURCE_EXHAUSTED` for `application/grpc` requests) is one branch in
//! these functions and no change to the service: see [`crate::layer::grpc`].

use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::decision::Decision;
use crate::error::Error;
use crate::key::KeyRejection;
use crate::layer::aftercare::AtEnd;
use crate::layer::grpc;
use crate::layer::headers::{retry_after_secs, PolicyHeaders, Snapshot};
use crate::layer::options::{BodyStyle, Config};
use crate::policy::Algorithm;

pin_project! {
    /// The body of a rate-limited service's responses: the inner service's own body, or
    /// the short one the layer wrote for a 429, a 503 or a key rejection.
    ///
    /// Its data is [`Bytes`] and its error is the inner body's, so it fits wherever the
    /// inner body did (axum, tonic, hyper).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        // `at_end` is dropped when the body ends (its last frame, or an error), or
        // with the body: the request's slot is given back then.
        Inner { #[pin] body: B, at_end: Option<AtEnd> },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, at_end: Option<AtEnd>) -> Self {
        Self {
            kind: Kind::Inner { body, at_end },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            kind: Kind::Full { data },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, at_end } => {
                let frame = ready!(body.poll_frame(cx));
                if !matches!(frame, Some(Ok(_))) {
                    at_end.take();
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A response the layer answers by itself, before the body type is chosen.
pub(crate) type Answer = Response<Bytes>;

/// The 429 for a denied request: `Retry-After`, the configured rate-limit headers and a
/// short body.
///
/// A gRPC request (`content-type: application/grpc...`) gets a trailers-only
/// `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms` instead, and the same rate-limit
/// headers: see [`crate::layer::grpc`].
pub(crate) fn too_many_requests(
    head: &Parts,
    decision: &Decision,
    config: &Config,
    policy_headers: &PolicyHeaders,
) -> Answer {
    if grpc::is_grpc(head) {
        // The exact wait, at least 1 ms: 0 would tell a retrying client to come straight back.
        let wait_ms = decision.outcome().retry_after_ms.max(1);
        let message = format!("{}; retry after {wait_ms} ms", what_denied(decision));
        let mut response =
            grpc::trailers_only(head, grpc::RESOURCE_EXHAUSTED, &message, Some(wait_ms));
        policy_headers.write(
            config.header_style,
            &Snapshot::of(decision),
            response.headers_mut(),
        );
        return response;
    }
    let retry = retry_after_secs(decision);
    let detail = format!("{}; retry after {retry} s", what_denied(decision));
    let status = if decision.policy().is_quota() {
        config.quota_status
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let body = match config.body_style {
        BodyStyle::PlainText => {
            format!("{}: {detail}", status.canonical_reason().unwrap_or("Error"))
        }
        BodyStyle::ProblemJson => problem_json(status, &detail, Some(retry)),
    };
    let mut response = answer(status, config, body);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(retry));
    policy_headers.write(config.header_style, &Snapshot::of(decision), headers);
    response
}

/// Which limit denied, in words a client can act on: a rate (come back later) or
/// requests in flight (finish one first).
fn what_denied(decision: &Decision) -> String {
    let policy = decision.policy();
    match policy.algorithm() {
        Algorithm::InFlight => format!(
            "in-flight limit '{}' reached: {} requests already running",
            policy.name(),
            policy.limit()
        ),
        Algorithm::Calendar => {
            let wait_ms = decision.outcome().retry_after_ms;
            match reset_point(policy, wait_ms) {
                Some(at) => format!(
                    "quota '{}' of {} used up; it resets at {at}",
                    policy.name(),
                    policy.limit()
                ),
                None => format!("quota '{}' of {} used up", policy.name(), policy.limit()),
            }
        }
        _ => format!("rate limit '{}' exceeded", policy.name()),
    }
}

/// When a calendar quota denying for `wait_ms` resets, in its zone's local time
/// (`2026-11-15T00:00:00-05:00[America/New_York]`): the period boundary nearest the
/// system clock's now plus the wait (the check's clock may be the store's).
#[cfg(feature = "calendar")]
fn reset_point(policy: &crate::policy::Policy, wait_ms: u64) -> Option<String> {
    use crate::clock::{Clock, SystemClock};
    let calendar = policy.calendar_spec()?;
    let near = SystemClock
        .now_ms()
        .saturating_add(wait_ms)
        .saturating_sub(1);
    let end = crate::algorithm::calendar::period_at(policy, near).1;
    let at = jiff::Timestamp::from_millisecond(i64::try_from(end).ok()?).ok()?;
    Some(at.to_zoned_datetime(calendar.zone.clone()).to_string())
}

/// Without the feature no policy is a calendar quota.
#[cfg(not(feature = "calendar"))]
fn reset_point(_policy: &crate::policy::Policy, _wait_ms: u64) -> Option<String> {
    None
}

/// The 503 of [`FailureMode::Closed`](crate::layer::FailureMode::Closed) when the store
/// cannot decide: never a 429, which would blame the client.
///
/// A gRPC request gets `UNAVAILABLE`, the status gRPC clients retry, with a pushback of
/// one second like the `Retry-After: 1` of the 503.
pub(crate) fn unavailable(head: &Parts, config: &Config) -> Answer {
    if grpc::is_grpc(head) {
        return grpc::trailers_only(
            head,
            grpc::UNAVAILABLE,
            "rate limiter unavailable; retry after 1000 ms",
            Some(1_000),
        );
    }
    let body = match config.body_style {
        BodyStyle::PlainText => "Service Unavailable: rate limiter unavailable".to_owned(),
        BodyStyle::ProblemJson => problem_json(
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate limiter cannot decide; retry after 1 s",
            Some(1),
        ),
    };
    let mut response = answer(StatusCode::SERVICE_UNAVAILABLE, config, body);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The answer to a request whose cost no policy could ever take ([`Error::ZeroCost`],
/// [`Error::CostTooHigh`]).
///
/// A cost computed from the request (items in a batch, bytes, tokens) is the client's
/// input, so this is the client's error, answered the same in every failure mode and on
/// every store, and nothing is counted: a cost of 0 is `400 Bad Request` (counting
/// nothing would let the request past an exhausted limit), a cost above what a policy
/// admits at once is `429` without `Retry-After` (no wait makes it fit: the client must
/// send less at a time). gRPC gets `INVALID_ARGUMENT` and `RESOURCE_EXHAUSTED` without a
/// pushback.
pub(crate) fn impossible_cost(
    head: &Parts,
    error: &Error,
    config: &Config,
    policy_headers: &PolicyHeaders,
) -> Answer {
    let (status, detail) = match error {
        Error::CostTooHigh { cost, max, policy } => (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this request costs {cost}, more than rate limit '{policy}' ever admits at once ({max}); send less at a time"
            ),
        ),
        _ => (
            StatusCode::BAD_REQUEST,
            "this request costs 0; every request must cost at least 1".to_owned(),
        ),
    };
    let mut response = if grpc::is_grpc(head) {
        grpc::trailers_only(head, grpc::code_for(status), &detail, None)
    } else {
        let body = match config.body_style {
            BodyStyle::PlainText => {
                format!("{}: {detail}", status.canonical_reason().unwrap_or("Error"))
            }
            BodyStyle::ProblemJson => problem_json(status, &detail, None),
        };
        answer(status, config, body)
    };
    if status == StatusCode::TOO_MANY_REQUESTS {
        policy_headers.write_quota(config.header_style, response.headers_mut());
    }
    response
}

/// The answer to a request the key extractor found no subject in: the rejection's own
/// status and message (for a gRPC request, the nearest gRPC status: [`grpc::code_for`]).
pub(crate) fn rejected(head: &Parts, rejection: &KeyRejection, config: &Config) -> Answer {
    if grpc::is_grpc(head) {
        let code = grpc::code_for(rejection.status());
        return grpc::trailers_only(head, code, rejection.message(), None);
    }
    let body = match config.body_style {
        BodyStyle::PlainText => rejection.message().to_owned(),
        BodyStyle::ProblemJson => problem_json(rejection.status(), rejection.message(), None),
    };
    answer(rejection.status(), config, body)
}

/// The answer to a check the limiter could not make as set up (its policies count a
/// scope the layer gives no subject for): a 500 that names it, in every failure mode.
pub(crate) fn misconfigured(head: &Parts, error: &Error, config: &Config) -> Answer {
    let message = error.to_string();
    if grpc::is_grpc(head) {
        return grpc::trailers_only(head, grpc::INTERNAL, &message, None);
    }
    let body = match config.body_style {
        BodyStyle::PlainText => message,
        BodyStyle::ProblemJson => problem_json(StatusCode::INTERNAL_SERVER_ERROR, &message, None),
    };
    answer(StatusCode::INTERNAL_SERVER_ERROR, config, body)
}

fn answer(status: StatusCode, config: &Config, body: String) -> Answer {
    let content_type = match config.body_style {
        BodyStyle::PlainText => "text/plain; charset=utf-8",
        BodyStyle::ProblemJson => "application/problem+json",
    };
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// An RFC 9457 problem object. `about:blank` says the status alone explains the
/// problem, so the title is the status's reason phrase.
fn problem_json(status: StatusCode, detail: &str, retry_after: Option<u64>) -> String {
    let mut out = String::with_capacity(128 + detail.len());
    out.push_str(r#"{"type":"about:blank","title":"#);
    push_json_string(&mut out, status.canonical_reason().unwrap_or("Error"));
    let _ = write!(out, r#","status":{},"detail":"#, status.as_u16());
    push_json_string(&mut out, detail);
    if let Some(secs) = retry_after {
        let _ = write!(out, r#","retry_after":{secs}"#);
    }
    out.push('}');
    out
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn problem_json_escapes_what_json_needs() {
        let body = problem_json(StatusCode::BAD_REQUEST, "a \"b\"\\\n\u{1}", None);
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"a \"b\"\\\n\u0001"}"#
        );
    }

    #[tokio::test]
    async fn full_body_is_one_frame_with_an_exact_size() {
        let body = ResponseBody::<http_body_util::Empty<Bytes>>::full(Bytes::from_static(b"hi"));
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"hi");

        let empty = ResponseBody::<http_body_util::Empty<Bytes>>::full(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn inner_body_passes_through() {
        let body = ResponseBody::inner(
            http_body_util::Full::new(Bytes::from_static(b"inner")),
            None,
        );
        assert_eq!(body.size_hint().exact(), Some(5));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"inner");
    }
}
