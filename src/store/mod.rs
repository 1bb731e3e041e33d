//! Where limit state lives: [`MemoryStore`] for one process,
//! [`RedisStore`](crate::RedisStore) for many. Their docs say how each keeps its state:
//! the sharded map and its sweeping, the one connection, the keys, Redis Cluster and
//! failures.
//!
//! A store decides all of a request's policies at once, atomically: if one denies,
//! none consumes. Both stores fold their per-policy outcomes with the same code, so the
//! same trace gives the same [`Decision`](crate::Decision) whichever store holds it.

use std::error::Error as StdError;
use std::fmt;
use std::hash::Hasher;
use std::sync::Arc;

use crate::error::debug_as_display;

pub(crate) mod backend;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub(crate) use backend::{AdminStore, Backend, CheckNow, Operation, PolicySet};

#[cfg(feature = "redis")]
pub use self::redis::{InvalidPrefix, InvalidUrl};
pub(crate) use memory::MemoryStore;

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

/// A store a [`Limiter`](crate::Limiter) decides in: [`MemoryStore`],
/// [`RedisStore`](crate::RedisStore), or an `Arc` of either; name it to write code that
/// works on both (`fn app<S: Store + Clone>(store: S)`).
///
/// Sealed: what a store must do (decide every policy of a request atomically, in the
/// same arithmetic as the others, with the admin operations and leases) is this crate's
/// own contract, not yet one a third-party store can be held to.
pub trait Store: AdminStore {}

impl<T: AdminStore> Store for T {}

// What a store does for leases is at home with leases.
pub(crate) use crate::lease::store::{
    GiveBack, GiveBackFuture, Grant, LeaseAsk, LeaseFuture, LeaseStore,
};

/// What went wrong with a store: it is never shown to clients as a 429.
///
/// A clone is the same failure with the same cause (shared): the requests waiting for
/// one leasing check all answer with its error.
#[derive(Clone)]
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
    /// The store had more checks waiting than it takes
    /// ([`RedisStore::max_queue`](crate::RedisStore::max_queue)): this one was
    /// shed before Redis saw it. The layer answers it with the limiter's fallback,
    /// or 503 even when failing open: shedding load never lets a request through
    /// unchecked.
    Overloaded,
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
    #[cfg(feature = "redis")]
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
            StoreErrorKind::Overloaded => "is overloaded (check shed)",
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

debug_as_display!(StoreError);
