//! Reserve then settle (`RateLimitLayer::settle`), through the layer, on the memory
//! store and on a real Redis, on a fake clock and without sleeps: the reservation
//! counts while the body streams, the settlement (a refund of the rest, a charge of
//! the excess past the limit) comes when the body ends or is dropped, or the handler
//! panics; it goes where the reservation went (the store, the fallback, nowhere for a
//! fail-open request); a refund lifts this instance's cached denial; leases keep the
//! totals within the debt bound; `refund_on` gives the whole reservation back.

use std::convert::Infallible;
use std::future::Ready;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Extension;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use redlimit::clock::{Clock, FakeClock};
use redlimit::internals::{AdminStore, Backend, CheckNow, Operation, PolicySet};
use redlimit::layer::{OverLimit, ResponseBody, Usage};
use redlimit::lease::Leases;
use redlimit::store::{Store, StoreError};
use redlimit::{Decision, Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore, Subject};
use tokio::sync::mpsc;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::support::layer::{header, request, BrokenStore, UserHeader};
use crate::support::props::Lcg;
use crate::support::RedisServer;

/// A whole minute, aligned to the window, so every test starts a fresh window.
const T0: u64 = 1_700_000_040_000;
const MINUTE: Duration = Duration::from_secs(60);

/// The issue's limit: 1000 tokens a minute, sliding.
fn tokens_per_minute() -> Policy {
    Policy::sliding_window("tokens", 1_000, MINUTE).unwrap()
}

/// A handler's body: each amount the test sends is added to the request's [`Usage`]
/// as the body yields it (the cost counted as the response streams); it ends when the
/// test drops the sender.
#[derive(Debug)]
struct Metered {
    amounts: mpsc::Receiver<u64>,
    usage: Option<Usage>,
}

impl Body for Metered {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.amounts.poll_recv(cx).map(|amount| {
            amount.map(|n| {
                if let Some(usage) = &self.usage {
                    usage.add(n);
                }
                Ok(Frame::data(Bytes::from(n.to_string())))
            })
        })
    }
}

/// The senders of the streaming bodies, in the order their handlers ran.
#[derive(Clone, Default)]
struct Streams(Arc<Mutex<Vec<mpsc::Sender<u64>>>>);

impl Streams {
    /// The sender of the last streaming body made.
    fn last(&self) -> mpsc::Sender<u64> {
        self.0.lock().unwrap().pop().expect("no streaming body")
    }
}

/// The request's wishes, in headers: `x-reserve` (the cost reserved, 1 without),
/// `x-used` (reported at the head), `x-stream` (a body fed by the test), `x-panic`
/// (`before` or `after` the report), `x-status` (the response's status).
fn ask(user: &str, reserve: u32, used: Option<u64>) -> Request<Empty<Bytes>> {
    let mut req = request(user);
    req.headers_mut().insert("x-reserve", reserve.into());
    if let Some(used) = used {
        req.headers_mut().insert("x-used", used.into());
    }
    req
}

fn with(mut req: Request<Empty<Bytes>>, name: &'static str, value: &str) -> Request<Empty<Bytes>> {
    req.headers_mut().insert(name, value.parse().unwrap());
    req
}

async fn handler(
    streams: Streams,
    req: Request<Empty<Bytes>>,
) -> Result<Response<Metered>, Infallible> {
    let usage = req.extensions().get::<Usage>().cloned();
    let wants = |name: &str| req.headers().get(name).map(|v| v.to_str().unwrap());
    if wants("x-panic") == Some("before") {
        panic!("the handler failed before reporting");
    }
    if let (Some(usage), Some(used)) = (&usage, wants("x-used")) {
        usage.report(used.parse().unwrap());
    }
    if wants("x-panic") == Some("after") {
        panic!("the handler failed after reporting");
    }
    let (tx, amounts) = mpsc::channel(8);
    if wants("x-stream").is_some() {
        streams.0.lock().unwrap().push(tx);
    }
    let origin = req.extensions().get::<Decision>().map(|d| d.origin());
    let mut response = Response::new(Metered { amounts, usage });
    if let Some(origin) = origin {
        let origin = format!("{origin:?}");
        response
            .headers_mut()
            .insert("x-origin", origin.parse().unwrap());
    }
    if let Some(status) = wants("x-status") {
        *response.status_mut() = StatusCode::from_bytes(status.as_bytes()).unwrap();
    }
    Ok(response)
}

type Answer = Response<ResponseBody<Metered>>;

/// The layer that settles, over `limiter`, reserving `x-reserve`; `refunding` adds
/// `refund_on(5xx)`.
fn service<S: Store + Sync>(
    limiter: &Arc<Limiter<S>>,
    streams: &Streams,
    refunding: bool,
) -> impl Service<Request<Empty<Bytes>>, Response = Answer, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    let mut layer = RateLimitLayer::from_shared(Arc::clone(limiter), UserHeader)
        .cost_fn(|parts| {
            parts
                .headers
                .get("x-reserve")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .settle();
    if refunding {
        layer = layer.refund_on(|s| s.is_server_error());
    }
    let streams = streams.clone();
    ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |req| handler(streams.clone(), req))
}

