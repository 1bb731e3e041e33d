//! The rate-limit response headers: IETF structured fields, or the legacy `X-RateLimit-*`.
//!
//! [`HeaderStyle::Ietf`] follows draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy`
//! lists every policy the limiter checks, `RateLimit` describes the binding one.
//!
//! ```text
//! RateLimit-Policy: "burst";q=10;w=1, "hourly";q=1000;w=3600
//! RateLimit: "burst";r=0;t=1
//! Retry-After: 1
//! ```
//!
//! All numbers are whole seconds, rounded up: a client that waits `t` seconds never
//! comes back too early.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use sfv::{KeyRef, ListSerializer, StringRef};

use crate::decision::Decision;
use crate::policy::Policy;

/// `RateLimit`: the binding policy's remaining quota and seconds until it frees up.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy`: every policy the limiter checks, with its quota and window.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `X-RateLimit-Limit` (legacy style): the binding policy's limit.
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (legacy style): units left in the binding policy.
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (legacy style): seconds until the binding policy is back to unused.
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which rate-limit headers responses carry.
///
/// `Retry-After` is always sent with a 429, whatever the style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` as structured fields
    /// (draft-ietf-httpapi-ratelimit-headers): the standard track.
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds), for
    /// clients written against the older convention.
    Legacy,
    /// Both sets, while clients migrate.
    Both,
    /// No rate-limit headers (only `Retry-After` on a 429).
    None,
}

impl HeaderStyle {
    fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }

    fn legacy(self) -> bool {
        matches!(self, HeaderStyle::Legacy | HeaderStyle::Both)
    }

    pub(crate) fn is_none(self) -> bool {
        self == HeaderStyle::None
    }
}

/// The largest integer a structured field may carry (RFC 9651, 15 digits).
const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// Milliseconds as whole seconds, rounded up.
pub(crate) fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// What the headers say about one decision, in the numbers they show.
///
/// Small and `Copy`, so the response future can carry it across the inner call instead
/// of the whole [`Decision`] (which goes to the request's extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// The binding policy's position in the limiter.
    index: usize,
    limit: u64,
    remaining: u64,
    /// Seconds until the binding policy is back to unused, rounded up.
    reset_secs: u64,
    /// Seconds until quota frees up: the retry-after when denied (for an in-flight
    /// policy, its hint: a slot frees whenever a request ends), else the reset.
    wait_secs: u64,
}

impl Snapshot {
    pub(crate) fn of(decision: &Decision) -> Self {
        let reset_secs = ceil_secs(decision.outcome().reset_after_ms);
        let wait_secs = match decision.retry_after() {
            Some(_) => retry_after_secs(decision),
            None => reset_secs,
        };
        Self {
            index: decision.policy_index(),
            limit: decision.limit(),
            remaining: decision.remaining(),
            reset_secs,
            wait_secs,
        }
    }
}

/// `Retry-After` for a denial: whole seconds, rounded up, at least 1 (a client told 0
/// comes straight back and is denied again).
pub(crate) fn retry_after_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.outcome().retry_after_ms).max(1)
}

/// The parts of the headers fixed by the limiter's policies, computed once per layer.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHeaders {
    /// `RateLimit-Policy`, already serialized.
    policy_list: Option<HeaderValue>,
    /// Per policy, in the limiter's order.
    policies: Box<[PolicyParts]>,
}

#[derive(Debug, Clone)]
struct PolicyParts {
    /// The policy name as a structured-field string, quotes included.
    item: Option<Box<str>>,
    /// `X-RateLimit-Limit`.
    limit: HeaderValue,
}

