//! Every outage shape a Redis store meets, met the way users meet it: concurrent
//! requests through an axum `Router` whose handler takes `Extension<Decision>` (the
//! README's pattern), on a real `redis-server` the test starts, breaks and mends.
//!
//! Shapes: the server stopped (SIGKILL, then restarted on its port); paused
//! (SIGSTOP: its sockets stay open, nothing answers); refusing writes
//! (`maxmemory 1`, `noeviction`: an OOM error reply); `SCRIPT FLUSH` and `FUNCTION FLUSH` mid-load; the
//! store's connection killed (`CLIENT KILL`). Each in each failure mode: open (the
//! handler runs), closed (503 + `Retry-After`), and a local fallback (decisions from
//! memory). For each: every request is answered (counted by what answered it), never
//! with a 500, within the store's timeout plus a margin, and within one second of
//! recovery the store decides again, limit enforced.

use crate::support;
use redlimit::store::StoreErrorKind;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use deadpool_redis::redis;
use http::{Request, Response, StatusCode};
use redlimit::key::Header;
use redlimit::layer::FailureMode;
use redlimit::{Decision, Error, Limiter, MemoryStore, Origin, Policy, RateLimitLayer, RedisStore};
use support::{command_calls, RedisServer};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// The store's call timeout: its default.
const TIMEOUT: Duration = Duration::from_millis(50);
/// How late past [`TIMEOUT`] an answer may come. The store's deadline is a tokio
/// timer (1 ms ticks), and the layer, the handler and a fallback decision take
/// microseconds; the rest is waiting for a core: two of these tests run at once,
/// each with its load tasks and its redis-server, on a 2-core machine shared with
/// other builds, where a ready task can wait a few scheduler slices (tens of ms).
/// 150 ms is three times the timeout, and a stalled call (a hang) is far past it.
const MARGIN: Duration = Duration::from_millis(150);
/// The policy: exact (sliding log, on Redis TIME), in a window no run outlasts.
const LIMIT: u32 = 5;
const WINDOW: Duration = Duration::from_secs(3_600);
/// Requests per load subject: `LIMIT` admitted, then denials.
const PER_SUBJECT: usize = LIMIT as usize + 3;
/// Concurrent load tasks, and the most requests one sends.
const TASKS: usize = 8;
const MAX_REQUESTS_PER_TASK: usize = 5_000;
/// A request not answered by then is counted unanswered (and fails the test).
const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// The store decides again within this of the recovery.
const BACK_WITHIN: Duration = Duration::from_secs(1);

/// How the layer answers when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Open,
    Closed,
    Fallback,
}

/// What happens to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// SIGKILL, 500 ms with nothing on the port, restarted.
    Stopped,
    /// SIGSTOP for 1.5 s (past the store's 1 s stall detection, so the store also
    /// meets a reconnection that hangs), then SIGCONT. Not `DEBUG SLEEP`: Redis 7
    /// refuses `DEBUG` unless started with `enable-debug-command`, and a stopped
    /// process is what a client sees of a frozen host too: the kernel still accepts
    /// connections, nothing answers.
    Paused,
    /// `maxmemory 1` with `noeviction` for 500 ms: every write refused with `-OOM`.
    OutOfMemory,
    /// Five `SCRIPT FLUSH` + `FUNCTION FLUSH`es, 100 ms apart: the server forgets
    /// the store's Lua. The store meets "Function not found", sends that call as its
    /// script in full and loads its library again in the background, so no request
    /// should notice: no failure answer at all, and at least one `FUNCTION LOAD` per
    /// flush.
    ScriptFlush,
    /// Three `CLIENT KILL TYPE normal SKIPME yes`, 200 ms apart: each must find
    /// exactly one connection, the store's, reconnected since the last.
    ClientKill,
}

impl Shape {
    /// Whether the store cannot decide at all while the shape lasts.
    fn store_fails(self) -> bool {
        matches!(self, Shape::Stopped | Shape::Paused | Shape::OutOfMemory)
    }
}

