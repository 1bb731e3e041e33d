//! HTTP end to end: a hello-world axum app bare, with `RateLimitLayer` on the memory
//! store, on the Redis store, and with `tower_governor`, and a handler that sends one
//! smallest fixed-window script per request (the Redis store's reference), under one
//! load generator.
//!
//! The server runs on its own tokio runtime (two workers, as an app would); the load
//! generator on another thread with a current-thread runtime: `CONNECTIONS` HTTP/1.1
//! keep-alive connections, each sending its next request when the last answer is
//! read, for a fixed time. Every variant keys on the client IP (all requests come from
//! 127.0.0.1: one hot subject) with a limit no request reaches, so every request takes
//! the allowed path; the generator checks the status and, for the layers, that the
//! decision's headers are there (no store failure let a request pass unchecked).

use crate::helpers::*;
use crate::support::RedisServer;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use redlimit::key::ClientIp;
use redlimit::{Limiter, MemoryStore, RateLimitLayer};
use std::net::SocketAddr;

const CONNECTIONS: usize = 32;
const TURN: Duration = Duration::from_millis(1_000);
const WARM_UP: Duration = Duration::from_millis(150);
const ROUNDS: u32 = 5;
/// Two variants closer than this are a tie: turns of one variant differ by more.
const TIE: f64 = 0.02;

fn app() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

fn policy() -> Policy {
    Policy::sliding_window("http", 1_000_000_000, Duration::from_secs(1)).expect("policy")
}

/// The fixed-window twin of [`policy`]: the Redis store's layer on the algorithm of the
/// smallest script, so the two differ by the layer and the store alone.
fn fixed_window_policy() -> Policy {
    Policy::fixed_window("http", 1_000_000_000, Duration::from_secs(1)).expect("policy")
}

/// The hello world behind the least a Redis-backed limiter can do per request: one
/// `EVALSHA` of the smallest fixed-window script (`TIME`, `INCR`, `PEXPIRE` when new)
/// for the client IP on one redis-rs multiplexed connection, the count compared with
/// the policy's limit. The reference of the Redis store's layer.
fn smallest_script_app(conn: MultiplexedConnection) -> Router {
    let (limit, window_ms) = (policy().limit(), policy().window_ms());
    let handler = move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
        let mut conn = conn.clone();
        async move {
            let key = format!("rl:{{{}}}:http:fw", peer.ip());
            let count: redis::RedisResult<u64> = reference::smallest_fixed_window(&key, window_ms)
                .query_async(&mut conn)
                .await;
            match count {
                Ok(n) if n <= limit => (StatusCode::OK, "Hello, World!"),
                Ok(_) => (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests"),
                Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable"),
            }
        }
    };
    Router::new().route("/", get(handler))
}

/// The variants: name, whether responses carry the layer's headers, and the app.
/// `smallest`: the connection of the handler that sends the smallest script, opened on
/// the server's runtime (its driver task runs there).
fn variants(
    server: &RedisServer,
    smallest: MultiplexedConnection,
) -> Vec<(&'static str, bool, Router)> {
    let redis_layer = |policy| {
        let store = RedisStore::new(server.pool()).timeout(Duration::from_secs(1));
        RateLimitLayer::new(Limiter::new(store, policy), ClientIp::new())
    };
    let mut governor = tower_governor::governor::GovernorConfigBuilder::default();
    governor.per_nanosecond(1).burst_size(u32::MAX);
    let governor = governor.finish().expect("tower_governor config");
    vec![
        ("bare axum", false, app()),
        (
            "RateLimitLayer, memory store",
            true,
            app().layer(RateLimitLayer::new(
                Limiter::new(MemoryStore::new(), policy()),
                ClientIp::new(),
            )),
        ),
        (
            "RateLimitLayer, memory store, headers_on_allowed(false)",
            false,
            app().layer(
                RateLimitLayer::new(Limiter::new(MemoryStore::new(), policy()), ClientIp::new())
                    .headers_on_allowed(false),
            ),
        ),
        (
            "RateLimitLayer, Redis store",
            true,
            app().layer(redis_layer(policy())),
        ),
        (
            "RateLimitLayer, Redis store, fixed window",
            true,
            app().layer(redis_layer(fixed_window_policy())),
        ),
        (
            "handler sending one smallest fixed-window script",
            false,
            smallest_script_app(smallest),
        ),
        (
            "tower_governor 0.8",
            false,
            app().layer(tower_governor::GovernorLayer::new(governor)),
        ),
    ]
}

/// What one turn of load measured.
#[derive(Default)]
struct Load {
    requests: u64,
    time: Duration,
    /// Microseconds per request, unsorted.
    latencies: Vec<u32>,
    /// Answers without the layer's headers where they were expected.
    unchecked: u64,
}

/// `CONNECTIONS` connections sending requests to `addr` for `turn`.
fn load(addr: SocketAddr, turn: Duration, headers: bool) -> Load {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("generator runtime");
        rt.block_on(async move {
            let start = Instant::now();
            let deadline = start + turn;
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..CONNECTIONS {
                tasks.spawn(async move {
                    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
                    stream.set_nodelay(true).expect("nodelay");
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                        .await
                        .expect("handshake");
                    tokio::spawn(conn);
                    let mut latencies = Vec::with_capacity(16_384);
                    let mut unchecked = 0;
                    while Instant::now() < deadline {
                        let sent = Instant::now();
                        sender.ready().await.expect("connection ready");
                        let request = ::http::Request::builder()
                            .uri("/")
                            .header("host", "127.0.0.1")
                            .body(Empty::<bytes::Bytes>::new())
                            .expect("request");
                        let response = sender.send_request(request).await.expect("response");
                        assert_eq!(response.status(), ::http::StatusCode::OK);
                        if headers && !response.headers().contains_key("ratelimit") {
                            unchecked += 1;
                        }
                        response.into_body().collect().await.expect("body");
                        latencies
                            .push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                    }
                    (latencies, unchecked)
                });
            }
            let mut total = Load::default();
            while let Some(done) = tasks.join_next().await {
                let (latencies, unchecked) = done.expect("connection task");
                total.requests += latencies.len() as u64;
                total.latencies.extend(latencies);
                total.unchecked += unchecked;
            }
            total.time = start.elapsed();
            total
        })
    })
    .join()
    .expect("generator thread")
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i]) / 1_000.0
}

