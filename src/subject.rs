//! The subject a limit is kept for: an IP network, a hashed API key, a user id, a route.
//!
//! A subject is bytes, and may hold anything a client sent. It is made safe once, here:
//! long values are replaced by a hash so memory stays bounded, secrets are stored only
//! as a keyed hash, and the Redis store escapes it inside its key so that no input can
//! leave its hash tag or reach another subject's key.
//!
//! ```
//! use redlimit::{key::Secret, Subject};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let user = Subject::new("user:42");
//! let api_key = Secret::new("a long random server-side secret")?.subject(b"sk_live_abc");
//! assert_ne!(format!("{api_key:?}").contains("sk_live"), true);
//! assert_eq!(user, Subject::new("user:42"));
//! # Ok(()) }
//! ```

use std::fmt::{self, Write as _};

use smallvec::SmallVec;

use crate::error::debug_as_display;

/// Subjects longer than this are stored as a 128-bit hash of their bytes.
pub(crate) const MAX_RAW_LEN: usize = 128;

const RAW: u8 = b'r';
const HASHED: u8 = b'h';
const SECRET: u8 = b's';
/// A subject with named scopes beside its key ([`Subject::within`]): the key's bytes,
/// then each scope's name and bytes, by name, every part after its length (u16).
const SCOPED: u8 = b'm';
/// The one subject of [`Scope::global`](crate::Scope::global) counters.
pub(crate) const GLOBAL: &[u8] = b"g";
/// Context string of the unkeyed hash used for overlong subjects.
const LONG_CONTEXT: &str = "redlimit 2026 long subject";

/// An opaque, bounded identity to rate-limit.
///
/// Equal subjects share limits; the constructors keep different kinds of input apart
/// (a raw value can never equal a hashed one).
#[derive(PartialEq, Eq, Hash)]
pub struct Subject {
    /// A tag byte (raw, hashed or secret), then the value or its 16-byte hash.
    ///
    /// Inline up to 32 bytes (an address, a user id, a hashed secret): making and
    /// cloning a subject, once per request, then needs no allocation.
    bytes: SmallVec<[u8; INLINE]>,
}

/// How many bytes a subject holds in place.
const INLINE: usize = 32;

// By hand: `SmallVec`'s own `Clone` copies element by element; bytes copy as one block.
impl Clone for Subject {
    fn clone(&self) -> Self {
        Self {
            bytes: SmallVec::from_slice(&self.bytes),
        }
    }
}

impl Subject {
    /// A subject from a value that may be shown in logs and keys (an IP, a user id).
    ///
    /// Values longer than 128 bytes are kept as a hash, so a hostile
    /// megabyte costs 17 bytes.
    pub fn new(value: impl AsRef<[u8]>) -> Self {
        let value = value.as_ref();
        if value.len() > MAX_RAW_LEN {
            let hash = blake3::Hasher::new_derive_key(LONG_CONTEXT)
                .update(value)
                .finalize();
            return Self::tagged(HASHED, &hash.as_bytes()[..16]);
        }
        Self::tagged(RAW, value)
    }

    /// A subject from a secret (an API key): only a keyed hash of it is kept.
    ///
    /// `key` is the server-side secret that makes the hash unguessable; every instance
    /// that shares a Redis must use the same one. Any length works: it is first
    /// stretched into a 32-byte BLAKE3 key. A key others know (empty, or written in
    /// source) protects nothing against someone who reads Redis, which is why the
    /// public path is [`Secret::subject`], whose [`Secret`] refuses an empty key.
    #[cfg(test)]
    pub(crate) fn secret(key: &[u8], value: impl AsRef<[u8]>) -> Self {
        Self::secret_with(&derive_secret_key(key), value.as_ref())
    }

    /// [`Subject::secret`] with a key already derived by [`derive_secret_key`] (what a
    /// [`Secret`] holds).
    pub(crate) fn secret_with(key: &[u8; 32], value: &[u8]) -> Self {
        let hash = blake3::keyed_hash(key, value);
        Self::tagged(SECRET, &hash.as_bytes()[..16])
    }

