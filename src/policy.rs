//! Policies: an algorithm, its numbers and a name, valid by construction.
//!
//! ```
//! use redlimit::Policy;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), redlimit::PolicyError> {
//! // 100 requests per minute, estimated over a sliding window: the recommended default.
//! let default = Policy::sliding_window("default", 100, Duration::from_secs(60))?;
//! // Bursts of 20, refilled at 10 per second.
//! let api = Policy::token_bucket("api", 20, 10, Duration::from_secs(1))?;
//! assert_eq!(api.max_cost(), 20);
//! assert!(Policy::fixed_window("bad", 0, Duration::from_secs(1)).is_err());
//! # Ok(()) }
//! ```

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::error::debug_as_display;

/// Largest product of limit and window (in ms) or of capacity and emission interval (in
/// µs): the Lua side computes in doubles, exact only below 2^53.
const MAX_EXACT: u64 = 1 << 53;
/// The sliding log keeps one stamp per admitted unit; past this a sorted set or a
/// sliding window counter is the better tool.
pub(crate) const MAX_SLIDING_LOG_LIMIT: u32 = 100_000;
/// Longest policy name: it travels in every response header and Redis key.
pub(crate) const MAX_NAME_LEN: usize = 64;
/// Longest window and token-bucket fill time: 3,653 days. A bucket stores its arrival
/// time in µs since the epoch, up to two fill times ahead, and Lua's doubles are exact
/// only to 2^53 µs (285 years): ten years keeps every stored time exact for centuries.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(3_653 * 86_400);

/// The six algorithms: five that count units over time ([`Algorithm::RATES`]) and
/// requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// One counter per window aligned to the epoch. Fastest and smallest; lets up to
    /// twice the limit through across a window boundary.
    FixedWindow,
    /// The previous and current windows' counters, the previous weighted by how much of
    /// it still overlaps the sliding window. About 2% over at a boundary; the default.
    SlidingWindow,
    /// A token bucket, kept as one theoretical arrival time (GCRA): bursts up to the
    /// capacity, sustained rate equal to the refill rate.
    TokenBucket,
    /// The admitted requests' timestamps: exact, never more than the limit in any
    /// window, at a few bytes per admitted request.
    SlidingLog,
    /// Requests running at once: a slot per admitted request, held until its response
    /// ends, each instance's slots freeing themselves a slot lifetime after the
    /// instance stops renewing them ([`Policy::in_flight`]).
    InFlight,
    /// A quota of a calendar period (a day, a week or a month in a time zone), reset
    /// at the period's start ([`Policy::calendar`], feature `calendar`).
    Calendar,
}

impl Algorithm {
    /// A short stable name, used in keys, metrics and tables.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::InFlight => "in_flight",
            Algorithm::Calendar => "calendar",
        }
    }

    /// All six: the four rates, fastest to slowest, the one of requests at once, then
    /// the calendar quota.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
        Algorithm::InFlight,
        Algorithm::Calendar,
    ];

    /// The algorithms that count units over time: all but [`Algorithm::InFlight`].
    pub const RATES: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
        Algorithm::Calendar,
    ];
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a policy could not be built.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The name is empty, too long or has characters outside `[A-Za-z0-9_.-]`.
    #[error("policy name {0:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' or '-'")]
    BadName(String),
    /// A limit or capacity of zero admits nothing.
    #[error("policy {0:?}: the limit must be at least 1")]
    ZeroLimit(String),
    /// A window (or refill period) under one millisecond.
    #[error("policy {0:?}: the window must be at least 1 ms")]
    WindowTooShort(String),
    /// The refill amount of a token bucket is zero.
    #[error("policy {0:?}: the refill amount must be at least 1")]
    ZeroRefill(String),
    /// A scope's name is empty, too long or has characters outside `[A-Za-z0-9_.-]`.
    #[error("scope name {0:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' or '-'")]
    BadScope(String),
    /// Numbers too large to compute exactly: limit x window over 2^53, a window or fill
    /// time over [`Policy::MAX_WINDOW`], a refill faster than a token per µs.
    #[error("policy {0:?}: {1}")]
    OutOfRange(String, &'static str),
    /// A calendar quota's time zone is not in the time zone database.
    #[error("policy {0:?}: time zone {1:?} is not in the time zone database (an IANA name such as \"Europe/Paris\" or \"UTC\")")]
    UnknownTimeZone(String, String),
    /// A calendar quota's anchor day is outside its period's range.
    #[error("policy {0:?}: {1}")]
    BadAnchor(String, &'static str),
}

debug_as_display!(PolicyError);

/// What a policy counts: the request's cost (the default), or requests, one each
/// whatever they cost.
///
/// Requests per minute beside tokens per minute, in one limiter: the tokens policy
/// counts the cost (`cost_fn`, reserved and settled), the requests policy one per
/// request. A refund or a settlement gives back or charges cost units only: a request
/// that ran stays counted.
///
/// ```
/// use redlimit::{Policy, Unit};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), redlimit::PolicyError> {
/// let rpm = Policy::fixed_window("rpm", 60, Duration::from_secs(60))?.counting(Unit::Requests);
/// assert_eq!(rpm.unit(), Unit::Requests);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Unit {
    /// The cost each check asks for (1 unless a cost is given).
    #[default]
    Cost,
    /// One per request, whatever its cost.
    Requests,
}

