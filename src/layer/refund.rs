//! Giving back an allowed request's cost when the inner service answered with a
//! failure: [`RateLimitLayer::refund_on`](crate::RateLimitLayer::refund_on).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{HeaderMap, StatusCode};

use crate::decision::Origin;
use crate::limiter::Limiter;
use crate::store::AdminStore;
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

impl<S> Refund<S> {
    /// What an allowed request keeps until its response head is known. Only layers
    /// with a refund rule pay for the subject's clone.
    pub(crate) fn keep(
        &self,
        limiter: &Arc<Limiter<S>>,
        subject: &Subject,
        cost: u32,
    ) -> PendingRefund<S> {
        PendingRefund {
            refund: self.clone(),
            limiter: Arc::clone(limiter),
            subject: subject.clone(),
            cost,
            origin: Origin::FailOpen,
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

/// An allowed request's subject and cost, refunded if its response matches, where
/// its check took the cost.
pub(crate) struct PendingRefund<S> {
    refund: Refund<S>,
    limiter: Arc<Limiter<S>>,
    subject: Subject,
    cost: u32,
    /// Who took the cost; nobody ([`Origin::FailOpen`]) until the check allows.
    origin: Origin,
}

impl<S> PendingRefund<S> {
    /// The check allowed the request: `origin` took its cost.
    pub(crate) fn taken_by(&mut self, origin: Origin) {
        self.origin = origin;
    }

    /// Refunds if the response head matches the layer's rule.
    pub(crate) fn settle(self, status: StatusCode, headers: &HeaderMap) {
        if (self.refund.when)(status, headers) {
            (self.refund.run)(self.limiter, self.subject, self.cost, self.origin);
        }
    }
}

/// Refunds without holding up the response: a store that answers at once (the memory
/// store) is done here; any other finishes in a Tokio task.
fn refund_now<S: AdminStore>(
    limiter: Arc<Limiter<S>>,
    subject: Subject,
    cost: u32,
    origin: Origin,
) {
    if origin == Origin::FailOpen {
        return;
    }
    let mut refund = Box::pin(async move { limiter.refund_from(origin, subject, cost).await });
    match refund
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => crate::telemetry::layer_refunded(&result),
        Poll::Pending => match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { crate::telemetry::layer_refunded(&refund.await) });
            }
            // A store that needs a runtime was called outside one: the refund cannot
            // finish, and the client keeps the cost it already paid.
            Err(_) => tracing::warn!("rate-limit refund dropped: no Tokio runtime to run it"),
        },
    }
}
