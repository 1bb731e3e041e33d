//! A request header's value as the subject: hashed (API keys) or plain (tenant ids).

use std::fmt;

use http::header::HeaderName;
use http::request::Parts;
use http::StatusCode;

use super::extractor::{KeyExtractor, KeyRejection, SubjectBuf};
use crate::error::debug_as_display;
use crate::subject::{Secret, Subject};

/// Keys requests by a header's value: an API key, a tenant id.
///
/// ```
/// use http::{Request, StatusCode};
/// use redlimit::key::{Header, KeyExtractor, Secret};
///
/// // From your secret store or the environment (`Secret::from_env`); the same on every
/// // instance that shares a Redis.
/// let secret = Secret::new("a long random value shared by every instance")?;
/// let key = Header::new("x-api-key", &secret)?;
/// let (parts, ()) = Request::get("/")
///     .header("x-api-key", "sk_live_abc")
///     .body(())
///     .unwrap()
///     .into_parts();
/// let subject = key.extract(&parts).unwrap();
/// assert!(!format!("{subject:?} {key:?}").contains("sk_live"));
///
/// let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// let rejection = key.extract(&parts).unwrap_err();
/// assert_eq!(rejection.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(rejection.message(), "missing x-api-key header");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// - [`Header::new`] treats the value as a secret: the subject is a keyed BLAKE3 hash
///   of it, under a key derived from your [`Secret`] and the header name, so the raw
///   value is never stored, logged, or shown by `Debug`, and someone who reads Redis
///   cannot test guessed values without the secret. There is no built-in secret (it
///   would be public); see [`Secret`] for what the hash does not protect. Every
///   instance that shares a Redis must use the same secret, or each keeps its own
///   counts; changing it resets every API key's count.
/// - [`Header::plain`] is for values that are not secret (a tenant id): the subject
///   reads `header:x-tenant=acme`, escaped before it becomes part of a Redis key, and
///   values longer than 128 bytes are hashed.
///
/// The first line of the header is read. A missing or empty header is rejected with
/// **401 `missing <name> header`**. The value is what the client sent, not checked: a
/// client can rotate it freely, so key on it for clients that are authenticated by it,
/// or use [`Extension`](super::extension::Extension) for an identity an auth layer has checked.
#[derive(Clone)]
pub struct Header {
    name: HeaderName,
    mode: Mode,
    missing: KeyRejection,
}

#[derive(Clone)]
enum Mode {
    /// The BLAKE3 key for this header, derived from the secret and the header name.
    Secret([u8; 32]),
    Plain,
}

impl Header {
    /// A secret header (an API key): only a hash of its value keyed by `secret` is
    /// kept. Any case is accepted (`X-Api-Key` reads `x-api-key`); a name that is not a
    /// valid header name is an error.
    pub fn new(name: impl AsRef<str>, secret: &Secret) -> Result<Self, InvalidHeaderName> {
        Ok(Self::secret(header_name(name.as_ref())?, secret))
    }

    /// [`Header::new`] of a name already checked.
    pub(crate) fn secret(name: HeaderName, secret: &Secret) -> Self {
        Self {
            mode: Mode::Secret(header_key(secret, &name)),
            missing: missing(&name),
            name,
        }
    }

    /// A header whose value is not secret (a tenant id): kept readable, escaped. A name
    /// that is not a valid header name is an error, as for [`Header::new`].
    pub fn plain(name: impl AsRef<str>) -> Result<Self, InvalidHeaderName> {
        let name = header_name(name.as_ref())?;
        Ok(Self {
            mode: Mode::Plain,
            missing: missing(&name),
            name,
        })
    }

    /// The header read.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl Header {
    /// The subject of a request whose header holds `value`: what an admin route names
    /// a key by (`Limiter::set_limit`, `Limiter::reset`) without a request of its own.
    pub fn subject_of(&self, value: impl AsRef<[u8]>) -> Subject {
        let value = value.as_ref();
        match &self.mode {
            Mode::Secret(key) => Subject::secret_with(key, value),
            Mode::Plain => SubjectBuf::default()
                .push(b"header:")
                .push(self.name.as_str().as_bytes())
                .push(b"=")
                .push(value)
                .subject(),
        }
    }
}

impl KeyExtractor for Header {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        let value = match parts.headers.get(&self.name) {
            Some(value) if !value.is_empty() => value.as_bytes(),
            _ => return Err(self.missing.clone()),
        };
        Ok(self.subject_of(value))
    }
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::Secret(_) => "secret (keyed hash)",
            Mode::Plain => "plain",
        };
        f.debug_struct("Header")
            .field("name", &self.name)
            .field("mode", &mode)
            .finish_non_exhaustive()
    }
}

/// A name that [`Header::new`] or [`Header::plain`] refused; its message names it
/// (`"x api key" is not an HTTP header name: ...`).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not an HTTP header name: use letters, digits and '-' (as in \"x-api-key\"), \
     with no spaces"
)]
pub struct InvalidHeaderName {
    name: String,
}

impl InvalidHeaderName {
    /// The name as it was given.
    pub fn name(&self) -> &str {
        &self.name
    }
}

debug_as_display!(InvalidHeaderName);

/// `name` as a header name (any case), or the error that names it.
fn header_name(name: &str) -> Result<HeaderName, InvalidHeaderName> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| InvalidHeaderName {
        name: name.to_owned(),
    })
}

