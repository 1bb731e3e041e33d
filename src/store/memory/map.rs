//! The map of states: one entry per subject and policy set, in [`SHARDS`] tables each
//! behind its own lock.
//!
//! Each table holds its keys and entries side by side and is searched by a hash the
//! caller computed once (it also picks the shard) and an equality closure over the
//! caller's borrowed subject: a lookup neither copies the subject nor hashes it again,
//! and a key is built only when an entry is made.

use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::hash_table::HashTable;

use crate::algorithm::State;

/// How many shards the map has: the unit of locking and of sweeping. Many small shards
/// keep each sweep slice short (a million subjects are about 1,000 per shard) and make
/// it unlikely that a decision meets the one shard being swept.
pub(super) const SHARDS: usize = 1024;

/// What a shard's table holds: the key beside its entry.
pub(super) type Slot = (Key, Entry);

/// The shards and the keyed hash that spreads subjects over them.
#[derive(Debug)]
pub(super) struct Map {
    pub(super) shards: Box<[Shard]>,
    /// Keyed per store: subjects come from clients, so their hashes must not be
    /// predictable (one hash per decision picks the shard and the slot in it).
    hasher: ShortKeyHasher,
}

impl Map {
    pub(super) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: ShortKeyHasher::new(),
        }
    }

    /// The shard of `subject` under the policy set `set` (its fingerprint), locked,
    /// ready to look its entry up.
    #[inline]
    pub(super) fn lock<'m, 's>(&'m self, set: u64, subject: &'s [u8]) -> Locked<'m, 's> {
        let probe = Probe {
            hash: self.hasher.hash(set, subject),
            set,
            subject,
        };
        // Bits the shard's own table does not lean on (it uses the lowest for the slot
        // and the top seven as a tag).
        let shard = &self.shards[(probe.hash >> 32) as usize % SHARDS];
        Locked {
            table: shard.lock(),
            probe,
        }
    }

    /// How many entries the map holds, expired or not.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.lock().is_empty())
    }

    /// Drops one shard's expired entries and gives its memory back; returns how many
    /// entries are left in it.
    pub(super) fn sweep_shard(&self, index: usize, now: u64) -> usize {
        let Some(shard) = self.shards.get(index) else {
            return 0;
        };
        let mut table = shard.lock();
        table.retain(|(_, entry)| entry.expires_at_ms > now);
        if table.capacity() > 4 * table.len() + 16 || (table.is_empty() && table.capacity() > 0) {
            table.shrink_to_fit(slot_hash);
        }
        table.len()
    }
}

/// The hash a slot was placed by, for the table to move it when it grows or shrinks.
#[inline]
fn slot_hash(slot: &Slot) -> u64 {
    slot.0.hash
}

/// One lock's worth of the map, on its own cache line (two threads working on
/// neighbouring shards do not slow each other).
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct Shard(Mutex<HashTable<Slot>>);

impl Shard {
    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, HashTable<Slot>> {
        // A panic under the lock leaves at worst one subject's state half-updated;
        // never refuse every later decision for it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A subject's shard, locked, and what finds its entry there. Dropping it unlocks.
pub(super) struct Locked<'m, 's> {
    table: MutexGuard<'m, HashTable<Slot>>,
    probe: Probe<'s>,
}

impl Locked<'_, '_> {
    /// The subject's entry, made if it has none, renewed for a decision on `policies`
    /// at `now`: the one way a decision comes to an entry (only a check or a leasing
    /// check makes one).
    #[inline]
    pub(super) fn find_or_insert(&mut self, policies: usize, now: u64) -> &mut Entry {
        let probe = &self.probe;
        // A plain find first, an insert only on a miss: the table's own `entry` would
        // reserve room and track a free slot on every call, hits (nearly all) included.
        let entry = match self
            .table
            .find_entry(probe.hash, |slot| probe.matches(&slot.0))
        {
            Ok(found) => &mut found.into_mut().1,
            Err(absent) => {
                // Expired from the start, so that the renewal below clears it.
                let slot = (probe.key(), Entry::fresh());
                let table = absent.into_table();
                &mut table
                    .insert_unique(probe.hash, slot, slot_hash)
                    .into_mut()
                    .1
            }
        };
        entry.renew(policies, now);
        entry
    }

    /// The subject's entry if it has one, renewed as by
    /// [`find_or_insert`](Self::find_or_insert).
    #[inline]
    pub(super) fn find(&mut self, policies: usize, now: u64) -> Option<&mut Entry> {
        let probe = &self.probe;
        let (_, entry) = self
            .table
            .find_mut(probe.hash, |slot| probe.matches(&slot.0))?;
        entry.renew(policies, now);
        Some(entry)
    }

    /// Forgets the subject's entry.
    pub(super) fn remove(&mut self) {
        let probe = &self.probe;
        if let Ok(found) = self
            .table
            .find_entry(probe.hash, |slot| probe.matches(&slot.0))
        {
            found.remove();
        }
    }
}

/// A subject under one policy set, as the map keeps it: 40 bytes, with the hash
/// computed once per decision. The table keeps no hashes of its own: this one moves the
/// slot when the table grows or shrinks, and is the first thing a lookup compares.
#[derive(Debug)]
pub(super) struct Key {
    hash: u64,
    set: u64,
    subject: KeyBytes,
}

/// A lookup's key: the hash, the policy set and the subject's bytes, borrowed.
struct Probe<'a> {
    hash: u64,
    set: u64,
    subject: &'a [u8],
}

impl Probe<'_> {
    /// Whether `key` is this subject under this set: the hash first, which tells most
    /// keys of a probe sequence apart in one compare.
    #[inline]
    fn matches(&self, key: &Key) -> bool {
        key.hash == self.hash
            && key.set == self.set
            && same_bytes(key.subject.as_slice(), self.subject)
    }

