//! Leases (`redlimit::lease`) on real `redis-server` processes and on the memory store's
//! model of them, on a fake clock:
//!
//! - a hot subject is served from leases, a cold one never leases, and unspent units
//!   go back when a lease expires (by the sweep, which runs by itself);
//! - the leasing check in Lua and the model in Rust grant the same units;
//! - a denied hot subject is answered locally until it may ask again, with the
//!   store's denial;
//! - random arrivals through 2 to 8 instances sharing one Redis never admit beyond
//!   each algorithm's bound (zero for the window counters, `ceil(L / interval)` more
//!   burst for a token bucket), on every window;
//! - through the layer, leased answers carry the `RateLimit` headers and kept denials
//!   the store's `Retry-After`; a Redis that hangs or stops under a leasing subject
//!   is answered by the failure mode (open here), never a 429, and decisions resume;
//! - configurations that cannot lease are refused.

use crate::support;
use redlimit::internals::{AdminStore, GiveBack, LeaseAsk, LeaseStore, Operation};

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use redlimit::key::ClientIp;
use redlimit::{redis, Decision, RateLimitLayer};
use tower::ServiceExt;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use redlimit::clock::{Clock, FakeClock};
use redlimit::internals::LimiterInternals;
use redlimit::lease::Leases;
use redlimit::{BuildError, Limiter, MemoryStore, Origin, Policy, RedisStore};
use support::RedisServer;

/// One instance of a fleet: its own store (its own pool and connection) on the shared
/// fake clock, with leases.
fn instance(
    server: &RedisServer,
    clock: &FakeClock,
    policy: &Policy,
    leases: Leases,
) -> Limiter<RedisStore> {
    let store = server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(5));
    Limiter::builder(store)
        .policy(policy.clone())
        .local_clock(clock.clone())
        .leases(leases)
        .build()
        .expect("a set that can lease")
}

/// One step of the fake clock, in ms, for the tests that run many requests against
/// Redis: a second, where a real step takes a millisecond or so. Redis counts TTLs in
/// real time: with steps of a second, every TTL a call writes is a second or more, and
/// a key outlives, in real time, the steps the fake clock takes to reach its end
/// unless each takes about a second. (With steps of a millisecond, the loss tests'
/// fixed window key, written when the limit was reached, expired in real time before
/// the 1,400 denials after it had run on a busy machine, and the control without
/// leases admitted 2,391 of 2,000; a lease granted 2 ms before its window ends is
/// lost by a step that takes 2 ms.)
const STEP_MS: u64 = 1_000;

fn sliding(limit: u32, window_ms: u64) -> Policy {
    Policy::sliding_window("api", limit, Duration::from_millis(window_ms)).unwrap()
}

#[tokio::test]
async fn a_hot_subject_leases_and_a_cold_one_never_does() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_000_000);
    // 1000 a second; lifetime 100 ms, leases of up to 100, from 50 a second.
    let limiter = instance(&server, &clock, &sliding(1_000, 1_000), Leases::new());
    let store = limiter.store().clone();

    // A cold subject: 2 requests a second for 5 s, every one a store call.
    for _ in 0..10 {
        let d = limiter.check("cold", 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.origin(), Origin::Store);
        clock.advance(Duration::from_millis(500));
    }
    assert_eq!(store.calls_sent(), 10);

    // A hot one: 400 requests, one a millisecond (1000 a second).
    let before = store.calls_sent();
    let mut from_lease = 0;
    for _ in 0..400 {
        let d = limiter.check("hot", 1).await.unwrap();
        assert!(d.is_allowed());
        if d.origin() == Origin::Lease {
            from_lease += 1;
        }
        clock.advance(Duration::from_millis(1));
    }
    let calls = store.calls_sent() - before;
    assert!(from_lease >= 360, "{from_lease} of 400 from leases");
    assert!(calls <= 40, "{calls} store calls for 400 requests");
    // Every admitted unit is counted in Redis, leased or spent: 400 spent plus what
    // the current lease holds, no more than the limit.
    let peeked = limiter.peek("hot", 1).await.unwrap();
    assert!(peeked.remaining() <= 1_000 - 400, "{peeked:?}");
}

#[tokio::test]
async fn a_decision_from_a_lease_reports_the_store_remaining_plus_the_unspent_units() {
    let server = RedisServer::start();
    let clock = FakeClock::new(5_000_000);
    let policy = Policy::fixed_window("api", 100, Duration::from_secs(10)).unwrap();
    let leases = Leases::new()
        .lifetime(Duration::from_secs(1))
        .max_units(10)
        .min_rate(1);
    let limiter = instance(&server, &clock, &policy, leases);
    // min_rate 1/s over 1 s: the second unit in a lifetime asks for a lease.
    assert_eq!(limiter.check("s", 1).await.unwrap().origin(), Origin::Store);
    let asked = limiter.check("s", 1).await.unwrap();
    assert_eq!(asked.origin(), Origin::Store);
    // The store counted 2 and a lease of 2 (the rate so far): 96 left in Redis, 98
    // for this instance.
    assert_eq!(asked.remaining(), 98);
    // (A peek of 1 answers what would be left after one more.)
    assert_eq!(limiter.peek("s", 1).await.unwrap().remaining(), 95);
    clock.advance(Duration::from_millis(300));
    let leased = limiter.check("s", 1).await.unwrap();
    assert_eq!(leased.origin(), Origin::Lease);
    assert_eq!(leased.remaining(), 97);
    assert_eq!(
        leased.reset_after(),
        asked.reset_after() - Duration::from_millis(300)
    );
}

#[tokio::test]
async fn unspent_units_go_back_when_the_lease_expires() {
    let server = RedisServer::start();
    let clock = FakeClock::new(7_000_000);
    let policy = Policy::fixed_window("api", 1_000, Duration::from_secs(10)).unwrap();
    let leases = Leases::new()
        .lifetime(Duration::from_millis(200))
        .max_units(50)
        .min_rate(10);
    let limiter = instance(&server, &clock, &policy, leases);
    for _ in 0..60 {
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    }
    let counted = 1_000 - limiter.peek("s", 1).await.unwrap().remaining();
    assert!(
        counted > 60,
        "a lease is held: {counted} counted for 60 spent"
    );
    // Demand stops. Before the lease expires nothing goes back ...
    clock.advance(Duration::from_millis(199));
    assert_eq!(limiter.sweep_leases().await, 0);
    // ... at its end, the unspent units do: Redis counts what was spent.
    clock.advance(Duration::from_millis(1));
    assert_eq!(limiter.sweep_leases().await, 1);
    assert_eq!(
        limiter.peek("s", 1).await.unwrap().remaining(),
        1_000 - 60 - 1
    );
}

