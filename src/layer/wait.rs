//! Waiting instead of refusing ([`OverLimit::Wait`](crate::layer::OverLimit::Wait)): the
//! settings ([`Wait`]), the places a layer counts its waiting requests in ([`Room`],
//! [`Place`]), and what a waiting request does until it is admitted or refused
//! ([`Held`]: its place, its sleep, the checks at its time, then the readying of a clone
//! of the inner service).
//!
//! None of it exists for a layer that does not wait: [`Waits`] is made by
//! [`RateLimitLayer::over_limit`](crate::RateLimitLayer::over_limit), and a request only
//! gets a [`Held`] (one box) once the limiter has denied it.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Request;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::decision::Decision;
use crate::error::Error;
use crate::layer::future::{verdict, Headers, Verdict};
use crate::layer::response::{self, Answer};
use crate::layer::{Aftercare, Config, Limit, OverLimit, Pick, Plan, Shared};
use crate::limiter::{CheckFuture, Limiter};
use crate::store::Store;
use crate::subject::Subject;

/// How long a request over its limit may wait for its turn, and how many may wait at
/// once: the settings of [`OverLimit::Wait`](crate::layer::OverLimit::Wait).
///
/// ```
/// use std::time::Duration;
/// use redlimit::layer::Wait;
///
/// let wait = Wait::up_to(Duration::from_millis(500)).per_subject(4).per_instance(256);
/// assert_eq!(wait.max_wait(), Duration::from_millis(500));
/// ```
///
/// Every value is accepted and means what it says: `per_subject(0)` or
/// `per_instance(0)` lets nobody wait (every request over its limit is refused, as
/// without waiting), `usize::MAX` sets no bound of its own, `Duration::ZERO` holds only
/// a request whose time has already come, and `Duration::MAX` has no deadline (a request
/// waits as long as the limiter says, however long that is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    max_wait: Duration,
    per_subject: usize,
    per_instance: usize,
}

impl Wait {
    /// How many requests of one subject may wait at once on a layer, by default.
    ///
    /// Waiting smooths a short burst over the limit; a subject with more than 16
    /// requests over it at once is a client that does not slow down, and each of its
    /// waiting requests holds a connection and its request on this instance. 16 also
    /// keeps one subject from taking more than a sixty-fourth of the instance's places.
    pub const DEFAULT_PER_SUBJECT: usize = 16;

    /// How many requests may wait at once on a layer, all subjects together, by default.
    ///
    /// Each holds its request (the head and the body not yet read) and about 1 KB of the
    /// layer's own (its box, its timer, its place): 1024 bound the layer's share to about
    /// a megabyte beside the requests, and the connections held to far fewer than a
    /// server's usual file-descriptor limit.
    pub const DEFAULT_PER_INSTANCE: usize = 1024;

    /// Requests whose time comes within `max_wait` of their denial wait for it; the
    /// others are refused. [`Wait::DEFAULT_PER_SUBJECT`] and
    /// [`Wait::DEFAULT_PER_INSTANCE`] bound how many wait.
    pub const fn up_to(max_wait: Duration) -> Self {
        Self {
            max_wait,
            per_subject: Self::DEFAULT_PER_SUBJECT,
            per_instance: Self::DEFAULT_PER_INSTANCE,
        }
    }

    /// How many requests of one subject (of one limiter) may wait at once on the layer;
    /// the next one is refused at once.
    #[must_use]
    pub const fn per_subject(mut self, n: usize) -> Self {
        self.per_subject = n;
        self
    }

    /// How many requests may wait at once on the layer, all subjects together; the next
    /// one is refused at once.
    #[must_use]
    pub const fn per_instance(mut self, n: usize) -> Self {
        self.per_instance = n;
        self
    }

    /// The longest a request waits, counted from its first denial.
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The bound of one subject's waiting requests.
    pub const fn max_per_subject(&self) -> usize {
        self.per_subject
    }

    /// The bound of all waiting requests on the layer.
    pub const fn max_per_instance(&self) -> usize {
        self.per_instance
    }
}

/// A peek of the store, boxed: the one future a waiting request's place needs.
type PeekFuture = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send>>;

fn peek_now<S: Store>(limiter: Arc<Limiter<S>>, subject: Subject, cost: u32) -> PeekFuture {
    Box::pin(async move { limiter.peek(subject, cost).await })
}

/// What a waiting layer shares with its services: the settings and the places.
pub(crate) struct Waits<S> {
    pub(crate) wait: Wait,
    room: Arc<Room>,
    store: std::marker::PhantomData<fn() -> S>,
}

impl<S> Waits<S> {
    pub(crate) fn new(wait: Wait) -> Self {
        Self {
            wait,
            room: Arc::new(Room::default()),
            store: std::marker::PhantomData,
        }
    }
}