/// Whose counter a policy keeps: the subject a request is checked for (its key, the
/// default), another subject of the same request by name (its org, team, tenant), or
/// one counter shared by every request.
///
/// A limiter's policies may count different scopes; a check decides them all, all
/// or nothing, in one store call ([`Subject::within`](crate::Subject::within) gives a
/// check its named subjects; the layer's
/// key extractor's [`within`](crate::key::KeyExtractorExt::within) gives them).
///
/// ```
/// use redlimit::{Policy, Scope};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), redlimit::PolicyError> {
/// let minute = Duration::from_secs(60);
/// let per_org = Policy::sliding_window("org", 1000, minute)?.per(Scope::named("org")?);
/// let everyone = Policy::fixed_window("all", 100_000, minute)?.per(Scope::global());
/// assert_eq!(per_org.scope().name(), Some("org"));
/// assert!(everyone.scope().is_global());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Scope(ScopeKind);

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
enum ScopeKind {
    #[default]
    Key,
    Named(Arc<str>),
    Global,
}

impl Scope {
    /// The subject the request is checked for: the default.
    pub fn key() -> Self {
        Self(ScopeKind::Key)
    }

    /// Another subject of the request, by name (`"org"`): 1 to 64 characters of
    /// `[A-Za-z0-9_.-]`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::BadScope`] for any other name.
    pub fn named(name: impl Into<String>) -> Result<Self, PolicyError> {
        let name = name.into();
        if is_plain_name(&name) {
            Ok(Self(ScopeKind::Named(name.into())))
        } else {
            Err(PolicyError::BadScope(name))
        }
    }

    /// One counter for every request.
    pub fn global() -> Self {
        Self(ScopeKind::Global)
    }

    /// The name of a named scope.
    pub fn name(&self) -> Option<&str> {
        match &self.0 {
            ScopeKind::Named(name) => Some(name),
            _ => None,
        }
    }

    /// Whether this is the request's key (the default).
    pub fn is_key(&self) -> bool {
        self.0 == ScopeKind::Key
    }

    /// Whether every request shares this counter.
    pub fn is_global(&self) -> bool {
        self.0 == ScopeKind::Global
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ScopeKind::Key => f.write_str("key"),
            ScopeKind::Named(name) => f.write_str(name),
            ScopeKind::Global => f.write_str("global"),
        }
    }
}

/// The calendar period a [`Policy::calendar`] quota counts: each starts at 00:00 local
/// time on its anchor day, so a day that changes clocks is 23 or 25 hours long.
#[cfg(feature = "calendar")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Period {
    /// From each midnight to the next (anchor day 1).
    Day,
    /// From the anchor weekday's midnight, seven days (anchor: ISO weekday, 1 = Monday
    /// to 7 = Sunday).
    Week,
    /// From the anchor day's midnight to the same day of the next month (anchor: day of
    /// the month, 1 to 28, so every month has it).
    Month,
}

#[cfg(feature = "calendar")]
impl Period {
    /// A short stable name, used in the fingerprint and in messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// [`Policy::window`] of a quota of this period: a day, 7 days, 31 days (the
    /// longest month; a period that changes clocks may be an hour longer).
    const fn nominal_ms(self) -> u64 {
        const DAY_MS: u64 = 86_400_000;
        match self {
            Period::Day => DAY_MS,
            Period::Week => 7 * DAY_MS,
            Period::Month => 31 * DAY_MS,
        }
    }
}