/// Phases of a run, as the load sees them when it sends a request.
const HEALTHY: usize = 0;
const OUTAGE: usize = 1;
const BACK: usize = 2;
const PHASES: [&str; 3] = ["healthy", "outage", "back"];

/// What answered one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Answer {
    /// 200: the handler ran with a decision from this origin: the store's with the
    /// rate-limit headers, `FailOpen` for a request let through unchecked.
    Passed(Origin),
    /// 429 with `Retry-After`.
    Denied,
    /// 503 with `Retry-After: 1`.
    Unavailable,
    /// Anything else: a 500 (the handler found no decision), a 200 from the store
    /// without its headers, a 429 or 503 without `Retry-After`.
    Wrong(u16, &'static str),
    /// Nothing within [`ANSWER_DEADLINE`].
    Unanswered,
}

impl Answer {
    /// Whether the layer answered as `mode` says for a store that failed.
    fn is_failure_answer(self, mode: Mode) -> bool {
        match mode {
            Mode::Open => self == Answer::Passed(Origin::FailOpen),
            Mode::Closed => self == Answer::Unavailable,
            Mode::Fallback => self == Answer::Passed(Origin::Fallback),
        }
    }

    /// Whether `mode` may answer this at all.
    fn allowed_in(self, mode: Mode) -> bool {
        matches!(self, Answer::Passed(Origin::Store) | Answer::Denied)
            || self.is_failure_answer(mode)
    }
}

/// One request of the load.
#[derive(Debug)]
struct Sample {
    phase: usize,
    subject: String,
    answer: Answer,
    latency: Duration,
}

/// The README's handler: it takes the decision from the request's extensions, and
/// says where it came from and whether the request was checked.
async fn handler(Extension(decision): Extension<Decision>) -> String {
    format!("{} {}", decision.origin().as_str(), decision.is_checked())
}

fn app(store: RedisStore, mode: Mode) -> Router {
    let policy = Policy::sliding_log("outage", LIMIT, WINDOW).unwrap();
    let mut limiter = Limiter::builder(store).policy(policy);
    let failure_mode = match mode {
        Mode::Open => FailureMode::Open,
        Mode::Closed => FailureMode::Closed,
        Mode::Fallback => {
            limiter = limiter.fallback(MemoryStore::new());
            FailureMode::Open
        }
    };
    let limiter = limiter.build().unwrap();
    let layer = RateLimitLayer::new(limiter, Header::plain("x-subject").unwrap())
        .failure_mode(failure_mode);
    Router::new().route("/", get(handler)).layer(layer)
}

/// Sends one request as `subject` and says what answered it.
async fn ask(app: &Router, subject: &str) -> Answer {
    let request = Request::builder()
        .uri("/")
        .header("x-subject", subject)
        .body(Body::empty())
        .unwrap();
    match tokio::time::timeout(ANSWER_DEADLINE, app.clone().oneshot(request)).await {
        Ok(Ok(response)) => classify(response).await,
        Ok(Err(never)) => match never {},
        Err(_) => Answer::Unanswered,
    }
}

async fn classify(response: Response<Body>) -> Answer {
    let status = response.status();
    let headers = response.headers();
    let retry_after = headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let limit_headers =
        headers.contains_key("ratelimit") && headers.contains_key("ratelimit-policy");
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    match status {
        StatusCode::OK => match &body[..] {
            b"store true" if limit_headers => Answer::Passed(Origin::Store),
            b"store true" => Answer::Wrong(200, "a store decision without its headers"),
            b"fallback true" => Answer::Passed(Origin::Fallback),
            b"block_cache true" => Answer::Passed(Origin::BlockCache),
            b"fail_open false" => Answer::Passed(Origin::FailOpen),
            _ => Answer::Wrong(200, "an unknown origin, or checked wrongly"),
        },
        StatusCode::TOO_MANY_REQUESTS if retry_after.is_some() => Answer::Denied,
        StatusCode::TOO_MANY_REQUESTS => Answer::Wrong(429, "no Retry-After"),
        StatusCode::SERVICE_UNAVAILABLE if retry_after.as_deref() == Some("1") => {
            Answer::Unavailable
        }
        StatusCode::SERVICE_UNAVAILABLE => Answer::Wrong(503, "no Retry-After: 1"),
        other => Answer::Wrong(other.as_u16(), "unexpected status"),
    }
}

