//! What the limiter decided, with everything the headers and the caller need.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::policy::Policy;

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// The limiter's store (Redis or memory).
    Store,
    /// The local block cache: the store denied this subject earlier and its retry time
    /// has not come.
    BlockCache,
    /// The local fallback store, deciding while the main store fails.
    Fallback,
    /// This instance's lease of the subject's units ([`crate::lease`]): admitted from
    /// units taken from the store earlier, or denied from the store's denial kept
    /// until the instance asks again.
    Lease,
    /// Nobody: the store failed (or timed out) with no fallback, and
    /// the layer's open failure mode (`FailureMode::Open`) let the request through
    /// unchecked. Such a decision is allowed and knows no figures: see
    /// [`Decision::is_checked`].
    FailOpen,
}

impl Origin {
    /// A short stable name, for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Origin::Store => "store",
            Origin::BlockCache => "block_cache",
            Origin::Fallback => "fallback",
            Origin::Lease => "lease",
            Origin::FailOpen => "fail_open",
        }
    }
}

/// One policy's verdict, in the integers both stores produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyOutcome {
    /// Whether this policy admits the request.
    pub allowed: bool,
    /// The policy's limit (capacity for a token bucket).
    pub limit: u64,
    /// Units left after this request if the decision admits it; when it denies,
    /// nothing is taken, and this is what is left now.
    pub remaining: u64,
    /// Milliseconds until the subject's state for this policy is back to unused.
    pub reset_after_ms: u64,
    /// Milliseconds until the same request would be admitted (0 when allowed).
    pub retry_after_ms: u64,
}

/// The limiter's answer for one request, over all its policies.
///
/// When denied, it describes the policy that denied with the longest wait (the one the
/// client must wait for); when allowed, the policy with the fewest units left. Shadow
/// policies ([`Policy::shadow`]) never deny and never bind (unless every policy is a
/// shadow): a request only they would deny is allowed, and
/// [`Decision::would_deny`] says so.
#[derive(Debug, Clone, Eq)]
pub struct Decision {
    allowed: bool,
    origin: Origin,
    /// Index of the binding policy in `policies` (never empty: a limiter has at least
    /// one policy by construction).
    index: usize,
    outcome: PolicyOutcome,
    /// The shadow policy that would have denied this allowed request (the longest
    /// wait among them), if any.
    shadow_denier: Option<usize>,
    policies: Arc<[Policy]>,
    /// Every policy's outcome, as its store answered, when there is more than one
    /// (the `RateLimit` header shows each budget) and in the admin operations'
    /// answers; a decision of one policy keeps it alone, with no allocation.
    each: Option<Arc<[PolicyOutcome]>>,
}

/// Equal when they decide alike: the same verdict, binding policy and figures, origin
/// and policies. [`Decision::each_policy`] is not compared: the other policies'
/// figures inform a client, they do not decide (a peek equals the check it foretells).
impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.origin == other.origin
            && self.index == other.index
            && self.outcome == other.outcome
            && self.shadow_denier == other.shadow_denier
            && self.policies == other.policies
    }
}

impl Decision {
    /// Folds per-policy outcomes (in `policies` order) of a check of `cost` into one
    /// decision.
    ///
    /// Both stores use this, so the choice of the binding policy is made in one place.
    pub(crate) fn from_outcomes(
        policies: &Arc<[Policy]>,
        outcomes: impl IntoIterator<Item = PolicyOutcome>,
        cost: u64,
    ) -> Self {
        let mut outcomes = outcomes.into_iter();
        if policies.len() == 1 {
            if let Some(outcome) = outcomes.next() {
                return Self::from_outcome(policies, outcome);
            }
        }
        Self::fold(policies, outcomes, cost)
    }