/// The background sweep gives units back without traffic, every quarter lifetime:
/// the memory store (the model of the Redis store's leasing) on paused tokio time.
#[tokio::test(start_paused = true)]
async fn the_background_sweep_returns_stranded_units_within_a_lifetime_and_a_quarter() {
    let clock = FakeClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let policy = Policy::sliding_window("api", 1_000, Duration::from_secs(10)).unwrap();
    let lifetime = Duration::from_millis(400);
    let limiter = Limiter::builder(store)
        .policy(policy)
        .local_clock(clock.clone())
        .leases(Leases::new().lifetime(lifetime).max_units(100).min_rate(10))
        .build()
        .unwrap();
    for _ in 0..30 {
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    }
    // (A peek of 1 answers what would be left after one more.)
    let held = 1_000 - 30 - 1 - limiter.peek("s", 1).await.unwrap().remaining();
    assert!(held > 0, "a lease holds units");
    // Time passes on both clocks: the sweep task wakes on tokio's, reads the fake one.
    let step = Duration::from_millis(10);
    let mut waited = Duration::ZERO;
    while limiter.peek("s", 1).await.unwrap().remaining() != 1_000 - 30 - 1 {
        assert!(
            waited <= lifetime + lifetime / 4,
            "still stranded after {waited:?}"
        );
        clock.advance(step);
        tokio::time::advance(step).await;
        waited += step;
    }
    assert!(
        waited >= lifetime,
        "given back after {waited:?}, before the lease expired"
    );
    // The subject is forgotten once idle for two lifetimes.
    for _ in 0..100 {
        clock.advance(step);
        tokio::time::advance(step).await;
    }
    assert_eq!(limiter.leased_subjects(), 0);
}

#[tokio::test]
async fn a_denied_hot_subject_is_answered_locally_until_it_may_ask_again() {
    let server = RedisServer::start();
    let clock = FakeClock::new(10_000);
    let policy = Policy::fixed_window("api", 50, Duration::from_secs(1)).unwrap();
    let limiter = instance(&server, &clock, &policy, Leases::new().min_rate(1));
    let plain = Limiter::new(server.store().client_clock(clock.clone()), policy.clone());
    let store = limiter.store().clone();
    let mut admitted = 0;
    for _ in 0..500 {
        if limiter.check("hot", 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 50, "exactly the limit");
    let calls = store.calls_sent();
    let local = limiter.check("hot", 1).await.unwrap();
    assert_eq!(store.calls_sent(), calls, "a denial kept costs no call");
    assert_eq!(local.origin(), Origin::Lease);
    // The same denial the store gives a limiter without leases.
    let store_says = plain.check("hot", 1).await.unwrap();
    assert!(!store_says.is_allowed());
    assert_eq!(local.retry_after(), store_says.retry_after());
    assert_eq!(local.remaining(), 0);
    // At the retry time the subject is asked for again, and admitted.
    clock.advance(store_says.retry_after().unwrap());
    assert!(limiter.check("hot", 1).await.unwrap().is_allowed());
}

#[test]
fn sets_that_cannot_lease_are_refused_with_a_reason() {
    let log = Policy::sliding_log("exact", 10, Duration::from_secs(1)).unwrap();
    let refused = Limiter::builder(MemoryStore::new())
        .policy(sliding(10, 1_000))
        .policy(log)
        .leases(Leases::new())
        .build();
    match refused {
        Err(BuildError::LeaseSlidingLog(name)) => assert_eq!(name, "exact"),
        other => panic!("expected a sliding-log refusal, got {other:?}"),
    }
    let zero = Limiter::builder(MemoryStore::new())
        .policy(sliding(10, 1_000))
        .leases(Leases::new().lifetime(Duration::ZERO))
        .build();
    assert!(matches!(zero, Err(BuildError::LeaseZeroLifetime)));
    let zero = Limiter::builder(MemoryStore::new())
        .policy(sliding(10, 1_000))
        .leases(Leases::new().max_units(0))
        .build();
    assert!(matches!(zero, Err(BuildError::LeaseZeroUnits)));
    // Policies given after the leases are planned for like those before them.
    let planned = Limiter::builder(MemoryStore::new())
        .policy(sliding(10, 1_000))
        .leases(Leases::new())
        .policy(Policy::fixed_window("daily", 1_000, Duration::from_secs(86_400)).unwrap())
        .build()
        .unwrap();
    assert_eq!(planned.policies().len(), 2);
    let message = BuildError::LeaseSlidingLog("exact".into()).to_string();
    assert!(message.contains("never leases"), "{message}");
}

/// A sliding log never leases, whichever order the settings come in: the builder
/// refuses it before or after the leases, never panics, and the same policies without
/// leases admit exactly the log's limit.
#[tokio::test]
async fn a_sliding_log_is_refused_leases_in_either_order() {
    let clock = FakeClock::new(0);
    let log = || Policy::sliding_log("exact", 10, Duration::from_secs(1)).unwrap();
    let after = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(sliding(1_000, 1_000))
        .leases(Leases::new().min_rate(1))
        .policy(log())
        .build();
    let before = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(log())
        .leases(Leases::new().min_rate(1))
        .policy(sliding(1_000, 1_000))
        .build();
    for refused in [after, before] {
        assert!(
            matches!(refused, Err(BuildError::LeaseSlidingLog(ref name)) if name == "exact"),
            "{refused:?}"
        );
    }
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(sliding(1_000, 1_000))
        .local_clock(clock.clone())
        .policy(log())
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..100 {
        let decision = limiter.check("s", 1).await.unwrap();
        assert_ne!(decision.origin(), Origin::Lease);
        admitted += usize::from(decision.is_allowed());
    }
    assert_eq!(admitted, 10);
}

// ---------------------------------------------------------------------------------
// Through the layer, as the README recommends, and when Redis fails.

/// The README's handler.
async fn handler(Extension(decision): Extension<Decision>) -> String {
    if decision.is_checked() {
        format!("{} left ({:?})", decision.remaining(), decision.origin())
    } else {
        "not counted".to_owned()
    }
}

fn from(client: [u8; 4]) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from((client, 40_000)));
    request
}

