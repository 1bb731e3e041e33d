//! The layer's tests' common parts: a key from the `x-user` header, a hello service,
//! requests and header reads, layers on a fake clock, and stores that fail or answer a
//! poll late, as an unreachable or a network store would.

use redlimit::internals::{AdminStore, Backend, Operation, PolicySet, Store};
use redlimit::store::{StoreError, StoreErrorKind};

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use redlimit::clock::FakeClock;
use redlimit::key::{KeyExtractor, KeyRejection};
use redlimit::layer::{Keyed, Plan};
use redlimit::{Decision, Limiter, MemoryStore, Policy, RateLimitLayer, Subject};

/// The response headers, by the names clients read.
pub const RATELIMIT: &str = "ratelimit";
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
pub const X_RATELIMIT_LIMIT: &str = "x-ratelimit-limit";
pub const X_RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";
pub const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";

/// Keys on the `x-user` header; a request without one is rejected with 401.
/// Keys on the `x-user` header; a request without one is rejected with 401.
pub struct UserHeader;

impl KeyExtractor for UserHeader {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        parts
            .headers
            .get("x-user")
            .map(|v| Subject::new(v.as_bytes()))
            .ok_or_else(|| KeyRejection::new(StatusCode::UNAUTHORIZED, "missing x-user header"))
    }
}

pub async fn hello(_req: Request<Empty<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::from("hello")))
}

pub fn request(user: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .header("x-user", user)
        .body(Empty::new())
        .unwrap()
}

pub fn fixed(name: &str, limit: u32, window_ms: u64) -> Policy {
    Policy::fixed_window(name, limit, Duration::from_millis(window_ms)).unwrap()
}

/// A layer over a memory store on `clock`, with the given policies.
pub fn layer_on(
    clock: &FakeClock,
    policies: Vec<Policy>,
) -> RateLimitLayer<MemoryStore, Keyed<MemoryStore, UserHeader>> {
    let limiter = policies
        .into_iter()
        .fold(
            Limiter::builder(MemoryStore::with_clock(clock.clone())),
            |builder, p| builder.policy(p),
        )
        .build()
        .unwrap();
    RateLimitLayer::new(limiter, UserHeader)
}

pub async fn body_text<B>(response: Response<B>) -> String
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

pub fn header(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> Option<&str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

/// A store that always fails, as an unreachable Redis would.
pub struct BrokenStore;

impl Backend for BrokenStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _subject: Subject, _set: &PolicySet, _cost: u64) -> Self::Future {
        ready(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

/// Its admin operations decide as its checks do.
impl AdminStore for BrokenStore {
    fn run(&self, _: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.check(subject, set, cost)
    }
}

pub fn broken_layer() -> RateLimitLayer<BrokenStore, Keyed<BrokenStore, UserHeader>> {
    RateLimitLayer::new(
        Limiter::new(BrokenStore, fixed("default", 1, 1_000)),
        UserHeader,
    )
}

/// A store whose answers arrive one poll late, as a network store's would.
pub struct SlowStore<S>(pub S);

pub struct OnePollLate<F> {
    inner: F,
    waited: bool,
}

impl<F: Future + Unpin> Future for OnePollLate<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if !self.waited {
            self.waited = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl<S> Backend for SlowStore<S>
where
    S: Store<Future = Ready<Result<Decision, StoreError>>>,
{
    type Future = OnePollLate<Ready<Result<Decision, StoreError>>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        OnePollLate {
            inner: self.0.check(subject, set, cost),
            waited: false,
        }
    }
}

impl<S> AdminStore for SlowStore<S>
where
    S: Store<Future = Ready<Result<Decision, StoreError>>>,
{
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        OnePollLate {
            inner: self.0.run(op, subject, set, cost),
            waited: false,
        }
    }
}

/// A layer whose cost is read from the client's `x-items` header (1 without one).
pub fn cost_from_header<S: Store, P: Plan<S>>(layer: RateLimitLayer<S, P>) -> RateLimitLayer<S, P> {
    layer.cost_fn(|parts| {
        parts
            .headers
            .get("x-items")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
}

pub fn with_items(user: &str, items: u32) -> Request<Empty<Bytes>> {
    let mut request = request(user);
    request.headers_mut().insert("x-items", items.into());
    request
}

/// Answers with the status named in the request's `x-status` header (200 without one),
/// and `grpc-status` from `x-grpc-status` when there is one.
pub async fn status_from_header(
    req: Request<Empty<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let wanted = |name| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let mut response = Response::new(Full::from("answered"));
    if let Some(status) = wanted("x-status") {
        *response.status_mut() = StatusCode::from_bytes(status.as_bytes()).unwrap();
    }
    if let Some(grpc) = wanted("x-grpc-status") {
        response
            .headers_mut()
            .insert("grpc-status", grpc.parse().unwrap());
    }
    Ok(response)
}

pub fn answered_with(user: &str, header: &str, value: &str) -> Request<Empty<Bytes>> {
    let mut request = request(user);
    request.headers_mut().insert(
        http::HeaderName::from_bytes(header.as_bytes()).unwrap(),
        value.parse().unwrap(),
    );
    request
}

/// A store clock that follows Tokio's time (paused in tests): `base_ms` when made, then
/// as far on as `tokio::time::Instant` has moved since, so `tokio::time::advance` moves
/// the store and the layer's waiting requests together.
#[derive(Debug, Clone)]
pub struct TokioClock {
    start: tokio::time::Instant,
    base_ms: u64,
}

impl TokioClock {
    /// Reads `base_ms` now (call it inside the runtime whose time it follows).
    pub fn at(base_ms: u64) -> Self {
        Self {
            start: tokio::time::Instant::now(),
            base_ms,
        }
    }

    /// Milliseconds of Tokio's time since this clock was made.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap()
    }
}

impl redlimit::clock::Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.base_ms + self.elapsed_ms()
    }
}

/// A store that counts its checks and peeks, deciding as the store it wraps does (at
/// once when that one does).
pub struct Counting<S> {
    pub store: S,
    pub checks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub peeks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<S> Counting<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            checks: Default::default(),
            peeks: Default::default(),
        }
    }

    pub fn checks(&self) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        std::sync::Arc::clone(&self.checks)
    }

    pub fn peeks(&self) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        std::sync::Arc::clone(&self.peeks)
    }
}

impl<S: Store> Backend for Counting<S> {
    type Future = S::Future;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.checks
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.check(subject, set, cost)
    }

    fn check_now(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
    ) -> redlimit::internals::CheckNow {
        use redlimit::internals::CheckNow;
        match self.store.check_now(subject, set, cost) {
            CheckNow::Decided(result) => {
                self.checks
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                CheckNow::Decided(result)
            }
            later => later,
        }
    }
}

impl<S: redlimit::internals::AdminStore> redlimit::internals::AdminStore for Counting<S> {
    fn run(
        &self,
        op: redlimit::internals::Operation,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
    ) -> Self::Future {
        if op == redlimit::internals::Operation::Peek {
            self.peeks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.store.run(op, subject, set, cost)
    }
}
