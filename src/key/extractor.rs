//! The extractor trait every key implements, the rejection it answers with when a
//! request has no subject, and the stack buffer extractors build a subject's text in.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::StatusCode;
use smallvec::SmallVec;

use crate::error::debug_as_display;
use crate::subject::Subject;

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
pub(super) struct SubjectBuf(SmallVec<[u8; crate::subject::MAX_RAW_LEN]>);

impl SubjectBuf {
    pub(super) fn push(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }

    pub(super) fn subject(&self) -> Subject {
        Subject::new(&self.0[..])
    }
}

impl fmt::Write for SubjectBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
