//! A leasing check in flight, from asking to its answer: the one request that asks
//! the store, the waiters that look again after it (flight.rs is their channel), and
//! recording the answer: the lease it granted (added to one of the same generation
//! still held), or the denial to keep, for the subject's next requests.

use std::sync::Arc;

use super::flight::{Answer, Asker, Waiter};
use super::table::{give_back_of, DecisionFuture, Lease, LeaseTable, Local};
use crate::algorithm::Grant;
use crate::clock::StoreMs;
use crate::decision::{Decision, Origin};
use crate::error::StoreError;
use crate::limiter::kept::KeptDenial;
use crate::policy::Algorithm;
use crate::store::LeaseAsk;
use crate::subject::Subject;

impl LeaseTable {
    /// Records what a leasing check sent at `sent` (on the store's clock) got, and
    /// returns the decision for the request that asked: its remaining counts the new
    /// lease. The subject's entry no longer names `asker`'s flight: its next requests
    /// spend what it left, or ask again.
    pub(crate) fn granted(
        self: &Arc<Self>,
        subject: &Subject,
        cost: u64,
        batch: u64,
        sent: StoreMs,
        result: Result<(Decision, Grant), StoreError>,
        asker: &Asker<Answer>,
    ) -> Result<Decision, StoreError> {
        let now = self.store_now();
        let mut shard = self.shard(subject);
        let mut entry = shard.get_mut(subject);
        if let Some(entry) = entry.as_deref_mut() {
            // Only this asker's: after a reset, a fresh entry's flight is another
            // asker's, whose waiters wait for that one.
            if entry.flight.as_ref().is_some_and(|f| f.waits_for(asker)) {
                entry.flight = None;
            }
        }
        // A failure goes back to the asker, which gives it to the waiters.
        let (mut decision, grant) = result?;
        let Some(entry) = entry else {
            // Swept out meanwhile: the units cannot be spent here; give them back.
            drop(shard);
            let back = give_back_of(
                grant.units,
                grant.window_end_ms.map(StoreMs),
                grant.epoch,
                self.plan.max_cost,
            );
            if let Some(back) = back {
                self.give_back(subject.clone(), back);
            }
            return Ok(decision);
        };
        if !decision.is_allowed() {
            let wait = decision
                .outcome()
                .retry_after_ms
                .max(grant.ask_again_ms)
                .max(1);
            // The wait is the one for the cost and a batch more: it holds for them all.
            // A fixed window's is its end whatever the cost: it holds for every larger
            // one too.
            let fixed = self
                .set
                .policies()
                .iter()
                .all(|p| p.algorithm() == Algorithm::FixedWindow);
            let up_to = if fixed {
                u64::MAX
            } else {
                cost.saturating_add(batch)
            };
            entry.denial = Some(KeptDenial::new(cost, &decision, sent.0, wait).up_to(up_to));
            return Ok(decision);
        }
        if grant.units == 0 {
            return Ok(decision);
        }
        // The lease starts when the call was sent, so it ends no later than the window
        // the store decided in, whatever the round trip took.
        let life = grant.window_left_ms.map_or(self.plan.lifetime_ms, |left| {
            left.min(self.plan.lifetime_ms)
        });
        let expires = sent.after(life);
        let mut stale = None;
        match &mut entry.lease {
            // Two leases of one generation at once: one, ending with the earlier. (A
            // lease of an older generation is dropped below: the store no longer
            // counts its units, so they are neither spent nor given back.)
            Some(lease) if now < lease.expires && lease.epoch == grant.epoch => {
                lease.units += grant.units;
                lease.expires = lease.expires.min(expires);
                lease.window_end = lease.window_end.min(grant.window_end_ms.map(StoreMs));
                lease.decided_at = sent;
                lease.decision = decision.clone();
            }
            slot => {
                stale = slot
                    .take()
                    .filter(|lease| lease.epoch == grant.epoch)
                    .and_then(|lease| lease.back(self.plan.max_cost));
                *slot = Some(Lease {
                    units: grant.units,
                    expires,
                    decided_at: sent,
                    decision: decision.clone(),
                    window_end: grant.window_end_ms.map(StoreMs),
                    epoch: grant.epoch,
                });
            }
        }
        let held = entry.lease.as_ref().map_or(0, |lease| lease.units);
        drop(shard);
        if let Some(back) = stale {
            self.give_back(subject.clone(), back);
        }
        self.start_sweeping();
        let remaining = decision.remaining().saturating_add(held);
        let reset = decision.outcome().reset_after_ms;
        decision.rebase_allowed(remaining, reset, Origin::Store);
        Ok(decision)
    }
}

impl LeaseTable {
    /// The store's leasing check for `ask`, recorded when it is answered and then
    /// given to the subject's waiters. Dropped first, it drops `asker`: the waiters
    /// wake to ask for themselves.
    pub(crate) fn ask(
        self: &Arc<Self>,
        subject: Subject,
        cost: u64,
        ask: LeaseAsk,
        asker: Asker<Answer>,
    ) -> DecisionFuture {
        // Read before the call is made: the store decides no earlier.
        let sent = self.store_now();
        let call = self
            .source
            .check_leasing(subject.clone(), &self.set, cost, ask);
        let table = Arc::clone(self);
        Box::pin(async move {
            let result = call.await;
            let decided = table.granted(&subject, cost, ask.batch, sent, result, &asker);
            asker.answer(decided.as_ref().map(drop).map_err(StoreError::clone));
            decided
        })
    }

    /// Waits for the subject's leasing check in flight, then decides as
    /// [`LeaseTable::try_local`] says (asking the store itself if it must), or
    /// answers with that check's failure.
    pub(crate) fn after_wait(
        self: &Arc<Self>,
        mut waiter: Waiter<Answer>,
        subject: Subject,
        cost: u64,
    ) -> DecisionFuture {
        let table = Arc::clone(self);
        Box::pin(async move {
            loop {
                // Answered or left without an answer: look again below.
                if let Some(Err(error)) = waiter.answer().await {
                    return Err(error);
                }
                let now = table.local_now();
                match table.try_local(&subject, cost, now) {
                    Local::Decided(decision) => return Ok(decision),
                    Local::Ask(ask, asker) => return table.ask(subject, cost, ask, asker).await,
                    Local::Wait(next) => waiter = next,
                    Local::Plain => {
                        let plain = LeaseAsk { want: 0, batch: 0 };
                        let call = table.source.check_leasing(subject, &table.set, cost, plain);
                        return call.await.map(|(decision, _)| decision);
                    }
                }
            }
        })
    }
}
