//! What a store does for a limiter: the interface the memory and Redis stores share,
//! private to the crate (the public face is the sealed [`Store`](crate::store::Store)).

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::policy::{Policy, Unit};
use crate::subject::Subject;

/// The policies one [`Limiter`](crate::Limiter) checks together, with a fingerprint
/// that tells policy sets apart inside a shared store.
///
/// State is only ever read by the policy set that wrote it: the memory store keys its
/// entries by the fingerprint, and every Redis key of the set carries
/// [`key_tag`](PolicySet::key_tag), the fingerprint in hex. A policy whose window,
/// algorithm, unit or scope (a calendar quota's zone, period or anchor day) changed
/// under the same name, or a set that gained or lost
/// a policy, therefore starts fresh counting instead of reading numbers it would
/// misread (a rolling deploy costs at most one window of fresh counting). The limit
/// is not part of it, nor the shadow flag: every algorithm's state means the same
/// under another limit (a token bucket's identity is its emission interval), so a
/// limit raised or lowered, by a deploy or live ([`crate::Limiter::set_limit`]),
/// keeps the count, and switching a policy between shadow and enforced keeps its
/// state.
#[derive(Debug, Clone)]
pub struct PolicySet {
    policies: Arc<[Policy]>,
    fingerprint: u64,
    key_tag: Box<str>,
    max_cost: u64,
    /// The named scopes the policies count, in the order first named: a check's
    /// subject must carry each (empty: the set counts the key and global alone).
    scopes: Arc<[Arc<str>]>,
    /// Whether some policy counts another subject than the key (named or global):
    /// the stores then keep a counter per scope and subject.
    scoped: bool,
    /// The in-flight policies, and where each stands in `policies`: what a holder's
    /// release or renewal changes and answers for (empty: none).
    held: Arc<[Policy]>,
    held_at: Arc<[usize]>,
}

/// Hex digits of the fingerprint in Redis keys: 48 bits, so two sets of one
/// deployment that share a prefix and their policies' names collide with odds of
/// about 2^-48 per pair, for 13 bytes a key.
const KEY_TAG_DIGITS: usize = 12;

impl PolicySet {
    /// The set of `policies`, its in-flight ones held by a new holder: every set made
    /// is an instance of its own, and its clones share its slots.
    pub(crate) fn new(policies: Vec<Policy>) -> Self {
        let holder = new_holder();
        let policies: Vec<Policy> = policies.into_iter().map(|p| p.held_by(holder)).collect();
        // FNV-1a over an explicit byte layout: the same in every process, release
        // and architecture (a derived `Hash` writes integers in native byte order).
        let mut h = Fnv1a::new();
        h.write(STATE_LAYOUT);
        for policy in &policies {
            h.write(policy.name().as_bytes());
            h.write(&[0xff]);
            h.write(policy.algorithm().as_str().as_bytes());
            h.write(&policy.state_window().to_le_bytes());
            // What a policy counts, and whose: written only when not the default, so
            // a set of defaults keeps one fingerprint whatever is added here later.
            if policy.unit() != Unit::Cost {
                h.write(b"\xfeunit=requests");
            }
            if !policy.scope().is_key() {
                h.write(b"\xfescope=");
                h.write(policy.scope().to_string().as_bytes());
                h.write(&[0xff]);
            }
            // A calendar quota's periods: its zone, period and anchor day (nothing
            // for the other policies, whose fingerprints stay as they were).
            if let Some((zone, period, anchor)) = policy.calendar_key() {
                h.write(&[0xfe]);
                h.write(zone.as_bytes());
                h.write(&[0xff]);
                h.write(period.as_bytes());
                h.write(&[anchor]);
            }
        }
        let fingerprint = h.finish();
        let mut scopes: Vec<Arc<str>> = Vec::new();
        for name in policies.iter().filter_map(|p| p.scope().name()) {
            if !scopes.iter().any(|s| &**s == name) {
                scopes.push(name.into());
            }
        }
        let scoped = policies.iter().any(|p| !p.scope().is_key());
        let (held, held_at) = held_of(&policies);
        Self {
            max_cost: max_cost(&policies),
            policies: policies.into(),
            fingerprint,
            key_tag: format!("{:012x}", fingerprint >> (64 - 4 * KEY_TAG_DIGITS)).into(),
            scopes: scopes.into(),
            scoped,
            held,
            held_at,
        }
    }