/// Reads a response's body to its end.
async fn read_to_end(response: Answer) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

/// The tokens `user` has left: a peek of 1 answers what is left after that 1.
async fn left<S: Store>(limiter: &Limiter<S>, user: &str) -> u64 {
    let peek = limiter.peek(user, 1).await.unwrap();
    if peek.is_allowed() {
        peek.remaining() + 1
    } else {
        0
    }
}

/// Waits (a bounded number of turns of the runtime, no sleep) until `user` has
/// `expected` tokens left: a settlement in Redis runs as a task of its own.
async fn settles_to<S: Store>(limiter: &Limiter<S>, user: &str, expected: u64) {
    for _ in 0..100 {
        if left(limiter, user).await == expected {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(left(limiter, user).await, expected, "{user}");
}

/// Lets any settlement task run and its call reach the store before the next one: a
/// few turns of the runtime, then a round trip behind it.
async fn quiesce<S: Store>(limiter: &Limiter<S>) {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    limiter.peek("~quiesce", 1).await.unwrap();
}

/// Asserts `user` keeps `expected` tokens left over several turns and round trips: no
/// settlement is on its way.
async fn stays_at<S: Store>(limiter: &Limiter<S>, user: &str, expected: u64) {
    for _ in 0..5 {
        quiesce(limiter).await;
        assert_eq!(left(limiter, user).await, expected, "{user}");
    }
}

fn memory(clock: &FakeClock, policy: Policy) -> Arc<Limiter<MemoryStore>> {
    Arc::new(Limiter::new(MemoryStore::with_clock(clock.clone()), policy))
}

fn redis(server: &RedisServer, clock: &FakeClock, policy: Policy) -> Arc<Limiter<RedisStore>> {
    Arc::new(Limiter::new(redis_store(server, clock), policy))
}

fn redis_store(server: &RedisServer, clock: &FakeClock) -> RedisStore {
    server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(5))
}

/// The issue's acceptance: reserving 800 and using 100 leaves 900 once the body has
/// ended; a fresh key reserving 100 and using 500 leaves 500.
async fn acceptance<S: Store + Sync>(limiter: Arc<Limiter<S>>) {
    let svc = service(&limiter, &Streams::default(), false);
    let ok = svc.clone().oneshot(ask("a", 800, Some(100))).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    read_to_end(ok).await;
    settles_to(&limiter, "a", 900).await;
    assert_eq!(limiter.peek("a", 1).await.unwrap().remaining(), 899);

    let ok = svc.clone().oneshot(ask("b", 100, Some(500))).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    read_to_end(ok).await;
    settles_to(&limiter, "b", 500).await;
    assert_eq!(limiter.peek("b", 1).await.unwrap().remaining(), 499);
    // The 900 left are the client's to spend: 900 pass, the next token is denied.
    let ok = svc.clone().oneshot(ask("a", 900, None)).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    read_to_end(ok).await;
    let denied = svc.oneshot(ask("a", 1, None)).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn memory_reserving_800_and_using_100_leaves_900() {
    acceptance(memory(&FakeClock::new(T0), tokens_per_minute())).await;
}

#[tokio::test]
async fn redis_reserving_800_and_using_100_leaves_900() {
    let server = RedisServer::start();
    acceptance(redis(&server, &FakeClock::new(T0), tokens_per_minute())).await;
    server.assert_every_key_expires().await;
}

/// While the body streams, the reservation counts; the usage streamed is settled when
/// the body ends, not when the head came.
async fn the_reservation_counts_until_the_body_ends<S: Store + Sync>(limiter: Arc<Limiter<S>>) {
    let streams = Streams::default();
    let svc = service(&limiter, &streams, false);
    // Reported at the head, on a body that streams on.
    let ok = svc
        .clone()
        .oneshot(with(ask("h", 800, Some(100)), "x-stream", "1"))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let feed = streams.last();
    stays_at(&limiter, "h", 200).await;
    // A second request cannot take what the first reserved and has not yet given back.
    let denied = svc.clone().oneshot(ask("h", 201, None)).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(feed);
    read_to_end(ok).await;
    settles_to(&limiter, "h", 900).await;

    // Reported as the body streams: 30, then 70 more, then the end.
    let ok = svc
        .clone()
        .oneshot(with(ask("s", 800, None), "x-stream", "1"))
        .await
        .unwrap();
    let feed = streams.last();
    let mut body = ok.into_body();
    feed.send(30).await.unwrap();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "30"
    );
    feed.send(70).await.unwrap();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "70"
    );
    stays_at(&limiter, "s", 200).await;
    drop(feed);
    assert!(body.frame().await.is_none());
    settles_to(&limiter, "s", 900).await;
    drop(body);
    stays_at(&limiter, "s", 900).await;
}

