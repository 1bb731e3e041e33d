//! An LLM-style gateway: per API key, a budget of tokens per minute that each
//! completion reserves before it runs and settles on what it used, and a bound on the
//! completions running at once; optionally requests per minute per key, tokens per
//! minute per org, requests per minute across everyone and a monthly quota. Every
//! counter of a request is decided in one store call, all or nothing, and shared by
//! every instance on one Redis; an admin route changes a key's budget live.
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
//!   (10000): each instance renews its slots every third of it while they run;
//! - `RPM`: requests per minute per API key (unset: none);
//! - `ORG_TOKENS`: tokens per minute per org, the org taken from the header `x-org`
//!   (unset: none). While it is set, a request without `x-org` gets 400;
//! - `GLOBAL_RPM`: requests per minute across all keys (unset: none);
//! - `MONTHLY_TOKENS`: tokens per calendar month per API key (unset: none), counted
//!   in the zone `QUOTA_TZ` (an IANA name, default `UTC`) from day `QUOTA_ANCHOR_DAY`
//!   (1 to 28, default 1) at 00:00; an exhausted quota gets 402, told apart from 429;
//! - `ADMIN_TOKEN`: turns on the admin route (unset: no admin route).
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
//! - `GET /v1/usage`: `tokens_remaining=<n> in_flight=<n>`, then, for whichever are
//!   set, `requests_remaining=<n>`, `org_tokens_remaining=<n>` (with `x-org`),
//!   `global_requests_remaining=<n>`, `quota_remaining=<n> quota_resets=<RFC 3339>`;
//!   consuming nothing.
//! - `PUT /v1/limits/<api-key>?tokens=<n>` and `DELETE /v1/limits/<api-key>`, with
//!   `x-admin-token` (401 without it, 403 when it is wrong): set or remove the key's
//!   tokens per minute, on every instance sharing the store within a second, keeping
//!   what the key has used.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Router};
use http_body::Frame;
use redlimit::clock::{Clock, SystemClock};
use redlimit::key::{Header, KeyExtractor, KeyExtractorExt, Secret};
use redlimit::layer::Usage;
use redlimit::store::{LiveLimitStore, Store};
use redlimit::{Limiter, MemoryStore, Period, Policy, RateLimitLayer, RedisStore, Scope, Unit};

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
    Ok(optional(name)?.unwrap_or(default))
}

/// A setting from the environment, if set.
fn optional<T: std::str::FromStr>(name: &str) -> Result<Option<T>, BoxError> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={value:?} is not a valid value").into()),
        Err(_) => Ok(None),
    }
}

/// What the gateway limits, from the environment (the module docs list it).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) tokens: u32,
    pub(crate) in_flight: u32,
    pub(crate) slot_ttl: Duration,
    pub(crate) rpm: Option<u32>,
    pub(crate) org_tokens: Option<u32>,
    pub(crate) global_rpm: Option<u32>,
    pub(crate) monthly: Option<Quota>,
    pub(crate) admin_token: Option<String>,
    /// How often each instance reads the live limits: the bound on how soon a change
    /// made on one reaches the others.
    pub(crate) live_every: Duration,
    /// The clock `quota_resets` is told on: the store's (the system clock, or a test's).
    pub(crate) clock: Arc<dyn Clock>,
}

/// `MONTHLY_TOKENS` in its zone, from its anchor day.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    pub(crate) tokens: u32,
    pub(crate) zone: String,
    pub(crate) anchor_day: u8,
}

impl Settings {
    fn from_env() -> Result<Self, BoxError> {
        let monthly = optional::<u32>("MONTHLY_TOKENS")?
            .map(|tokens| -> Result<Quota, BoxError> {
                Ok(Quota {
                    tokens,
                    zone: setting("QUOTA_TZ", "UTC".to_owned())?,
                    anchor_day: setting("QUOTA_ANCHOR_DAY", 1)?,
                })
            })
            .transpose()?;
        Ok(Self {
            tokens: setting("TOKENS", 10_000)?,
            in_flight: setting("IN_FLIGHT", 4)?,
            slot_ttl: Duration::from_millis(setting("IN_FLIGHT_TTL_MS", 10_000)?),
            rpm: optional("RPM")?,
            org_tokens: optional("ORG_TOKENS")?,
            global_rpm: optional("GLOBAL_RPM")?,
            monthly,
            admin_token: optional::<String>("ADMIN_TOKEN")?.filter(|t| !t.is_empty()),
            live_every: Duration::from_millis(250),
            clock: Arc::new(SystemClock),
        })
    }

