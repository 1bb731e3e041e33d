//! The lease table's unit tests: settings resolved, a subject's way to a lease, the
//! bound on subjects, and the single flight of leasing checks (one asks, the others
//! wait for its answer, whatever that answer is, even none).

use super::table::Local;
use super::*;
use crate::clock::{Clock, FakeClock, LocalMs, StoreMs};
use crate::decision::Origin;
use crate::store::lease::LeaseFuture;
use crate::store::{GiveBack, GiveBackFuture, LeaseAsk, LeaseStore, StoreError, StoreErrorKind};
use crate::subject::Subject;
use crate::MemoryStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Waker};

fn set(policies: Vec<Policy>) -> PolicySet {
    PolicySet::new(policies)
}

fn sliding(limit: u32, window_ms: u64) -> Policy {
    Policy::sliding_window("s", limit, Duration::from_millis(window_ms)).unwrap()
}

#[test]
fn defaults_follow_the_shortest_window_and_the_smallest_limit() {
    let plan = Leases::new()
        .resolve(&set(vec![sliding(1_000, 1_000)]))
        .unwrap();
    assert_eq!(plan.lifetime_ms, 100, "a tenth of the window");
    assert_eq!(plan.max_units, 100, "a tenth of the limit");
    assert_eq!(plan.min_units, 5, "50 a second over 100 ms");
    assert_eq!(plan.batch, None, "half the lease, decided per ask");
    assert!(plan.gives_back);

    // A token bucket of 10 refilled at 1 a second fills in 10 s: the lifetime is
    // capped at 1 s; its units are written off, not given back.
    let bucket = Policy::token_bucket("b", 10, 1, Duration::from_secs(1)).unwrap();
    let plan = Leases::new().resolve(&set(vec![bucket])).unwrap();
    assert_eq!((plan.lifetime_ms, plan.max_units), (1_000, 1));
    assert!(!plan.gives_back);

    // Fixed windows lease down to the last unit: no batch.
    let fixed = Policy::fixed_window("f", 100, Duration::from_secs(60)).unwrap();
    let plan = Leases::new().resolve(&set(vec![fixed])).unwrap();
    assert_eq!(plan.batch, Some(0));

    // A subject needs two units a lifetime to gain anything from a lease.
    let plan = Leases::new()
        .min_rate(1)
        .resolve(&set(vec![sliding(10, 100)]))
        .unwrap();
    assert_eq!((plan.lifetime_ms, plan.min_units), (10, 2));
}

fn table(clock: &FakeClock, policy: Policy, leases: Leases) -> Arc<LeaseTable> {
    let set = set(vec![policy]);
    let plan = leases.resolve(&set).unwrap();
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    Arc::new(LeaseTable::new(plan, set, store, Arc::new(clock.clone())))
}

#[tokio::test]
async fn a_subject_asks_for_its_rate_and_spends_the_grant_here() {
    let clock = FakeClock::new(1_000_000);
    let table = table(&clock, sliding(1_000, 1_000), Leases::new());
    let subject = Subject::new("s");
    for _ in 0..4 {
        assert!(matches!(
            table.try_local(&subject, 1, LocalMs(1_000_000)),
            Local::Plain
        ));
    }
    let Local::Ask(ask, asker) = table.try_local(&subject, 1, LocalMs(1_000_000)) else {
        panic!("the fifth unit in a lifetime asks for a lease");
    };
    assert_eq!(ask, LeaseAsk { want: 5, batch: 2 });
    let answer = table
        .source
        .check_leasing(subject.clone(), &table.set, 1, ask)
        .await;
    let decision = table
        .granted(&subject, 1, ask.batch, StoreMs(1_000_000), answer, &asker)
        .unwrap();
    // 1 for this request and 5 leased: 994 left in the store, 999 here.
    assert_eq!(decision.remaining(), 999);
    for left in (0..5).rev() {
        let Local::Decided(decision) = table.try_local(&subject, 1, LocalMs(1_000_010)) else {
            panic!("served from the lease");
        };
        assert_eq!(decision.origin(), Origin::Lease);
        assert_eq!(decision.remaining(), 994 + left);
    }
    // The lease is spent: the next unit asks again, for the rate seen (11 units).
    let Local::Ask(ask, asker) = table.try_local(&subject, 1, LocalMs(1_000_020)) else {
        panic!("asks again");
    };
    assert_eq!(ask.want, 11);
    // Meanwhile the subject's other requests wait for that answer.
    let Local::Wait(waiter) = table.try_local(&subject, 1, LocalMs(1_000_020)) else {
        panic!("waits for the leasing check in flight");
    };
    assert!(waiter.waits_for(&asker), "the one just asked");
}

#[test]
fn subjects_past_the_bound_are_checked_without_leases() {
    let clock = FakeClock::new(0);
    let table = table(
        &clock,
        sliding(1_000, 1_000),
        Leases::new().max_subjects(32),
    );
    for i in 0..1_000 {
        let _ = table.try_local(&Subject::new(format!("s{i}")), 1, LocalMs(0));
    }
    assert!(table.len() <= 32, "{} tracked", table.len());
    // Idle subjects are swept after two lifetimes, which makes room again.
    assert!(table.sweep(LocalMs(200)).is_empty());
    assert_eq!(table.len(), 0);
}
/// The cause of a failing store's errors, to tell the asker's own error apart from one
/// rebuilt from its text.
#[derive(Debug)]
struct Down(usize);

impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "down at call {}", self.0)
    }
}

impl std::error::Error for Down {}

