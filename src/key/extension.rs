//! The identity an authentication layer put into the request extensions.

use std::fmt;
use std::marker::PhantomData;

use http::request::Parts;
use http::StatusCode;

use super::extractor::{KeyExtractor, KeyRejection};
use crate::subject::Subject;
use crate::telemetry;

/// Keys requests by a value of type `T` that an earlier layer inserted into the request
/// extensions, typically the authenticated user.
///
/// ```
/// use http::{Request, StatusCode};
/// use redlimit::key::{Extension, KeyExtractor};
/// use redlimit::Subject;
///
/// #[derive(Clone)]
/// struct User { id: u64 }
///
/// // With a mapping closure ...
/// let by_user = Extension::new(|user: &User| format!("user:{}", user.id));
///
/// // ... or with a type that knows its subject: the standard conversion.
/// impl From<&User> for Subject {
///     fn from(user: &User) -> Self { Subject::new(format!("user:{}", user.id)) }
/// }
/// let same = Extension::<User>::of();
///
/// let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(by_user.extract(&parts).unwrap_err().status(), StatusCode::UNAUTHORIZED);
/// parts.extensions.insert(User { id: 42 });
/// assert_eq!(by_user.extract(&parts), Ok(Subject::new("user:42")));
/// assert_eq!(same.extract(&parts), by_user.extract(&parts));
/// ```
///
/// A request without the extension is rejected with **401 "not authenticated"**;
/// fall back to another key (say, the client address) with
/// [`KeyExtractorExt::or`](super::combine::KeyExtractorExt::or), or restate the rejection with
/// [`reject_with`](super::combine::KeyExtractorExt::reject_with). The rate limit layer must run
/// after (inside) the layer that inserts the value: when every request is answered
/// 401, signed-in ones too, the order is the other way round, and a `tracing` line at
/// debug names the type that was looked for (`the request has no myapp::User
/// extension`). The body does not: it goes to every client that is not signed in,
/// for whom "not authenticated" is the whole answer, and the type is the
/// application's own business.
///
/// The mapping may return anything that converts into a [`Subject`]: a `String`, or
/// an integer id as it is (`Extension::new(|user: &User| user.id)`, its decimal text;
/// see [`Subject`]'s `From` impls).
pub struct Extension<T, F = fn(&T) -> Subject> {
    map: F,
    _value: PhantomData<fn(&T)>,
}

impl<T> Extension<T>
where
    T: Send + Sync + 'static,
    for<'a> &'a T: Into<Subject>,
{
    /// Keys by the extension's own conversion into a [`Subject`]: write
    /// `impl From<&User> for Subject` for the type, and give the subject a prefix of
    /// its own (`user:42`), so it never equals another kind's.
    pub fn of() -> Self {
        Self {
            map: into_subject::<T>,
            _value: PhantomData,
        }
    }
}

fn into_subject<T>(value: &T) -> Subject
where
    for<'a> &'a T: Into<Subject>,
{
    value.into()
}

impl<T, F> Extension<T, F> {
    /// Keys by what `map` makes of the extension (anything that converts into a
    /// [`Subject`], such as a `String`).
    pub fn new<S>(map: F) -> Self
    where
        F: Fn(&T) -> S,
        S: Into<Subject>,
    {
        Self {
            map,
            _value: PhantomData,
        }
    }
}

impl<T, F, S> KeyExtractor for Extension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> S + Send + Sync + 'static,
    S: Into<Subject>,
{
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        match parts.extensions.get::<T>() {
            Some(value) => Ok((self.map)(value).into()),
            None => {
                telemetry::extension_missing(std::any::type_name::<T>());
                Err(KeyRejection::new(
                    StatusCode::UNAUTHORIZED,
                    "not authenticated",
                ))
            }
        }
    }
}

impl<T, F: Clone> Clone for Extension<T, F> {
    fn clone(&self) -> Self {
        Self {
            map: self.map.clone(),
            _value: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for Extension<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extension")
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Tenant(&'static str);

    impl From<&Tenant> for Subject {
        fn from(tenant: &Tenant) -> Self {
            Subject::new(format!("tenant:{}", tenant.0))
        }
    }

    #[test]
    fn present_extensions_are_mapped() {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.extensions.insert(Tenant("acme"));
        let by_trait = Extension::<Tenant>::of();
        let by_closure = Extension::new(|t: &Tenant| Subject::new(format!("tenant:{}", t.0)));
        assert_eq!(by_trait.extract(&parts), Ok(Subject::new("tenant:acme")));
        assert_eq!(by_closure.extract(&parts), by_trait.extract(&parts));
        assert!(format!("{by_trait:?}").contains("Tenant"));
    }

    #[test]
    fn missing_extensions_are_401() {
        let (parts, ()) = http::Request::new(()).into_parts();
        let err = Extension::<Tenant>::of()
            .clone()
            .extract(&parts)
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(err.message(), "not authenticated");
    }
}
