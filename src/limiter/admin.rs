//! Admin operations on a limiter: what a check would decide, giving back, forgetting.

use super::parts::Limiter;
use crate::decision::{Decision, Origin};
use crate::error::Error;
use crate::store::{AdminStore, Operation};
use crate::subject::Subject;

/// Admin operations: what a check would decide, giving back, forgetting.
///
/// They go through the same per-algorithm code as the check (one script in Redis,
/// the model in memory), bypass the block cache (and clear the subject's entry in
/// it when they give back), and are not counted as decisions.
///
/// ```
/// use redlimit::{clock::FakeClock, Limiter, MemoryStore, Policy};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(
///     MemoryStore::with_clock(FakeClock::new(0)),
///     Policy::fixed_window("api", 2, Duration::from_secs(60))?,
/// );
/// limiter.check("u1", 2).await?;
/// // What a check would say now, consuming nothing.
/// assert!(!limiter.peek("u1", 1).await?.is_allowed());
/// // The handler failed: give the cost back, and the next check admits again.
/// limiter.refund("u1", 1).await?;
/// assert!(limiter.check("u1", 1).await?.is_allowed());
/// // Forget the subject altogether.
/// limiter.reset("u1").await?;
/// assert_eq!(limiter.peek("u1", 1).await?.remaining(), 1);
/// # Ok(()) }
/// ```
impl<S: AdminStore> Limiter<S> {
    /// The decision [`Limiter::check`] would make now for `cost`, consuming nothing.
    ///
    /// Goes to the store (not the block cache); the fallback answers while the store
    /// fails, as for a check.
    pub async fn peek(&self, subject: impl Into<Subject>, cost: u32) -> Result<Decision, Error> {
        let cost = self.valid_cost(cost)?;
        self.admin(Operation::Peek, subject.into(), cost).await
    }

    /// Gives back `cost` units a check consumed, for instance when the handler
    /// answered 5xx, and answers as [`Limiter::peek`] of `cost` would afterwards.
    /// With leases, this instance forgets the subject's kept denial; its lease stays
    /// (the store still counts its units).
    ///
    /// Per policy (shadow ones included): a fixed or sliding window lowers its current
    /// window's count (not below 0; nothing if the window has changed since); a token
    /// bucket moves its theoretical arrival time back by `cost` intervals (not before
    /// now); a sliding log removes its `cost` most recent stamps still in the window.
    /// The state only shrinks and keeps its expiry. The subject's cached denial, if
    /// any, is dropped. While the store fails, the fallback (if any) is refunded.
    ///
    /// To give back what a check took, use [`Limiter::refund_decision`]: it refunds
    /// where that check's cost went, which this admin operation does not know.
    pub async fn refund(&self, subject: impl Into<Subject>, cost: u32) -> Result<Decision, Error> {
        let cost = self.valid_cost(cost)?;
        self.admin(Operation::Refund, subject.into(), cost).await
    }

    /// Gives back `cost` units where `decision` (this limiter's allowed check of
    /// `subject`) took them, and answers as [`Limiter::refund`] does; `None` when
    /// there was nothing to give back.
    ///
    /// A decision of the store (or of a lease) is refunded in the store, and only
    /// there: if the store fails now, the refund is an error, since the fallback never
    /// counted the request. A decision of the fallback is refunded in the fallback,
    /// which counted it, never in the store, which did not. A request let through
    /// unchecked ([`Origin::FailOpen`]: a store that failed, or timed out after the
    /// call may have run) and a denial consumed nothing here: nothing is given back.
    /// The layer's [`refund_on`](crate::RateLimitLayer::refund_on) refunds this way.
    pub async fn refund_decision(
        &self,
        decision: &Decision,
        subject: impl Into<Subject>,
        cost: u32,
    ) -> Result<Option<Decision>, Error> {
        if !decision.is_allowed() {
            return Ok(None);
        }
        self.refund_from(decision.origin(), subject.into(), cost)
            .await
    }

    /// [`Limiter::refund_decision`] of an allowed decision from `origin`.
    pub(crate) async fn refund_from(
        &self,
        origin: Origin,
        subject: Subject,
        cost: u32,
    ) -> Result<Option<Decision>, Error> {
        let cost = self.valid_cost(cost)?;
        self.settle_from(Operation::Refund, origin, subject, cost)
            .await
    }

