//! What follows an allowed request's check in the layer: giving its cost back when
//! the inner service answered with a failure
//! ([`RateLimitLayer::refund_on`](crate::RateLimitLayer::refund_on)), and holding its
//! in-flight slot until its response body ends.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

use crate::decision::{Decision, Origin};
use crate::limiter::Limiter;
use crate::slot::{run_off_path, Slot};
use crate::store::{AdminStore, Store};
use crate::subject::Subject;

/// The application's rule: does this response head mean the server failed?
type When = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

/// Which responses are refunded, and how.
pub(crate) struct Refund<S> {
    when: Arc<When>,
    /// `refund_now::<S>`, made where `S: AdminStore` is known: the service and its
    /// future need only `S: Store`, and layers without refunds stay as they were.
    run: fn(Arc<Limiter<S>>, Subject, u32, Origin),
}

impl<S: AdminStore> Refund<S> {
    pub(crate) fn new(
        when: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            when: Arc::new(when),
            run: refund_now::<S>,
        }
    }
}

impl<S> Clone for Refund<S> {
    fn clone(&self) -> Self {
        Self {
            when: Arc::clone(&self.when),
            run: self.run,
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
    slot: Option<Slot>,
}

impl<S: Store> Aftercare<S> {
    /// What a request checked by `limiter` keeps, when anything: a refund rule, or
    /// in-flight policies whose slot it will hold.
    pub(crate) fn keep(
        refund: Option<&Refund<S>>,
        limiter: &Arc<Limiter<S>>,
        subject: &Subject,
        cost: u32,
    ) -> Option<Box<Self>> {
        if refund.is_none() && limiter.slot_table().is_none() {
            return None;
        }
        Some(Box::new(Self {
            refund: refund.cloned(),
            limiter: Arc::clone(limiter),
            subject: subject.clone(),
            cost,
            origin: Origin::FailOpen,
            slot: None,
        }))
    }

    /// The check allowed the request: `decision`'s origin took its cost, and its
    /// slot is held from now.
    pub(crate) fn allowed(&mut self, decision: &Decision) {
        self.origin = decision.origin();
        self.slot = self.limiter.hold(self.subject.clone(), decision);
    }
}

impl<S> Aftercare<S> {
    /// The response head is known: refunds if it matches the layer's rule, and
    /// returns what lasts until the body ends.
    pub(crate) fn at_head(self, status: StatusCode, headers: &HeaderMap) -> Option<AtEnd> {
        if let Some(refund) = &self.refund {
            if (refund.when)(status, headers) {
                (refund.run)(self.limiter, self.subject, self.cost, self.origin);
            }
        }
        self.slot.map(|slot| AtEnd { _slot: slot })
    }
}

/// What an allowed response's body holds until it ends or is dropped: the request's
/// slot, given back then.
#[derive(Debug)]
pub(crate) struct AtEnd {
    _slot: Slot,
}

/// Refunds without holding up the response (see [`run_off_path`]).
fn refund_now<S: AdminStore>(
    limiter: Arc<Limiter<S>>,
    subject: Subject,
    cost: u32,
    origin: Origin,
) {
    if origin == Origin::FailOpen {
        return;
    }
    run_off_path(
        async move {
            let refunded = limiter.refund_from(origin, subject, cost).await;
            crate::telemetry::layer_refunded(&refunded);
        },
        "rate-limit refund",
    );
}
