//! The local block cache: a subject the store denied is answered locally until its
//! retry time, without a store call.
//!
//! Exact, not a heuristic: the store said the request would not be admitted before
//! `retry_after`, so nothing the cache blocks could have been admitted sooner. It
//! answers by the rule of a [`KeptDenial`] (only the cost that was denied, until its
//! retry time) and forgets a subject as soon as the store admits one of its requests.

use std::sync::{Mutex, MutexGuard, PoisonError};

use dashmap::DashMap;

use super::kept::KeptDenial;
use crate::decision::{Decision, Origin};
use crate::subject::Subject;

/// How many slots a full cache looks at, from the clock hand, for an expired block to
/// replace.
const PROBES: usize = 4;

/// Denied subjects and until when, bounded in entries.
///
/// Eviction is a clock over a ring of slots, one per entry: each block owns a slot,
/// freed slots (forgotten or expired blocks) are reused first, and when every slot is
/// taken the hand looks at the next few and replaces the first expired block; if all of
/// those are live, the new denial is not cached (its subject keeps going to the store,
/// which decides exactly) and the hand moves on, so it walks the whole ring over the
/// next inserts. Each insert does a bounded amount of work whatever the size: a flood
/// of distinct denied subjects, the case the cache exists for, never makes an insert
/// scan the cache.
///
/// Lookups read the map alone; everything that adds or removes a block holds the ring's
/// lock, so the map and the ring always agree.
#[derive(Debug)]
pub(crate) struct BlockCache {
    blocked: DashMap<Subject, Blocked>,
    ring: Mutex<Ring>,
    max_entries: usize,
}

#[derive(Debug)]
struct Blocked {
    denial: KeptDenial,
    /// The ring slot that holds this subject.
    slot: usize,
}

#[derive(Debug)]
struct RingSlot {
    subject: Subject,
    until_ms: u64,
}

#[derive(Debug, Default)]
struct Ring {
    /// Each slot's block: its subject and until when (`None`: the slot is on the free
    /// list), so the hand tells an expired block without a map lookup. Grows up to the
    /// cache's size as blocks come, so an idle cache costs nothing.
    slots: Vec<Option<RingSlot>>,
    /// Slots whose block was removed (forgotten or expired), to fill first.
    free: Vec<usize>,
    /// The next slot to look at once every slot is taken.
    hand: usize,
}

