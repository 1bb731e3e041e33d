//! The in-process store: the reference algorithms in a sharded concurrent map.
//!
//! ```
//! use redlimit::{clock::FakeClock, Limiter, MemoryStore, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = FakeClock::new(0);
//! let limiter = Limiter::new(
//!     MemoryStore::with_clock(clock.clone()),
//!     Policy::fixed_window("jobs", 2, Duration::from_secs(1))?,
//! );
//! assert!(limiter.check("queue-a", 1).await?.is_allowed());
//! assert!(limiter.check("queue-a", 1).await?.is_allowed());
//! assert!(!limiter.check("queue-a", 1).await?.is_allowed());
//! clock.advance(Duration::from_secs(1));
//! assert!(limiter.check("queue-a", 1).await?.is_allowed());
//! # Ok(()) }
//! ```

use std::borrow::Borrow;
use std::collections::HashMap;
use std::future::{ready, Ready};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use super::{
    AdminStore, CheckNow, Fnv1a, GiveBack, GiveBackFuture, Grant, LeaseAsk, LeaseFuture,
    LeaseStore, Operation, PolicySet, Store, StoreError,
};
use crate::algorithm::{self, State};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::subject::Subject;

/// How many shards the map has: the unit of locking and of sweeping. Many small shards
/// keep each sweep slice short (a million subjects are about 1,000 per shard) and make
/// it unlikely that a decision meets the one shard being swept.
const SHARDS: usize = 1024;

/// How many times per pass the background sweeper wakes, sweeping the slices due each
/// time. Each wake takes a core from whatever ran there (a decision, on a busy machine):
/// a few dozen a second keep those rare, yet each short (a few shards).
const WAKES_PER_PASS: u64 = 50;

/// Limit state in this process's memory.
///
/// Sharded (no global lock); each subject's shard is locked only while one decision
/// runs on it. Entries whose state has decayed to "unused" are swept, and shards shrink
/// back when they have emptied, so a flood of one-off subjects costs memory only for
/// about one window.
///
/// # Housekeeping, off the request path
///
/// Sweeping goes one shard at a time: a pass over the whole map is spread evenly over
/// the sweep interval (one second by default), so no decision ever waits for more than
/// one shard's sweep, and decisions on other shards do not wait at all.
///
/// - [`MemoryStore::new`] (a real clock) sweeps in a background thread the store owns:
///   memory comes back without traffic, and decisions do no housekeeping at all. The
///   thread holds only a weak reference and stops when the last clone is dropped; it
///   needs no async runtime.
/// - [`MemoryStore::with_clock`] sweeps on calls instead: a call that finds a slice due
///   sweeps that one shard. A [`FakeClock`](crate::clock::FakeClock) only moves when a
///   test moves it, so a thread woken by wall time would sweep at moments the test does
///   not choose; on calls, the same test always sweeps the same entries. A store on a
///   real clock can opt into the thread with [`MemoryStore::sweep_in_background`].
/// - [`MemoryStore::sweep`] reclaims everything expired at once, for whoever wants it.
///
/// Cloning is cheap and shares the state.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    /// Keyed per store: subjects come from clients, so their hashes must not be
    /// predictable (one hash per decision picks the shard and the slot in it).
    hasher: ShortKeyHasher,
    clock: Arc<dyn Clock>,
    sweep_every_ms: AtomicU64,
    /// When the next slice is due, read by every call that sweeps; the schedule itself
    /// is behind a lock only sweepers take.
    next_slice_ms: AtomicU64,
    schedule: Mutex<Schedule>,
    /// Set once a background thread sweeps: calls then leave housekeeping alone.
    swept_in_background: AtomicBool,
    sweeper: OnceLock<Sweeper>,
    /// The lease generations of subjects that leased ([`Grant::epoch`]), apart from
    /// the states so that checks never pay for them.
    epochs: Mutex<Epochs>,
}

/// One policy set's subjects: each one's generation and when it expires (ms).
type SubjectEpochs = HashMap<Box<[u8]>, (u64, u64)>;

/// Per policy set (fingerprint) and subject: the generation and when it expires (ms),
/// with the states it was made with. Generations are unique per store.
#[derive(Debug, Default)]
struct Epochs {
    map: HashMap<u64, SubjectEpochs>,
    last: u64,
    /// Entries when expired ones were last dropped: they are dropped again once the
    /// map has doubled since.
    pruned_at_len: usize,
}