    /// The policies, in the usage line's order: the tokens, the slots, then whichever
    /// are set.
    fn policies(&self) -> Result<Vec<Policy>, BoxError> {
        let minute = Duration::from_secs(60);
        let mut policies = vec![
            Policy::sliding_window(TOKENS, self.tokens, minute)?,
            Policy::in_flight(IN_FLIGHT, self.in_flight, self.slot_ttl)?,
        ];
        if let Some(rpm) = self.rpm {
            policies.push(Policy::sliding_window(REQUESTS, rpm, minute)?.counting(Unit::Requests));
        }
        if let Some(org_tokens) = self.org_tokens {
            policies.push(
                Policy::sliding_window(ORG_TOKENS, org_tokens, minute)?.per(Scope::named(ORG)?),
            );
        }
        if let Some(global_rpm) = self.global_rpm {
            policies.push(
                Policy::sliding_window(GLOBAL_REQUESTS, global_rpm, minute)?
                    .counting(Unit::Requests)
                    .per(Scope::global()),
            );
        }
        if let Some(quota) = &self.monthly {
            policies.push(quota_policy(quota)?);
        }
        Ok(policies)
    }
}

const TOKENS: &str = "tokens";
const IN_FLIGHT: &str = "in_flight";
const REQUESTS: &str = "requests";
const ORG_TOKENS: &str = "org_tokens";
const GLOBAL_REQUESTS: &str = "global_requests";
const QUOTA: &str = "quota";
/// The scope of `ORG_TOKENS`, from `x-org`.
const ORG: &str = "org";

/// The monthly quota: a calendar policy in its zone, from its anchor day.
fn quota_policy(quota: &Quota) -> Result<Policy, BoxError> {
    Ok(Policy::calendar(
        QUOTA,
        quota.tokens,
        Period::Month,
        &quota.zone,
        quota.anchor_day,
    )?)
}