    /// The general rule of [`Decision::from_outcomes`], over any number of policies.
    fn fold(
        policies: &Arc<[Policy]>,
        outcomes: impl Iterator<Item = PolicyOutcome>,
        cost: u64,
    ) -> Self {
        // The binding policy among the enforced ones (among all when every policy is a
        // shadow, read as admitting); the shadow denier with the longest wait apart.
        let mut best: Option<(usize, PolicyOutcome)> = None;
        let mut shadow: Option<(usize, u64)> = None;
        let mut allowed = true;
        let all_shadow = policies.iter().all(Policy::is_shadow);
        let mut each: SmallVec<[PolicyOutcome; 4]> = SmallVec::new();
        for (i, mut o) in outcomes.enumerate() {
            each.push(o);
            if policies.get(i).is_some_and(Policy::is_shadow) {
                if !o.allowed && shadow.is_none_or(|(_, wait)| o.retry_after_ms > wait) {
                    shadow = Some((i, o.retry_after_ms));
                }
                if !all_shadow {
                    continue;
                }
                o.allowed = true;
                o.retry_after_ms = 0;
            }
            allowed &= o.allowed;
            let better = match &best {
                None => true,
                Some((_, b)) => match (o.allowed, b.allowed) {
                    (false, true) => true,
                    (false, false) => o.retry_after_ms > b.retry_after_ms,
                    (true, true) => o.remaining < b.remaining,
                    (true, false) => false,
                },
            };
            if better {
                best = Some((i, o));
            }
        }
        if !allowed {
            // Nothing was taken: a policy that would have admitted still has the
            // units (the slot) its outcome counted as spent.
            for (policy, o) in policies.iter().zip(each.iter_mut()) {
                if o.allowed {
                    let units = policy.units_taken(cost);
                    o.remaining = o.remaining.saturating_add(units).min(o.limit);
                }
            }
        }
        let (index, outcome) = best.unwrap_or((
            0,
            PolicyOutcome {
                allowed: true,
                limit: 0,
                remaining: 0,
                reset_after_ms: 0,
                retry_after_ms: 0,
            },
        ));
        Self {
            allowed,
            origin: Origin::Store,
            index,
            outcome,
            // Only a request that is allowed was spared by shadow mode.
            shadow_denier: if allowed {
                shadow.map(|(i, _)| i)
            } else {
                None
            },
            policies: Arc::clone(policies),
            each: Some(Arc::from(each.as_slice())),
        }
    }

    /// [`Decision::from_outcomes`] for a set of one policy (the common case), with no
    /// loop: a lone shadow policy binds, admitting, and names itself when it would deny.
    #[inline]
    pub(crate) fn from_outcome(policies: &Arc<[Policy]>, mut outcome: PolicyOutcome) -> Self {
        let mut shadow_denier = None;
        if policies.first().is_some_and(Policy::is_shadow) {
            if !outcome.allowed {
                shadow_denier = Some(0);
            }
            outcome.allowed = true;
            outcome.retry_after_ms = 0;
        }
        Self {
            allowed: outcome.allowed,
            origin: Origin::Store,
            index: 0,
            outcome,
            shadow_denier,
            policies: Arc::clone(policies),
            each: None,
        }
    }

    /// A cached denial seen again, `retry_ms` before its retry time and `reset_ms`
    /// before its reset time.
    pub(crate) fn rebase(&mut self, retry_ms: u64, reset_ms: u64, origin: Origin) {
        self.age_others(reset_ms);
        self.outcome.retry_after_ms = retry_ms;
        self.outcome.reset_after_ms = reset_ms;
        self.origin = origin;
    }

    /// An admission seen again from a lease: `remaining` units known left and
    /// `reset_ms` before the reset time.
    pub(crate) fn rebase_allowed(&mut self, remaining: u64, reset_ms: u64, origin: Origin) {
        self.age_others(reset_ms);
        self.outcome.remaining = remaining;
        self.outcome.reset_after_ms = reset_ms;
        self.origin = origin;
    }

