//! Many counters in one decision: policies of different subjects (the key, its org,
//! everyone) and units (requests, cost) decided together, all or nothing, in one store
//! call, the same on the memory store and on Redis; and live limits that keep the
//! count, on every instance sharing the store.

use std::time::Duration;

use redlimit::clock::FakeClock;
use redlimit::store::Store;
use redlimit::{Error, Limiter, MemoryStore, Policy, Scope, Subject, Unit};

use crate::support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

fn rpm_and_tokens<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder(store)
        .policy(
            Policy::fixed_window("rpm", 3, MINUTE)
                .unwrap()
                .counting(Unit::Requests),
        )
        .policy(Policy::sliding_window("tokens", 1000, MINUTE).unwrap())
        .build()
        .unwrap()
}

/// Requests per minute beside tokens per minute: each check of 10 takes one request
/// and 10 tokens; the refused fourth takes neither.
async fn requests_and_tokens<S: Store>(limiters: &[Limiter<S>]) {
    let mut allowed = Vec::new();
    for i in 0..4 {
        allowed.push(
            limiters[i % limiters.len()]
                .check("k", 10)
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    assert_eq!(allowed, [true, true, true, false]);
    let peek = limiters[0].peek("k", 1).await.unwrap();
    let each = peek.each_policy().unwrap();
    assert_eq!((each[0].allowed, each[0].remaining), (false, 0), "{peek:?}");
    // The peek is refused (by the requests), so it takes nothing: 970 left.
    assert_eq!(
        (each[1].allowed, each[1].remaining),
        (true, 970),
        "{peek:?}"
    );
    // A cost a requests policy alone could not take is no error: it takes one.
    let big = rpm_and_tokens(MemoryStore::new());
    assert!(big.check("other", 1000).await.unwrap().is_allowed());
    // Refunds and charges move the cost units alone.
    limiters[0].refund("k", 10).await.unwrap();
    let each = limiters[0].peek("k", 1).await.unwrap();
    let each = each.each_policy().unwrap();
    assert_eq!((each[0].remaining, each[1].remaining), (0, 980));
}

#[tokio::test]
async fn requests_and_tokens_in_one_check_in_memory() {
    requests_and_tokens(&[rpm_and_tokens(MemoryStore::new())]).await;
}

#[tokio::test]
async fn requests_and_tokens_in_one_check_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    requests_and_tokens(&[
        rpm_and_tokens(server.store()),
        rpm_and_tokens(server.store()),
    ])
    .await;
}

fn key_and_org<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder(store)
        .policy(Policy::sliding_window("tokens", 1000, MINUTE).unwrap())
        .policy(
            Policy::sliding_window("org_tokens", 1000, MINUTE)
                .unwrap()
                .per(Scope::named("org").unwrap()),
        )
        .build()
        .unwrap()
}

fn of_org(key: &str, org: &str) -> Subject {
    Subject::new(key).within("org", &Subject::new(org))
}

/// Key A of org X uses 600; key B of X then asks 600: the org refuses, and B's own
/// budget is untouched.
async fn key_within_org<S: Store>(limiters: &[Limiter<S>]) {
    let last = &limiters[limiters.len() - 1];
    assert!(limiters[0]
        .check(of_org("a", "x"), 600)
        .await
        .unwrap()
        .is_allowed());
    let refused = last.check(of_org("b", "x"), 600).await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(refused.policy().name(), "org_tokens");
    let peek = last.peek(of_org("b", "x"), 1).await.unwrap();
    let each = peek.each_policy().unwrap();
    assert_eq!(
        (each[0].remaining, each[1].remaining),
        (999, 399),
        "{peek:?}"
    );
    // Another org's key is not counted with X.
    assert!(last
        .check(of_org("c", "y"), 1000)
        .await
        .unwrap()
        .is_allowed());
    // A subject without the org is a setup mistake, never a decision.
    assert!(matches!(
        last.check("a", 1).await,
        Err(Error::MissingScope(scope)) if scope == "org"
    ));
    // A's own count moved with X's: 400 left of its own 1000.
    let a = last.peek(of_org("a", "x"), 1).await.unwrap();
    assert_eq!(a.each_policy().unwrap()[0].remaining, 399);
}

#[tokio::test]
async fn a_key_and_its_org_all_or_nothing_in_memory() {
    key_within_org(&[key_and_org(MemoryStore::new())]).await;
}

#[tokio::test]
async fn a_key_and_its_org_all_or_nothing_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    key_within_org(&[key_and_org(server.store()), key_and_org(server.store())]).await;
    // Each counter that took something: A's and C's, X's and Y's (B was refused).
    let keys = server.keys().await;
    assert_eq!(keys.len(), 4, "{keys:?}");
    // One hash tag per check: the org's.
    let tags: std::collections::BTreeSet<_> = keys
        .iter()
        .map(|k| crate::support::hash_tag(k).to_vec())
        .collect();
    assert_eq!(tags.len(), 2, "{keys:?}");
    server.assert_every_key_expires().await;
}

