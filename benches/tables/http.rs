//! HTTP end to end: a hello-world axum app bare, with `RateLimitLayer` on the memory
//! store, on the Redis store, and with `tower_governor`, and a handler that sends one
//! smallest fixed-window script per request (the Redis store's reference), under one
//! load generator; and, in a build with `--cfg redlimit_peers` (see benches/Cargo.toml: the
//! crate wants a newer rustc than the one here), behind tower-rate-limiter 0.1.6's layer
//! on its Redis store, a fixed window as redlimit's fixed-window Redis layer.
//!
//! The server runs on its own tokio runtime (two workers, as an app would); the load
//! generator on another thread with a current-thread runtime: `CONNECTIONS` HTTP/1.1
//! keep-alive connections, each sending its next request when the last answer is
//! read, for a fixed time. Every variant keys on the client IP (all requests come from
//! 127.0.0.1: one hot subject) with a limit no request reaches, so every request takes
//! the allowed path; the generator checks the status and, for the layers, that the
//! decision's headers are there (no store failure let a request pass unchecked).
//!
//! On one client IP the rotation also has the Redis store's fixed-window layer without
//! headers on allowed answers, as the smallest-script handler answers. The Redis
//! store's batching is its defaults unless `REDLIMIT_MAX_PIPELINED` or
//! `REDLIMIT_MAX_BATCH` say otherwise, as in the throughput section.
//!
//! With `REDLIMIT_HTTP_LOAD=wrk` each turn is `wrk -t1 -c32` instead, in a process of
//! its own and in whole seconds: the load generator the HTTP targets were first
//! measured with. It checks every status but no headers, and gives each turn's p50
//! and p99 (the table shows their medians), not every request's latency.
//!
//! What each request costs beside its rate, per turn: the app's CPU, the CPU time of
//! the server runtime's threads (named `rl-http-server`: its workers, and any blocking
//! thread it starts) from `/proc/self/task/<tid>/schedstat`, so the load generator's
//! thread, in the same process, is not counted; and for the Redis-backed variants,
//! Redis's, the `used_cpu_user_main_thread` + `used_cpu_sys_main_thread` delta of `INFO
//! cpu`, read on a blocking connection from the main thread (on no runtime measured).
//! Both over the turn's requests.

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
/// The name of the server runtime's threads, whose CPU time is the app's.
const SERVER_THREADS: &str = "rl-http-server";
const TURN: Duration = Duration::from_millis(1_000);
const WARM_UP: Duration = Duration::from_millis(150);
const ROUNDS: u32 = 5;
/// Two variants closer than this are a tie: turns of one variant differ by more.
const TIE: f64 = 0.02;

fn app() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// Every variant's limit a second: never reached here (well above the requests/s
/// this machine serves), and under 2^25, as most limits are, so the store's reply
/// packs each outcome into one integer (10^9, this bench's limit before, took four:
/// BENCHMARKS.md, "One task").
const LIMIT: u32 = 1_000_000;

fn policy() -> Policy {
    Policy::sliding_window("http", LIMIT, Duration::from_secs(1)).expect("policy")
}

/// The fixed-window twin of [`policy`]: the Redis store's layer on the algorithm of the
/// smallest script, so the two differ by the layer and the store alone.
fn fixed_window_policy() -> Policy {
    Policy::fixed_window("http", LIMIT, Duration::from_secs(1)).expect("policy")
}

/// What every variant keys on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// The client IP: every request of the generator comes from 127.0.0.1, one hot
    /// subject.
    ClientIp,
    /// The `x-api-key` header: the generator's connections walk through
    /// [`API_KEYS`] keys, each request the next one of its connection's.
    ApiKeys,
}

/// The API keys the generator sends in [`Keys::ApiKeys`] turns.
const API_KEYS: usize = 100_000;
/// The header that carries them.
const API_KEY: &str = "x-api-key";

