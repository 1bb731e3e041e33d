//! Logs and metrics of decisions, in one place.
//!
//! Decisions are `tracing` events at debug level (so is a request an
//! [`Extension`](crate::key::Extension) key found no value in, naming its type), requests a shadow policy would have
//! denied at info (the point of shadow mode is to read them), store failures at warn, at
//! most one line a second per kind of failure (with the count of those left out), so an
//! outage under load does not flood the logs.
//! With the
//! `metrics` feature, counters and a histogram go through the `metrics` facade, so any
//! exporter (Prometheus, StatsD) the application installs receives them:
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `redlimit_decisions_total` | counter | `outcome` (allowed, denied), `origin` (store, block_cache, fallback), `policy` |
//! | `redlimit_store_errors_total` | counter | `kind` (timeout, unavailable, protocol, overloaded), `handled` (fallback or not) |
//! | `redlimit_shadow_denials_total` | counter | `policy` (the shadow policy that would have denied) |
//! | `redlimit_refused_costs_total` | counter | `reason` (zero, too_high): requests the layer refused because no policy can take their cost |
//! | `redlimit_refunds_total` | counter | `outcome` (done, failed): refunds the layer made for [`refund_on`](crate::RateLimitLayer::refund_on) |
//! | `redlimit_degraded_total` | counter | `policy` (the one that denied): requests over their limit the layer let through for a lesser answer ([`OverLimit::Degrade`](crate::layer::OverLimit::Degrade)) |
//! | `redlimit_waited_total` | counter | `policy` (the one that first denied), `outcome` (admitted, refused, failed, cancelled): requests over their limit on a layer that waits ([`OverLimit::Wait`](crate::layer::OverLimit::Wait)), once each |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use crate::decision::Decision;
use crate::error::Error;
use crate::error::{StoreError, StoreErrorKind};

/// Cheap when nobody listens (the common case on a hot path): the same level check
/// `debug!` makes first, inline, before any call.
#[inline]
pub(crate) fn decided(decision: &Decision) {
    if cfg!(feature = "metrics")
        || decision.would_deny()
        || tracing::level_enabled!(tracing::Level::DEBUG)
    {
        report_decision(decision);
    }
}

fn report_decision(decision: &Decision) {
    tracing::debug!(
        allowed = decision.is_allowed(),
        policy = decision.policy().name(),
        remaining = decision.remaining(),
        retry_after_ms = decision.outcome().retry_after_ms,
        origin = decision.origin().as_str(),
        "rate-limit decision"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_decisions_total",
        "outcome" => if decision.is_allowed() { "allowed" } else { "denied" },
        "origin" => decision.origin().as_str(),
        "policy" => decision.policy().name().to_owned(),
    )
    .increment(1);
    if let Some(policy) = decision.shadow_denied_by() {
        shadow_denied(decision, policy);
    }
}

/// An allowed request that a shadow policy would have denied.
fn shadow_denied(decision: &Decision, policy: &str) {
    tracing::info!(
        policy,
        origin = decision.origin().as_str(),
        "rate-limit shadow policy would have denied"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_shadow_denials_total",
        "policy" => policy.to_owned(),
    )
    .increment(1);
}

/// A store call failed. Logged at warn (at most a line a second) only when the fallback
/// hid it from the caller;
/// otherwise the caller gets the error and reports it (the layer does, per its
/// failure mode), so logging it here too would double every line of an outage.
pub(crate) fn store_failed(error: &StoreError, handled_by_fallback: bool) {
    if handled_by_fallback {
        // At most a line a second: an outage under load fails every request.
        static FALLBACK: LogThrottle = LogThrottle::new();
        if let Some(suppressed) = FALLBACK.admit(uptime_ms()) {
            tracing::warn!(%error, suppressed, "rate-limit store failed; decided by the local fallback");
        }
    } else {
        tracing::debug!(%error, "rate-limit store failed");
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_store_errors_total",
        "kind" => kind_name(error.kind()),
        "handled" => if handled_by_fallback { "fallback" } else { "no" },
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind_name(error.kind());
}

fn kind_name(kind: StoreErrorKind) -> &'static str {
    match kind {
        StoreErrorKind::Timeout => "timeout",
        StoreErrorKind::Unavailable => "unavailable",
        StoreErrorKind::Protocol => "protocol",
        StoreErrorKind::Overloaded => "overloaded",
    }
}

/// An attempt to connect to Redis failed: at warn, a line a second at most per store
/// (`throttle` is its own; with the count left out), naming where it connects.
#[cfg(feature = "redis")]
pub(crate) fn redis_unreachable(
    throttle: &LogThrottle,
    address: &str,
    error: &str,
    retry_in: std::time::Duration,
) {
    if let Some(suppressed) = throttle.admit(uptime_ms()) {
        tracing::warn!(
            address,
            %error,
            ?retry_in,
            suppressed,
            "cannot connect to Redis at {address}; its checks fail until it answers"
        );
    }
}

