//! What a store does for leases: the leasing check (a check that also takes units
//! for this instance to spend) and the give-back of units a lease did not spend.
//! Private to the crate, like the other store traits; the table that is its one
//! caller is the limiter's (`limiter/lease`). What a grant is, the algorithm owns
//! ([`Grant`]): it is worked out with the decision.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::backend::PolicySet;
use crate::algorithm::Grant;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::subject::Subject;

/// What a leasing check asks for beyond its cost (see [`crate::lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// Units wanted as a lease, taken from every policy beyond the cost if all admit.
    pub want: u64,
    /// When the check is denied: the wait for the cost and this many more units is
    /// reported too ([`Grant::ask_again_ms`]). `cost + batch` must not exceed
    /// [`PolicySet::max_cost`].
    pub batch: u64,
}

/// Units a lease did not spend, for [`LeaseStore::give_back`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBack {
    /// The units, at most [`PolicySet::max_cost`].
    pub units: u64,
    /// The end of the lease's window on the store's clock ([`Grant::window_end_ms`]):
    /// from then on the window the units came from is over and nothing changes.
    pub before_ms: u64,
    /// The lease generation the units were taken in ([`Grant::epoch`]): once the
    /// store's is another, they are no longer counted and nothing changes.
    pub epoch: u64,
}

/// The pending result of [`LeaseStore::check_leasing`].
pub(crate) type LeaseFuture =
    Pin<Box<dyn Future<Output = Result<(Decision, Grant), StoreError>> + Send + 'static>>;

/// The pending result of [`LeaseStore::give_back`].
pub(crate) type GiveBackFuture =
    Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send + 'static>>;

/// A store shared by several instances that can also hand out leases: units taken
/// from a subject's budget in the same atomic call as a check, for the instance to
/// spend locally ([`crate::lease`]). A store of one process has no use for them.
///
/// Object-safe (boxed futures), so a limiter keeps its store behind
/// `Arc<dyn LeaseStore>` for leases and its type does not change with them on.
pub trait LeaseStore: Send + Sync + 'static {
    /// [`Backend::check`](super::backend::Backend::check) of `cost`, and when every policy admits, up to `ask.want` more
    /// units taken from every policy at once (never more than each admits now).
    fn check_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> LeaseFuture;

    /// Gives back units a lease did not spend, as [`Operation::Refund`](super::backend::Operation::Refund) does, if the
    /// store's clock is still before [`GiveBack::before_ms`] and the subject's lease
    /// generation is still [`GiveBack::epoch`]; otherwise nothing changes (a peek).
    fn give_back(&self, subject: Subject, set: &PolicySet, back: GiveBack) -> GiveBackFuture;

    /// The clock this store decides on, when it reads one in this process (the memory
    /// store's, a Redis store's client clock); `None` (the default) when it keeps its
    /// own, as Redis `TIME`, which runs at the speed of time. Leases and the denials an
    /// instance keeps are timed on it (or, for `None`, on a monotonic clock), never on
    /// the limiter's local clock: one that runs slow or steps back could otherwise
    /// spend a lease after its window ended in the store.
    fn lease_clock(&self) -> Option<Arc<dyn Clock>> {
        None
    }
}

impl<S: LeaseStore> LeaseStore for Arc<S> {
    fn check_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> LeaseFuture {
        (**self).check_leasing(subject, set, cost, ask)
    }

    fn give_back(&self, subject: Subject, set: &PolicySet, back: GiveBack) -> GiveBackFuture {
        (**self).give_back(subject, set, back)
    }

    fn lease_clock(&self) -> Option<Arc<dyn Clock>> {
        (**self).lease_clock()
    }
}