    /// Charges `units` more where a decision from `origin` took its cost, whatever
    /// the limit: what a request cost beyond what it reserved (a debt the next checks
    /// see), then answers as [`Limiter::peek`] of 1 would; `None` when there was
    /// nothing to charge (0 units, or nowhere: see [`Limiter::refund_decision`]).
    ///
    /// Routed as a refund is: a decision of the store (or of a lease) is charged in
    /// the store (its failure is an error), one of the fallback in the fallback, one
    /// let through unchecked or from the block cache nowhere. Any number of units: the
    /// cost limit of a check does not apply, and what a policy may owe is bounded
    /// (`MAX_DEBT` in the algorithms' module: at most `MAX_CLOCK_BACK` limits, or one
    /// window of a sliding log), more is not taken. Shadow policies are charged too.
    /// The block cache forgets nothing: a charge can only deny more. A charge that
    /// leaves the subject denied ends this instance's lease of it (its units stay
    /// counted in the store), so the lease stops admitting what the store denies.
    pub(crate) async fn charge_from(
        &self,
        origin: Origin,
        subject: Subject,
        units: u64,
    ) -> Result<Option<Decision>, Error> {
        if units == 0 {
            return Ok(None);
        }
        self.settle_from(Operation::Charge, origin, subject, units)
            .await
    }

    /// A refund or a charge of `cost` where a decision from `origin` took its cost.
    async fn settle_from(
        &self,
        op: Operation,
        origin: Origin,
        subject: Subject,
        cost: u64,
    ) -> Result<Option<Decision>, Error> {
        let (subject, live) = self.prepare(subject, 1)?;
        let set = live.as_ref().unwrap_or(&self.set);
        let guard = self.guard.as_ref();
        match origin {
            Origin::FailOpen | Origin::BlockCache => Ok(None),
            Origin::Fallback => Ok(guard.and_then(|g| g.fallback.as_ref()).map(|fallback| {
                fallback
                    .run_op(op, subject, set, cost)
                    .with_origin(Origin::Fallback)
            })),
            Origin::Store | Origin::Lease => {
                if let Some(guard) = guard {
                    guard.forget_before(op, &subject);
                }
                let after = guard
                    .filter(|g| g.forgets_after(op))
                    .map(|g| (g, subject.clone()));
                match self.store.run(op, subject, set, cost).await {
                    Ok(decision) => {
                        if let Some((guard, subject)) = after {
                            guard.forget_after(op, &subject, &decision);
                        }
                        Ok(Some(decision))
                    }
                    Err(error) => {
                        crate::telemetry::store_failed(&error, false);
                        Err(Error::Store(error))
                    }
                }
            }
        }
    }

    /// Forgets `subject`'s state for every policy of this limiter (deletes its keys),
    /// its cached denial, its lease and kept denial on this instance, and its state in
    /// the fallback. Other instances' leases of the subject are not spent twice: see
    /// [`crate::lease`] for what a reset costs while they hold some.
    ///
    /// A store failure is an error even with a fallback: the store's state is unchanged.
    pub async fn reset(&self, subject: impl Into<Subject>) -> Result<(), Error> {
        let (subject, _) = self.prepare(subject.into(), 1)?;
        if let Some(guard) = &self.guard {
            guard.forget_before(Operation::Reset, &subject);
            if let Some(fallback) = &guard.fallback {
                fallback.run_op(Operation::Reset, subject.clone(), &self.set, 1);
            }
        }
        self.store
            .run(Operation::Reset, subject, &self.set, 1)
            .await
            .map(drop)
            .map_err(|error| {
                crate::telemetry::store_failed(&error, false);
                Error::Store(error)
            })
    }

    /// Sets `policy`'s limit for `subject` (the subject of the policy's own scope: the
    /// key's, an org's; ignored for a global policy) to `limit`, on every instance
    /// that shares the store within the poll interval of
    /// [`LimiterBuilder::live_limits`](crate::LimiterBuilder::live_limits), on this
    /// one at once. The count is kept: a key that used 800 of 1000 and is raised to
    /// 5000 has 4200 left. The limit is stored as the store keeps the subject (an API
    /// key as its keyed hash), never raw.
    ///
    /// # Errors
    ///
    /// [`Error::BadLimit`] when live limits are off, no policy has that name, or the
    /// policy cannot take the limit (0, or past what its algorithm computes exactly:
    /// see the constructors); [`Error::Store`] when the store does not answer (nothing
    /// changed then).
    pub async fn set_limit(
        &self,
        policy: &str,
        subject: impl Into<Subject>,
        limit: u64,
    ) -> Result<(), Error> {
        let (index, part) = self.live_limit_of(policy, &subject.into())?;
        if self.set.policies()[index].with_limit(limit).is_none() {
            return Err(Error::BadLimit(format!(
                "policy {policy:?} cannot take a limit of {limit}"
            )));
        }
        self.write_limit(index, &part, Some(limit)).await
    }

