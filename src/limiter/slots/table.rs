//! The table of slots this instance holds, per subject and where each is counted, and
//! its renewal rounds (what the [module docs](super) promise).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use crate::decision::Decision;
use crate::policy::Policy;
use crate::store::{MemoryStore, Operation, PolicySet, Store, StoreError};
use crate::subject::Subject;

/// The most subjects kept to renew for a call of unknown outcome alone (nothing held
/// of them): a long outage must not grow the table without end. Past it, such a call's
/// slot, if it ran, frees itself within its lifetime, and the round says so at warn.
const MAX_UNSETTLED: usize = 4_096;

/// Renewals that must succeed before a call of unknown outcome is settled: the first
/// runs after the call on the same connection; the second, sent after the first was
/// answered, after anything still buffered on a connection the store replaced.
const SETTLING_RENEWALS: u8 = 2;

/// The policies of `policies` that hold slots, with their places: the one place that
/// tells an in-flight policy from a rate.
pub(crate) fn in_flight(policies: &[Policy]) -> impl Iterator<Item = (usize, &Policy)> {
    policies
        .iter()
        .enumerate()
        .filter(|(_, p)| p.is_in_flight())
}

/// A renewal's store call, whatever the store (the renewal task holds no limiter).
type Renewal = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

trait Renews: Send + Sync + 'static {
    fn renew(&self, subject: Subject, set: &PolicySet, count: u64) -> Renewal;
}

impl<S: Store> Renews for S {
    fn renew(&self, subject: Subject, set: &PolicySet, count: u64) -> Renewal {
        Box::pin(self.run(Operation::Renew, subject, set, count))
    }
}

/// The slots this limiter holds, per subject and where they are counted (the store or
/// the fallback), the subjects a call of unknown outcome may have changed, and what the
/// renewal needs: the store, the policies, the fallback.
pub(crate) struct SlotTable {
    held: Mutex<Held>,
    every: Duration,
    store: Arc<dyn Renews>,
    set: PolicySet,
    fallback: Option<MemoryStore>,
}

impl fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotTable")
            .field("held", &self.held)
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Held {
    counts: HashMap<Subject, Counts>,
    /// Subjects whose entry in the store a call of unknown outcome may have changed (a
    /// check that failed or timed out, and may have run; a release or renewal that
    /// failed), with the renewals still owed them: each round renews them with what is
    /// held, 0 included (the entry goes).
    unsettled: HashMap<Subject, u8>,
    /// Such calls not kept since the last round ([`MAX_UNSETTLED`] reached).
    untracked: u64,
    renewing: bool,
}

impl Held {
    /// `subject` is owed `renewals` more (at least); `false` when [`MAX_UNSETTLED`]
    /// are kept already (counted, and said at warn by the round).
    fn mark(&mut self, subject: Subject, renewals: u8) -> bool {
        let full = self.unsettled.len() >= MAX_UNSETTLED;
        match self.unsettled.get_mut(&subject) {
            Some(owed) => *owed = (*owed).max(renewals),
            None if full => {
                self.untracked += 1;
                return false;
            }
            None => {
                self.unsettled.insert(subject, renewals);
            }
        }
        true
    }
}

/// One subject's slots held by this instance, by where they are counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    /// In this instance's entry in the store: taken there, or taken by the fallback
    /// and written there by a renewal since.
    store: u64,
    /// Taken by the fallback while the store failed, and counted only there so far.
    fallback: u64,
}

/// Where a released slot was counted, so where it is given back.
pub(in crate::limiter) enum Home {
    Store,
    Fallback,
}

/// One subject's part in a round: what was sent, and the renewals it was owed.
struct Sent {
    subject: Subject,
    counts: Counts,
    owed: u8,
}

