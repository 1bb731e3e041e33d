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

mod support;

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
use redlimit::lease::{LeaseError, Leases};
use redlimit::{Limiter, MemoryStore, Origin, Policy, RedisStore};
use support::RedisServer;

/// One instance of a fleet: its own store (its own pool and connection) on the shared
/// fake clock, with leases.
fn instance(
    server: &RedisServer,
    clock: &FakeClock,
    policy: &Policy,
    leases: Leases,
) -> Limiter<RedisStore> {
    let store = RedisStore::new(server.pool())
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(5));
    Limiter::new(store, policy.clone())
        .local_clock(clock.clone())
        .leases(leases)
        .expect("a set that can lease")
}

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
    let limiter = Limiter::new(store, policy)
        .local_clock(clock.clone())
        .leases(Leases::new().lifetime(lifetime).max_units(100).min_rate(10))
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
    let plain = Limiter::new(
        RedisStore::new(server.pool()).client_clock(clock.clone()),
        policy.clone(),
    );
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
    let refused = Limiter::new(MemoryStore::new(), sliding(10, 1_000))
        .policy(log)
        .leases(Leases::new());
    match refused {
        Err(LeaseError::SlidingLog(name)) => assert_eq!(name, "exact"),
        other => panic!("expected a sliding-log refusal, got {other:?}"),
    }
    let zero = Limiter::new(MemoryStore::new(), sliding(10, 1_000))
        .leases(Leases::new().lifetime(Duration::ZERO));
    assert!(matches!(zero, Err(LeaseError::ZeroLifetime)));
    let zero =
        Limiter::new(MemoryStore::new(), sliding(10, 1_000)).leases(Leases::new().max_units(0));
    assert!(matches!(zero, Err(LeaseError::ZeroUnits)));
    // A policy that can lease, added after leases, re-plans them.
    let replanned = Limiter::new(MemoryStore::new(), sliding(10, 1_000))
        .leases(Leases::new())
        .unwrap()
        .policy(Policy::fixed_window("daily", 1_000, Duration::from_secs(86_400)).unwrap());
    assert_eq!(replanned.policies().len(), 2);
    let message = LeaseError::SlidingLog("exact".into()).to_string();
    assert!(message.contains("never leases"), "{message}");
}

#[test]
#[should_panic(expected = "Limiter::policy after Limiter::leases")]
fn a_sliding_log_added_after_leases_is_a_loud_mistake() {
    let _ = Limiter::new(MemoryStore::new(), sliding(10, 1_000))
        .leases(Leases::new())
        .unwrap()
        .policy(Policy::sliding_log("exact", 10, Duration::from_secs(1)).unwrap());
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
    let store = RedisStore::new(server.pool())
        .client_clock(clock.clone())
        .timeout(Duration::from_millis(100));
    let leases = Leases::new()
        .lifetime(Duration::from_millis(20))
        .min_rate(1);
    let limiter = Limiter::new(store, policy)
        .local_clock(clock.clone())
        .leases(leases)
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
    /// Per step: instance, ms to advance first, cost, and whether every instance
    /// sweeps its expired leases first.
    steps: Vec<(usize, u64, u32, bool)>,
}

fn fleet() -> impl Strategy<Value = Fleet> {
    let kind = prop_oneof![Just(Kind::Fixed), Just(Kind::Sliding), Just(Kind::Bucket)];
    // Windows of seconds: keys expire in real time and must outlive the run.
    (kind, 5u32..=200, 2_000u64..=8_000, 2usize..=8).prop_flat_map(
        |(kind, limit, window_ms, instances)| {
            let step = (
                0..instances,
                0..=window_ms / 40,
                1u32..=3,
                prop::bool::weighted(0.05),
            );
            (
                Just(kind),
                Just(limit),
                Just(window_ms),
                Just(instances),
                10..=window_ms / 4,
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
    let leases = Leases::new()
        .lifetime(Duration::from_millis(fleet.lifetime_ms))
        .max_units(fleet.max_units)
        .min_rate(1);
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
    for policy in [
        Policy::fixed_window("p", 40, Duration::from_secs(2)).unwrap(),
        sliding(40, 2_000),
        Policy::token_bucket("p", 40, 20, Duration::from_secs(1)).unwrap(),
    ] {
        let clock = FakeClock::new(3_000_000);
        // Leases end with their window (a lifetime longer than it), so no give-back,
        // which runs in the background at moments that differ between the stores, can
        // change state between two compared steps (give-backs are tested above).
        let leases = Leases::new()
            .lifetime(Duration::from_secs(5))
            .max_units(8)
            .min_rate(1);
        let redis = instance(&server, &clock, &policy, leases.clone());
        let memory = Limiter::new(MemoryStore::with_clock(clock.clone()), policy.clone())
            .local_clock(clock.clone())
            .leases(leases)
            .unwrap();
        for i in 0..400u64 {
            clock.advance(Duration::from_millis(i % 7 * 3));
            let cost = 1 + (i % 3) as u32;
            let (a, b) = (
                redis.check("s", cost).await.unwrap(),
                memory.check("s", cost).await.unwrap(),
            );
            assert_eq!(a, b, "{policy:?} step {i}");
            if i % 50 == 0 {
                assert_eq!(redis.sweep_leases().await, memory.sweep_leases().await);
            }
        }
    }
}
