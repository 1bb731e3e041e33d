//! What follows an allowed request's check in the layer: giving its cost back when
//! the inner service answered with a failure
//! ([`RateLimitLayer::refund_on`](crate::RateLimitLayer::refund_on)), holding its
//! in-flight slot until its response body ends, and settling its reservation on the
//! actual cost the inner service reports ([`RateLimitLayer::settle`](crate::RateLimitLayer::settle)).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

use crate::decision::{Decision, Origin};
use crate::limiter::Limiter;
use crate::limiter::{run_off_path, Permit};
use crate::store::Store;
use crate::subject::Subject;

/// The application's rule: does this response head mean the server failed?
type When = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

/// Which responses are refunded: the application's rule.
pub(crate) struct Refund<S> {
    when: Arc<When>,
    store: std::marker::PhantomData<fn() -> S>,
}

impl<S> Refund<S> {
    pub(crate) fn new(
        when: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            when: Arc::new(when),
            store: std::marker::PhantomData,
        }
    }
}

impl<S> Clone for Refund<S> {
    fn clone(&self) -> Self {
        Self {
            when: Arc::clone(&self.when),
            store: std::marker::PhantomData,
        }
    }
}

impl<S> fmt::Debug for Refund<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Refund(..)")
    }
}

/// What an allowed request's check leaves to do once its response comes: give its
/// cost back if the response matches the layer's refund rule, and hold its slot in
/// the limiter's in-flight policies until its body ends. Made only by layers and
/// limiters that need it: the others keep no clone of the subject.
pub(crate) struct Aftercare<S> {
    refund: Option<Refund<S>>,
    limiter: Arc<Limiter<S>>,
    subject: Subject,
    cost: u32,
    /// Who took the cost; nobody ([`Origin::FailOpen`]) until the check allows.
    origin: Origin,
    /// The request's slot, once allowed.
    slot: Option<Permit>,
    /// Whether the cost is a reservation to settle on the actual.
    settles: bool,
    /// The reservation, once allowed: settled when dropped.
    settlement: Option<Settlement>,
}

impl<S: Store> Aftercare<S> {
    /// What a request checked by `limiter` keeps, when anything: a refund rule, or
    /// in-flight policies whose slot it will hold.
    pub(crate) fn keep(
        refund: Option<&Refund<S>>,
        settles: bool,
        limiter: &Arc<Limiter<S>>,
        subject: &Subject,
        cost: u32,
    ) -> Option<Box<Self>> {
        if refund.is_none() && !settles && limiter.slot_table().is_none() {
            return None;
        }
        Some(Box::new(Self {
            refund: refund.cloned(),
            limiter: Arc::clone(limiter),
            subject: subject.clone(),
            cost,
            origin: Origin::FailOpen,
            slot: None,
            settles,
            settlement: None,
        }))
    }

    /// The check allowed the request: `decision`'s origin took its cost, its slot is
    /// held from now, and a reservation's [`Usage`] goes into `extensions` for the
    /// inner service to report on.
    pub(crate) fn allowed(&mut self, decision: &Decision, extensions: &mut http::Extensions) {
        self.origin = decision.origin();
        self.slot = self.limiter.hold(self.subject.clone(), decision);
        if !self.settles {
            return;
        }
        if self.origin == Origin::FailOpen {
            // Nobody took the cost: nothing to settle.
            extensions.insert(Usage::unsettled(u64::from(self.cost)));
        } else {
            let usage = Usage::new(u64::from(self.cost));
            extensions.insert(usage.clone());
            let limiter: Arc<dyn Settles> = Arc::clone(&self.limiter) as Arc<dyn Settles>;
            self.settlement = Some(Settlement {
                limiter,
                subject: self.subject.clone(),
                origin: self.origin,
                usage,
            });
        }
    }

    /// The request passes with nothing taken (let through unchecked, or over its
    /// limit on a layer that degrades): nothing to refund, hold or settle, but on a
    /// layer that settles its handler still finds a [`Usage`], one that settles
    /// nothing.
    pub(crate) fn unreserved(self: Box<Self>, extensions: &mut http::Extensions) {
        if self.settles {
            extensions.insert(Usage::unsettled(u64::from(self.cost)));
        }
    }