/// Redis answered after calls (or attempts to connect) failed: one line at info.
#[cfg(feature = "redis")]
pub(crate) fn redis_answers_again(address: &str, failing_for: std::time::Duration) {
    tracing::info!(
        address,
        failing_ms = u64::try_from(failing_for.as_millis()).unwrap_or(u64::MAX),
        "Redis at {address} answers again"
    );
}

/// The units each policy has left after a refund or a charge (an in-flight one's slots,
/// which neither changes), from its answer: a peek of `peeked` units, whose `remaining`
/// counts what they would take as taken when it would admit them.
pub(crate) struct UnitsLeft<'a> {
    pub(crate) answer: &'a Decision,
    pub(crate) peeked: u64,
}

impl std::fmt::Display for UnitsLeft<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcomes = self
            .answer
            .each_policy()
            .unwrap_or(std::slice::from_ref(self.answer.outcome()));
        let taken = if self.answer.is_allowed() {
            self.peeked
        } else {
            0
        };
        let mut first = true;
        for (policy, outcome) in self.answer.policies().iter().zip(outcomes) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            let left = (outcome.remaining)
                .saturating_add(policy.units_taken(taken).min(taken))
                .min(outcome.limit);
            write!(f, "{}={left}", policy.name())?;
        }
        Ok(())
    }
}

/// The layer gave back a request's cost (`refund_on`), `cost` units. A failed refund
/// only costs the client budget, so it is a warning, not an error.
pub(crate) fn layer_refunded(result: &Result<Option<Decision>, Error>, cost: u64) {
    if matches!(result, Ok(None)) {
        // Nothing to give back: the cost was taken nowhere (no fallback any more).
        return;
    }
    match result {
        Ok(None) => {}
        Ok(Some(answer)) => tracing::debug!(
            remaining = %UnitsLeft { answer, peeked: cost },
            "rate-limit cost refunded"
        ),
        Err(error) => tracing::warn!(%error, "rate-limit refund failed"),
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_refunds_total",
        "outcome" => if result.is_ok() { "done" } else { "failed" },
    )
    .increment(1);
}

/// A reservation settled on its reported cost: `refunded` units given back when less
/// was used than reserved, else the excess charged (`None`).
pub(crate) fn layer_settled(result: &Result<Option<Decision>, Error>, refunded: Option<u64>) {
    let direction = if refunded.is_some() {
        "refund"
    } else {
        "charge"
    };
    if matches!(result, Ok(None)) {
        return;
    }
    match result {
        Ok(None) => {}
        // A refund answers as a peek of what it gave back, a charge as a peek of 1.
        Ok(Some(answer)) => tracing::debug!(
            remaining = %UnitsLeft { answer, peeked: refunded.unwrap_or(1) },
            direction,
            "rate-limit reservation settled"
        ),
        Err(error) => tracing::warn!(%error, direction, "rate-limit settlement failed"),
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_settlements_total",
        "direction" => direction,
        "outcome" => if result.is_ok() { "done" } else { "failed" },
    )
    .increment(1);
}

/// The store could not decide a request the layer checked: the operator's concern
/// (warn, at most a line a second), never the client's fault. `let_through` says
/// whether the request passed (fail open) or was answered 503.
pub(crate) fn layer_failed(error: &StoreError, let_through: bool) {
    static STORE: LogThrottle = LogThrottle::new();
    let action = if let_through {
        "letting the request through"
    } else {
        "answering 503"
    };
    if let Some(suppressed) = STORE.admit(uptime_ms()) {
        tracing::warn!(%error, kind = ?error.kind(), suppressed, "rate-limit store failed; {action}");
    }
}

/// A request had no `extension` (the type's name) for an `Extension` key, and was
/// answered 401. At debug: a client that is not signed in is no news, but when every
/// request is answered so, this line names what the key looked for (the layer that
/// inserts it then runs inside the rate-limit layer instead of outside it).
pub(crate) fn extension_missing(extension: &'static str) {
    tracing::debug!(
        extension,
        "rate-limit key: the request has no {extension} extension; answered 401 (the layer that inserts it must run before the rate-limit layer)"
    );
}

/// A request over its limit passed with its denial, for the handler to answer with less
/// (`OverLimit::Degrade`): a debug line and a counter, as for any decision.
pub(crate) fn degraded(decision: &Decision) {
    tracing::debug!(
        policy = decision.denied_by().unwrap_or_default(),
        "rate-limit exceeded; passed on for a degraded answer"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_degraded_total",
        "policy" => decision.denied_by().unwrap_or_default().to_owned(),
    )
    .increment(1);
}