pub(crate) fn run(server: &RedisServer) {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("server runtime");
    let mut served = Vec::new();
    let smallest = server_rt.block_on(connect(server));
    for (name, headers, router) in variants(server, smallest) {
        let listener = server_rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        server_rt.spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .expect("serve");
        });
        served.push((name, headers, addr));
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); served.len()];
    let mut latencies: Vec<Vec<u32>> = vec![Vec::new(); served.len()];
    let mut unchecked = vec![0; served.len()];
    for round in 0..ROUNDS {
        for (i, (_, headers, addr)) in served.iter().enumerate() {
            load(*addr, WARM_UP, *headers);
            let turn = load(*addr, TURN, *headers);
            rates[i].push(turn.requests as f64 / turn.time.as_secs_f64());
            latencies[i].extend(turn.latencies);
            unchecked[i] += turn.unchecked;
        }
        eprintln!("http: round {} of {ROUNDS} done", round + 1);
    }
    drop(server_rt);

    println!();
    println!("## HTTP end to end");
    println!();
    println!(
        "A hello-world axum 0.8 app on loopback, served with connect info on a 2-worker tokio runtime; \
         a Rust load generator in the same process (hyper 1 client, one thread): {CONNECTIONS} keep-alive \
         connections, one request in flight each, {ROUNDS} turns of {} ms per variant in rotation. \
         Requests/s is the median turn, a ratio the median of the ratios of one round's turns; latencies over every request of the variant. Every variant keys \
         on the client IP; the limits admit everything.",
        TURN.as_millis()
    );
    println!();
    println!("| variant | requests/s (median) | slowest / fastest turn | vs bare | p50 latency | p99 latency | answers without the layer's headers |");
    println!("|---|---|---|---|---|---|---|");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // The median of the per-round ratios of variant `a` to variant `b`.
    let ratio = |a: usize, b: usize| {
        let per_round: Vec<f64> = rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect();
        median(&per_round)
    };
    for (i, (name, headers, _)) in served.iter().enumerate() {
        latencies[i].sort_unstable();
        let rate = median(&rates[i]);
        let slowest = rates[i].iter().cloned().fold(f64::MAX, f64::min);
        let fastest = rates[i].iter().cloned().fold(f64::MIN, f64::max);
        println!(
            "| {name} | {} | {} / {} | {:.3}x | {:.2} ms | {:.2} ms | {} |",
            thousands(rate),
            thousands(slowest),
            thousands(fastest),
            ratio(i, 0),
            percentile(&latencies[i], 0.50),
            percentile(&latencies[i], 0.99),
            if *headers {
                unchecked[i].to_string()
            } else {
                "—".to_owned()
            },
        );
    }
    let at = |name: &str| {
        served
            .iter()
            .position(|(n, _, _)| *n == name)
            .unwrap_or_else(|| panic!("no variant {name:?}"))
    };
    let (bare, memory, quiet, redis, redis_fixed, smallest, governor) = (
        at("bare axum"),
        at("RateLimitLayer, memory store"),
        at("RateLimitLayer, memory store, headers_on_allowed(false)"),
        at("RateLimitLayer, Redis store"),
        at("RateLimitLayer, Redis store, fixed window"),
        at("handler sending one smallest fixed-window script"),
        at("tower_governor 0.8"),
    );
    let (memory_vs_governor, quiet_vs_governor) = (ratio(memory, governor), ratio(quiet, governor));
    let (redis_vs_smallest, redis_fixed_vs_smallest) =
        (ratio(redis, smallest), ratio(redis_fixed, smallest));
    let (memory, quiet, redis, governor, smallest) = (
        ratio(memory, bare),
        ratio(quiet, bare),
        ratio(redis, bare),
        ratio(governor, bare),
        ratio(smallest, bare),
    );
    println!();
    println!("### Targets");
    println!();
    println!(
        "- memory store {memory:.3}x bare (target >= 0.95x: {}); {memory_vs_governor:.3}x tower_governor \
         (target: not behind it, a tie within {:.0}%: {}); tower_governor itself: {governor:.3}x bare",
        met(memory >= 0.95),
        TIE * 100.0,
        met(memory_vs_governor >= 1.0 - TIE)
    );
    println!(
        "- memory store without headers on allowed answers (as tower_governor by default): {quiet:.3}x bare, \
         {quiet_vs_governor:.3}x tower_governor"
    );
    println!(
        "- Redis store {redis:.3}x bare (target >= 0.6x: {})",
        met(redis >= 0.6)
    );
    println!(
        "- Redis store {redis_vs_smallest:.3}x the handler sending one smallest fixed-window script \
         per request (target >= 0.85x: {}); on a fixed window {redis_fixed_vs_smallest:.3}x ({}); \
         that handler itself: {smallest:.3}x bare",
        met(redis_vs_smallest >= 0.85),
        met(redis_fixed_vs_smallest >= 0.85)
    );
}