fn global<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder(store)
        .policy(Policy::sliding_window("tokens", 1000, MINUTE).unwrap())
        .policy(
            Policy::fixed_window("everyone", 5, MINUTE)
                .unwrap()
                .counting(Unit::Requests)
                .per(Scope::global()),
        )
        .build()
        .unwrap()
}

async fn five_keys_then_none<S: Store>(limiters: &[Limiter<S>]) {
    for i in 0..5 {
        let decision = limiters[i % limiters.len()]
            .check(format!("key-{i}"), 7)
            .await
            .unwrap();
        assert!(decision.is_allowed(), "{i}: {decision:?}");
    }
    let sixth = limiters[1 % limiters.len()]
        .check("key-6", 7)
        .await
        .unwrap();
    assert!(!sixth.is_allowed());
    assert_eq!(sixth.policy().name(), "everyone");
    // The refused key took nothing of its own (a refused peek takes nothing either).
    let peek = limiters[0].peek("key-6", 1).await.unwrap();
    assert_eq!(peek.each_policy().unwrap()[0].remaining, 1000);
}

#[tokio::test]
async fn a_global_counter_beside_each_key_in_memory() {
    five_keys_then_none(&[global(MemoryStore::new())]).await;
}

#[tokio::test]
async fn a_global_counter_beside_each_key_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    five_keys_then_none(&[global(server.store()), global(server.store())]).await;
}

/// Checks of many keys of one org queued behind each other go as one batch: each
/// must see the org counter as the checks before it left it.
#[tokio::test]
async fn a_batch_of_one_orgs_keys_counts_the_org_once_per_check() {
    let server = RedisServer::start();
    let limiter = std::sync::Arc::new(key_and_org(server.store().max_pipelined(1)));
    let checks: Vec<_> = (0..40)
        .map(|i| {
            let limiter = std::sync::Arc::clone(&limiter);
            tokio::spawn(async move { limiter.check(of_org(&format!("k{i}"), "x"), 100).await })
        })
        .collect();
    let mut allowed = 0;
    for check in checks {
        if check.await.unwrap().unwrap().is_allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 10);
}

fn live<S: Store + redlimit::store::LiveLimitStore + Clone>(
    store: S,
    every: Duration,
) -> Limiter<S> {
    Limiter::builder(store)
        .policy(Policy::sliding_window("tokens", 1000, MINUTE).unwrap())
        .live_limits(every)
        .build()
        .unwrap()
}

/// A key that used 800 of 1000, raised to 5000 on one instance: 4200 left on the
/// other once it has read the change, and a removal gives it its own limit back.
async fn raised_keeps_the_count<'a, S: Store>(
    a: &Limiter<S>,
    b: &Limiter<S>,
    b_reads: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>,
) {
    assert!(a.check("k", 800).await.unwrap().is_allowed());
    assert!(!b.check("k", 800).await.unwrap().is_allowed());
    a.set_limit("tokens", "k", 5000).await.unwrap();
    assert_eq!(a.limit_of("tokens", "k").unwrap(), 5000);
    b_reads().await;
    assert_eq!(b.limit_of("tokens", "k").unwrap(), 5000);
    let peek = b.peek("k", 1).await.unwrap();
    assert_eq!(peek.each_policy().unwrap()[0].remaining + 1, 4200);
    assert!(b.check("k", 800).await.unwrap().is_allowed());
    // Other keys keep the policy's own limit.
    assert_eq!(b.limit_of("tokens", "other").unwrap(), 1000);
    a.remove_limit("tokens", "k").await.unwrap();
    b_reads().await;
    assert_eq!(b.limit_of("tokens", "k").unwrap(), 1000);
    assert!(!b.check("k", 1).await.unwrap().is_allowed());
    // A policy's limit for everyone, under a subject's own.
    a.set_policy_limit("tokens", 3000).await.unwrap();
    a.set_limit("tokens", "k", 1500).await.unwrap();
    b_reads().await;
    assert_eq!(b.limit_of("tokens", "other").unwrap(), 3000);
    assert_eq!(b.limit_of("tokens", "k").unwrap(), 1500);
    let peek = b.peek("other", 1).await.unwrap();
    assert_eq!(peek.each_policy().unwrap()[0].remaining + 1, 3000);
    a.remove_policy_limit("tokens").await.unwrap();
    a.remove_limit("tokens", "k").await.unwrap();
    b_reads().await;
    assert_eq!(b.limit_of("tokens", "other").unwrap(), 1000);
    // What cannot be a limit is an error, not a change.
    assert!(matches!(
        a.set_limit("tokens", "k", 0).await,
        Err(Error::BadLimit(_))
    ));
    assert!(matches!(
        a.set_limit("nope", "k", 9).await,
        Err(Error::BadLimit(_))
    ));
    assert!(matches!(
        a.set_limit("tokens", "k", u64::MAX).await,
        Err(Error::BadLimit(_))
    ));
}

