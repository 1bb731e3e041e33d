use super::*;
use crate::clock::FakeClock;
use crate::decision::{Decision, Origin};
use crate::store::backend::Backend;
use crate::store::{AdminStore, Operation, PolicySet, StoreError};
use crate::MemoryStore;
use std::time::Duration;

fn two_policies(clock: &FakeClock) -> Limiter<MemoryStore> {
    Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(Policy::fixed_window("second", 3, Duration::from_secs(1)).unwrap())
        .policy(Policy::fixed_window("minute", 5, Duration::from_secs(60)).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_denial_by_one_policy_consumes_from_none() {
    let clock = FakeClock::new(0);
    let limiter = two_policies(&clock);
    for _ in 0..3 {
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    }
    let denied = limiter.check("s", 1).await.unwrap();
    assert_eq!(denied.denied_by(), Some("second"));
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
    clock.advance(Duration::from_secs(1));
    // "minute" saw 3, not 4: two more pass, then it denies.
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    let last = limiter.check("s", 1).await.unwrap();
    assert!(last.is_allowed());
    assert_eq!(last.policy().name(), "minute");
    assert_eq!(last.remaining(), 0);
    let denied = limiter.check("s", 1).await.unwrap();
    assert_eq!(denied.denied_by(), Some("minute"));
}

#[tokio::test]
async fn impossible_costs_are_errors_not_denials() {
    let limiter = two_policies(&FakeClock::new(0));
    assert!(matches!(limiter.check("s", 0).await, Err(Error::ZeroCost)));
    match limiter.check("s", 4).await {
        Err(Error::CostTooHigh { max, policy, .. }) => {
            assert_eq!((max, policy.as_str()), (3, "second"));
        }
        other => panic!("expected CostTooHigh, got {other:?}"),
    }
    assert!(limiter.check("s", 3).await.unwrap().is_allowed());
}

#[test]
fn a_name_given_twice_is_refused_and_nothing_is_replaced() {
    let twice = Limiter::builder(MemoryStore::new())
        .policy(Policy::fixed_window("second", 3, Duration::from_secs(1)).unwrap())
        .policy(Policy::fixed_window("minute", 5, Duration::from_secs(60)).unwrap())
        .policy(Policy::sliding_log("second", 9, Duration::from_secs(1)).unwrap())
        .build();
    match twice {
        Err(BuildError::DuplicateName(name)) => assert_eq!(name, "second"),
        other => panic!("expected a duplicate name, got {other:?}"),
    }
    let none = Limiter::builder(MemoryStore::new()).block_cache(4).build();
    assert!(matches!(none, Err(BuildError::NoPolicy)), "{none:?}");
}

/// Settings given in any order build the same limiter, and clones share the block
/// cache: a denial one clone cached answers the other.
#[tokio::test]
async fn settings_in_any_order_build_the_same_limiter_and_clones_share_the_cache() {
    let clock = FakeClock::new(0);
    let policy = || Policy::fixed_window("p", 1, Duration::from_secs(60)).unwrap();
    let one = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .local_clock(clock.clone())
        .block_cache(8)
        .policy(policy())
        .build()
        .unwrap();
    let other = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(policy())
        .block_cache(8)
        .local_clock(clock.clone())
        .build()
        .unwrap();
    for limiter in [one, other] {
        let clone = limiter.clone();
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        assert_eq!(limiter.check("s", 1).await.unwrap().origin(), Origin::Store);
        assert_eq!(
            clone.check("s", 1).await.unwrap().origin(),
            Origin::BlockCache
        );
    }
}

/// A store that always fails, to exercise the fallback.
#[derive(Debug)]
struct Broken;

impl Backend for Broken {
    type Future = std::future::Ready<Result<Decision, StoreError>>;
    fn check(&self, _: Subject, _: &PolicySet, _: u64) -> Self::Future {
        std::future::ready(Err(StoreError::timeout()))
    }
}

/// Its admin operations decide as its checks do.
impl AdminStore for Broken {
    fn run(&self, _: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.check(subject, set, cost)
    }
}

/// Counts calls that reach the store.
#[derive(Debug)]
struct Counting(MemoryStore, std::sync::atomic::AtomicUsize);

impl Backend for Counting {
    type Future = <MemoryStore as Backend>::Future;
    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.check(subject, set, cost)
    }
}

impl AdminStore for Counting {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.run(op, subject, set, cost)
    }
}

#[tokio::test]
async fn the_block_cache_answers_a_flood_without_the_store() {
    let clock = FakeClock::new(0);
    let store = Arc::new(Counting(
        MemoryStore::with_clock(clock.clone()),
        Default::default(),
    ));
    let limiter = Limiter::builder(Arc::clone(&store))
        .policy(Policy::sliding_window("p", 10, Duration::from_secs(1)).unwrap())
        .block_cache(100)
        .local_clock(clock.clone())
        .build()
        .unwrap();
    let mut first_denial = None;
    for i in 0..1_000 {
        let d = limiter.check("flooder", 1).await.unwrap();
        if !d.is_allowed() && first_denial.is_none() {
            first_denial = Some((i, d.clone()));
        }
        assert_eq!(d.is_allowed(), i < 10, "request {i}");
    }
    let (_, denial) = first_denial.unwrap();
    assert_eq!(store.1.load(std::sync::atomic::Ordering::SeqCst), 11);
    let cached = limiter.check("flooder", 1).await.unwrap();
    assert_eq!(cached.origin(), Origin::BlockCache);
    assert_eq!(cached.retry_after(), denial.retry_after());
    // Others still reach the store, and so does the flooder once its wait is over.
    assert!(limiter.check("someone-else", 1).await.unwrap().is_allowed());
    clock.advance(denial.retry_after().unwrap());
    let after = limiter.check("flooder", 1).await.unwrap();
    assert!(after.is_allowed());
    assert_eq!(after.origin(), Origin::Store);
}

