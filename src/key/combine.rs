//! Extractors made of extractors: both keys, one or else another, a restated rejection.

use std::borrow::Cow;

use http::request::Parts;
use http::StatusCode;

use super::extractor::{KeyExtractor, KeyRejection};
use crate::subject::Subject;

/// Combinators for every [`KeyExtractor`].
///
/// ```
/// use std::net::SocketAddr;
/// use http::{Request, StatusCode};
/// use redlimit::key::{ClientIp, Extension, KeyExtractor, KeyExtractorExt, Route};
///
/// #[derive(Clone)]
/// struct User(u64);
///
/// // Per user when signed in, else per address; separately for each route.
/// let key = Extension::new(|u: &User| format!("user:{}", u.0))
///     .or(ClientIp::new())
///     .and(Route::new());
///
/// // Without an address either, say so with a 400 instead of the default 403.
/// let strict = ClientIp::new().reject_with(StatusCode::BAD_REQUEST, "who are you?");
///
/// let (mut parts, ()) = Request::get("/a").body(()).unwrap().into_parts();
/// assert_eq!(strict.extract(&parts).unwrap_err().status(), StatusCode::BAD_REQUEST);
/// parts.extensions.insert(SocketAddr::from(([192, 0, 2, 1], 1234)));
/// let anonymous = key.extract(&parts).unwrap();
/// parts.extensions.insert(User(7));
/// assert_ne!(key.extract(&parts).unwrap(), anonymous);
/// ```
pub trait KeyExtractorExt: KeyExtractor + Sized {
    /// Both subjects as one (route and client, say): the first rejection if either rejects.
    fn and<B: KeyExtractor>(self, other: B) -> Pair<Self, B> {
        Pair(self, other)
    }

    /// This subject, or `other`'s when this one rejects (user, or else client address).
    /// When both reject, `other`'s rejection is answered.
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B> {
        Or {
            first: self,
            second: other,
        }
    }

    /// This subject with `other`'s beside it as the subject of the named `scope`
    /// ([`Subject::within`]): one check decides the key's policies and the
    /// policies [`per`](crate::Policy::per) [`Scope::named`](crate::Scope::named)`(scope)`
    /// (an org's, a team's) together, all or nothing. The first rejection if either
    /// rejects. Chain it for more scopes (`.within("team", ..).within("org", ..)`).
    ///
    /// ```
    /// use http::Request;
    /// use redlimit::key::{Header, KeyExtractor, KeyExtractorExt, Secret};
    ///
    /// let secret = Secret::new("from your secret store")?;
    /// let key = Header::new("x-api-key", &secret)?.within("org", Header::plain("x-org")?);
    /// let request = Request::get("/").header("x-api-key", "k").header("x-org", "acme");
    /// let (parts, ()) = request.body(()).unwrap().into_parts();
    /// assert!(key.extract(&parts).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn within<B: KeyExtractor>(self, scope: impl Into<String>, other: B) -> Within<Self, B> {
        Within {
            key: self,
            scope: scope.into(),
            other,
        }
    }

    /// Answers this extractor's rejections with `status` and `message` instead.
    fn reject_with(
        self,
        status: StatusCode,
        message: impl Into<Cow<'static, str>>,
    ) -> RejectWith<Self> {
        RejectWith {
            inner: self,
            rejection: KeyRejection::new(status, message),
        }
    }

    /// Erases the type, to keep differently built extractors in one place.
    fn boxed(self) -> Box<dyn KeyExtractor> {
        Box::new(self)
    }
}

impl<K: KeyExtractor> KeyExtractorExt for K {}

/// Two extractors whose subjects are joined into one (see [`KeyExtractorExt::and`]).
///
/// The join is unambiguous: `(ab, c)` never equals `(a, bc)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pair<A, B>(pub A, pub B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Pair<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        let first = self.0.extract(parts)?;
        let second = self.1.extract(parts)?;
        Ok(Subject::pair(&first, &second))
    }
}

