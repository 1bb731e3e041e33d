//! The rate-limit response headers: IETF structured fields, or the legacy `X-RateLimit-*`.
//!
//! [`HeaderStyle::Ietf`] follows draft-ietf-httpapi-ratelimit-headers (draft 10, the
//! current one): `RateLimit-Policy` lists every policy the limiter enforces,
//! `RateLimit` gives each one's units left (`r`) and seconds until more are free
//! (`t`), the binding one first. An in-flight policy counts requests at once: it has
//! no window, and says so with the draft's quota unit `concurrent-requests`.
//!
//! ```text
//! RateLimit-Policy: "burst";q=10;w=1, "hourly";q=1000;w=3600
//! RateLimit: "burst";r=0;t=1, "hourly";r=990;t=3599
//! Retry-After: 1
//! ```
//!
//! All numbers are whole seconds, rounded up: a client that waits `t` seconds never
//! comes back too early. Shadow policies are trials, never shown to clients: a
//! client must not slow down for a limit that does not hold.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use sfv::{KeyRef, ListSerializer, StringRef};

use std::sync::Arc;

use crate::algorithm::calendar;
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PolicyOutcome};
use crate::policy::Policy;

/// `RateLimit`: each policy's remaining quota and seconds until it frees up.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy`: every policy the limiter enforces, with its quota and window.
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
/// Small, so the response future can carry it across the inner call instead of the
/// whole [`Decision`] (which goes to the request's extensions): the other policies'
/// outcomes are shared, not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Every policy's outcome, when the limiter has more than one.
    each: Option<Arc<[PolicyOutcome]>>,
}

impl Snapshot {
    pub(crate) fn of(decision: &Decision) -> Self {
        let outcome = decision.outcome();
        Self {
            index: decision.policy_index(),
            limit: decision.limit(),
            remaining: decision.remaining(),
            reset_secs: ceil_secs(outcome.reset_after_ms),
            wait_secs: wait_secs(outcome),
            each: decision.each_outcomes(),
        }
    }
}

