//! What `RateLimitLayer` adds to a hello-world axum request, beside a no-op layer and
//! `tower_governor` measured in the same run.
//!
//! ```text
//! cargo run --release -p redlimit-bench --example layer_overhead  # in-process, then over HTTP
//! SERVE_ONE=layer PER_CONN=1500 valgrind --tool=callgrind \
//!     target/release/examples/layer_overhead                      # one variant, for instruction counts
//! CALL_ONE=layer REQUESTS=3000000 perf record -g target/release/examples/layer_overhead
//! CALL_ONE=layer REQUESTS=100000 valgrind --tool=callgrind \
//!     --toggle-collect='layer_overhead::in_process*' \
//!     target/release/examples/layer_overhead                      # in process, per request
//! ```
//!
//! In process, a variant's instructions per request are its total less `bare`'s, over
//! `REQUESTS`. `--toggle-collect` counts the requests alone: without it the total also
//! holds the setup (building the router, calibrating a clock) and the memory store's
//! sweeping thread, which runs as long as the process does, together worth tens to a
//! hundred instructions per request at 100,000 requests, and not the same from run to run.
//!
//! Variants: bare, noop, layer, noheaders, governor, governor-headers. The policy admits
//! everything (10^9 per second), so every request takes the allowed path.

use std::time::{Duration, Instant};

use axum::{body::Body, routing::get, Router};
use http::{request::Parts, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use redlimit::key::{KeyExtractor, KeyRejection};
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
use tower::Service;

/// Keys on the `x-user` header, as the `tower_governor` variant does.
struct UserHeader;

impl KeyExtractor for UserHeader {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        parts
            .headers
            .get("x-user")
            .map(|v| Subject::new(v.as_bytes()))
            .ok_or_else(|| KeyRejection::new(StatusCode::UNAUTHORIZED, "no user"))
    }
}

#[derive(Clone)]
struct GovUser;