    /// Two subjects as one (route and IP, say); `(a, b)` never equals another pair.
    pub fn pair(first: &Subject, second: &Subject) -> Self {
        let mut joined = Vec::with_capacity(first.bytes.len() + second.bytes.len() + 4);
        let _ = write!(Text(&mut joined), "{}:", first.bytes.len());
        joined.extend_from_slice(&first.bytes);
        joined.extend_from_slice(&second.bytes);
        Self::new(joined)
    }

    /// This subject with `scope`'s subject beside it, for the policies
    /// [`per`](crate::Policy::per) [`Scope::named`](crate::Scope::named)`(scope)`: one
    /// check decides the key's counters and the scope's (an org's, a team's) together.
    /// A scope given again replaces the earlier one.
    ///
    /// The scopes do not change whose subject this is for the key's own counters: a
    /// limiter whose policies name no scope counts `user` and `user` within any org
    /// as one subject.
    ///
    /// ```
    /// use redlimit::Subject;
    ///
    /// let user = Subject::new("user:7").within("org", &Subject::new("acme"));
    /// assert_ne!(user, Subject::new("user:7"));
    /// ```
    pub fn within(&self, scope: &str, subject: &Subject) -> Subject {
        let mut parts: SmallVec<[(&[u8], &[u8]); 2]> = self.scopes().collect();
        parts.retain(|(name, _)| *name != scope.as_bytes());
        parts.push((scope.as_bytes(), subject.key_part()));
        parts.sort_unstable();
        let key = self.key_part();
        let mut bytes = SmallVec::with_capacity(
            1 + 2
                + key.len()
                + parts
                    .iter()
                    .map(|(n, s)| 4 + n.len() + s.len())
                    .sum::<usize>(),
        );
        bytes.push(SCOPED);
        push_part(&mut bytes, key);
        for (name, part) in parts {
            push_part(&mut bytes, name);
            push_part(&mut bytes, part);
        }
        Self { bytes }
    }

    /// The subject of the request's key (itself, when it has no scopes).
    pub(crate) fn key_part(&self) -> &[u8] {
        if self.bytes.first() != Some(&SCOPED) {
            return &self.bytes;
        }
        split_part(&self.bytes[1..]).map_or(&[][..], |(key, _)| key)
    }

    /// Whether named scopes ride beside the key.
    #[inline]
    pub(crate) fn is_scoped(&self) -> bool {
        self.bytes.first() == Some(&SCOPED)
    }

    /// The named scopes and their subjects' bytes, by name.
    pub(crate) fn scopes(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let mut rest = if self.is_scoped() {
            split_part(&self.bytes[1..]).map_or(&[][..], |(_, rest)| rest)
        } else {
            &[][..]
        };
        std::iter::from_fn(move || {
            let (name, after) = split_part(rest)?;
            let (part, after) = split_part(after)?;
            rest = after;
            Some((name, part))
        })
    }

    /// The subject bytes of the scope `name`, if given.
    pub(crate) fn scope_part(&self, name: &str) -> Option<&[u8]> {
        self.scopes()
            .find(|(n, _)| *n == name.as_bytes())
            .map(|(_, part)| part)
    }