impl SlotTable {
    /// The table of a set with in-flight policies (`None` for a set without).
    pub(crate) fn of<S: Store>(
        set: &PolicySet,
        store: &Arc<S>,
        fallback: Option<&MemoryStore>,
    ) -> Option<Arc<Self>> {
        let shortest = in_flight(set.policies())
            .map(|(_, p)| p.window_ms())
            .min()?;
        let store: Arc<dyn Renews> = Arc::clone(store) as Arc<dyn Renews>;
        Some(Arc::new(Self {
            held: Mutex::new(Held::default()),
            every: Duration::from_millis((shortest / 3).max(1)),
            store,
            set: set.clone(),
            fallback: fallback.cloned(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // Plain counts: a panic elsewhere must not turn every release into one.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more slot, and starts the renewal if it is not running.
    pub(in crate::limiter) fn take(self: &Arc<Self>, subject: Subject, in_fallback: bool) {
        let start = {
            let mut held = self.lock();
            let counts = held.counts.entry(subject).or_default();
            if in_fallback {
                counts.fallback += 1;
            } else {
                counts.store += 1;
            }
            !std::mem::replace(&mut held.renewing, true)
        };
        if start {
            self.start_renewing();
        }
    }

    /// Counts one slot fewer: where it was taken if it is still counted there, else
    /// where the others are (slots of a subject are alike: any may be the one that
    /// ended). `None` when nothing of `subject` is held.
    pub(in crate::limiter) fn give(&self, subject: &Subject, in_fallback: bool) -> Option<Home> {
        let mut held = self.lock();
        let counts = held.counts.get_mut(subject)?;
        let home = if (in_fallback || counts.store == 0) && counts.fallback > 0 {
            counts.fallback -= 1;
            Home::Fallback
        } else if counts.store > 0 {
            counts.store -= 1;
            Home::Store
        } else {
            return None;
        };
        if *counts == Counts::default() {
            held.counts.remove(subject);
        }
        Some(home)
    }

    /// A call of `subject` whose outcome is unknown may have changed this instance's
    /// entry in the store: the next round renews it with what is held (0: the entry
    /// goes), so a check that ran after it timed out holds no slot past that round.
    pub(crate) fn unsettle(self: &Arc<Self>, subject: Subject) {
        let start = {
            let mut held = self.lock();
            if !held.mark(subject, SETTLING_RENEWALS) {
                return;
            }
            !std::mem::replace(&mut held.renewing, true)
        };
        if start {
            self.start_renewing();
        }
    }

    /// The renewal task, holding the table weakly: it ends when nothing is held or
    /// unsettled, or the limiter is gone. Without a Tokio runtime there is none (until
    /// a slot is taken on one), and slots held longer than their lifetime stop
    /// counting.
    fn start_renewing(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.lock().renewing = false;
            tracing::warn!("in-flight slots are not renewed: no Tokio runtime to renew them");
            return;
        };
        runtime.spawn(renew_while_held(Arc::downgrade(self), self.every));
    }

    /// One round of renewals: every subject held or unsettled, one store call each with
    /// the count this instance holds of it, wherever taken, all at once (a slow store
    /// delays the round by one call's time, not by one per subject); how many.
    /// `None` (with `stop_if_idle`: the task stops) when there is nothing to renew. Runs
    /// on a Tokio runtime: the renewal task's (or a test's).
    pub(crate) async fn renew_round(&self, stop_if_idle: bool) -> Option<usize> {
        let (round, untracked) = {
            let mut held = self.lock();
            if held.counts.is_empty() && held.unsettled.is_empty() && stop_if_idle {
                held.renewing = false;
                return None;
            }
            let mut unsettled = std::mem::take(&mut held.unsettled);
            let mut round: Vec<Sent> = held
                .counts
                .iter()
                .map(|(subject, counts)| Sent {
                    subject: subject.clone(),
                    counts: *counts,
                    owed: unsettled.remove(subject).unwrap_or(0),
                })
                .collect();
            round.extend(unsettled.into_iter().map(|(subject, owed)| Sent {
                subject,
                counts: Counts::default(),
                owed,
            }));
            (round, std::mem::take(&mut held.untracked))
        };
        if untracked > 0 {
            tracing::warn!(
                calls = untracked,
                "in-flight calls of unknown outcome past the {MAX_UNSETTLED} kept: a slot one took, if it ran, counts until its lifetime ends"
            );
        }
        let subjects = round.len();
        let mut calls = tokio::task::JoinSet::new();
        for sent in round {
            let count = sent.counts.store + sent.counts.fallback;
            let call = self.store.renew(sent.subject.clone(), &self.set, count);
            calls.spawn(async move { (sent, call.await) });
        }
        let (mut failed, mut first_error) = (0usize, None);
        while let Some(done) = calls.join_next().await {
            let Ok((sent, renewed)) = done else {
                continue;
            };
            match renewed {
                Ok(_) => self.renewed(sent),
                Err(error) => {
                    failed += 1;
                    first_error.get_or_insert(error);
                    self.not_renewed(sent.subject);
                }
            }
        }
        if let Some(error) = first_error {
            tracing::warn!(
                subjects = failed,
                %error,
                "in-flight slots not renewed in the store: renewed again next round; meanwhile they count until their lifetime ends"
            );
        }
        Some(subjects)
    }

    /// The store's entry of the subject now counts what was sent (its slots in the
    /// store and in the fallback): the fallback's are counted in the store from now,
    /// and leave the fallback's entry.
    fn renewed(&self, sent: Sent) {
        let Sent {
            subject,
            counts,
            owed,
        } = sent;
        let left = {
            let mut held = self.lock();
            if owed > 1 {
                held.mark(subject.clone(), owed - 1);
            }
            if counts.fallback == 0 {
                return;
            }
            let (moved, left) = match held.counts.get_mut(&subject) {
                Some(now) => {
                    let moved = counts.fallback.min(now.fallback);
                    now.fallback -= moved;
                    now.store += moved;
                    (moved, now.fallback)
                }
                None => (0, 0),
            };
            // Some were given back to the fallback meanwhile: the store counts them
            // still, until the next round.
            if moved < counts.fallback {
                held.mark(subject.clone(), 1);
            }
            left
        };
        if let Some(fallback) = &self.fallback {
            fallback.run_op(Operation::Renew, subject, &self.set, left);
        }
    }

    /// The store did not renew `subject`: whatever it did is unknown, so later rounds
    /// renew it again, held or not; the fallback keeps counting its own slots.
    fn not_renewed(&self, subject: Subject) {
        let in_fallback = {
            let mut held = self.lock();
            held.mark(subject.clone(), SETTLING_RENEWALS);
            held.counts.get(&subject).map_or(0, |c| c.fallback)
        };
        if let (Some(fallback), true) = (&self.fallback, in_fallback > 0) {
            fallback.run_op(Operation::Renew, subject, &self.set, in_fallback);
        }
    }

    /// The slots held of `subject`, in the store and in the fallback.
    #[cfg(feature = "internals")]
    pub(crate) fn held(&self, subject: &Subject) -> u64 {
        self.lock()
            .counts
            .get(subject)
            .map_or(0, |c| c.store + c.fallback)
    }
}

async fn renew_while_held(table: Weak<SlotTable>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(table) = table.upgrade() else {
            return;
        };
        if table.renew_round(true).await.is_none() {
            return;
        }
    }
}