/// Separates headers: the same value in two headers gives two subjects. (The same
/// derivation as before secrets became required, so counts kept under a configured
/// secret carry over.)
fn header_key(secret: &Secret, name: &HeaderName) -> [u8; 32] {
    *blake3::keyed_hash(secret.key(), name.as_str().as_bytes()).as_bytes()
}

fn missing(name: &HeaderName) -> KeyRejection {
    KeyRejection::new(
        StatusCode::UNAUTHORIZED,
        format!("missing {} header", name.as_str()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn secret(value: &str) -> Secret {
        Secret::new(value).unwrap()
    }

    fn with(headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn secret_values_are_hashed_and_never_shown() {
        let key = Header::new("x-api-key", &secret("hunter2-server-secret")).unwrap();
        let parts = with(&[("x-api-key", "sk_live_0123456789")]);
        let subject = key.extract(&parts).unwrap();
        let shown = format!("{subject:?} {key:?} {:?}", key.clone());
        assert!(!shown.contains("sk_live"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!subject.as_bytes().windows(7).any(|w| w == b"sk_live"));
        // Stable across instances with the same secret.
        let again = Header::new("X-Api-Key", &secret("hunter2-server-secret")).unwrap();
        assert_eq!(again.extract(&parts), Ok(subject.clone()));
        // Different values, secrets and headers give different subjects.
        let other = with(&[("x-api-key", "sk_live_other")]);
        assert_ne!(key.extract(&other), Ok(subject.clone()));
        assert_ne!(
            Header::new("x-api-key", &secret("another secret"))
                .unwrap()
                .extract(&parts),
            Ok(subject.clone())
        );
        let both = with(&[("x-api-key", "same"), ("x-other-key", "same")]);
        let s = secret("s");
        assert_ne!(
            Header::new("x-api-key", &s).unwrap().extract(&both),
            Header::new("x-other-key", &s).unwrap().extract(&both)
        );
    }

    #[test]
    fn plain_values_are_readable_and_escaped() {
        let key = Header::plain("x-tenant").unwrap();
        let parts = with(&[("x-tenant", "acme")]);
        assert_eq!(
            key.extract(&parts),
            Ok(Subject::new("header:x-tenant=acme"))
        );
        let mut out = String::new();
        key.extract(&with(&[("x-tenant", "}{evil")]))
            .unwrap()
            .write_key_part(&mut out);
        assert!(!out.contains('{') && !out.contains('}'), "{out}");
        // A plain header can't pose as a client address.
        let parts = with(&[("ip", "203.0.113.7")]);
        assert_ne!(
            Header::plain("ip").unwrap().extract(&parts),
            Ok(Subject::new("ip=203.0.113.7"))
        );
        // The same header read as a secret hides it.
        let hidden = Header::new("x-tenant", &secret("s"))
            .unwrap()
            .extract(&with(&[("x-tenant", "acme")]))
            .unwrap();
        assert!(!format!("{hidden:?}").contains("acme"));
    }

    #[test]
    fn missing_or_empty_headers_are_401() {
        for parts in [with(&[]), with(&[("x-api-key", "")])] {
            let err = Header::new("x-api-key", &secret("s"))
                .unwrap()
                .extract(&parts)
                .unwrap_err();
            assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(err.message(), "missing x-api-key header");
        }
        let err = Header::plain("x-tenant")
            .unwrap()
            .extract(&with(&[]))
            .unwrap_err();
        assert_eq!(err.message(), "missing x-tenant header");
    }

    #[test]
    fn the_first_line_is_read() {
        let key = Header::plain("x-tenant").unwrap();
        let parts = with(&[("x-tenant", "a"), ("x-tenant", "b")]);
        assert_eq!(key.extract(&parts), Ok(Subject::new("header:x-tenant=a")));
    }

    #[test]
    fn names_of_any_form() {
        let s = secret("s");
        assert_eq!(Header::new("X-Api-Key", &s).unwrap().name(), "x-api-key");
        assert_eq!(
            Header::new(HeaderName::from_static("x-api-key"), &s)
                .unwrap()
                .name(),
            "x-api-key"
        );
        assert_eq!(Header::plain(String::from("x-t")).unwrap().name(), "x-t");
    }

    #[test]
    fn an_invalid_name_is_an_error_not_a_panic() {
        assert!(Header::new("bad name", &secret("s")).is_err());
        assert!(Header::plain("").is_err());
        assert!(Header::plain("x\ny").is_err());
    }

    /// What `main` prints for `Header::new("x api key", ..)?`: the name, not
    /// `InvalidHeaderName`.
    #[test]
    fn an_invalid_name_is_named() {
        let err = Header::new("x api key", &secret("s")).unwrap_err();
        assert_eq!(err.name(), "x api key");
        let shown = format!("{err:?}");
        assert!(
            shown.starts_with("\"x api key\" is not an HTTP header name"),
            "{shown}"
        );
        assert!(!shown.contains("InvalidHeaderName"), "{shown}");
        assert_eq!(shown, err.to_string());
        let err = Header::plain("x\ny").unwrap_err();
        assert!(err.to_string().starts_with("\"x\\ny\" is not"), "{err}");
    }
}