    /// The subject whose stored bytes are `bytes` (what [`as_bytes`](Self::as_bytes)
    /// gave).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Self {
            bytes: SmallVec::from_slice(bytes),
        }
    }

    /// This subject with only the scopes `keep` names (none: the key's plain subject),
    /// or the first of them it lacks.
    pub(crate) fn narrowed<'n>(&self, keep: &'n [std::sync::Arc<str>]) -> Result<Subject, &'n str> {
        if keep.is_empty() {
            return Ok(Self {
                bytes: SmallVec::from_slice(self.key_part()),
            });
        }
        let mut out = Self {
            bytes: SmallVec::from_slice(self.key_part()),
        };
        for name in keep {
            let part = self.scope_part(name).ok_or(&**name)?;
            out = out.within(
                name,
                &Self {
                    bytes: SmallVec::from_slice(part),
                },
            );
        }
        Ok(out)
    }

    /// `tag` then `value`: written straight into the inline buffer when they fit (a
    /// subject made per request, from an address or a user id, is one copy).
    #[inline]
    fn tagged(tag: u8, value: &[u8]) -> Self {
        let mut inline = [tag; INLINE];
        if let Some(place) = inline.get_mut(1..=value.len()) {
            place.copy_from_slice(value);
            return Self {
                bytes: SmallVec::from_buf_and_len(inline, value.len() + 1),
            };
        }
        let mut bytes = SmallVec::with_capacity(value.len() + 1);
        bytes.push(tag);
        bytes.extend_from_slice(value);
        Self { bytes }
    }

    /// The subject's stored bytes (a tag byte, then the value or its hash).
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Appends the subject as it appears inside a Redis hash tag.
    ///
    /// Raw values keep `[A-Za-z0-9._=:/@-]` and percent-escape every other byte (so no
    /// `{`, `}` or `%` ambiguity); hashes are `#` and hex (`#` is always escaped in raw
    /// values). The mapping is injective and never emits `{` or `}`.
    pub(crate) fn write_key_part(&self, out: &mut String) {
        if self.is_scoped() {
            // Only a limiter's own keys are written from parts (scoped sets); shown
            // whole in `Debug`: the key, then `+scope=subject` (`+` and `=` are
            // escaped inside parts).
            write_key_part_of(self.key_part(), out);
            for (name, part) in self.scopes() {
                out.push('+');
                out.push_str(&String::from_utf8_lossy(name));
                out.push('=');
                write_key_part_of(part, out);
            }
            return;
        }
        write_key_part_of(&self.bytes, out);
    }
}

/// Appends `bytes` (a plain subject's) as [`Subject::write_key_part`] shows them.
pub(crate) fn write_key_part_of(bytes: &[u8], out: &mut String) {
    let (tag, value) = bytes.split_first().unwrap_or((&RAW, &[]));
    match *tag {
        RAW => {
            // Runs of bytes that stand as themselves, each pushed at once: a key is
            // written for every check.
            let mut rest = value;
            loop {
                let run = rest.iter().take_while(|&&b| shown_as_is(b)).count();
                let (shown, after) = rest.split_at(run);
                // ASCII alone, so always UTF-8.
                out.push_str(std::str::from_utf8(shown).unwrap_or_default());
                let Some((&b, after)) = after.split_first() else {
                    break;
                };
                out.push('%');
                push_hex_digits(out, b, b"0123456789ABCDEF");
                rest = after;
            }
        }
        b'g' if value.is_empty() => out.push('~'),
        other => {
            out.push(if other == SECRET { '$' } else { '#' });
            push_hex(out, value);
        }
    }
}

/// Whether a plain subject's byte stands as itself in its key.
fn shown_as_is(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'=' | b':' | b'/' | b'@' | b'-')
}

/// Appends `bytes` in lowercase hex, two digits a byte.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(2 * bytes.len());
    for &b in bytes {
        push_hex_digits(out, b, b"0123456789abcdef");
    }
}

/// Appends `b` as two hex digits of `digits`.
fn push_hex_digits(out: &mut String, b: u8, digits: &[u8; 16]) {
    out.push(char::from(digits[usize::from(b >> 4)]));
    out.push(char::from(digits[usize::from(b & 0x0f)]));
}

/// Appends `part` after its length.
fn push_part(bytes: &mut SmallVec<[u8; 32]>, part: &[u8]) {
    let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&part[..usize::from(len)]);
}

