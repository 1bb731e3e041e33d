//! Shadow policies and the admin operations (peek, refund, reset) on both stores, the
//! Redis one on a real `redis-server`. The conformance suite proves that both stores
//! agree on long traces; these tests state each operation's promise on its own.

use crate::support;
use redlimit::internals::{AdminStore, LimiterInternals, RedisStoreInternals};

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::AsyncCommands;
use redlimit::clock::FakeClock;
use redlimit::{Limiter, LimiterBuilder, MemoryStore, Policy, RedisStore, Subject};
use support::{key_of, Captured, RedisServer};

const S: Duration = Duration::from_secs(1);

fn every_algorithm(limit: u32) -> Vec<Policy> {
    vec![
        Policy::fixed_window("fw", limit, S).unwrap(),
        Policy::sliding_window("sw", limit, S).unwrap(),
        Policy::token_bucket("tb", limit, limit, S).unwrap(),
        Policy::sliding_log("sl", limit, S).unwrap(),
    ]
}

fn redis_store(server: &RedisServer, clock: &FakeClock) -> RedisStore {
    server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(5))
}

/// The same scenario on a memory store and on a Redis store, on one fake clock each.
async fn on_both_stores<F, Fut>(server: &RedisServer, scenario: F)
where
    F: Fn(FakeClock, Box<dyn Fn(Policy) -> BothBuilder>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let clock = FakeClock::new(1_000_000);
    let (c, store) = (clock.clone(), redis_store(server, &clock));
    scenario(
        clock,
        Box::new(move |p| BothBuilder {
            memory: Limiter::builder(MemoryStore::with_clock(c.clone())).policy(p.clone()),
            redis: Limiter::builder(store.clone()).policy(p),
        }),
    )
    .await;
}

/// One limiter per store, the same policies.
struct Both {
    memory: Limiter<MemoryStore>,
    redis: Limiter<RedisStore>,
}

/// [`Both`] before it is built.
struct BothBuilder {
    memory: LimiterBuilder<MemoryStore>,
    redis: LimiterBuilder<RedisStore>,
}

impl BothBuilder {
    fn policy(self, p: Policy) -> Self {
        Self {
            memory: self.memory.policy(p.clone()),
            redis: self.redis.policy(p),
        }
    }

    fn build(self) -> Both {
        Both {
            memory: self.memory.build().unwrap(),
            redis: self.redis.build().unwrap(),
        }
    }
}

/// Runs `body` against both limiters of `both`, labelled.
macro_rules! each {
    ($both:expr, |$l:ident, $what:ident| $body:block) => {{
        {
            let $l = &$both.memory;
            let $what = "memory";
            $body
        }
        {
            let $l = &$both.redis;
            let $what = "redis";
            $body
        }
    }};
}

