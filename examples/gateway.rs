//! An LLM-style gateway: per API key, a budget of tokens per minute that each
//! completion reserves before it runs and settles on what it used, and a bound on the
//! completions running at once, both decided in one call and shared by every instance
//! on one Redis.
//!
//! ```text
//! cargo run --example gateway                                   # memory store, 127.0.0.1:3000
//! REDIS_URL=redis://127.0.0.1:6379/ REDLIMIT_SECRET=s3cret cargo run --example gateway
//! ```
//!
//! Environment:
//!
//! - `PORT` (3000), `REDIS_URL` (the memory store when unset), `REDLIMIT_SECRET` (API
//!   keys are kept as keyed hashes; the same on every instance);
//! - `TOKENS`: tokens per minute per API key (10000), a sliding window;
//! - `IN_FLIGHT`: completions running at once per API key (4);
//! - `IN_FLIGHT_TTL_MS`: how long the slots of a vanished instance keep counting
//!   (10000): each instance renews its slots every third of it while they run.
//!
//! Warnings go to stderr (a Redis that does not answer, requests let through unchecked
//! meanwhile), with redlimit's lines at info (when Redis answers again).
//!
//! Routes, keyed by `x-api-key` (401 without):
//!
//! - `POST /v1/complete`: reserves `x-max-tokens` (400 without it or when it is not a
//!   positive integer); a fake upstream then uses `x-use-tokens` (default: all it
//!   reserved) and streams ten chunks over `x-delay-ms` (default 0), reporting the use
//!   at the end of the stream, when the layer settles. 429 when the reservation does
//!   not fit or the key has `IN_FLIGHT` completions running; the body says which.
//! - `GET /v1/usage`: `tokens_remaining=<n> in_flight=<n>`, consuming nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use http_body::Frame;
use redlimit::key::{Header, KeyExtractor, Secret};
use redlimit::layer::Usage;
use redlimit::store::Store;
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    log_to_stderr();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gateway: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Failing open must show on the default output: warnings on stderr, and redlimit's
/// info lines (Redis answers again; shadow policies that would have denied).
fn log_to_stderr() {
    use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};
    let levels = Targets::new()
        .with_default(tracing::Level::WARN)
        .with_target("redlimit", tracing::Level::INFO);
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(levels)
        .init();
}

/// A setting from the environment, or its default.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a valid number").into()),
        Err(_) => Ok(default),
    }
}

async fn run() -> Result<(), BoxError> {
    let port: u16 = setting("PORT", 3000)?;
    let tokens: u32 = setting("TOKENS", 10_000)?;
    let in_flight: u32 = setting("IN_FLIGHT", 4)?;
    let slot_ttl = Duration::from_millis(setting("IN_FLIGHT_TTL_MS", 10_000)?);
    let secret = Secret::from_env("REDLIMIT_SECRET").or_else(|_| {
        eprintln!(
            "gateway: REDLIMIT_SECRET is not set: API keys are hashed with a secret of this \
             process, so instances do not share budgets (set it, the same everywhere)"
        );
        Secret::new(process_secret())
    })?;
    let policies = [
        Policy::sliding_window("tokens", tokens, Duration::from_secs(60))?,
        Policy::in_flight("in_flight", in_flight, slot_ttl)?,
    ];
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (app, store) = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let store = RedisStore::from_url(&url)?;
            // At start, not at the first request: a wrong REDIS_URL stops the gateway,
            // and the first completion is decided on a warm connection.
            store.connect().await?;
            (app(store, policies, &secret)?, format!("redis at {url}"))
        }
        Err(_) => (
            app(MemoryStore::new(), policies, &secret)?,
            "memory (this process only)".to_owned(),
        ),
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("redlimit gateway on http://{addr} (store: {store})");
    println!(
        "  per x-api-key: {tokens} tokens a minute (reserved, then settled), {in_flight} in \
         flight (slots of a vanished instance count {} ms more at most)",
        slot_ttl.as_millis()
    );
    println!(
        "try: curl -si -X POST http://{addr}/v1/complete -H 'x-api-key: k' -H 'x-max-tokens: 800' \
         -H 'x-use-tokens: 100'; curl -s http://{addr}/v1/usage -H 'x-api-key: k'"
    );
    axum::serve(listener, app).await?;
    Ok(())
}