/// The part at the start of `bytes` and what follows it.
fn split_part(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = usize::from(u16::from_le_bytes([*bytes.first()?, *bytes.get(1)?]));
    let rest = &bytes[2..];
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// Derives the 32-byte key [`Subject::secret`] uses from a secret of any length.
pub(crate) fn derive_secret_key(secret: &[u8]) -> [u8; 32] {
    blake3::derive_key("redlimit 2026 subject secret", secret)
}

/// A server-side secret that secret values (API keys) are hashed with before they
/// become subjects; every instance that shares a Redis must hold the same one.
///
/// There is no default: a key built into the crate would be public, and anyone who can
/// read Redis could test guessed API keys against it. Read it from configuration:
///
/// ```
/// use redlimit::key::{Header, Secret, SecretError};
///
/// # std::env::set_var("REDLIMIT_SECRET", "32 random bytes from your secret store");
/// let secret = Secret::from_env("REDLIMIT_SECRET")?;
/// let key = Header::new("x-api-key", &secret)?;
/// assert!(!format!("{secret:?} {key:?}").contains("random"));
///
/// assert!(matches!(Secret::new(""), Err(SecretError::Empty)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// What the hash protects: raw values are never stored in Redis, shown in keys, logs
/// or `Debug`, and someone who reads Redis cannot test guessed values offline without
/// the secret. What it does not: whoever has the secret and Redis can test guesses, so
/// short or leaked API keys stay weak; keep the secret as you keep the API keys.
/// Changing it changes every hashed subject, which resets their counts.
///
/// Only a key derived from the secret is kept (32 bytes, BLAKE3), never the secret
/// itself; `Debug` shows neither.
#[derive(Clone)]
pub struct Secret {
    key: [u8; 32],
}

impl Secret {
    /// A secret from bytes of any length; empty is refused. Use a long random value
    /// (32 bytes or more), not a word.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self {
            key: derive_secret_key(secret),
        })
    }

    /// The secret held by the environment variable `name`, read once; unset or empty
    /// is an error that names the variable.
    pub fn from_env(name: &str) -> Result<Self, SecretError> {
        let missing = || SecretError::MissingEnv {
            name: name.to_owned(),
        };
        let value = std::env::var_os(name).ok_or_else(missing)?;
        Self::new(value.into_encoded_bytes()).map_err(|_| missing())
    }

    /// `value` (an API key, a session token) as a subject: a keyed hash of it.
    pub fn subject(&self, value: impl AsRef<[u8]>) -> Subject {
        Subject::secret_with(&self.key, value.as_ref())
    }

    /// The derived 32-byte key.
    pub(crate) fn key(&self) -> &[u8; 32] {
        &self.key
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Why a [`Secret`] could not be made.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// An empty secret would hash with a key everyone knows.
    #[error("the secret is empty: secret values would be hashed with a key everyone knows")]
    Empty,
    /// The environment variable is unset or empty.
    #[error(
        "environment variable {name} is unset or empty: set it to a long random value, \
         the same on every instance that shares a Redis (API keys are hashed with it)"
    )]
    MissingEnv {
        /// The variable's name.
        name: String,
    },
}

debug_as_display!(SecretError);

impl From<&str> for Subject {
    fn from(value: &str) -> Self {
        Subject::new(value)
    }
}

impl From<String> for Subject {
    fn from(value: String) -> Self {
        Subject::new(value)
    }
}

/// An integer (a user or tenant id) as a subject: its decimal text, so
/// `Extension::new(|user: &User| user.id)` keys by the id as it is.
///
/// Two different numbers never give one subject, whatever their types (a sign is
/// written, `-7`); the same number does, whatever its type, so an id keeps its count
/// when its type widens from `u32` to `u64`. The text is the one `Subject::new` gives
/// it: `7u64` and `"7"` are one subject. No built-in extractor gives a bare number (theirs
/// read `ip=..`, `route=..`), so a number can only meet another subject of your own:
/// give it a prefix (`format!("user:{}", user.id)`) where two kinds of id share a
/// limiter.
macro_rules! subject_from_integers {
    ($($int:ty),+) => {$(
        impl From<$int> for Subject {
            fn from(value: $int) -> Self {
                // Every `i128` fits (39 digits and a sign): no allocation. (64: the
                // nearest size smallvec takes without its `const_generics`.)
                let mut text = SmallVec::<[u8; 64]>::new();
                let _ = write!(Text(&mut text), "{value}");
                Subject::new(&text[..])
            }
        }
    )+};
}

subject_from_integers!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = String::new();
        self.write_key_part(&mut shown);
        f.debug_tuple("Subject").field(&shown).finish()
    }
}

/// `fmt::Write` over bytes (a `Vec`, a `SmallVec`), for `write!` of numbers.
struct Text<'a, B>(&'a mut B);