/// `t` of one policy's outcome: its retry-after when it denies, else its reset.
fn wait_secs(outcome: &PolicyOutcome) -> u64 {
    if outcome.allowed {
        ceil_secs(outcome.reset_after_ms)
    } else {
        ceil_secs(outcome.retry_after_ms).max(1)
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
    /// A limiter with a calendar quota: its policies, whose `RateLimit-Policy` is
    /// written for each response instead (the current period's length, in `w`).
    calendar: Option<Box<[Policy]>>,
    /// Per policy, in the limiter's order.
    policies: Box<[PolicyParts]>,
    /// The longest `RateLimit` value these policies can make.
    ratelimit_len: usize,
}

#[derive(Debug, Clone)]
struct PolicyParts {
    /// The start of the policy's `RateLimit` item: its name as a structured-field
    /// string, quotes included, then `;r=`; `None` for a policy the headers do not show
    /// (a shadow one).
    item: Option<Box<[u8]>>,
    /// `X-RateLimit-Limit`.
    limit: HeaderValue,
}

impl PolicyHeaders {
    pub(crate) fn new(policies: &[Policy]) -> Self {
        let parts: Box<[PolicyParts]> = policies
            .iter()
            .map(|policy| {
                let name = shown_name(policy);
                PolicyParts {
                    item: name.map(|name| {
                        let mut item = String::with_capacity(policy.name().len() + 5);
                        _ = sfv::ItemSerializer::with_buffer(&mut item).bare_item(name);
                        item.push_str(";r=");
                        item.into_bytes().into_boxed_slice()
                    }),
                    limit: HeaderValue::from(policy.limit()),
                }
            })
            .collect();
        let calendar = policies
            .iter()
            .any(Policy::is_quota)
            .then(|| policies.into());
        let ratelimit_len = parts
            .iter()
            .filter_map(|p| p.item.as_ref())
            .map(|item| item.len() + ITEM_REST_MAX)
            .sum();
        Self {
            policy_list: policy_list(policies, None),
            calendar,
            policies: parts,
            ratelimit_len,
        }
    }

    /// Adds only what the policies fix, `RateLimit-Policy` (for a request that was not
    /// counted, so has no `RateLimit` of its own).
    pub(crate) fn write_quota(&self, style: HeaderStyle, headers: &mut HeaderMap) {
        if !style.ietf() {
            return;
        }
        let list = match &self.calendar {
            Some(policies) => policy_list(policies, Some(SystemClock.now_ms())),
            None => self.policy_list.clone(),
        };
        if let Some(list) = list {
            headers.append(RATELIMIT_POLICY, list);
        }
    }

    /// Adds the headers of `style` for `snapshot` to `headers`.
    ///
    /// The structured fields are lists, so they are appended: an outer and an inner
    /// limiter both show. The legacy fields hold one number each (the binding
    /// policy's), so an existing value (from a limiter nearer the handler) is kept.
    pub(crate) fn write(&self, style: HeaderStyle, snapshot: &Snapshot, headers: &mut HeaderMap) {
        self.write_quota(style, headers);
        if style.ietf() {
            if let Some(value) = self.ratelimit_value(snapshot) {
                headers.append(RATELIMIT, value);
            }
        }
        let binding = self.policies.get(snapshot.index);
        // A shadow policy binds only when every policy is one: nothing is shown.
        if style.legacy() && binding.is_none_or(|p| p.item.is_some()) {
            let limit = match binding {
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

    /// `RateLimit`: `"name";r=<remaining>;t=<seconds>` for the binding policy, then for
    /// each other one shown, in the limiter's order. Written on the stack when it fits
    /// (one limiter's list nearly always does), else in a buffer as long as the longest
    /// list these policies make, and copied once into the value.
    fn ratelimit_value(&self, snapshot: &Snapshot) -> Option<HeaderValue> {
        if self.ratelimit_len <= INLINE_VALUE {
            let mut buf = [0u8; INLINE_VALUE];
            self.ratelimit_into(snapshot, &mut buf)
        } else {
            self.ratelimit_into(snapshot, &mut vec![0u8; self.ratelimit_len])
        }
    }

    /// [`ratelimit_value`](Self::ratelimit_value), written in `buf` first.
    fn ratelimit_into(&self, snapshot: &Snapshot, buf: &mut [u8]) -> Option<HeaderValue> {
        let mut out = Cursor { buf, at: 0 };
        if let Some(item) = self.shown(snapshot.index) {
            out.item(item, snapshot.remaining, snapshot.wait_secs);
        }
        for (i, outcome) in snapshot
            .each
            .iter()
            .flat_map(|each| each.iter().enumerate())
        {
            if i == snapshot.index {
                continue;
            }
            if let Some(item) = self.shown(i) {
                out.item(item, outcome.remaining, wait_secs(outcome));
            }
        }
        let written = out.written()?;
        (!written.is_empty())
            .then(|| HeaderValue::from_bytes(written).ok())
            .flatten()
    }

    /// The start of policy `i`'s `RateLimit` item, if the headers show it.
    fn shown(&self, i: usize) -> Option<&[u8]> {
        self.policies.get(i).and_then(|p| p.item.as_deref())
    }
}

/// The longest `RateLimit` value written on the stack.
const INLINE_VALUE: usize = 256;

/// The most an item adds after its start (`"name";r=`): the `, ` before it, the
/// remaining units, `;t=` and the seconds (15 digits each at most).
const ITEM_REST_MAX: usize = 2 + 15 + 3 + 15;

/// Where a `RateLimit` value is written: `buf` up to `at`. A write past the end of
/// `buf` (which its length rules out) spoils the value instead of panicking.
struct Cursor<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// Appends one item, after a `, ` when the list has one already: `start` (the
    /// name and `;r=`), the remaining units, `;t=` and the seconds.
    fn item(&mut self, start: &[u8], remaining: u64, wait_secs: u64) {
        if self.at > 0 {
            self.put(b", ");
        }
        self.put(start);
        self.decimal(remaining.min(MAX_SF_INTEGER));
        self.put(b";t=");
        self.decimal(wait_secs.min(MAX_SF_INTEGER));
    }

    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at.saturating_add(bytes.len());
        match self.buf.get_mut(self.at..end) {
            Some(place) => {
                place.copy_from_slice(bytes);
                self.at = end;
            }
            None => self.at = usize::MAX,
        }
    }

    /// `n` in decimal.
    #[inline]
    fn decimal(&mut self, n: u64) {
        self.put(itoa::Buffer::new().format(n).as_bytes());
    }

    /// What was written, unless a write went past the end.
    fn written(self) -> Option<&'a [u8]> {
        self.buf.get(..self.at)
    }
}

/// A policy's name as a structured-field string, if the headers show it. Policy names
/// are checked to `[A-Za-z0-9_.-]`, always a valid sf-string; a name that somehow is
/// not is left out of the headers rather than sent malformed (its entry stays, so
/// indices still match the limiter's). Shadow policies are not shown.
fn shown_name(policy: &Policy) -> Option<&StringRef> {
    StringRef::from_str(policy.name())
        .ok()
        .filter(|_| !policy.is_shadow())
}

/// `RateLimit-Policy` of `policies`; a calendar quota's `w` is the length of the
/// period `now_ms` is in (its usual length without a now).
fn policy_list(policies: &[Policy], now_ms: Option<u64>) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for policy in policies {
        let Some(name) = shown_name(policy) else {
            continue;
        };
        let item = list
            .bare_item(name)
            .parameter(KeyRef::constant("q"), sf_integer(policy.limit()));
        // Requests in flight have no window: their quota is requests at once.
        // (The serializer writes as it goes: what it returns needs no finish.)
        if policy.is_in_flight() {
            _ = item.parameter(
                KeyRef::constant("qu"),
                StringRef::constant("concurrent-requests"),
            );
        } else {
            let window_ms = match now_ms {
                Some(now) if policy.is_quota() => {
                    let (start, end) = calendar::period_at(policy, now);
                    end - start
                }
                _ => policy.window_ms(),
            };
            _ = item.parameter(KeyRef::constant("w"), sf_integer(ceil_secs(window_ms)));
        }
    }
    list.finish().and_then(|s| HeaderValue::try_from(s).ok())
}

