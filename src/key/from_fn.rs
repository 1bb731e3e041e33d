//! An extractor written as a closure.

use std::fmt;

use http::request::Parts;

use super::extractor::{KeyExtractor, KeyRejection};
use crate::subject::Subject;

/// Keys requests by a closure over the request head, for keys the built-ins don't cover.
///
/// ```
/// use http::{Request, StatusCode};
/// use redlimit::key::{from_fn, KeyExtractor, KeyRejection};
/// use redlimit::Subject;
///
/// // One subject per host name; requests without one are a 400.
/// let by_host = from_fn(|parts| match parts.uri.host() {
///     Some(host) => Ok(Subject::new(format!("host:{host}"))),
///     None => Err(KeyRejection::new(StatusCode::BAD_REQUEST, "no host")),
/// });
/// let (parts, ()) = Request::get("https://example.com/").body(()).unwrap().into_parts();
/// assert_eq!(by_host.extract(&parts), Ok(Subject::new("host:example.com")));
/// ```
///
/// Give the subjects a prefix of their own (`host:`), so they never equal another
/// extractor's.
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Result<Subject, KeyRejection> + Send + Sync + 'static,
{
    FromFn { f }
}

/// The extractor [`from_fn`] makes.
#[derive(Clone)]
pub struct FromFn<F> {
    f: F,
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&Parts) -> Result<Subject, KeyRejection> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        (self.f)(parts)
    }
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}