    /// The response head is known: refunds if it matches the layer's rule, and
    /// returns what lasts until the body ends (the request's slot and its
    /// reservation), in the box this aftercare came in: the response carries one
    /// pointer to it, and nothing is allocated again.
    ///
    /// A refunded response gives back its whole reservation: there is nothing left to
    /// settle.
    pub(crate) fn at_head(
        self: Box<Self>,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<AtEnd> {
        if let Some(refund) = &self.refund {
            if (refund.when)(status, headers) {
                if let Some(settled) = &self.settlement {
                    settled.usage.report(settled.usage.reserved());
                }
                let limiter = Arc::clone(&self.limiter);
                refund_now(limiter, self.subject.clone(), self.cost, self.origin);
            }
        }
        if self.slot.is_none() && self.settlement.is_none() {
            return None;
        }
        Some(AtEnd { _held: self })
    }
}

impl<S> fmt::Debug for Aftercare<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Aftercare")
            .field("subject", &self.subject)
            .field("cost", &self.cost)
            .field("origin", &self.origin)
            .field("slot", &self.slot)
            .field("settlement", &self.settlement)
            .finish_non_exhaustive()
    }
}

/// What an allowed response's body holds until it ends or is dropped: the request's
/// aftercare, whose slot is given back then (its [`Permit`] dropped) and whose
/// reservation is settled then (its `Settlement` dropped), in that order.
#[derive(Debug)]
pub(crate) struct AtEnd {
    _held: Box<dyn Ending>,
}

/// An aftercare of any store, as a response body holds it: dropped when the body ends.
trait Ending: fmt::Debug + Send + Sync + 'static {}

impl<S: Store> Ending for Aftercare<S> {}

/// The actual cost of a request, reported by the inner service, against the cost the
/// layer reserved before calling it ([`RateLimitLayer::settle`](crate::RateLimitLayer::settle)).
///
/// A settling layer puts one in the extensions of every request it lets through; clone
/// it into whatever produces the response (a handler, a streaming body) and
/// [`report`](Usage::report) or [`add`](Usage::add) as the cost becomes known. The layer
/// reads it once, when the response body ends or is dropped, and settles: less than
/// reserved is given back, more is charged (past the limit, as a debt the next requests
/// see), nothing reported settles at the reserved cost.
///
/// A request that took nothing still gets one, so `Extension<Usage>` never fails behind
/// a settling layer (a missing extension is a 500, and an outage would turn every such
/// handler into one): let through unchecked ([`FailureMode::Open`](crate::layer::FailureMode::Open)
/// while the store fails), passed on over its limit
/// ([`OverLimit::Degrade`](crate::layer::OverLimit::Degrade)), or left unlimited by a
/// [`Rules`](crate::layer::Rules) or [`Tiers`](crate::layer::Tiers) plan. Its
/// [`settles`](Usage::settles) is `false`: what is reported is kept, and settles nothing,
/// with no store call. Its [`reserved`](Usage::reserved) is still the request's cost,
/// so a handler that sizes its work by it (an upstream's `max_tokens`) serves the
/// request as any other instead of asking for nothing (on an unlimited request it is 0:
/// the layer never runs its cost function on a request no limit applies to).
///
/// ```
/// use axum::{routing::post, Extension, Router};
/// use redlimit::layer::Usage;
///
/// async fn complete(Extension(usage): Extension<Usage>) -> &'static str {
///     // The upstream said how many tokens the answer took.
///     usage.report(120);
///     "..."
/// }
/// let app: Router = Router::new().route("/v1/complete", post(complete));
/// ```
#[derive(Clone)]
pub struct Usage(Arc<UsageCell>);

struct UsageCell {
    reserved: u64,
    /// `UNREPORTED` until the inner service reports.
    used: AtomicU64,
    /// Whether a store took `reserved` and the layer settles what is reported.
    settles: bool,
}

/// Not reported: settles at the reserved cost.
const UNREPORTED: u64 = u64::MAX;

impl Usage {
    /// A reservation the layer settles.
    fn new(reserved: u64) -> Self {
        Self::with(reserved, true)
    }