async fn run() -> Result<(), BoxError> {
    let port: u16 = setting("PORT", 3000)?;
    let settings = Settings::from_env()?;
    let secret = Secret::from_env("REDLIMIT_SECRET").or_else(|_| {
        eprintln!(
            "gateway: REDLIMIT_SECRET is not set: API keys are hashed with a secret of this \
             process, so instances do not share budgets (set it, the same everywhere)"
        );
        Secret::new(process_secret())
    })?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (app, store) = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let store = RedisStore::from_url(&url)?;
            // At start, not at the first request: a wrong REDIS_URL stops the gateway,
            // and the first completion is decided on a warm connection.
            store.connect().await?;
            (
                app(store, &settings, &secret).await?,
                format!("redis at {url}"),
            )
        }
        Err(_) => (
            app(MemoryStore::new(), &settings, &secret).await?,
            "memory (this process only)".to_owned(),
        ),
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("redlimit gateway on http://{addr} (store: {store})");
    println!(
        "  per x-api-key: {} tokens a minute (reserved, then settled), {} in flight (slots of \
         a vanished instance count {} ms more at most)",
        settings.tokens,
        settings.in_flight,
        settings.slot_ttl.as_millis()
    );
    if let Some(rpm) = settings.rpm {
        println!("  per x-api-key: {rpm} requests a minute");
    }
    if let Some(org_tokens) = settings.org_tokens {
        println!("  per x-org: {org_tokens} tokens a minute (x-org required)");
    }
    if let Some(global_rpm) = settings.global_rpm {
        println!("  everyone: {global_rpm} requests a minute");
    }
    if let Some(quota) = &settings.monthly {
        println!(
            "  per x-api-key: {} tokens a month from day {} in {} (402 when spent)",
            quota.tokens, quota.anchor_day, quota.zone
        );
    }
    println!(
        "  admin route: {}",
        if settings.admin_token.is_some() {
            "PUT/DELETE /v1/limits/<api-key> with x-admin-token"
        } else {
            "off (ADMIN_TOKEN unset)"
        }
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

/// The routes on one limiter: every counter of a completion (its key's tokens, slots,
/// requests and quota, its org's tokens, everyone's requests) is checked in one store
/// call, all or nothing. Built inside the runtime: the live limits are polled on it.
pub(crate) async fn app<S: Store + LiveLimitStore + Clone>(
    store: S,
    settings: &Settings,
    secret: &Secret,
) -> Result<Router, BoxError> {
    let limiter = Arc::new(
        settings
            .policies()?
            .into_iter()
            .fold(Limiter::builder(store), |builder, p| builder.policy(p))
            .live_limits(settings.live_every)
            .build()?,
    );
    // Applied before the first request, not a poll later.
    limiter.refresh_limits().await?;
    let orgs = settings.org_tokens.is_some();
    let api_key = Header::new("x-api-key", secret)?;
    let admin_key = api_key.clone();
    let key: Arc<dyn KeyExtractor> = if orgs {
        Arc::new(api_key.within(ORG, Header::new("x-org", secret)?))
    } else {
        Arc::new(api_key)
    };
    let limited = RateLimitLayer::from_shared(Arc::clone(&limiter), Arc::clone(&key))
        // What it may use at most: reserved before it runs, settled on its actual.
        .cost_fn(|parts| max_tokens(&parts.headers).unwrap_or(0))
        // A month's tokens spent is no rate: told apart from 429.
        .quota_status(StatusCode::PAYMENT_REQUIRED)
        .settle();
    let shared = Shared {
        clock: Arc::clone(&settings.clock),
        limiter,
        key,
        api_key: admin_key,
        admin_token: settings.admin_token.clone(),
    };
    let usage_route = {
        let shared = shared.clone();
        move |headers: HeaderMap| usage(shared.clone(), headers)
    };
    let mut router = Router::new()
        .route(
            "/v1/complete",
            post(complete)
                .layer(limited)
                .layer(middleware::from_fn(needs_max_tokens)),
        )
        .route("/v1/usage", get(usage_route));
    if shared.admin_token.is_some() {
        let (set, remove) = (shared.clone(), shared.clone());
        router = router.route(
            "/v1/limits/{api_key}",
            put(move |path, query, headers| set_limit(set.clone(), path, query, headers))
                .delete(move |path, headers| remove_limit(remove.clone(), path, headers)),
        );
    }
    if orgs {
        router = router.layer(middleware::from_fn(needs_org));
    }
    Ok(router)
}

/// What the handlers share.
#[derive(Clone)]
struct Shared<S> {
    limiter: Arc<Limiter<S>>,
    key: Arc<dyn KeyExtractor>,
    /// The key alone: the admin route names a key by its value.
    api_key: Header,
    clock: Arc<dyn Clock>,
    admin_token: Option<String>,
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

/// 400, in words, for a request without `x-org` while orgs are limited (the admin
/// route names no org).
async fn needs_org(request: Request, next: Next) -> Response {
    let admin = request.uri().path().starts_with("/v1/limits/");
    let has_org = request
        .headers()
        .get("x-org")
        .is_some_and(|v| !v.is_empty());
    if !admin && !has_org {
        let why = "x-org is required: tokens are limited per org\n";
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

/// What is left of each of a key's budgets and how many of its completions run, from
/// one peek of every counter the key's completions are checked against.
async fn usage<S: Store>(shared: Shared<S>, headers: HeaderMap) -> Response {
    let mut parts = axum::http::Request::new(()).into_parts().0;
    parts.headers = headers;
    let subject = match shared.key.extract(&parts) {
        Ok(subject) => subject,
        Err(rejection) => {
            return (rejection.status(), format!("{}\n", rejection.message())).into_response()
        }
    };
    let peek = match shared.limiter.peek(subject, 1).await {
        Ok(peek) => peek,
        Err(error) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response()
        }
    };
    let Some(each) = peek.each_policy() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no usage\n").into_response();
    };
    let mut line = String::new();
    for (policy, outcome) in shared.limiter.policies().iter().zip(each) {
        use std::fmt::Write as _;
        if policy.is_in_flight() {
            // Admitted, the peek's own slot is counted in `remaining`; refused (by
            // this policy or another), nothing was taken.
            let running = match (outcome.allowed, peek.is_allowed()) {
                (false, _) => outcome.limit,
                (true, true) => outcome.limit.saturating_sub(outcome.remaining + 1),
                (true, false) => outcome.limit.saturating_sub(outcome.remaining),
            };
            let _ = write!(line, " in_flight={running}");
            continue;
        }
        // A peek of 1: admitted, its `remaining` is after that one; refused, nothing
        // was taken.
        let left = if peek.is_allowed() {
            outcome.remaining + 1
        } else {
            outcome.remaining
        };
        let name = match policy.name() {
            TOKENS => "tokens_remaining",
            REQUESTS => "requests_remaining",
            ORG_TOKENS => "org_tokens_remaining",
            GLOBAL_REQUESTS => "global_requests_remaining",
            QUOTA => "quota_remaining",
            _ => continue,
        };
        let _ = write!(line, " {name}={left}");
        if policy.name() == QUOTA {
            let end_ms = shared.clock.now_ms().saturating_add(outcome.reset_after_ms);
            let _ = write!(line, " quota_resets={}", quota_resets(policy, end_ms));
        }
    }
    line.push('\n');
    line.trim_start().to_owned().into_response()
}

/// When the quota starts again (its period's end, ms since the epoch), in RFC 3339 in
/// the quota's zone.
fn quota_resets(policy: &Policy, end_ms: u64) -> String {
    let zone = policy
        .time_zone()
        .and_then(|name| jiff::tz::TimeZone::get(name).ok())
        .unwrap_or(jiff::tz::TimeZone::UTC);
    let at = i64::try_from(end_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.to_zoned_datetime(zone)
        .strftime("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

/// `n` of a query `tokens=<n>`.
fn tokens_of(query: Option<&str>) -> Option<u64> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("tokens="))?
        .parse()
        .ok()
}

/// 401 without `x-admin-token`, 403 with a wrong one, else `None`.
fn admin_refusal(expected: Option<&str>, headers: &HeaderMap) -> Option<Response> {
    let Some(expected) = expected else {
        return Some(StatusCode::NOT_FOUND.into_response());
    };
    let Some(given) = headers.get("x-admin-token") else {
        return Some((StatusCode::UNAUTHORIZED, "x-admin-token is required\n").into_response());
    };
    // The same time whatever the bytes: the comparison tells nothing of the token.
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let differ = a.len() != b.len() || a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) != 0;
    differ.then(|| (StatusCode::FORBIDDEN, "wrong x-admin-token\n").into_response())
}

/// `PUT /v1/limits/<api-key>?tokens=<n>`: the key's tokens per minute, live.
async fn set_limit<S: Store>(
    shared: Shared<S>,
    Path(api_key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = admin_refusal(shared.admin_token.as_deref(), &headers) {
        return refusal;
    }
    let Some(tokens) = tokens_of(query.as_deref()) else {
        return (StatusCode::BAD_REQUEST, "?tokens=<n> is required\n").into_response();
    };
    let subject = shared.api_key.subject_of(api_key.as_bytes());
    limit_answer(
        shared.limiter.set_limit(TOKENS, subject, tokens).await,
        tokens,
    )
}

/// `DELETE /v1/limits/<api-key>`: the key's tokens per minute back to `TOKENS`.
async fn remove_limit<S: Store>(
    shared: Shared<S>,
    Path(api_key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = admin_refusal(shared.admin_token.as_deref(), &headers) {
        return refusal;
    }
    let subject = shared.api_key.subject_of(api_key.as_bytes());
    let own = shared.limiter.policies()[0].limit();
    limit_answer(shared.limiter.remove_limit(TOKENS, subject).await, own)
}

fn limit_answer(result: Result<(), redlimit::Error>, tokens: u64) -> Response {
    match result {
        Ok(()) => format!("tokens={tokens}\n").into_response(),
        Err(error @ redlimit::Error::BadLimit(_)) => {
            (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response()
        }
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response(),
    }
}