impl PolicyHeaders {
    pub(crate) fn new(policies: &[Policy]) -> Self {
        let mut list = ListSerializer::new();
        let mut parts = Vec::with_capacity(policies.len());
        for policy in policies {
            // Policy names are checked to `[A-Za-z0-9_.-]`, always a valid sf-string; a
            // name that somehow is not is left out of the headers rather than sent
            // malformed (its entry stays, so indices still match the limiter's).
            let name = StringRef::from_str(policy.name()).ok();
            if let Some(name) = name {
                let item = list
                    .bare_item(name)
                    .parameter(KeyRef::constant("q"), sf_integer(policy.limit()));
                // Requests in flight have no window: their quota is requests at once.
                // (The serializer writes as it goes: what it returns needs no finish.)
                if !policy.is_in_flight() {
                    _ = item.parameter(
                        KeyRef::constant("w"),
                        sf_integer(ceil_secs(policy.window_ms())),
                    );
                }
            }
            parts.push(PolicyParts {
                item: name.map(|name| {
                    let mut item = String::with_capacity(policy.name().len() + 2);
                    _ = sfv::ItemSerializer::with_buffer(&mut item).bare_item(name);
                    item.into_boxed_str()
                }),
                limit: HeaderValue::from(policy.limit()),
            });
        }
        let policy_list = list.finish().and_then(|s| HeaderValue::try_from(s).ok());
        Self {
            policy_list,
            policies: parts.into_boxed_slice(),
        }
    }

    /// Adds only what the policies fix, `RateLimit-Policy` (for a request that was not
    /// counted, so has no `RateLimit` of its own).
    pub(crate) fn write_quota(&self, style: HeaderStyle, headers: &mut HeaderMap) {
        if let Some(list) = self.policy_list.as_ref().filter(|_| style.ietf()) {
            headers.append(RATELIMIT_POLICY, list.clone());
        }
    }

    /// Adds the headers of `style` for `snapshot` to `headers`.
    ///
    /// The structured fields are lists, so they are appended: an outer and an inner
    /// limiter both show. The legacy fields hold one number each, so an existing value
    /// (from a limiter nearer the handler) is kept.
    pub(crate) fn write(&self, style: HeaderStyle, snapshot: &Snapshot, headers: &mut HeaderMap) {
        let policy = self.policies.get(snapshot.index);
        self.write_quota(style, headers);
        if style.ietf() {
            if let Some(value) = policy
                .and_then(|p| p.item.as_deref())
                .and_then(|item| ratelimit_value(item, snapshot))
            {
                headers.append(RATELIMIT, value);
            }
        }
        if style.legacy() {
            let limit = match policy {
                Some(p) => p.limit.clone(),
                None => HeaderValue::from(snapshot.limit),
            };
            headers.entry(X_RATELIMIT_LIMIT).or_insert(limit);
            headers
                .entry(X_RATELIMIT_REMAINING)
                .or_insert_with(|| HeaderValue::from(snapshot.remaining));
            headers
                .entry(X_RATELIMIT_RESET)
                .or_insert_with(|| HeaderValue::from(snapshot.reset_secs));
        }
    }
}

fn sf_integer(n: u64) -> sfv::Integer {
    // Clamped to the 15 digits a structured field allows; within them the conversion
    // cannot fail.
    sfv::Integer::try_from(n.min(MAX_SF_INTEGER)).unwrap_or(sfv::Integer::MAX)
}

/// `"name";r=<remaining>;t=<seconds>`, written on the stack and copied once into the
/// header value: the one allocation of the allowed path's headers.
fn ratelimit_value(item: &str, snapshot: &Snapshot) -> Option<HeaderValue> {
    let mut buf = StackBuf::new();
    buf.push(item.as_bytes())?;
    buf.push(b";r=")?;
    buf.push_decimal(snapshot.remaining.min(MAX_SF_INTEGER))?;
    buf.push(b";t=")?;
    buf.push_decimal(snapshot.wait_secs.min(MAX_SF_INTEGER))?;
    HeaderValue::from_bytes(buf.as_bytes()).ok()
}

/// A header value under construction. 128 bytes hold the longest `RateLimit` item: a
/// 64-byte name in quotes and two 15-digit integers.
struct StackBuf {
    bytes: [u8; 128],
    len: usize,
}

impl StackBuf {
    fn new() -> Self {
        Self {
            bytes: [0; 128],
            len: 0,
        }
    }

    /// Appends `s`, or `None` if it does not fit.
    fn push(&mut self, s: &[u8]) -> Option<()> {
        let end = self.len.checked_add(s.len())?;
        self.bytes.get_mut(self.len..end)?.copy_from_slice(s);
        self.len = end;
        Some(())
    }