#[tokio::test]
async fn leased_answers_carry_the_headers_and_denials_their_retry_after() {
    let server = RedisServer::start();
    let clock = FakeClock::new(20_000_000);
    let policy = Policy::fixed_window("api", 30, Duration::from_secs(10)).unwrap();
    let limiter = instance(&server, &clock, &policy, Leases::new().min_rate(1));
    let store = limiter.store().clone();
    let app = Router::new()
        .route("/", get(handler))
        .layer(RateLimitLayer::new(limiter, ClientIp::new()));
    let client = [203, 0, 113, 9];
    let mut from_lease = 0;
    for n in 1..=30 {
        let ok = app.clone().oneshot(from(client)).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK, "request {n}");
        // This instance holds the rest of the window's budget in leases of 3 (a tenth
        // of the limit): it knows exactly what is left.
        let header = ok.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(
            header.contains(&format!("r={}", 30 - n)),
            "request {n}: {header}"
        );
        let text =
            String::from_utf8(ok.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        if text.ends_with("(Lease)") {
            from_lease += 1;
        }
    }
    assert!(from_lease >= 15, "{from_lease} of 30 from leases");
    let calls = store.calls_sent();
    for _ in 0..20 {
        let denied = app.clone().oneshot(from(client)).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        // The window ends 10 s after 20,000,000 ms: the store's retry time.
        assert_eq!(denied.headers()["retry-after"], "10");
    }
    assert_eq!(
        store.calls_sent(),
        calls + 1,
        "one call denied, the rest answered here"
    );
}

#[tokio::test]
async fn a_redis_that_stops_or_hangs_under_a_leasing_subject_is_never_a_429() {
    let mut server = RedisServer::start();
    let policy = Policy::sliding_window("api", 100_000, Duration::from_secs(1)).unwrap();
    let clock = FakeClock::new(30_000_000);
    // A short timeout: the hang costs each call 100 ms.
    let store = server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_millis(100));
    let leases = Leases::new()
        .lifetime(Duration::from_millis(20))
        .min_rate(1);
    let limiter = Limiter::builder(store)
        .policy(policy)
        .local_clock(clock.clone())
        .leases(leases)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(handler))
        .layer(RateLimitLayer::new(limiter, ClientIp::new()));
    let client = [192, 0, 2, 1];
    let send = |app: &Router| {
        let app = app.clone();
        async move {
            let response = app.oneshot(from(client)).await.unwrap();
            let status = response.status();
            let text = String::from_utf8(
                response
                    .into_body()
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes()
                    .to_vec(),
            )
            .unwrap();
            (status, text)
        }
    };
    for _ in 0..50 {
        assert_eq!(send(&app).await.0, StatusCode::OK);
    }
    // Hung: 16 concurrent requests, one leasing check in flight and the others waiting
    // on it; when it times out its waiters answer with its failure at once (fail open),
    // rather than each asking the hung store in turn.
    let mut probe = server.conn().await;
    {
        let _paused = server.pause();
        // Stopped for sure: a command of our own gets no answer.
        let ping = redis::cmd("PING");
        let ping = ping.query_async::<String>(&mut probe);
        assert!(tokio::time::timeout(Duration::from_millis(100), ping)
            .await
            .is_err());
        clock.advance(Duration::from_millis(25)); // the lease expires
        let started = std::time::Instant::now();
        let answers = futures_join(&app, 16, &send).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(16 * 100 / 2),
            "{took:?}: the waiters asked in turn"
        );
        let mut unchecked = 0;
        for (status, text) in answers {
            assert_eq!(status, StatusCode::OK, "{text}");
            unchecked += usize::from(text == "not counted");
        }
        assert_eq!(unchecked, 16, "every request met the hang");
    }
    // Stopped: the handler runs, not counted, never a 429.
    server.stop();
    for _ in 0..20 {
        let (status, text) = send(&app).await;
        assert_eq!((status, text.as_str()), (StatusCode::OK, "not counted"));
    }
    // Back: decisions again.
    server.restart();
    let mut back = false;
    for _ in 0..200 {
        let (status, text) = send(&app).await;
        assert_eq!(status, StatusCode::OK);
        if text.ends_with("(Store)") || text.ends_with("(Lease)") {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "decisions came back after the restart");
}

/// `n` requests at once.
async fn futures_join<F, Fut>(app: &Router, n: usize, send: &F) -> Vec<(StatusCode, String)>
where
    F: Fn(&Router) -> Fut,
    Fut: std::future::Future<Output = (StatusCode, String)> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(send(app));
    }
    let mut answers = Vec::new();
    while let Some(answer) = tasks.join_next().await {
        answers.push(answer.expect("a request task"));
    }
    answers
}

// ---------------------------------------------------------------------------------
// Random arrivals through 2 to 8 instances on one redis-server.

#[derive(Debug, Clone, Copy)]
enum Kind {
    Fixed,
    Sliding,
    Bucket,
}

#[derive(Debug, Clone)]
struct Fleet {
    kind: Kind,
    limit: u32,
    /// The window, or for a token bucket the refill period of `limit` tokens.
    window_ms: u64,
    instances: usize,
    lifetime_ms: u64,
    max_units: u64,
    /// Per step: instance, ms to advance first (whole steps of [`STEP_MS`]), cost, and
    /// whether every instance sweeps its expired leases first.
    steps: Vec<(usize, u64, u32, bool)>,
}

fn fleet() -> impl Strategy<Value = Fleet> {
    let kind = prop_oneof![Just(Kind::Fixed), Just(Kind::Sliding), Just(Kind::Bucket)];
    // Windows of 2,000 to 8,000 steps of a second: keys expire in real time and must
    // outlive the run (see `STEP_MS`).
    (kind, 5u32..=200, 2_000u64..=8_000, 2usize..=8).prop_flat_map(
        |(kind, limit, window, instances)| {
            let window_ms = window * STEP_MS;
            let step = (
                0..instances,
                (0..=window / 40).prop_map(|steps| steps * STEP_MS),
                1u32..=3,
                prop::bool::weighted(0.05),
            );
            (
                Just(kind),
                Just(limit),
                Just(window_ms),
                Just(instances),
                (10..=window / 4).prop_map(|steps| steps * STEP_MS),
                1..=u64::from(limit),
                prop::collection::vec(step, 200..500),
            )
                .prop_map(
                    |(kind, limit, window_ms, instances, lifetime_ms, max_units, steps)| Fleet {
                        kind,
                        limit,
                        window_ms,
                        instances,
                        lifetime_ms,
                        max_units,
                        steps,
                    },
                )
        },
    )
}

impl Fleet {
    fn policy(&self) -> Policy {
        let window = Duration::from_millis(self.window_ms);
        match self.kind {
            Kind::Fixed => Policy::fixed_window("p", self.limit, window),
            Kind::Sliding => Policy::sliding_window("p", self.limit, window),
            Kind::Bucket => Policy::token_bucket("p", self.limit, self.limit, window),
        }
        .unwrap()
    }
}