    /// Counts the other policies' waits from now too, when the binding one's reset,
    /// a fixed time, is `reset_ms` away: they are as much older. Their units are as
    /// the store last told (a denial consumed none; what refilled since is not
    /// shown, so a client is never told of more than there is).
    fn age_others(&mut self, reset_ms: u64) {
        let Some(each) = &self.each else {
            return;
        };
        let aged = self.outcome.reset_after_ms.saturating_sub(reset_ms);
        if aged == 0 {
            return;
        }
        self.each = Some(
            each.iter()
                .map(|o| PolicyOutcome {
                    reset_after_ms: o.reset_after_ms.saturating_sub(aged),
                    retry_after_ms: o.retry_after_ms.saturating_sub(aged),
                    ..*o
                })
                .collect(),
        );
    }

    /// The decision of a request let through because the store could not decide: allowed,
    /// nothing consumed, and no figure known (remaining, reset and retry read 0, the
    /// limit is the first policy's).
    pub(crate) fn fail_open(policies: &Arc<[Policy]>) -> Self {
        Self {
            allowed: true,
            origin: Origin::FailOpen,
            index: 0,
            outcome: PolicyOutcome {
                allowed: true,
                limit: policies.first().map_or(0, Policy::limit),
                remaining: 0,
                reset_after_ms: 0,
                retry_after_ms: 0,
            },
            shadow_denier: None,
            policies: Arc::clone(policies),
            each: None,
        }
    }

    /// This decision with every policy's outcome (an admin operation's answer): a
    /// decision of several has them already; one of one policy gets its own, as the
    /// store gave it.
    pub(crate) fn with_each(mut self, outcomes: Arc<[PolicyOutcome]>) -> Self {
        if self.each.is_none() {
            self.each = Some(outcomes);
        }
        self
    }

    pub(crate) fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// Who decided: the store, the local block cache, or the local fallback store.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether the request may pass.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether a store (or the block cache, or the fallback) decided this request.
    ///
    /// `false` only for [`Origin::FailOpen`]: the store failed and the layer let the
    /// request through unchecked. Then [`remaining`](Decision::remaining),
    /// [`reset_after`](Decision::reset_after) and [`outcome`](Decision::outcome) say
    /// nothing about the subject (they read 0), so a handler that shows them checks
    /// this first:
    ///
    /// ```
    /// # fn show(decision: &redlimit::Decision) -> String {
    /// if decision.is_checked() {
    ///     format!("{} left", decision.remaining())
    /// } else {
    ///     "not counted: the rate limiter is unavailable".to_owned()
    /// }
    /// # }
    /// ```
    pub fn is_checked(&self) -> bool {
        self.origin != Origin::FailOpen
    }

    /// The policy this decision describes: the denier, or the tightest one.
    pub fn policy(&self) -> &Policy {
        &self.policies[self.index]
    }

    /// The binding policy's position among [`Decision::policies`].
    pub fn policy_index(&self) -> usize {
        self.index
    }

    /// All policies the limiter checked, for `RateLimit-Policy`.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The binding policy's verdict as raw integers.
    pub fn outcome(&self) -> &PolicyOutcome {
        &self.outcome
    }

    /// Every policy's verdict, in the order of [`policies`](Decision::policies), as
    /// the store gave it (a shadow policy's own, even where the decision reads it as
    /// admitting): in every decision over more than one policy, and in the answers of
    /// [`Limiter::peek`](crate::Limiter::peek), [`refund`](crate::Limiter::refund) and
    /// the other admin operations (a usage page showing each budget). `None` for a
    /// check of one policy, whose one verdict is [`outcome`](Decision::outcome).
    pub fn each_policy(&self) -> Option<&[PolicyOutcome]> {
        self.each.as_deref()
    }

    /// [`Decision::each_policy`], shared (the response headers carry it).
    pub(crate) fn each_outcomes(&self) -> Option<Arc<[PolicyOutcome]>> {
        self.each.clone()
    }

    /// The binding policy's limit.
    pub fn limit(&self) -> u64 {
        self.outcome.limit
    }

