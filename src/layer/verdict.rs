//! What the layer makes of the limiter's answer: the request passed on (with the
//! headers its response gets), or the layer's own answer.

use std::sync::Arc;

use http::request::Parts;

use crate::decision::Decision;
use crate::error::Error;
use crate::layer::aftercare::Aftercare;
use crate::layer::headers::{HeaderStyle, PolicyHeaders, Snapshot};
use crate::layer::options::{Config, FailureMode, OverLimit};
use crate::layer::plan::Limit;
use crate::layer::response::{self, Answer};
use crate::store::Store;

/// What to add to an allowed response once the inner service answers.
pub(crate) struct Headers {
    style: HeaderStyle,
    snapshot: Snapshot,
    policies: Arc<PolicyHeaders>,
}

impl Headers {
    /// Writes them into the inner service's response headers.
    pub(crate) fn write(&self, headers: &mut http::HeaderMap) {
        self.policies.write(self.style, &self.snapshot, headers);
    }
}

/// What the layer makes of a check: pass the request on (its [`Decision`] put in its
/// extensions already; the headers its response gets, what follows it), or answer it.
pub(crate) enum Verdict<R> {
    Pass {
        headers: Option<Headers>,
        aftercare: Option<R>,
    },
    Answer(Answer),
}

/// Acts on the limiter's answer (a first check's, or a wait's admission or failure):
/// passes the request on when allowed or when the store failed and the failure mode is
/// open, with the [`Decision`] in the request's extensions either way (so an
/// `Extension<Decision>` handler runs as written during an outage); answers otherwise.
/// `aftercare` is kept only for an allowed request, and learns who took its cost (the
/// store or the fallback); one that failed open or degraded consumed nothing, and on a
/// settling layer gets a [`Usage`](crate::layer::Usage) that settles nothing (so an
/// `Extension<Usage>` handler runs as written too). A denial a waiting layer holds
/// never comes here.
///
/// `head` is the request's: the decision goes into its extensions, and the layer's
/// answers are made from it (the request itself is put together again only for the
/// inner call).
#[inline]
pub(crate) fn verdict<S>(
    checked: Result<Decision, Error>,
    head: &mut Parts,
    config: &Config,
    limit: &Limit<S>,
    mut aftercare: Option<Box<Aftercare<S>>>,
) -> Verdict<Box<Aftercare<S>>>
where
    S: Store,
{
    let policies = &limit.headers;
    let passing = |decision: &Decision| {
        (config.headers_on_allowed && !config.header_style.is_none()).then(|| Headers {
            style: config.header_style,
            snapshot: Snapshot::of(decision),
            policies: Arc::clone(policies),
        })
    };
    let (headers, aftercare) = match checked {
        Ok(decision) if decision.is_allowed() => {
            let headers = passing(&decision);
            if let Some(after) = &mut aftercare {
                after.allowed(&decision, &mut head.extensions);
            }
            head.extensions.insert(decision);
            (headers, aftercare)
        }
        Ok(decision) if config.over_limit == OverLimit::Degrade => {
            // Over the limit, and passed on with its denial: nothing was consumed, so
            // there is nothing to refund, no slot to hold and nothing to settle.
            crate::telemetry::degraded(&decision);
            let headers = passing(&decision);
            if let Some(after) = aftercare {
                after.unreserved(&mut head.extensions);
            }
            head.extensions.insert(decision);
            (headers, None)
        }
        Ok(decision) => {
            return Verdict::Answer(response::too_many_requests(
                head, &decision, config, policies,
            ));
        }
        Err(Error::Store(error)) => {
            // A shed check (the store's queue full) is never let through: shedding
            // load must not turn into passing it unchecked.
            let open = config.failure_mode == FailureMode::Open
                && error.kind() != crate::store::StoreErrorKind::Overloaded;
            crate::telemetry::layer_failed(&error, open);
            if !open {
                return Verdict::Answer(response::unavailable(head, config));
            }
            // No RateLimit headers: there are no figures to send, and made-up ones
            // would mislead a client.
            let policies = limit.limiter.policy_set().policies();
            if let Some(after) = aftercare {
                after.unreserved(&mut head.extensions);
            }
            head.extensions.insert(Decision::fail_open(policies));
            (None, None)
        }
        Err(error @ (Error::ZeroCost | Error::CostTooHigh { .. })) => {
            // The request's own cost, never the store's fault: the same answer in every
            // failure mode, and nothing consumed.
            crate::telemetry::impossible_cost(&error);
            return Verdict::Answer(response::impossible_cost(head, &error, config, policies));
        }
        Err(error) => {
            // A setup mistake, never the request's nor the store's: said on the log.
            tracing::error!(%error, "redlimit: the request could not be checked");
            return Verdict::Answer(response::misconfigured(head, &error, config));
        }
    };
    Verdict::Pass { headers, aftercare }
}
