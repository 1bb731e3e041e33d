//! Where limit state lives: [`MemoryStore`] for one process, [`RedisStore`] for many.
//! Their modules, [`memory`] and [`redis`], say how each keeps its state: the sharded
//! map and its sweeping, the one connection, the keys, Redis Cluster and failures.
//!
//! A store decides all of a request's policies at once, atomically: if one denies,
//! none consumes. Both stores fold their per-policy outcomes with the same code, so the
//! same trace gives the same [`Decision`] whichever store holds it.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::decision::Decision;
use crate::policy::Policy;
use crate::subject::Subject;

pub mod memory;
pub mod redis;

pub use self::redis::{InvalidPrefix, RedisStore};
pub use memory::MemoryStore;

/// The policies one [`Limiter`](crate::Limiter) checks together, with a fingerprint
/// that tells policy sets apart inside a shared store.
///
/// State is only ever read by the policy set that wrote it: the memory store keys its
/// entries by the fingerprint, and every Redis key of the set carries
/// [`key_tag`](PolicySet::key_tag), the fingerprint in hex. A policy whose window,
/// limit or algorithm changed under the same name, or a set that gained or lost a
/// policy, therefore starts fresh counting instead of reading numbers it would
/// misread (a rolling deploy costs at most one window of fresh counting). The shadow
/// flag is not part of it: switching a policy between shadow and enforced keeps its
/// state.
#[derive(Debug, Clone)]
pub struct PolicySet {
    policies: Arc<[Policy]>,
    fingerprint: u64,
    key_tag: Box<str>,
    max_cost: u64,
}

/// Hex digits of the fingerprint in Redis keys: 48 bits, so two sets of one
/// deployment that share a prefix and their policies' names collide with odds of
/// about 2^-48 per pair, for 13 bytes a key.
const KEY_TAG_DIGITS: usize = 12;

impl PolicySet {
    pub(crate) fn new(policies: Vec<Policy>) -> Self {
        // FNV-1a over an explicit byte layout: the same in every process, release
        // and architecture (a derived `Hash` writes integers in native byte order).
        let mut h = Fnv1a::new();
        for policy in &policies {
            h.write(policy.name().as_bytes());
            h.write(&[0xff]);
            h.write(policy.algorithm().as_str().as_bytes());
            for n in [
                policy.limit(),
                policy.window_ms(),
                policy.emission_interval_us(),
            ] {
                h.write(&n.to_le_bytes());
            }
        }
        let fingerprint = h.finish();
        let max_cost = policies.iter().map(Policy::max_cost).min().unwrap_or(0);
        Self {
            policies: policies.into(),
            fingerprint,
            key_tag: format!("{:012x}", fingerprint >> (64 - 4 * KEY_TAG_DIGITS)).into(),
            max_cost,
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

/// FNV-1a: a hash that is the same in every process and release.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv1a(pub(crate) u64);

impl Fnv1a {
    pub(crate) const fn new() -> Self {
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

/// A place that decides and keeps limit state.
///
/// The future is a named type so the layer's response future needs no box for the
/// memory store. Implementations must be atomic per call: no other call on the same
/// subject and policies may interleave between reading and writing state.
pub trait Store: Send + Sync + 'static {
    /// The pending decision.
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Decides whether `subject` may spend `cost` under every policy of `set`, and
    /// consumes from all of them only if all admit. `cost` is already validated:
    /// `1 <= cost <= set.max_cost()`.
    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future;

    /// Decides at once if this store can do so without waiting (the memory store
    /// can), as [`Store::check`] would; otherwise hands the subject back. The default
    /// hands it back.
    ///
    /// A decision made at once lets the layer call the inner service within its own
    /// `call`, with no future to keep: the fast path is the store's word, not a guess
    /// about its future's type.
    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        let _ = (set, cost);
        CheckNow::Later(subject)
    }
}

/// What [`Store::check_now`] did.
#[derive(Debug)]
pub enum CheckNow {
    /// Decided (or failed) without waiting.
    Decided(Result<Decision, StoreError>),
    /// This store answers later: [`Store::check`] takes the subject back.
    Later(Subject),
}

impl<S: Store> Store for Arc<S> {
    type Future = S::Future;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        (**self).check(subject, set, cost)
    }

    fn check_now(&self, subject: Subject, set: &PolicySet, cost: u64) -> CheckNow {
        (**self).check_now(subject, set, cost)
    }
}

/// What a store call does to a subject's state. The check and the admin operations go
/// through the same per-algorithm code (the model in memory, the one script in Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Decide and consume (the hot path, [`Store::check`]).
    Check,
    /// Decide as a check would now, consuming nothing.
    Peek,
    /// Give back `cost` units (see [`Limiter::refund`](crate::Limiter::refund)), then
    /// answer as a peek of `cost` would.
    Refund,
    /// Forget the subject's state for every policy of the set, then answer as a peek
    /// of `cost` would (on fresh state).
    Reset,
}

impl Operation {
    /// A short stable name, for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Check => "check",
            Operation::Peek => "peek",
            Operation::Refund => "refund",
            Operation::Reset => "reset",
        }
    }
}

/// A store that also runs the admin operations (peek, refund, reset).
///
/// Apart from [`Store`] so that a store written for checks alone (a test double, a
/// wrapper) needs nothing more.
pub trait AdminStore: Store {
    /// Runs `op` for `subject` under every policy of `set`. `cost` is validated as for
    /// [`Store::check`]; `run(Operation::Check, ..)` is `check`.
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future;
}

impl<S: AdminStore> AdminStore for Arc<S> {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        (**self).run(op, subject, set, cost)
    }
}

// What a store does for leases is at home with leases; these are its public paths.
pub use crate::lease::store::{GiveBack, GiveBackFuture, Grant, LeaseAsk, LeaseFuture, LeaseStore};

/// What went wrong with a store: it is never shown to clients as a 429.
///
/// A clone is the same failure with the same cause (shared): the requests waiting for
/// one leasing check all answer with its error.
#[derive(Debug, Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

/// The broad class of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer within its timeout.
    Timeout,
    /// The store could not be reached or refused the call.
    Unavailable,
    /// The store answered with something that is not a decision.
    Protocol,
}

impl StoreError {
    /// A store error of `kind` caused by `source`.
    pub fn new(kind: StoreErrorKind, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind,
            source: Some(Arc::from(source.into())),
        }
    }

    /// A timeout, with no further cause.
    pub fn timeout() -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            source: None,
        }
    }

    /// The class of failure.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The same failure for another caller (the checks of one batch share its
    /// failure); the cause is kept as its text.
    pub(crate) fn duplicate(&self) -> Self {
        Self {
            kind: self.kind,
            source: self
                .source
                .as_ref()
                .map(|s| Arc::from(Box::<dyn StdError + Send + Sync>::from(s.to_string()))),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Timeout => "timed out",
            StoreErrorKind::Unavailable => "is unavailable",
            StoreErrorKind::Protocol => "answered something unexpected",
        };
        write!(f, "rate-limit store {what}")?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