/// What a calendar quota counts in: its time zone (the name it was found by, as the
/// database spells it), its period and anchor day. The boundaries are computed by
/// `algorithm::calendar::period_at`.
#[cfg(feature = "calendar")]
#[derive(Debug)]
pub(crate) struct Calendar {
    pub(crate) zone: jiff::tz::TimeZone,
    pub(crate) zone_name: Box<str>,
    pub(crate) period: Period,
    pub(crate) anchor: u8,
}

/// Equal when they count the same periods: the zone by its name.
#[cfg(feature = "calendar")]
impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        (&self.zone_name, self.period, self.anchor)
            == (&other.zone_name, other.period, other.anchor)
    }
}

#[cfg(feature = "calendar")]
impl Eq for Calendar {}

/// A rate-limit policy: algorithm, limit, window and a name for headers and keys. Cheap
/// to clone; built only through the checked constructors, so exact in Rust and in Lua.
#[derive(Clone, Eq)]
pub struct Policy {
    name: Arc<str>,
    algorithm: Algorithm,
    /// Limit (window algorithms) or capacity (token bucket).
    limit: u64,
    /// Window length in ms; for the token bucket, the time to refill from empty.
    window_ms: u64,
    /// Token bucket only: microseconds per token.
    emission_us: u64,
    /// Decides, counts and shows in headers, but never denies.
    shadow: bool,
    /// What it counts: the cost, or requests.
    unit: Unit,
    /// Whose counter it keeps.
    scope: Scope,
    /// In-flight only: the instance whose slots this is, given by the limiter that
    /// checks the policy (0 until then). Not part of the fingerprint: every instance
    /// counts into the same state.
    holder: u64,
    /// Calendar quotas only: the zone, period and anchor day.
    #[cfg(feature = "calendar")]
    calendar: Option<Arc<Calendar>>,
}

/// Equal when configured alike: the holder a limiter gives an in-flight policy aside.
impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.algorithm == other.algorithm
            && self.limit == other.limit
            && self.window_ms == other.window_ms
            && self.emission_us == other.emission_us
            && self.shadow == other.shadow
            && self.unit == other.unit
            && self.scope == other.scope
            && self.calendar_key() == other.calendar_key()
    }
}

