//! `OverLimit::Wait`: requests over their limit held until their place comes, on paused
//! Tokio time with a store clock that follows it (`TokioClock`), or a fake store clock
//! moved with `tokio::time::advance`. Never a real sleep.
//!
//! The promises: a waiter's place is counted when it starts to wait (the k-th waits for
//! `cost × (k+1)`, so no two wake for one slot), only what fits within `max_wait` waits,
//! the store decides every admission (never past the limit), the bounds refuse at once,
//! a waiter holds nothing of the inner service and frees its place when dropped, a
//! waiter denied again at its time waits again or is refused by its deadline, a store
//! failure while waiting takes the failure mode, gRPC waits alike, and Redis waits as
//! memory does.

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use redlimit::clock::FakeClock;
use redlimit::internals::{AdminStore, Backend, CheckNow, Operation, PolicySet};
use redlimit::layer::{FailureMode, OverLimit, Wait};
use redlimit::store::{StoreError, StoreErrorKind};
use redlimit::{Decision, Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
use tokio::task::JoinHandle;
use tower::{ServiceBuilder, ServiceExt};
use tower_service::Service;

use crate::support::layer::*;
use crate::support::RedisServer;

const S: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn waiting(max_wait_ms: u64) -> OverLimit {
    OverLimit::Wait(Wait::up_to(ms(max_wait_ms)))
}

/// The handler: answers 200 with the time it ran (ms of `clock` since it was made) in
/// `x-at`, and the remaining units of its decision in `x-remaining`.
fn stamping(clock: TokioClock) -> impl Handler {
    tower::service_fn(move |req: Request<Empty<Bytes>>| {
        let decision = req.extensions().get::<Decision>().cloned().unwrap();
        let mut response = Response::new(Full::from("ok"));
        response
            .headers_mut()
            .insert("x-at", clock.elapsed_ms().into());
        response
            .headers_mut()
            .insert("x-origin", decision.origin().as_str().parse().unwrap());
        assert!(decision.is_allowed(), "the handler only sees admissions");
        std::future::ready(Ok(response))
    })
}

/// The handler's service type.
trait Handler:
    Service<
        Request<Empty<Bytes>>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future = Ready<Result<Response<Full<Bytes>>, Infallible>>,
    > + Clone
    + Send
    + 'static
{
}

impl<T> Handler for T where
    T: Service<
            Request<Empty<Bytes>>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
            Future = Ready<Result<Response<Full<Bytes>>, Infallible>>,
        > + Clone
        + Send
        + 'static
{
}

/// What one request came to: its status, when it was admitted (the handler's time) or
/// answered (the layer's own answer), and its `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answered {
    status: StatusCode,
    at_ms: u64,
    retry_after: Option<String>,
    grpc_status: Option<String>,
}

/// Sends `n` requests made by `make` one after the other (each `call` made before the
/// next, so a store that decides at once decides them in order), each awaited in a task
/// of its own.
async fn burst<Svc, B>(
    svc: &Svc,
    clock: &TokioClock,
    make: impl Fn() -> Request<Empty<Bytes>>,
    n: usize,
) -> Vec<JoinHandle<Answered>>
where
    Svc: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    Svc::Future: Send + 'static,
    B: Send + 'static,
{
    let mut handles = Vec::new();
    for _ in 0..n {
        let mut svc = svc.clone();
        svc.ready().await.unwrap();
        let future = svc.call(make());
        let clock = clock.clone();
        handles.push(tokio::spawn(async move {
            let response = future.await.unwrap();
            let h = response.headers();
            let at_ms = match header(h, "x-at") {
                Some(at) => at.parse().unwrap(),
                None => clock.elapsed_ms(),
            };
            Answered {
                status: response.status(),
                at_ms,
                retry_after: header(h, "retry-after").map(str::to_owned),
                grpc_status: header(h, "grpc-status").map(str::to_owned),
            }
        }));
    }
    handles
}

async fn all(handles: Vec<JoinHandle<Answered>>) -> Vec<Answered> {
    let mut answers = Vec::new();
    for handle in handles {
        answers.push(handle.await.unwrap());
    }
    answers
}

