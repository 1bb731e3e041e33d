//! The response future of [`RateLimit`](crate::RateLimit): the one state machine of a
//! request, from the limiter's check (and, on a layer that waits, the wait for its
//! turn) to the inner service's call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::decision::Decision;
use crate::error::Error;
use crate::layer::aftercare::Aftercare;
use crate::layer::options::{OverLimit, Shared};
use crate::layer::plan::{Limit, Plan};
use crate::layer::response::{self, Answer, ResponseBody};
use crate::layer::verdict::{verdict, Headers, Verdict};
use crate::layer::wait::Waiting;
use crate::limiter::CheckFuture;
use crate::store::Store;
use crate::subject::Subject;

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
            pending: Box<Pending<S, P, Inner, ReqBody>>,
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
        /// Over its limit on a layer that waits ([`OverLimit::Wait`]): waiting for its
        /// turn, then readying a clone of the inner service. Boxed: only a denied request
        /// of a waiting layer gets here, and the other states stay as small as they were.
        Waiting { held: Box<Held<S, P, Inner, ReqBody>> },
        /// The layer answers by itself: a key rejection, a denial, a 503.
        Answered { answer: Option<Answer> },
        Done,
    }
}

/// What waits beside a pending check: the request, the readied inner service, and
/// what deciding needs once the check completes (the layer's options, the limit that
/// checks the request, what follows its check, what it asked for).
struct Pending<S, P: Plan<S>, Inner, ReqBody> {
    request: Request<ReqBody>,
    inner: Inner,
    shared: Arc<Shared<S, P>>,
    limit: Limit<S>,
    aftercare: Option<Box<Aftercare<S>>>,
    asked: Option<Asked>,
}

/// What a request asked its limiter for, kept from `call` on a layer that waits: a
/// denied request waits for the same subject and cost, with no second run of the key
/// extractor or the cost function.
pub(crate) struct Asked {
    pub(crate) subject: Subject,
    pub(crate) cost: u32,
}

/// A request the limiter denied, on a layer that waits: its wait (`None` once admitted),
/// then the readying of a clone of the inner service and its call.
struct Held<S, P: Plan<S>, Inner, ReqBody> {
    turn: Option<Waiting>,
    request: Option<Request<ReqBody>>,
    /// A clone of the inner service, readied only once the request is admitted.
    inner: Inner,
    shared: Arc<Shared<S, P>>,
    limit: Limit<S>,
    aftercare: Option<Box<Aftercare<S>>>,
    headers: Option<Headers>,
}

impl<S, P, Inner, ReqBody> ResponseFuture<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>> + Clone,
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
        asked: Option<Asked>,
    ) -> Self {
        let pending = Box::new(Pending {
            request,
            inner,
            shared,
            limit,
            aftercare,
            asked,
        });
        Self {
            state: State::Checking { check, pending },
        }
    }

    /// A check decided at once: `inner` (the service `poll_ready` readied) is called
    /// now if the request (`head` and `body`) may pass.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn at_once(
        checked: Result<Decision, Error>,
        head: Parts,
        body: ReqBody,
        inner: &mut Inner,
        shared: &Arc<Shared<S, P>>,
        limit: &Limit<S>,
        aftercare: Option<Box<Aftercare<S>>>,
        asked: Option<Asked>,
    ) -> Self {
        let state = decide(checked, head, body, inner, shared, limit, aftercare, asked);
        Self { state }
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

/// Acts on the first check: a denial that a waiting layer holds is handed to its wait
/// ([`hold`]); anything else is the [`verdict`]'s, and `inner` (the readied service) is
/// called when the request passes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn decide<S, P, Inner, ReqBody>(
    checked: Result<Decision, Error>,
    mut head: Parts,
    body: ReqBody,
    inner: &mut Inner,
    shared: &Arc<Shared<S, P>>,
    limit: &Limit<S>,
    aftercare: Option<Box<Aftercare<S>>>,
    asked: Option<Asked>,
) -> State<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>> + Clone,
{
    let checked = match (checked, asked) {
        (Ok(denial), Some(asked)) if !denial.is_allowed() => {
            let request = Request::from_parts(head, body);
            return hold(denial, asked, request, inner, shared, limit, aftercare);
        }
        (checked, _) => checked,
    };
    match verdict(checked, &mut head, &shared.config, limit, aftercare) {
        Verdict::Pass { headers, aftercare } => State::Calling {
            future: inner.call(Request::from_parts(head, body)),
            headers,
            aftercare,
        },
        Verdict::Answer(answer) => State::Answered {
            answer: Some(answer),
        },
    }
}