    fn key(&self) -> Key {
        Key {
            hash: self.hash,
            set: self.set,
            subject: KeyBytes::new(self.subject),
        }
    }
}

/// How many bytes of a subject the key holds in place: an IPv4 or short IPv6 subject,
/// a user id, a hashed secret (17 bytes). Longer ones go to the heap, once per entry.
const INLINE_SUBJECT: usize = 22;

/// A subject's bytes in the key, inline when short (a `Subject` takes 48 bytes; a
/// smaller entry keeps more of the map in cache).
#[derive(Debug)]
pub(super) enum KeyBytes {
    Inline {
        len: u8,
        bytes: [u8; INLINE_SUBJECT],
    },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    pub(super) fn new(subject: &[u8]) -> Self {
        match u8::try_from(subject.len()) {
            Ok(len) if subject.len() <= INLINE_SUBJECT => {
                let mut bytes = [0; INLINE_SUBJECT];
                bytes[..subject.len()].copy_from_slice(subject);
                KeyBytes::Inline { len, bytes }
            }
            _ => KeyBytes::Heap(subject.into()),
        }
    }

    #[inline]
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            KeyBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBytes::Heap(bytes) => bytes,
        }
    }
}

/// Byte equality, by two overlapping word reads for the short strings subjects mostly
/// are (no call to `memcmp`).
#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match a.len() {
        8..=16 => {
            let last = a.len() - 8;
            word(a, 0) == word(b, 0) && word(a, last) == word(b, last)
        }
        _ => a == b,
    }
}

/// Eight little-endian bytes of `bytes` from `at` (the caller knows they are there).
#[inline]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(buf)
}

/// The hash of a subject under a policy set: foldhash, seeded at random per store.
///
/// foldhash (the hash hashbrown uses by default) folds 64x64->128-bit products of the
/// input with its seeds, a few multiplications where SipHash takes rounds per 8 bytes.
/// Without the seeds, which never leave the process, a client cannot choose subjects
/// that share a shard or a bucket. It is not a cryptographic hash; an attacker able to
/// observe timing over very many requests is the limit of its promise, as with any fast
/// keyed table hash.
#[derive(Debug)]
pub(super) struct ShortKeyHasher {
    state: foldhash::fast::RandomState,
}

impl ShortKeyHasher {
    pub(super) fn new() -> Self {
        Self {
            state: foldhash::fast::RandomState::default(),
        }
    }

    /// The hash of `bytes` under the policy set `set` (its fingerprint).
    #[inline]
    pub(super) fn hash(&self, set: u64, bytes: &[u8]) -> u64 {
        let mut hasher = self.state.build_hasher();
        hasher.write_u64(set);
        // foldhash mixes the length into a byte string's hash itself.
        hasher.write(bytes);
        hasher.finish()
    }
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) states: States,
    pub(super) expires_at_ms: u64,
}

/// One state per policy of the set: in place for one policy (the common case, 32
/// bytes), else a boxed slice made when the entry is (re)made.
#[derive(Debug)]
pub(super) enum States {
    One(Option<State>),
    Many(Box<[Option<State>]>),
}

impl States {
    #[inline]
    pub(super) fn as_mut_slice(&mut self) -> &mut [Option<State>] {
        match self {
            States::One(state) => std::slice::from_mut(state),
            States::Many(states) => states,
        }
    }

    pub(super) fn as_slice(&self) -> &[Option<State>] {
        match self {
            States::One(state) => std::slice::from_ref(state),
            States::Many(states) => states,
        }
    }

    #[inline]
    fn len(&self) -> usize {
        match self {
            States::One(_) => 1,
            States::Many(states) => states.len(),
        }
    }

    /// `policies` unused states, reusing the box when it has the right length.
    fn clear(&mut self, policies: usize) {
        match self {
            States::One(state) if policies == 1 => *state = None,
            States::Many(states) if states.len() == policies => states.fill(None),
            _ if policies == 1 => *self = States::One(None),
            _ => *self = States::Many(vec![None; policies].into_boxed_slice()),
        }
    }
}

impl Entry {
    fn fresh() -> Self {
        Entry {
            // Expired from the start: the first decision renews it.
            states: States::One(None),
            expires_at_ms: 0,
        }
    }

    /// Forgets decayed state (or state kept for another number of policies) before a
    /// decision reads it.
    #[inline]
    fn renew(&mut self, policies: usize, now: u64) {
        if self.expires_at_ms <= now || self.states.len() != policies {
            self.reset(policies);
        }
    }

    #[cold]
    fn reset(&mut self, policies: usize) {
        self.states.clear(policies);
    }

    /// A commit's state must be kept `keep` ms from `now` (never shortened).
    #[inline]
    pub(super) fn keep(&mut self, now: u64, keep: Option<u64>) {
        if let Some(keep) = keep {
            self.expires_at_ms = self.expires_at_ms.max(now.saturating_add(keep));
        }
    }
}