#[tokio::test]
async fn memory_the_reservation_counts_until_the_body_ends() {
    the_reservation_counts_until_the_body_ends(memory(&FakeClock::new(T0), tokens_per_minute()))
        .await;
}

#[tokio::test]
async fn redis_the_reservation_counts_until_the_body_ends() {
    let server = RedisServer::start();
    the_reservation_counts_until_the_body_ends(redis(
        &server,
        &FakeClock::new(T0),
        tokens_per_minute(),
    ))
    .await;
}

/// The body reports per chunk; the client reads two chunks and drops the body while
/// a third is on its way: settled on the two.
async fn a_body_dropped_mid_stream_settles_on_what_was_reported<S: Store + Sync>(
    limiter: Arc<Limiter<S>>,
) {
    let streams = Streams::default();
    let svc = service(&limiter, &streams, false);
    let ok = svc
        .clone()
        .oneshot(with(ask("d", 500, None), "x-stream", "1"))
        .await
        .unwrap();
    let feed = streams.last();
    let mut body = ok.into_body();
    for n in [40, 60] {
        feed.send(n).await.unwrap();
        body.frame().await.unwrap().unwrap();
    }
    // Sent, never read: never reported.
    feed.send(300).await.unwrap();
    stays_at(&limiter, "d", 500).await;
    drop(body);
    settles_to(&limiter, "d", 900).await;
    stays_at(&limiter, "d", 900).await;

    // Past the reservation mid-stream: the excess is charged.
    let ok = svc
        .oneshot(with(ask("e", 100, None), "x-stream", "1"))
        .await
        .unwrap();
    let feed = streams.last();
    let mut body = ok.into_body();
    for n in [150, 150] {
        feed.send(n).await.unwrap();
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    settles_to(&limiter, "e", 700).await;
}

#[tokio::test]
async fn memory_a_body_dropped_mid_stream_settles_on_what_was_reported() {
    a_body_dropped_mid_stream_settles_on_what_was_reported(memory(
        &FakeClock::new(T0),
        tokens_per_minute(),
    ))
    .await;
}

#[tokio::test]
async fn redis_a_body_dropped_mid_stream_settles_on_what_was_reported() {
    let server = RedisServer::start();
    a_body_dropped_mid_stream_settles_on_what_was_reported(redis(
        &server,
        &FakeClock::new(T0),
        tokens_per_minute(),
    ))
    .await;
}

/// A handler that panics after reporting is settled on its report; one that panics
/// before reporting is settled at its reservation, with no call.
async fn a_handler_that_panics<S: Store + Sync>(limiter: Arc<Limiter<S>>) {
    let svc = service(&limiter, &Streams::default(), false);
    let after = with(ask("p", 800, Some(100)), "x-panic", "after");
    let joined = tokio::spawn(svc.clone().oneshot(after)).await;
    assert!(joined.unwrap_err().is_panic());
    settles_to(&limiter, "p", 900).await;

    let more = with(ask("q", 100, Some(400)), "x-panic", "after");
    let joined = tokio::spawn(svc.clone().oneshot(more)).await;
    assert!(joined.unwrap_err().is_panic());
    settles_to(&limiter, "q", 600).await;

    let before = with(ask("r", 800, Some(100)), "x-panic", "before");
    let joined = tokio::spawn(svc.oneshot(before)).await;
    assert!(joined.unwrap_err().is_panic());
    stays_at(&limiter, "r", 200).await;
}

#[tokio::test]
async fn memory_a_handler_that_panics_is_settled_on_its_report_or_its_reservation() {
    a_handler_that_panics(memory(&FakeClock::new(T0), tokens_per_minute())).await;
}

#[tokio::test]
async fn redis_a_handler_that_panics_is_settled_on_its_report_or_its_reservation() {
    let server = RedisServer::start();
    a_handler_that_panics(redis(&server, &FakeClock::new(T0), tokens_per_minute())).await;
}

/// A fresh key reserves 100 and uses 1500: the excess is charged past the limit, the
/// next request is denied with a `Retry-After` never early, and admitted at that time
/// to the millisecond.
async fn more_than_reserved_past_the_limit<S: Store + Sync>(
    limiter: Arc<Limiter<S>>,
    clock: FakeClock,
) {
    let svc = service(&limiter, &Streams::default(), false);
    let ok = svc
        .clone()
        .oneshot(ask("o", 100, Some(1_500)))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    read_to_end(ok).await;
    settles_to(&limiter, "o", 0).await;
    // 1500 in this window: a token fits once the window has turned and the 1500 weigh
    // at most 999 of the next one's 1000, 60 s + (60 - 999 * 60 / 1500) s = 80.04 s on.
    let wait_ms = 60_000 + (60_000 - 999 * 60_000 / 1_500);
    assert_eq!(wait_ms, 80_040);
    let denied = svc.clone().oneshot(ask("o", 1, None)).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(denied.headers(), "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry, 81, "the wait rounded up, never early");
    assert_eq!(
        limiter.peek("o", 1).await.unwrap().retry_after(),
        Some(Duration::from_millis(wait_ms))
    );
    clock.set_ms(T0 + wait_ms - 1);
    let early = svc.clone().oneshot(ask("o", 1, None)).await.unwrap();
    assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
    clock.set_ms(T0 + wait_ms);
    let admitted = svc.oneshot(ask("o", 1, None)).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
}

#[tokio::test]
async fn memory_more_than_reserved_is_charged_past_the_limit_and_waited_out_exactly() {
    let clock = FakeClock::new(T0);
    more_than_reserved_past_the_limit(memory(&clock, tokens_per_minute()), clock).await;
}

#[tokio::test]
async fn redis_more_than_reserved_is_charged_past_the_limit_and_waited_out_exactly() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    more_than_reserved_past_the_limit(redis(&server, &clock, tokens_per_minute()), clock).await;
    server.assert_every_key_expires().await;
}

/// A failing store that counts every call made to it (checks and admin operations).
#[derive(Clone, Default)]
struct BrokenCounting(Arc<AtomicUsize>);

impl Backend for BrokenCounting {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        BrokenStore.check(subject, set, cost)
    }
}

