//! The response future of [`RateLimit`](crate::RateLimit): first the limiter's check,
//! then the inner service's call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::error::Error;
use crate::headers::Snapshot;
use crate::layer::{FailureMode, Shared};
use crate::limiter::CheckFuture;
use crate::response::{self, Answer, ResponseBody};
use crate::store::Store;

pin_project! {
    /// The pending response of [`RateLimit`](crate::RateLimit).
    ///
    /// A state machine, not a box: with the memory store (whose check is ready at once)
    /// the check and the inner call are polled in the same `poll`, with no allocation of
    /// its own.
    pub struct ResponseFuture<S, K, Inner, ReqBody>
    where
        S: Store,
        Inner: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S::Future, Inner, Inner::Future, ReqBody>,
        shared: Arc<Shared<S, K>>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwned]
    enum State<C, Inner, F, ReqBody> {
        /// Waiting for the limiter; the request and the readied inner service wait too.
        Checking {
            #[pin]
            check: CheckFuture<C>,
            request: Request<ReqBody>,
            inner: Inner,
        },
        /// Allowed: the inner service runs; `headers` is what to add to its response.
        Calling {
            #[pin]
            future: F,
            headers: Option<Snapshot>,
        },
        /// The layer answers by itself (a key rejection).
        Answered { answer: Option<Answer> },
        Done,
    }
}

impl<S, K, Inner, ReqBody> ResponseFuture<S, K, Inner, ReqBody>
where
    S: Store,
    Inner: Service<Request<ReqBody>>,
{
    pub(crate) fn checking(
        check: CheckFuture<S::Future>,
        request: Request<ReqBody>,
        inner: Inner,
        shared: Arc<Shared<S, K>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                request,
                inner,
            },
            shared,
        }
    }

    pub(crate) fn answered(answer: Answer, shared: Arc<Shared<S, K>>) -> Self {
        Self {
            state: State::Answered {
                answer: Some(answer),
            },
            shared,
        }
    }
}

impl<S, K, Inner, ReqBody, ResBody> Future for ResponseFuture<S, K, Inner, ReqBody>
where
    S: Store,
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let config = &this.shared.config;
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, .. } => {
                    let checked = ready!(check.poll(cx));
                    let StateOwned::Checking {
                        mut request,
                        mut inner,
                        ..
                    } = this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was Checking a moment ago");
                    };
                    let headers = match checked {
                        Ok(decision) if decision.is_allowed() => {
                            let headers = (config.headers_on_allowed
                                && !config.header_style.is_none())
                            .then(|| Snapshot::of(&decision));
                            request.extensions_mut().insert(decision);
                            headers
                        }
                        Ok(decision) => {
                            let (head, _body) = request.into_parts();
                            let answer = response::too_many_requests(&head, &decision, config);
                            return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                        }
                        Err(error) => {
                            log_failure(&error, config.failure_mode);
                            if config.failure_mode == FailureMode::Closed {
                                let (head, _body) = request.into_parts();
                                let answer = response::unavailable(&head, config);
                                return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                            }
                            None
                        }
                    };
                    let future = inner.call(request);
                    this.state.set(State::Calling { future, headers });
                }
                StateProj::Calling { future, headers } => {
                    let result = ready!(future.poll(cx));
                    let headers = headers.take();
                    this.state.set(State::Done);
                    let mut response = result?.map(ResponseBody::inner);
                    if let Some(snapshot) = headers {
                        config.policy_headers.write(
                            config.header_style,
                            &snapshot,
                            response.headers_mut(),
                        );
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Answered { answer } => {
                    let answer = answer.take();
                    this.state.set(State::Done);
                    if let Some(answer) = answer {
                        return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                    }
                }
                StateProj::Done => panic!("redlimit ResponseFuture polled after completion"),
            }
        }
    }
}

/// Store failures are the operator's concern (warn); a cost no policy can take is a bug
/// in the configuration (error). Neither is the client's fault.
fn log_failure(error: &Error, mode: FailureMode) {
    let action = match mode {
        FailureMode::Open => "letting the request through",
        FailureMode::Closed => "answering 503",
    };
    match error {
        Error::Store(error) => {
            tracing::warn!(%error, kind = ?error.kind(), "rate-limit store failed; {action}");
        }
        Error::ZeroCost | Error::CostTooHigh { .. } => {
            tracing::error!(%error, "rate-limit cost misconfigured; {action}");
        }
    }
}

impl<S, K, Inner, ReqBody> fmt::Debug for ResponseFuture<S, K, Inner, ReqBody>
where
    S: Store,
    Inner: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