/// One extractor, or another when it rejects (see [`KeyExtractorExt::or`]).
#[derive(Debug, Clone, Copy)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        self.first
            .extract(parts)
            .or_else(|_| self.second.extract(parts))
    }
}

/// An extractor whose rejections are restated (see [`KeyExtractorExt::reject_with`]).
#[derive(Debug, Clone)]
pub struct RejectWith<K> {
    inner: K,
    rejection: KeyRejection,
}

impl<K: KeyExtractor> KeyExtractor for RejectWith<K> {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        self.inner
            .extract(parts)
            .map_err(|_| self.rejection.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{from_fn, ClientIp, Global, Header, Route};
    use std::net::SocketAddr;

    fn parts() -> Parts {
        http::Request::get("/x").body(()).unwrap().into_parts().0
    }

    fn reject(status: StatusCode, message: &'static str) -> impl KeyExtractor {
        from_fn(move |_| Err(KeyRejection::new(status, message)))
    }

    fn fixed(value: &'static str) -> impl KeyExtractor {
        from_fn(move |_| Ok(Subject::new(value)))
    }

    #[test]
    fn and_joins_both_subjects_or_rejects_with_the_first() {
        let both = fixed("a").and(fixed("b"));
        assert_eq!(
            both.extract(&parts()),
            Ok(Subject::pair(&Subject::new("a"), &Subject::new("b")))
        );
        assert_ne!(
            both.extract(&parts()),
            fixed("b").and(fixed("a")).extract(&parts())
        );
        let first = reject(StatusCode::UNAUTHORIZED, "one")
            .and(reject(StatusCode::FORBIDDEN, "two"))
            .extract(&parts());
        assert_eq!(first.unwrap_err().message(), "one");
        let second = Global
            .and(reject(StatusCode::FORBIDDEN, "two"))
            .extract(&parts());
        assert_eq!(second.unwrap_err().message(), "two");
    }

    #[test]
    fn or_falls_back_only_on_rejection() {
        let mut parts = parts();
        parts
            .extensions
            .insert(SocketAddr::from(([192, 0, 2, 1], 1)));
        let key = Header::plain("x-user").unwrap().or(ClientIp::new());
        assert_eq!(key.extract(&parts), Ok(Subject::new("ip=192.0.2.1")));
        parts.headers.insert("x-user", "u1".parse().unwrap());
        assert_eq!(key.extract(&parts), Ok(Subject::new("header:x-user=u1")));

        let neither = reject(StatusCode::UNAUTHORIZED, "one")
            .or(reject(StatusCode::FORBIDDEN, "two"))
            .extract(&parts);
        assert_eq!(
            neither,
            Err(KeyRejection::new(StatusCode::FORBIDDEN, "two"))
        );
    }

    #[test]
    fn reject_with_restates_only_rejections() {
        let strict = ClientIp::new().reject_with(StatusCode::BAD_REQUEST, "no address");
        assert_eq!(
            strict.extract(&parts()),
            Err(KeyRejection::new(StatusCode::BAD_REQUEST, "no address"))
        );
        let fine = Route::new().reject_with(StatusCode::BAD_REQUEST, "never");
        assert_eq!(fine.extract(&parts()), Ok(Subject::new("route=GET /x")));
    }

    #[test]
    fn combinations_nest_and_erase() {
        let key = fixed("a").or(Global).and(Route::new()).boxed();
        let same = Pair(fixed("a"), Route::new());
        assert_eq!(key.extract(&parts()), same.extract(&parts()));
    }
}

/// A key with the subject of a named scope beside it (see [`KeyExtractorExt::within`]).
#[derive(Debug, Clone)]
pub struct Within<A, B> {
    key: A,
    scope: String,
    other: B,
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Within<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        let key = self.key.extract(parts)?;
        let other = self.other.extract(parts)?;
        Ok(key.within(&self.scope, &other))
    }
}
