//! The layer's options and what a layer shares with the services it makes: below the
//! middleware, the service, its future and its answers, which all read them.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use crate::layer::aftercare::Refund;
use crate::layer::headers::HeaderStyle;
use crate::layer::plan::Plan;
use crate::layer::wait::{Room, Wait};

/// What the layer does when the store cannot decide (it failed or timed out). Never a
/// 429: that would blame the client for the server's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Let the request through unlimited and log a warning (at most one a second):
    /// availability over limits. The request still carries a [`Decision`](crate::Decision) in its
    /// extensions, of [`Origin::FailOpen`](crate::Origin::FailOpen), so handlers that
    /// extract it run as written; its response gets no rate-limit headers. A check
    /// the store shed because too many waited
    /// ([`StoreErrorKind::Overloaded`](crate::store::StoreErrorKind::Overloaded)) is
    /// answered 503 all the same: shedding load never lets requests through.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After: 1`: for limits that protect
    /// something that must not be overrun (a login form, a paid upstream).
    Closed,
}

/// What the layer does with a request over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OverLimit {
    /// Answer 429 with `Retry-After` (gRPC: `RESOURCE_EXHAUSTED`).
    #[default]
    Refuse,
    /// Let the request through with its denial: the handler finds a
    /// [`Decision`](crate::Decision) whose [`is_allowed`](crate::Decision::is_allowed) is
    /// `false` (with its `retry_after`) and can answer with less (a cached, smaller or
    /// slower answer). Nothing is consumed, so the limit still counts only what it
    /// admitted; the response carries the rate-limit headers as an allowed one does,
    /// never `Retry-After`. Counted as `redlimit_degraded_total` (feature `metrics`).
    Degrade,
    /// Hold the request until the limiter admits it, within [`Wait::max_wait`] of its
    /// denial; refuse (429, as [`OverLimit::Refuse`]) what cannot be admitted by then.
    ///
    /// The wait is [`Limiter::check_within`](crate::Limiter::check_within)'s loop, which code outside HTTP calls
    /// directly; the layer adds the bounds and the places below.
    ///
    /// The promise, per layer (its clones share it):
    ///
    /// - A denied request waits when its time comes within `max_wait` of its first
    ///   denial and fewer than [`Wait::per_subject`] requests of its subject (for that
    ///   limiter) and fewer than [`Wait::per_instance`] in all wait; the others get the
    ///   429 at once, their `Retry-After` never earlier than the denial's.
    /// - Its place is counted when it starts to wait: with `k` requests of its subject
    ///   already waiting, its time is when the limiter says their costs and its own
    ///   (`cost × (k+1)` when every request costs the same) would fit, from
    ///   [`Limiter::peek`](crate::Limiter::peek) of that total, not the first waiter's time. So waiting
    ///   requests neither all wake at once nor exceed the limit when they do. A total
    ///   that can never fit (above what a policy admits at once), or a time past
    ///   `max_wait`, is refused at once.
    /// - At its time it is checked for real: admitted, the inner service runs with that
    ///   [`Decision`](crate::Decision) in the extensions; denied again (another instance
    ///   took the room), it takes its place again behind the others waiting if its new
    ///   time is still within its deadline (first denial + `max_wait`), else 429 with
    ///   that denial. The store decides every admission: never one past the limit.
    /// - While it waits it holds nothing of the inner service: the service
    ///   `poll_ready` readied is dropped when it starts to wait, and a clone of it is
    ///   readied only once the request is admitted, then called.
    /// - A store failure while it waits takes the [`FailureMode`] path exactly as a
    ///   first check's would (never a 429); a gRPC request waits the same way.
    /// - It sleeps on Tokio's timer (`tokio::time`: paused time in tests moves it).
    ///   Outside a Tokio runtime nothing can wait: the request is refused (429). A
    ///   response future dropped while it waits (the client left) frees its place at
    ///   once.
    ///
    /// A waiting request costs the store a peek when others of its subject wait ahead
    /// of it (none when it is the first), and a check at each of its times (one, unless
    /// another instance takes the room). Counted as `redlimit_waited_total` by outcome
    /// (feature `metrics`). Needs a store with admin operations (both stores have them).
    Wait(Wait),
}

/// How the layer's own answers (429, 503, key rejections) word their bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyStyle {
    /// A short `text/plain` sentence, e.g. `Too Many Requests: rate limit 'api'
    /// exceeded; retry after 3 s`.
    #[default]
    PlainText,
    /// `application/problem+json` (RFC 9457) with `type`, `title`, `status`, `detail`
    /// and, for 429 and 503, `retry_after` in seconds: for API clients that parse errors.
    ProblemJson,
}

/// What a layer and every service made of it share, behind one `Arc`: cloning either,
/// and [`Layer::layer`], allocate nothing (axum layers a handler's route again for
/// each request it serves without state).
pub(crate) struct Shared<S, P: Plan<S>> {
    /// In an `Arc` of its own so that configuring a cloned layer copies its options,
    /// not its plan: neither the store nor the key extractor needs `Clone`.
    pub(crate) plan: Arc<P>,
    pub(crate) config: Config,
    /// When to give back an allowed request's cost ([`RateLimitLayer::refund_on`]).
    pub(crate) refund: Option<Refund<S>>,
    /// The places of the requests that wait, when over-limit requests wait
    /// ([`OverLimit::Wait`], whose settings are the config's).
    pub(crate) room: Option<Arc<Room>>,
}

/// The layer's options, with the headers that depend only on the policies precomputed.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) header_style: HeaderStyle,
    pub(crate) headers_on_allowed: bool,
    pub(crate) body_style: BodyStyle,
    /// The status of a denial by a calendar quota (429 unless set).
    pub(crate) quota_status: http::StatusCode,
    pub(crate) failure_mode: FailureMode,
    pub(crate) over_limit: OverLimit,
    pub(crate) cost: Cost,
    /// Whether the cost is a reservation settled on the reported actual.
    pub(crate) settles: bool,
}

/// What one request costs.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u32),
    PerRequest(Arc<dyn Fn(&Parts) -> u32 + Send + Sync>),
}

impl Cost {
    pub(crate) fn of(&self, parts: &Parts) -> u32 {
        match self {
            Cost::Fixed(cost) => *cost,
            Cost::PerRequest(f) => f(parts),
        }
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::Fixed(cost) => f.debug_tuple("Fixed").field(cost).finish(),
            Cost::PerRequest(_) => f.write_str("PerRequest(..)"),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("header_style", &self.header_style)
            .field("headers_on_allowed", &self.headers_on_allowed)
            .field("body_style", &self.body_style)
            .field("quota_status", &self.quota_status)
            .field("failure_mode", &self.failure_mode)
            .field("over_limit", &self.over_limit)
            .field("cost", &self.cost)
            .field("settles", &self.settles)
            .finish_non_exhaustive()
    }
}

// By hand: the plan is in an `Arc`, so neither the store nor the extractor needs `Clone`.
impl<S, P: Plan<S>> Clone for Shared<S, P> {
    fn clone(&self) -> Self {
        Self {
            plan: Arc::clone(&self.plan),
            config: self.config.clone(),
            refund: self.refund.clone(),
            room: self.room.clone(),
        }
    }
}