#[tokio::test]
async fn a_live_limit_reaches_the_other_instance_through_redis() {
    let server = RedisServer::start();
    let (a, b) = (live(server.store(), MINUTE), live(server.store(), MINUTE));
    raised_keeps_the_count(&a, &b, || {
        Box::pin(async { b.refresh_limits().await.unwrap() })
    })
    .await;
}

/// The polling itself, on a paused clock: another limiter of the same store sees a
/// change within one poll interval.
#[tokio::test(start_paused = true)]
async fn a_live_limit_is_polled_within_its_interval() {
    let store = std::sync::Arc::new(MemoryStore::with_clock(FakeClock::new(1_000_000)));
    let every = Duration::from_millis(250);
    let (a, b) = (
        live(std::sync::Arc::clone(&store), every),
        live(std::sync::Arc::clone(&store), every),
    );
    raised_keeps_the_count(&a, &b, || {
        Box::pin(async {
            tokio::time::sleep(every + Duration::from_millis(1)).await;
        })
    })
    .await;
}

#[test]
fn live_limits_without_a_runtime_say_so_and_still_apply_their_own_changes() {
    let limiter = live(MemoryStore::new(), MINUTE);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        limiter.set_limit("tokens", "k", 5).await.unwrap();
        assert_eq!(limiter.limit_of("tokens", "k").unwrap(), 5);
        assert!(limiter.check("k", 5).await.unwrap().is_allowed());
        assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
    });
}

#[tokio::test]
async fn what_cannot_work_together_is_refused_when_built() {
    let org = Scope::named("org").unwrap();
    let slots = Policy::in_flight("slots", 3, MINUTE)
        .unwrap()
        .per(org.clone());
    assert!(matches!(
        Limiter::builder(MemoryStore::new()).policy(slots).build(),
        Err(redlimit::BuildError::ScopedInFlight(_))
    ));
    assert!(Scope::named("").is_err() && Scope::named("a b").is_err());
}

/// Every algorithm keeps its count under a live limit, raised or lowered, in memory
/// and in Redis: 3 used of 5, raised to 10 leaves 7; lowered to 2 refuses; back to
/// its own limit leaves 2.
async fn every_algorithm_keeps_its_count<S: Store + redlimit::store::LiveLimitStore + Clone>(
    store: impl Fn() -> S,
) {
    let w = MINUTE;
    let policies = [
        Policy::fixed_window("p", 5, w).unwrap(),
        Policy::sliding_window("p", 5, w).unwrap(),
        Policy::token_bucket("p", 5, 1, w).unwrap(),
        Policy::sliding_log("p", 5, w).unwrap(),
        Policy::in_flight("p", 5, w).unwrap(),
        Policy::calendar("p", 5, redlimit::Period::Month, "America/New_York", 15).unwrap(),
    ];
    for (i, policy) in policies.into_iter().enumerate() {
        let algorithm = policy.algorithm();
        let limiter = Limiter::builder(store())
            .policy(policy)
            .live_limits(MINUTE)
            .build()
            .unwrap();
        let subject = format!("s{i}");
        for _ in 0..3 {
            assert!(
                limiter
                    .check(subject.as_str(), 1)
                    .await
                    .unwrap()
                    .is_allowed(),
                "{algorithm}"
            );
        }
        let left = |d: redlimit::Decision| d.each_policy().unwrap()[0].remaining + 1;
        limiter.set_limit("p", subject.as_str(), 10).await.unwrap();
        assert_eq!(
            left(limiter.peek(subject.as_str(), 1).await.unwrap()),
            7,
            "{algorithm}"
        );
        limiter.set_limit("p", subject.as_str(), 2).await.unwrap();
        assert!(
            !limiter
                .check(subject.as_str(), 1)
                .await
                .unwrap()
                .is_allowed(),
            "{algorithm}"
        );
        limiter.remove_limit("p", subject.as_str()).await.unwrap();
        assert_eq!(
            left(limiter.peek(subject.as_str(), 1).await.unwrap()),
            2,
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn every_algorithm_keeps_its_count_under_a_live_limit_in_memory() {
    let store = MemoryStore::with_clock(FakeClock::new(1_700_000_000_000));
    every_algorithm_keeps_its_count(|| store.clone()).await;
}

#[tokio::test]
async fn every_algorithm_keeps_its_count_under_a_live_limit_in_redis() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    every_algorithm_keeps_its_count(|| server.store().client_clock(clock.clone())).await;
}