fn ok_at(at_ms: u64) -> Answered {
    Answered {
        status: StatusCode::OK,
        at_ms,
        retry_after: None,
        grpc_status: None,
    }
}

fn refused_at(at_ms: u64, retry_after: &str) -> Answered {
    Answered {
        status: StatusCode::TOO_MANY_REQUESTS,
        at_ms,
        retry_after: Some(retry_after.to_owned()),
        grpc_status: None,
    }
}

fn admitted_times(answers: &[Answered]) -> Vec<u64> {
    let mut times: Vec<u64> = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .map(|a| a.at_ms)
        .collect();
    times.sort_unstable();
    times
}

/// A token bucket of `capacity` refilled one every `interval_ms` never admits more than
/// `capacity + span / interval` within any span.
fn assert_within_token_bucket(times: &[u64], capacity: u64, interval_ms: u64) {
    for i in 0..times.len() {
        for j in i..times.len() {
            let admitted = (j - i + 1) as u64;
            let allowed = capacity + (times[j] - times[i]) / interval_ms;
            assert!(
                admitted <= allowed,
                "{admitted} admitted in [{}, {}] ms: {times:?}",
                times[i],
                times[j]
            );
        }
    }
}

/// A fixed window never admits more than `limit` in one window (`base_ms` is the store
/// time at test time 0).
fn assert_within_fixed_windows(times: &[u64], base_ms: u64, limit: usize, window_ms: u64) {
    let mut per_window = std::collections::BTreeMap::<u64, usize>::new();
    for t in times {
        *per_window.entry((base_ms + t) / window_ms).or_default() += 1;
    }
    assert!(
        per_window.values().all(|&n| n <= limit),
        "{per_window:?} from {times:?}"
    );
}

/// A sliding window counter admits only while `prev × (1 − elapsed/window) + cur ≤
/// limit`, at every admission.
fn assert_within_sliding_window(times: &[u64], base_ms: u64, limit: u64, window_ms: u64) {
    for (i, t) in times.iter().enumerate() {
        let now = base_ms + t;
        let window = now / window_ms;
        let up_to = &times[..=i];
        let count = |w: u64| {
            up_to
                .iter()
                .filter(|u| (base_ms + **u) / window_ms == w)
                .count() as u64
        };
        let (prev, cur) = (window.checked_sub(1).map_or(0, count), count(window));
        let elapsed = now % window_ms;
        assert!(
            prev * (window_ms - elapsed) + cur * window_ms <= limit * window_ms,
            "admission {i} at {t} ms: prev {prev}, cur {cur}: {times:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_bucket_burst_admits_10_at_once_5_each_at_its_own_slot_and_refuses_the_rest() {
    // 10 tokens, one more every 100 ms, 500 ms of waiting: 20 at once get 10 at once,
    // then one at each of 100, 200, 300, 400, 500 ms (the k-th waiter at the time
    // cost × (k+1) fits), and 5 refused at once (their places would come at 600 ms and
    // later). Each waiter is checked once: none wakes for a slot another took.
    let clock = TokioClock::at(1_000_000);
    let store = Counting::new(MemoryStore::with_clock(clock.clone()));
    let (checks, peeks) = (store.checks(), store.peeks());
    let limiter = Limiter::new(store, Policy::token_bucket("tb", 10, 10, S).unwrap());
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));

    let answers = all(burst(&svc, &clock, || request("alice"), 20).await).await;
    let mut expected: Vec<Answered> = (0..10).map(|_| ok_at(0)).collect();
    expected.extend((1..=5).map(|k| ok_at(k * 100)));
    expected.extend((0..5).map(|_| refused_at(0, "1")));
    assert_eq!(answers, expected);
    assert_within_token_bucket(&admitted_times(&answers), 10, 100);
    // 20 first checks and one check per waiter at its time; a peek for each over-limit
    // request but the first (the first's time is its denial's).
    assert_eq!(checks.load(Ordering::SeqCst), 20 + 5);
    assert_eq!(peeks.load(Ordering::SeqCst), 9);
}