/// Runs the fleet; returns the admitted (time, cost) in order.
async fn admitted(server: &RedisServer, fleet: &Fleet, subject: &str) -> Vec<(u64, u64)> {
    let clock = FakeClock::new(1_000_000_000);
    let policy = fleet.policy();
    // Leasing from two units a lifetime: a fleet asks about a unit every 25 to 100
    // steps.
    let leases = Leases::new()
        .lifetime(Duration::from_millis(fleet.lifetime_ms))
        .max_units(fleet.max_units)
        .min_rate(0);
    let limiters: Vec<_> = (0..fleet.instances)
        .map(|_| instance(server, &clock, &policy, leases.clone()))
        .collect();
    let mut admitted = Vec::new();
    for &(at, advance, cost, sweep) in &fleet.steps {
        clock.advance(Duration::from_millis(advance));
        if sweep {
            for limiter in &limiters {
                limiter.sweep_leases().await;
            }
        }
        let decision = limiters[at].check(subject, cost).await.expect("a decision");
        if decision.is_allowed() {
            admitted.push((clock.now_ms(), u64::from(cost)));
        }
        // Let give-backs spawned by this check reach Redis in their order.
        tokio::task::yield_now().await;
    }
    admitted
}

/// Where `admitted` breaks the policy's own promise, if anywhere.
fn violation(fleet: &Fleet, admitted: &[(u64, u64)]) -> Option<String> {
    let limit = u64::from(fleet.limit);
    let w = fleet.window_ms;
    match fleet.kind {
        Kind::Fixed => {
            let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
            for &(t, cost) in admitted {
                *per_window.entry(t / w).or_default() += cost;
            }
            per_window
                .into_iter()
                .find(|&(_, n)| n > limit)
                .map(|(window, n)| format!("window {window} admitted {n} > {limit}"))
        }
        Kind::Sliding => {
            // At every admission: previous * (w - elapsed) + current * w <= limit * w.
            let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
            for &(t, cost) in admitted {
                let index = t / w;
                *per_window.entry(index).or_default() += cost;
                let current = per_window[&index];
                let previous = index
                    .checked_sub(1)
                    .and_then(|i| per_window.get(&i))
                    .copied()
                    .unwrap_or(0);
                let elapsed = t - index * w;
                if previous * (w - elapsed) + current * w > limit * w {
                    return Some(format!(
                        "at {t}: previous {previous}, current {current}, elapsed {elapsed} of {w}, limit {limit}"
                    ));
                }
            }
            None
        }
        Kind::Bucket => {
            // A bucket of `limit + ceil(L / interval)` admits every admission.
            let interval_us = w * 1_000 / limit;
            let extra = (fleet.lifetime_ms * 1_000).div_ceil(interval_us);
            let tolerance = (limit + extra) * interval_us;
            let mut tat = 0u64;
            for &(t, cost) in admitted {
                let now = t * 1_000;
                let next = tat.max(now) + cost * interval_us;
                if next - now > tolerance {
                    return Some(format!(
                        "at {t}: a bucket of {limit} + {extra} would not admit {cost} (tat {tat})"
                    ));
                }
                tat = next;
            }
            None
        }
    }
}

