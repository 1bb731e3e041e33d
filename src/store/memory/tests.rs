//! The memory store's own tests: its map's keys and hash, and its sweeping.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::map::{same_bytes, Entry, Key, KeyBytes, ShortKeyHasher, SHARDS};
use super::MemoryStore;
use crate::clock::{Clock, FakeClock};
use crate::policy::Policy;
use crate::store::PolicySet;
use crate::subject::Subject;

fn set() -> PolicySet {
    PolicySet::new(vec![
        Policy::fixed_window("p", 10, Duration::from_secs(1)).unwrap()
    ])
}

/// `count` subjects decided on at the clock's time: each holds state for a second.
fn fill(store: &MemoryStore, set: &PolicySet, prefix: &str, count: usize) {
    for i in 0..count {
        let decision = store.decide(Subject::new(format!("{prefix}{i}")), set, 1);
        assert!(decision.is_allowed());
    }
}

fn largest_shard(store: &MemoryStore) -> usize {
    store
        .inner
        .map
        .shards
        .iter()
        .map(|s| s.lock().len())
        .max()
        .unwrap()
}

#[test]
fn an_entry_with_its_key_takes_80_bytes() {
    // What keeps 10,000 subjects' map about a third smaller than with a `Subject`
    // and a `SmallVec` of states (120 bytes).
    assert!(std::mem::size_of::<(Key, Entry)>() <= 80);
}

#[test]
fn the_short_key_hash_is_keyed_and_tells_lengths_and_sets_apart() {
    let (a, b) = (ShortKeyHasher::new(), ShortKeyHasher::new());
    let mut seen = std::collections::HashSet::new();
    for len in 0..=40usize {
        // Zero bytes of every length: only the length tells them apart.
        let zeros = vec![0u8; len];
        assert_eq!(a.hash(7, &zeros), a.hash(7, &zeros), "deterministic");
        assert!(seen.insert(a.hash(7, &zeros)), "length {len}");
        assert!(seen.insert(a.hash(8, &zeros)), "set, length {len}");
        // One byte changed anywhere changes the hash.
        for at in 0..len {
            let mut one = zeros.clone();
            one[at] = 1;
            assert!(seen.insert(a.hash(7, &one)), "length {len}, byte {at}");
        }
    }
    assert_ne!(
        a.hash(7, b"ip=10.0.0.1"),
        b.hash(7, b"ip=10.0.0.1"),
        "keyed"
    );
}

#[test]
fn short_byte_comparison_is_equality() {
    let base: Vec<u8> = (0..40u8).collect();
    for len in 0..=40 {
        let a = &base[..len];
        assert!(same_bytes(a, &base[..len]));
        for at in 0..len {
            let mut b = a.to_vec();
            b[at] ^= 0x80;
            assert!(!same_bytes(a, &b), "length {len}, byte {at}");
        }
        if len > 0 {
            assert!(!same_bytes(a, &base[..len - 1]));
        }
    }
}

#[test]
fn long_subjects_live_on_the_heap_and_keep_apart() {
    let clock = FakeClock::new(0);
    let store = MemoryStore::with_clock(clock);
    let set = PolicySet::new(vec![
        Policy::fixed_window("p", 2, Duration::from_secs(1)).unwrap()
    ]);
    // Tag byte plus 21, 22 and 40 bytes: on either side of the inline limit, and
    // pairs that differ only in their last byte.
    for len in [21, 22, 40] {
        let (x, y) = ("x".repeat(len), format!("{}y", "x".repeat(len - 1)));
        for _ in 0..2 {
            assert!(store.decide(Subject::new(&x), &set, 1).is_allowed());
        }
        assert!(!store.decide(Subject::new(&x), &set, 1).is_allowed());
        assert!(
            store.decide(Subject::new(&y), &set, 1).is_allowed(),
            "{len}"
        );
    }
    let heap = KeyBytes::new(&[9; 23]);
    assert!(matches!(heap, KeyBytes::Heap(_)));
    assert_eq!(heap.as_slice(), &[9; 23]);
    assert_eq!(KeyBytes::new(&[9; 22]).as_slice(), &[9; 22]);
}

#[test]
fn a_call_sweeps_at_most_one_shard_and_a_pass_of_calls_sweeps_them_all() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    assert!(
        store.inner.sweeper.get().is_none(),
        "no thread on a given clock"
    );
    let set = set();
    fill(&store, &set, "old-", 20_000);
    assert_eq!(store.len(), 20_000);
    clock.advance(Duration::from_secs(10));
    // Every old entry has expired, and the whole pass is overdue: still, one call
    // sweeps one shard, not the map.
    let shard = largest_shard(&store);
    store.decide(Subject::new("new-0"), &set, 1);
    let left = store.len();
    assert!(left < 20_000 + 1, "the call swept something");
    assert!(
        20_000 + 1 - left <= shard,
        "one call reclaimed {} entries; the largest shard holds {shard}",
        20_000 + 1 - left
    );
    // One shard per call: after a pass's worth of calls, only the new subjects.
    for i in 1..SHARDS {
        store.decide(Subject::new(format!("new-{i}")), &set, 1);
    }
    assert_eq!(store.len(), SHARDS);
}

#[test]
fn the_sweepers_step_gives_memory_back_without_any_call() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    let set = set();
    fill(&store, &set, "s", 10_000);
    // Not due yet: the step sweeps a slice at most (nothing has expired anyway).
    store.inner.sweep_due_slices(clock.now_ms());
    assert_eq!(store.len(), 10_000);
    clock.advance(Duration::from_secs(2));
    // What the background thread does when it wakes: no decision involved.
    let wait = store.inner.sweep_due_slices(clock.now_ms());
    assert!(store.is_empty());
    assert!(
        store
            .inner
            .map
            .shards
            .iter()
            .all(|s| s.lock().capacity() == 0),
        "emptied shards give their memory back"
    );
    // A pass that found the store empty waits an interval more before the next.
    assert!(wait >= Duration::from_secs(1), "{wait:?}");
}

#[test]
fn the_explicit_sweep_reclaims_everything_expired_at_once() {
    let clock = FakeClock::new(0);
    let store = MemoryStore::with_clock(clock.clone()).sweep_every(Duration::from_secs(1 << 30));
    let set = set();
    fill(&store, &set, "old-", 5_000);
    clock.advance(Duration::from_secs(5));
    fill(&store, &set, "live-", 100);
    assert_eq!(store.len(), 5_100, "never due: calls swept nothing");
    store.sweep();
    assert_eq!(store.len(), 100);
}

#[test]
fn the_background_sweeper_reclaims_without_traffic_and_stops_with_the_store() {
    let store = MemoryStore::new().sweep_every(Duration::from_millis(20));
    assert!(store.inner.swept_in_background.load(Ordering::Relaxed));
    let set = PolicySet::new(vec![Policy::fixed_window(
        "p",
        10,
        Duration::from_millis(1),
    )
    .unwrap()]);
    fill(&store, &set, "s", 1_000);
    // Wall time: wait for the thread, bounded far beyond its 20 ms passes.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !store.is_empty() {
        assert!(std::time::Instant::now() < deadline, "{} left", store.len());
        std::thread::sleep(Duration::from_millis(5));
    }
    let alive = store.inner.sweeper.get().unwrap().alive.clone();
    let copy = store.clone();
    drop(store);
    assert!(alive.upgrade().is_some(), "a clone keeps the thread");
    drop(copy);
    while alive.upgrade().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the thread outlived its store"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