/// One load task: requests back to back (2 ms apart) until told to stop, each
/// recorded with the phase it was sent in. Subjects change every [`PER_SUBJECT`]
/// requests and with the phase.
async fn load(
    app: Router,
    task: usize,
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    for i in 0..MAX_REQUESTS_PER_TASK {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let phase = phase.load(Ordering::Relaxed);
        let subject = format!("t{task}:{}:{}", PHASES[phase], i / PER_SUBJECT);
        let started = Instant::now();
        let answer = ask(&app, &subject).await;
        samples.push(Sample {
            phase,
            subject,
            answer,
            latency: started.elapsed(),
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    samples
}

/// Until the store has its first connection (which a loaded machine may not make
/// within one call's timeout), within 5 s.
async fn warm_up(app: &Router) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = ask(app, "warm").await;
        if answer == Answer::Passed(Origin::Store) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no store decision within 5 s: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fresh subjects, one request after another, until one is decided by the store
/// exactly: `LIMIT` admitted with the store's headers, then a 429. Returns when that
/// subject's first request was sent after `recovered`, and the probes it took.
async fn decided_again(app: &Router, recovered: Instant) -> (Duration, usize) {
    let mut probes = 0;
    'probe: loop {
        let started = recovered.elapsed();
        assert!(
            started < BACK_WITHIN,
            "the store did not decide again within {BACK_WITHIN:?} of the recovery ({probes} probes)"
        );
        probes += 1;
        let subject = format!("probe:{probes}");
        for n in 0..=LIMIT {
            let answer = ask(app, &subject).await;
            assert!(
                !matches!(answer, Answer::Wrong(..) | Answer::Unanswered),
                "{subject} after the recovery: {answer:?}"
            );
            let expected = if n < LIMIT {
                Answer::Passed(Origin::Store)
            } else {
                Answer::Denied
            };
            if answer != expected {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue 'probe;
            }
        }
        return (started, probes);
    }
}

/// `CONFIG SET name value` on the test's own connection.
async fn config_set(conn: &mut redis::aio::MultiplexedConnection, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// Breaks Redis as `shape` says, mends it, and returns when it was mended.
///
/// For the shapes where the store cannot decide at all, the outage phase is exactly
/// the requests sent and answered while Redis was broken: it begins once the break
/// has taken effect, and ends [`TIMEOUT`] + [`MARGIN`] (the longest a request may
/// take) before the mend. The requests in between count as back.
async fn break_and_mend(
    shape: Shape,
    server: &mut RedisServer,
    direct: &Limiter<RedisStore>,
    phase: &AtomicUsize,
) -> Instant {
    let enter = |next: usize| phase.store(next, Ordering::Relaxed);
    // Back, once every request sent during the outage has been answered.
    let end_outage = || {
        enter(BACK);
        tokio::time::sleep(TIMEOUT + MARGIN)
    };
    match shape {
        Shape::Stopped => {
            tokio::task::block_in_place(|| server.stop());
            enter(OUTAGE);
            tokio::time::sleep(Duration::from_millis(500)).await;
            end_outage().await;
            tokio::task::block_in_place(|| server.restart());
        }
        Shape::Paused => {
            let paused = tokio::task::block_in_place(|| server.pause());
            enter(OUTAGE);
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            end_outage().await;
            tokio::task::block_in_place(|| paused.resume());
        }
        Shape::OutOfMemory => {
            let mut control = server.conn().await;
            config_set(&mut control, "maxmemory-policy", "noeviction").await;
            config_set(&mut control, "maxmemory", "1").await;
            enter(OUTAGE);
            tokio::time::sleep(Duration::from_millis(250)).await;
            // The refusal is a store failure that says what happened: not a denial,
            // not the client's fault.
            match direct.check("oom-probe", 1).await {
                Err(Error::Store(e)) => {
                    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
                    assert!(e.to_string().contains("OOM"), "{e}");
                }
                other => panic!("a check refused by an out-of-memory Redis: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            end_outage().await;
            config_set(&mut control, "maxmemory", "0").await;
        }
        Shape::ScriptFlush => {
            let mut control = server.conn().await;
            let loads = |calls: std::collections::HashMap<String, u64>| {
                calls.get("function|load").copied().unwrap_or(0)
            };
            let loads_before = loads(command_calls(&mut control).await);
            enter(OUTAGE);
            const FLUSHES: u64 = 5;
            for _ in 0..FLUSHES {
                for what in ["SCRIPT", "FUNCTION"] {
                    let () = redis::cmd(what)
                        .arg("FLUSH")
                        .query_async(&mut control)
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            enter(BACK);
            // The store loads its library only when the server lacks it: at least
            // once per flush, or the flushes went unseen.
            let reloads = loads(command_calls(&mut control).await) - loads_before;
            assert!(reloads >= FLUSHES, "{reloads} loads for {FLUSHES} flushes");
        }
        Shape::ClientKill => {
            let mut control = server.conn().await;
            enter(OUTAGE);
            for kill in 0..3 {
                let killed: u64 = support::kill_other_clients()
                    .query_async(&mut control)
                    .await
                    .unwrap();
                // The store's one connection, a new one each time: it reconnected.
                assert_eq!(killed, 1, "kill {kill}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            enter(BACK);
        }
    }
    Instant::now()
}

/// Counts of each answer in each phase.
fn tally(samples: &[Sample]) -> [HashMap<Answer, usize>; 3] {
    let mut tally: [HashMap<Answer, usize>; 3] = Default::default();
    for sample in samples {
        *tally[sample.phase].entry(sample.answer).or_default() += 1;
    }
    tally
}

async fn outage(shape: Shape, mode: Mode) {
    let mut server = RedisServer::start();
    let store = RedisStore::new(server.pool()).timeout(TIMEOUT);
    // The same store (one connection) without the layer, for what the router hides.
    let direct = Limiter::new(
        store.clone(),
        Policy::sliding_log("direct", LIMIT, WINDOW).unwrap(),
    );
    let app = app(store, mode);
    warm_up(&app).await;

    let phase = Arc::new(AtomicUsize::new(HEALTHY));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        tasks.spawn(load(
            app.clone(),
            task,
            Arc::clone(&phase),
            Arc::clone(&stop),
        ));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let recovered = break_and_mend(shape, &mut server, &direct, &phase).await;
    let (back_after, probes) = decided_again(&app, recovered).await;
    // The load runs on a little with the store deciding, then stops.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    while let Some(done) = tasks.join_next().await {
        samples.extend(done.expect("a load task panicked"));
    }

    let tally = tally(&samples);
    let max_latency = |phase: usize| {
        samples
            .iter()
            .filter(|s| s.phase == phase)
            .map(|s| s.latency)
            .max()
            .unwrap_or_default()
    };
    eprintln!(
        "{shape:?} / {mode:?}: {} requests; decided by the store again {back_after:?} after \
         the recovery ({probes} probes)",
        samples.len()
    );
    for (phase, name) in PHASES.iter().enumerate() {
        eprintln!(
            "  {name}: max latency {:?}, {:?}",
            max_latency(phase),
            tally[phase]
        );
    }

    // Every request answered, as the mode says, never with a 500, in time.
    for sample in &samples {
        assert!(
            sample.answer.allowed_in(mode),
            "{shape:?} / {mode:?}: {} in the {} phase answered {:?}",
            sample.subject,
            PHASES[sample.phase],
            sample.answer
        );
        assert!(
            sample.latency <= TIMEOUT + MARGIN,
            "{shape:?} / {mode:?}: {} in the {} phase took {:?}",
            sample.subject,
            PHASES[sample.phase],
            sample.latency
        );
    }
    // Whoever decided (the store or the fallback; failing open decides nothing), a
    // subject is never admitted past the limit by one decider.
    let mut admitted: HashMap<(&str, Origin), u32> = HashMap::new();
    for sample in &samples {
        if let Answer::Passed(origin) = sample.answer {
            if origin != Origin::FailOpen {
                *admitted.entry((&sample.subject, origin)).or_default() += 1;
            }
        }
    }
    for ((subject, origin), admitted) in admitted {
        assert!(
            admitted <= LIMIT,
            "{subject}: {admitted} admitted by the {origin:?}"
        );
    }

    let count = |phase: usize, keep: &dyn Fn(Answer) -> bool| -> usize {
        tally[phase]
            .iter()
            .filter(|(a, _)| keep(**a))
            .map(|(_, n)| n)
            .sum()
    };
    let all = |phase| count(phase, &|_| true);
    assert!(count(HEALTHY, &|a| a == Answer::Passed(Origin::Store)) > 0);
    assert!(count(BACK, &|a| a == Answer::Passed(Origin::Store)) > 0);
    let failure_answers = count(OUTAGE, &|a| a.is_failure_answer(mode));
    if shape.store_fails() {
        // Every request sent and answered while Redis was broken is answered as the
        // mode says; with a fallback, its denials too (the phase's subjects are new,
        // so no denial can be the store's).
        let denials = count(OUTAGE, &|a| a == Answer::Denied);
        let undecided = match mode {
            Mode::Fallback => {
                assert!(denials > 0, "{shape:?}: the fallback never denied");
                failure_answers + denials
            }
            Mode::Open | Mode::Closed => failure_answers,
        };
        assert!(all(OUTAGE) > 0);
        assert_eq!(
            undecided,
            all(OUTAGE),
            "{shape:?} / {mode:?}: outage requests not answered as the store failed"
        );
    }
    if shape == Shape::ScriptFlush {
        // The store meets "Function not found", answers that call through its script
        // and loads its library in the background: no request even notices.
        assert_eq!(
            failure_answers, 0,
            "{mode:?}: requests failed across SCRIPT FLUSH"
        );
    }
    // The store holds one connection, whatever it went through: none leaked.
    let mut control = server.conn().await;
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("normal")
            .query_async(&mut control)
            .await
            .unwrap();
        // The store's and this one.
        if clients.lines().count() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{shape:?} / {mode:?}: connections left open:\n{clients}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.assert_every_key_expires().await;
}

macro_rules! outage_tests {
    ($($name:ident: $shape:ident, $mode:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            outage(Shape::$shape, Mode::$mode).await;
        }
    )*};
}

outage_tests! {
    stopped_fail_open: Stopped, Open;
    stopped_fail_closed: Stopped, Closed;
    stopped_fallback: Stopped, Fallback;
    paused_fail_open: Paused, Open;
    paused_fail_closed: Paused, Closed;
    paused_fallback: Paused, Fallback;
    out_of_memory_fail_open: OutOfMemory, Open;
    out_of_memory_fail_closed: OutOfMemory, Closed;
    out_of_memory_fallback: OutOfMemory, Fallback;
    script_flush_fail_open: ScriptFlush, Open;
    script_flush_fail_closed: ScriptFlush, Closed;
    script_flush_fallback: ScriptFlush, Fallback;
    client_kill_fail_open: ClientKill, Open;
    client_kill_fail_closed: ClientKill, Closed;
    client_kill_fallback: ClientKill, Fallback;
}

/// The README's refund: an axum handler that answers 500 (here when the request
/// says `x-fail`), `refund_on(5xx)`, a Redis store with a memory fallback.
fn refund_app(store: RedisStore, fallback: MemoryStore) -> (Router, Arc<Limiter<RedisStore>>) {
    let policy = Policy::sliding_log("refund", 2, WINDOW).unwrap();
    let limiter = Arc::new(
        Limiter::builder(store)
            .policy(policy)
            .fallback(fallback)
            .build()
            .unwrap(),
    );
    let layer =
        RateLimitLayer::from_shared(Arc::clone(&limiter), Header::plain("x-subject").unwrap())
            .failure_mode(FailureMode::Open)
            .refund_on(|status| status.is_server_error());
    let handler = |Extension(decision): Extension<Decision>, headers: http::HeaderMap| async move {
        let status = if headers.contains_key("x-fail") {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        (status, decision.origin().as_str())
    };
    (Router::new().route("/", get(handler)).layer(layer), limiter)
}

/// Sends one request as "k" (answered 500 when `fail`): its status and the origin of
/// its decision, as the handler saw it.
async fn refund_ask(app: &Router, fail: bool) -> (u16, String) {
    let mut request = Request::builder().uri("/").header("x-subject", "k");
    if fail {
        request = request.header("x-fail", "1");
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A refund goes where the cost went. With a limit of 2: one request passes, then
/// one is sent during a 300 ms `CLIENT PAUSE`, admitted by the fallback (the store
/// timed out after its call was written, and Redis runs it once the pause ends: on
/// the store's own socket a call that waited unwritten is written before it may time
/// out, while a pool's connection on a loaded machine may drop a call it had not
/// written yet), and its handler answers 500. Its refund belongs to the fallback, which counted it;
/// Redis must not be refunded a request it counted only by chance, so the next
/// request is denied. Control: the same 500 on a store decision is refunded in
/// Redis, and the next request passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_goes_where_the_cost_went() {
    for paused in [false, true] {
        let server = RedisServer::start();
        let fallback = MemoryStore::new();
        let store = RedisStore::from_url(&server.url())
            .unwrap()
            .timeout(TIMEOUT);
        let (app, limiter) = refund_app(store, fallback.clone());
        let deadline = Instant::now() + Duration::from_secs(5);
        while limiter.peek("warm", 1).await.unwrap().origin() != Origin::Store {
            assert!(Instant::now() < deadline, "no store decision within 5 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(refund_ask(&app, false).await, (200, "store".to_owned()));

        let mut control = server.conn().await;
        if paused {
            let () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(300)
                .arg("ALL")
                .query_async(&mut control)
                .await
                .unwrap();
        }
        let expected_origin = if paused { "fallback" } else { "store" };
        assert_eq!(
            refund_ask(&app, true).await,
            (500, expected_origin.to_owned()),
            "paused: {paused}"
        );
        // Once Redis answers the store's connection again, it has run everything sent
        // on it before (in order): the timed-out check, and a refund if one was sent
        // (a fallback's refund is done before its response is returned).
        let deadline = Instant::now() + Duration::from_secs(3);
        while limiter.peek("k", 1).await.unwrap().origin() != Origin::Store {
            assert!(Instant::now() < deadline, "Redis did not answer again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !paused {
            // The store's refund runs in a task of the layer's: one more round trip.
            while !limiter.peek("k", 1).await.unwrap().is_allowed() {
                assert!(Instant::now() < deadline, "the store's refund did not land");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        let next = refund_ask(&app, false).await;
        // What a check would leave in the fallback: 1 when it holds nothing for "k".
        let fallback_left =
            Limiter::new(fallback, Policy::sliding_log("refund", 2, WINDOW).unwrap())
                .peek("k", 1)
                .await
                .unwrap()
                .remaining();
        if paused {
            assert_eq!(
                next.0, 429,
                "Redis was refunded a fallback's decision: {next:?}"
            );
            assert_eq!(fallback_left, 1, "the fallback was not refunded");
        } else {
            assert_eq!(
                next,
                (200, "store".to_owned()),
                "the store's refund is lost"
            );
            assert_eq!(fallback_left, 1, "the fallback counted nothing");
        }
    }
}