/// Hashes what identifies the state (its window or a token bucket's interval, name, algorithm, unit,
/// scope), not the limit nor the shadow flag: a policy whose limit changes, or that
/// is switched from shadow to enforced, keeps its state, in memory as in Redis.
impl Hash for Policy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.algorithm.hash(state);
        self.state_window().hash(state);
        self.unit.hash(state);
        self.scope.hash(state);
        // Calendar quotas only: every other policy hashes as it did.
        if let Some((zone, period, anchor)) = self.calendar_key() {
            zone.hash(state);
            period.hash(state);
            anchor.hash(state);
        }
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm)
            .field("limit", &self.limit)
            .field("window_ms", &self.window_ms)
            .field("shadow", &self.shadow)
            .field("unit", &self.unit)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// The largest limit of a sliding log: it keeps one stamp per admitted unit, and
    /// past this a sliding window counter is the better tool.
    pub const MAX_SLIDING_LOG_LIMIT: u32 = MAX_SLIDING_LOG_LIMIT;
    /// The longest policy name: it travels in every response header and Redis key.
    pub const MAX_NAME_LEN: usize = MAX_NAME_LEN;
    /// The longest window, and the longest fill time (capacity x refill interval) of a
    /// token bucket: ten years, so every time the Lua side stores stays exact.
    pub const MAX_WINDOW: Duration = MAX_WINDOW;
    /// At most `limit` per window aligned to the epoch (`floor(now / window)`).
    pub fn fixed_window(
        name: impl Into<String>,
        limit: u32,
        window: Duration,
    ) -> Result<Self, PolicyError> {
        Self::windowed(name.into(), Algorithm::FixedWindow, limit, window)
    }

    /// At most `limit` in the estimate `previous * (1 - elapsed / window) + current`.
    pub fn sliding_window(
        name: impl Into<String>,
        limit: u32,
        window: Duration,
    ) -> Result<Self, PolicyError> {
        Self::windowed(name.into(), Algorithm::SlidingWindow, limit, window)
    }

    /// Exactly at most `limit` in any window of length `window`.
    pub fn sliding_log(
        name: impl Into<String>,
        limit: u32,
        window: Duration,
    ) -> Result<Self, PolicyError> {
        let name = name.into();
        if limit > MAX_SLIDING_LOG_LIMIT {
            return Err(PolicyError::OutOfRange(
                name,
                "a sliding log holds at most 100000 stamps; use a sliding window for more",
            ));
        }
        Self::windowed(name, Algorithm::SlidingLog, limit, window)
    }

    /// At most `limit` requests of a subject running at once, across every instance
    /// that shares the store: the check takes a slot (whatever the request's cost),
    /// and the slot is given back when the response's body ends or is dropped (the
    /// layer does this; outside it, the [`Permit`](crate::Permit) that
    /// [`Limiter::hold`](crate::Limiter::hold) gives, dropped).
    ///
    /// `slot_ttl` bounds what a vanished instance (killed, partitioned away) can hold:
    /// each instance renews its slots every third of it while its requests run, so
    /// slots it can no longer renew free themselves within `slot_ttl` (plus one
    /// renewal interval) of its last renewal. Longer costs a crashed instance's
    /// subjects longer refusals; shorter costs more renewal calls (one per subject
    /// with requests running, per `slot_ttl / 3`). 30 s suits most services.
    ///
    /// A denial's wait is a hint, not a promise: a slot frees whenever a request
    /// ends, so a denied request is told to come back in a second (or when the
    /// oldest slot would free itself, if sooner), and the block cache never keeps
    /// such a denial.
    ///
    /// # Errors
    ///
    /// A bad name, a limit of 0, or a `slot_ttl` under 1 ms or over
    /// [`Policy::MAX_WINDOW`].
    pub fn in_flight(
        name: impl Into<String>,
        limit: u32,
        slot_ttl: Duration,
    ) -> Result<Self, PolicyError> {
        Self::windowed(name.into(), Algorithm::InFlight, limit, slot_ttl)
    }

    /// Bursts of up to `capacity`, refilled by `refill` tokens every `period`.
    ///
    /// The refill is continuous: one token every `period / refill`, to the microsecond.
    pub fn token_bucket(
        name: impl Into<String>,
        capacity: u32,
        refill: u32,
        period: Duration,
    ) -> Result<Self, PolicyError> {
        let name = checked_name(name.into())?;
        if capacity == 0 {
            return Err(PolicyError::ZeroLimit(name));
        }
        if refill == 0 {
            return Err(PolicyError::ZeroRefill(name));
        }
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        if period_us < 1_000 {
            return Err(PolicyError::WindowTooShort(name));
        }
        let emission_us = period_us / u64::from(refill);
        if emission_us == 0 {
            return Err(PolicyError::OutOfRange(
                name,
                "refill faster than one token per microsecond",
            ));
        }
        let tolerance_us = emission_us
            .checked_mul(u64::from(capacity))
            .filter(|t| *t <= max_window_us())
            .ok_or_else(|| {
                PolicyError::OutOfRange(
                    name.clone(),
                    "the fill time (capacity x refill interval) must be at most 10 years",
                )
            })?;
        Ok(Self {
            name: name.into(),
            algorithm: Algorithm::TokenBucket,
            limit: u64::from(capacity),
            window_ms: tolerance_us.div_ceil(1_000),
            emission_us,
            shadow: false,
            unit: Unit::Cost,
            scope: Scope::key(),
            holder: 0,
            #[cfg(feature = "calendar")]
            calendar: None,
        })
    }

    fn windowed(
        name: String,
        algorithm: Algorithm,
        limit: u32,
        window: Duration,
    ) -> Result<Self, PolicyError> {
        let name = checked_name(name)?;
        if limit == 0 {
            return Err(PolicyError::ZeroLimit(name));
        }
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        if window_ms == 0 {
            return Err(PolicyError::WindowTooShort(name));
        }
        if window > MAX_WINDOW {
            return Err(PolicyError::OutOfRange(
                name,
                "the window must be at most 10 years",
            ));
        }
        if u64::from(limit)
            .checked_mul(window_ms)
            .is_none_or(|p| p >= MAX_EXACT)
        {
            return Err(PolicyError::OutOfRange(
                name,
                "limit x window in ms must stay under 2^53",
            ));
        }
        Ok(Self {
            name: name.into(),
            algorithm,
            limit: u64::from(limit),
            window_ms,
            emission_us: 0,
            shadow: false,
            unit: Unit::Cost,
            scope: Scope::key(),
            holder: 0,
            #[cfg(feature = "calendar")]
            calendar: None,
        })
    }

    /// At most `limit` units per calendar period in `time_zone` (an IANA name such as
    /// `"America/New_York"`, or `"UTC"`), reset at the period's start: 00:00 local
    /// time on `anchor_day` (a [`Period::Month`]: the day of the month, 1 to 28; a
    /// [`Period::Week`]: the ISO weekday, 1 = Monday to 7 = Sunday; a [`Period::Day`]:
    /// 1). Where a clock change skips midnight, the period starts at the first instant
    /// after it. A denial's wait is the time to the period's end, and the layer can
    /// answer it with a status of its own
    /// ([`RateLimitLayer::quota_status`](crate::RateLimitLayer::quota_status)).
    ///
    /// Zones come from the system's time zone database, or the one built into the
    /// crate where the system has none.
    ///
    /// ```
    /// use redlimit::{Period, Policy};
    ///
    /// // 100,000 units a month, from the 15th, New York time.
    /// let monthly = Policy::calendar("monthly", 100_000, Period::Month, "America/New_York", 15)?;
    /// assert!(Policy::calendar("bad", 10, Period::Week, "America/New_York", 8).is_err());
    /// # Ok::<(), redlimit::PolicyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A bad name, a limit of 0, a zone the database does not know
    /// ([`PolicyError::UnknownTimeZone`]), an anchor day outside its period's range
    /// ([`PolicyError::BadAnchor`]).
    #[cfg(feature = "calendar")]
    pub fn calendar(
        name: impl Into<String>,
        limit: u32,
        period: Period,
        time_zone: &str,
        anchor_day: u8,
    ) -> Result<Self, PolicyError> {
        let name = checked_name(name.into())?;
        if limit == 0 {
            return Err(PolicyError::ZeroLimit(name));
        }
        let (most, why) = match period {
            Period::Day => (1, "a daily quota's anchor day must be 1"),
            Period::Week => (
                7,
                "a weekly quota's anchor day is an ISO weekday, 1 (Monday) to 7 (Sunday)",
            ),
            Period::Month => (
                28,
                "a monthly quota's anchor day must be 1 to 28 (a day every month has)",
            ),
        };
        if !(1..=most).contains(&anchor_day) {
            return Err(PolicyError::BadAnchor(name, why));
        }
        let zone = jiff::tz::db().get(time_zone).map_err(|_| {
            let shown: String = time_zone.chars().take(64).collect();
            PolicyError::UnknownTimeZone(name.clone(), shown)
        })?;
        let zone_name = zone.iana_name().unwrap_or(time_zone).into();
        Ok(Self {
            name: name.into(),
            algorithm: Algorithm::Calendar,
            limit: u64::from(limit),
            window_ms: period.nominal_ms(),
            emission_us: 0,
            shadow: false,
            unit: Unit::Cost,
            scope: Scope::key(),
            holder: 0,
            calendar: Some(Arc::new(Calendar {
                zone,
                zone_name,
                period,
                anchor: anchor_day,
            })),
        })
    }

    /// A calendar quota's period ([`Policy::calendar`]); `None` for the others.
    #[cfg(feature = "calendar")]
    pub fn period(&self) -> Option<Period> {
        self.calendar.as_ref().map(|c| c.period)
    }

    /// A calendar quota's time zone, as the database names it; `None` for the others.
    #[cfg(feature = "calendar")]
    pub fn time_zone(&self) -> Option<&str> {
        self.calendar.as_ref().map(|c| &*c.zone_name)
    }

    /// A calendar quota's zone, period and anchor.
    #[cfg(feature = "calendar")]
    pub(crate) fn calendar_spec(&self) -> Option<&Calendar> {
        self.calendar.as_deref()
    }

    /// What tells two calendar quotas apart beside the numbers: zone, period, anchor
    /// (`None` for other policies, and without the feature that makes them).
    pub(crate) fn calendar_key(&self) -> Option<(&str, &'static str, u8)> {
        #[cfg(feature = "calendar")]
        if let Some(c) = &self.calendar {
            return Some((&c.zone_name, c.period.as_str(), c.anchor));
        }
        None
    }

    /// Whether this policy is a calendar quota ([`Policy::calendar`]): its denial is
    /// a quota spent until the period ends, not a rate to slow down to.
    pub fn is_quota(&self) -> bool {
        self.algorithm == Algorithm::Calendar
    }

    /// The name used in `RateLimit-Policy` and in Redis keys.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which algorithm decides.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The limit, or the capacity of a token bucket.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window; for a token bucket, the time to refill from empty to full; for a
    /// calendar quota, its period's usual length (a day, 7 days, 31 days), the current
    /// period's being in the `RateLimit-Policy` header.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Token bucket only: microseconds between two tokens (0 for the others).
    pub fn emission_interval_us(&self) -> u64 {
        self.emission_us
    }

    /// The largest cost this policy can ever admit in one request (any, when it
    /// counts requests or requests in flight).
    pub fn max_cost(&self) -> u64 {
        if self.counts_requests() {
            return u64::MAX;
        }
        self.limit
    }

    /// The units a request of `cost` takes: its cost, or one of a policy that counts
    /// requests (one slot of an in-flight policy), whatever they cost.
    pub(crate) fn units_taken(&self, cost: u64) -> u64 {
        if self.counts_requests() {
            return 1;
        }
        cost
    }

    /// Whether a request takes one unit whatever it costs: an in-flight policy, or one
    /// [`counting`](Policy::counting) [`Unit::Requests`]. Refunds and charges of cost
    /// units leave such a policy alone.
    pub(crate) fn counts_requests(&self) -> bool {
        self.unit == Unit::Requests || self.algorithm == Algorithm::InFlight
    }

    /// The number besides the algorithm that gives a stored state its meaning: the
    /// window in ms, or a token bucket's emission interval in µs (its capacity, the
    /// limit, may change under the same state).
    pub(crate) fn state_window(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket => self.emission_us,
            _ => self.window_ms,
        }
    }

    /// This policy counting `unit` ([`Unit::Cost`] by default).
    pub fn counting(mut self, unit: Unit) -> Self {
        self.unit = unit;
        self
    }

    /// What this policy counts.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// This policy keeping a counter per `scope` ([`Scope::key`] by default).
    pub fn per(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Whose counter this policy keeps.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// This policy with another limit (a live override), everything else kept: the
    /// same state, read under the new limit. `None` when the limit cannot be computed
    /// exactly (see the constructors) or is 0.
    pub(crate) fn with_limit(&self, limit: u64) -> Option<Self> {
        let fits = limit >= 1
            && match self.algorithm {
                Algorithm::TokenBucket => limit
                    .checked_mul(self.emission_us)
                    .is_some_and(|t| t <= max_window_us()),
                Algorithm::SlidingLog => limit <= u64::from(MAX_SLIDING_LOG_LIMIT),
                _ => limit
                    .checked_mul(self.window_ms)
                    .is_some_and(|p| p < MAX_EXACT),
            }
            && limit <= u64::from(u32::MAX);
        fits.then(|| {
            let mut policy = self.clone();
            policy.limit = limit;
            if self.algorithm == Algorithm::TokenBucket {
                policy.window_ms = (limit * self.emission_us).div_ceil(1_000);
            }
            policy
        })
    }

    /// Whether this policy counts requests running now ([`Policy::in_flight`]).
    pub fn is_in_flight(&self) -> bool {
        self.algorithm == Algorithm::InFlight
    }

    /// This policy in shadow mode, to try a limit on real traffic: it decides, counts
    /// and appears in the headers, but never denies. A request it alone would deny is
    /// allowed, and the [`Decision`](crate::Decision) names it
    /// ([`would_deny`](crate::Decision::would_deny)); a log line and a counter record it.
    ///
    /// State: the enforced policies stay all or nothing among themselves; a shadow
    /// policy consumes exactly when it admits and every enforced policy admits, so its
    /// state is what enforcing it would have kept. Its Redis key is the one it has when
    /// enforced, so switching it on later keeps the state.
    ///
    /// An in-flight policy ([`Policy::in_flight`]) in shadow mode takes no slot for a
    /// request it would refuse, so it too counts what enforcing it would keep; it must
    /// be its limiter's only in-flight policy, or
    /// [`LimiterBuilder::build`](crate::LimiterBuilder::build) refuses the set
    /// ([`BuildError::ShadowInFlight`](crate::BuildError::ShadowInFlight)).
    pub fn shadow(self) -> Self {
        self.enforce(false)
    }

    /// Enforces this policy (`true`, the default) or only shadows it (`false`, see
    /// [`Policy::shadow`]).
    pub fn enforce(mut self, enforce: bool) -> Self {
        self.shadow = !enforce;
        self
    }

    /// Whether this policy is in shadow mode (decides but never denies).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// In-flight only: the instance whose slots this policy counts as its own.
    pub(crate) fn holder(&self) -> u64 {
        self.holder
    }

    /// This policy as `holder`'s (see [`Policy::holder`]); other policies unchanged.
    pub(crate) fn held_by(mut self, holder: u64) -> Self {
        if self.algorithm == Algorithm::InFlight {
            self.holder = holder & HOLDER_MASK;
        }
        self
    }
}

