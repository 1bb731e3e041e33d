//! Logs and metrics of decisions, in one place.
//!
//! Decisions are `tracing` events at debug level, requests a shadow policy would have
//! denied at info (the point of shadow mode is to read them), store failures at warn.
//! With the
//! `metrics` feature, counters and a histogram go through the `metrics` facade, so any
//! exporter (Prometheus, StatsD) the application installs receives them:
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `redlimit_decisions_total` | counter | `outcome` (allowed, denied), `origin` (store, block_cache, fallback), `policy` |
//! | `redlimit_store_errors_total` | counter | `kind` (timeout, unavailable, protocol), `handled` (fallback or not) |
//! | `redlimit_shadow_denials_total` | counter | `policy` (the shadow policy that would have denied) |
//! | `redlimit_refunds_total` | counter | `outcome` (done, failed): refunds the layer made for [`refund_on`](crate::RateLimitLayer::refund_on) |

use crate::decision::Decision;
use crate::error::Error;
use crate::store::{StoreError, StoreErrorKind};

pub(crate) fn decided(decision: &Decision) {
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

/// A store call failed. Logged at warn only when the fallback hid it from the caller;
/// otherwise the caller gets the error and reports it (the layer does, per its
/// failure mode), so logging it here too would double every line of an outage.
pub(crate) fn store_failed(error: &StoreError, handled_by_fallback: bool) {
    if handled_by_fallback {
        tracing::warn!(%error, "rate-limit store failed; decided by the local fallback");
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
    }
}

/// The layer gave back a request's cost (`refund_on`). A failed refund only costs the
/// client budget, so it is a warning, not an error.
pub(crate) fn layer_refunded(result: &Result<Decision, Error>) {
    match result {
        Ok(decision) => tracing::debug!(
            remaining = decision.remaining(),
            policy = decision.policy().name(),
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
