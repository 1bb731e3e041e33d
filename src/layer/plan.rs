//! What the layer checks for one request: a [`Plan`] picks a limiter and a subject.
//!
//! One layer, one `Service` impl: a key extractor (with the layer's one limiter),
//! [`Rules`](crate::layer::rules::Rules) and [`Tiers`](crate::layer::tiers::Tiers) are all plans.

use std::sync::Arc;

use http::request::Parts;

use crate::key::{KeyExtractor, KeyRejection};
use crate::layer::headers::PolicyHeaders;
use crate::limiter::Limiter;
use crate::store::Store;
use crate::subject::Subject;

/// Chooses, per request, which limiter checks it and as which subject; or that no limit
/// applies and the request passes untouched.
///
/// Implemented by every [`KeyExtractor`] (checked against the limiter given to
/// [`RateLimitLayer::new`](crate::RateLimitLayer::new)), by
/// [`Rules`](crate::layer::rules::Rules) and by [`Tiers`](crate::layer::tiers::Tiers). Sealed: the
/// layer's answers depend on what a plan hands back, so new plans are added here.
pub trait Plan<S>: SealedPlan<S> + Send + Sync + 'static {}

impl<S, P: SealedPlan<S> + Send + Sync + 'static> Plan<S> for P {}

/// What a request is checked against: a limiter, with the headers its policies always
/// produce computed once when the plan is built, so a request only formats its own
/// numbers.
pub struct Gate<S> {
    pub(crate) limiter: Arc<Limiter<S>>,
    pub(crate) headers: Arc<PolicyHeaders>,
}

impl<S: Store> Gate<S> {
    pub(crate) fn new(limiter: Arc<Limiter<S>>) -> Self {
        let headers = Arc::new(PolicyHeaders::new(limiter.policies()));
        Self { limiter, headers }
    }
}

impl<S> Clone for Gate<S> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            headers: Arc::clone(&self.headers),
        }
    }
}

impl<S: Store> std::fmt::Debug for Gate<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.limiter.policies().iter().map(|p| p.name()))
            .finish()
    }
}

/// What a plan picked for a request: `Ok(None)` lets it pass without a check.
pub(crate) type Selected<'a, S> = Result<Option<(&'a Gate<S>, Subject)>, KeyRejection>;

/// The sealed half of [`Plan`]: public in a private module, so it cannot be named or
/// implemented outside the crate.
pub trait SealedPlan<S> {
    /// What the layer keeps beside the plan: the one limiter of a key extractor, nothing
    /// for plans that hold their own limiters.
    type Held: Send + Sync + 'static;

    /// The gate and subject for this request.
    fn select<'a>(&'a self, held: &'a Self::Held, parts: &Parts) -> Selected<'a, S>;

    /// Every gate this plan can pick, for checks made once when the layer is built.
    fn each_gate<'a>(&'a self, held: &'a Self::Held, visit: &mut dyn FnMut(&'a Gate<S>));
}

impl<S: Store, K: KeyExtractor> SealedPlan<S> for K {
    type Held = Gate<S>;

    #[inline]
    fn select<'a>(&'a self, gate: &'a Gate<S>, parts: &Parts) -> Selected<'a, S> {
        self.extract(parts).map(|subject| Some((gate, subject)))
    }

    fn each_gate<'a>(&'a self, gate: &'a Gate<S>, visit: &mut dyn FnMut(&'a Gate<S>)) {
        visit(gate);
    }
}