impl Epochs {
    /// The generation of `subject` under `set` at `now`, if it has one.
    fn get(&self, set: u64, subject: &[u8], now: u64) -> Option<u64> {
        let &(epoch, expires) = self.map.get(&set)?.get(subject)?;
        (now < expires).then_some(epoch)
    }

    /// The generation of `subject` under `set`, made if it has none, kept until
    /// `expires`.
    fn keep(&mut self, set: u64, subject: &[u8], now: u64, expires: u64) -> u64 {
        let epoch = match self.get(set, subject, now) {
            Some(epoch) => epoch,
            None => {
                self.last += 1;
                self.last
            }
        };
        let subjects = self.map.entry(set).or_default();
        match subjects.get_mut(subject) {
            Some(slot) => *slot = (epoch, expires.max(slot.1)),
            None => {
                subjects.insert(subject.into(), (epoch, expires));
            }
        }
        let len: usize = self.map.values().map(HashMap::len).sum();
        if len > 2 * self.pruned_at_len + 1_024 {
            for subjects in self.map.values_mut() {
                subjects.retain(|_, &mut (_, expires)| now < expires);
            }
            self.map.retain(|_, subjects| !subjects.is_empty());
            self.pruned_at_len = self.map.values().map(HashMap::len).sum();
        }
        epoch
    }

    fn forget(&mut self, set: u64, subject: &[u8]) {
        if let Some(subjects) = self.map.get_mut(&set) {
            subjects.remove(subject);
        }
    }
}

/// The background sweeping thread, to wake it (a new interval, or the store dropped).
#[derive(Debug)]
struct Sweeper {
    thread: std::thread::Thread,
    /// Dropped when the thread has ended (only the tests look).
    #[cfg_attr(not(test), allow(dead_code))]
    alive: Weak<()>,
}

/// One lock's worth of the map, on its own cache line (two threads working on
/// neighbouring shards do not slow each other).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard(Mutex<HashMap<Key, Entry, BuildHasherDefault<KnownHash>>>);

type ShardMap = HashMap<Key, Entry, BuildHasherDefault<KnownHash>>;

impl Shard {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, ShardMap> {
        // A panic under the lock leaves at worst one subject's state half-updated;
        // never refuse every later decision for it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A subject under one policy set, as the map keeps it: 40 bytes, with the hash
/// computed once per decision.
#[derive(Debug)]
struct Key {
    hash: u64,
    set: u64,
    subject: KeyBytes,
}

/// How many bytes of a subject the key holds in place: an IPv4 or short IPv6 subject,
/// a user id, a hashed secret (17 bytes). Longer ones go to the heap, once per entry.
const INLINE_SUBJECT: usize = 22;

/// A subject's bytes in the key, inline when short (a `Subject` takes 48 bytes; a
/// smaller entry keeps more of the map in cache).
#[derive(Debug)]
enum KeyBytes {
    Inline {
        len: u8,
        bytes: [u8; INLINE_SUBJECT],
    },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    fn new(subject: &[u8]) -> Self {
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
    fn as_slice(&self) -> &[u8] {
        match self {
            KeyBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBytes::Heap(bytes) => bytes,
        }
    }
}

/// What a lookup compares: a stored [`Key`], or a [`Probe`] borrowing the caller's
/// subject (a lookup never copies the subject, nor allocates for a long one).
trait KeyParts {
    fn parts(&self) -> (u64, u64, &[u8]);
}

impl KeyParts for Key {
    #[inline]
    fn parts(&self) -> (u64, u64, &[u8]) {
        (self.hash, self.set, self.subject.as_slice())
    }
}

/// A lookup's key: the hash, the policy set and the subject's bytes, borrowed.
struct Probe<'a> {
    hash: u64,
    set: u64,
    subject: &'a [u8],
}

impl KeyParts for Probe<'_> {
    #[inline]
    fn parts(&self) -> (u64, u64, &[u8]) {
        (self.hash, self.set, self.subject)
    }
}

impl Probe<'_> {
    fn key(&self) -> Key {
        Key {
            hash: self.hash,
            set: self.set,
            subject: KeyBytes::new(self.subject),
        }
    }

