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

use crate::decision::Decision;
use crate::error::Error;
use crate::layer::headers::{HeaderStyle, PolicyHeaders, Snapshot};
use crate::layer::response::{self, Answer, ResponseBody};
use crate::layer::wait::{self, Held, Settled, Start};
use crate::layer::{Aftercare, Config, FailureMode, Limit, OverLimit, Plan, Shared};
use crate::limiter::CheckFuture;
use crate::store::Store;

pin_project! {
    /// The pending response of [`RateLimit`](crate::RateLimit).
    ///
    /// A state machine, not a box. The memory store decides inside `call`, so its
    /// requests go straight to the inner call: no clone of the inner service, and no
    /// allocation of the layer's own beyond the response headers (and an aftercare's, when
    /// [`refund_on`](crate::RateLimitLayer::refund_on) is set or the limiter has in-flight
    /// policies). A store that answers
    /// later (Redis) keeps the request in one box while it waits.
    ///
    /// # Panics
    ///
    /// When polled again after it has completed, as futures may.
    pub struct ResponseFuture<S, P, Inner, ReqBody>
    where
        S: Store,
        P: Plan<S>,
        Inner: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, P, Inner, ReqBody>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwned]
    enum State<S, P, Inner, ReqBody>
    where
        S: Store,
        P: Plan<S>,
        Inner: Service<Request<ReqBody>>,
    {
        /// Waiting for the limiter; the request and the readied inner service wait
        /// too, boxed: this state only exists for stores that answer later (Redis,
        /// where a box is nothing beside the round trip), and without it the future
        /// of every request would be as large as the request, and moved as often.
        Checking {
            #[pin]
            check: CheckFuture<S::Future>,
            waiting: Box<Waiting<S, P, Inner, ReqBody>>,
        },
        /// Allowed: the inner service runs; `headers` says what to add to its response
        /// (absent when allowed responses carry no headers, the store failed open, or
        /// no limit applied), `aftercare` what follows once the response comes (a refund the layer's rule
        /// may make, the request's in-flight slot).
        Calling {
            #[pin]
            future: Inner::Future,
            headers: Option<Headers>,
            aftercare: Option<Box<Aftercare<S>>>,
        },
        /// Over its limit on a layer that waits ([`OverLimit::Wait`]): held until its
        /// time, then checked, then readying a clone of the inner service. Boxed: only
        /// a denied request of a waiting layer gets here, and the other states stay as
        /// small as they were.
        Waiting { held: Box<Held<S, P, Inner, ReqBody>> },
        /// The layer answers by itself: a key rejection, a denial, a 503.
        Answered { answer: Option<Answer> },
        Done,
    }
}

/// What waits beside a pending check: the request, the readied inner service, and
/// what deciding needs once the check completes (the layer's options, the limit that
/// checks the request, what follows its check).
struct Waiting<S, P: Plan<S>, Inner, ReqBody> {
    request: Request<ReqBody>,
    inner: Inner,
    shared: Arc<Shared<S, P>>,
    limit: Limit<S>,
    aftercare: Option<Box<Aftercare<S>>>,
}

/// What to add to an allowed response once the inner service answers.
pub(crate) struct Headers {
    style: HeaderStyle,
    snapshot: Snapshot,
    policies: Arc<PolicyHeaders>,
}

impl<S, P, Inner, ReqBody> ResponseFuture<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>>,
{
    /// A check still pending: `inner` is the service `poll_ready` readied; `limit` is
    /// the one checking.
    pub(crate) fn checking(
        check: CheckFuture<S::Future>,
        request: Request<ReqBody>,
        inner: Inner,
        shared: Arc<Shared<S, P>>,
        limit: Limit<S>,
        aftercare: Option<Box<Aftercare<S>>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                waiting: Box::new(Waiting {
                    request,
                    inner,
                    shared,
                    limit,
                    aftercare,
                }),
            },
        }
    }

    /// A check decided at once: `inner` (the service `poll_ready` readied) is called
    /// now if the request may pass.
    pub(crate) fn at_once(
        checked: Result<Decision, Error>,
        request: Request<ReqBody>,
        inner: &mut Inner,
        shared: &Arc<Shared<S, P>>,
        limit: &Limit<S>,
        aftercare: Option<Box<Aftercare<S>>>,
    ) -> Self
    where
        Inner: Clone,
    {
        let next = next_step(checked, request, inner, &shared.config, limit, aftercare);
        let state = match next {
            Next::Wait {
                decision,
                request,
                aftercare,
            } => {
                // The service `poll_ready` readied is dropped, so the waiting request
                // holds nothing of it (a concurrency permit, a buffer slot); the
                // service keeps a fresh clone for the next request, and the request a
                // clone of its own, readied only once it is admitted.
                let fresh = inner.clone();
                drop(std::mem::replace(inner, fresh));
                let mine = inner.clone();
                Self::held(wait::hold(
                    decision, request, aftercare, mine, shared, limit,
                ))
            }
            Next::Call {
                future,
                headers,
                aftercare,
            } => State::Calling {
                future,
                headers,
                aftercare,
            },
            Next::Answer(answer) => State::Answered {
                answer: Some(answer),
            },
        };
        Self { state }
    }

    fn held(start: Start<Box<Held<S, P, Inner, ReqBody>>>) -> State<S, P, Inner, ReqBody> {
        match start {
            Start::Held(held) => State::Waiting { held },
            Start::Answer(answer) => State::Answered {
                answer: Some(answer),
            },
        }
    }

    /// No limit applies: the inner call, untouched.
    pub(crate) fn unlimited(future: Inner::Future) -> Self {
        Self {
            state: State::Calling {
                future,
                headers: None,
                aftercare: None,
            },
        }
    }

    /// The layer's own answer, known in `call` (a key rejection).
    pub(crate) fn answered(answer: Answer) -> Self {
        Self {
            state: State::Answered {
                answer: Some(answer),
            },
        }
    }
}