/// A secret for this process alone, from std's OS-seeded `RandomState`.
fn process_secret() -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    (0..4)
        .flat_map(|_| {
            let hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.finish().to_le_bytes()
        })
        .collect()
}

/// The two routes on one limiter: the tokens and the in-flight slots of a key are
/// checked in one store call, all or nothing.
pub(crate) fn app<S: Store>(
    store: S,
    policies: [Policy; 2],
    secret: &Secret,
) -> Result<Router, BoxError> {
    let limiter = Arc::new(
        policies
            .into_iter()
            .fold(Limiter::builder(store), |builder, p| builder.policy(p))
            .build()?,
    );
    let key = Header::new("x-api-key", secret)?;
    let limited = RateLimitLayer::from_shared(Arc::clone(&limiter), key.clone())
        // What it may use at most: reserved before it runs, settled on its actual.
        .cost_fn(|parts| max_tokens(&parts.headers).unwrap_or(0))
        .settle();
    Ok(Router::new()
        .route(
            "/v1/complete",
            post(complete)
                .layer(limited)
                .layer(middleware::from_fn(needs_max_tokens)),
        )
        .route(
            "/v1/usage",
            get(move |headers: HeaderMap| usage(Arc::clone(&limiter), key.clone(), headers)),
        ))
}

/// `x-max-tokens` as a positive integer.
fn max_tokens(headers: &HeaderMap) -> Option<u32> {
    let n: u32 = headers.get("x-max-tokens")?.to_str().ok()?.parse().ok()?;
    (n > 0).then_some(n)
}

/// 400, in words, for a completion without a valid `x-max-tokens`.
async fn needs_max_tokens(request: Request, next: Next) -> Response {
    if max_tokens(request.headers()).is_none() {
        let why =
            "x-max-tokens must be a positive integer: the most tokens this completion may use\n";
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    next.run(request).await
}

/// The fake upstream: uses `x-use-tokens` (default: what was reserved), streams ten
/// chunks over `x-delay-ms`, and reports its use with the last one.
async fn complete(Extension(usage): Extension<Usage>, headers: HeaderMap) -> Response {
    let number = |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.parse().ok() };
    let uses = number("x-use-tokens").unwrap_or(usage.reserved());
    let delay = Duration::from_millis(number("x-delay-ms").unwrap_or(0));
    Body::new(Upstream {
        chunks_left: CHUNKS,
        every: delay / CHUNKS,
        wait: None,
        uses,
        usage,
    })
    .into_response()
}

const CHUNKS: u32 = 10;

/// Ten chunks, one every `every`; the last reports the tokens used.
struct Upstream {
    chunks_left: u32,
    every: Duration,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    uses: u64,
    usage: Usage,
}

impl http_body::Body for Upstream {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.chunks_left == 0 {
            return Poll::Ready(None);
        }
        let every = self.every;
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        ready!(wait.as_mut().poll(cx));
        self.wait = None;
        self.chunks_left -= 1;
        let chunk = if self.chunks_left == 0 {
            self.usage.report(self.uses);
            format!("done: {} tokens\n", self.uses)
        } else {
            format!("chunk {}\n", CHUNKS - self.chunks_left)
        };
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }
}

/// What is left of a key's budget and how many of its completions run, from one peek.
async fn usage<S: Store>(limiter: Arc<Limiter<S>>, key: Header, headers: HeaderMap) -> Response {
    let mut parts = axum::http::Request::new(()).into_parts().0;
    parts.headers = headers;
    let subject = match key.extract(&parts) {
        Ok(subject) => subject,
        Err(rejection) => {
            return (rejection.status(), format!("{}\n", rejection.message())).into_response()
        }
    };
    let peek = match limiter.peek(subject, 1).await {
        Ok(peek) => peek,
        Err(error) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response()
        }
    };
    let Some([tokens, slots]) = peek.each_policy() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no usage\n").into_response();
    };
    // A peek of 1: its `remaining` is after that one, when it would be admitted.
    let tokens_remaining = if peek.is_allowed() {
        tokens.remaining + 1
    } else {
        tokens.remaining
    };
    let in_flight = if slots.allowed {
        slots.limit - slots.remaining - 1
    } else {
        slots.limit
    };
    format!("tokens_remaining={tokens_remaining} in_flight={in_flight}\n").into_response()
}