impl BlockCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            blocked: DashMap::new(),
            ring: Mutex::new(Ring::default()),
            max_entries: max_entries.max(1),
        }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // The ring is consistent between statements; a panic elsewhere must not turn
        // every later denial into a panic.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached denial for `subject` at `now_ms`, if it still holds for `cost`.
    pub(crate) fn lookup(&self, subject: &Subject, cost: u64, now_ms: u64) -> Option<Decision> {
        let entry = self.blocked.get(subject)?;
        if entry.denial.is_over(now_ms) {
            drop(entry);
            let mut ring = self.ring();
            if let Some((_, gone)) = self
                .blocked
                .remove_if(subject, |_, b| b.denial.is_over(now_ms))
            {
                ring.release(gone.slot);
            }
            return None;
        }
        entry.denial.answer(cost, now_ms, Origin::BlockCache)
    }

    /// Remembers a denial made at `now_ms`.
    pub(crate) fn insert(&self, subject: Subject, cost: u64, decision: &Decision, now_ms: u64) {
        let Some(denial) = KeptDenial::of(cost, decision, now_ms) else {
            return;
        };
        let mut ring = self.ring();
        if let Some(mut blocked) = self.blocked.get_mut(&subject) {
            // Denied again: the new wait replaces the old, in the same slot.
            let slot = blocked.slot;
            *blocked = Blocked { denial, slot };
            if let Some(Some(held)) = ring.slots.get_mut(slot) {
                held.until_ms = blocked.denial.until_ms();
            }
            return;
        }
        let slot = match ring.free.pop() {
            Some(slot) => slot,
            None if ring.slots.len() < self.max_entries => {
                ring.slots.push(None);
                ring.slots.len() - 1
            }
            None => {
                let Some(slot) = Self::expired_near_hand(&mut ring, now_ms) else {
                    // Full of live blocks: this subject keeps going to the store.
                    return;
                };
                if let Some(evicted) = ring.slots[slot].take() {
                    self.blocked.remove(&evicted.subject);
                }
                slot
            }
        };
        let blocked = Blocked { denial, slot };
        ring.slots[slot] = Some(RingSlot {
            subject: subject.clone(),
            until_ms: blocked.denial.until_ms(),
        });
        self.blocked.insert(subject, blocked);
    }

    /// The first slot of an expired block among the few from the hand on, when all
    /// are taken; the hand moves past the slots it looked at.
    fn expired_near_hand(ring: &mut Ring, now_ms: u64) -> Option<usize> {
        let slots = ring.slots.len();
        let looked = PROBES.min(slots);
        let found = (0..looked).map(|i| (ring.hand + i) % slots).find(|&slot| {
            ring.slots[slot]
                .as_ref()
                .is_none_or(|held| held.until_ms <= now_ms)
        });
        ring.hand = match found {
            Some(slot) => slot + 1,
            None => ring.hand + looked,
        } % slots;
        found
    }

    /// Drops `subject`'s block once its state changed (the store admitted one of its
    /// requests, or it was refunded or reset): the cached retry time may no longer hold.
    pub(crate) fn forget(&self, subject: &Subject) {
        // Most admitted subjects are not blocked: look before taking a lock.
        if self.blocked.contains_key(subject) {
            let mut ring = self.ring();
            if let Some((_, gone)) = self.blocked.remove(subject) {
                ring.release(gone.slot);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.blocked.len()
    }
}

impl Ring {
    /// A block left the map: its slot is free for the next one.
    fn release(&mut self, slot: usize) {
        if let Some(held) = self.slots.get_mut(slot) {
            *held = None;
            self.free.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::store::PolicySet;
    use crate::{MemoryStore, Policy};
    use std::time::Duration;

    /// A denial with a wait of `window` (a fixed window of one, its one spent at 0).
    fn denial(window: Duration) -> Decision {
        let store = MemoryStore::with_clock(FakeClock::new(0));
        let set = PolicySet::new(vec![Policy::fixed_window("p", 1, window).unwrap()]);
        assert!(store.decide(Subject::new("x"), &set, 1).is_allowed());
        let denied = store.decide(Subject::new("x"), &set, 1);
        assert_eq!(denied.retry_after(), Some(window));
        denied
    }

    fn held(cache: &BlockCache, names: &[&str], now_ms: u64) -> Vec<bool> {
        names
            .iter()
            .map(|n| cache.lookup(&Subject::new(*n), 1, now_ms).is_some())
            .collect()
    }

    #[test]
    fn a_full_cache_of_live_blocks_keeps_them_and_caches_no_more() {
        let cache = BlockCache::new(3);
        let long = denial(Duration::from_secs(100));
        for name in ["a", "b", "c", "d"] {
            cache.insert(Subject::new(name), 1, &long, 0);
        }
        assert_eq!(
            held(&cache, &["a", "b", "c", "d"], 1),
            [true, true, true, false]
        );
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_full_cache_replaces_an_expired_block() {
        let cache = BlockCache::new(3);
        let (short, long) = (
            denial(Duration::from_secs(1)),
            denial(Duration::from_secs(100)),
        );
        cache.insert(Subject::new("a"), 1, &long, 0);
        cache.insert(Subject::new("b"), 1, &short, 0);
        cache.insert(Subject::new("c"), 1, &long, 0);
        // "a" is the oldest but still blocked; "b" has expired: it makes room.
        cache.insert(Subject::new("d"), 1, &long, 2_000);
        assert_eq!(held(&cache, &["a", "c", "d"], 2_000), [true, true, true]);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn the_hand_walks_the_ring_to_find_an_expired_block_a_few_slots_at_a_time() {
        let cache = BlockCache::new(2 * PROBES);
        let (short, long) = (
            denial(Duration::from_secs(1)),
            denial(Duration::from_secs(100)),
        );
        for i in 0..2 * PROBES {
            let wait = if i == PROBES + 2 { &short } else { &long };
            cache.insert(Subject::new(format!("s{i}")), 1, wait, 0);
        }
        // The first look sees only live blocks: not cached, the hand moves on.
        cache.insert(Subject::new("x"), 1, &long, 2_000);
        assert_eq!(held(&cache, &["x"], 2_000), [false]);
        assert_eq!(cache.ring().hand, PROBES);
        // The next look reaches the expired one.
        cache.insert(Subject::new("y"), 1, &long, 2_000);
        assert_eq!(held(&cache, &["y"], 2_000), [true]);
        let expired = format!("s{}", PROBES + 2);
        assert_eq!(held(&cache, &[expired.as_str()], 2_000), [false]);
        assert_eq!(cache.len(), 2 * PROBES);
    }

    #[test]
    fn forgotten_and_expired_blocks_free_their_slot_for_the_next() {
        let cache = BlockCache::new(3);
        let (short, long) = (
            denial(Duration::from_secs(1)),
            denial(Duration::from_secs(100)),
        );
        cache.insert(Subject::new("a"), 1, &long, 0);
        cache.insert(Subject::new("b"), 1, &long, 0);
        cache.insert(Subject::new("c"), 1, &short, 0);
        cache.forget(&Subject::new("b"));
        assert_eq!(
            held(&cache, &["c"], 1_000),
            [false],
            "expired, dropped on lookup"
        );
        // Two free slots: no live block is evicted to make room.
        cache.insert(Subject::new("d"), 1, &long, 1_000);
        cache.insert(Subject::new("e"), 1, &long, 1_000);
        assert_eq!(held(&cache, &["a", "d", "e"], 1_000), [true, true, true]);
        // Denied again: the same slot, a new wait, nothing evicted.
        cache.insert(Subject::new("a"), 1, &short, 1_000);
        assert_eq!(held(&cache, &["a", "d", "e"], 1_500), [true, true, true]);
        assert_eq!(cache.len(), 3);
        assert!(cache.ring().free.is_empty());
    }

    #[test]
    fn a_flood_of_distinct_subjects_stays_bounded_and_keeps_the_blocks_it_has() {
        let cache = BlockCache::new(100);
        let long = denial(Duration::from_secs(100));
        for i in 0..10_000 {
            cache.insert(Subject::new(format!("s{i}")), 1, &long, 0);
            assert!(cache.len() <= 100);
        }
        assert_eq!(cache.len(), 100);
        assert_eq!(cache.ring().slots.len(), 100);
        let held_from = |range: std::ops::Range<usize>, now_ms| {
            range.into_iter().all(|i| {
                cache
                    .lookup(&Subject::new(format!("s{i}")), 1, now_ms)
                    .is_some()
            })
        };
        assert!(
            held_from(0..100, 1),
            "live blocks are not pushed out by newer ones"
        );
        // Once they expire, the flood's next denials take their place.
        for i in 10_000..10_100 {
            cache.insert(Subject::new(format!("s{i}")), 1, &long, 100_000);
        }
        assert!(held_from(10_000..10_100, 100_000));
        assert_eq!(cache.len(), 100);
    }
}