    /// Removes `policy`'s live limit for `subject`: its own limit applies again, on
    /// every instance as [`set_limit`](Self::set_limit) says.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit)'s.
    pub async fn remove_limit(
        &self,
        policy: &str,
        subject: impl Into<Subject>,
    ) -> Result<(), Error> {
        let (index, part) = self.live_limit_of(policy, &subject.into())?;
        self.write_limit(index, &part, None).await
    }

    /// Sets `policy`'s limit for every subject without a live limit of its own, on
    /// every instance as [`set_limit`](Self::set_limit) says: a policy changed at
    /// runtime, keeping every subject's count.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit)'s.
    pub async fn set_policy_limit(&self, policy: &str, limit: u64) -> Result<(), Error> {
        if self.limits.is_none() {
            return Err(limits_off());
        }
        let index = self.policy_index(policy)?;
        if self.set.policies()[index].with_limit(limit).is_none() {
            return Err(Error::BadLimit(format!(
                "policy {policy:?} cannot take a limit of {limit}"
            )));
        }
        self.write_limit(index, &[], Some(limit)).await
    }

    /// Removes what [`set_policy_limit`](Self::set_policy_limit) set: the policy's own
    /// limit applies again to every subject without a live limit of its own.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit)'s.
    pub async fn remove_policy_limit(&self, policy: &str) -> Result<(), Error> {
        if self.limits.is_none() {
            return Err(limits_off());
        }
        let index = self.policy_index(policy)?;
        self.write_limit(index, &[], None).await
    }

    /// The limit `policy` applies to `subject` now on this instance: its live limit,
    /// else the policy's live limit for every subject, else its own.
    ///
    /// # Errors
    ///
    /// [`Error::BadLimit`] when no policy has that name.
    pub fn limit_of(&self, policy: &str, subject: impl Into<Subject>) -> Result<u64, Error> {
        let index = self.policy_index(policy)?;
        let own = self.set.policies()[index].limit();
        let Some(limits) = &self.limits else {
            return Ok(own);
        };
        let part = self.scope_part(index, &subject.into());
        Ok(limits.get(index, &part).unwrap_or(own))
    }

    /// Reads the store's live limits now if they changed (the polling does this every
    /// interval): for a start that must apply them before its first request.
    ///
    /// # Errors
    ///
    /// [`Error::BadLimit`] when live limits are off; [`Error::Store`] when the store
    /// does not answer.
    pub async fn refresh_limits(&self) -> Result<(), Error> {
        let limits = self.limits.as_ref().ok_or_else(limits_off)?;
        limits.refresh().await.map_err(Error::Store)
    }

    fn policy_index(&self, policy: &str) -> Result<usize, Error> {
        self.set
            .policies()
            .iter()
            .position(|p| p.name() == policy)
            .ok_or_else(|| Error::BadLimit(format!("no policy is named {policy:?}")))
    }

    /// The bytes a live limit of policy `index` is kept under for `subject`.
    fn scope_part(&self, index: usize, subject: &Subject) -> Vec<u8> {
        let policy = &self.set.policies()[index];
        if policy.scope().is_global() {
            crate::subject::GLOBAL.to_vec()
        } else {
            subject.key_part().to_vec()
        }
    }

    fn live_limit_of(&self, policy: &str, subject: &Subject) -> Result<(usize, Vec<u8>), Error> {
        if self.limits.is_none() {
            return Err(limits_off());
        }
        let index = self.policy_index(policy)?;
        Ok((index, self.scope_part(index, subject)))
    }

    async fn write_limit(
        &self,
        index: usize,
        part: &[u8],
        limit: Option<u64>,
    ) -> Result<(), Error> {
        let limits = self.limits.as_ref().ok_or_else(limits_off)?;
        limits.write(index, part, limit).await.map_err(|error| {
            crate::telemetry::store_failed(&error, false);
            Error::Store(error)
        })?;
        // A denial this instance keeps was decided under the old limit.
        if let Some(blocks) = self.guard.as_ref().and_then(|g| g.blocks.as_ref()) {
            if !part.is_empty()
                && self.set.policies()[index].scope().is_key()
                && !self.set.is_scoped()
            {
                blocks.forget(&Subject::from_bytes(part));
            }
        }
        Ok(())
    }