    fn push_decimal(&mut self, mut n: u64) -> Option<()> {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[start..])
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policies() -> Vec<Policy> {
        vec![
            Policy::fixed_window("default", 5, Duration::from_secs(10)).unwrap(),
            Policy::token_bucket("burst", 20, 10, Duration::from_millis(1500)).unwrap(),
        ]
    }

    #[test]
    fn policy_list_is_a_structured_list_with_windows_rounded_up() {
        let headers = PolicyHeaders::new(&policies());
        let list = headers.policy_list.as_ref().unwrap().to_str().unwrap();
        // The token bucket refills from empty in 2 periods of 1.5 s: 3 s.
        assert_eq!(list, r#""default";q=5;w=10, "burst";q=20;w=3"#);
        let parsed: sfv::List = sfv::Parser::new(list).parse().unwrap();
        assert_eq!(parsed.len(), 2);
    }

    #[test]
    fn ratelimit_value_parses_as_a_structured_list() {
        let snapshot = Snapshot {
            index: 0,
            limit: 5,
            remaining: 0,
            reset_secs: 9,
            wait_secs: 7,
        };
        let value = ratelimit_value("\"default\"", &snapshot).unwrap();
        assert_eq!(value, "\"default\";r=0;t=7");
        let parsed: sfv::List = sfv::Parser::new(value.as_bytes()).parse().unwrap();
        assert_eq!(parsed.len(), 1);
    }

    #[test]
    fn huge_numbers_are_clamped_to_fifteen_digits() {
        let snapshot = Snapshot {
            index: 0,
            limit: 5,
            remaining: u64::MAX,
            reset_secs: 0,
            wait_secs: u64::MAX,
        };
        let value = ratelimit_value("\"x\"", &snapshot).unwrap();
        assert_eq!(value, "\"x\";r=999999999999999;t=999999999999999");
        assert!(sfv::Parser::new(value.as_bytes())
            .parse::<sfv::List>()
            .is_ok());
    }

    #[test]
    fn decimals() {
        for n in [0u64, 7, 10, 1234567890, u64::MAX] {
            let mut buf = StackBuf::new();
            buf.push_decimal(n).unwrap();
            assert_eq!(std::str::from_utf8(buf.as_bytes()).unwrap(), n.to_string());
        }
    }

    #[test]
    fn an_overlong_value_is_left_out_not_truncated() {
        let mut buf = StackBuf::new();
        assert!(buf.push(&[b'a'; 128]).is_some());
        assert!(buf.push(b"b").is_none());
        let long_item = format!("\"{}\"", "n".repeat(200));
        let snapshot = Snapshot {
            index: 0,
            limit: 1,
            remaining: 0,
            reset_secs: 1,
            wait_secs: 1,
        };
        assert!(ratelimit_value(&long_item, &snapshot).is_none());
    }

    #[test]
    fn legacy_headers_keep_an_inner_limiters_values() {
        let headers = PolicyHeaders::new(&policies());
        let snapshot = Snapshot {
            index: 1,
            limit: 20,
            remaining: 3,
            reset_secs: 2,
            wait_secs: 2,
        };
        let mut map = HeaderMap::new();
        map.insert(X_RATELIMIT_REMAINING, HeaderValue::from_static("1"));
        headers.write(HeaderStyle::Both, &snapshot, &mut map);
        assert_eq!(map[X_RATELIMIT_LIMIT], "20");
        assert_eq!(map[X_RATELIMIT_REMAINING], "1");
        assert_eq!(map[X_RATELIMIT_RESET], "2");
        assert_eq!(map[RATELIMIT], "\"burst\";r=3;t=2");
        // Appended twice, the lists combine into one list of both.
        headers.write(HeaderStyle::Ietf, &snapshot, &mut map);
        assert_eq!(map.get_all(RATELIMIT).iter().count(), 2);
    }

    #[test]
    fn rounding() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
        assert_eq!(ceil_secs(u64::MAX), u64::MAX / 1000 + 1);
    }
}