#[tokio::test(start_paused = true)]
async fn a_fixed_window_waiter_is_admitted_when_the_next_window_begins_within_max_wait() {
    // 600 ms into a window of 10/s: the next one begins in 400 ms, within the 500 ms
    // of waiting. 25 at once: 10 now, the next 10 (all the next window admits) at
    // 400 ms, and 5 refused at once: 11 never fit in one window.
    let base = 10_600;
    let clock = TokioClock::at(base);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        fixed("fw", 10, 1_000),
    );
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));

    let answers = all(burst(&svc, &clock, || request("alice"), 25).await).await;
    let mut expected: Vec<Answered> = (0..10).map(|_| ok_at(0)).collect();
    expected.extend((0..10).map(|_| ok_at(400)));
    expected.extend((0..5).map(|_| refused_at(0, "1")));
    assert_eq!(answers, expected);
    assert_within_fixed_windows(&admitted_times(&answers), base, 10, 1_000);
}

#[tokio::test(start_paused = true)]
async fn a_fixed_window_refuses_at_once_when_the_next_window_begins_after_max_wait() {
    // 250 ms into the window: the next begins in 750 ms, past the 500 ms of waiting.
    let base = 10_250;
    let clock = TokioClock::at(base);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        fixed("fw", 10, 1_000),
    );
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));

    let answers = all(burst(&svc, &clock, || request("alice"), 20).await).await;
    let mut expected: Vec<Answered> = (0..10).map(|_| ok_at(0)).collect();
    expected.extend((0..10).map(|_| refused_at(0, "1")));
    assert_eq!(answers, expected);
    assert_within_fixed_windows(&admitted_times(&answers), base, 10, 1_000);
}

#[tokio::test(start_paused = true)]
async fn a_sliding_window_waiter_is_admitted_when_the_weighted_count_leaves_it_room() {
    // 900 ms into a window of 10/s, with nothing before: 10 now. Then the previous
    // window's 10 weigh 10 × (1 − elapsed/1000): the k-th waiter fits once that leaves
    // room for k+1, at 1000 + 100 (k+1) ms, so 200, 300, 400, 500 ms from now.
    let base = 10_900;
    let clock = TokioClock::at(base);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Policy::sliding_window("sw", 10, S).unwrap(),
    );
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));

    let answers = all(burst(&svc, &clock, || request("alice"), 20).await).await;
    let statuses: Vec<_> = answers.iter().map(|a| (a.status, a.at_ms)).collect();
    let mut expected: Vec<_> = (0..10).map(|_| (StatusCode::OK, 0)).collect();
    expected.extend((0..4).map(|k| (StatusCode::OK, 200 + 100 * k)));
    expected.extend((0..6).map(|_| (StatusCode::TOO_MANY_REQUESTS, 0)));
    assert_eq!(statuses, expected);
    assert_within_sliding_window(&admitted_times(&answers), base, 10, 1_000);
}

#[tokio::test(start_paused = true)]
async fn the_one_over_the_subject_s_or_the_layer_s_bound_is_refused_at_once() {
    let clock = TokioClock::at(0);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Policy::token_bucket("tb", 10, 10, S).unwrap(),
    );
    // Per subject: 2 of alice wait, her third is refused although its time (300 ms)
    // is within max_wait.
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(OverLimit::Wait(
        Wait::up_to(ms(500)).per_subject(2).per_instance(3),
    ));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));
    let alice = burst(&svc, &clock, || request("alice"), 13).await;
    // Per layer: bob's first waiter takes the third place; his second finds none.
    let bob = burst(&svc, &clock, || request("bob"), 12).await;
    let (alice, bob) = (all(alice).await, all(bob).await);
    let mut expected: Vec<Answered> = (0..10).map(|_| ok_at(0)).collect();
    expected.extend([ok_at(100), ok_at(200), refused_at(0, "1")]);
    assert_eq!(alice, expected);
    let mut expected: Vec<Answered> = (0..10).map(|_| ok_at(0)).collect();
    expected.extend([ok_at(100), refused_at(0, "1")]);
    assert_eq!(bob, expected);
}