/// The hello world behind the least a Redis-backed limiter can do per request: one
/// `EVALSHA` of the smallest fixed-window script (`TIME`, `INCR`, `PEXPIRE` when new)
/// for the client IP on one redis-rs multiplexed connection, the count compared with
/// the policy's limit. The reference of the Redis store's layer.
fn smallest_script_app(conn: MultiplexedConnection, keys: Keys) -> Router {
    let (limit, window_ms) = (policy().limit(), policy().window_ms());
    let handler = move |ConnectInfo(peer): ConnectInfo<SocketAddr>,
                        headers: axum::http::HeaderMap| {
        let mut conn = conn.clone();
        async move {
            let key = match (keys, headers.get(API_KEY)) {
                (Keys::ApiKeys, Some(key)) => {
                    format!("rl:{{{}}}:http:fw", String::from_utf8_lossy(key.as_bytes()))
                }
                (Keys::ApiKeys, None) => return (StatusCode::UNAUTHORIZED, "no API key"),
                (Keys::ClientIp, _) => format!("rl:{{{}}}:http:fw", peer.ip()),
            };
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

/// The name of the Redis store's fixed-window layer without headers on allowed answers.
const REDIS_FIXED_QUIET: &str =
    "RateLimitLayer, Redis store, fixed window, headers_on_allowed(false)";

/// The name of tower-rate-limiter's variant.
const TOWER_RATE_LIMITER: &str = "tower-rate-limiter 0.1.6, Redis store, fixed window";

/// The hello world behind tower-rate-limiter 0.1.6's layer on its Redis store, on the
/// connection it is given (as its README builds it: a redis-rs multiplexed connection
/// with the client's defaults): a fixed window of [`fixed_window_policy`]'s limit and
/// window, keyed on the socket's client IP (`IpKeyExtractor`, from axum's
/// `ConnectInfo`). With its `redis-lua` feature (see Cargo.toml) each request is one
/// `EVALSHA` of its script: `INCR`, `PEXPIRE` when new, `PTTL`. Its allowed answers
/// carry its `RateLimit` headers.
///
/// Fail-open (`StoreFailureMode::Allow`), not its default fail-closed: its store fails
/// every call that finds the window's key in its last millisecond, where `PTTL` answers
/// 0 and the store rejects that as an invalid reset time ("redis returned invalid
/// reset-after milliseconds 0": 101 of 108,830 calls in 5 s on one key with a 1 s
/// window, measured here). Failing closed, those requests are 503s and the generator
/// stops; failing open, they pass without its headers and are counted in the column of
/// answers without the layer's headers. Either way the call went to Redis.
#[cfg(redlimit_peers)]
fn tower_rate_limiter_app(conn: MultiplexedConnection, keys: Keys) -> Router {
    use tower_rate_limiter::{IpKeyExtractor, RateLimitLayer, RedisStore, StoreFailureMode};
    let policy = fixed_window_policy();
    // One builder for both extractors: its type names the extractor.
    macro_rules! layer {
        ($extractor:expr) => {
            RateLimitLayer::builder($extractor)
                .policy_name("http")
                .limit(policy.limit())
                .window(Duration::from_millis(policy.window_ms()))
                .with_store(RedisStore::new(conn))
                .store_failure_mode(StoreFailureMode::Allow)
                .build()
                .expect("tower-rate-limiter layer")
        };
    }
    match keys {
        Keys::ClientIp => app().layer(layer!(IpKeyExtractor::new())),
        Keys::ApiKeys => app().layer(layer!(ApiKeyExtractor)),
    }
}

/// tower-rate-limiter's extractor of the `x-api-key` header (it has none built in).
#[cfg(redlimit_peers)]
#[derive(Clone, Copy)]
struct ApiKeyExtractor;

#[cfg(redlimit_peers)]
impl tower_rate_limiter::KeyExtractor for ApiKeyExtractor {
    type Key = String;

    fn extract<T>(
        &self,
        request: &::http::Request<T>,
    ) -> Result<String, tower_rate_limiter::RateLimitError> {
        request
            .headers()
            .get(API_KEY)
            .map(|key| String::from_utf8_lossy(key.as_bytes()).into_owned())
            .ok_or_else(|| {
                tower_rate_limiter::RateLimitError::Key("no_api_key".into(), "no x-api-key".into())
            })
    }
}

/// One variant of the app.
struct Variant {
    name: &'static str,
    /// Whether its responses carry the layer's `RateLimit` headers.
    headers: bool,
    /// Whether it sends a call to Redis per request (its Redis CPU is measured).
    redis: bool,
    router: Router,
}

/// The variants keyed on `keys` (on API keys, the Redis-backed ones beside bare
/// axum). `smallest`: the connection of the handler that sends the smallest script;
/// `peer`: tower-rate-limiter's; both opened on the server's runtime (their driver
/// tasks run there).
fn variants(
    server: &RedisServer,
    smallest: MultiplexedConnection,
    peer: Option<MultiplexedConnection>,
    keys: Keys,
) -> Vec<Variant> {
    // The hello world behind the Redis store's layer of `policy`, with or without its
    // headers on allowed answers; the store's batching as set in the environment
    // (`REDLIMIT_MAX_PIPELINED`, `REDLIMIT_MAX_BATCH`), else its defaults.
    let redis_app_with = |policy, headers_on_allowed| {
        let store = RedisStore::new(server.pool())
            .timeout(Duration::from_secs(1))
            .max_pipelined(env_usize("REDLIMIT_MAX_PIPELINED", 2))
            .max_batch(env_usize("REDLIMIT_MAX_BATCH", 32));
        let limiter = Limiter::new(store, policy);
        match keys {
            Keys::ClientIp => app().layer(
                RateLimitLayer::new(limiter, ClientIp::new())
                    .headers_on_allowed(headers_on_allowed),
            ),
            Keys::ApiKeys => {
                let header = redlimit::key::Header::plain(API_KEY).expect("a header name");
                app().layer(
                    RateLimitLayer::new(limiter, header).headers_on_allowed(headers_on_allowed),
                )
            }
        }
    };
    let redis_app = |policy| redis_app_with(policy, true);
    let variant = |name, headers, redis, router| Variant {
        name,
        headers,
        redis,
        router,
    };
    let mut variants = vec![variant("bare axum", false, false, app())];
    if keys == Keys::ClientIp {
        let mut governor = tower_governor::governor::GovernorConfigBuilder::default();
        governor.per_nanosecond(1).burst_size(u32::MAX);
        let governor = governor.finish().expect("tower_governor config");
        variants.extend([
            variant(
                "RateLimitLayer, memory store",
                true,
                false,
                app().layer(RateLimitLayer::new(
                    Limiter::new(MemoryStore::new(), policy()),
                    ClientIp::new(),
                )),
            ),
            variant(
                "RateLimitLayer, memory store, headers_on_allowed(false)",
                false,
                false,
                app().layer(
                    RateLimitLayer::new(
                        Limiter::new(MemoryStore::new(), policy()),
                        ClientIp::new(),
                    )
                    .headers_on_allowed(false),
                ),
            ),
            variant(
                "RateLimitLayer, Redis store",
                true,
                true,
                redis_app(policy()),
            ),
            variant(
                "tower_governor 0.8",
                false,
                false,
                app().layer(tower_governor::GovernorLayer::new(governor)),
            ),
        ]);
    }
    variants.extend([
        variant(
            "RateLimitLayer, Redis store, fixed window",
            true,
            true,
            redis_app(fixed_window_policy()),
        ),
        variant(
            "handler sending one smallest fixed-window script",
            false,
            true,
            smallest_script_app(smallest, keys),
        ),
    ]);
    if keys == Keys::ClientIp {
        // The handler sends no headers: the layer without them on allowed answers, to
        // tell what they cost from what the store's path does.
        variants.push(variant(
            REDIS_FIXED_QUIET,
            false,
            true,
            redis_app_with(fixed_window_policy(), false),
        ));
    }
    // tower-rate-limiter last, in a build that has it.
    #[cfg(redlimit_peers)]
    variants.extend(peer.map(|conn| {
        variant(
            TOWER_RATE_LIMITER,
            true,
            true,
            tower_rate_limiter_app(conn, keys),
        )
    }));
    #[cfg(not(redlimit_peers))]
    let _ = peer;
    variants
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
    /// wrk's p50 and p99 for the turn, ms (wrk keeps no latency per request).
    percentiles: Option<(f64, f64)>,
}

/// What sends the turns' requests.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Generator {
    /// [`load`]: a hyper client on a thread of this process.
    InProcess,
    /// [`load_wrk`]: `wrk -t1 -c32`, in a process of its own.
    Wrk,
}

impl Generator {
    /// `REDLIMIT_HTTP_LOAD`: `wrk`, or unset (or empty) for the in-process generator.
    fn from_env() -> Self {
        match std::env::var("REDLIMIT_HTTP_LOAD").as_deref() {
            Err(_) | Ok("") => Generator::InProcess,
            Ok("wrk") => Generator::Wrk,
            Ok(other) => panic!("REDLIMIT_HTTP_LOAD={other:?}: `wrk`, or unset"),
        }
    }
}

/// `wrk -t1 -c{CONNECTIONS}` on `addr` for `turn` (whole seconds, at least one),
/// each request with the next API key when `keys` says so (benches/wrk/walk_keys.lua).
fn load_wrk(addr: SocketAddr, turn: Duration, keys: Keys) -> Load {
    let secs = turn.as_secs().max(1);
    let mut wrk = std::process::Command::new("wrk");
    wrk.args([
        "-t1",
        &format!("-c{CONNECTIONS}"),
        &format!("-d{secs}s"),
        "--latency",
    ]);
    if keys == Keys::ApiKeys {
        wrk.args([
            "-s",
            concat!(env!("CARGO_MANIFEST_DIR"), "/wrk/walk_keys.lua"),
        ]);
    }
    let out = wrk
        .arg(format!("http://{addr}/"))
        .output()
        .unwrap_or_else(|e| panic!("REDLIMIT_HTTP_LOAD=wrk needs wrk (apt-get install wrk): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("Non-2xx") && !text.contains("Socket errors"),
        "wrk saw answers other than 200, or socket errors: {text}"
    );
    // "  73528 requests in 1.00s, 9.19MB read"
    let (requests, time) = text
        .lines()
        .find_map(|line| {
            let (n, rest) = line.trim().split_once(" requests in ")?;
            let secs = wrk_duration_ms(rest.split(',').next()?)? / 1_000.0;
            Some((n.parse::<u64>().ok()?, Duration::from_secs_f64(secs)))
        })
        .unwrap_or_else(|| panic!("no request count in wrk's output: {text}"));
    // "     50%  383.00us" under "Latency Distribution"
    let percentile = |p: &str| {
        text.lines()
            .find_map(|line| wrk_duration_ms(line.trim().strip_prefix(p)?.trim()))
            .unwrap_or_else(|| panic!("no {p} latency in wrk's output: {text}"))
    };
    Load {
        requests,
        time,
        latencies: Vec::new(),
        unchecked: 0,
        percentiles: Some((percentile("50%"), percentile("99%"))),
    }
}

/// A wrk duration (`383.00us`, `1.20ms`, `1.00s`) in ms.
fn wrk_duration_ms(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60e3)
    } else {
        return None;
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// `CONNECTIONS` connections sending requests to `addr` for `turn`, with an API key
/// each (`keys`).
fn load(addr: SocketAddr, turn: Duration, headers: bool, keys: Keys) -> Load {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("generator runtime");
        rt.block_on(async move {
            let start = Instant::now();
            let deadline = start + turn;
            let mut tasks = tokio::task::JoinSet::new();
            for connection in 0..CONNECTIONS {
                tasks.spawn(async move {
                    // Each connection walks its own stretch of the keys.
                    let mut key = connection * (API_KEYS / CONNECTIONS);
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
                        let mut request = ::http::Request::builder()
                            .uri("/")
                            .header("host", "127.0.0.1");
                        if keys == Keys::ApiKeys {
                            key = (key + 1) % API_KEYS;
                            request = request.header(API_KEY, format!("key-{key:06}"));
                        }
                        let request = request.body(Empty::<bytes::Bytes>::new()).expect("request");
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
    measure(server, Keys::ClientIp);
    measure(server, Keys::ApiKeys);
}

/// One table: every variant keyed on `keys`, in rotation, and its targets.
fn measure(server: &RedisServer, keys: Keys) {
    let (turn_length, warm_up) = (scaled(TURN), scaled(WARM_UP));
    let generator = Generator::from_env();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SERVER_THREADS)
        .enable_all()
        .build()
        .expect("server runtime");
    let mut served = Vec::new();
    let smallest = server_rt.block_on(connect(server));
    let peer = cfg!(redlimit_peers).then(|| server_rt.block_on(server.conn()));
    for Variant {
        name,
        headers,
        redis,
        router,
    } in variants(server, smallest, peer, keys)
    {
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
        served.push((name, headers, redis, addr));
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); served.len()];
    let mut latencies: Vec<Vec<u32>> = vec![Vec::new(); served.len()];
    let mut unchecked = vec![0; served.len()];
    // Per turn, µs per request: the server runtime's CPU, and Redis's.
    let mut app_cpu: Vec<Vec<f64>> = vec![Vec::new(); served.len()];
    let mut redis_cpu: Vec<Vec<f64>> = vec![Vec::new(); served.len()];
    // Per turn: Redis script calls per request (a batch of checks is one).
    let mut calls: Vec<Vec<f64>> = vec![Vec::new(); served.len()];
    // Per turn, with wrk: its p50 and p99, ms.
    let mut turn_percentiles: Vec<Vec<(f64, f64)>> = vec![Vec::new(); served.len()];
    let mut info = blocking_conn(server);
    for round in 0..ROUNDS {
        for (i, (_, headers, _, addr)) in served.iter().enumerate() {
            load(*addr, warm_up, *headers, keys);
            let (redis_before, calls_before) = (
                redis_cpu_s_blocking(&mut info),
                script_calls_blocking(&mut info),
            );
            let app_before = machine::threads_cpu_ns(SERVER_THREADS);
            let turn = match generator {
                Generator::InProcess => load(*addr, turn_length, *headers, keys),
                Generator::Wrk => load_wrk(*addr, turn_length, keys),
            };
            let app = machine::threads_cpu_ns(SERVER_THREADS).saturating_sub(app_before);
            let redis = redis_cpu_s_blocking(&mut info) - redis_before;
            let requests = turn.requests.max(1) as f64;
            calls[i].push((script_calls_blocking(&mut info) - calls_before) as f64 / requests);
            rates[i].push(turn.requests as f64 / turn.time.as_secs_f64());
            app_cpu[i].push(app as f64 / 1_000.0 / requests);
            redis_cpu[i].push(redis * 1e6 / requests);
            latencies[i].extend(turn.latencies);
            turn_percentiles[i].extend(turn.percentiles);
            unchecked[i] += turn.unchecked;
        }
        eprintln!(
            "http ({}): round {} of {ROUNDS} done",
            keys.name(),
            round + 1
        );
    }
    drop(server_rt);

    println!();
    match keys {
        Keys::ClientIp => println!("## HTTP end to end"),
        Keys::ApiKeys => println!("### The same on {} API keys", thousands(API_KEYS as f64)),
    }
    println!();
    println!(
        "A hello-world axum 0.8 app on loopback, served with connect info on a 2-worker tokio runtime; \
         {}: {CONNECTIONS} keep-alive \
         connections, one request in flight each, {ROUNDS} turns of {} ms per variant in rotation (each after \
         {} ms of warm-up). Requests/s is the median turn, a ratio the median of the ratios of one round's turns; {}. Every variant keys \
         on {}; the limits admit everything. App CPU: the CPU time of the server runtime's threads \
         (not the generator's) over the turn, per request; Redis CPU: the main thread's \
         `used_cpu_user_main_thread` + `used_cpu_sys_main_thread` delta over the turn, per request (the \
         Redis-backed variants); both the median turn.",
        match generator {
            Generator::InProcess => "a Rust load generator in the same process (hyper 1 client, one thread)",
            Generator::Wrk => "wrk in a process of its own (`wrk -t1 -c32 --latency`, with benches/wrk/walk_keys.lua on API keys)",
        },
        match generator {
            Generator::InProcess => turn_length.as_millis(),
            Generator::Wrk => u128::from(turn_length.as_secs().max(1)) * 1_000,
        },
        warm_up.as_millis(),
        match generator {
            Generator::InProcess => "latencies over every request of the variant",
            Generator::Wrk => "latencies the median of its turns' wrk p50 and p99 (wrk checks no headers: that column is empty)",
        },
        match keys {
            Keys::ClientIp => "the client IP (every request from 127.0.0.1: one hot subject)".to_owned(),
            Keys::ApiKeys => format!(
                "the `{API_KEY}` header, each connection's requests walking through its share of \
                 {} keys (`Header::plain` for redlimit, its own extractor for tower-rate-limiter)",
                thousands(API_KEYS as f64)
            ),
        },
    );
    println!();
    println!("| variant | requests/s (median) | slowest / fastest turn | vs bare | p50 latency | p99 latency | answers without the layer's headers | app CPU per request | Redis CPU per request | Redis calls per request |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
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
    // The median of the per-round ratios of `x[a]` to `x[b]`.
    let ratio_of = |x: &[Vec<f64>], a: usize, b: usize| {
        let per_round: Vec<f64> = x[a].iter().zip(&x[b]).map(|(p, q)| p / q).collect();
        median(&per_round)
    };
    for latencies in &mut latencies {
        latencies.sort_unstable();
    }
    // Variant `i`'s percentile `p` (0.5 or 0.99), ms: over its requests, or with wrk
    // the median of its turns'.
    let latency = |i: usize, p: f64| {
        if turn_percentiles[i].is_empty() {
            percentile(&latencies[i], p)
        } else {
            let turns: Vec<f64> = turn_percentiles[i]
                .iter()
                .map(|&(p50, p99)| if p < 0.9 { p50 } else { p99 })
                .collect();
            median(&turns)
        }
    };
    for (i, (name, headers, redis, _)) in served.iter().enumerate() {
        let rate = median(&rates[i]);
        let slowest = rates[i].iter().cloned().fold(f64::MAX, f64::min);
        let fastest = rates[i].iter().cloned().fold(f64::MIN, f64::max);
        println!(
            "| {name} | {} | {} / {} | {:.3}x | {:.2} ms | {:.2} ms | {} | {:.2} µs | {} | {} |",
            thousands(rate),
            thousands(slowest),
            thousands(fastest),
            ratio(i, 0),
            latency(i, 0.50),
            latency(i, 0.99),
            if *headers && generator == Generator::InProcess {
                unchecked[i].to_string()
            } else {
                "—".to_owned()
            },
            median(&app_cpu[i]),
            if *redis {
                format!("{:.2} µs", median(&redis_cpu[i]))
            } else {
                "—".to_owned()
            },
            if *redis {
                format!("{:.3}", median(&calls[i]))
            } else {
                "—".to_owned()
            },
        );
    }
    let find = |name: &str| served.iter().position(|(n, _, _, _)| *n == name);
    let at = |name: &str| find(name).unwrap_or_else(|| panic!("no variant {name:?}"));
    let (bare, redis_fixed, smallest) = (
        at("bare axum"),
        at("RateLimitLayer, Redis store, fixed window"),
        at("handler sending one smallest fixed-window script"),
    );
    let redis_fixed_vs_smallest = ratio(redis_fixed, smallest);
    let redis_fixed_cpu_vs_smallest = ratio_of(&redis_cpu, redis_fixed, smallest);
    let peer = find(TOWER_RATE_LIMITER).map(|peer| {
        (
            ratio(redis_fixed, peer),
            ratio_of(&redis_cpu, redis_fixed, peer),
            ratio_of(&app_cpu, redis_fixed, peer),
        )
    });
    println!();
    println!("#### Targets ({})", keys.name());
    println!();
    if keys == Keys::ClientIp {
        let (memory, quiet, redis, governor) = (
            at("RateLimitLayer, memory store"),
            at("RateLimitLayer, memory store, headers_on_allowed(false)"),
            at("RateLimitLayer, Redis store"),
            at("tower_governor 0.8"),
        );
        let (memory_vs_governor, quiet_vs_governor) =
            (ratio(memory, governor), ratio(quiet, governor));
        let memory_cpu_vs_governor = ratio_of(&app_cpu, memory, governor);
        let redis_vs_smallest = ratio(redis, smallest);
        let (memory, quiet, redis, governor, smallest) = (
            ratio(memory, bare),
            ratio(quiet, bare),
            ratio(redis, bare),
            ratio(governor, bare),
            ratio(smallest, bare),
        );
        println!(
            "- memory store {memory:.3}x bare (target >= 0.95x: {}); {memory_vs_governor:.3}x tower_governor \
             (target: not behind it, a tie within {:.0}%: {}), {memory_cpu_vs_governor:.3}x its app CPU per \
             request (target <= 1.05x: {}); tower_governor itself: {governor:.3}x bare",
            met(memory >= 0.95),
            TIE * 100.0,
            met(memory_vs_governor >= 1.0 - TIE),
            met(memory_cpu_vs_governor <= 1.05),
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
             per request (target >= 0.85x: {}); that handler itself: {smallest:.3}x bare",
            met(redis_vs_smallest >= 0.85),
        );
    }
    println!(
        "- Redis store on a fixed window {redis_fixed_vs_smallest:.3}x the handler sending one smallest \
         fixed-window script (target >= 0.9x: {}), {redis_fixed_cpu_vs_smallest:.3}x its Redis CPU per request",
        met(redis_fixed_vs_smallest >= 0.9),
    );
    if let Some(quiet) = find(REDIS_FIXED_QUIET) {
        println!(
            "- the same without headers on allowed answers (as the handler answers): {:.3}x the handler's \
             requests/s, {:.3}x its app CPU per request",
            ratio(quiet, smallest),
            ratio_of(&app_cpu, quiet, smallest),
        );
    }
    match peer {
        Some((rate, redis_cpu, app_cpu)) => println!(
            "- Redis store on a fixed window {rate:.3}x tower-rate-limiter 0.1.6's requests/s (target >= \
             1.15x: {}), {redis_cpu:.3}x its Redis CPU per request (target <= 0.8x: {}), {app_cpu:.3}x its \
             app CPU per request",
            met(rate >= 1.15),
            met(redis_cpu <= 0.8),
        ),
        None => println!(
            "- tower-rate-limiter 0.1.6 not in this build (it wants rustc 1.96): \
             `RUSTFLAGS=\"--cfg redlimit_peers\" cargo bench -p redlimit-bench --bench tables --ignore-rust-version -- http` \
             measures it (targets: the fixed-window Redis layer >= 1.15x its requests/s, <= 0.8x its Redis \
             CPU per request)"
        ),
    }
}

impl Keys {
    fn name(self) -> &'static str {
        match self {
            Keys::ClientIp => "one client IP",
            Keys::ApiKeys => "API keys",
        }
    }
}
