//! Housekeeping: the units of expired leases go back to the store, and subjects idle
//! for two lifetimes are forgotten, by a background task every quarter lifetime (and
//! by a full shard that needs room for a new subject).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::table::{lock, Entry, LeaseTable, Shard, SHARDS};
use crate::clock::{LocalMs, StoreMs};
use crate::store::{GiveBack, GiveBackFuture};
use crate::subject::Subject;

impl Entry {
    /// Holds nothing and waits for nothing, and was last asked for `idle_after` ms ago
    /// (`now` local, `at` on the store's clock).
    fn is_idle(&self, now: LocalMs, at: StoreMs, idle_after: u64) -> bool {
        self.flight
            .as_ref()
            .is_none_or(|flight| !flight.in_flight())
            && self.lease.is_none()
            && self
                .denial
                .as_ref()
                .is_none_or(|denial| denial.is_over(at.0))
            && now.since(self.last_seen) >= idle_after
    }
}

impl LeaseTable {
    /// Makes room in a full shard by forgetting its idle subjects, at most once a
    /// quarter lifetime (a scan of the shard); whether there is room now. The sweep
    /// does the same in the background; this is for a table filled faster than it
    /// sweeps, so that a subject turning hot behind a crowd of cold ones still leases.
    pub(super) fn make_room(&self, shard: &mut Shard, now: LocalMs, at: StoreMs) -> bool {
        let every = (self.plan.lifetime_ms / 4).max(1);
        if shard
            .pruned_at
            .is_some_and(|pruned| now >= pruned && now.since(pruned) < every)
        {
            return false;
        }
        shard.pruned_at = Some(now);
        let idle_after = self.plan.lifetime_ms.saturating_mul(2);
        shard.retain(|_, entry| !entry.is_idle(now, at, idle_after));
        shard.len().saturating_mul(SHARDS) < self.plan.max_subjects
    }

    /// Gives `units` back to the store in the background (written off without a
    /// runtime, when the store fails, or when the set has a token bucket).
    /// Only units of a window that has not ended on the store's clock, and of the
    /// lease generation the store still has, go back: the store checks both, so a late
    /// give-back, or one after the store lost its counts, changes nothing.
    pub(super) fn give_back(self: &Arc<Self>, subject: Subject, back: GiveBack) {
        if !self.plan.gives_back {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let units = back.units;
        let call = self.source.give_back(subject, &self.set, back);
        runtime.spawn(async move {
            if let Err(error) = call.await {
                tracing::debug!(%error, units, "could not give back a lease's units: written off");
            }
        });
    }

    /// Gives back the units of every expired lease and forgets subjects idle for two
    /// lifetimes. Returns the give-back calls, for callers that wait for them.
    pub(crate) fn sweep(&self, now: LocalMs) -> Vec<GiveBackFuture> {
        let at = self.store_now();
        let idle_after = self.plan.lifetime_ms.saturating_mul(2);
        let mut returns = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.retain(|subject, entry| {
                if entry
                    .lease
                    .as_ref()
                    .is_some_and(|lease| at >= lease.expires)
                {
                    let back = entry.lease.take().and_then(|l| l.back(self.plan.max_cost));
                    if let (true, Some(back)) = (self.plan.gives_back, back) {
                        returns.push(self.source.give_back(subject.clone(), &self.set, back));
                    }
                }
                if entry
                    .denial
                    .as_ref()
                    .is_some_and(|denial| denial.is_over(at.0))
                {
                    entry.denial = None;
                }
                !entry.is_idle(now, at, idle_after)
            });
        }
        returns
    }

    /// Starts the background sweep on the current runtime, once.
    pub(super) fn start_sweeping(self: &Arc<Self>) {
        if self.sweeping.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let table: Weak<Self> = Arc::downgrade(self);
        let every = Duration::from_millis((self.plan.lifetime_ms / 4).max(1));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(table) = table.upgrade() else {
                    return;
                };
                let returns = table.sweep(table.local_now());
                drop(table);
                for call in returns {
                    if let Err(error) = call.await {
                        tracing::debug!(%error, "could not give back a lease's units: written off");
                    }
                }
            }
        });
    }

    /// [`LeaseTable::sweep`] now, waiting for its give-backs: how many calls it made.
    #[cfg(feature = "internals")]
    pub(crate) async fn sweep_now(&self) -> usize {
        let calls = self.sweep(self.local_now());
        let made = calls.len();
        for call in calls {
            let _ = call.await;
        }
        made
    }
}