#[tokio::test(start_paused = true)]
async fn zero_places_or_no_time_to_wait_is_refusing() {
    let clock = TokioClock::at(0);
    let policy = Policy::token_bucket("tb", 1, 1, ms(100)).unwrap();
    for wait in [
        Wait::up_to(ms(500)).per_subject(0),
        Wait::up_to(ms(500)).per_instance(0),
        Wait::up_to(Duration::ZERO),
    ] {
        let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()), policy.clone());
        let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(OverLimit::Wait(wait));
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service(stamping(clock.clone()));
        let answers = all(burst(&svc, &clock, || request("a"), 2).await).await;
        assert_eq!(answers, [ok_at(0), refused_at(0, "1")], "{wait:?}");
    }
    // No bound at all: every value means something, nothing overflows. (Capacity 4:
    // the k-th waiter's place is where 4 tokens fit at most, so 4 wait.)
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Policy::token_bucket("tb", 4, 10, S).unwrap(),
    );
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(OverLimit::Wait(
        Wait::up_to(Duration::MAX)
            .per_subject(usize::MAX)
            .per_instance(usize::MAX),
    ));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));
    let start = clock.elapsed_ms();
    let answers = all(burst(&svc, &clock, || request("a"), 9).await).await;
    let got: Vec<_> = answers
        .iter()
        .map(|a| (a.status, a.at_ms - start))
        .collect();
    let mut expected: Vec<_> = (0..4).map(|_| (StatusCode::OK, 0)).collect();
    expected.extend((1..=4).map(|k| (StatusCode::OK, k * 100)));
    // A fifth waiter would need 5 tokens to fit at once: more than the bucket holds.
    expected.push((StatusCode::TOO_MANY_REQUESTS, 0));
    assert_eq!(got, expected);
}

/// An inner service that counts how many of its instances hold a readiness they have
/// not spent (polled ready, not yet called, not dropped). A clone is not ready, as
/// tower's services' clones are not.
struct CountsReadies {
    held: Arc<AtomicUsize>,
    readied: bool,
    clock: TokioClock,
}

impl Service<Request<Empty<Bytes>>> for CountsReadies {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if !self.readied {
            self.readied = true;
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Empty<Bytes>>) -> Self::Future {
        assert!(self.readied, "called without poll_ready");
        self.readied = false;
        self.held.fetch_sub(1, Ordering::SeqCst);
        let mut inner = stamping(self.clock.clone());
        inner.call(req)
    }
}

impl Clone for CountsReadies {
    fn clone(&self) -> Self {
        Self {
            held: Arc::clone(&self.held),
            readied: false,
            clock: self.clock.clone(),
        }
    }
}

