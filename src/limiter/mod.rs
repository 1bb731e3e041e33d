//! The limiter: a store and the policies checked together, usable without HTTP.
//!
//! ```
//! use redlimit::{Limiter, MemoryStore, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 10 per second and 1000 per hour: both must admit, and a denial consumes nothing.
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::token_bucket("burst", 10, 10, Duration::from_secs(1))?)
//!     .policy(Policy::sliding_window("hourly", 1000, Duration::from_secs(3600))?)
//!     .build()?;
//!
//! let decision = limiter.check("tenant-7", 1).await?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 9);
//! # Ok(()) }
//! ```

use std::sync::Arc;

use crate::clock::LocalMs;
use crate::error::Error;
use crate::policy::Policy;
use crate::store::{CheckNow, PolicySet, Store};
use crate::subject::Subject;

mod admin;
mod block_cache;
mod build_error;
mod builder;
mod forget;
mod future;
mod kept;
pub(crate) mod lease;
mod limits;
mod parts;
mod permit;
mod slots;
#[cfg(test)]
mod tests;
mod wait;

pub use build_error::BuildError;
pub use builder::LimiterBuilder;
pub use future::CheckFuture;
pub(crate) use permit::run_off_path;
pub use permit::Permit;

use self::lease::Leased;
pub(crate) use future::Checked;
use future::{After, CheckState, PendingLease};
pub use parts::Limiter;
pub(crate) use wait::{may_wait, wait_turn, Turn};

impl<S: Store> Limiter<S> {
    /// A limiter on `store` with one policy and nothing around it: the shorthand for
    /// `Limiter::builder(store).policy(policy).build()`, which cannot fail.
    pub fn new(store: S, policy: Policy) -> Self {
        builder::assemble(store, PolicySet::new(vec![policy]), None, None, None, None)
    }

    /// A limiter with several policies, a block cache, a memory fallback, leases or a
    /// clock of its own: every setting is given first and checked once, in
    /// [`LimiterBuilder::build`], so the order of the calls never matters.
    pub fn builder(store: S) -> LimiterBuilder<S> {
        LimiterBuilder::new(store)
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides whether `subject` may spend `cost` now, and consumes it if so.
    ///
    /// A cost of 0, or above what some policy can ever admit, is an error rather than a
    /// denial that would never end.
    #[inline]
    pub fn check(&self, subject: impl Into<Subject>, cost: u32) -> CheckFuture<S::Future> {
        match self.check_or_later(subject.into(), cost) {
            Checked::Now(result) => CheckFuture::ready(result),
            Checked::Later(future) => future,
        }
    }

    /// [`Limiter::check`], with its result as it is when the check was decided at once
    /// (by a store that decides at once, the block cache, a lease, or a refused cost):
    /// the layer's fast path, which then needs no future at all. Reported (logged and
    /// counted) once, either way.
    #[inline]
    pub(crate) fn check_or_later(&self, subject: Subject, cost: u32) -> Checked<S::Future> {
        let cost = match self.valid_cost(cost) {
            Ok(cost) => cost,
            Err(error) => return Checked::now(Err(error)),
        };
        let (subject, live) = match self.prepare(subject, cost) {
            Ok(prepared) => prepared,
            Err(error) => return Checked::now(Err(error)),
        };
        let set = live.as_ref().unwrap_or(&self.set);
        let Some(guard) = &self.guard else {
            return match self.store.check_now(subject, set, cost) {
                CheckNow::Decided(result) => Checked::now(result.map_err(Error::from)),
                CheckNow::Later(subject) => Checked::Later(CheckFuture {
                    state: CheckState::Store {
                        future: self.store.check(subject, set, cost),
                    },
                    after: None,
                }),
            };
        };
        if let Some(blocks) = &guard.blocks {
            if let Some(decision) = blocks.lookup(&subject, cost, guard.clock.now_ms()) {
                return Checked::now(Ok(decision));
            }
        }
        // What runs once the store answers: made only for a check that goes to it.
        let after = || After {
            guard: Arc::clone(guard),
            subject: subject.clone(),
            set: set.clone(),
            cost,
        };
        if let Some(leases) = &guard.leases {
            let now = guard.clock.now_ms();
            match leases.check(&subject, cost, LocalMs(now)) {
                // Served from a lease or a kept denial: nothing to do afterwards.
                Leased::Decided(decision) => return Checked::now(Ok(decision)),
                Leased::Pending(future) => {
                    return Checked::Later(CheckFuture {
                        state: CheckState::Lease {
                            future: PendingLease(future),
                        },
                        after: Some(after()),
                    })
                }
                Leased::Plain => {}
            }
        }
        let after = after();
        match self.store.check_now(subject, set, cost) {
            CheckNow::Decided(result) => Checked::now(after.finish(result)),
            CheckNow::Later(subject) => Checked::Later(CheckFuture {
                state: CheckState::Store {
                    future: self.store.check(subject, set, cost),
                },
                after: Some(after),
            }),
        }
    }
}