/// A request over its limit on a layer that waits (`OverLimit::Wait`) came to
/// `outcome`: admitted at its time, refused (at once or at its deadline), decided by the
/// failure mode (the store failed while it waited), or cancelled (its client left).
pub(crate) fn waited(denial: &Decision, outcome: WaitOutcome) {
    tracing::debug!(
        policy = denial.policy().name(),
        outcome = outcome.as_str(),
        retry_after_ms = denial.outcome().retry_after_ms,
        "rate-limit exceeded; waited"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_waited_total",
        "policy" => denial.policy().name().to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(1);
}

/// How a wait for the limiter ended ([`Limiter::check_within`](crate::Limiter::check_within)
/// and the layer's `OverLimit::Wait`), for the logs and `redlimit_waited_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    /// Admitted at its time.
    Admitted,
    /// Refused: its time beyond its deadline, no place free, no runtime to wait on.
    Refused,
    /// The store failed while it waited.
    Failed,
    /// Dropped while it waited (the client left).
    Cancelled,
}

impl WaitOutcome {
    const fn as_str(self) -> &'static str {
        match self {
            WaitOutcome::Admitted => "admitted",
            WaitOutcome::Refused => "refused",
            WaitOutcome::Failed => "failed",
            WaitOutcome::Cancelled => "cancelled",
        }
    }
}

/// A request whose cost no policy can take was refused: the client's input (or a cost
/// function's bug), so a debug line and a counter, never a warning per request.
pub(crate) fn impossible_cost(error: &Error) {
    tracing::debug!(%error, "rate-limit cost refused");
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_refused_costs_total",
        "reason" => if matches!(error, Error::ZeroCost) { "zero" } else { "too_high" },
    )
    .increment(1);
}

/// `ClientIp` found no peer address: the server was set up without connect info, so
/// every such request fails alike; a line a second (with the count left out) says so.
pub(crate) fn no_peer_address(message: &str) {
    static NO_PEER: LogThrottle = LogThrottle::new();
    if let Some(suppressed) = NO_PEER.admit(uptime_ms()) {
        tracing::warn!(suppressed, "rate-limit key: answering 403: {message}");
    }
}

/// Milliseconds since the first call, for the log throttles.
fn uptime_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// Lets one event a second through, and counts the others.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    /// When the next event may be logged (ms on `uptime_ms`'s clock).
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    const INTERVAL_MS: u64 = 1_000;

    pub(crate) const fn new() -> Self {
        Self {
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(events left out since the last one logged)` when this one is to be logged.
    fn admit(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let claimed = now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms + Self::INTERVAL_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if claimed {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LogThrottle, UnitsLeft};
    use crate::{Limiter, MemoryStore, Policy};
    use std::time::Duration;

    /// The gateway's shape: a token budget beside an in-flight limit, 500 reserved.
    #[tokio::test]
    async fn a_settlement_says_what_each_budget_has_left() {
        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::sliding_window("tokens", 10_000, Duration::from_secs(60)).unwrap())
            .policy(Policy::in_flight("in_flight", 4, Duration::from_secs(30)).unwrap())
            .build()
            .unwrap();
        let checked = limiter.check("k", 500).await.unwrap();
        let refunded = limiter.refund("k", 200).await.unwrap();
        let left = UnitsLeft {
            answer: &refunded,
            peeked: 200,
        };
        assert_eq!(left.to_string(), "tokens=9700, in_flight=3");
        let charged = limiter
            .charge_from(checked.origin(), "k".into(), 300)
            .await
            .unwrap()
            .unwrap();
        let left = UnitsLeft {
            answer: &charged,
            peeked: 1,
        };
        assert_eq!(left.to_string(), "tokens=9400, in_flight=3");
        // Every slot taken: the answer denies, and takes nothing.
        for _ in 0..3 {
            limiter.check("k", 1).await.unwrap();
        }
        let refunded = limiter.refund("k", 100).await.unwrap();
        assert!(!refunded.is_allowed());
        let left = UnitsLeft {
            answer: &refunded,
            peeked: 100,
        };
        assert_eq!(left.to_string(), "tokens=9497, in_flight=0");
    }

    #[test]
    fn one_line_a_second_with_the_count_of_those_left_out() {
        let throttle = LogThrottle::new();
        assert_eq!(throttle.admit(5), Some(0));
        for now in [5, 6, 500, 1_004] {
            assert_eq!(throttle.admit(now), None, "{now}");
        }
        assert_eq!(throttle.admit(1_005), Some(4));
        assert_eq!(throttle.admit(1_006), None);
        // A quiet spell: the next failure is logged at once.
        assert_eq!(throttle.admit(60_000), Some(1));
        assert_eq!(throttle.admit(60_001), None);
    }
}
