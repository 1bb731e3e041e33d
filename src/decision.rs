//! What the limiter decided, with everything the headers and the caller need.

use std::sync::Arc;
use std::time::Duration;

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
}

impl Origin {
    /// A short stable name, for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Origin::Store => "store",
            Origin::BlockCache => "block_cache",
            Origin::Fallback => "fallback",
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
    /// Units left after this request (before it, when denied).
    pub remaining: u64,
    /// Milliseconds until the subject's state for this policy is back to unused.
    pub reset_after_ms: u64,
    /// Milliseconds until the same request would be admitted (0 when allowed).
    pub retry_after_ms: u64,
}

/// The limiter's answer for one request, over all its policies.
///
/// When denied, it describes the policy that denied with the longest wait (the one the
/// client must wait for); when allowed, the policy with the fewest units left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    origin: Origin,
    /// Index of the binding policy in `policies` (never empty: a limiter has at least
    /// one policy by construction).
    index: usize,
    outcome: PolicyOutcome,
    policies: Arc<[Policy]>,
}

impl Decision {
    /// Folds per-policy outcomes (in `policies` order) into one decision.
    ///
    /// Both stores use this, so the choice of the binding policy is made in one place.
    pub(crate) fn from_outcomes(
        policies: &Arc<[Policy]>,
        outcomes: impl IntoIterator<Item = PolicyOutcome>,
    ) -> Self {
        let mut best: Option<(usize, PolicyOutcome)> = None;
        let mut allowed = true;
        for (i, o) in outcomes.into_iter().enumerate() {
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
            policies: Arc::clone(policies),
        }
    }

    /// A cached denial seen `elapsed_ms` later, `retry_ms` before its retry time.
    pub(crate) fn rebase(&mut self, retry_ms: u64, elapsed_ms: u64, origin: Origin) {
        self.outcome.retry_after_ms = retry_ms;
        self.outcome.reset_after_ms = self.outcome.reset_after_ms.saturating_sub(elapsed_ms);
        self.origin = origin;
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

    /// The binding policy's limit.
    pub fn limit(&self) -> u64 {
        self.outcome.limit
    }

    /// Units left in the binding policy.
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
}