impl AdminStore for BrokenCounting {
    fn run(&self, _op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        BrokenStore.check(subject, set, cost)
    }
}

/// The store is down: a request the fallback admitted settles in the fallback, never
/// in the store; a request let through unchecked (fail open) settles nothing.
#[tokio::test]
async fn a_settlement_goes_where_the_reservation_went() {
    let clock = FakeClock::new(T0);
    let store = BrokenCounting::default();
    let fallback = MemoryStore::with_clock(clock.clone());
    let limiter = Arc::new(
        Limiter::builder(store.clone())
            .policy(tokens_per_minute())
            .fallback(fallback.clone())
            .local_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let svc = service(&limiter, &Streams::default(), false);
    for (user, reserve, used, expected) in [("f", 800, 100, 900), ("g", 100, 500, 500)] {
        let ok = svc
            .clone()
            .oneshot(ask(user, reserve, Some(used)))
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        // The check went to the store (and failed), nothing else did.
        let calls = store.0.load(Ordering::SeqCst);
        read_to_end(ok).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            store.0.load(Ordering::SeqCst),
            calls,
            "{user}: settled in the store"
        );
        // What the fallback counts (a limiter of the same policy on it reads it).
        let fallback_limiter = Limiter::new(fallback.clone(), tokens_per_minute());
        assert_eq!(left(&fallback_limiter, user).await, expected, "{user}");
        assert_eq!(left(&limiter, user).await, expected, "{user}");
    }

    // Fail open: a Usage that settles nothing, and nothing settled.
    let open_store = BrokenCounting::default();
    let open = Arc::new(Limiter::new(open_store.clone(), tokens_per_minute()));
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::from_shared(Arc::clone(&open), UserHeader)
                .cost_fn(|_| 100)
                .settle(),
        )
        .service_fn(|req: Request<Empty<Bytes>>| async move {
            let settles = req.extensions().get::<Usage>().map(Usage::settles);
            if let Some(usage) = req.extensions().get::<Usage>() {
                usage.report(500);
            }
            let decision = req.extensions().get::<Decision>().unwrap().origin();
            Ok::<_, Infallible>(Response::new(format!("{settles:?} {decision:?}")))
        });
    for _ in 0..3 {
        let passed = svc.clone().oneshot(request("o")).await.unwrap();
        assert_eq!(passed.status(), StatusCode::OK);
        let body = passed.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "Some(false) FailOpen");
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        open_store.0.load(Ordering::SeqCst),
        3,
        "the three checks alone"
    );
}

