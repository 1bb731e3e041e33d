//! A fleet of instances sharing one Redis budget, in one process: the contract the lease
//! benchmarks (and anyone else) test against.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ INSTANCES=4 PORT=4000 LIMIT=1000 \
//!     cargo run --release -p redlimit-bench --example fleet
//! LEASES=off ...                    # every request one Redis call
//! STORE=memory ...                  # each instance its own memory store (no Redis)
//! ```
//!
//! Serves `INSTANCES` axum apps (default 4) on 127.0.0.1, ports `PORT` (default 4000) to
//! `PORT + INSTANCES - 1`. Each has its own `Limiter` and its own `RedisStore` (its own
//! pool and connection, as separate processes would), and limits `GET /` by the
//! `x-api-key` header (hashed with `REDLIMIT_SECRET`, else a secret of this process,
//! which every instance here shares), else by client IP, to a sliding window of `LIMIT`
//! (default 1000) per second. Leases are on unless `LEASES=off`. `STORE=memory` gives
//! each instance a memory store instead (no shared budget: a reference for throughput).
//!
//! `GET /stats` (not limited) answers the instance's counts so far as one line,
//! `admitted=<n> denied=<n> redis_calls=<n>`, for load tests that measure an interval.
//! On Ctrl-C or SIGTERM it prints, per instance and in total, the requests admitted and
//! denied and the Redis calls made, then exits.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use redlimit::deadpool_redis;
use redlimit::key::{ClientIp, Header, KeyExtractorExt, Secret};
use redlimit::lease::Leases;
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fleet: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What one instance answered.
#[derive(Debug, Default)]
struct Counts {
    admitted: AtomicU64,
    denied: AtomicU64,
    other: AtomicU64,
}

/// Reads an environment variable as a number, with a default.
fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a number").into()),
        Err(_) => Ok(default),
    }
}

async fn run() -> Result<(), BoxError> {
    let instances: u16 = number("INSTANCES", 4)?;
    let port: u16 = number("PORT", 4000)?;
    let limit: u32 = number("LIMIT", 1000)?;
    if instances == 0 || port.checked_add(instances - 1).is_none() {
        return Err(format!("INSTANCES={instances} from PORT={port} do not fit in ports").into());
    }
    let leases = match std::env::var("LEASES").as_deref() {
        Ok("off") => false,
        Ok("on") | Err(_) => true,
        Ok(other) => return Err(format!("LEASES={other:?}: on or off").into()),
    };
    let memory = match std::env::var("STORE").as_deref() {
        Ok("memory") => true,
        Ok("redis") | Err(_) => false,
        Ok(other) => return Err(format!("STORE={other:?}: redis or memory").into()),
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let secret = match Secret::from_env("REDLIMIT_SECRET") {
        Ok(secret) => secret,
        // Every instance is in this process: one random secret serves them all.
        Err(_) => Secret::new(format!("fleet-{}-{:?}", std::process::id(), Instant::now()))?,
    };
    let policy = Policy::sliding_window("fleet", limit, Duration::from_secs(1))?;

    let mut servers = Vec::new();
    let mut stats = Vec::new();
    for i in 0..instances {
        let counts = Arc::new(Counts::default());
        let key = Header::new("x-api-key", &secret)?.or(ClientIp::new());
        let (router, store) = if memory {
            let limiter = Limiter::new(MemoryStore::new(), policy.clone());
            let router = hello().layer(RateLimitLayer::new(limiter, key));
            (counted(router, &counts, None), None)
        } else {
            let pool = deadpool_redis::Config::from_url(url.as_str())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
            drop(
                pool.get()
                    .await
                    .map_err(|e| format!("cannot reach {url}: {e}"))?,
            );
            let store = RedisStore::new(pool);
            let mut limiter = Limiter::builder(store.clone()).policy(policy.clone());
            if leases {
                limiter = limiter.leases(Leases::new());
            }
            let limiter = limiter.build()?;
            let router = hello().layer(RateLimitLayer::new(limiter, key));
            (counted(router, &counts, Some(store.clone())), Some(store))
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port + i));
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        servers.push(tokio::spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        }));
        stats.push((addr, counts, store));
    }
    let store = if memory {
        "a memory store each".to_owned()
    } else {
        format!(
            "redis at {url}, leases {}",
            if leases { "on" } else { "off" }
        )
    };
    println!(
        "redlimit fleet: {instances} instances on 127.0.0.1:{port}..{}, GET / by x-api-key \
         (else client IP), sliding window {limit}/s, {store}; Ctrl-C or SIGTERM prints the counts",
        port + instances - 1
    );
    let started = Instant::now();
    shutdown().await;
    let seconds = started.elapsed().as_secs_f64();
    for server in &servers {
        server.abort();
    }

    println!("instance           admitted     denied  redis calls  calls/request");
    let (mut admitted, mut denied, mut calls) = (0, 0, 0);
    for (addr, counts, store) in &stats {
        let a = counts.admitted.load(Ordering::Relaxed);
        let d = counts.denied.load(Ordering::Relaxed);
        let c = store.as_ref().map_or(0, RedisStore::calls_sent);
        let other = counts.other.load(Ordering::Relaxed);
        println!("{addr:<16} {a:>10} {d:>10} {c:>12} {:>14.4}", per(c, a + d));
        if other > 0 {
            println!("{addr:<16} {other} answers neither 200 nor 429");
        }
        admitted += a;
        denied += d;
        calls += c;
    }
    println!(
        "{:<16} {admitted:>10} {denied:>10} {calls:>12} {:>14.4}",
        "total",
        per(calls, admitted + denied)
    );
    println!(
        "over {seconds:.1} s: {:.1} admitted/s ({:.3}x LIMIT), {:.0} requests/s",
        admitted as f64 / seconds,
        admitted as f64 / seconds / f64::from(limit),
        (admitted + denied) as f64 / seconds
    );
    Ok(())
}

fn per(calls: u64, requests: u64) -> f64 {
    if requests == 0 {
        0.0
    } else {
        calls as f64 / requests as f64
    }
}

/// `GET /`, hello world.
fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// `router`, counting what it answered (after the limit's layer), and `GET /stats`.
fn counted(router: Router, counts: &Arc<Counts>, store: Option<RedisStore>) -> Router {
    let stats = {
        let counts = Arc::clone(counts);
        move || async move {
            format!(
                "admitted={} denied={} redis_calls={}\n",
                counts.admitted.load(Ordering::Relaxed),
                counts.denied.load(Ordering::Relaxed),
                store.as_ref().map_or(0, RedisStore::calls_sent)
            )
        }
    };
    router
        .layer(middleware::from_fn_with_state(Arc::clone(counts), count))
        .route("/stats", get(stats))
}

async fn count(
    State(counts): State<Arc<Counts>>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let counter = match response.status() {
        StatusCode::OK => &counts.admitted,
        StatusCode::TOO_MANY_REQUESTS => &counts.denied,
        _ => &counts.other,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    response
}

/// Ctrl-C or SIGTERM.
async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