impl<S, P, Inner, ReqBody, ResBody> Future for ResponseFuture<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Output = Result<Response<ResponseBody<ResBody>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking { check, .. } => {
                    let checked = ready!(check.poll(cx));
                    let StateOwned::Checking { waiting, .. } =
                        state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was Checking a moment ago");
                    };
                    let Waiting {
                        request,
                        mut inner,
                        shared,
                        limit,
                        aftercare,
                    } = *waiting;
                    match next_step(
                        checked,
                        request,
                        &mut inner,
                        &shared.config,
                        &limit,
                        aftercare,
                    ) {
                        Next::Call {
                            future,
                            headers,
                            aftercare,
                        } => {
                            state.set(State::Calling {
                                future,
                                headers,
                                aftercare,
                            });
                        }
                        Next::Answer(answer) => {
                            return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                        }
                        Next::Wait {
                            decision,
                            request,
                            aftercare,
                        } => {
                            // The readied service is dropped here: the request waits
                            // with an unreadied clone (see `at_once`).
                            let mine = inner.clone();
                            drop(inner);
                            let start =
                                wait::hold(decision, request, aftercare, mine, &shared, &limit);
                            state.set(Self::held(start));
                        }
                    }
                }
                StateProj::Waiting { held } => match ready!(held.poll_settle(cx)) {
                    Ok(Settled::Call {
                        future,
                        headers,
                        aftercare,
                    }) => state.set(State::Calling {
                        future,
                        headers,
                        aftercare,
                    }),
                    Ok(Settled::Answer(answer)) => {
                        state.set(State::Done);
                        return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                    }
                    Err(error) => {
                        state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                },
                StateProj::Calling {
                    future,
                    headers,
                    aftercare,
                } => {
                    let result = ready!(future.poll(cx));
                    let (headers, aftercare) = (headers.take(), aftercare.take());
                    state.set(State::Done);
                    let response = result?;
                    let at_end = aftercare
                        .and_then(|after| after.at_head(response.status(), response.headers()));
                    let mut response = response.map(|body| ResponseBody::inner(body, at_end));
                    if let Some(headers) = headers {
                        headers.policies.write(
                            headers.style,
                            &headers.snapshot,
                            response.headers_mut(),
                        );
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Answered { answer } => {
                    let answer = answer.take();
                    state.set(State::Done);
                    if let Some(answer) = answer {
                        return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                    }
                }
                StateProj::Done => panic!("redlimit ResponseFuture polled after completion"),
            }
        }
    }
}

/// What follows a check: the inner call, an answer of the layer's own, or a wait.
enum Next<F, R, ReqBody> {
    Call {
        future: F,
        headers: Option<Headers>,
        aftercare: Option<R>,
    },
    Answer(Answer),
    /// Denied on a layer that waits: the caller holds it ([`wait::hold`]).
    Wait {
        decision: Decision,
        request: Request<ReqBody>,
        aftercare: Option<R>,
    },
}