/// A settlement that gives back enough lifts this instance's cached denial: the next
/// request is admitted at once, without waiting the denial out.
async fn a_settled_refund_lifts_the_cached_denial<S: Store + Sync>(
    limiter: Arc<Limiter<S>>,
    clock: &FakeClock,
) {
    let streams = Streams::default();
    let svc = service(&limiter, &streams, false);
    let held = svc
        .clone()
        .oneshot(with(ask("c", 800, Some(100)), "x-stream", "1"))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let feed = streams.last();
    // Denied by the store, then by the cache (which the store never hears of).
    for _ in 0..2 {
        let denied = svc.clone().oneshot(ask("c", 800, None)).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let cached = limiter.check("c", 800).await.unwrap();
    assert_eq!(cached.origin(), redlimit::Origin::BlockCache, "{cached:?}");
    drop(feed);
    read_to_end(held).await;
    settles_to(&limiter, "c", 900).await;
    assert_eq!(clock.now_ms(), T0, "no time passed");
    let admitted = svc.oneshot(ask("c", 800, None)).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
}

fn cached<S: Store>(store: S, clock: &FakeClock) -> Arc<Limiter<S>> {
    Arc::new(
        Limiter::builder(store)
            .policy(tokens_per_minute())
            .block_cache(16)
            .local_clock(clock.clone())
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn memory_a_settled_refund_lifts_the_cached_denial() {
    let clock = FakeClock::new(T0);
    let limiter = cached(MemoryStore::with_clock(clock.clone()), &clock);
    a_settled_refund_lifts_the_cached_denial(limiter, &clock).await;
}

#[tokio::test]
async fn redis_a_settled_refund_lifts_the_cached_denial() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let limiter = cached(redis_store(&server, &clock), &clock);
    a_settled_refund_lifts_the_cached_denial(limiter, &clock).await;
}

/// What one policy may count in one window, debts included: `MAX_DEBT` limits.
const MAX_DEBT: u64 = 4;

/// With leases (of the default size, and of half the limit), requests reserving 10 of
/// a limit of 100 a second and using 0 to 120: in every window, what the admitted
/// requests used never exceeds the limit and the debt bound; without the settlement
/// (nothing charged) it would, nearly twice over. With leases of half the limit it
/// also takes the lease's end at a charge that leaves the subject in debt: before,
/// requests went on being answered from units leased earlier, and used 473 in one
/// window.
async fn leases_keep_the_totals_within_the_debt_bound<S: Store + Sync>(
    limiter: Arc<Limiter<S>>,
    clock: &FakeClock,
    seed: u64,
) -> usize {
    const LIMIT: u64 = 100;
    let svc = service(&limiter, &Streams::default(), false);
    let mut rng = Lcg(seed);
    let mut used_in: std::collections::BTreeMap<u64, u64> = Default::default();
    let (mut admitted, mut leased) = (0, 0);
    for _ in 0..600 {
        clock.advance(Duration::from_millis(rng.below(40)));
        let window = clock.now_ms() / 1_000;
        let used = rng.below(121);
        let answer = svc.clone().oneshot(ask("l", 10, Some(used))).await.unwrap();
        if answer.status() == StatusCode::OK {
            admitted += 1;
            if header(answer.headers(), "x-origin") == Some("Lease") {
                leased += 1;
            }
            *used_in.entry(window).or_default() += used;
        } else {
            assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        }
        read_to_end(answer).await;
        quiesce(&limiter).await;
    }
    let most = used_in.values().copied().max().unwrap();
    assert!(
        most <= MAX_DEBT * LIMIT,
        "used {most} in one window: {used_in:?}"
    );
    assert!(admitted >= 10, "seed {seed}: only {admitted} admitted");
    // How many a lease answered: a charge into debt ends the lease, so some runs see
    // none; the callers require some over their runs.
    leased
}

/// A hot subject's request answered from this instance's lease settles in the store
/// all the same: what it used beyond its reservation is charged there, what it did not
/// use is given back there (the store counted the lease's units when it granted them).
async fn a_leased_request_settles_in_the_store<S: Store + Sync>(
    limiter: Arc<Limiter<S>>,
    clock: &FakeClock,
) {
    let svc = service(&limiter, &Streams::default(), false);
    let leased = |used| {
        let svc = svc.clone();
        async move {
            let answer = svc.oneshot(ask("k", 10, Some(used))).await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            let origin = header(answer.headers(), "x-origin").unwrap().to_owned();
            read_to_end(answer).await;
            origin
        }
    };
    // Hot: used as reserved (no settlement). The leasing checks grant more each time
    // (store, lease, store with a lease of 30): the next three are the lease's.
    let mut origins = Vec::new();
    for _ in 0..3 {
        clock.advance(Duration::from_millis(1));
        origins.push(leased(10).await);
    }
    assert_eq!(origins, ["Store", "Lease", "Store"]);
    quiesce(&limiter).await;
    let before = left(&limiter, "k").await;
    assert_eq!(before, 40, "20, then 40 taken");
    let mut expected = before;
    for (used, now) in [(30, before - 20), (2, before - 20 + 8), (10, before - 12)] {
        assert_eq!(leased(used).await, "Lease", "used {used}");
        settles_to(&limiter, "k", now).await;
        expected = now;
    }
    stays_at(&limiter, "k", expected).await;
}

fn leasing<S: Store + Clone + redlimit::internals::LeaseStore>(
    store: S,
    clock: &FakeClock,
    policy: Policy,
    leases: Leases,
) -> Arc<Limiter<S>> {
    Arc::new(
        Limiter::builder(store)
            .policy(policy)
            .local_clock(clock.clone())
            .leases(leases)
            .build()
            .unwrap(),
    )
}

/// Leases of up to half the limit: a hot subject is answered from them for a while.
fn big_leases() -> Leases {
    Leases::new().min_rate(1).max_units(50)
}

fn per_second(sliding: bool) -> Policy {
    let s = Duration::from_secs(1);
    if sliding {
        Policy::sliding_window("api", 100, s).unwrap()
    } else {
        Policy::fixed_window("api", 100, s).unwrap()
    }
}

#[tokio::test]
async fn memory_leases_settle_in_the_store_within_the_debt_bound() {
    let mut leased = 0;
    for sliding in [false, true] {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let limiter = leasing(
            store,
            &clock,
            per_second(sliding),
            Leases::new().min_rate(1),
        );
        leased += leases_keep_the_totals_within_the_debt_bound(limiter, &clock, 11).await;
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let limiter = leasing(store, &clock, per_second(sliding), big_leases());
        leased += leases_keep_the_totals_within_the_debt_bound(limiter, &clock, 13).await;
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let limiter = leasing(store, &clock, per_second(sliding), big_leases());
        a_leased_request_settles_in_the_store(limiter, &clock).await;
    }
    assert!(leased >= 1, "no request was answered from a lease");
}

#[tokio::test]
async fn redis_leases_settle_in_the_store_within_the_debt_bound() {
    let server = RedisServer::start();
    let mut leased = 0;
    for sliding in [false, true] {
        let clock = FakeClock::new(T0);
        let limiter = leasing(
            redis_store(&server, &clock),
            &clock,
            per_second(sliding),
            Leases::new().min_rate(1),
        );
        leased += leases_keep_the_totals_within_the_debt_bound(limiter, &clock, 12).await;
        // The same subject again, on a fresh state: the last run's debt is not this one's.
        let mut conn = server.conn().await;
        let () = redlimit::redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .unwrap();
        let clock = FakeClock::new(T0);
        let limiter = leasing(
            redis_store(&server, &clock),
            &clock,
            per_second(sliding),
            big_leases(),
        );
        leased += leases_keep_the_totals_within_the_debt_bound(limiter, &clock, 14).await;
        let clock = FakeClock::new(T0);
        let limiter = leasing(
            redis_store(&server, &clock),
            &clock,
            per_second(sliding),
            big_leases(),
        );
        a_leased_request_settles_in_the_store(limiter, &clock).await;
    }
    assert!(leased >= 1, "no request was answered from a lease");
    server.assert_every_key_expires().await;
}

/// `refund_on(5xx)`: a 503 after a report gives the whole reservation back, and
/// nothing more is settled.
async fn a_refunded_response_gives_the_whole_reservation_back<S: Store + Sync>(
    limiter: Arc<Limiter<S>>,
) {
    let svc = service(&limiter, &Streams::default(), true);
    // 800 spent for good (reported as reserved: no call).
    let ok = svc.clone().oneshot(ask("u", 800, Some(800))).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    read_to_end(ok).await;
    settles_to(&limiter, "u", 200).await;
    // Reserved 100, reported 50, then failed: the 100 come back, not the 50 more.
    let failed = svc
        .clone()
        .oneshot(with(ask("u", 100, Some(50)), "x-status", "503"))
        .await
        .unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    read_to_end(failed).await;
    settles_to(&limiter, "u", 200).await;
    stays_at(&limiter, "u", 200).await;
    // Reported more than reserved, then failed: nothing is charged either.
    let failed = svc
        .clone()
        .oneshot(with(ask("u", 100, Some(150)), "x-status", "503"))
        .await
        .unwrap();
    read_to_end(failed).await;
    stays_at(&limiter, "u", 200).await;
    // A client's error is no refund: settled on the report.
    let not_found = svc
        .oneshot(with(ask("u", 100, Some(50)), "x-status", "404"))
        .await
        .unwrap();
    read_to_end(not_found).await;
    settles_to(&limiter, "u", 150).await;
}

#[tokio::test]
async fn memory_a_refunded_response_gives_the_whole_reservation_back() {
    a_refunded_response_gives_the_whole_reservation_back(memory(
        &FakeClock::new(T0),
        tokens_per_minute(),
    ))
    .await;
}

#[tokio::test]
async fn redis_a_refunded_response_gives_the_whole_reservation_back() {
    let server = RedisServer::start();
    a_refunded_response_gives_the_whole_reservation_back(redis(
        &server,
        &FakeClock::new(T0),
        tokens_per_minute(),
    ))
    .await;
}

/// A store that counts what its limiter asks of it: checks, and settlements (the
/// refunds and charges a settling layer sends once a body ends). Around a real store.
#[derive(Clone)]
struct Counted<S> {
    store: S,
    checks: Arc<AtomicUsize>,
    settlements: Arc<AtomicUsize>,
}

impl<S> Counted<S> {
    fn new(store: S) -> Self {
        Self {
            store,
            checks: Arc::default(),
            settlements: Arc::default(),
        }
    }

    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    fn settlements(&self) -> usize {
        self.settlements.load(Ordering::SeqCst)
    }
}

impl<S: Backend> Backend for Counted<S> {
    type Future = S::Future;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.store.check(subject, set, cost)
    }

    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        let now = self.store.check_now(subject, set, cost);
        if matches!(now, CheckNow::Decided(_)) {
            self.checks.fetch_add(1, Ordering::SeqCst);
        }
        now
    }
}