    fn as_parts(&self) -> &(dyn KeyParts + '_) {
        self
    }
}

impl<'a> Borrow<dyn KeyParts + 'a> for Key {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl PartialEq for dyn KeyParts + '_ {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        let ((hash, set, subject), (other_hash, other_set, other_subject)) =
            (self.parts(), other.parts());
        hash == other_hash && set == other_set && same_bytes(subject, other_subject)
    }
}

impl Eq for dyn KeyParts + '_ {}

impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.parts().0);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        <dyn KeyParts>::eq(self, other)
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Byte equality, by two overlapping word reads for the short strings subjects mostly
/// are (no call to `memcmp`).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
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

/// The shard's map reuses the key's hash instead of hashing the subject again.
#[derive(Debug, Default)]
struct KnownHash(u64);

impl Hasher for KnownHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; anything else still hashes (FNV-1a).
        let mut fnv = Fnv1a(self.0);
        fnv.write(bytes);
        self.0 = fnv.0;
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug)]
struct Entry {
    states: States,
    expires_at_ms: u64,
}

/// One state per policy of the set: in place for one policy (the common case, 32
/// bytes), else a boxed slice made when the entry is (re)made.
#[derive(Debug)]
enum States {
    One(Option<State>),
    Many(Box<[Option<State>]>),
}

impl States {
    #[inline]
    fn as_mut_slice(&mut self) -> &mut [Option<State>] {
        match self {
            States::One(state) => std::slice::from_mut(state),
            States::Many(states) => states,
        }
    }

    fn as_slice(&self) -> &[Option<State>] {
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
    fn keep(&mut self, now: u64, keep: Option<u64>) {
        if let Some(keep) = keep {
            self.expires_at_ms = self.expires_at_ms.max(now.saturating_add(keep));
        }
    }
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
struct ShortKeyHasher {
    state: foldhash::fast::RandomState,
}

impl ShortKeyHasher {
    fn new() -> Self {
        Self {
            state: foldhash::fast::RandomState::default(),
        }
    }

    /// The hash of `bytes` under the policy set `set` (its fingerprint).
    #[inline]
    fn hash(&self, set: u64, bytes: &[u8]) -> u64 {
        let mut hasher = self.state.build_hasher();
        hasher.write_u64(set);
        // foldhash mixes the length into a byte string's hash itself.
        hasher.write(bytes);
        hasher.finish()
    }
}

/// Eight little-endian bytes of `bytes` from `at` (the caller knows they are there).
#[inline]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(buf)
}

/// Where the sweep is in its pass over the shards.
#[derive(Debug)]
struct Schedule {
    pass_start_ms: u64,
    next_shard: usize,
    /// Entries left in the shards swept so far in this pass.
    left_in_pass: usize,
}

impl Schedule {
    /// When the next shard's turn comes: the pass's slices spread evenly over `every`.
    fn due_ms(&self, every_ms: u64) -> u64 {
        let offset = u128::from(every_ms) * (self.next_shard as u128 + 1) / SHARDS as u128;
        self.pass_start_ms
            .saturating_add(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    /// One more shard swept at `now_ms`, with `left` entries still in it; `is_empty`
    /// tells, at the end of a pass that left nothing, whether the store is still empty
    /// (shards swept early in the pass may have filled since).
    fn advance(
        &mut self,
        left: usize,
        now_ms: u64,
        every_ms: u64,
        is_empty: impl FnOnce() -> bool,
    ) {
        self.left_in_pass += left;
        self.next_shard += 1;
        if self.next_shard == SHARDS {
            // A pass ends; the next follows on, but never more than one pass behind:
            // after a long gap (no calls, a starved thread, a clock moved forward) one
            // whole pass is due at once, and no more. A pass that found the store empty
            // waits an interval more: an idle store costs nothing.
            self.pass_start_ms = if self.left_in_pass == 0 && is_empty() {
                now_ms.saturating_add(every_ms)
            } else {
                self.pass_start_ms
                    .saturating_add(every_ms)
                    .max(now_ms.saturating_sub(every_ms))
            };
            self.next_shard = 0;
            self.left_in_pass = 0;
        }
    }
}

impl MemoryStore {
    /// A memory store on the monotonic clock, swept by a background thread.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new()).sweep_in_background()
    }

    /// A memory store reading time from `clock` (a [`FakeClock`](crate::clock::FakeClock)
    /// in tests), swept one shard at a time by the calls that find a slice due.
    pub fn with_clock(clock: impl Clock) -> Self {
        let now = clock.now_ms();
        let schedule = Schedule {
            pass_start_ms: now,
            next_shard: 0,
            left_in_pass: 0,
        };
        let every_ms = 1_000;
        Self {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
                hasher: ShortKeyHasher::new(),
                clock: Arc::new(clock),
                sweep_every_ms: AtomicU64::new(every_ms),
                next_slice_ms: AtomicU64::new(schedule.due_ms(every_ms)),
                schedule: Mutex::new(schedule),
                swept_in_background: AtomicBool::new(false),
                sweeper: OnceLock::new(),
                epochs: Mutex::default(),
            }),
        }
    }