/// What a [`Scripted`] store's first leasing check gets; the later ones go to the
/// memory store.
#[derive(Debug, Clone, Copy)]
enum First {
    /// Never answered.
    Hangs,
    /// Fails (as every later one does too).
    Fails,
    /// Answered by the memory store.
    Answers,
}

/// A memory store that counts its leasing checks, the first of which may hang or
/// fail.
struct Scripted {
    memory: MemoryStore,
    first: First,
    calls: AtomicUsize,
}

impl LeaseStore for Scripted {
    fn check_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> LeaseFuture {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        match (call, self.first) {
            (0, First::Hangs) => Box::pin(std::future::pending()),
            (_, First::Fails) => Box::pin(std::future::ready(Err(StoreError::new(
                StoreErrorKind::Unavailable,
                Down(call),
            )))),
            _ => self.memory.check_leasing(subject, set, cost, ask),
        }
    }

    fn give_back(&self, subject: Subject, set: &PolicySet, back: GiveBack) -> GiveBackFuture {
        self.memory.give_back(subject, set, back)
    }

    fn lease_clock(&self) -> Option<Arc<dyn Clock>> {
        self.memory.lease_clock()
    }
}

/// A table on a [`Scripted`] store, a subject asking it for a lease, and two of the
/// subject's requests waiting for that leasing check.
fn in_flight(
    first: First,
) -> (
    Arc<LeaseTable>,
    Arc<Scripted>,
    DecisionFuture,
    [DecisionFuture; 2],
) {
    let clock = FakeClock::new(0);
    let set = set(vec![sliding(1_000, 1_000)]);
    let plan = Leases::new().min_rate(0).resolve(&set).unwrap();
    let store = Arc::new(Scripted {
        memory: MemoryStore::with_clock(clock.clone()),
        first,
        calls: AtomicUsize::new(0),
    });
    let source: Arc<dyn LeaseStore> = store.clone();
    let table = Arc::new(LeaseTable::new(plan, set, source, Arc::new(clock)));
    let subject = Subject::new("s");
    // From two units a lifetime: the second request asks.
    assert!(matches!(
        table.check(&subject, 1, LocalMs(0)),
        Leased::Plain
    ));
    let Leased::Pending(asking) = table.check(&subject, 1, LocalMs(0)) else {
        panic!("the second unit asks for a lease");
    };
    let waiting = [(); 2].map(|()| match table.check(&subject, 1, LocalMs(0)) {
        Leased::Pending(waiting) => waiting,
        _ => panic!("waits for the leasing check in flight"),
    });
    (table, store, asking, waiting)
}

#[tokio::test]
async fn waiters_spend_the_lease_their_asker_took_without_asking() {
    let (_table, store, asking, waiting) = in_flight(First::Answers);
    let asked = asking.await.unwrap();
    assert_eq!(asked.origin(), Origin::Store);
    for waiting in waiting {
        let decision = waiting.await.unwrap();
        assert!(decision.is_allowed());
        assert_eq!(decision.origin(), Origin::Lease);
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 1, "one leasing check");
}

#[tokio::test]
async fn waiters_answer_with_the_asker_s_own_failure_without_asking() {
    let (_table, store, asking, waiting) = in_flight(First::Fails);
    let failed = asking.await.unwrap_err();
    let cause = |error: &StoreError| {
        let source = std::error::Error::source(error).expect("a cause");
        std::ptr::from_ref(
            source
                .downcast_ref::<Down>()
                .expect("the store's own cause"),
        )
    };
    for waiting in waiting {
        let error = waiting.await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Unavailable);
        assert_eq!(error.to_string(), failed.to_string());
        // The very error the asker got, shared: not one made again from its text.
        assert_eq!(cause(&error), cause(&failed));
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 1, "one leasing check");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_asker_hands_its_flight_to_one_of_its_waiters() {
    let (table, store, mut asking, waiting) = in_flight(First::Hangs);
    let [mut first, second] = waiting;
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        asking.as_mut().poll(&mut cx).is_pending(),
        "the store hangs"
    );
    assert!(
        first.as_mut().poll(&mut cx).is_pending(),
        "waits for the asker"
    );
    // The asking request is cancelled mid-flight.
    drop(asking);
    // Its first waiter asks in its place; the second waits for that one, then spends
    // its lease. (On the paused clock, a waiter left hanging fails the timeout at once.)
    let bound = std::time::Duration::from_secs(60);
    let took_over = tokio::time::timeout(bound, first)
        .await
        .expect("not left hanging");
    assert_eq!(took_over.unwrap().origin(), Origin::Store);
    let waited = tokio::time::timeout(bound, second)
        .await
        .expect("not left hanging");
    assert_eq!(waited.unwrap().origin(), Origin::Lease);
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        2,
        "the hung one and one more"
    );
    assert!(table.held_units() > 0);
}

#[tokio::test]
async fn a_reset_during_a_leasing_check_leaves_its_waiters_to_look_again() {
    let (table, store, asking, waiting) = in_flight(First::Answers);
    table.forget(&Subject::new("s"));
    // The asker is answered; the subject was forgotten here meanwhile, so its lease is
    // not kept (its units go back to the store).
    assert_eq!(asking.await.unwrap().origin(), Origin::Store);
    assert_eq!(table.held_units(), 0);
    // Its waiters get that answer, then look again on a fresh entry: the first is
    // below the rate there and checks without a lease, the second asks for one.
    for waiting in waiting {
        let decision = waiting.await.unwrap();
        assert_eq!(decision.origin(), Origin::Store);
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 3);
    assert!(table.held_units() > 0, "the second waiter's lease");
}