    /// This set with some limits replaced (live overrides: `(policy index, limit)`),
    /// keeping its fingerprint and key tag, so the same states are read under the new
    /// limits. An index past the policies, or a limit a policy cannot compute exactly,
    /// is skipped.
    pub(crate) fn with_limits(&self, limits: &[(usize, u64)]) -> Self {
        let mut policies = self.policies.to_vec();
        for &(i, limit) in limits {
            if let Some(changed) = policies.get(i).and_then(|p| p.with_limit(limit)) {
                policies[i] = changed;
            }
        }
        let (held, held_at) = held_of(&policies);
        Self {
            max_cost: max_cost(&policies),
            policies: policies.into(),
            fingerprint: self.fingerprint,
            key_tag: self.key_tag.clone(),
            scopes: Arc::clone(&self.scopes),
            scoped: self.scoped,
            held,
            held_at,
        }
    }

    /// The in-flight policies, what a holder's release or renewal changes and answers
    /// for, and where each stands among [`PolicySet::policies`].
    pub(crate) fn held(&self) -> (&Arc<[Policy]>, &[usize]) {
        (&self.held, &self.held_at)
    }

    /// The named scopes a check's subject must carry, in the order first named.
    pub fn scopes(&self) -> &[Arc<str>] {
        &self.scopes
    }

    /// Whether some policy counts another subject than the request's key.
    #[inline]
    pub fn is_scoped(&self) -> bool {
        self.scoped
    }

    /// The scope whose subject gives a scoped set's Redis keys their hash tag, so a
    /// check's keys share one cluster slot: the last named scope (policies are added
    /// from the narrowest subject to the broadest: key, team, org), else the key.
    pub fn tag_scope(&self) -> Option<&str> {
        self.scopes.last().map(|s| &**s)
    }

    /// The subject bytes of `policy`'s counter in a check of `subject` (narrowed to
    /// this set's scopes: each is there).
    pub(crate) fn part_of<'s>(&self, policy: &Policy, subject: &'s Subject) -> &'s [u8] {
        if policy.scope().is_global() {
            return crate::subject::GLOBAL;
        }
        match policy.scope().name() {
            Some(name) => subject.scope_part(name).unwrap_or(&[]),
            None => subject.key_part(),
        }
    }

    /// The policies, in the order they were added.
    pub fn policies(&self) -> &Arc<[Policy]> {
        &self.policies
    }

    /// A stable hash of the policies' names, algorithms and numbers, in order.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The fingerprint as it appears in Redis keys: 12 hex digits.
    pub fn key_tag(&self) -> &str {
        &self.key_tag
    }

    /// The largest cost every policy could admit (0 when there are none).
    pub fn max_cost(&self) -> u64 {
        self.max_cost
    }
}

/// The in-flight policies of `policies`, and their places.
fn held_of(policies: &[Policy]) -> (Arc<[Policy]>, Arc<[usize]>) {
    let at: Vec<usize> = (0..policies.len())
        .filter(|&i| policies[i].is_in_flight())
        .collect();
    let held = at.iter().map(|&i| policies[i].clone()).collect();
    (held, at.into())
}

/// The largest cost every policy of `policies` could admit (0 when there are none);
/// one counting requests takes any.
fn max_cost(policies: &[Policy]) -> u64 {
    policies.iter().map(Policy::max_cost).min().unwrap_or(0)
}

/// A holder id no other set in any process is likely to have: 48 bits (the Redis
/// state keeps each holder's id in 6 bytes, lua/in_flight.lua) from the standard
/// library's randomly keyed hasher, over the time and a count: two live instances'
/// ids meet with odds of about 2^-48 a pair, as two sets' key tags do.
fn new_holder() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static MADE: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(MADE.fetch_add(1, Ordering::Relaxed));
    if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(since.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish() & crate::policy::HOLDER_MASK
}

/// Written first into every fingerprint: the layout of the states the stores keep
/// (here: the Lua's packed states). A release that lays its states out anew
/// changes it, so its instances never read an earlier release's states: each
/// subject starts afresh once, as for a changed policy.
const STATE_LAYOUT: &[u8] = b"redlimit states 2\xff";

