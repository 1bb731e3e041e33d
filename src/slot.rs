//! The slots this instance holds in its limiters' in-flight policies
//! ([`Policy::in_flight`](crate::Policy::in_flight)): a [`Slot`] per request running,
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
//! failover) and corrects a release that never arrived.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::decision::{Decision, Origin};
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::store::{Operation, Store};
use crate::subject::Subject;

/// A request's slot in its limiter's in-flight policies: given back when dropped.
///
/// From [`Limiter::hold`]; the layer holds one per request until its response body
/// ends or is dropped (the client went away, the handler panicked).
#[must_use = "the slot is given back as soon as it is dropped"]
pub struct Slot {
    holder: Arc<dyn Holds>,
    subject: Option<Subject>,
    in_fallback: bool,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("subject", &self.subject)
            .field("in_fallback", &self.in_fallback)
            .finish_non_exhaustive()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(subject) = self.subject.take() {
            Arc::clone(&self.holder).release(subject, self.in_fallback);
        }
    }
}

/// What a slot gives itself back to: its limiter, whatever its store.
trait Holds: Send + Sync + 'static {
    fn release(self: Arc<Self>, subject: Subject, in_fallback: bool);
}

/// The slots this limiter holds, per subject and where they were taken (the store or
/// the fallback), and whether the renewal task runs.
#[derive(Debug)]
pub(crate) struct SlotTable {
    held: Mutex<Held>,
    every: Duration,
}

#[derive(Debug, Default)]
struct Held {
    counts: HashMap<(bool, Subject), u64>,
    renewing: bool,
}

impl SlotTable {
    /// The table of a set with in-flight policies (`None` for a set without).
    pub(crate) fn of(policies: &[Policy]) -> Option<Self> {
        let shortest = policies
            .iter()
            .filter(|p| p.is_in_flight())
            .map(Policy::window_ms)
            .min()?;
        Some(Self {
            held: Mutex::new(Held::default()),
            every: Duration::from_millis((shortest / 3).max(1)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // Plain counts: a panic elsewhere must not turn every release into one.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more slot; whether the renewal task must be started.
    fn take(&self, key: (bool, Subject)) -> bool {
        let mut held = self.lock();
        *held.counts.entry(key).or_insert(0) += 1;
        !std::mem::replace(&mut held.renewing, true)
    }

    fn give(&self, key: &(bool, Subject)) {
        let mut held = self.lock();
        if let Some(count) = held.counts.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                held.counts.remove(key);
            }
        }
    }

    /// What to renew now. With `stop_if_idle`, `None` when nothing is held, and the
    /// renewal task is then marked stopped (under the same lock as a new slot's
    /// `take`, so a slot taken meanwhile starts a new task).
    fn to_renew(&self, stop_if_idle: bool) -> Option<Vec<((bool, Subject), u64)>> {
        let mut held = self.lock();
        if held.counts.is_empty() && stop_if_idle {
            held.renewing = false;
            return None;
        }
        Some(held.counts.iter().map(|(k, n)| (k.clone(), *n)).collect())
    }

    /// The slots held of `subject`, in the store and in the fallback.
    #[cfg(feature = "internals")]
    pub(crate) fn held(&self, subject: &Subject) -> u64 {
        let held = self.lock();
        [false, true]
            .iter()
            .filter_map(|f| held.counts.get(&(*f, subject.clone())))
            .sum()
    }
}

impl<S: Store> Limiter<S> {
    /// The slot `decision` (this limiter's allowed check of `subject`) took in its
    /// in-flight policies, held until the returned [`Slot`] is dropped; `None` when
    /// there is none to hold: no in-flight policy, a denial, a request let through
    /// unchecked ([`Origin::FailOpen`]).
    ///
    /// While slots are held, this instance renews them every third of the shortest
    /// slot lifetime (a Tokio task; one store call per subject held). A check that
    /// admitted but whose slot nobody holds frees itself a slot lifetime later.
    pub fn hold(
        self: &Arc<Self>,
        subject: impl Into<Subject>,
        decision: &Decision,
    ) -> Option<Slot> {
        let table = self.slot_table()?;
        let in_fallback = match decision.origin() {
            _ if !decision.is_allowed() => return None,
            Origin::Store | Origin::Lease => false,
            Origin::Fallback => true,
            Origin::FailOpen | Origin::BlockCache => return None,
        };
        let subject = subject.into();
        if table.take((in_fallback, subject.clone())) {
            self.start_renewing(table.every);
        }
        let holder: Arc<dyn Holds> = Arc::clone(self) as Arc<dyn Holds>;
        Some(Slot {
            holder,
            subject: Some(subject),
            in_fallback,
        })
    }

    /// The renewal task, holding the limiter weakly: it ends when nothing is held
    /// or the limiter is gone. Without a Tokio runtime there is none, and slots held
    /// longer than their lifetime stop counting.
    fn start_renewing(self: &Arc<Self>, every: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("in-flight slots are not renewed: no Tokio runtime to renew them");
            return;
        };
        let limiter = Arc::downgrade(self);
        runtime.spawn(renew_while_held(limiter, every));
    }

    /// One round of renewals: every subject held, one store call each, all at once
    /// (a slow store delays the round by one call's time, not by one per subject); how
    /// many. `None` (with `stop_if_idle`: the task stops) when nothing is held. Runs on
    /// a Tokio runtime: the renewal task's (or a test's).
    pub(crate) async fn renew_slots(&self, stop_if_idle: bool) -> Option<usize> {
        let held = self.slot_table()?.to_renew(stop_if_idle)?;
        let subjects = held.len();
        let mut calls = tokio::task::JoinSet::new();
        for ((in_fallback, subject), count) in held {
            if in_fallback {
                if let Some(fallback) = self.fallback() {
                    fallback.run_op(Operation::Renew, subject, self.policy_set(), count);
                }
                continue;
            }
            let call = self
                .store()
                .run(Operation::Renew, subject, self.policy_set(), count);
            calls.spawn(call);
        }
        while let Some(renewed) = calls.join_next().await {
            if let Ok(Err(error)) = renewed {
                tracing::warn!(%error, "in-flight slots not renewed; they count until their lifetime ends");
            }
        }
        Some(subjects)
    }
}

async fn renew_while_held<S: Store>(limiter: Weak<Limiter<S>>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(limiter) = limiter.upgrade() else {
            return;
        };
        if limiter.renew_slots(true).await.is_none() {
            return;
        }
    }
}

impl<S: Store> Holds for Limiter<S> {
    fn release(self: Arc<Self>, subject: Subject, in_fallback: bool) {
        let Some(table) = self.slot_table() else {
            return;
        };
        let key = (in_fallback, subject);
        table.give(&key);
        let (in_fallback, subject) = key;
        if in_fallback {
            if let Some(fallback) = self.fallback() {
                fallback.run_op(Operation::Release, subject, self.policy_set(), 1);
            }
            return;
        }
        run_off_path(
            async move {
                let released = self
                    .store()
                    .run(Operation::Release, subject, self.policy_set(), 1)
                    .await;
                if let Err(error) = released {
                    tracing::warn!(%error, "in-flight slot not released; it frees itself within its lifetime");
                }
            },
            "in-flight slot release",
        );
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