    async fn admin(&self, op: Operation, subject: Subject, cost: u64) -> Result<Decision, Error> {
        let (subject, live) = self.prepare(subject, cost)?;
        let set = live.as_ref().unwrap_or(&self.set);
        if let Some(guard) = &self.guard {
            guard.forget_before(op, &subject);
        }
        let fallback = self.guard.as_ref().and_then(|g| g.fallback.as_ref());
        let key = fallback.map(|_| subject.clone());
        match self.store.run(op, subject, set, cost).await {
            Ok(decision) => Ok(decision),
            Err(error) => {
                crate::telemetry::store_failed(&error, fallback.is_some());
                match (fallback, key) {
                    (Some(fallback), Some(subject)) => Ok(fallback
                        .run_op(op, subject, set, cost)
                        .with_origin(Origin::Fallback)),
                    _ => Err(Error::Store(error)),
                }
            }
        }
    }
}

fn limits_off() -> Error {
    Error::BadLimit("live limits are off (LimiterBuilder::live_limits)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::policy::Policy;
    use crate::MemoryStore;
    use std::time::Duration;

    /// A limiter of 3 a second on `store`, with a fallback and a block cache.
    fn limiter(
        store: &MemoryStore,
        fallback: &MemoryStore,
        clock: &FakeClock,
    ) -> Limiter<MemoryStore> {
        Limiter::builder(store.clone())
            .policy(Policy::fixed_window("p", 3, Duration::from_secs(1)).unwrap())
            .fallback(fallback.clone())
            .block_cache(8)
            .local_clock(clock.clone())
            .build()
            .unwrap()
    }

    /// What a check of 1 would leave of `subject` in `store` (2 when fresh).
    fn left(limiter: &Limiter<MemoryStore>, store: &MemoryStore, subject: &str) -> u64 {
        store
            .run_op(Operation::Peek, subject.into(), &limiter.set, 1)
            .remaining()
    }

    #[tokio::test]
    async fn a_charge_goes_where_the_cost_went_whatever_its_size() {
        let clock = FakeClock::new(0);
        let (store, fallback) = (
            MemoryStore::with_clock(clock.clone()),
            MemoryStore::with_clock(clock.clone()),
        );
        let limiter = limiter(&store, &fallback, &clock);
        // The store's (or a lease's): charged in the store, past the limit (no cost
        // check), and what it answers is a peek of 1.
        let charged = limiter
            .charge_from(Origin::Store, "s".into(), 5)
            .await
            .unwrap()
            .unwrap();
        assert!(!charged.is_allowed(), "{charged:?}");
        assert_eq!(charged.retry_after(), Some(Duration::from_secs(1)));
        assert!(!limiter.peek("s", 1).await.unwrap().is_allowed());
        assert_eq!(left(&limiter, &fallback, "s"), 2);
        limiter
            .charge_from(Origin::Lease, "l".into(), 1)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (left(&limiter, &store, "l"), left(&limiter, &fallback, "l")),
            (1, 2)
        );
        // The fallback's: charged there, any number of units, never in the store.
        let charged = limiter
            .charge_from(Origin::Fallback, "f".into(), u64::MAX)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(charged.origin(), Origin::Fallback);
        assert!(!charged.is_allowed());
        assert_eq!(
            (left(&limiter, &store, "f"), left(&limiter, &fallback, "f")),
            (2, 0)
        );
        // Unchecked, from the cache, or nothing to charge: nowhere.
        for (origin, units) in [
            (Origin::FailOpen, 2),
            (Origin::BlockCache, 2),
            (Origin::Store, 0),
        ] {
            let none = limiter
                .charge_from(origin, "n".into(), units)
                .await
                .unwrap();
            assert!(none.is_none(), "{origin:?} {units}: {none:?}");
        }
        assert_eq!(
            (left(&limiter, &store, "n"), left(&limiter, &fallback, "n")),
            (2, 2)
        );
    }

    #[tokio::test]
    async fn a_charge_keeps_the_subject_s_cached_denial_where_a_refund_drops_it() {
        let clock = FakeClock::new(0);
        let (store, fallback) = (
            MemoryStore::with_clock(clock.clone()),
            MemoryStore::with_clock(clock.clone()),
        );
        let limiter = limiter(&store, &fallback, &clock);
        for _ in 0..3 {
            assert!(limiter.check("b", 1).await.unwrap().is_allowed());
        }
        assert_eq!(limiter.check("b", 1).await.unwrap().origin(), Origin::Store);
        assert_eq!(
            limiter.check("b", 1).await.unwrap().origin(),
            Origin::BlockCache
        );
        limiter
            .charge_from(Origin::Store, "b".into(), 2)
            .await
            .unwrap();
        assert_eq!(
            limiter.check("b", 1).await.unwrap().origin(),
            Origin::BlockCache
        );
        limiter
            .refund_from(Origin::Store, "b".into(), 1)
            .await
            .unwrap();
        assert_eq!(limiter.check("b", 1).await.unwrap().origin(), Origin::Store);
    }
}