    /// Sets how long a pass over every entry takes (default one second): each expired
    /// entry is gone within about this long after it expired.
    pub fn sweep_every(self, every: Duration) -> Self {
        let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        let inner = &*self.inner;
        inner.sweep_every_ms.store(every_ms, Ordering::Relaxed);
        let schedule = inner.lock_schedule();
        inner
            .next_slice_ms
            .store(schedule.due_ms(every_ms), Ordering::Relaxed);
        drop(schedule);
        if let Some(sweeper) = inner.sweeper.get() {
            sweeper.thread.unpark();
        }
        self
    }

    /// Sweeps in a background thread of the store's own, so that memory comes back
    /// without traffic and no decision does housekeeping (what [`MemoryStore::new`]
    /// does). Use it with a real clock only: the thread sleeps in wall time.
    ///
    /// If the thread cannot be started, calls go on sweeping, one shard each.
    pub fn sweep_in_background(self) -> Self {
        if self.inner.sweeper.get().is_some() {
            return self;
        }
        let store = Arc::downgrade(&self.inner);
        let alive = Arc::new(());
        let token = Arc::downgrade(&alive);
        let spawned = std::thread::Builder::new()
            .name("redlimit-sweep".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let _alive = alive;
                sweep_until_dropped(&store);
            });
        if let Ok(handle) = spawned {
            let sweeper = Sweeper {
                thread: handle.thread().clone(),
                alive: token,
            };
            if self.inner.sweeper.set(sweeper).is_ok() {
                self.inner
                    .swept_in_background
                    .store(true, Ordering::Relaxed);
            }
        }
        self
    }

    /// How many subjects (per policy set) hold state now, expired or not.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no subject holds state.
    pub fn is_empty(&self) -> bool {
        self.inner.shards.iter().all(|s| s.lock().is_empty())
    }

    /// Drops every entry whose state has decayed, and gives memory back: the whole
    /// map now, one shard locked at a time.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_ms();
        for index in 0..SHARDS {
            self.inner.sweep_shard(index, now);
        }
    }

    /// A check: the request path, kept short (one clock read, one hash, one lock, and
    /// for one policy no collection of steps or outcomes). Inlined into the caller, so
    /// the decision is built where it is wanted rather than copied out.
    #[inline]
    pub(crate) fn decide(&self, subject: Subject, set: &PolicySet, cost: u64) -> Decision {
        let inner = &*self.inner;
        let now = inner.now_and_sweep();
        let policies = set.policies();
        let probe = inner.probe(set, subject.as_bytes());
        let mut shard = inner.shard(probe.hash).lock();
        // A lookup by reference; the key is made only for a new entry.
        let entry = match shard.get_mut(probe.as_parts()) {
            Some(entry) => entry,
            None => shard.entry(probe.key()).or_insert_with(Entry::fresh),
        };
        entry.renew(policies.len(), now);
        if let ([policy], [state]) = (&policies[..], entry.states.as_mut_slice()) {
            let (outcome, keep) = algorithm::decide_one(policy, state, now, cost);
            entry.keep(now, keep);
            drop(shard);
            return Decision::from_outcome(policies, outcome);
        }
        let decision = decide_many(entry, policies, now, cost);
        drop(shard);
        decision
    }

    /// Every operation on one entry, under its shard's lock: the model's steps, then
    /// what the operation keeps of them.
    pub(crate) fn run_op(
        &self,
        op: Operation,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        if op == Operation::Check {
            return self.decide(subject, set, cost);
        }
        let inner = &*self.inner;
        let now = inner.now_and_sweep();
        let policies = set.policies();
        let probe = inner.probe(set, subject.as_bytes());
        let mut shard = inner.shard(probe.hash).lock();
        if op == Operation::Reset {
            shard.remove(probe.as_parts());
            lock_epochs(inner).forget(set.fingerprint(), subject.as_bytes());
        }
        // Only a check creates an entry.
        let Some(entry) = shard.get_mut(probe.as_parts()) else {
            drop(shard);
            let states: SmallVec<[Option<State>; 1]> = SmallVec::from_elem(None, policies.len());
            return peek(policies, &states, now, cost);
        };
        entry.renew(policies.len(), now);
        if op == Operation::Refund {
            for (policy, state) in policies.iter().zip(entry.states.as_mut_slice()) {
                if let Some(next) = algorithm::refund(policy, state.as_ref(), now, cost) {
                    *state = Some(next);
                }
            }
        }
        // A peek, or what a check would now make of the refunded state.
        peek(policies, entry.states.as_slice(), now, cost)
    }
}

