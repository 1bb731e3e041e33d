//! The quickstart: an axum server that limits two routes.
//!
//! ```text
//! cargo run --example quickstart              # memory store, 127.0.0.1:3000
//! PORT=8080 cargo run --example quickstart    # another port
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example quickstart
//! REDIS_CLUSTER=redis://127.0.0.1:7000,redis://127.0.0.1:7001 cargo run --example quickstart
//! ```
//!
//! - `GET /`: per client IP, 5 requests per 10 seconds, sliding window;
//! - `GET /api/hello`: per `x-api-key` header, token bucket with bursts of 10 refilled
//!   at 1 per second; without the header, per client IP.
//!
//! With `REDIS_URL` (one server) or `REDIS_CLUSTER` (comma-separated node URLs) set,
//! state lives in Redis: several instances share one budget. The store connects at
//! start (a Redis that cannot be reached stops the quickstart with its address), and
//! warnings go to stderr: a Redis that stops answering later, and the requests let
//! through unchecked meanwhile, show on the default output. API keys are hashed with
//! the secret in `REDLIMIT_SECRET` (the same on every instance); without it a random
//! secret is made for this process, which is all the memory store needs, and in Redis
//! mode means instances share IP budgets but not API-key budgets (it says so at start).

use redlimit::store::Store;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use redlimit::key::{ClientIp, Header, KeyExtractorExt, Secret};
use redlimit::{Decision, Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    log_to_stderr();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("quickstart: {error}");
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

async fn run() -> Result<(), BoxError> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|_| format!("PORT={port:?} is not a port number"))?,
        Err(_) => 3000,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let redis =
        std::env::var_os("REDIS_CLUSTER").is_some() || std::env::var_os("REDIS_URL").is_some();
    let (secret, hashed_with) = match Secret::from_env("REDLIMIT_SECRET") {
        Ok(secret) => (secret, "REDLIMIT_SECRET"),
        Err(_) => {
            // A demo should start as written; a service would stop here (`?`).
            if redis {
                eprintln!(
                    "quickstart: REDLIMIT_SECRET is not set, so API keys are hashed with a \
                     random secret of this process: instances share IP budgets but not \
                     API-key budgets (set REDLIMIT_SECRET, the same on every instance)"
                );
            }
            (process_secret(), "a random secret of this process")
        }
    };
    let (app, store) = if let Ok(nodes) = std::env::var("REDIS_CLUSTER") {
        let urls: Vec<String> = nodes
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        // The store's own cluster client: it never resends a call that may have run.
        let store = RedisStore::cluster_from_urls(urls)?;
        // At start, not at the first request: a cluster that is not there stops the
        // quickstart, and the first check is decided on a warm connection.
        store.connect().await?;
        (app(store, &secret)?, format!("redis cluster at {nodes}"))
    } else if let Ok(url) = std::env::var("REDIS_URL") {
        let store = RedisStore::from_url(&url)?;
        store.connect().await?;
        (app(store, &secret)?, format!("redis at {url}"))
    } else {
        let store = "memory (this process only)".to_owned();
        (app(MemoryStore::new(), &secret)?, store)
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("redlimit quickstart on http://{addr} (store: {store})");
    println!("  GET /           per client IP: 5 requests per 10 s, sliding window");
    println!(
        "  GET /api/hello  per x-api-key header (else client IP): token bucket, burst 10, 1/s"
    );
    println!("  API keys are kept as hashes keyed by {hashed_with}");
    println!("try: for i in $(seq 7); do curl -si http://{addr}/ | head -1; done");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// A random secret for this process alone: enough for the memory store, whose counts
/// live and die with the process (std's `RandomState` is seeded from the OS).
fn process_secret() -> Secret {
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = Vec::with_capacity(32);
    for _ in 0..4 {
        let hasher = std::collections::hash_map::RandomState::new().build_hasher();
        bytes.extend_from_slice(&hasher.finish().to_le_bytes());
    }
    Secret::new(bytes).expect("32 bytes are not empty")
}

/// The two routes, each with its own limiter on the same store.
fn app<S: Store + Clone>(store: S, secret: &Secret) -> Result<Router, BoxError> {
    let index = Limiter::new(
        store.clone(),
        Policy::sliding_window("index", 5, Duration::from_secs(10))?,
    );
    let api = Limiter::new(
        store,
        Policy::token_bucket("api", 10, 1, Duration::from_secs(1))?,
    );
    let api_key = Header::new("x-api-key", secret)?.or(ClientIp::new());
    Ok(Router::new()
        .route(
            "/",
            get(root).layer(RateLimitLayer::new(index, ClientIp::new())),
        )
        .route(
            "/api/hello",
            get(hello).layer(RateLimitLayer::new(api, api_key)),
        ))
}

// Every request the layer lets through carries a `Decision`, also while the store is
// down and the layer fails open: then nothing was counted, and `is_checked` says so.
async fn root(Extension(decision): Extension<Decision>) -> String {
    format!("hello from redlimit: {}\n", left(&decision))
}

async fn hello(Extension(decision): Extension<Decision>) -> String {
    format!("hello, API client: {}\n", left(&decision))
}

fn left(decision: &Decision) -> String {
    if decision.is_checked() {
        format!("{} of {} left", decision.remaining(), decision.limit())
    } else {
        "not counted (the rate limiter's store is unavailable)".to_owned()
    }
}