/// The hand-off to a wait: a denied request on a layer that waits is held for its turn
/// in a place of the layer's, or refused at once (429) when it may not wait.
///
/// The service `poll_ready` readied (`inner`) is given up, so the waiting request holds
/// nothing of it (a concurrency permit, a buffer slot): `inner` becomes a fresh clone
/// for its owner, and the request waits with a clone of its own, readied only once it
/// is admitted.
fn hold<S, P, Inner, ReqBody>(
    denial: Decision,
    asked: Asked,
    request: Request<ReqBody>,
    inner: &mut Inner,
    shared: &Arc<Shared<S, P>>,
    limit: &Limit<S>,
    aftercare: Option<Box<Aftercare<S>>>,
) -> State<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
    Inner: Service<Request<ReqBody>> + Clone,
{
    let config = &shared.config;
    let turn = match (&shared.room, config.over_limit) {
        (Some(room), OverLimit::Wait(wait)) => {
            room.hold(&limit.limiter, asked.subject, asked.cost, denial, &wait)
        }
        _ => Err(denial),
    };
    match turn {
        Ok(turn) => {
            let fresh = inner.clone();
            drop(std::mem::replace(inner, fresh));
            State::Waiting {
                held: Box::new(Held {
                    turn: Some(turn),
                    request: Some(request),
                    inner: inner.clone(),
                    shared: Arc::clone(shared),
                    limit: limit.clone(),
                    aftercare,
                    headers: None,
                }),
            }
        }
        Err(denial) => {
            // Its time is past `max_wait`, or no place is free: refused before anything
            // is made for a wait (a flood over the limit costs what it costs a refusing
            // layer).
            crate::telemetry::waited(&denial, crate::telemetry::WaitOutcome::Refused);
            let (head, _body) = request.into_parts();
            let answer = response::too_many_requests(&head, &denial, config, &limit.headers);
            State::Answered {
                answer: Some(answer),
            }
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
                    let StateOwned::Checking { pending, .. } =
                        state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was Checking a moment ago");
                    };
                    let Pending {
                        request,
                        mut inner,
                        shared,
                        limit,
                        aftercare,
                        asked,
                    } = *pending;
                    let (head, body) = request.into_parts();
                    let next = decide(
                        checked, head, body, &mut inner, &shared, &limit, aftercare, asked,
                    );
                    state.set(next);
                }
                StateProj::Waiting { held } => {
                    if let Some(turn) = &mut held.turn {
                        let waited = ready!(turn.as_mut().poll(cx));
                        held.turn = None;
                        if let Some(answer) = held.admitted(waited) {
                            state.set(State::Done);
                            return Poll::Ready(Ok(answer.map(ResponseBody::full)));
                        }
                    }
                    if let Err(error) = ready!(held.inner.poll_ready(cx)) {
                        state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                    let request = held.request.take().expect("a held request is called once");
                    let future = held.inner.call(request);
                    let (headers, aftercare) = (held.headers.take(), held.aftercare.take());
                    state.set(State::Calling {
                        future,
                        headers,
                        aftercare,
                    });
                }
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
                        headers.write(response.headers_mut());
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

impl<S: Store, P: Plan<S>, Inner, ReqBody> Held<S, P, Inner, ReqBody> {
    /// Acts on how its wait ended as on a first check: admitted, or failed open, it goes
    /// on to readying the inner service (`None`); else its answer (the 429 of its latest
    /// denial, or the failure mode's).
    fn admitted(&mut self, waited: Result<Decision, Error>) -> Option<Answer> {
        let request = self.request.take().expect("a held request waits once");
        let config = &self.shared.config;
        let checked = match waited {
            Ok(denial) if !denial.is_allowed() => {
                let (head, _body) = request.into_parts();
                let policies = &self.limit.headers;
                return Some(response::too_many_requests(
                    &head, &denial, config, policies,
                ));
            }
            checked => checked,
        };
        let (mut head, body) = request.into_parts();
        match verdict(
            checked,
            &mut head,
            config,
            &self.limit,
            self.aftercare.take(),
        ) {
            Verdict::Pass { headers, aftercare } => {
                self.request = Some(Request::from_parts(head, body));
                self.headers = headers;
                self.aftercare = aftercare;
                None
            }
            Verdict::Answer(answer) => Some(answer),
        }
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