#[tokio::test]
async fn the_block_cache_answers_only_the_denied_cost_until_the_subject_is_admitted() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(Policy::sliding_log("p", 3, Duration::from_secs(1)).unwrap())
        .block_cache(10)
        .local_clock(clock.clone())
        .build()
        .unwrap();
    for t in [0, 100, 200] {
        clock.set_ms(t);
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    }
    clock.set_ms(300);
    let one = limiter.check("s", 1).await.unwrap();
    assert_eq!(one.retry_after(), Some(Duration::from_millis(700)));
    // Two units wait for the stamp at 100 to leave, not the one at 0.
    let two = limiter.check("s", 2).await.unwrap();
    assert_eq!(two.origin(), Origin::Store);
    assert_eq!(two.retry_after(), Some(Duration::from_millis(800)));
    let again = limiter.check("s", 2).await.unwrap();
    assert_eq!(again.origin(), Origin::BlockCache);
    // One unit fits at 1 000 and consumes: two units now wait for 1 200, not 1 100.
    clock.set_ms(1_000);
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    let two = limiter.check("s", 2).await.unwrap();
    assert_eq!(two.origin(), Origin::Store);
    assert_eq!(two.retry_after(), Some(Duration::from_millis(200)));
}

#[tokio::test]
async fn after_the_local_clock_goes_back_the_block_cache_asks_the_store_once() {
    let clock = FakeClock::new(10_000);
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(Policy::fixed_window("p", 1, Duration::from_secs(1)).unwrap())
        .block_cache(10)
        .local_clock(clock.clone())
        .build()
        .unwrap();
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    assert!(!limiter.check("s", 1).await.unwrap().is_allowed());
    clock.set_ms(9_500);
    // Behind the denial: the store decides (it may read its state as foreign and start
    // afresh, which a cached wait cannot know).
    let asked = limiter.check("s", 1).await.unwrap();
    assert_eq!(asked.origin(), Origin::Store);
    // Still blocked until 11 000, now 1.5 s away; cached again from the store's answer.
    assert_eq!(asked.retry_after(), Some(Duration::from_millis(1_500)));
    let cached = limiter.check("s", 1).await.unwrap();
    assert_eq!(cached.origin(), Origin::BlockCache);
    assert_eq!(cached.clone().with_origin(Origin::Store), asked);
    let store = limiter.store().decide(Subject::new("s"), &limiter.set, 1);
    assert_eq!(store, cached.with_origin(Origin::Store));
}

#[tokio::test]
async fn the_block_cache_shortens_its_wait_as_time_passes_and_stays_bounded() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(Policy::fixed_window("p", 2, Duration::from_secs(10)).unwrap())
        .block_cache(3)
        .local_clock(clock.clone())
        .build()
        .unwrap();
    for subject in ["a", "b", "c", "d", "e"] {
        for _ in 0..3 {
            limiter.check(subject, 1).await.unwrap();
        }
    }
    let blocks = limiter.guard.as_ref().unwrap().blocks.as_ref().unwrap();
    assert_eq!(blocks.len(), 3, "bounded to its size");
    clock.advance(Duration::from_secs(4));
    let cached = limiter.check("a", 1).await.unwrap();
    assert_eq!(cached.origin(), Origin::BlockCache);
    assert_eq!(cached.retry_after(), Some(Duration::from_secs(6)));
    // A cost smaller than the denied one may fit sooner: the cache lets it through
    // to the store.
    clock.advance(Duration::from_secs(6));
    assert!(limiter.check("f", 1).await.unwrap().is_allowed());
    assert!(!limiter.check("f", 2).await.unwrap().is_allowed());
    let small = limiter.check("f", 1).await.unwrap();
    assert!(small.is_allowed());
    assert_eq!(small.origin(), Origin::Store);
}

#[tokio::test]
async fn the_fallback_decides_while_the_store_fails() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::builder(Broken)
        .policy(Policy::fixed_window("p", 2, Duration::from_secs(1)).unwrap())
        .fallback(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let a = limiter.check("s", 1).await.unwrap();
    assert!(a.is_allowed());
    assert_eq!(a.origin(), Origin::Fallback);
    assert!(limiter.check("s", 1).await.unwrap().is_allowed());
    assert!(!limiter.check("s", 1).await.unwrap().is_allowed());
    // Without a fallback the failure is an error, never a denial.
    let bare = Limiter::new(
        Broken,
        Policy::fixed_window("p", 2, Duration::from_secs(1)).unwrap(),
    );
    assert!(matches!(bare.check("s", 1).await, Err(Error::Store(_))));
}