impl Drop for CountsReadies {
    fn drop(&mut self) {
        if self.readied {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_holds_nothing_of_the_inner_service() {
    // Decided at once (memory) and decided later (a store answering a poll late): the
    // readiness `poll_ready` gave is given up when the request starts to wait, and a
    // clone is readied only once it is admitted.
    let clock = TokioClock::at(0);
    let policy = Policy::token_bucket("tb", 1, 1, ms(100)).unwrap();
    let memory = Limiter::new(MemoryStore::with_clock(clock.clone()), policy.clone());
    let slow = Limiter::new(
        SlowStore(MemoryStore::with_clock(clock.clone())),
        policy.clone(),
    );
    let held = Arc::new(AtomicUsize::new(0));
    let inner = CountsReadies {
        held: Arc::clone(&held),
        readied: false,
        clock: clock.clone(),
    };
    let memory = ServiceBuilder::new()
        .layer(RateLimitLayer::new(memory, UserHeader).over_limit(waiting(500)))
        .service(inner.clone());
    let slow = ServiceBuilder::new()
        .layer(RateLimitLayer::new(slow, UserHeader).over_limit(waiting(500)))
        .service(inner);
    holds_nothing_while_waiting("memory", memory, &held, &clock).await;
    holds_nothing_while_waiting("slow", slow, &held, &clock).await;
}

/// The second of two requests waits on `svc`, kept alive meanwhile: no instance of the
/// inner service holds a readiness until it is admitted at 100 ms.
async fn holds_nothing_while_waiting<Svc, B>(
    name: &str,
    mut svc: Svc,
    held: &AtomicUsize,
    clock: &TokioClock,
) where
    Svc: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = Infallible>,
    Svc::Future: Unpin,
{
    let start = clock.elapsed_ms();
    svc.ready().await.unwrap();
    let first = svc.call(request(name)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    svc.ready().await.unwrap();
    let mut second = svc.call(request(name));
    for _ in 0..3 {
        assert!(poll_once(&mut second).is_none(), "{name}: still waiting");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        held.load(Ordering::SeqCst),
        0,
        "{name}: a readiness is held"
    );
    let second = second.await.unwrap();
    assert_eq!(second.status(), StatusCode::OK, "{name}");
    let at: u64 = header(second.headers(), "x-at").unwrap().parse().unwrap();
    assert_eq!(at - start, 100, "{name}");
    assert_eq!(held.load(Ordering::SeqCst), 0, "{name}");
    drop(svc);
}

/// Polls a future once with a waker that does nothing; `Some` if it completed.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    match std::pin::Pin::new(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_limit_of_one_serves_others_while_a_request_waits() {
    // The inner service admits one call at a time: the waiting request must not sit on
    // its permit, or bob (within his limit) would wait for alice's turn.
    let clock = TokioClock::at(0);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Policy::token_bucket("tb", 1, 1, ms(100)).unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500)))
        .concurrency_limit(1)
        .service(stamping(clock.clone()));
    let alice = all(burst(&svc, &clock, || request("alice"), 1).await).await;
    assert_eq!(alice, [ok_at(0)]);
    // Alice's second waits; the service that readied for it stays alive meanwhile.
    let mut alices = svc.clone();
    alices.ready().await.unwrap();
    let waiting_alice = tokio::spawn(alices.call(request("alice")));
    let bob = tokio::time::timeout(ms(50), async {
        all(burst(&svc, &clock, || request("bob"), 1).await).await
    })
    .await;
    assert_eq!(bob.ok(), Some(vec![ok_at(0)]), "bob is served at once");
    let alice = waiting_alice.await.unwrap().unwrap();
    assert_eq!(header(alice.headers(), "x-at"), Some("100"));
    drop(alices);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiting_request_frees_its_place_at_once() {
    let clock = TokioClock::at(0);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Policy::token_bucket("tb", 1, 1, ms(100)).unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter, UserHeader)
                .over_limit(OverLimit::Wait(Wait::up_to(ms(500)).per_subject(1))),
        )
        .service(stamping(clock.clone()));
    let mut svc2 = svc.clone();
    assert_eq!(
        svc.clone().oneshot(request("a")).await.unwrap().status(),
        StatusCode::OK
    );
    // The one place is taken: the next is refused at once.
    svc2.ready().await.unwrap();
    let waiter = svc2.call(request("a"));
    let refused = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Its client leaves: the place is free for the next, which waits its time.
    drop(waiter);
    let next = all(burst(&svc, &clock, || request("a"), 1).await).await;
    assert_eq!(next, [ok_at(100)]);
}

/// Lets every task that can run, run.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn denied_again_at_its_time_it_waits_again_or_is_refused_by_its_deadline() {
    // Two limiters of one policy on one store: two instances of a service. The store's
    // clock is moved by hand, with Tokio's.
    for (max_wait, waits_again) in [(500, true), (150, false)] {
        let clock = FakeClock::new(0);
        let store = MemoryStore::with_clock(clock.clone());
        let policy = Policy::token_bucket("tb", 10, 10, S).unwrap();
        let other = Limiter::new(store.clone(), policy.clone());
        let start = tokio::time::Instant::now();
        let svc = ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(Limiter::new(store, policy), UserHeader)
                    .over_limit(waiting(max_wait)),
            )
            .service_fn(hello);
        for _ in 0..10 {
            let ok = svc.clone().oneshot(request("alice")).await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK);
        }
        // Denied at 0 ms; its place comes at 100 ms.
        let waiter = tokio::spawn(svc.clone().oneshot(request("alice")));
        settle().await;
        assert!(!waiter.is_finished());
        // At 100 ms the other instance takes the token first.
        clock.set_ms(100);
        assert!(other.check("alice", 1).await.unwrap().is_allowed());
        tokio::time::advance(ms(100)).await;
        settle().await;
        // Denied at its time: its next place is at 200 ms, within 500 ms of its first
        // denial but not within 150.
        if waits_again {
            assert!(!waiter.is_finished(), "waits again");
            clock.set_ms(200);
            tokio::time::advance(ms(100)).await;
            settle().await;
            assert!(waiter.is_finished(), "admitted at 200 ms");
            let response = waiter.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(start.elapsed(), ms(200));
        } else {
            assert!(waiter.is_finished(), "refused by its deadline");
            let response = waiter.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            // The denial at its time: the next token in 100 ms.
            assert_eq!(header(response.headers(), "retry-after"), Some("1"));
            assert_eq!(start.elapsed(), ms(100));
        }
    }
}