/// The bits of an in-flight holder's id: the Redis state keeps it in 6 bytes.
pub(crate) const HOLDER_MASK: u64 = (1 << 48) - 1;

/// [`MAX_WINDOW`] in microseconds.
const fn max_window_us() -> u64 {
    MAX_WINDOW.as_secs() * 1_000_000
}

/// 1 to [`MAX_NAME_LEN`] characters of `[A-Za-z0-9_.-]`: policy and scope names.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn checked_name(name: String) -> Result<String, PolicyError> {
    if is_plain_name(&name) {
        Ok(name)
    } else {
        Err(PolicyError::BadName(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_cannot_be_computed() {
        let s = Duration::from_secs(1);
        assert!(matches!(
            Policy::fixed_window("a", 0, s),
            Err(PolicyError::ZeroLimit(_))
        ));
        assert!(matches!(
            Policy::sliding_window("a", 1, Duration::from_micros(999)),
            Err(PolicyError::WindowTooShort(_))
        ));
        assert!(matches!(
            Policy::sliding_window("a b", 1, s),
            Err(PolicyError::BadName(_))
        ));
        assert!(matches!(
            Policy::sliding_window("", 1, s),
            Err(PolicyError::BadName(_))
        ));
        assert!(matches!(
            Policy::sliding_window("{x}", 1, s),
            Err(PolicyError::BadName(_))
        ));
        assert!(matches!(
            Policy::sliding_window("a", u32::MAX, Duration::from_secs(86_400 * 365)),
            Err(PolicyError::OutOfRange(..))
        ));
        assert!(matches!(
            Policy::sliding_log("a", MAX_SLIDING_LOG_LIMIT + 1, s),
            Err(PolicyError::OutOfRange(..))
        ));
        assert!(matches!(
            Policy::token_bucket("a", 1, 0, s),
            Err(PolicyError::ZeroRefill(_))
        ));
        assert!(matches!(
            Policy::token_bucket("a", 1, 2_000_000, s),
            Err(PolicyError::OutOfRange(..))
        ));
    }

    #[test]
    fn token_bucket_window_is_time_to_refill_from_empty() {
        let p = Policy::token_bucket("api", 10, 1, Duration::from_secs(1)).unwrap();
        assert_eq!(p.emission_interval_us(), 1_000_000);
        assert_eq!(p.window(), Duration::from_secs(10));
        assert_eq!(p.limit(), 10);
    }

    #[test]
    fn shadow_is_a_flag_that_keeps_the_fingerprint() {
        use std::collections::hash_map::DefaultHasher;
        let p = Policy::fixed_window("p", 3, Duration::from_secs(1)).unwrap();
        let hash = |p: &Policy| {
            let mut h = DefaultHasher::new();
            p.hash(&mut h);
            h.finish()
        };
        let s = p.clone().shadow();
        assert!(s.is_shadow() && !p.is_shadow());
        assert_ne!(s, p);
        assert_eq!(hash(&s), hash(&p));
        assert_eq!(s.enforce(true), p);
    }
}