impl<S: AdminStore> AdminStore for Counted<S> {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        match op {
            Operation::Refund | Operation::Charge => {
                self.settlements.fetch_add(1, Ordering::SeqCst);
            }
            Operation::Check => {
                self.checks.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        self.store.run(op, subject, set, cost)
    }
}

/// The handler docs/costs.md teaches: it extracts the request's `Usage` (axum answers
/// 500 when there is none) and reports on it, `x-used` or all it reserved. It answers
/// what it found; `origin=none` when no limit applied.
async fn doc_handler(
    Extension(usage): Extension<Usage>,
    decision: Option<Extension<Decision>>,
    headers: http::HeaderMap,
) -> String {
    let used = headers
        .get("x-used")
        .map_or(usage.reserved(), |v| v.to_str().unwrap().parse().unwrap());
    usage.report(used);
    let (allowed, origin) = match decision {
        Some(Extension(d)) => (d.is_allowed().to_string(), format!("{:?}", d.origin())),
        None => ("none".to_owned(), "none".to_owned()),
    };
    format!(
        "reserved={} settles={} allowed={allowed} origin={origin}",
        usage.reserved(),
        usage.settles()
    )
}

/// `doc_handler` on `/v1/complete` behind a settling layer over `limiter` that
/// reserves `x-reserve`, with `over_limit`.
fn doc_app<S: Store + Sync>(limiter: &Arc<Limiter<S>>, over_limit: OverLimit) -> axum::Router {
    let layer = RateLimitLayer::from_shared(Arc::clone(limiter), UserHeader)
        .cost_fn(|parts| {
            parts
                .headers
                .get("x-reserve")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .over_limit(over_limit)
        .settle();
    axum::Router::new()
        .route("/v1/complete", axum::routing::post(doc_handler))
        .layer(layer)
}

/// A completion of `user` reserving `reserve` and using `used`: its status and its
/// body, read to the end (which is when the layer settles).
async fn complete(app: &axum::Router, user: &str, reserve: u32, used: u64) -> (StatusCode, String) {
    let request = Request::post("/v1/complete")
        .header("x-user", user)
        .header("x-reserve", reserve)
        .header("x-used", used)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Redis stopped under `FailureMode::Open` (the default): the handler that extracts
/// `Extension<Usage>` answers its 200 (it was a 500: a request let through unchecked
/// got no `Usage`), its `Usage` says it settles nothing, and no settlement is sent.
/// The control, on the healthy Redis first: the same request is settled as before.
#[tokio::test]
async fn redis_down_under_fail_open_a_usage_handler_answers_and_nothing_is_settled() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let store = Counted::new(redis_store(&server, &clock));
    let limiter = Arc::new(Limiter::new(store.clone(), tokens_per_minute()));
    let app = doc_app(&limiter, OverLimit::Refuse);

    let (status, body) = complete(&app, "a", 800, 100).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "reserved=800 settles=true allowed=true origin=Store");
    settles_to(&limiter, "a", 900).await;
    assert_eq!(store.settlements(), 1, "the control's refund of 700");

    server.stop();
    let checks = store.checks();
    for user in ["a", "b", "c"] {
        let (status, body) = complete(&app, user, 800, 100).await;
        assert_eq!(status, StatusCode::OK, "{user}: {body}");
        assert_eq!(
            body,
            "reserved=800 settles=false allowed=true origin=FailOpen"
        );
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.checks() - checks,
        3,
        "one check a request, each failed"
    );
    assert_eq!(
        store.settlements(),
        1,
        "no settlement of what was not taken"
    );
}

/// `OverLimit::Degrade` on a healthy Redis: a request over its limit reaches the
/// handler with its denial and a `Usage` that settles nothing, whatever it reports
/// (less than its cost, or more): nothing given back, nothing charged, no call. It
/// was a 500. The control: an allowed request of the same layer is settled.
#[tokio::test]
async fn redis_over_the_limit_under_degrade_a_usage_handler_answers_and_nothing_is_settled() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let store = Counted::new(redis_store(&server, &clock));
    let limiter = Arc::new(Limiter::new(store.clone(), tokens_per_minute()));
    let app = doc_app(&limiter, OverLimit::Degrade);

    let (status, body) = complete(&app, "d", 800, 100).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "reserved=800 settles=true allowed=true origin=Store");
    settles_to(&limiter, "d", 900).await;
    assert_eq!(store.settlements(), 1, "the control's refund of 700");
    // The rest, used as reserved: no call.
    let (status, _) = complete(&app, "d", 900, 900).await;
    assert_eq!(status, StatusCode::OK);
    stays_at(&limiter, "d", 0).await;
    let wait = limiter.peek("d", 1).await.unwrap().retry_after();
    assert!(wait.is_some());

