//! Key extractors: which subject a request is limited as.
//!
//! An extractor is sync and reads only the request's head (`http::request::Parts`).
//! When it finds nothing to key on, it returns a [`KeyRejection`], which the layer
//! answers with the rejection's status and message (never a 500, never a panic); or it
//! falls back to another extractor with [`KeyExtractorExt::or`].

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;
use http::StatusCode;

use crate::subject::Subject;

/// Finds the subject of a request in its head.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a key extractor",
    label = "this must implement `redlimit::key::KeyExtractor`",
    note = "use one of `redlimit::key::*`, or `redlimit::key::from_fn(|parts| ...)`"
)]
pub trait KeyExtractor: Send + Sync + 'static {
    /// The subject to limit, or why there is none.
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection>;
}

/// No subject could be found: answered with this status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRejection {
    status: StatusCode,
    message: Cow<'static, str>,
}

impl KeyRejection {
    /// A rejection answered with `status` and a short plain-text `message`.
    pub fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message to answer with.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for KeyRejection {}