/// Acts on the limiter's answer: calls `inner` when allowed or when the store failed and
/// the failure mode is open, with the [`Decision`] in the request's extensions either
/// way (so an `Extension<Decision>` handler runs as written during an outage); answers
/// otherwise, or hands a denial on a layer that waits back to be held. `aftercare` is kept
/// only for an allowed request, and learns who took its cost (the store or the
/// fallback); one that failed open or degraded consumed nothing, and on a settling
/// layer gets a [`Usage`](crate::layer::Usage) that settles nothing (so an
/// `Extension<Usage>` handler runs as written too).
#[inline]
fn next_step<S, Inner, ReqBody>(
    checked: Result<Decision, Error>,
    request: Request<ReqBody>,
    inner: &mut Inner,
    config: &Config,
    limit: &Limit<S>,
    aftercare: Option<Box<Aftercare<S>>>,
) -> Next<Inner::Future, Box<Aftercare<S>>, ReqBody>
where
    S: Store,
    Inner: Service<Request<ReqBody>>,
{
    match verdict(checked, request, config, limit, aftercare, true) {
        Verdict::Pass {
            request,
            headers,
            aftercare,
        } => Next::Call {
            future: inner.call(request),
            headers,
            aftercare,
        },
        Verdict::Answer(answer) => Next::Answer(answer),
        Verdict::Over {
            decision,
            request,
            aftercare,
        } => Next::Wait {
            decision,
            request,
            aftercare,
        },
    }
}

/// What the layer makes of a check: pass the request on (its [`Decision`] in its
/// extensions, the headers its response gets, what follows it), answer it, or, on a
/// layer that waits and when `may_wait`, hand a denial back to be held.
pub(crate) enum Verdict<ReqBody, R> {
    Pass {
        request: Request<ReqBody>,
        headers: Option<Headers>,
        aftercare: Option<R>,
    },
    Answer(Answer),
    Over {
        decision: Decision,
        request: Request<ReqBody>,
        aftercare: Option<R>,
    },
}

/// [`next_step`] up to the inner call: shared with a held request's check at its time
/// (`may_wait` false there: it places itself again on its own).
#[inline]
pub(crate) fn verdict<S, ReqBody>(
    checked: Result<Decision, Error>,
    mut request: Request<ReqBody>,
    config: &Config,
    limit: &Limit<S>,
    mut aftercare: Option<Box<Aftercare<S>>>,
    may_wait: bool,
) -> Verdict<ReqBody, Box<Aftercare<S>>>
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
                after.allowed(&decision, request.extensions_mut());
            }
            request.extensions_mut().insert(decision);
            (headers, aftercare)
        }
        Ok(decision) if config.over_limit == OverLimit::Degrade => {
            // Over the limit, and passed on with its denial: nothing was consumed, so
            // there is nothing to refund, no slot to hold and nothing to settle.
            crate::telemetry::degraded(&decision);
            let headers = passing(&decision);
            if let Some(after) = aftercare {
                after.unreserved(request.extensions_mut());
            }
            request.extensions_mut().insert(decision);
            (headers, None)
        }
        Ok(decision) if may_wait && wait::may_wait(config, &decision) => {
            return Verdict::Over {
                decision,
                request,
                aftercare,
            };
        }
        Ok(decision) => {
            if may_wait && matches!(config.over_limit, OverLimit::Wait(_)) {
                // Its time is past `max_wait` already: refused before anything is made
                // for a wait (a flood over the limit costs what it costs a refusing
                // layer).
                crate::telemetry::waited(&decision, crate::layer::WaitOutcome::Refused);
            }
            let (head, _body) = request.into_parts();
            return Verdict::Answer(response::too_many_requests(
                &head, &decision, config, policies,
            ));
        }
        Err(Error::Store(error)) => {
            // A shed check (the store's queue full) is never let through: shedding
            // load must not turn into passing it unchecked.
            let open = config.failure_mode == FailureMode::Open
                && error.kind() != crate::store::StoreErrorKind::Overloaded;
            crate::telemetry::layer_failed(&error, open);
            if !open {
                let (head, _body) = request.into_parts();
                return Verdict::Answer(response::unavailable(&head, config));
            }
            // No RateLimit headers: there are no figures to send, and made-up ones
            // would mislead a client.
            let policies = limit.limiter.policy_set().policies();
            if let Some(after) = aftercare {
                after.unreserved(request.extensions_mut());
            }
            request
                .extensions_mut()
                .insert(Decision::fail_open(policies));
            (None, None)
        }
        Err(error @ (Error::ZeroCost | Error::CostTooHigh { .. })) => {
            // The request's own cost, never the store's fault: the same answer in every
            // failure mode, and nothing consumed.
            crate::telemetry::impossible_cost(&error);
            let (head, _body) = request.into_parts();
            return Verdict::Answer(response::impossible_cost(&head, &error, config, policies));
        }
    };
    Verdict::Pass {
        request,
        headers,
        aftercare,
    }
}

impl<S, P, Inner, ReqBody> fmt::Debug for ResponseFuture<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