    for used in [100, 5_000] {
        let (status, body) = complete(&app, "d", 800, used).await;
        assert_eq!(status, StatusCode::OK, "used {used}: {body}");
        assert_eq!(
            body,
            "reserved=800 settles=false allowed=false origin=Store"
        );
    }
    stays_at(&limiter, "d", 0).await;
    // A charge of the 4,200 over the cost would have pushed the wait out.
    assert_eq!(limiter.peek("d", 1).await.unwrap().retry_after(), wait);
    assert_eq!(
        store.settlements(),
        1,
        "no settlement of what was not taken"
    );
    server.assert_every_key_expires().await;
}

/// A memory store whose calls fail from the `good`-th on, as a Redis that went down
/// at that moment would.
#[derive(Clone)]
struct GoesDown {
    store: MemoryStore,
    calls: Arc<AtomicUsize>,
    good: usize,
}

impl GoesDown {
    fn up(&self) -> bool {
        self.calls.fetch_add(1, Ordering::SeqCst) < self.good
    }
}

impl Backend for GoesDown {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.run(Operation::Check, subject, set, cost)
    }

    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        CheckNow::Decided(self.check(subject, set, cost).into_inner())
    }
}

impl AdminStore for GoesDown {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        if self.up() {
            self.store.run(op, subject, set, cost)
        } else {
            BrokenStore.check(subject, set, cost)
        }
    }
}

