//! Token bucket as GCRA: one theoretical arrival time (TAT) in microseconds. The Rust
//! twin of `lua/token_bucket.lua`; the script keeps the TAT as a decimal integer.

use super::state::{Commit, State, Step, MAX_CLOCK_BACK, MAX_DEBT};
use crate::decision::PolicyOutcome;
use crate::policy::Policy;

#[inline(always)]
pub(super) fn decide(policy: &Policy, state: Option<&State>, now_ms: u64, cost: u64) -> Step {
    let t = policy.emission_interval_us();
    let tolerance = policy.limit() * t;
    let asked = now_ms * 1_000;
    let (now, tat) = current(state, asked, tolerance);
    let new_tat = tat + cost * t;
    let allowed = new_tat - now <= tolerance;
    let kept = if allowed { new_tat } else { tat };
    // Waits are counted from the time asked: a clamped clock waits for the stored
    // time too.
    let reset = (kept - asked).div_ceil(1_000);
    Step {
        outcome: PolicyOutcome {
            allowed,
            limit: policy.limit(),
            remaining: (tolerance - (kept - now)) / t,
            reset_after_ms: reset,
            retry_after_ms: if allowed {
                0
            } else {
                (new_tat - tolerance - asked).div_ceil(1_000)
            },
        },
        commit: allowed.then_some(Commit::Set(State::TokenBucket { tat_us: kept })),
        ttl_ms: reset,
    }
}

/// The time the bucket decides at and its arrival time, for a check asked at `asked`
/// (µs): a clock that went back is clamped to the last moment the stored state can
/// describe (an empty bucket), so the bucket never looks fuller; foreign state reads
/// as a full bucket. What the check and the charge read alike.
#[inline(always)]
fn current(state: Option<&State>, asked: u64, tolerance: u64) -> (u64, u64) {
    match state {
        Some(State::TokenBucket { tat_us }) if !ahead(*tat_us, asked, tolerance) => {
            let now = asked.max(tat_us.saturating_sub(tolerance));
            (now, (*tat_us).max(now))
        }
        _ => (asked, asked),
    }
}

/// Whether a stored arrival time lies more than `MAX_CLOCK_BACK + 1` fill times
/// (`tolerance`) after `now`: a bucket admits up to one fill time ahead, so only a
/// clock that went back by more than [`MAX_CLOCK_BACK`] fill
/// times sees this: foreign state, read as a full bucket.
#[inline(always)]
fn ahead(tat_us: u64, now_us: u64, tolerance: u64) -> bool {
    tat_us.saturating_sub(now_us) > (MAX_CLOCK_BACK + 1) * tolerance
}

/// The theoretical arrival time moves back by `cost` emission intervals, not before
/// now (now clamped as the check clamps it when the clock went back).
pub(super) fn refund(policy: &Policy, tat_us: u64, now: u64, cost: u64) -> Option<State> {
    let t = policy.emission_interval_us();
    if ahead(tat_us, now * 1_000, policy.limit() * t) {
        return None;
    }
    let now = (now * 1_000).max(tat_us.saturating_sub(policy.limit() * t));
    let back = tat_us.saturating_sub(cost * t).max(now);
    (back < tat_us).then_some(State::TokenBucket { tat_us: back })
}

/// The theoretical arrival time becomes `max(tat, now) + cost` emission intervals, at
/// most [`MAX_DEBT`] fill times after the time asked (a check reads state more than
/// `MAX_CLOCK_BACK + 1` fill times ahead as foreign); kept until it has passed.
pub(super) fn charge(
    policy: &Policy,
    state: Option<&State>,
    now_ms: u64,
    cost: u64,
) -> (State, u64) {
    let t = policy.emission_interval_us();
    let tolerance = policy.limit() * t;
    let asked = now_ms * 1_000;
    let (_, tat) = current(state, asked, tolerance);
    let most = asked + MAX_DEBT * tolerance;
    // More than `MAX_DEBT` fills' worth cannot fit: `cost * t` stays small.
    let cost = cost.min(MAX_DEBT * policy.limit());
    let charged = tat.max(most.min(tat + cost * t));
    (
        State::TokenBucket { tat_us: charged },
        (charged - asked).div_ceil(1_000),
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{charged_after, readmitted_at, refunded_after, run};
    use super::*;
    use std::time::Duration;

    fn admitted(outcomes: &[PolicyOutcome]) -> usize {
        outcomes.iter().filter(|o| o.allowed).count()
    }

    #[test]
    fn token_bucket_bursts_then_refills_at_the_rate() {
        let p = Policy::token_bucket("p", 10, 1, Duration::from_secs(1)).unwrap();
        let steps: Vec<_> = (0..11)
            .map(|_| (0, 1))
            .chain([(999, 1), (1_000, 1)])
            .collect();
        let out = run(&p, &steps);
        assert_eq!(admitted(&out[..10]), 10);
        assert!(!out[10].allowed);
        assert_eq!(out[10].retry_after_ms, 1_000);
        assert!(!out[11].allowed);
        assert!(out[12].allowed);
        assert_eq!(out[9].remaining, 0);
        assert_eq!(out[0].remaining, 9);
    }

    #[test]
    fn a_refund_moves_the_arrival_time_back_not_before_now() {
        let tb = Policy::token_bucket("tb", 4, 1, Duration::from_secs(1)).unwrap();
        assert_eq!(
            refunded_after(&tb, &[(0, 3)], 0, 1),
            Some(State::TokenBucket { tat_us: 2_000_000 })
        );
        assert_eq!(
            refunded_after(&tb, &[(0, 3)], 500, 4),
            Some(State::TokenBucket { tat_us: 500_000 }),
            "not before now"
        );
        assert_eq!(refunded_after(&tb, &[(0, 1)], 2_000, 1), None);
    }

    #[test]
    fn a_charge_past_the_limit_moves_the_arrival_time_past_the_tolerance() {
        let tb = Policy::token_bucket("tb", 4, 1, Duration::from_secs(1)).unwrap();
        // 6 from a full bucket of 4: 2 owed; one token a second.
        let (charged, ttl) = charged_after(&tb, &[], 0, 6);
        assert_eq!(charged, State::TokenBucket { tat_us: 6_000_000 });
        assert_eq!(ttl, 6_000);
        assert_eq!(readmitted_at(&tb, &charged, ttl, 0), 3_000);
        // From max(tat, now): a bucket refilled since is charged from now.
        assert_eq!(
            charged_after(&tb, &[(0, 1)], 5_000, 2).0,
            State::TokenBucket { tat_us: 7_000_000 }
        );
        // At most MAX_DEBT fill times ahead.
        assert_eq!(
            charged_after(&tb, &[(0, 4)], 1_000, u64::MAX).0,
            State::TokenBucket { tat_us: 17_000_000 }
        );
    }
}
