//! What the layer's own tests need of its private parts: the options a clone keeps,
//! and the limiter's decision made at once, which the layer's fast path depends on. The
//! layer end to end, through its public API, is tested in `tests/it/layer*.rs`.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::FakeClock;
use crate::key::Global;
use crate::layer::middleware::*;
use crate::limiter::{Checked, Limiter};
use crate::store::backend::Backend;
use crate::store::{AdminStore, Operation};
use crate::store::{PolicySet, StoreError, StoreErrorKind};
use crate::{Decision, MemoryStore, Policy, Subject};

/// A store that always fails, as an unreachable Redis would.
pub(crate) struct BrokenStore;

impl Backend for BrokenStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _subject: Subject, _set: &PolicySet, _cost: u64) -> Self::Future {
        ready(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

/// Its admin operations decide as its checks do.
impl AdminStore for BrokenStore {
    fn run(&self, _: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.check(subject, set, cost)
    }
}

/// A store that never decides at once, as Redis does not: its `check_now` is the
/// default one, which hands the subject back.
struct AnswersLater(MemoryStore);

impl Backend for AnswersLater {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.0.check(subject, set, cost)
    }
}

impl AdminStore for AnswersLater {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.0.run(op, subject, set, cost)
    }
}

fn fixed(name: &str, limit: u32, window_ms: u64) -> Policy {
    Policy::fixed_window(name, limit, Duration::from_millis(window_ms)).unwrap()
}

#[test]
fn layer_is_clone_and_debug_and_configures_a_copy() {
    let limiter = Limiter::new(
        MemoryStore::with_clock(FakeClock::new(0)),
        fixed("default", 1, 1_000),
    );
    let layer = RateLimitLayer::new(limiter, Global);
    let legacy = layer.clone().header_style(HeaderStyle::Legacy);
    assert_eq!(layer.shared.config.header_style, HeaderStyle::Ietf);
    assert_eq!(legacy.shared.config.header_style, HeaderStyle::Legacy);
    assert!(Arc::ptr_eq(layer.limiter(), legacy.limiter()));
    let debug = format!("{legacy:?}");
    assert!(
        debug.contains("RateLimitLayer") && debug.contains("Legacy"),
        "{debug}"
    );
}

#[tokio::test]
async fn decisions_made_at_once_take_the_fast_path() {
    // The fast path (no clone of the inner service, no future kept) is taken when the
    // store says it decided at once, and for the block cache's answers on any store.
    let clock = FakeClock::new(0);
    let memory = Limiter::new(MemoryStore::with_clock(clock.clone()), fixed("d", 1, 1_000));
    let now = |checked| match checked {
        Checked::Now(result) => Some(result),
        Checked::Later(_) => None,
    };
    assert!(now(memory.check_or_later("a".into(), 1)).is_some());
    assert!(
        now(memory.check_or_later("a".into(), 0)).is_some(),
        "a refused cost"
    );
    // A store that answers later, as Redis does: no fast path for its own answers...
    let slow = Limiter::builder(AnswersLater(MemoryStore::with_clock(clock.clone())))
        .policy(fixed("d", 1, 1_000))
        .block_cache(16)
        .local_clock(clock)
        .build()
        .unwrap();
    let Checked::Later(first) = slow.check_or_later("a".into(), 1) else {
        panic!("decided at once");
    };
    assert!(first.await.unwrap().is_allowed());
    let Checked::Later(denied) = slow.check_or_later("a".into(), 1) else {
        panic!("decided at once");
    };
    assert!(!denied.await.unwrap().is_allowed());
    // ...but its block cache's answers take it.
    let cached = now(slow.check_or_later("a".into(), 1)).unwrap().unwrap();
    assert_eq!(cached.origin(), crate::Origin::BlockCache);
}
