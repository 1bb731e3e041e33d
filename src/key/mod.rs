//! Key extractors: which subject a request is limited as.
//!
//! ```
//! use std::net::SocketAddr;
//! use http::{Request, StatusCode};
//! use redlimit::key::{ClientIp, Header, KeyExtractor, KeyExtractorExt, Route, Secret};
//!
//! // API keys are hashed with a secret of yours (`Secret::from_env`, a secret store).
//! let secret = Secret::new("from your secret store")?;
//! // Per API key when the client sends one, else per client address; and per route.
//! let key = Header::new("x-api-key", &secret)?
//!     .or(ClientIp::new())
//!     .and(Route::new());
//!
//! let (mut parts, ()) = Request::get("/users/7").body(()).unwrap().into_parts();
//! // The server puts the peer address in the extensions (axum's `ConnectInfo`,
//! // tonic's `TcpConnectInfo`, or a plain `SocketAddr` for bare hyper and tests).
//! parts.extensions.insert(SocketAddr::from(([203, 0, 113, 7], 4711)));
//! let by_ip = key.extract(&parts).unwrap();
//!
//! parts.headers.insert("x-api-key", "sk_live_abc".parse().unwrap());
//! let by_api_key = key.extract(&parts).unwrap();
//! assert_ne!(by_ip, by_api_key);
//! assert!(!format!("{by_api_key:?}").contains("sk_live"));
//!
//! // A missing subject is a 4xx the layer answers with, never a 500.
//! let rejection = Header::new("x-api-key", &secret)?.extract(&Request::get("/").body(()).unwrap().into_parts().0);
//! assert_eq!(rejection.unwrap_err().status(), StatusCode::UNAUTHORIZED);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The extractors, their subjects and rejections, and how to combine them, are on the
//! keys page, below.
//!
#![doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/keys.md"))]

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::StatusCode;
use smallvec::SmallVec;

use crate::error::debug_as_display;
use crate::subject::Subject;

mod client_ip;
mod combine;
mod extension;
mod forwarding;
mod from_fn;
mod global;
mod header;
mod route;

pub use client_ip::{ClientIp, ForwardedHeader};
pub use combine::{KeyExtractorExt, Or, Pair, RejectWith};
pub use extension::Extension;
pub use from_fn::{from_fn, FromFn};
pub use global::Global;
pub use header::{Header, InvalidHeaderName};
pub use route::Route;

pub use crate::subject::{Secret, SecretError};

/// Finds the subject of a request in its head.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a key extractor",
    label = "this must implement `redlimit::key::KeyExtractor`",
    note = "use one of `redlimit::key::*`, or `redlimit::key::from_fn(|parts| ...)`",
    note = "if it is a `Result` (of `Header::new(..)` or `Header::plain(..)`, say), add `?` to take the extractor out of it"
)]
pub trait KeyExtractor: Send + Sync + 'static {
    /// The subject to limit, or why there is none.
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection>;
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Arc<K> {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        (**self).extract(parts)
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Box<K> {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        (**self).extract(parts)
    }
}

/// No subject could be found: answered with this status and message.
///
/// Cheap to clone (the message is static or shared), since extractors hand out a
/// stored rejection for every request that lacks a key.
#[derive(Clone)]
pub struct KeyRejection {
    status: StatusCode,
    message: Message,
}

#[derive(Clone)]
enum Message {
    Static(&'static str),
    Shared(Arc<str>),
}

impl KeyRejection {
    /// A rejection answered with `status` and a short plain-text `message`.
    pub fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        let message = match message.into() {
            Cow::Borrowed(text) => Message::Static(text),
            Cow::Owned(text) => Message::Shared(text.into()),
        };
        Self { status, message }
    }

    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message to answer with.
    pub fn message(&self) -> &str {
        match &self.message {
            Message::Static(text) => text,
            Message::Shared(text) => text,
        }
    }
}

impl PartialEq for KeyRejection {
    fn eq(&self, other: &Self) -> bool {
        self.status == other.status && self.message() == other.message()
    }
}

impl Eq for KeyRejection {}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message())
    }
}

impl std::error::Error for KeyRejection {}

debug_as_display!(KeyRejection);

/// A subject's text, built on the stack: subjects up to [`crate::subject::MAX_RAW_LEN`]
/// bytes cost no allocation beyond the subject itself (longer ones are hashed anyway).
#[derive(Default)]
struct SubjectBuf(SmallVec<[u8; crate::subject::MAX_RAW_LEN]>);

impl SubjectBuf {
    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }

    fn subject(&self) -> Subject {
        Subject::new(&self.0[..])
    }
}

impl fmt::Write for SubjectBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Parts {
        http::Request::new(()).into_parts().0
    }

    #[test]
    fn arcs_and_boxes_are_extractors() {
        let boxed: Box<dyn KeyExtractor> = Box::new(Global);
        let shared: Arc<dyn KeyExtractor> = Arc::new(Route::new());
        let in_arc = Arc::new(Global);
        assert_eq!(boxed.extract(&parts()), Ok(Subject::new("global")));
        assert_eq!(in_arc.extract(&parts()), Ok(Subject::new("global")));
        assert_eq!(shared.extract(&parts()), Ok(Subject::new("route=GET /")));
        // Erased extractors still combine.
        let both = boxed.and(shared);
        assert!(both.extract(&parts()).is_ok());
    }

    #[test]
    fn rejections_show_status_and_message() {
        let r = KeyRejection::new(StatusCode::FORBIDDEN, "client address unavailable");
        assert_eq!(r.to_string(), "403 Forbidden: client address unavailable");
        assert_eq!(r.message(), "client address unavailable");
        let shared = KeyRejection::new(
            StatusCode::FORBIDDEN,
            String::from("client address unavailable"),
        );
        assert_eq!(shared, r);
        assert_eq!(format!("{:?}", shared.clone()), format!("{r:?}"));
        assert_eq!(
            format!("{r:?}"),
            "403 Forbidden: client address unavailable"
        );
    }
}