/// A waiting layer (`OverLimit::Wait`) whose store goes down while a request waits:
/// the check at its time fails, the request is let through unchecked, and the
/// handler finds a `Usage` that settles nothing (it was a 500), with no call. The
/// control: the request before it was allowed and settled.
#[tokio::test(start_paused = true)]
async fn a_request_failed_open_after_its_wait_finds_a_usage_that_settles_nothing() {
    let clock = FakeClock::new(T0);
    let store = Counted::new(GoesDown {
        store: MemoryStore::with_clock(clock.clone()),
        calls: Arc::default(),
        // The control's check and its settlement, then the denial; then down.
        good: 3,
    });
    let policy = Policy::fixed_window("tokens", 1_000, MINUTE).unwrap();
    let limiter = Arc::new(Limiter::new(store.clone(), policy));
    let wait = redlimit::layer::Wait::up_to(2 * MINUTE);
    let app = doc_app(&limiter, OverLimit::Wait(wait));

    let (status, body) = complete(&app, "w", 1_000, 900).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "reserved=1000 settles=true allowed=true origin=Store");
    assert_eq!(store.settlements(), 1, "the control's refund of 100");
    // Over the limit: denied (the third call), waits out the window on the paused
    // timer, then its check fails.
    let (status, body) = complete(&app, "w", 800, 100).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        "reserved=800 settles=false allowed=true origin=FailOpen"
    );
    assert_eq!(
        store.checks(),
        3,
        "the control, the denial, the check at its time"
    );
    assert_eq!(
        store.settlements(),
        1,
        "no settlement of what was not taken"
    );
}

/// A request no rule matches passes a settling `Rules` layer unlimited; its handler
/// still finds a `Usage` (it was a 500), one that settles nothing.
#[tokio::test]
async fn an_unlimited_request_of_a_settling_rules_layer_finds_a_usage() {
    let clock = FakeClock::new(T0);
    let store = Counted::new(MemoryStore::with_clock(clock.clone()));
    let limiter = Arc::new(Limiter::new(store.clone(), tokens_per_minute()));
    let rules = redlimit::layer::Rules::builder()
        .path("/v1/complete", Arc::clone(&limiter), UserHeader)
        .build()
        .unwrap();
    let layer = RateLimitLayer::rules(rules)
        .cost_fn(|parts| {
            parts
                .headers
                .get("x-reserve")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .settle();
    let app = axum::Router::new()
        .route("/v1/complete", axum::routing::post(doc_handler))
        .route("/v1/free", axum::routing::post(doc_handler))
        .layer(layer);

    let (status, body) = complete(&app, "r", 800, 100).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "reserved=800 settles=true allowed=true origin=Store");
    assert_eq!((store.checks(), store.settlements()), (1, 1), "the control");
    let free = Request::post("/v1/free")
        .header("x-user", "r")
        .header("x-reserve", 300)
        .header("x-used", 100)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.clone().oneshot(free).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    // Of 0: the cost function is not run on a request no limit applies to.
    assert_eq!(body, "reserved=0 settles=false allowed=none origin=none");
    assert_eq!((store.checks(), store.settlements()), (1, 1), "no call");
    assert_eq!(left(&limiter, "r").await, 900);
}