#[tokio::test]
async fn peek_answers_as_a_check_would_and_consumes_nothing() {
    let server = RedisServer::start();
    on_both_stores(&server, |_clock, build| async move {
        for policy in every_algorithm(3) {
            let both = build(policy.clone()).build();
            each!(both, |l, what| {
                // A peek on a fresh subject creates nothing, and says 3 - 1 would be left.
                assert_eq!(l.peek("p", 1).await.unwrap().remaining(), 2, "{what}");
                for i in 0..3 {
                    for _ in 0..5 {
                        let peeked = l.peek("p", 1).await.unwrap();
                        assert!(peeked.is_allowed(), "{what} {policy:?} {i}");
                    }
                    let peeked = l.peek("p", 1).await.unwrap();
                    let checked = l.check("p", 1).await.unwrap();
                    assert_eq!(peeked, checked, "{what} {policy:?}: peek then check");
                }
                let peeked = l.peek("p", 1).await.unwrap();
                assert!(!peeked.is_allowed(), "{what} {policy:?}");
                assert_eq!(peeked, l.check("p", 1).await.unwrap(), "{what}");
                assert!(l.peek("p", 0).await.is_err(), "{what}: cost 0");
                assert!(
                    l.peek("p", 4).await.is_err(),
                    "{what}: cost above the limit"
                );
            });
        }
    })
    .await;
    // Peeks on fresh subjects wrote nothing: only the checked subject's keys exist.
    let keys = server.keys().await;
    assert_eq!(keys.len(), 4, "{keys:?}");
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn refund_then_check_admits_again_for_every_algorithm() {
    let server = RedisServer::start();
    on_both_stores(&server, |clock, build| async move {
        for policy in every_algorithm(3) {
            let both = build(policy.clone()).build();
            let subject = format!("r-{}", policy.name());
            each!(both, |l, what| {
                let s = subject.as_str();
                clock.advance(Duration::from_millis(10));
                assert!(l.check(s, 3).await.unwrap().is_allowed(), "{what}");
                assert!(!l.check(s, 1).await.unwrap().is_allowed(), "{what}");
                let after = l.refund(s, 1).await.unwrap();
                assert!(after.is_allowed(), "{what} {policy:?}: {after:?}");
                assert_eq!(after.remaining(), 0, "{what} {policy:?}");
                assert!(l.check(s, 1).await.unwrap().is_allowed(), "{what}");
                assert!(!l.check(s, 1).await.unwrap().is_allowed(), "{what}");
                // A refund larger than what was consumed gives back no more than that.
                l.refund(s, 3).await.unwrap();
                l.refund(s, 3).await.unwrap();
                assert!(l.check(s, 3).await.unwrap().is_allowed(), "{what}");
                assert!(!l.check(s, 1).await.unwrap().is_allowed(), "{what}");
                // Refunding a subject never seen creates nothing.
                let fresh = l.refund(format!("{s}-never"), 2).await.unwrap();
                assert_eq!(fresh.remaining(), 1, "{what}");
            });
        }
    })
    .await;
    assert!(!server
        .keys()
        .await
        .iter()
        .any(|k| k.windows(6).any(|w| w == b"never}")));
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn a_refund_keeps_the_key_s_ttl() {
    let server = RedisServer::start();
    let clock = FakeClock::new(5_000_000);
    let store = redis_store(&server, &clock);
    let mut conn = server.conn().await;
    for policy in every_algorithm(4) {
        let limiter = Limiter::new(store.clone(), policy.clone());
        let key = key_of(&store, "ttl", &policy);
        limiter.check("ttl", 2).await.unwrap();
        let before: i64 = conn.pttl(&key).await.unwrap();
        // Give back everything: the sliding log becomes an empty ring, the bucket full.
        limiter.refund("ttl", 4).await.unwrap();
        let after: i64 = conn.pttl(&key).await.unwrap();
        assert!(
            after > 0 && after <= before,
            "{policy:?}: PTTL {before} then {after}"
        );
        assert_eq!(limiter.peek("ttl", 4).await.unwrap().remaining(), 0);
        assert!(limiter.check("ttl", 4).await.unwrap().is_allowed());
    }
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn reset_forgets_every_policy_of_the_subject_only() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    on_both_stores(&server, |_clock, build| async move {
        let mut policies = every_algorithm(2).into_iter();
        let first = policies.next().unwrap();
        let both = policies.fold(build(first), BothBuilder::policy).build();
        each!(both, |l, what| {
            for s in ["gone", "kept"] {
                l.check(s, 2).await.unwrap();
                assert!(!l.check(s, 1).await.unwrap().is_allowed(), "{what}");
            }
            l.reset("gone").await.unwrap();
            let fresh = l.check("gone", 1).await.unwrap();
            assert!(fresh.is_allowed(), "{what}");
            assert_eq!(fresh.remaining(), 1, "{what}: {fresh:?}");
            assert!(!l.check("kept", 1).await.unwrap().is_allowed(), "{what}");
            // Resetting a subject never seen is harmless.
            l.reset("nobody").await.unwrap();
        });
    })
    .await;
    let store = server.store();
    let all = every_algorithm(2);
    let limiter = all
        .iter()
        .cloned()
        .fold(Limiter::builder(store.clone()), LimiterBuilder::policy)
        .build()
        .unwrap();
    let key = store.key(&Subject::new("gone"), limiter.policy_set(), &all[0]);
    let count: u64 = conn.exists(key).await.unwrap();
    assert_eq!(count, 1, "re-created by the check after the reset");
    assert_eq!(
        server.keys().await.len(),
        2,
        "two subjects, four policies in each one's key"
    );
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn a_redis_reset_deletes_the_keys() {
    let server = RedisServer::start();
    let store = server.store();
    // As the README starts a store: connected, its library loaded (a first call on a
    // fresh server runs its script in full, within the 50 ms timeout, which a starved
    // Redis can outlast).
    store.connect().await.unwrap();
    let policies = every_algorithm(5).into_iter();
    let limiter = policies
        .fold(
            Limiter::builder(store.clone()).policy(Policy::sliding_window("x", 5, S).unwrap()),
            LimiterBuilder::policy,
        )
        .build()
        .unwrap();
    limiter.check("user:1", 1).await.unwrap();
    // Five policies, their states in the subject's one key.
    assert_eq!(server.keys().await.len(), 1);
    limiter.reset("user:1").await.unwrap();
    assert!(server.keys().await.is_empty());
}

#[tokio::test]
async fn a_refund_or_reset_clears_the_cached_denial() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(Policy::fixed_window("p", 1, Duration::from_secs(60)).unwrap())
        .block_cache(16)
        .local_clock(clock.clone())
        .build()
        .unwrap();
    limiter.check("a", 1).await.unwrap();
    assert!(!limiter.check("a", 1).await.unwrap().is_allowed());
    let cached = limiter.check("a", 1).await.unwrap();
    assert_eq!(cached.origin(), redlimit::Origin::BlockCache);
    limiter.refund("a", 1).await.unwrap();
    let after = limiter.check("a", 1).await.unwrap();
    assert!(after.is_allowed(), "{after:?}");
    assert!(!limiter.check("a", 1).await.unwrap().is_allowed());
    limiter.reset("a").await.unwrap();
    assert!(limiter.check("a", 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_shadow_policy_never_denies_and_says_it_would_have() {
    let server = RedisServer::start();
    on_both_stores(&server, |_clock, build| async move {
        let both = build(Policy::fixed_window("real", 10, S).unwrap())
            .policy(Policy::sliding_log("trial", 2, S).unwrap().shadow())
            .build();
        each!(both, |l, what| {
            let first = l.check("s", 1).await.unwrap();
            assert_eq!(
                first.policy().name(),
                "real",
                "{what}: a shadow never binds"
            );
            assert_eq!(first.remaining(), 9, "{what}");
            assert!(l.check("s", 1).await.unwrap().is_allowed(), "{what}");
            for i in 0..3 {
                let d = l.check("s", 1).await.unwrap();
                assert!(d.is_allowed(), "{what} {i}");
                assert!(d.would_deny(), "{what} {i}");
                assert_eq!(d.shadow_denied_by(), Some("trial"), "{what}");
                assert_eq!(d.retry_after(), None, "{what}");
                assert_eq!(d.remaining(), 7 - i, "{what}: the real policy counts");
            }
            // The peek tells the same story without counting.
            assert!(l.peek("s", 1).await.unwrap().would_deny(), "{what}");
        });
    })
    .await;
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn a_shadow_policy_keeps_the_enforced_key_and_state_format() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let store = server.store();
    store.connect().await.unwrap();
    let policy = Policy::fixed_window("trial", 5, Duration::from_secs(3_600)).unwrap();
    let shadow = Limiter::new(store.clone(), policy.clone().shadow());
    shadow.check("s", 2).await.unwrap();
    let key = key_of(&store, "s", &policy);
    assert_eq!(key, key_of(&store, "s", &policy.clone().shadow()));
    let raw: Vec<u8> = conn.get(&key).await.unwrap();
    let state = RedisStore::stored_state(shadow.policy_set(), &policy, &raw).unwrap();
    assert!(state.ends_with(":2"), "{state:?}");
    // Switched on, it carries on from the shadow's state.
    let enforced = Limiter::new(store, policy);
    assert_eq!(enforced.check("s", 3).await.unwrap().remaining(), 0);
    assert!(!enforced.check("s", 1).await.unwrap().is_allowed());
    server.assert_every_key_expires().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_shadow_denial_is_logged_at_info() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let limiter = Limiter::new(
        MemoryStore::with_clock(FakeClock::new(0)),
        Policy::fixed_window("trial", 1, S).unwrap().shadow(),
    );
    assert!(!limiter.check("s", 1).await.unwrap().would_deny());
    assert!(captured.0.lock().unwrap().is_empty(), "nothing to say yet");
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("INFO") && log.contains("shadow policy would have denied"),
        "{log}"
    );
    assert!(
        log.contains("policy=\"trial\"") || log.contains("policy=trial"),
        "{log}"
    );
}

/// `AdminStore` is implemented by `Arc<S>` too, so a shared store keeps the admin
/// operations.
#[tokio::test]
async fn a_shared_store_keeps_the_admin_operations() {
    fn admin<S: AdminStore>(_: &S) {}
    let store = Arc::new(MemoryStore::with_clock(FakeClock::new(0)));
    admin(&store);
    let limiter = Limiter::new(store, Policy::fixed_window("p", 1, S).unwrap());
    limiter.check("a", 1).await.unwrap();
    assert!(!limiter.peek("a", 1).await.unwrap().is_allowed());
    limiter.reset("a").await.unwrap();
    assert!(limiter.peek("a", 1).await.unwrap().is_allowed());
}

/// The layer's `refund_on` against a real Redis: the refund runs in a task after the
/// response, so the test waits (bounded) until the store shows it.
#[tokio::test]
async fn the_layer_refunds_server_errors_on_redis() {
    use http::{Request, Response, StatusCode};
    use redlimit::key::Global;
    use redlimit::RateLimitLayer;
    use tower::{ServiceBuilder, ServiceExt};

    let server = RedisServer::start();
    let clock = FakeClock::new(1_000_000);
    // An hour's window: Redis expires keys in real time whatever the fake clock says, so
    // a short one could empty the state while the test waits, refund or not.
    let hour = Duration::from_secs(3600);
    let limiter = Limiter::builder(redis_store(&server, &clock))
        .policy(Policy::fixed_window("fw", 2, hour).unwrap())
        .policy(Policy::sliding_window("sw", 2, hour).unwrap())
        .policy(Policy::token_bucket("tb", 2, 2, hour).unwrap())
        .policy(Policy::sliding_log("sl", 2, hour).unwrap())
        .build()
        .unwrap();
    let limiter = Arc::new(limiter);
    let layer = RateLimitLayer::from_shared(Arc::clone(&limiter), Global)
        .refund_on(|status| status.is_server_error());
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|req: Request<String>| async move {
            let status = StatusCode::from_bytes(req.body().as_bytes()).unwrap();
            let mut response = Response::new(String::new());
            *response.status_mut() = status;
            Ok::<_, std::convert::Infallible>(response)
        });
    let call = |status: &'static str| svc.clone().oneshot(Request::new(status.to_owned()));

    for _ in 0..5 {
        assert_eq!(
            call("503").await.unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        // Back to the whole budget of 2 (a peek of 1 leaves 1), within 5 s.
        tokio::time::timeout(Duration::from_secs(5), async {
            while limiter.peek("global", 1).await.unwrap().remaining() != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the refund reached Redis");
    }
    assert_eq!(call("404").await.unwrap().status(), StatusCode::NOT_FOUND);
    assert_eq!(call("200").await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        call("200").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    server.assert_every_key_expires().await;
}