#[test]
fn instances_sharing_one_redis_never_admit_beyond_the_bound() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cases = std::env::var("LEASE_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    });
    let run = std::cell::Cell::new(0u32);
    let (leased, total) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    let result = runner.run(&fleet(), |fleet| {
        run.set(run.get() + 1);
        let subject = format!("fleet-{}", run.get());
        let admitted = runtime.block_on(admitted(&server, &fleet, &subject));
        total.set(total.get() + fleet.steps.len());
        leased.set(leased.get() + admitted.len());
        if let Some(broken) = violation(&fleet, &admitted) {
            return Err(TestCaseError::fail(broken));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\n{}", server.log_tail());
    }
    eprintln!(
        "{cases} fleets, {} of {} requests admitted",
        leased.get(),
        total.get()
    );
    // The fleets must hit their limits, or the bound was never tested.
    assert!(
        leased.get() * 10 < total.get() * 9,
        "{leased:?} of {total:?} admitted"
    );
}

/// The checker above catches what it is meant to: a fleet admitting one unit past a
/// fixed window's limit, a sliding window's estimate or a bucket's burst fails.
#[test]
fn the_bound_checker_catches_one_unit_too_many() {
    let base = Fleet {
        kind: Kind::Fixed,
        limit: 3,
        window_ms: 1_000,
        instances: 2,
        lifetime_ms: 100,
        max_units: 1,
        steps: Vec::new(),
    };
    let fixed = [(0, 1), (10, 1), (999, 1)];
    assert_eq!(violation(&base, &fixed), None);
    assert!(violation(&base, &[(0, 1), (10, 1), (999, 1), (999, 1)]).is_some());
    let sliding = Fleet {
        kind: Kind::Sliding,
        ..base.clone()
    };
    // 3 in window 0, then at 1500 half of them still count: 1 more fits, not 2.
    assert_eq!(violation(&sliding, &[(0, 3), (1_500, 1)]), None);
    assert!(violation(&sliding, &[(0, 3), (1_500, 2)]).is_some());
    // A bucket of 3 refilled every 333 us x 1000, lifetime 100 ms: 1 unit of slack.
    let bucket = Fleet {
        kind: Kind::Bucket,
        ..base
    };
    assert_eq!(violation(&bucket, &[(0, 3), (0, 1)]), None);
    assert!(violation(&bucket, &[(0, 3), (0, 2)]).is_some());
}

/// The leasing check's Lua and the model grant the same: the Redis store and the
/// memory store side by side on one trace of a fleet of one.
#[tokio::test]
async fn the_lua_lease_and_the_model_grant_the_same_units() {
    let server = RedisServer::start();
    let steps = |n: u64| Duration::from_millis(n * STEP_MS);
    for policy in [
        Policy::fixed_window("p", 40, steps(2_000)).unwrap(),
        sliding(40, 2_000 * STEP_MS),
        Policy::token_bucket("p", 40, 20, steps(1_000)).unwrap(),
    ] {
        let clock = FakeClock::new(3_000 * STEP_MS * 1_000);
        // Leases end with their window (a lifetime longer than it), so no give-back,
        // which runs in the background at moments that differ between the stores, can
        // change state between two compared steps (give-backs are tested above).
        // Leasing from two units a lifetime: the trace asks about 0.2 units a second.
        let leases = Leases::new()
            .lifetime(steps(5_000))
            .max_units(8)
            .min_rate(0);
        let redis = instance(&server, &clock, &policy, leases.clone());
        let memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .policy(policy.clone())
            .local_clock(clock.clone())
            .leases(leases)
            .build()
            .unwrap();
        let mut leased = 0;
        for i in 0..400u64 {
            clock.advance(steps(i % 7 * 3));
            let cost = 1 + (i % 3) as u32;
            let (a, b) = (
                redis.check("s", cost).await.unwrap(),
                memory.check("s", cost).await.unwrap(),
            );
            assert_eq!(a, b, "{policy:?} step {i}");
            leased += u32::from(a.origin() == Origin::Lease);
            if i % 50 == 0 {
                assert_eq!(redis.sweep_leases().await, memory.sweep_leases().await);
            }
        }
        eprintln!("{:?}: {leased} of 400 from leases", policy.algorithm());
        assert!(leased >= 100, "{policy:?}: {leased} of 400 from leases");
    }
}

/// A calendar quota leases like a fixed window, its leases ending with the period: the
/// Lua and the model grant the same units, across the end of a day too.
#[tokio::test]
async fn a_calendar_quota_leases_alike_in_lua_and_the_model() {
    let server = RedisServer::start();
    let policy = Policy::calendar("p", 300, redlimit::Period::Day, "UTC", 1).unwrap();
    // Half an hour before a day ends; the trace lasts about an hour. Leases end with
    // their period (a lifetime longer than the trace), so no give-back, which runs in
    // the background at moments that differ between the stores, changes state between
    // two compared steps.
    let clock = FakeClock::new(35 * 86_400_000 - 1_800_000);
    let leases = Leases::new()
        .lifetime(Duration::from_secs(7_200))
        .max_units(8)
        .min_rate(0);
    let redis = instance(&server, &clock, &policy, leases.clone());
    let memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(policy.clone())
        .local_clock(clock.clone())
        .leases(leases)
        .build()
        .unwrap();
    let (mut leased, mut denied) = (0, 0);
    for i in 0..400u64 {
        clock.advance(Duration::from_secs(i % 7 * 3));
        let cost = 1 + (i % 3) as u32;
        let (a, b) = (
            redis.check("s", cost).await.unwrap(),
            memory.check("s", cost).await.unwrap(),
        );
        assert_eq!(a, b, "step {i} at {}", clock.now_ms());
        leased += u32::from(a.origin() == Origin::Lease);
        denied += u32::from(!a.is_allowed());
        if i % 50 == 0 {
            assert_eq!(redis.sweep_leases().await, memory.sweep_leases().await);
        }
    }
    assert!(
        leased >= 100 && denied > 0,
        "{leased} of 400 from leases, {denied} denied"
    );
}

// ---------------------------------------------------------------------------------
// Lost state, admin operations, skewed clocks, a full table and extreme settings.

/// How Redis loses a subject's counts in the middle of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// `FLUSHALL`.
    Flush,
    /// `Limiter::reset` of the subject, from instance 0.
    Reset,
    /// The server restarts (no persistence: its data is gone).
    Restart,
}

/// What a fleet of four admitted from a loss to the end of its window.
#[derive(Debug)]
struct AfterLoss {
    admitted: u64,
    /// Units the instances that spend after the loss held when it happened (for a
    /// reset, not counting the instance that reset: it forgets its own).
    held: u64,
}

const LOSS_LIMIT: u64 = 2_000;

/// The loss tests' lease settings: a lifetime of a tenth of the window, leasing from
/// two units a lifetime (each instance sees half a unit a step).
fn loss_leases() -> Leases {
    Leases::new()
        .lifetime(Duration::from_millis(200 * STEP_MS))
        .min_rate(0)
}

/// Four instances (with `leases`, or plain) on one Redis and a shared fake clock send
/// a subject twice the limit of `policy` (2,000 per 2,000 steps): a whole window, then
/// 300 steps of the next, then the loss, then the rest of that window. `drained`: from
/// the loss on, only instances 0 and 1 are sent anything (the others are drained, as
/// in a rolling deploy), so what they held can only come back as give-backs.
async fn lose_state(
    server: &mut RedisServer,
    policy: &Policy,
    loss: Loss,
    leases: Option<Leases>,
    drained: bool,
) -> AfterLoss {
    let clock = FakeClock::new(1_000_000_000);
    let subject = format!("loss-{loss:?}-{drained}-{}", leases.is_some());
    let limiters: Vec<Limiter<RedisStore>> = (0..4)
        .map(|_| match &leases {
            Some(leases) => instance(server, &clock, policy, leases.clone()),
            None => Limiter::builder(
                server
                    .store()
                    .client_clock(clock.clone())
                    .timeout(Duration::from_secs(5)),
            )
            .policy(policy.clone())
            .local_clock(clock.clone())
            .build()
            .unwrap(),
        })
        .collect();
    let window_end = 1_000_000_000 + 4_000 * STEP_MS;
    let loss_at = 1_000_000_000 + 2_300 * STEP_MS;
    let mut after = AfterLoss {
        admitted: 0,
        held: 0,
    };
    let mut lost = false;
    let mut request = 0usize;
    while clock.now_ms() < window_end {
        let now = clock.now_ms();
        if now >= loss_at && !lost {
            lost = true;
            let serving = if drained { 0..2 } else { 0..4 };
            after.held = limiters[serving]
                .iter()
                .enumerate()
                .filter(|(i, _)| !(loss == Loss::Reset && *i == 0))
                .map(|(_, limiter)| limiter.held_units())
                .sum();
            match loss {
                Loss::Flush => {
                    let mut conn = server.conn().await;
                    let () = redis::cmd("FLUSHALL")
                        .query_async(&mut conn)
                        .await
                        .expect("FLUSHALL");
                }
                Loss::Reset => limiters[0].reset(subject.as_str()).await.expect("reset"),
                Loss::Restart => {
                    server.restart();
                    // Each instance's store reconnects by itself: wait until all answer
                    // again (bounded), with the fake clock standing still.
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    for limiter in &limiters {
                        while limiter.peek("probe", 1).await.is_err() {
                            assert!(std::time::Instant::now() < deadline, "Redis came back");
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            }
        }
        let at = if lost && drained {
            request % 2
        } else {
            request % 4
        };
        request += 1;
        let allowed = limiters[at]
            .check(subject.as_str(), 1)
            .await
            .expect("a decision")
            .is_allowed();
        if lost && allowed {
            after.admitted += 1;
        }
        // Let give-backs spawned by this check reach Redis.
        tokio::task::yield_now().await;
        // Twice the limit: 2 requests a step; every instance sweeps its expired leases
        // every 50 steps (a quarter lifetime), as its background task would.
        if request.is_multiple_of(2) {
            clock.advance(Duration::from_millis(STEP_MS));
            if clock.now_ms().is_multiple_of(50 * STEP_MS) {
                for limiter in &limiters {
                    limiter.sweep_leases().await;
                }
            }
        }
    }
    after
}

/// The loss cases for the two window policies and a token bucket: the fleet of the
/// report (all four instances spend on) and a drained one, beside the control without
/// leases.
async fn loss_is_bounded_by_the_units_held(loss: Loss) {
    let mut server = RedisServer::start();
    let window = Duration::from_millis(2_000 * STEP_MS);
    // After the loss, 1,700 steps of the window are left. A window policy admits its
    // limit in them; a bucket of 1,000 refilled 1 every 2 steps, its capacity and the
    // refill (850), and with leases the burst grows by at most a lifetime's refill
    // (200 steps, a tenth of its fill time: 100).
    for (policy, budget, lease_burst) in [
        (
            Policy::fixed_window("api", LOSS_LIMIT as u32, window).unwrap(),
            LOSS_LIMIT,
            0,
        ),
        (
            Policy::sliding_window("api", LOSS_LIMIT as u32, window).unwrap(),
            LOSS_LIMIT,
            0,
        ),
        (
            Policy::token_bucket("api", 1_000, 1_000, window).unwrap(),
            1_000 + 850 + 1,
            100,
        ),
    ] {
        let control = lose_state(&mut server, &policy, loss, None, false).await;
        assert!(
            control.admitted <= budget,
            "{loss:?} without leases, {policy:?}: {control:?}"
        );
        for drained in [false, true] {
            let after = lose_state(&mut server, &policy, loss, Some(loss_leases()), drained).await;
            eprintln!(
                "{loss:?}, {:?}, drained {drained}: {} admitted after the loss (at most {budget} without leases, {} held at the loss); without leases {}",
                policy.algorithm(),
                after.admitted,
                after.held,
                control.admitted
            );
            assert!(
                after.admitted <= budget + lease_burst + after.held,
                "{loss:?}, {policy:?}, drained {drained}: {after:?}\n{}",
                server.log_tail()
            );
        }
    }
}

#[tokio::test]
async fn a_flush_costs_at_most_the_units_held_then() {
    loss_is_bounded_by_the_units_held(Loss::Flush).await;
}

#[tokio::test]
async fn a_reset_costs_at_most_the_units_other_instances_held_then() {
    loss_is_bounded_by_the_units_held(Loss::Reset).await;
}

#[tokio::test]
async fn a_restart_costs_at_most_the_units_held_then() {
    loss_is_bounded_by_the_units_held(Loss::Restart).await;
}

#[tokio::test]
async fn reset_and_refund_forget_the_subject_s_lease_and_kept_denial() {
    let server = RedisServer::start();
    let clock = FakeClock::new(40_000_000);
    let policy = Policy::fixed_window("api", 20, Duration::from_secs(1_000)).unwrap();
    let leased = instance(&server, &clock, &policy, Leases::new().min_rate(1));
    // The control: the block cache keeps denials too, and forgets them.
    let cached = Limiter::builder(server.store().client_clock(clock.clone()))
        .policy(policy.clone())
        .local_clock(clock.clone())
        .block_cache(10)
        .build()
        .unwrap();
    for (name, limiter) in [("leases", &leased), ("block cache", &cached)] {
        let subject = format!("admin-{name}");
        let subject = subject.as_str();
        let admitted = admitted_of(limiter, subject, 50).await;
        assert_eq!(admitted, 20, "{name}");
        assert!(!limiter.check(subject, 1).await.unwrap().is_allowed());

        limiter.reset(subject).await.unwrap();
        let next = limiter.check(subject, 1).await.unwrap();
        assert!(next.is_allowed(), "{name}: after a reset: {next:?}");
        assert_eq!(leased.held_units() + cached.held_units(), 0, "{name}");
        // The budget is whole again: 19 more.
        assert_eq!(admitted_of(limiter, subject, 50).await, 19, "{name}");

        limiter.refund(subject, 5).await.unwrap();
        let next = limiter.check(subject, 1).await.unwrap();
        assert!(next.is_allowed(), "{name}: after a refund: {next:?}");
        assert_eq!(admitted_of(limiter, subject, 50).await, 4, "{name}");
    }
    // A refund keeps a lease held (Redis still counts its units); a reset forgets it.
    let subject = "admin-held";
    assert_eq!(admitted_of(&leased, subject, 8).await, 8);
    let held = leased.held_units();
    assert!(held > 0, "a lease is held");
    leased.refund(subject, 1).await.unwrap();
    assert_eq!(leased.held_units(), held);
    // (A peek of 1 answers what would be left after one more.)
    let counted = 8 + held - 1;
    assert_eq!(
        leased.peek(subject, 1).await.unwrap().remaining(),
        20 - counted - 1
    );
    let next = leased.check(subject, 1).await.unwrap();
    assert_eq!(next.origin(), Origin::Lease, "still spent from the lease");
    leased.reset(subject).await.unwrap();
    assert_eq!(leased.held_units(), 0);
    assert_eq!(leased.peek(subject, 1).await.unwrap().remaining(), 19);
    let next = leased.check(subject, 1).await.unwrap();
    assert_eq!(next.origin(), Origin::Store, "asks the store after a reset");
}

/// How many of `n` checks of cost 1 of `subject` are admitted.
async fn admitted_of(limiter: &Limiter<RedisStore>, subject: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(limiter.check(subject, 1).await.unwrap().is_allowed());
    }
    admitted
}

/// A subject that turns hot behind a table full of cold subjects leases once they have
/// been idle for two lifetimes, as it does on a fresh limiter.
#[tokio::test]
async fn a_table_full_of_cold_subjects_makes_room_for_a_hot_one() {
    let server = RedisServer::start();
    let policy = sliding(100_000, 1_000);
    let leases = Leases::new().max_subjects(160);
    let mut calls = Vec::new();
    for cold in [0, 2_000] {
        let clock = FakeClock::new(60_000_000);
        let limiter = instance(&server, &clock, &policy, leases.clone());
        let store = limiter.store().clone();
        for i in 0..cold {
            assert!(limiter
                .check(format!("cold-{i}"), 1)
                .await
                .unwrap()
                .is_allowed());
        }
        let before = store.calls_sent();
        for _ in 0..3_000 {
            assert!(limiter.check("hot", 1).await.unwrap().is_allowed());
            clock.advance(Duration::from_millis(1));
        }
        calls.push(store.calls_sent() - before);
    }
    let (fresh, behind) = (calls[0], calls[1]);
    eprintln!("a hot subject: {fresh} calls on a fresh limiter, {behind} behind 2,000 cold ones");
    // Two lifetimes (200 ms) of plain checks at most, then as on a fresh limiter.
    assert!(behind <= fresh + 200 + 10, "{behind} calls, {fresh} fresh");
}

/// Subjects that never lease are swept all the same: the background sweep starts with
/// the first subject tracked, not the first lease.
#[tokio::test(start_paused = true)]
async fn subjects_that_never_leased_are_swept_in_the_background() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(sliding(1_000, 1_000))
        .local_clock(clock.clone())
        .leases(Leases::new().max_subjects(160))
        .build()
        .unwrap();
    for i in 0..2_000 {
        assert!(limiter
            .check(format!("cold-{i}"), 1)
            .await
            .unwrap()
            .is_allowed());
    }
    assert!(
        limiter.leased_subjects() > 100,
        "{}",
        limiter.leased_subjects()
    );
    // Two lifetimes (200 ms) idle, and a quarter lifetime for the sweep to look.
    let step = Duration::from_millis(5);
    for _ in 0..(250 / 5 + 1) {
        clock.advance(step);
        tokio::time::advance(step).await;
    }
    assert_eq!(limiter.leased_subjects(), 0);
}

/// A limiter's local clock that runs wrong (slow, or stepped back as `SystemClock` is
/// by an NTP step) cannot carry leased units into the store's next window: leases are
/// timed on the store's clock.
#[tokio::test]
async fn a_skewed_local_clock_never_carries_units_into_the_next_window() {
    #[derive(Debug, Clone, Copy)]
    enum Skew {
        None,
        HalfSpeed,
        StepBack,
    }
    let server = RedisServer::start();
    // Times in steps of a second (see `STEP_MS`): windows of 1,000 steps.
    let steps = |n: u64| n * STEP_MS;
    let window = steps(1_000);
    let policy = Policy::fixed_window("api", 100, Duration::from_millis(window)).unwrap();
    // Long leases of up to half the limit: a lease can hold what is left of a window.
    // Leasing from two units a lifetime.
    let leases = Leases::new()
        .lifetime(Duration::from_millis(window))
        .max_units(50)
        .min_rate(0);
    for (skew, leases) in [
        (Skew::None, None),
        (Skew::HalfSpeed, None),
        (Skew::StepBack, None),
        (Skew::None, Some(leases.clone())),
        (Skew::StepBack, Some(leases.clone())),
        (Skew::HalfSpeed, Some(leases)),
    ] {
        let start = 50_000 * window;
        let (store_clock, local) = (FakeClock::new(start), FakeClock::new(start));
        let store = server
            .store()
            .client_clock(store_clock.clone())
            .timeout(Duration::from_secs(5));
        let limiter = Limiter::builder(store)
            .policy(policy.clone())
            .local_clock(local.clone());
        let limiter = match &leases {
            Some(leases) => limiter.leases(leases.clone()),
            None => limiter,
        };
        let limiter = limiter.build().unwrap();
        let subject = format!("skew-{skew:?}-{}", leases.is_some());
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        let mut stepped = false;
        // Half the limit in even windows (a request every 20 steps of the store's
        // clock), so a lease holds units at their end, and in the first half of odd
        // ones five times the limit's rate (every 2 steps), so units carried into them
        // would be admitted beyond the limit.
        while store_clock.now_ms() < start + 4 * window {
            let now = store_clock.now_ms();
            match skew {
                Skew::None => local.set_ms(now),
                Skew::HalfSpeed => local.set_ms(start + (now - start) / 2),
                // 10 steps before the end of the first window, the local clock steps
                // back 500 steps, and runs on from there.
                Skew::StepBack => {
                    stepped |= now - start >= steps(990);
                    local.set_ms(if stepped { now - steps(500) } else { now });
                }
            }
            if limiter
                .check(subject.as_str(), 1)
                .await
                .unwrap()
                .is_allowed()
            {
                *per_window.entry(now / window).or_default() += 1;
            }
            tokio::task::yield_now().await;
            let into = now % window;
            let next = match (now / window % 2, into / STEP_MS) {
                (0, _) => steps(20),
                (_, ..500) => steps(2),
                // Nothing more in this window: what a store call denies there after
                // units were carried in cannot make up for them.
                _ => window - into,
            };
            store_clock.advance(Duration::from_millis(next));
        }
        eprintln!("{skew:?}, leases {}: {per_window:?}", leases.is_some());
        assert_eq!(per_window.len(), 4, "{per_window:?}");
        for (window, admitted) in per_window {
            assert!(
                admitted <= 100,
                "{skew:?}, leases {}: window {window} admitted {admitted}",
                leases.is_some()
            );
        }
    }
}

/// Every setter with 0 and the largest values it takes: a `BuildError` or a limiter
/// that keeps its limit, never a panic (tests run with overflow checks), on both stores.
#[tokio::test]
async fn extreme_lease_settings_are_errors_or_keep_the_limit() {
    let server = RedisServer::start();
    let huge = Duration::from_secs(10u64.pow(10));
    // Each setting, whether it is valid, and the least a sliding window admits with it in
    // its first window: its limit less a batch (the last units wait for a batch to
    // fit; a batch is at most the largest lease).
    let settings: Vec<(&str, Leases, bool, u64)> = vec![
        (
            "lifetime(ZERO)",
            Leases::new().lifetime(Duration::ZERO),
            false,
            90,
        ),
        (
            "lifetime(1 us)",
            Leases::new().lifetime(Duration::from_micros(1)),
            false,
            90,
        ),
        (
            "lifetime(MAX)",
            Leases::new().lifetime(Duration::MAX),
            true,
            90,
        ),
        ("lifetime(1e10 s)", Leases::new().lifetime(huge), true, 90),
        ("max_units(0)", Leases::new().max_units(0), false, 90),
        (
            "max_units(u64::MAX)",
            Leases::new().max_units(u64::MAX),
            true,
            90,
        ),
        ("min_rate(0)", Leases::new().min_rate(0), true, 90),
        (
            "min_rate(u32::MAX)",
            Leases::new().min_rate(u32::MAX),
            true,
            90,
        ),
        (
            "min_rate(u32::MAX).lifetime(1e10 s)",
            Leases::new().min_rate(u32::MAX).lifetime(huge),
            true,
            90,
        ),
        ("batch(0)", Leases::new().batch(0), true, 90),
        ("batch(u64::MAX)", Leases::new().batch(u64::MAX), true, 90),
        ("max_subjects(0)", Leases::new().max_subjects(0), false, 90),
        (
            "max_subjects(usize::MAX)",
            Leases::new().max_subjects(usize::MAX),
            true,
            90,
        ),
        (
            "every maximum",
            Leases::new()
                .lifetime(Duration::MAX)
                .max_units(u64::MAX)
                .min_rate(u32::MAX)
                .batch(u64::MAX)
                .max_subjects(usize::MAX),
            true,
            1,
        ),
        (
            "every maximum, leasing from 1 a second",
            Leases::new()
                .lifetime(Duration::MAX)
                .max_units(u64::MAX)
                .min_rate(1)
                .batch(u64::MAX)
                .max_subjects(usize::MAX),
            true,
            1,
        ),
    ];
    let window = Duration::from_secs(1);
    for (name, leases, valid, least_sliding) in settings {
        for policy in [
            Policy::fixed_window("api", 100, window).unwrap(),
            Policy::sliding_window("api", 100, window).unwrap(),
        ] {
            for on_redis in [false, true] {
                let clock = FakeClock::new(80_000_000);
                let what = format!("{name}, {:?}, Redis {on_redis}", policy.algorithm());
                let admitted = if on_redis {
                    let store = server.store().client_clock(clock.clone());
                    let limiter = Limiter::builder(store)
                        .policy(policy.clone())
                        .local_clock(clock.clone())
                        .leases(leases.clone())
                        .build();
                    match limiter {
                        Ok(limiter) => Some(run_hot(&limiter, &clock, &what).await),
                        Err(error) => {
                            assert!(!error.to_string().is_empty());
                            None
                        }
                    }
                } else {
                    let store = MemoryStore::with_clock(clock.clone());
                    let limiter = Limiter::builder(store)
                        .policy(policy.clone())
                        .local_clock(clock.clone())
                        .leases(leases.clone())
                        .build();
                    match limiter {
                        Ok(limiter) => Some(run_hot(&limiter, &clock, &what).await),
                        Err(_) => None,
                    }
                };
                assert_eq!(admitted.is_some(), valid, "{what}: accepted?");
                let Some(admitted) = admitted else { continue };
                // One instance: a fixed window admits its limit exactly; a sliding
                // window, in its first window, at most its limit.
                let least = if policy.algorithm() == redlimit::Algorithm::FixedWindow {
                    100
                } else {
                    least_sliding
                };
                assert!(
                    (least..=100).contains(&admitted),
                    "{what}: {admitted} of 300 admitted, limit 100"
                );
            }
        }
    }
}

/// 300 checks of one subject within one window (one a millisecond); the admitted.
async fn run_hot<S>(limiter: &Limiter<S>, clock: &FakeClock, what: &str) -> u64
where
    S: redlimit::store::Store,
{
    let mut admitted = 0;
    clock.set_ms(80_000_000);
    for _ in 0..300 {
        let decision = limiter.check(what, 1).await;
        let decision = decision.unwrap_or_else(|e| panic!("{what}: {e}"));
        admitted += u64::from(decision.is_allowed());
        clock.advance(Duration::from_millis(1));
    }
    admitted
}

/// The lease generation is one rule in Lua and in the model: a grant names it, later
/// grants keep it, a give-back under it is a refund, a reset forgets it, and a
/// give-back under a forgotten one changes nothing.
#[tokio::test]
async fn a_give_back_after_a_reset_changes_nothing_in_lua_and_in_the_model() {
    async fn run<S: LeaseStore + AdminStore>(
        store: &S,
        set: &redlimit::internals::PolicySet,
    ) -> Vec<u64> {
        let s = || redlimit::Subject::new("generations");
        let remaining = |d: redlimit::Decision| d.remaining();
        let ask = LeaseAsk { want: 10, batch: 0 };
        let (_, first) = store.check_leasing(s(), set, 1, ask).await.unwrap();
        let (_, second) = store.check_leasing(s(), set, 1, ask).await.unwrap();
        assert_eq!((first.units, second.units), (10, 10));
        assert_ne!(first.epoch, 0);
        assert_eq!(
            second.epoch, first.epoch,
            "one generation until the state is lost"
        );
        let back = |epoch| GiveBack {
            units: 5,
            before_ms: first.window_end_ms.unwrap(),
            epoch,
        };
        let mut seen = vec![remaining(
            store.give_back(s(), set, back(first.epoch)).await.unwrap(),
        )];
        store.run(Operation::Reset, s(), set, 1).await.unwrap();
        seen.push(remaining(
            store.run(Operation::Check, s(), set, 1).await.unwrap(),
        ));
        // Under the generation the reset forgot: nothing changes.
        seen.push(remaining(
            store.give_back(s(), set, back(first.epoch)).await.unwrap(),
        ));
        let (_, third) = store.check_leasing(s(), set, 1, ask).await.unwrap();
        assert_ne!(third.epoch, first.epoch, "a new generation after the reset");
        seen.push(remaining(
            store.give_back(s(), set, back(third.epoch)).await.unwrap(),
        ));
        seen
    }
    let server = RedisServer::start();
    let clock = FakeClock::new(90_000_000);
    let policy = Policy::fixed_window("api", 100, Duration::from_secs(10)).unwrap();
    let set = Limiter::new(MemoryStore::new(), policy)
        .policy_set()
        .clone();
    let redis = run(&server.store().client_clock(clock.clone()), &set).await;
    let memory = run(&MemoryStore::with_clock(clock.clone()), &set).await;
    // (A give-back answers as a peek of its units.) 22 counted, 5 back: 17, so 78
    // after 5 more; after the reset 1 counted (99 after one more), and the give-back
    // under the forgotten generation changes nothing (94 after 5 more: a refund would
    // have made it 95); 11 more counted, 5 back under the new one: 7, so 88.
    assert_eq!(redis, [78, 99, 94, 88]);
    assert_eq!(memory, redis);
    // The generation has a key of its own beside the policies' keys, and it expires.
    let keys = server.keys().await;
    assert!(
        keys.iter().any(|k| k.starts_with(b"rl:{generations}:")
            && k.ends_with(format!(":{}:~lease", set.key_tag()).as_bytes())),
        "{keys:?}"
    );
    server.assert_every_key_expires().await;
}

/// An instance that learns of a loss (its next grant is of a new lease generation)
/// drops what it still held of the old one instead of adding it to the new lease.
#[tokio::test]
async fn units_of_a_lost_generation_are_dropped_when_a_new_one_is_granted() {
    let server = RedisServer::start();
    let clock = FakeClock::new(95_000_000);
    let policy = Policy::fixed_window("api", 1_000, Duration::from_secs(10)).unwrap();
    let leases = Leases::new()
        .lifetime(Duration::from_secs(1))
        .max_units(20)
        .min_rate(1);
    let limiter = instance(&server, &clock, &policy, leases);
    assert_eq!(admitted_of(&limiter, "gen", 6).await, 6);
    let old = limiter.held_units();
    assert!(old > 0, "a lease is held");
    let mut conn = server.conn().await;
    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    // A cost the lease cannot cover asks Redis, which grants from a new generation.
    let cost = u32::try_from(old).unwrap() + 1;
    assert!(limiter.check("gen", cost).await.unwrap().is_allowed());
    // (A peek of 1 answers what would be left after one more.)
    let counted = 1_000 - 1 - limiter.peek("gen", 1).await.unwrap().remaining();
    let granted = counted - u64::from(cost);
    assert!(granted > 0, "a new lease");
    assert_eq!(
        limiter.held_units(),
        granted,
        "the {old} units of the lost generation are not held on"
    );
}