impl<S> Clone for Waits<S> {
    fn clone(&self) -> Self {
        Self {
            wait: self.wait,
            room: Arc::clone(&self.room),
            store: std::marker::PhantomData,
        }
    }
}

impl<S> fmt::Debug for Waits<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waits")
            .field("wait", &self.wait)
            .field("waiting", &self.room.waiting.load(Ordering::Relaxed))
            .finish()
    }
}

/// The requests waiting on one layer: how many in all, and per subject of each limiter
/// how many and what they cost together.
#[derive(Default)]
struct Room {
    waiting: AtomicUsize,
    queues: Mutex<HashMap<QueueKey, Queue>>,
}

/// A subject of one limiter (by the limiter's address: a layer's limiters live as long
/// as it does, and a place holds its limiter).
type QueueKey = (usize, Subject);

#[derive(Default)]
struct Queue {
    count: usize,
    cost: u64,
}

/// One waiting request's place: counted from when it starts to wait until it is
/// admitted, refused or dropped.
struct Place {
    room: Arc<Room>,
    key: QueueKey,
    cost: u64,
}

impl Room {
    /// A place for a request of `key` costing `cost`, with the costs of those waiting
    /// ahead of it; `None` when the subject or the layer has no place free.
    fn enter(self: &Arc<Self>, key: QueueKey, cost: u64, wait: &Wait) -> Option<(Place, Ahead)> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < wait.per_instance).then(|| n + 1)
            })
            .ok()?;
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = queues.entry(key.clone()).or_default();
        if queue.count >= wait.per_subject {
            if queue.count == 0 {
                queues.remove(&key);
            }
            drop(queues);
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let ahead = Ahead {
            count: queue.count,
            cost: queue.cost,
        };
        queue.count += 1;
        queue.cost = queue.cost.saturating_add(cost);
        drop(queues);
        let place = Place {
            room: Arc::clone(self),
            key,
            cost,
        };
        Some((place, ahead))
    }
}

/// Those waiting ahead of a request (on its first placing: all who wait; when placed
/// again after a denial at its time: all the others who wait).
#[derive(Debug, Clone, Copy)]
struct Ahead {
    count: usize,
    cost: u64,
}