fn sf_integer(n: u64) -> sfv::Integer {
    // Clamped to the 15 digits a structured field allows; within them the conversion
    // cannot fail.
    sfv::Integer::try_from(n.min(MAX_SF_INTEGER)).unwrap_or(sfv::Integer::MAX)
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

    fn outcome(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> PolicyOutcome {
        PolicyOutcome {
            allowed,
            limit: 5,
            remaining,
            reset_after_ms: reset_ms,
            retry_after_ms: retry_ms,
        }
    }

    fn snapshot(index: usize, remaining: u64, wait_secs: u64) -> Snapshot {
        Snapshot {
            index,
            limit: 5,
            remaining,
            reset_secs: wait_secs,
            wait_secs,
            each: None,
        }
    }

    #[cfg(feature = "calendar")]
    #[test]
    fn a_calendar_quota_s_window_is_its_current_period() {
        use crate::policy::Period;
        let p =
            Policy::calendar("monthly", 100_000, Period::Month, "America/New_York", 15).unwrap();
        // 2026-10-20 noon in New York: from 15 October to 15 November, 31 days and the
        // hour clocks go back.
        let list = policy_list(std::slice::from_ref(&p), Some(1_792_512_000_000)).unwrap();
        assert_eq!(list, r#""monthly";q=100000;w=2682000"#);
        // Its usual length without a now: 31 days.
        let list = policy_list(&[p], None).unwrap();
        assert_eq!(list, r#""monthly";q=100000;w=2678400"#);
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
    fn an_in_flight_policy_is_a_quota_of_concurrent_requests_and_shadows_are_not_shown() {
        let policies = [
            Policy::in_flight("slots", 4, Duration::from_secs(30)).unwrap(),
            Policy::fixed_window("trial", 1, Duration::from_secs(10))
                .unwrap()
                .shadow(),
            Policy::fixed_window("minute", 60, Duration::from_secs(60)).unwrap(),
        ];
        let headers = PolicyHeaders::new(&policies);
        let list = headers.policy_list.as_ref().unwrap().to_str().unwrap();
        assert_eq!(
            list,
            r#""slots";q=4;qu="concurrent-requests", "minute";q=60;w=60"#
        );
        let mut map = HeaderMap::new();
        let snap = Snapshot {
            each: Some(Arc::from(
                &[
                    outcome(true, 3, 30_000, 0),
                    outcome(false, 0, 9_000, 9_000),
                    outcome(true, 40, 31_500, 0),
                ][..],
            )),
            ..snapshot(0, 3, 30)
        };
        headers.write(HeaderStyle::Ietf, &snap, &mut map);
        // The shadow policy's denial is not the client's business.
        assert_eq!(map[RATELIMIT], r#""slots";r=3;t=30, "minute";r=40;t=32"#);
    }

    #[test]
    fn ratelimit_lists_every_policy_the_binding_one_first() {
        let headers = PolicyHeaders::new(&policies());
        let snap = Snapshot {
            each: Some(Arc::from(
                &[outcome(true, 4, 9_000, 0), outcome(false, 0, 2_500, 1_200)][..],
            )),
            ..snapshot(1, 0, 2)
        };
        let value = headers.ratelimit_value(&snap).unwrap();
        assert_eq!(value, r#""burst";r=0;t=2, "default";r=4;t=9"#);
        let parsed: sfv::List = sfv::Parser::new(value.as_bytes()).parse().unwrap();
        assert_eq!(parsed.len(), 2);
    }

    #[test]
    fn ratelimit_value_parses_as_a_structured_list() {
        let headers = PolicyHeaders::new(&policies());
        let value = headers.ratelimit_value(&snapshot(0, 0, 7)).unwrap();
        assert_eq!(value, "\"default\";r=0;t=7");
        let parsed: sfv::List = sfv::Parser::new(value.as_bytes()).parse().unwrap();
        assert_eq!(parsed.len(), 1);
    }

    #[test]
    fn huge_numbers_are_clamped_to_fifteen_digits() {
        let headers = PolicyHeaders::new(&policies());
        let snap = Snapshot {
            remaining: u64::MAX,
            wait_secs: u64::MAX,
            ..snapshot(0, 0, 0)
        };
        let value = headers.ratelimit_value(&snap).unwrap();
        assert_eq!(value, "\"default\";r=999999999999999;t=999999999999999");
        assert!(sfv::Parser::new(value.as_bytes())
            .parse::<sfv::List>()
            .is_ok());
    }

    #[test]
    fn decimals() {
        let mut ns = vec![0u64, 7, 10, 99, 100, 101, 1234567890, u64::MAX];
        ns.extend((0..20).map(|i| 10u64.pow(i)));
        ns.extend((1..20).map(|i| 10u64.pow(i) - 1));
        for n in ns {
            let mut buf = [0u8; 20];
            let mut out = Cursor {
                buf: &mut buf,
                at: 0,
            };
            out.decimal(n);
            let written = out.written().unwrap();
            assert_eq!(std::str::from_utf8(written).unwrap(), n.to_string());
        }
    }

    #[test]
    fn a_write_past_the_end_spoils_the_value_without_a_panic() {
        let mut buf = [0u8; 4];
        let mut out = Cursor {
            buf: &mut buf,
            at: 0,
        };
        out.decimal(12345);
        out.put(b"1");
        assert_eq!(out.written(), None);
        let mut buf = [0u8; 4];
        let mut out = Cursor {
            buf: &mut buf,
            at: 0,
        };
        out.put(b"\"a\"");
        out.put(b";r=");
        assert_eq!(out.written(), None);
    }

    #[test]
    fn many_long_names_make_one_whole_value() {
        let policies: Vec<Policy> = (0..8)
            .map(|i| {
                let name = format!("{i}{}", "n".repeat(63));
                Policy::fixed_window(&name, 5, Duration::from_secs(10)).unwrap()
            })
            .collect();
        let headers = PolicyHeaders::new(&policies);
        let each: Vec<PolicyOutcome> = (0..8).map(|_| outcome(true, 4, 1_000, 0)).collect();
        let snap = Snapshot {
            each: Some(Arc::from(each)),
            ..snapshot(3, 4, 1)
        };
        let value = headers.ratelimit_value(&snap).unwrap();
        let parsed: sfv::List = sfv::Parser::new(value.as_bytes()).parse().unwrap();
        assert_eq!(parsed.len(), 8);
    }

    #[test]
    fn legacy_headers_keep_an_inner_limiters_values() {
        let headers = PolicyHeaders::new(&policies());
        let snap = Snapshot {
            limit: 20,
            ..snapshot(1, 3, 2)
        };
        let mut map = HeaderMap::new();
        map.insert(X_RATELIMIT_REMAINING, HeaderValue::from_static("1"));
        headers.write(HeaderStyle::Both, &snap, &mut map);
        assert_eq!(map[X_RATELIMIT_LIMIT], "20");
        assert_eq!(map[X_RATELIMIT_REMAINING], "1");
        assert_eq!(map[X_RATELIMIT_RESET], "2");
        assert_eq!(map[RATELIMIT], "\"burst\";r=3;t=2");
        // Appended twice, the lists combine into one list of both.
        headers.write(HeaderStyle::Ietf, &snap, &mut map);
        assert_eq!(map.get_all(RATELIMIT).iter().count(), 2);
    }

    #[test]
    fn a_limiter_of_shadow_policies_shows_nothing() {
        let trial = Policy::fixed_window("trial", 1, Duration::from_secs(10))
            .unwrap()
            .shadow();
        let headers = PolicyHeaders::new(&[trial]);
        let mut map = HeaderMap::new();
        headers.write(HeaderStyle::Both, &snapshot(0, 0, 9), &mut map);
        assert!(map.is_empty(), "{map:?}");
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