impl MemoryStore {
    /// A leasing check on one entry, under its shard's lock (the model of the Redis
    /// store's; see [`crate::lease`]).
    pub(crate) fn decide_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> (Decision, Grant) {
        let inner = &*self.inner;
        let now = inner.now_and_sweep();
        let policies = set.policies();
        let probe = inner.probe(set, subject.as_bytes());
        let mut shard = inner.shard(probe.hash).lock();
        let entry = match shard.get_mut(probe.as_parts()) {
            Some(entry) => entry,
            None => shard.entry(probe.key()).or_insert_with(Entry::fresh),
        };
        entry.renew(policies.len(), now);
        let (outcomes, keep, grant) = algorithm::decide_leasing(
            policies,
            entry.states.as_mut_slice(),
            now,
            cost,
            ask.want,
            ask.batch,
        );
        entry.keep(now, keep);
        let expires = entry.expires_at_ms;
        drop(shard);
        let mut grant = grant;
        if grant.units > 0 {
            let subject = subject.as_bytes();
            grant.epoch = lock_epochs(inner).keep(set.fingerprint(), subject, now, expires);
        }
        (Decision::from_outcomes(policies, outcomes), grant)
    }
}

/// The lease generations' lock; a panic elsewhere while it was held leaves plain data.
fn lock_epochs(inner: &Inner) -> MutexGuard<'_, Epochs> {
    inner
        .epochs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A check of several policies on the entry `decide` found and renewed, all or nothing
/// (out of line: the one-policy path stays small enough to inline).
#[inline(never)]
fn decide_many(entry: &mut Entry, policies: &Arc<[Policy]>, now: u64, cost: u64) -> Decision {
    let (outcomes, keep) = algorithm::decide_all(policies, entry.states.as_mut_slice(), now, cost);
    entry.keep(now, keep);
    Decision::from_outcomes(policies, outcomes)
}

/// The background sweeper's life: every slice that is due, then sleep until the next
/// one; ends once the store is gone (its last clone dropped wakes the thread).
fn sweep_until_dropped(store: &Weak<Inner>) {
    while let Some(inner) = store.upgrade() {
        let wait = inner.sweep_due_slices(inner.clock.now_ms());
        // Not holding the store while asleep: dropping it must be able to end it.
        drop(inner);
        std::thread::park_timeout(wait);
    }
}

/// The decision a check would make on `states`, changing nothing.
fn peek(policies: &Arc<[Policy]>, states: &[Option<State>], now: u64, cost: u64) -> Decision {
    let outcomes = policies
        .iter()
        .zip(states)
        .map(|(policy, state)| algorithm::decide(policy, state.as_ref(), now, cost).outcome);
    Decision::from_outcomes(policies, outcomes)
}

impl Inner {
    /// The time of a call, after sweeping the next shard if a call must and its turn
    /// has come (one relaxed load when not).
    #[inline]
    fn now_and_sweep(&self) -> u64 {
        let now = self.clock.now_ms();
        if !self.swept_in_background.load(Ordering::Relaxed)
            && now >= self.next_slice_ms.load(Ordering::Relaxed)
        {
            self.sweep_next_slice(now);
        }
        now
    }