impl Place {
    /// The others of this subject who wait now.
    fn others(&self) -> Ahead {
        let queues = self
            .room
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let queue = queues.get(&self.key);
        Ahead {
            count: queue.map_or(0, |q| q.count.saturating_sub(1)),
            cost: queue.map_or(0, |q| q.cost.saturating_sub(self.cost)),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut queues = self
            .room
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = queues.get_mut(&self.key) {
            queue.count = queue.count.saturating_sub(1);
            queue.cost = queue.cost.saturating_sub(self.cost);
            if queue.count == 0 {
                queues.remove(&self.key);
            }
        }
        drop(queues);
        self.room.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a wait ended, for the logs and `redlimit_waited_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Admitted at its time.
    Admitted,
    /// Answered 429: no place free, its time beyond its deadline, no runtime to wait on.
    Refused,
    /// The store failed while it waited: the failure mode answered.
    Failed,
    /// Its response future was dropped (the client left) while it waited.
    Cancelled,
}

impl Outcome {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// A request the limiter denied, held until its time: what it waits on now, and
/// everything its answer needs afterwards. Always boxed (a request of a layer that waits
/// becomes one only once it is denied).
pub(crate) struct Held<S: Store, P: Plan<S>, Inner, ReqBody> {
    shared: Arc<Shared<S, P>>,
    limit: Limit<S>,
    subject: Subject,
    cost: u32,
    /// Its first denial plus `max_wait`; `None` when that is beyond any instant.
    deadline: Option<Instant>,
    /// The denial its 429 would carry: the latest, with the time its place would come.
    denial: Decision,
    /// Its place among the waiting; taken when it stops waiting.
    place: Option<Place>,
    request: Option<Request<ReqBody>>,
    aftercare: Option<Box<Aftercare<S>>>,
    /// A clone of the inner service, readied only once the request is admitted.
    inner: Inner,
    stage: Stage<S>,
}

enum Stage<S: Store> {
    /// Asking the store when the costs of those ahead plus its own would fit.
    Placing(PeekFuture),
    Sleeping(Pin<Box<Sleep>>),
    /// The real check at its time.
    Checking(Pin<Box<CheckFuture<S::Future>>>),
    /// Admitted: readying the inner service's clone for the call.
    Readying {
        headers: Option<Headers>,
    },
    Done,
}

/// What a held request came to: the inner call, or the layer's own answer.
pub(crate) enum Settled<F, S> {
    Call {
        future: F,
        headers: Option<Headers>,
        aftercare: Option<Box<Aftercare<S>>>,
    },
    Answer(Answer),
}

type SettleResult<Inner, ReqBody, S> = Result<
    Settled<<Inner as Service<Request<ReqBody>>>::Future, S>,
    <Inner as Service<Request<ReqBody>>>::Error,
>;

/// Whether a denial on this layer may wait at all: the layer waits and the denial's own
/// time comes within `max_wait` (a waiter's place is never earlier than that).
#[inline]
pub(crate) fn may_wait(config: &Config, denial: &Decision) -> bool {
    match config.over_limit {
        OverLimit::Wait(wait) => {
            Duration::from_millis(denial.outcome().retry_after_ms) <= wait.max_wait
        }
        OverLimit::Refuse | OverLimit::Degrade => false,
    }
}

/// What becomes of a request denied on a layer that waits: held, or answered at once.
pub(crate) enum Start<H> {
    Held(H),
    Answer(Answer),
}

/// Starts a denied request's wait, or refuses it at once: no place free, its time beyond
/// `max_wait`, a cost its place makes impossible, or no Tokio runtime to wait on.
/// `inner` is a clone of the inner service, never readied yet.
pub(crate) fn hold<S, P, Inner, ReqBody>(
    denial: Decision,
    request: Request<ReqBody>,
    aftercare: Option<Box<Aftercare<S>>>,
    inner: Inner,
    shared: &Arc<Shared<S, P>>,
    limit: &Limit<S>,
) -> Start<Box<Held<S, P, Inner, ReqBody>>>
where
    S: Store,
    P: Plan<S>,
{
    let config = &shared.config;
    let refuse = |request: Request<ReqBody>, denial: &Decision| {
        crate::telemetry::waited(denial, Outcome::Refused);
        let (head, _body) = request.into_parts();
        Start::Answer(response::too_many_requests(
            &head,
            denial,
            config,
            &limit.headers,
        ))
    };
    let Some(waits) = shared.wait.as_ref() else {
        return refuse(request, &denial);
    };
    if tokio::runtime::Handle::try_current().is_err() {
        // Nothing to wait on: refused as without waiting, never a panic.
        return refuse(request, &denial);
    }
    // The subject again, from the request's head: only a request that waits pays for it.
    let (parts, body) = request.into_parts();
    let subject = match shared.plan.pick(&parts) {
        Pick::Check(_, subject) => subject,
        Pick::Pass | Pick::Reject(_) => {
            return refuse(Request::from_parts(parts, body), &denial);
        }
    };
    let cost = config.cost.of(&parts);
    let request = Request::from_parts(parts, body);
    let now = Instant::now();
    let deadline = now.checked_add(waits.wait.max_wait);
    let key = (Arc::as_ptr(&limit.limiter) as usize, subject.clone());
    let Some((place, ahead)) = waits.room.enter(key, u64::from(cost), &waits.wait) else {
        return refuse(request, &denial);
    };
    let mut held = Held {
        shared: Arc::clone(shared),
        limit: limit.clone(),
        subject,
        cost,
        deadline,
        denial,
        place: Some(place),
        request: Some(request),
        aftercare,
        inner,
        stage: Stage::Done,
    };
    match held.place_behind(ahead, now) {
        Ok(()) => Start::Held(Box::new(held)),
        Err(()) => Start::Answer(held.refused()),
    }
}

impl<S, P, Inner, ReqBody> Held<S, P, Inner, ReqBody>
where
    S: Store,
    P: Plan<S>,
{
    /// Finds its time behind `ahead`, from the denial it holds (denied at `now`): the
    /// denial's own when nobody waits ahead, else when the store says the costs of all
    /// ahead plus its own would fit. `Err` when that can never be, or is past its
    /// deadline.
    fn place_behind(&mut self, ahead: Ahead, now: Instant) -> Result<(), ()> {
        if ahead.count == 0 {
            return self.sleep_for(self.denial.outcome().retry_after_ms, now);
        }
        let total = ahead.cost.saturating_add(u64::from(self.cost));
        // Above what a policy admits at once: its place never comes.
        let total = u32::try_from(total).map_err(drop)?;
        self.limit.limiter.valid_cost(total).map_err(drop)?;
        let peek = peek_now(Arc::clone(&self.limit.limiter), self.subject.clone(), total);
        self.stage = Stage::Placing(peek);
        Ok(())
    }

    /// Sleeps `wait_ms` from `now`, if that ends by the deadline.
    fn sleep_for(&mut self, wait_ms: u64, now: Instant) -> Result<(), ()> {
        let wake = now.checked_add(Duration::from_millis(wait_ms)).ok_or(())?;
        if self.deadline.is_some_and(|deadline| wake > deadline) {
            return Err(());
        }
        self.stage = Stage::Sleeping(Box::pin(tokio::time::sleep_until(wake)));
        Ok(())
    }

    /// Stops waiting: the place is free for the next one, the outcome counted (once).
    fn leave(&mut self, outcome: Outcome) {
        if self.place.take().is_some() {
            crate::telemetry::waited(&self.denial, outcome);
        }
    }

    fn refused(&mut self) -> Answer {
        self.leave(Outcome::Refused);
        self.stage = Stage::Done;
        let request = self.request.take().expect("a held request answers once");
        let (head, _body) = request.into_parts();
        response::too_many_requests(
            &head,
            &self.denial,
            &self.shared.config,
            &self.limit.headers,
        )
    }

    /// Waits for its time, checks, waits again when denied again by its deadline, then
    /// readies the inner service's clone and calls it; or answers (429, or the failure
    /// mode's answer when the store failed).
    pub(crate) fn poll_settle(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<SettleResult<Inner, ReqBody, S>>
    where
        Inner: Service<Request<ReqBody>>,
    {
        loop {
            match &mut self.stage {
                Stage::Placing(peek) => {
                    let peeked = ready!(peek.as_mut().poll(cx));
                    match peeked {
                        Ok(decision) => {
                            let wait_ms = if decision.is_allowed() {
                                0
                            } else {
                                decision.outcome().retry_after_ms
                            };
                            if !decision.is_allowed() {
                                // Its 429 names the time its place would have come.
                                self.denial = decision;
                            }
                            if self.sleep_for(wait_ms, Instant::now()).is_err() {
                                return Poll::Ready(Ok(Settled::Answer(self.refused())));
                            }
                        }
                        Err(error @ Error::Store(_)) => {
                            if let Some(answer) = self.checked(Err(error)) {
                                return Poll::Ready(Ok(Settled::Answer(answer)));
                            }
                        }
                        Err(_) => return Poll::Ready(Ok(Settled::Answer(self.refused()))),
                    }
                }
                Stage::Sleeping(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    let check = self.limit.limiter.check(self.subject.clone(), self.cost);
                    self.stage = Stage::Checking(Box::pin(check));
                }
                Stage::Checking(check) => {
                    let checked = ready!(check.as_mut().poll(cx));
                    match checked {
                        Ok(decision) if !decision.is_allowed() => {
                            // Another instance took the room: its place again, behind
                            // the others who wait, by its deadline.
                            self.denial = decision;
                            let others = self
                                .place
                                .as_ref()
                                .map_or(Ahead { count: 0, cost: 0 }, Place::others);
                            if self.place_behind(others, Instant::now()).is_err() {
                                return Poll::Ready(Ok(Settled::Answer(self.refused())));
                            }
                        }
                        checked => {
                            if let Some(answer) = self.checked(checked) {
                                return Poll::Ready(Ok(Settled::Answer(answer)));
                            }
                        }
                    }
                }
                Stage::Readying { .. } => {
                    ready!(self.inner.poll_ready(cx))?;
                    let Stage::Readying { headers } =
                        std::mem::replace(&mut self.stage, Stage::Done)
                    else {
                        unreachable!("the stage was Readying a moment ago");
                    };
                    let request = self.request.take().expect("a held request is called once");
                    let future = self.inner.call(request);
                    return Poll::Ready(Ok(Settled::Call {
                        future,
                        headers,
                        aftercare: self.aftercare.take(),
                    }));
                }
                Stage::Done => panic!("redlimit held request polled after it settled"),
            }
        }
    }

    /// Acts on the check (or the failure) at its time as on a first check: allowed or
    /// failed open, it goes on to readying the inner service (`None`); else its answer.
    fn checked(&mut self, checked: Result<Decision, Error>) -> Option<Answer> {
        let outcome = if checked.is_ok() {
            Outcome::Admitted
        } else {
            Outcome::Failed
        };
        self.leave(outcome);
        let request = self.request.take().expect("a held request is checked once");
        let aftercare = self.aftercare.take();
        match verdict(
            checked,
            request,
            &self.shared.config,
            &self.limit,
            aftercare,
            false,
        ) {
            Verdict::Pass {
                request,
                headers,
                aftercare,
            } => {
                self.request = Some(request);
                self.aftercare = aftercare;
                self.stage = Stage::Readying { headers };
                None
            }
            Verdict::Answer(answer) => {
                self.stage = Stage::Done;
                Some(answer)
            }
            Verdict::Over {
                decision, request, ..
            } => {
                // Not asked for (`may_wait` is false): answered as a denial.
                self.request = Some(request);
                self.denial = decision;
                Some(self.refused())
            }
        }
    }
}

impl<S: Store, P: Plan<S>, Inner, ReqBody> Drop for Held<S, P, Inner, ReqBody> {
    fn drop(&mut self) {
        // Dropped while it waits (the client left): its place is free at once.
        self.leave(Outcome::Cancelled);
    }
}