    /// The `Usage` of a request of `cost` that took nothing: reports settle nothing.
    pub(crate) fn unsettled(cost: u64) -> Self {
        Self::with(cost, false)
    }

    fn with(reserved: u64, settles: bool) -> Self {
        Self(Arc::new(UsageCell {
            reserved,
            used: AtomicU64::new(UNREPORTED),
            settles,
        }))
    }

    /// The cost the layer reserved before calling the inner service: the most the
    /// request may use. On a request that took nothing ([`settles`](Usage::settles) is
    /// `false`), the cost it was checked at, which nothing holds; 0 on one no limit
    /// applied to.
    pub fn reserved(&self) -> u64 {
        self.0.reserved
    }

    /// Whether the layer settles what is reported: `true` when a store (or the
    /// fallback, or a lease) took [`reserved`](Usage::reserved) for this request;
    /// `false` when nothing was taken (failed open, degraded over its limit, or
    /// unlimited), and reports are kept but cost nothing and settle nothing.
    pub fn settles(&self) -> bool {
        self.0.settles
    }

    /// The request's actual cost, replacing what was reported before. Values from
    /// `u64::MAX - 1` up are read as `u64::MAX - 1` (a charge is bounded anyway).
    pub fn report(&self, used: u64) {
        self.0
            .used
            .store(used.min(UNREPORTED - 1), Ordering::Relaxed);
    }

    /// Adds `used` to what was reported (to 0 when nothing was): for a cost counted
    /// as a streamed response goes.
    pub fn add(&self, used: u64) {
        let _ = self
            .0
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                let base = if now == UNREPORTED { 0 } else { now };
                Some(base.saturating_add(used).min(UNREPORTED - 1))
            });
    }

    /// What has been reported so far; `None` when nothing has.
    pub fn reported(&self) -> Option<u64> {
        let used = self.0.used.load(Ordering::Relaxed);
        (used != UNREPORTED).then_some(used)
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Usage")
            .field("reserved", &self.reserved())
            .field("reported", &self.reported())
            .field("settles", &self.settles())
            .finish()
    }
}

/// An allowed request's reservation: settled on its reported cost when dropped (the
/// body ended, the response or its future was dropped), one store call off the
/// response's path, where its check took the cost.
struct Settlement {
    limiter: Arc<dyn Settles>,
    subject: Subject,
    origin: Origin,
    usage: Usage,
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("subject", &self.subject)
            .field("origin", &self.origin)
            .field("usage", &self.usage)
            .finish()
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        let Some(used) = self.usage.reported() else {
            return;
        };
        let reserved = self.usage.reserved();
        if used != reserved {
            let subject = self.subject.clone();
            Arc::clone(&self.limiter).settle(self.origin, subject, reserved, used);
        }
    }
}

/// What a settlement calls: its limiter, whatever its store.
trait Settles: Send + Sync + 'static {
    fn settle(self: Arc<Self>, origin: Origin, subject: Subject, reserved: u64, used: u64);
}

impl<S: Store> Settles for Limiter<S> {
    fn settle(self: Arc<Self>, origin: Origin, subject: Subject, reserved: u64, used: u64) {
        run_off_path(
            async move {
                // At most the reservation, which was a valid cost.
                let back =
                    (used < reserved).then(|| u32::try_from(reserved - used).unwrap_or(u32::MAX));
                let settled = match back {
                    Some(back) => self.refund_from(origin, subject, back).await,
                    None => self.charge_from(origin, subject, used - reserved).await,
                };
                crate::telemetry::layer_settled(&settled, back.map(u64::from));
            },
            "rate-limit settlement",
        );
    }
}

/// Refunds without holding up the response (see [`run_off_path`]).
fn refund_now<S: Store>(limiter: Arc<Limiter<S>>, subject: Subject, cost: u32, origin: Origin) {
    if origin == Origin::FailOpen {
        return;
    }
    run_off_path(
        async move {
            let refunded = limiter.refund_from(origin, subject, cost).await;
            crate::telemetry::layer_refunded(&refunded, u64::from(cost));
        },
        "rate-limit refund",
    );
}
