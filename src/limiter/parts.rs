//! The limiter's parts: its store, its policies and what runs around the store, with
//! the accessors every operation of the limiter reads them through.

use std::sync::Arc;

use super::block_cache::BlockCache;
use super::lease::LeaseTable;
use super::limits::LiveLimits;
use super::slots::SlotTable;
use crate::clock::Clock;
use crate::error::Error;
use crate::policy::Policy;
use crate::store::{MemoryStore, PolicySet};
use crate::subject::Subject;

/// A store and the policies one kind of request is checked against.
///
/// Built with at least one policy, so every check has something to decide. Wrap it in an
/// `Arc` (the layer does) to share it.
#[derive(Debug, Clone)]
pub struct Limiter<S> {
    /// Shared with the renewal of in-flight slots, which runs without the limiter.
    pub(super) store: Arc<S>,
    pub(super) set: PolicySet,
    /// What runs around the store: block cache and fallback (none by default, so the
    /// plain path costs nothing extra).
    pub(super) guard: Option<Arc<Guard>>,
    /// Live limits, when on ([`LimiterBuilder::live_limits`](super::LimiterBuilder::live_limits)).
    pub(super) limits: Option<Arc<LiveLimits>>,
}

/// The limiter's local helpers, shared by every pending check.
#[derive(Debug)]
pub(super) struct Guard {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) blocks: Option<BlockCache>,
    pub(super) fallback: Option<MemoryStore>,
    /// This limiter's leases, when on.
    pub(super) leases: Option<Arc<LeaseTable>>,
    /// The slots this instance holds, when the set has in-flight policies.
    pub(super) slots: Option<Arc<SlotTable>>,
}

impl<S> Limiter<S> {
    /// This limiter's leases, when on.
    #[cfg(feature = "internals")]
    pub(crate) fn lease_table(&self) -> Option<&LeaseTable> {
        self.guard.as_ref()?.leases.as_deref()
    }

    /// The slots this instance holds, when the set has in-flight policies.
    pub(crate) fn slot_table(&self) -> Option<&Arc<SlotTable>> {
        self.guard.as_ref()?.slots.as_ref()
    }

    /// The memory fallback, when set.
    pub(crate) fn fallback(&self) -> Option<&MemoryStore> {
        self.guard.as_ref()?.fallback.as_ref()
    }

    /// The policies checked, in order.
    pub fn policies(&self) -> &[Policy] {
        self.set.policies()
    }

    /// The policies with their fingerprint, as stores see them.
    pub(crate) fn policy_set(&self) -> &PolicySet {
        &self.set
    }

    /// `cost` as the stores take it, or why no policy set could ever admit it.
    #[inline]
    pub(crate) fn valid_cost(&self, cost: u32) -> Result<u64, Error> {
        valid_cost_in(&self.set, cost)
    }

    /// What a call for `subject` of `cost` runs against: the subject narrowed to the
    /// scopes the policies count (a limiter whose policies name no scope counts the
    /// key alone, whatever rides beside it), and, when live limits are on and the
    /// subject has some, the policy set with them (`None`: the limiter's own). A live
    /// limit below `cost` is [`Error::CostTooHigh`], as a policy's own would be.
    #[inline]
    pub(crate) fn prepare(
        &self,
        subject: Subject,
        cost: u64,
    ) -> Result<(Subject, Option<PolicySet>), Error> {
        let subject = if subject.is_scoped() || self.set.is_scoped() {
            subject
                .narrowed(self.set.scopes())
                .map_err(|scope| Error::MissingScope(scope.to_owned()))?
        } else {
            subject
        };
        let Some(limits) = &self.limits else {
            return Ok((subject, None));
        };
        let set = limits.set_for(&self.set, &subject);
        if let Some(set) = &set {
            valid_cost_in(set, u32::try_from(cost).unwrap_or(u32::MAX))?;
        }
        Ok((subject, set))
    }
}

/// `cost` as the stores take it under `set`, or why `set` could never admit it.
#[inline]
fn valid_cost_in(set: &PolicySet, cost: u32) -> Result<u64, Error> {
    let cost = u64::from(cost);
    if cost == 0 {
        return Err(Error::ZeroCost);
    }
    if cost > set.max_cost() {
        let policy = set
            .policies()
            .iter()
            .find(|p| p.max_cost() < cost)
            .map(|p| p.name().to_owned())
            .unwrap_or_default();
        return Err(Error::CostTooHigh {
            cost,
            max: set.max_cost(),
            policy,
        });
    }
    Ok(cost)
}