/// A memory store that fails every call once told to.
#[derive(Clone)]
struct Failing {
    store: MemoryStore,
    failing: Arc<AtomicBool>,
}

impl Failing {
    fn answer(&self, decided: Decision) -> Result<Decision, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            Err(StoreError::new(StoreErrorKind::Unavailable, "gone"))
        } else {
            Ok(decided)
        }
    }
}

impl Backend for Failing {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        let decided = self.store.check(subject, set, cost).into_inner().unwrap();
        std::future::ready(self.answer(decided))
    }

    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        CheckNow::Decided(self.check(subject, set, cost).into_inner())
    }
}

impl AdminStore for Failing {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        let decided = self.store.run(op, subject, set, cost).into_inner().unwrap();
        std::future::ready(self.answer(decided))
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_while_waiting_takes_the_failure_mode_never_a_429() {
    for mode in [FailureMode::Open, FailureMode::Closed] {
        let clock = TokioClock::at(0);
        let store = Failing {
            store: MemoryStore::with_clock(clock.clone()),
            failing: Arc::new(AtomicBool::new(false)),
        };
        let failing = Arc::clone(&store.failing);
        let limiter = Limiter::new(store, Policy::token_bucket("tb", 1, 1, ms(100)).unwrap());
        let svc = ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(limiter, UserHeader)
                    .over_limit(waiting(500))
                    .failure_mode(mode),
            )
            .service(stamping(clock.clone()));
        let first = all(burst(&svc, &clock, || request("a"), 1).await).await;
        assert_eq!(first, [ok_at(0)]);
        let waiter = burst(&svc, &clock, || request("a"), 1).await;
        failing.store(true, Ordering::SeqCst);
        let answer = all(waiter).await.remove(0);
        match mode {
            // Let through unchecked (the handler sees a fail-open decision).
            FailureMode::Open => assert_eq!(answer, ok_at(100)),
            _ => {
                assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(answer.retry_after.as_deref(), Some("1"));
                assert_eq!(answer.at_ms, 100, "answered at its time");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_grpc_request_waits_the_same_way() {
    let clock = TokioClock::at(0);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Policy::token_bucket("tb", 1, 1, ms(100)).unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(150)))
        .service(stamping(clock.clone()));
    let grpc = || {
        let mut request = request("g");
        request
            .headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        request
    };
    let answers = all(burst(&svc, &clock, grpc, 3).await).await;
    assert_eq!(answers[..2], [ok_at(0), ok_at(100)]);
    // The third's place (200 ms) is past 150 ms: RESOURCE_EXHAUSTED at once.
    assert_eq!(answers[2].status, StatusCode::OK);
    assert_eq!(answers[2].grpc_status.as_deref(), Some("8"));
    assert_eq!(answers[2].at_ms, 0);
}

#[test]
fn outside_a_tokio_runtime_a_request_over_its_limit_is_refused_not_a_panic() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock),
        Policy::token_bucket("tb", 1, 1, ms(100)).unwrap(),
    );
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500)))
        .service_fn(hello);
    let mut send = || {
        let mut ready = pin!(std::future::poll_fn(|cx| svc.poll_ready(cx)));
        assert!(ready
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready());
        let mut response = pin!(svc.call(request("a")));
        match response
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(response) => response.unwrap().status(),
            Poll::Pending => panic!("answered at once"),
        }
    };
    assert_eq!(send(), StatusCode::OK);
    assert_eq!(send(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn on_redis_a_token_bucket_burst_admits_each_waiter_at_its_own_slot() {
    // The acceptance case on a real Redis, the store's clock following Tokio's paused
    // time. A blocking task keeps Tokio from advancing time by itself while Redis
    // answers (its round trips are real time); the test moves time by hand.
    let server = RedisServer::start();
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let inhibitor = tokio::task::spawn_blocking(move || {
        let _ = held.recv();
    });
    let clock = TokioClock::at(5_000_000);
    let store = server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(3_600));
    let limiter = Limiter::new(store, Policy::token_bucket("tb", 10, 10, S).unwrap());
    let layer = RateLimitLayer::new(limiter, UserHeader).over_limit(waiting(500));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));

    let handles = burst(&svc, &clock, || request("alice"), 20).await;
    let done =
        |handles: &[JoinHandle<Answered>]| handles.iter().filter(|h| h.is_finished()).count();
    // Lets Redis answer (real time) until `n` are done, or fails after 10 s.
    async fn until(handles: &[JoinHandle<Answered>], n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while handles.iter().filter(|h| h.is_finished()).count() < n {
            assert!(std::time::Instant::now() < deadline, "stuck before {n}");
            tokio::task::yield_now().await;
        }
        // The waiters still pending have all placed themselves by now.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }
    until(&handles, 15).await;
    for step in 1..=6 {
        tokio::time::advance(ms(100)).await;
        until(&handles, (15 + step).min(20)).await;
        assert_eq!(done(&handles), (15 + step).min(20), "at {} ms", step * 100);
    }
    let answers = all(handles).await;
    let mut statuses: Vec<_> = answers.iter().map(|a| (a.status, a.at_ms)).collect();
    statuses.sort();
    let mut expected: Vec<_> = (0..10).map(|_| (StatusCode::OK, 0)).collect();
    expected.extend((1..=5).map(|k| (StatusCode::OK, k * 100)));
    expected.extend((0..5).map(|_| (StatusCode::TOO_MANY_REQUESTS, 0)));
    expected.sort();
    assert_eq!(statuses, expected);
    assert!(answers
        .iter()
        .all(|a| a.status != StatusCode::OK || a.retry_after.is_none()));
    assert_within_token_bucket(&admitted_times(&answers), 10, 100);
    drop(hold);
    inhibitor.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_runs_its_key_and_its_cost_function_once() {
    // Decided at once (memory) and later (a store answering a poll late): the wait
    // uses the subject and the cost found in `call`.
    let clock = TokioClock::at(0);
    runs_key_and_cost_once("memory", MemoryStore::with_clock(clock.clone()), &clock).await;
    let slow = SlowStore(MemoryStore::with_clock(clock.clone()));
    runs_key_and_cost_once("slow", slow, &clock).await;
}

/// Two requests of cost 2 on a bucket of 2 refilled one every 100 ms: the second waits
/// 200 ms (the wait carries its cost), and each request ran the key and the cost
/// function once.
async fn runs_key_and_cost_once<S: redlimit::store::Store>(
    name: &str,
    store: S,
    clock: &TokioClock,
) {
    use redlimit::key::KeyExtractor;

    let (keys, costs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let key = {
        let keys = Arc::clone(&keys);
        redlimit::key::from_fn(move |parts| {
            keys.fetch_add(1, Ordering::SeqCst);
            UserHeader.extract(parts)
        })
    };
    let cost = {
        let costs = Arc::clone(&costs);
        move |_: &http::request::Parts| {
            costs.fetch_add(1, Ordering::SeqCst);
            2
        }
    };
    let limiter = Limiter::new(store, Policy::token_bucket("tb", 2, 1, ms(100)).unwrap());
    let layer = RateLimitLayer::new(limiter, key)
        .cost_fn(cost)
        .over_limit(waiting(500));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(stamping(clock.clone()));
    let start = clock.elapsed_ms();
    let answers = all(burst(&svc, clock, || request(name), 2).await).await;
    assert_eq!(answers, [ok_at(start), ok_at(start + 200)], "{name}");
    assert_eq!(
        keys.load(Ordering::SeqCst),
        2,
        "{name}: the key once a request"
    );
    assert_eq!(
        costs.load(Ordering::SeqCst),
        2,
        "{name}: the cost once a request"
    );
}