    /// Units left in the binding policy (0, meaning unknown, when not
    /// [checked](Decision::is_checked)).
    pub fn remaining(&self) -> u64 {
        self.outcome.remaining
    }

    /// Time until the binding policy's state is back to unused.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.outcome.reset_after_ms)
    }

    /// When denied, how long until the same request would be admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_millis(self.outcome.retry_after_ms))
    }

    /// The name of the policy that denied, if any.
    pub fn denied_by(&self) -> Option<&str> {
        (!self.allowed).then(|| self.policy().name())
    }

    /// Whether a shadow policy would have denied this allowed request, had it been
    /// enforced. Always `false` for a denied request.
    pub fn would_deny(&self) -> bool {
        self.shadow_denier.is_some()
    }

    /// Whether policy `i`, a shadow, would have refused this allowed request, so took
    /// nothing for it (an in-flight one, no slot): what enforcing it would have kept.
    pub(crate) fn spared_by(&self, i: usize) -> bool {
        let shadow = self.policies.get(i).is_some_and(Policy::is_shadow);
        self.allowed
            && shadow
            && match &self.each {
                Some(each) => each.get(i).is_some_and(|o| !o.allowed),
                None => self.shadow_denier == Some(i),
            }
    }

    /// The shadow policy that would have denied this allowed request (the one with
    /// the longest wait), if any.
    pub fn shadow_denied_by(&self) -> Option<&str> {
        self.shadow_denier
            .and_then(|i| self.policies.get(i))
            .map(Policy::name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn outcome(allowed: bool, remaining: u64, retry: u64) -> PolicyOutcome {
        PolicyOutcome {
            allowed,
            limit: 10,
            remaining,
            reset_after_ms: 1_000,
            retry_after_ms: retry,
        }
    }

    #[test]
    fn a_shadow_denial_is_allowed_and_named() {
        let s = Duration::from_secs(1);
        let policies: Arc<[Policy]> = vec![
            Policy::fixed_window("real", 10, s).unwrap(),
            Policy::fixed_window("trial", 10, s).unwrap().shadow(),
        ]
        .into();
        let d =
            Decision::from_outcomes(&policies, [outcome(true, 4, 0), outcome(false, 0, 300)], 1);
        assert!(d.is_allowed());
        assert!(d.would_deny());
        assert_eq!(d.shadow_denied_by(), Some("trial"));
        assert_eq!(d.policy().name(), "real", "a shadow never binds");
        assert_eq!(d.retry_after(), None);
        // Denied by the enforced one: denied, and nothing was spared by shadow mode.
        let d = Decision::from_outcomes(
            &policies,
            [outcome(false, 0, 50), outcome(false, 0, 300)],
            1,
        );
        assert_eq!(d.denied_by(), Some("real"));
        assert!(!d.would_deny());
        // Only shadows: allowed, and the tightest one describes it.
        let only: Arc<[Policy]> = vec![Policy::fixed_window("t", 10, s).unwrap().shadow()].into();
        let d = Decision::from_outcomes(&only, [outcome(false, 0, 300)], 1);
        assert!(d.is_allowed());
        assert_eq!(d.shadow_denied_by(), Some("t"));
        assert_eq!(d.outcome().retry_after_ms, 0);
    }

    #[test]
    fn a_shadow_in_flight_denial_spares_its_slot_whoever_is_named() {
        let s = Duration::from_secs(1);
        let policies: Arc<[Policy]> = vec![
            Policy::fixed_window("rate", 10, s).unwrap().shadow(),
            Policy::in_flight("running", 3, s).unwrap().shadow(),
        ]
        .into();
        // The rate's longer wait names it, and the slot is still spared.
        let d =
            Decision::from_outcomes(&policies, [outcome(false, 0, 900), outcome(false, 0, 5)], 1);
        assert_eq!(d.shadow_denied_by(), Some("rate"));
        assert!(d.spared_by(1));
        let d =
            Decision::from_outcomes(&policies, [outcome(false, 0, 900), outcome(true, 1, 0)], 1);
        assert!(d.would_deny() && !d.spared_by(1));
        let alone: Arc<[Policy]> =
            vec![Policy::in_flight("running", 3, s).unwrap().shadow()].into();
        assert!(Decision::from_outcomes(&alone, [outcome(false, 0, 5)], 1).spared_by(0));
        assert!(!Decision::from_outcomes(&alone, [outcome(true, 2, 0)], 1).spared_by(0));
        // An enforced policy never spares: its denial is the decision.
        let enforced: Arc<[Policy]> = vec![Policy::in_flight("running", 3, s).unwrap()].into();
        assert!(!Decision::from_outcomes(&enforced, [outcome(false, 0, 5)], 1).spared_by(0));
    }

    #[test]
    fn one_policy_decides_as_the_general_rule_does() {
        let s = Duration::from_secs(1);
        for shadow in [false, true] {
            let policy = Policy::fixed_window("p", 10, s).unwrap().enforce(!shadow);
            let policies: Arc<[Policy]> = vec![policy].into();
            for o in [outcome(true, 4, 0), outcome(false, 0, 300)] {
                assert_eq!(
                    Decision::from_outcome(&policies, o),
                    Decision::fold(&policies, [o].into_iter(), 1),
                    "shadow {shadow}, {o:?}"
                );
            }
        }
    }

    #[test]
    fn every_policy_is_kept_and_a_denial_spends_nothing_of_the_others() {
        let s = Duration::from_secs(1);
        let policies: Arc<[Policy]> = vec![
            Policy::fixed_window("minute", 10, s).unwrap(),
            Policy::in_flight("slots", 10, s).unwrap(),
            Policy::fixed_window("second", 10, s).unwrap(),
        ]
        .into();
        let admitted = [
            outcome(true, 4, 0),
            outcome(true, 7, 0),
            outcome(true, 2, 0),
        ];
        let d = Decision::from_outcomes(&policies, admitted, 3);
        assert_eq!(d.each_policy(), Some(&admitted[..]));
        // "second" denies a cost of 3: "minute" still has the 3 its outcome counted
        // as spent, "slots" the one slot.
        let d = Decision::from_outcomes(
            &policies,
            [
                outcome(true, 4, 0),
                outcome(true, 7, 0),
                outcome(false, 2, 500),
            ],
            3,
        );
        let left: Vec<u64> = d
            .each_policy()
            .unwrap()
            .iter()
            .map(|o| o.remaining)
            .collect();
        assert_eq!(left, [7, 8, 2]);
        assert_eq!(d.denied_by(), Some("second"));
        // One policy alone allocates nothing.
        let one: Arc<[Policy]> = vec![Policy::fixed_window("one", 10, s).unwrap()].into();
        assert!(Decision::from_outcomes(&one, [outcome(true, 4, 0)], 1)
            .each_policy()
            .is_none());
    }

    #[test]
    fn a_decision_seen_again_ages_every_policy_s_waits() {
        let s = Duration::from_secs(1);
        let policies: Arc<[Policy]> = vec![
            Policy::fixed_window("a", 10, s).unwrap(),
            Policy::fixed_window("b", 10, s).unwrap(),
        ]
        .into();
        let waiting = |retry| PolicyOutcome {
            reset_after_ms: 2_000,
            ..outcome(false, 0, retry)
        };
        let mut d = Decision::from_outcomes(&policies, [waiting(900), waiting(1_500)], 1);
        assert_eq!(d.policy().name(), "b");
        // Seen again 400 ms later, from the block cache.
        d.rebase(1_100, 1_600, Origin::BlockCache);
        let each = d.each_policy().unwrap();
        assert_eq!(
            each.iter()
                .map(|o| (o.retry_after_ms, o.reset_after_ms))
                .collect::<Vec<_>>(),
            [(500, 1_600), (1_100, 1_600)]
        );
    }
}