    #[inline]
    fn probe<'a>(&self, set: &PolicySet, subject: &'a [u8]) -> Probe<'a> {
        Probe {
            hash: self.hasher.hash(set.fingerprint(), subject),
            set: set.fingerprint(),
            subject,
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard {
        // Bits the shard's own table does not lean on (it uses the lowest for the slot
        // and the top seven as a tag).
        &self.shards[(hash >> 32) as usize % SHARDS]
    }

    fn lock_schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sweeps the next shard if its turn has come at `now`; false when none was due,
    /// or another caller is sweeping (a call never waits for housekeeping).
    fn sweep_next_slice(&self, now: u64) -> bool {
        if now < self.next_slice_ms.load(Ordering::Relaxed) {
            return false;
        }
        let mut schedule = match self.schedule.try_lock() {
            Ok(schedule) => schedule,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let every_ms = self.sweep_every_ms.load(Ordering::Relaxed);
        if now < schedule.due_ms(every_ms) {
            return false;
        }
        let left = self.sweep_shard(schedule.next_shard, now);
        schedule.advance(left, now, every_ms, || {
            self.shards.iter().all(|s| s.lock().is_empty())
        });
        self.next_slice_ms
            .store(schedule.due_ms(every_ms), Ordering::Relaxed);
        true
    }

    /// The background sweeper's step: every slice due at `now`, one shard locked at a
    /// time; returns how long to sleep before the next step.
    fn sweep_due_slices(&self, now: u64) -> Duration {
        // Bounded: at most the rest of this pass and one whole pass are due.
        while self.sweep_next_slice(now) {}
        let next = self.next_slice_ms.load(Ordering::Relaxed);
        let every_ms = self.sweep_every_ms.load(Ordering::Relaxed);
        let wait_ms = next
            .saturating_sub(now)
            .max(every_ms / WAKES_PER_PASS)
            .clamp(1, 60_000);
        Duration::from_millis(wait_ms)
    }

    /// Drops one shard's expired entries and gives its memory back; returns how many
    /// entries are left in it.
    fn sweep_shard(&self, index: usize, now: u64) -> usize {
        let mut map = self.shards[index].lock();
        map.retain(|_, entry| entry.expires_at_ms > now);
        if map.capacity() > 4 * map.len() + 16 || (map.is_empty() && map.capacity() > 0) {
            map.shrink_to_fit();
        }
        map.len()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.get() {
            sweeper.thread.unpark();
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Store for MemoryStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        ready(Ok(self.decide(subject, set, cost)))
    }

    #[inline]
    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        CheckNow::Decided(Ok(self.decide(subject, set, cost)))
    }
}

impl AdminStore for MemoryStore {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        ready(Ok(self.run_op(op, subject, set, cost)))
    }
}

/// Leases from one process's memory gain nothing over its checks; the memory store
/// leases as the model of the Redis store's leasing check, for tests that run leases
/// on a fake clock and compare the two.
impl LeaseStore for MemoryStore {
    fn check_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> LeaseFuture {
        Box::pin(ready(Ok(self.decide_leasing(subject, set, cost, ask))))
    }

    fn give_back(&self, subject: Subject, set: &PolicySet, back: GiveBack) -> GiveBackFuture {
        let now = self.inner.clock.now_ms();
        let epoch = lock_epochs(&self.inner).get(set.fingerprint(), subject.as_bytes(), now);
        let op = if now < back.before_ms && epoch == Some(back.epoch) {
            Operation::Refund
        } else {
            Operation::Peek
        };
        Box::pin(ready(Ok(self.run_op(op, subject, set, back.units))))
    }

    fn lease_clock(&self) -> Option<Arc<dyn Clock>> {
        Some(Arc::clone(&self.inner.clock))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;

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
            store.inner.shards.iter().all(|s| s.lock().capacity() == 0),
            "emptied shards give their memory back"
        );
        // A pass that found the store empty waits an interval more before the next.
        assert!(wait >= Duration::from_secs(1), "{wait:?}");
    }

    #[test]
    fn the_explicit_sweep_reclaims_everything_expired_at_once() {
        let clock = FakeClock::new(0);
        let store =
            MemoryStore::with_clock(clock.clone()).sweep_every(Duration::from_secs(1 << 30));
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
}