impl tower_governor::key_extractor::KeyExtractor for GovUser {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

fn redlimit(headers_on_allowed: bool) -> Router {
    let limiter = Limiter::new(
        MemoryStore::new(),
        Policy::sliding_window("default", 1_000_000_000, Duration::from_secs(1)).unwrap(),
    );
    app().layer(RateLimitLayer::new(limiter, UserHeader).headers_on_allowed(headers_on_allowed))
}

fn governor(headers: bool) -> Router {
    let mut builder = tower_governor::governor::GovernorConfigBuilder::default();
    builder.per_nanosecond(1).burst_size(u32::MAX);
    let mut builder = builder.key_extractor(GovUser);
    if headers {
        let config = builder.use_headers().finish().unwrap();
        app().layer(tower_governor::GovernorLayer::new(config))
    } else {
        let config = builder.finish().unwrap();
        app().layer(tower_governor::GovernorLayer::new(config))
    }
}

/// A variant's name and how to build its router.
type Variant = (&'static str, fn() -> Router);

const VARIANTS: [Variant; 6] = [
    ("bare", app),
    ("noop", || {
        app().layer(tower::util::MapRequestLayer::new(|r: Request<Body>| r))
    }),
    ("layer", || redlimit(true)),
    ("noheaders", || redlimit(false)),
    ("governor", || governor(false)),
    ("governor-headers", || governor(true)),
];

fn describe(name: &str) -> &'static str {
    match name {
        "bare" => "bare router",
        "noop" => "no-op layer (MapRequestLayer)",
        "layer" => "RateLimitLayer (IETF headers)",
        "noheaders" => "RateLimitLayer, headers_on_allowed(false)",
        "governor" => "tower_governor",
        _ => "tower_governor, use_headers()",
    }
}

async fn in_process(mut router: Router, n: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        let req = Request::builder()
            .uri("/")
            .header("x-user", "user-42")
            .body(Body::empty())
            .unwrap();
        let res = router.call(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

/// CPU time of this whole process (all threads) in ns, from /proc.
fn process_cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The client side, run in a child process so its CPU time is not the server's.
async fn client(addr: String, conns: usize, per_conn: usize) {
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let io = hyper_util::rt::TokioIo::new(stream);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            for _ in 0..per_conn {
                sender.ready().await.unwrap();
                let req = Request::builder()
                    .uri("/")
                    .header("host", "x")
                    .header("x-user", "user-42")
                    .body(Empty::<bytes::Bytes>::new())
                    .unwrap();
                let res = sender.send_request(req).await.unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                res.into_body().collect().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

fn run_client(addr: &str, conns: usize, per_conn: usize) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .env("CLIENT", addr)
        .env("CONNS", conns.to_string())
        .env("PER_CONN", per_conn.to_string())
        .spawn()
        .unwrap()
}

/// Serves `router` with `axum::serve` on one thread while a client process sends
/// `conns * per_conn` requests; returns the server's CPU time per request in ns.
fn server_cpu_per_request(router: Router, conns: usize, per_conn: usize) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = rt.spawn(async move { axum::serve(listener, router).await.unwrap() });
    let mut warm = run_client(&addr, 2, 500);
    rt.block_on(async { tokio::task::spawn_blocking(move || warm.wait()).await })
        .unwrap()
        .unwrap();
    let before = process_cpu_ns();
    let mut child = run_client(&addr, conns, per_conn);
    rt.block_on(async { tokio::task::spawn_blocking(move || child.wait()).await })
        .unwrap()
        .unwrap();
    let cpu = process_cpu_ns() - before;
    server.abort();
    cpu as f64 / (conns * per_conn) as f64
}

fn env_usize(name: &str) -> usize {
    std::env::var(name).unwrap().parse().unwrap()
}

fn main() {
    if let Ok(addr) = std::env::var("CLIENT") {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(client(addr, env_usize("CONNS"), env_usize("PER_CONN")));
        return;
    }
    if let Ok(name) = std::env::var("CALL_ONE") {
        // One variant in process, for a profiler (`perf record`).
        let (_, router) = VARIANTS.iter().find(|(n, _)| *n == name).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ns = rt.block_on(in_process(router(), env_usize("REQUESTS") as u32));
        println!("{}: {ns:.0} ns per Router::call", describe(&name));
        return;
    }
    if let Ok(name) = std::env::var("SERVE_ONE") {
        let (_, router) = VARIANTS.iter().find(|(n, _)| *n == name).unwrap();
        let ns = server_cpu_per_request(router(), 4, env_usize("PER_CONN"));
        println!("{}: {ns:.0} ns of server CPU per request", describe(&name));
        return;
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let n = 300_000;
    println!("in-process Router::call, {n} requests, best of 9 interleaved rounds");
    let mut best = [f64::MAX; VARIANTS.len()];
    for _ in 0..9 {
        for (i, (_, router)) in VARIANTS.iter().enumerate() {
            best[i] = best[i].min(rt.block_on(in_process(router(), n)));
        }
    }
    report(&best, "ns", 1.0);
    drop(rt);

    let (conns, per_conn) = (8, 5_000);
    println!(
        "axum::serve, HTTP/1.1 over loopback, client in another process, {conns} keep-alive \
         connections x {per_conn} requests: server CPU per request, min of 7 interleaved rounds"
    );
    let mut best = [f64::MAX; VARIANTS.len()];
    for _ in 0..7 {
        for (i, (_, router)) in VARIANTS.iter().enumerate() {
            best[i] = best[i].min(server_cpu_per_request(router(), conns, per_conn));
        }
    }
    report(&best, "us", 1000.0);
}

fn report(figures: &[f64], unit: &str, scale: f64) {
    for ((name, _), figure) in VARIANTS.iter().zip(figures) {
        println!(
            "  {:44} {:9.2} {unit}  {:+6.1}%",
            describe(name),
            figure / scale,
            (figure / figures[0] - 1.0) * 100.0
        );
    }
}
