//! The rate-limiting service that [`RateLimitLayer`](crate::RateLimitLayer) wraps around
//! an inner service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::layer::aftercare::{Aftercare, Usage};
use crate::layer::future::{Asked, ResponseFuture};
use crate::layer::options::Shared;
use crate::layer::plan::{Pick, Plan};
use crate::layer::response::{self, ResponseBody};
use crate::limiter::Checked;
use crate::store::Store;

/// A service limited by key: it answers 429 itself when the limiter denies, and calls
/// `Inner` otherwise.
///
/// Made by [`RateLimitLayer`](crate::RateLimitLayer); see the [`layer`](crate::layer)
/// module for an example. Its error type is `Inner`'s: denials, key rejections and store
/// failures are responses, never errors.
pub struct RateLimit<S, P: Plan<S>, Inner> {
    inner: Inner,
    /// The plan, options and refund rule of the layer that made this service.
    shared: Arc<Shared<S, P>>,
}

impl<S, P: Plan<S>, Inner> RateLimit<S, P, Inner> {
    pub(crate) fn new(inner: Inner, shared: Arc<Shared<S, P>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &Inner {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> Inner {
        self.inner
    }
}

impl<S, P: Plan<S>, Inner: Clone> Clone for RateLimit<S, P, Inner> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Store, P: Plan<S>, Inner: fmt::Debug> fmt::Debug for RateLimit<S, P, Inner> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("plan", &std::any::type_name::<P>())
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, P, Inner, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, P, Inner>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<S, P, Inner, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let (parts, body) = request.into_parts();
        let (limit, subject) = match shared.plan.pick(&parts) {
            Pick::Check(limit, subject) => (limit, subject),
            Pick::Pass => {
                let mut parts = parts;
                if shared.config.settles {
                    // Unlimited, but its handler reads a `Usage` all the same. Of 0:
                    // the cost function is never run on a request no limit applies to.
                    parts.extensions.insert(Usage::unsettled(0));
                }
                let request = Request::from_parts(parts, body);
                return ResponseFuture::unlimited(self.inner.call(request));
            }
            Pick::Reject(rejection) => {
                return ResponseFuture::answered(response::rejected(
                    &parts,
                    &rejection,
                    &shared.config,
                ));
            }
        };
        let cost = shared.config.cost.of(&parts);
        let aftercare = Aftercare::keep(
            shared.refund.as_ref(),
            shared.config.settles,
            &limit.limiter,
            &subject,
            cost,
        );
        // A layer that waits keeps what it asked for: a denied request waits for the
        // same subject and cost, with no second run of the key or the cost function.
        let asked = shared.room.is_some().then(|| Asked {
            subject: subject.clone(),
            cost,
        });
        let check = match limit.limiter.check_or_later(subject, cost) {
            Checked::Now(checked) => {
                // Decided already (the memory store, the block cache): the service
                // `poll_ready` readied is called right away, and the request stays in
                // its parts until then.
                return ResponseFuture::at_once(
                    checked,
                    parts,
                    body,
                    &mut self.inner,
                    shared,
                    limit,
                    aftercare,
                    asked,
                );
            }
            Checked::Later(check) => check,
        };
        let request = Request::from_parts(parts, body);
        // Otherwise the readied service is taken into the future and called when the
        // check completes; the clone stays for the next request and will be readied in
        // its turn.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let limit = limit.clone();
        ResponseFuture::checking(
            check,
            request,
            inner,
            Arc::clone(shared),
            limit,
            aftercare,
            asked,
        )
    }
}
