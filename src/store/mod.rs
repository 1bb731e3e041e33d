//! Where limit state lives: [`MemoryStore`] for one process,
//! [`RedisStore`](crate::RedisStore) for many. Their docs say how each keeps its state:
//! the sharded map and its sweeping, the one connection, the keys, Redis Cluster and
//! failures.
//!
//! A store decides all of a request's policies at once, atomically: if one denies,
//! none consumes. Both stores fold their per-policy outcomes with the same code, so the
//! same trace gives the same [`Decision`](crate::Decision) whichever store holds it.

// The store's error sits on the bottom floor, with the crate's other errors: the
// errors and telemetry name it without looking up at the stores.
pub use crate::error::{StoreError, StoreErrorKind};

pub(crate) mod backend;
pub(crate) mod lease;
pub(crate) mod limits;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub(crate) use backend::{AdminStore, CheckNow, Operation, PolicySet};

#[cfg(feature = "redis")]
pub use self::redis::setup::SetupError;
pub(crate) use memory::MemoryStore;

/// A store a [`Limiter`](crate::Limiter) decides in: [`MemoryStore`],
/// [`RedisStore`](crate::RedisStore), or an `Arc` of either; name it to write code that
/// works on both (`fn app<S: Store + Clone>(store: S)`).
///
/// Sealed: what a store must do (decide every policy of a request atomically, in the
/// same arithmetic as the others, with the admin operations and leases) is this crate's
/// own contract, not yet one a third-party store can be held to.
pub trait Store: AdminStore {}

impl<T: AdminStore> Store for T {}

/// A store that keeps live limits for every instance that shares it
/// ([`LimiterBuilder::live_limits`](crate::LimiterBuilder::live_limits)): both stores,
/// and an `Arc` of either. Sealed, as [`Store`] is.
pub trait LiveLimitStore: limits::LimitStore {}

impl<T: limits::LimitStore> LiveLimitStore for T {}

pub(crate) use self::lease::{GiveBack, GiveBackFuture, LeaseAsk, LeaseStore};