/// A place that decides and keeps limit state.
///
/// The future is a named type so the layer's response future needs no box for the
/// memory store. Implementations must be atomic per call: no other call on the same
/// subject and policies may interleave between reading and writing state.
pub trait Backend: Send + Sync + 'static {
    /// The pending decision.
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Decides whether `subject` may spend `cost` under every policy of `set`, and
    /// consumes from all of them only if all admit. `cost` is already validated:
    /// `1 <= cost <= set.max_cost()`.
    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future;

    /// Decides at once if this store can do so without waiting (the memory store
    /// can), as [`Backend::check`] would; otherwise hands the subject back. The default
    /// hands it back.
    ///
    /// A decision made at once lets the layer call the inner service within its own
    /// `call`, with no future to keep: the fast path is the store's word, not a guess
    /// about its future's type.
    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        let _ = (set, cost);
        CheckNow::Later(subject)
    }

    /// Whether one call's keys must share a slot (a Redis Cluster): a global counter
    /// cannot then be decided beside another subject's.
    fn is_cluster(&self) -> bool {
        false
    }
}

/// What [`Backend::check_now`] did.
#[derive(Debug)]
pub enum CheckNow {
    /// Decided (or failed) without waiting.
    Decided(Result<Decision, StoreError>),
    /// This store answers later: [`Backend::check`] takes the subject back.
    Later(Subject),
}

impl<S: Backend> Backend for Arc<S> {
    type Future = S::Future;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        (**self).check(subject, set, cost)
    }

    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        (**self).check_now(subject, set, cost)
    }

    fn is_cluster(&self) -> bool {
        (**self).is_cluster()
    }
}

/// What a store call does to a subject's state. The check and the admin operations go
/// through the same per-algorithm code (the model in memory, the one script in Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Decide and consume (the hot path, [`Backend::check`]).
    Check,
    /// Decide as a check would now, consuming nothing.
    Peek,
    /// Give back `cost` units (see [`Limiter::refund`](crate::Limiter::refund)), then
    /// answer as a peek of `cost` would.
    Refund,
    /// Forget the subject's state for every policy of the set, then answer as a peek
    /// of `cost` would (on fresh state).
    Reset,
    /// Consume `cost` units from every policy of the set (shadow ones too) whatever
    /// the limit, a debt the checks after it see, then answer as a peek of 1 would.
    /// Nothing is denied. `cost` is any number from 1: what a policy may owe is
    /// bounded (`MAX_DEBT` in the algorithms' module), and more is not taken. Made
    /// for settling a request that cost more than it reserved; state is created when
    /// there is none.
    Charge,
    /// In-flight policies only: one of this instance's requests ended, so its entry
    /// counts one fewer; then answer as a peek of 1 of the in-flight policies alone
    /// (the decision is over them: rate policies are neither read nor answered).
    Release,
    /// In-flight policies only: this instance's entry counts `cost` requests (what it
    /// holds, 0 included) for another slot lifetime; then answer as a release does.
    Renew,
}

impl Operation {
    /// Every operation, in declaration order: what the Redis store's contract derives
    /// its letters from.
    #[cfg(feature = "redis")]
    pub(crate) const ALL: [Operation; 7] = [
        Operation::Check,
        Operation::Peek,
        Operation::Refund,
        Operation::Reset,
        Operation::Charge,
        Operation::Release,
        Operation::Renew,
    ];

    /// A short stable name, for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Check => "check",
            Operation::Peek => "peek",
            Operation::Refund => "refund",
            Operation::Reset => "reset",
            Operation::Charge => "charge",
            Operation::Release => "release",
            Operation::Renew => "renew",
        }
    }
}

/// A store that also runs the admin operations (peek, refund, reset, charge).
///
/// Apart from [`Backend`] so that a store written for checks alone (a test double, a
/// wrapper) needs nothing more.
pub trait AdminStore: Backend {
    /// Runs `op` for `subject` under every policy of `set`. `cost` is validated as for
    /// [`Backend::check`], except for [`Operation::Charge`], which takes any cost from
    /// 1; `run(Operation::Check, ..)` is `check`.
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future;
}

impl<S: AdminStore> AdminStore for Arc<S> {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        (**self).run(op, subject, set, cost)
    }
}

/// FNV-1a: a hash that is the same in every process and release.
#[derive(Debug, Clone, Copy)]
struct Fnv1a(u64);

impl Fnv1a {
    const fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}
