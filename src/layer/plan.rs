//! What the layer checks for one request: a [`Plan`] picks a [`Limit`] and a subject.
//!
//! One layer, one `Service` impl: [`Keyed`] (one limiter and a key extractor, what
//! [`RateLimitLayer::new`](crate::RateLimitLayer::new) builds),
//! [`Rules`](crate::layer::rules::Rules) and [`Tiers`](crate::layer::tiers::Tiers) are
//! all plans, and each owns the limiters it picks from.

use std::fmt;
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
/// Implemented by [`Keyed`] (what [`RateLimitLayer::new`](crate::RateLimitLayer::new)
/// makes of a limiter and a [`KeyExtractor`]), by
/// [`Rules`](crate::layer::rules::Rules) and by [`Tiers`](crate::layer::tiers::Tiers).
/// Sealed: the layer's answers depend on what a plan hands back, so new plans are added
/// here.
pub trait Plan<S>: Sealed<S> + Send + Sync + 'static {}

impl<S, P: Sealed<S> + Send + Sync + 'static> Plan<S> for P {}

/// The sealed half of [`Plan`]: public in a private module, so it cannot be named or
/// implemented outside the crate. A type that is not a plan fails this bound, so the
/// diagnostic is here: `RateLimitLayer<MemoryStore, ClientIp>` is the natural guess
/// at a layer's type, and says to write `KeyedLayer<MemoryStore, ClientIp>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a plan of a rate-limit layer",
    label = "a plan: `Keyed<S, K>`, `Rules<S>` or `Tiers<S, K>`",
    note = "a key extractor is not a plan: the layer of `RateLimitLayer::new(limiter, key)` is `redlimit::layer::KeyedLayer<S, K>` (`RateLimitLayer<S, Keyed<S, K>>`)"
)]
pub trait Sealed<S> {
    /// The limit and subject for this request.
    fn pick(&self, parts: &Parts) -> Pick<'_, S>;

    /// Every limit this plan can pick, for checks made once when the layer is built.
    fn each_limit<'a>(&'a self, visit: &mut dyn FnMut(&'a Limit<S>));
}

/// What a plan picked for one request.
pub enum Pick<'a, S> {
    /// Check the request against this limit, as this subject.
    Check(&'a Limit<S>, Subject),
    /// No limit applies: the request passes untouched, without headers.
    Pass,
    /// The key extractor found no subject; its rejection is the answer.
    Reject(KeyRejection),
}

impl<'a, S> Pick<'a, S> {
    /// `limit` for the subject a key extractor found, or its rejection.
    #[inline]
    pub(crate) fn keyed(limit: &'a Limit<S>, subject: Result<Subject, KeyRejection>) -> Self {
        match subject {
            Ok(subject) => Pick::Check(limit, subject),
            Err(rejection) => Pick::Reject(rejection),
        }
    }
}

impl<S: Store> fmt::Debug for Pick<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pick::Check(limit, subject) => {
                f.debug_tuple("Check").field(limit).field(subject).finish()
            }
            Pick::Pass => f.write_str("Pass"),
            Pick::Reject(rejection) => f.debug_tuple("Reject").field(rejection).finish(),
        }
    }
}

/// A limiter, with the headers its policies always produce computed once when the plan
/// is built, so a request only formats its own numbers.
pub struct Limit<S> {
    pub(crate) limiter: Arc<Limiter<S>>,
    pub(crate) headers: Arc<PolicyHeaders>,
}

impl<S: Store> Limit<S> {
    pub(crate) fn new(limiter: Arc<Limiter<S>>) -> Self {
        let headers = Arc::new(PolicyHeaders::new(limiter.policies()));
        Self { limiter, headers }
    }
}

impl<S> Clone for Limit<S> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            headers: Arc::clone(&self.headers),
        }
    }
}

impl<S: Store> fmt::Debug for Limit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.limiter.policies().iter().map(|p| p.name()))
            .finish()
    }
}

/// One limit and the key extractor that names the subject it checks: the plan of
/// [`RateLimitLayer::new`](crate::RateLimitLayer::new), and what each rule of
/// [`Rules`](crate::layer::rules::Rules) points to.
pub struct Keyed<S, K> {
    pub(crate) limit: Limit<S>,
    key: K,
}

impl<S: Store, K: KeyExtractor> Keyed<S, K> {
    pub(crate) fn new(limiter: Arc<Limiter<S>>, key: K) -> Self {
        Self {
            limit: Limit::new(limiter),
            key,
        }
    }
}

impl<S: Store, K: KeyExtractor> Sealed<S> for Keyed<S, K> {
    #[inline]
    fn pick(&self, parts: &Parts) -> Pick<'_, S> {
        Pick::keyed(&self.limit, self.key.extract(parts))
    }

    fn each_limit<'a>(&'a self, visit: &mut dyn FnMut(&'a Limit<S>)) {
        visit(&self.limit);
    }
}

impl<S: Store, K> fmt::Debug for Keyed<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("limit", &self.limit)
            .field("key", &std::any::type_name::<K>())
            .finish()
    }
}