impl<B: Extend<u8>> fmt::Write for Text<'_, B> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend(s.bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &Subject) -> String {
        let mut out = String::new();
        s.write_key_part(&mut out);
        out
    }

    #[test]
    fn key_parts_are_written_as_they_always_were() {
        // Keys already in Redis name their subjects so: a change here strands them.
        let cases: [(&[u8], &str); 5] = [
            (b"r203.0.113.7", "203.0.113.7"),
            (b"ra b/{c}%\xff", "a%20b/%7Bc%7D%25%FF"),
            (b"r", ""),
            (b"h\x00\xab\xff\x10", "#00abff10"),
            (b"s\x01\xfe", "$01fe"),
        ];
        for (bytes, part) in cases {
            let mut out = String::new();
            write_key_part_of(bytes, &mut out);
            assert_eq!(out, part, "{bytes:?}");
        }
    }

    #[test]
    fn hostile_bytes_never_leave_the_hash_tag() {
        for input in [
            &b"}{evil"[..],
            b"a}:b",
            b"%7D",
            b"#abc",
            b"$abc",
            b"\xff\x00\xfe",
        ] {
            let k = key(&Subject::new(input));
            assert!(!k.contains('{') && !k.contains('}'), "{k}");
            assert!(!k.starts_with('#') && !k.starts_with('$'), "{k}");
        }
        assert_ne!(key(&Subject::new("%7D")), key(&Subject::new("}")));
    }

    #[test]
    fn long_values_are_bounded_and_distinct() {
        let a = Subject::new(vec![b'a'; 1 << 20]);
        let b = Subject::new(vec![b'b'; 1 << 20]);
        assert_eq!(a.as_bytes().len(), 17);
        assert_ne!(a, b);
        assert!(key(&a).starts_with('#'));
        // A raw value that looks like a hash is not a hash.
        assert_ne!(Subject::new(key(&a)), a);
    }

    #[test]
    fn secrets_are_keyed_and_never_raw() {
        let a = Subject::secret(b"k1", "sk_live_123");
        let b = Subject::secret(b"k2", "sk_live_123");
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains("sk_live"));
        assert_ne!(a, Subject::new("sk_live_123"));
    }

    #[test]
    fn secrets_are_required_non_empty_and_never_shown() {
        assert!(matches!(Secret::new(""), Err(SecretError::Empty)));
        let s = Secret::new("hunter2-server-secret").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        // The hash a secret gives is the one `Subject::secret` gives with its bytes.
        assert_eq!(
            s.subject("sk_live_1"),
            Subject::secret(b"hunter2-server-secret", "sk_live_1")
        );
        let name = "REDLIMIT_TEST_SECRET_SUBJECT_RS";
        std::env::remove_var(name);
        let err = Secret::from_env(name).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
        std::env::set_var(name, "");
        assert_eq!(Secret::from_env(name).unwrap_err(), err);
        std::env::set_var(name, "hunter2-server-secret");
        let from_env = Secret::from_env(name).unwrap();
        assert_eq!(from_env.subject("k"), s.subject("k"));
        std::env::remove_var(name);
    }

    #[test]
    fn integers_are_their_decimal_text() {
        assert_eq!(Subject::from(7u64), Subject::new("7"));
        assert_eq!(Subject::from(7u32), Subject::from(7u64));
        assert_eq!(Subject::from(-7i64), Subject::new("-7"));
        assert_ne!(Subject::from(-7i64), Subject::from(7i64));
        assert_eq!(
            Subject::from(u128::MAX),
            Subject::new(u128::MAX.to_string())
        );
        assert_eq!(
            Subject::from(i128::MIN),
            Subject::new(i128::MIN.to_string())
        );
        assert_eq!(key(&Subject::from(42usize)), "42");
    }

    proptest::proptest! {
        /// Distinct values of one type are distinct subjects.
        #[test]
        fn distinct_integers_are_distinct_subjects(a: i128, b: i128, c: u64, d: u64) {
            proptest::prop_assert_eq!(Subject::from(a) == Subject::from(b), a == b);
            proptest::prop_assert_eq!(Subject::from(c) == Subject::from(d), c == d);
            proptest::prop_assert_eq!(Subject::from(c), Subject::from(u128::from(c)));
        }
    }

    #[test]
    fn pairs_do_not_collide_by_regrouping() {
        let ab_c = Subject::pair(&Subject::new("ab"), &Subject::new("c"));
        let a_bc = Subject::pair(&Subject::new("a"), &Subject::new("bc"));
        assert_ne!(ab_c, a_bc);
    }
}
