//! The slots this instance holds in its limiters' in-flight policies
//! ([`Policy::in_flight`](crate::Policy::in_flight)): a [`Permit`] per request running,
//! given back when dropped, and the renewal that keeps them counting while they run.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use redlimit::{Limiter, MemoryStore, Policy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Arc::new(Limiter::new(
//!     MemoryStore::new(),
//!     Policy::in_flight("running", 2, Duration::from_secs(30))?,
//! ));
//! let first = limiter.check("tenant-7", 1).await?;
//! let slot = limiter.hold("tenant-7", &first);
//! assert!(slot.is_some());
//! let second = limiter.check("tenant-7", 1).await?;
//! let _also = limiter.hold("tenant-7", &second);
//! assert!(!limiter.check("tenant-7", 1).await?.is_allowed());
//! drop(slot); // the first request ended
//! assert!(limiter.check("tenant-7", 1).await?.is_allowed());
//! # Ok(()) }
//! ```
//!
//! Each instance (each [`Limiter`](crate::Limiter) built) counts its own requests
//! under an entry of its own in the subject's state, renewed every third of the slot
//! lifetime with the count this instance holds. An instance that vanishes stops
//! renewing, and its entry stops counting a slot lifetime after its last renewal;
//! a renewal also writes the entry again after the store lost it (a flush, a
//! failover), corrects a release that never arrived or a check that ran after it
//! timed out, and writes there the slots the fallback took while the store failed.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::parts::Limiter;
use super::slots::{in_flight, Home};
use crate::decision::{Decision, Origin};
use crate::store::{Operation, Store};
use crate::subject::Subject;

/// A request's permit: its slot in its limiter's in-flight policies, given back when
/// dropped.
///
/// From [`Limiter::hold`]; the layer holds one per request until its response body
/// ends or is dropped (the client went away, the handler panicked).
#[must_use = "the slot is given back as soon as it is dropped"]
pub struct Permit {
    limiter: Arc<dyn Holds>,
    subject: Option<Subject>,
    in_fallback: bool,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("subject", &self.subject)
            .field("in_fallback", &self.in_fallback)
            .finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(subject) = self.subject.take() {
            Arc::clone(&self.limiter).release(subject, self.in_fallback);
        }
    }
}

/// What a slot gives itself back to: its limiter, whatever its store.
trait Holds: Send + Sync + 'static {
    fn release(self: Arc<Self>, subject: Subject, in_fallback: bool);
}

impl<S: Store> Limiter<S> {
    /// The slot `decision` (this limiter's allowed check of `subject`) took in its
    /// in-flight policies, held until the returned [`Permit`] is dropped; `None` when
    /// there is none to hold: no in-flight policy, a denial, a request let through
    /// unchecked ([`Origin::FailOpen`]), or one a shadow in-flight policy would deny
    /// (enforcing it would have refused the request: it took no slot).
    ///
    /// While slots are held, this instance renews them every third of the shortest
    /// slot lifetime (a Tokio task; one store call per subject held). A check that
    /// admitted but whose slot nobody holds frees itself a slot lifetime later.
    pub fn hold(
        self: &Arc<Self>,
        subject: impl Into<Subject>,
        decision: &Decision,
    ) -> Option<Permit> {
        let table = self.slot_table()?;
        let in_fallback = match decision.origin() {
            _ if !decision.is_allowed() => return None,
            _ if in_flight(decision.policies()).any(|(i, _)| decision.spared_by(i)) => return None,
            Origin::Store | Origin::Lease => false,
            Origin::Fallback => true,
            Origin::FailOpen | Origin::BlockCache => return None,
        };
        let subject = subject.into();
        table.take(subject.clone(), in_fallback);
        let limiter: Arc<dyn Holds> = Arc::clone(self) as Arc<dyn Holds>;
        Some(Permit {
            limiter,
            subject: Some(subject),
            in_fallback,
        })
    }

    /// One round of renewals, as the renewal task makes them (see
    /// [`SlotTable::renew_round`]).
    #[cfg(feature = "internals")]
    pub(crate) async fn renew_slots(&self, stop_if_idle: bool) -> Option<usize> {
        self.slot_table()?.renew_round(stop_if_idle).await
    }
}

impl<S: Store> Holds for Limiter<S> {
    fn release(self: Arc<Self>, subject: Subject, in_fallback: bool) {
        let Some(table) = self.slot_table() else {
            return;
        };
        match table.give(&subject, in_fallback) {
            None => {}
            Some(Home::Fallback) => {
                if let Some(fallback) = self.fallback() {
                    fallback.run_op(Operation::Release, subject, self.policy_set(), 1);
                }
            }
            Some(Home::Store) => {
                let table = Arc::clone(table);
                run_off_path(
                    async move {
                        let released = self
                            .store()
                            .run(Operation::Release, subject.clone(), self.policy_set(), 1)
                            .await;
                        if let Err(error) = released {
                            tracing::warn!(%error, "in-flight slot not released: the next renewal corrects the count");
                            table.unsettle(subject);
                        }
                    },
                    "in-flight slot release",
                );
            }
        }
    }
}

/// Runs `work` without holding up the caller: work that completes at once (the
/// memory store's) is done here, any other in a Tokio task. Without a runtime it
/// cannot finish: it is dropped, and `what` is logged.
pub(crate) fn run_off_path<F>(work: F, what: &'static str)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut work = Box::pin(work);
    if let Poll::Ready(()) = work.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(work);
        }
        Err(_) => tracing::warn!("{what} dropped: no Tokio runtime to run it"),
    }
}
