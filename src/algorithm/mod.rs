//! The algorithms as pure functions of (policy, state, now, cost): the five that count
//! units over time (the calendar quota among them) and the one that counts requests
//! running now, one file each,
//! mirroring `lua/` file for file.
//!
//! This is the one Rust truth of each algorithm: the memory store keeps these states in
//! a map, and the Lua scripts in `lua/` are line-for-line translations of the same
//! arithmetic (integers only, exact in Lua's doubles because policies keep every
//! product under 2^53). The conformance suite runs both on the same traces.
//!
//! A decision never changes state when it denies, so a request that one of several
//! policies denies can be rolled back simply by not committing the others.
//!
//! Several policies decide together by one rule ([`decide_all`]): each policy whose
//! step admits commits it if every enforced policy admits. Enforced policies are thus
//! all or nothing among themselves, and a shadow policy consumes exactly when enforcing
//! it would have: when it admits and the enforced ones do.
//!
//! Beside the check, [`refund`] gives back what a check consumed (the admin operation
//! of [`Limiter::refund`](crate::Limiter::refund)), [`charge`] consumes whatever the
//! limit (a debt, for a request that cost more than it reserved); a peek is a check
//! whose commit is dropped, and a reset forgets the state.

use smallvec::SmallVec;

use crate::decision::PolicyOutcome;
use crate::policy::{Algorithm, Policy};

pub(crate) mod calendar;
mod fixed_window;
pub(crate) mod grant;
pub(crate) mod in_flight;
mod sliding_log;
mod sliding_window;
mod state;
mod token_bucket;

pub(crate) use grant::Grant;
#[cfg(all(feature = "redis", any(test, feature = "internals")))]
pub(crate) use sliding_log::ring_stamps as sliding_log_ring_stamps;
#[cfg(all(feature = "redis", any(test, feature = "internals")))]
pub(crate) use state::Holder;
#[cfg(feature = "redis")]
pub(crate) use state::MAX_CLOCK_BACK;
#[cfg(any(test, feature = "redis"))]
pub(crate) use state::MAX_DEBT;
pub(crate) use state::{State, Step};

/// The conformance table the stores are held to (tests/it/conformance.rs, through
/// `redlimit::internals::traces`), checked here against the model itself.
#[cfg(any(test, feature = "internals"))]
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
pub mod traces;

/// Decides one policy. `state` is `None` for a subject never seen (or expired).
///
/// `cost` must be at least 1 and at most `policy.max_cost()`; the limiter checks that.
#[inline]
pub(crate) fn decide(policy: &Policy, state: Option<&State>, now_ms: u64, cost: u64) -> Step {
    // A policy counting requests takes one whatever the cost.
    let cost = policy.units_taken(cost);
    match policy.algorithm() {
        Algorithm::FixedWindow => fixed_window::decide(policy, state, now_ms, cost),
        Algorithm::SlidingWindow => sliding_window::decide(policy, state, now_ms, cost),
        Algorithm::TokenBucket => token_bucket::decide(policy, state, now_ms, cost),
        Algorithm::SlidingLog => sliding_log::decide(policy, state, now_ms, cost),
        // A request takes one slot whatever its cost.
        Algorithm::InFlight => in_flight::decide(policy, state, now_ms),
        Algorithm::Calendar => calendar::decide(policy, state, now_ms, cost),
    }
}

/// The outcomes of a check of every policy, in order (inline for up to two).
pub(crate) type Outcomes = SmallVec<[PolicyOutcome; 2]>;

/// A check of every policy on `states` (one per policy, in order), all or nothing:
/// every policy decides, then, only if every enforced (non-shadow) policy admits, each
/// policy that admits commits its step, shadow ones included. Returns the outcomes and,
/// when something was committed, the longest time (ms from `now`) a committed state
/// must be kept.
///
/// The one Rust writing of the rule `lua/main.lua` follows: the memory store and the
/// model's tests both decide through it.
pub(crate) fn decide_all(
    policies: &[Policy],
    states: &mut [Option<State>],
    now: u64,
    cost: u64,
) -> (Outcomes, Option<u64>) {
    if let ([policy], [state]) = (policies, &mut *states) {
        let (outcome, keep) = decide_one(policy, state, now, cost);
        return (smallvec::smallvec![outcome], keep);
    }
    decide_each(policies, states, now, cost)
}

/// [`decide_all`] by its rule as written, for any number of policies: every step
/// first, then the commits.
fn decide_each(
    policies: &[Policy],
    states: &mut [Option<State>],
    now: u64,
    cost: u64,
) -> (Outcomes, Option<u64>) {
    let mut steps: SmallVec<[Step; 2]> = policies
        .iter()
        .zip(states.iter())
        .map(|(policy, state)| decide(policy, state.as_ref(), now, cost))
        .collect();
    let outcomes: Outcomes = steps.iter().map(|step| step.outcome).collect();
    let admitted = policies
        .iter()
        .zip(&outcomes)
        .all(|(policy, outcome)| outcome.allowed || policy.is_shadow());
    let mut keep = None;
    if admitted {
        for (state, step) in states.iter_mut().zip(steps.iter_mut()) {
            if let Some(commit) = step.commit.take() {
                commit.apply(state);
                keep = Some(keep.unwrap_or(0).max(step.ttl_ms.max(1)));
            }
        }
    }
    (outcomes, keep)
}

/// [`decide_all`] for a set of one policy, without collecting steps: the step commits
/// exactly when it admits (a lone shadow policy admits when enforcing it would). Returns
/// the outcome and, when committed, how long (ms from `now`) the state must be kept.
///
/// [`decide`] is inlined here with each algorithm's step, so a `Step` and its `Commit`
/// need never exist in memory: the commit becomes a store of the new state.
#[inline]
pub(crate) fn decide_one(
    policy: &Policy,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
) -> (PolicyOutcome, Option<u64>) {
    let step = decide(policy, state.as_ref(), now, cost);
    let keep = step.commit.map(|commit| {
        commit.apply(state);
        step.ttl_ms.max(1)
    });
    (step.outcome, keep)
}

/// A leasing check: [`decide_all`] of `cost` plus a lease of up to `want` more units
/// taken from every policy, at most what each admits now. The check admits only if
/// the cost and `batch` more fit every policy; otherwise it is denied, nothing
/// written, with the wait until they do. While a shadow policy would deny, no lease:
/// the cost alone, as a check (shadow reports stay those of checks). The rule
/// `lua/main.lua`'s lease part follows; see [`crate::lease`].
///
/// The grant never exceeds a policy's `remaining` after the cost, which is exactly
/// what that policy admits on top of it, so deciding `cost + grant` admits again.
pub(crate) fn decide_leasing(
    policies: &[Policy],
    states: &mut [Option<State>],
    now: u64,
    cost: u64,
    want: u64,
    batch: u64,
) -> (Outcomes, Option<u64>, Grant) {
    let firsts: Outcomes = policies
        .iter()
        .zip(states.iter())
        .map(|(policy, state)| decide(policy, state.as_ref(), now, cost).outcome)
        .collect();
    let admitted = policies
        .iter()
        .zip(&firsts)
        .all(|(policy, outcome)| outcome.allowed || policy.is_shadow());
    let wait_for_batch = |states: &[Option<State>]| {
        policies
            .iter()
            .zip(states)
            .filter(|(policy, _)| !policy.is_shadow())
            .map(|(policy, state)| {
                decide(policy, state.as_ref(), now, cost + batch)
                    .outcome
                    .retry_after_ms
            })
            .max()
            .unwrap_or(0)
    };
    if !admitted {
        let ask_again_ms = if batch == 0 {
            0
        } else {
            wait_for_batch(states)
        };
        let grant = Grant {
            ask_again_ms,
            ..Grant::default()
        };
        return (firsts, None, grant);
    }
    let shadow_denies = firsts.iter().any(|outcome| !outcome.allowed);
    let room = firsts
        .iter()
        .fold(want, |room, outcome| room.min(outcome.remaining));
    if !shadow_denies && room < batch {
        // Fewer than a batch beyond the cost: denied, nothing written, until the cost
        // and a batch fit.
        let ask_again_ms = wait_for_batch(states);
        let outcomes = policies
            .iter()
            .zip(firsts)
            .map(|(policy, outcome)| {
                if policy.is_shadow() {
                    outcome
                } else {
                    PolicyOutcome {
                        allowed: false,
                        remaining: 0,
                        retry_after_ms: ask_again_ms,
                        ..outcome
                    }
                }
            })
            .collect();
        let grant = Grant {
            ask_again_ms,
            ..Grant::default()
        };
        return (outcomes, None, grant);
    }
    let units = if shadow_denies { 0 } else { room };
    let window_left_ms = policies
        .iter()
        .filter_map(|policy| match policy.algorithm() {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                Some(policy.window_ms() - now % policy.window_ms())
            }
            Algorithm::Calendar => Some(calendar::period_at(policy, now).1 - now),
            _ => None,
        })
        .min();
    let (outcomes, keep) = decide_all(policies, states, now, cost + units);
    let grant = Grant {
        units,
        window_left_ms,
        ask_again_ms: 0,
        window_end_ms: window_left_ms.map(|left| now + left),
        // The store's to give: it keeps the subject's lease generation.
        epoch: 0,
    };
    (outcomes, keep, grant)
}

/// The state after giving back `cost` units, or `None` when there is nothing to give
/// back. The state only shrinks, so the expiry it had still covers it.
///
/// - fixed and sliding window: the current window's count goes down by `cost`, not
///   below 0; if the window has changed since, nothing is refunded;
/// - token bucket: the theoretical arrival time moves back by `cost` emission
///   intervals, not before now;
/// - sliding log: the `cost` most recent stamps are removed, only those still in the
///   window;
/// - calendar quota: as the fixed window, in the current period.
///
/// "Now" is clamped as the check clamps it when the clock went back.
pub(crate) fn refund(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Option<State> {
    // Cost units come back; a request that ran stays counted.
    if policy.counts_requests() {
        return None;
    }
    match state? {
        State::FixedWindow { window, count } => {
            fixed_window::refund(policy, *window, *count, now, cost)
        }
        State::SlidingWindow { window, prev, cur } => {
            sliding_window::refund(policy, (*window, *prev, *cur), now, cost)
        }
        State::TokenBucket { tat_us } => token_bucket::refund(policy, *tat_us, now, cost),
        State::SlidingLog { stamps } => sliding_log::refund(policy, stamps, now, cost),
        State::Calendar { end, count } => calendar::refund(policy, *end, *count, now, cost),
        // Slots are given back by their release, never by a refund of units.
        State::InFlight { .. } => None,
    }
}

/// What a charge of `units` can take at most from any policy of `policies`: the units
/// clamped to the largest [`MAX_DEBT`] bound among them, so that they are exact in the
/// Lua's doubles. A charge of the clamped units is the same charge.
#[cfg(feature = "redis")]
pub(crate) fn charge_units(policies: &[Policy], units: u64) -> u64 {
    let most = policies.iter().filter_map(max_charge).max().unwrap_or(0);
    units.min(most)
}

/// The most a charge takes from `policy` (its [`MAX_DEBT`] bound); `None` for a policy
/// a charge leaves alone: slots are held by requests, never charged.
#[cfg(any(test, feature = "redis"))]
fn max_charge(policy: &Policy) -> Option<u64> {
    (!policy.counts_requests()).then(|| MAX_DEBT * policy.limit())
}

/// The state after consuming `cost` units (any number; at most the [`MAX_DEBT`] bound
/// is taken) whatever the limit, and how long (ms from `now`) it must be kept: a debt
/// the checks after it see. A charge creates state when there is none; it never lowers
/// a state. Nothing is denied.
///
/// - fixed window: the current window's count goes up by `cost` (a new window starts
///   at `cost`); kept to the window's end;
/// - sliding window: the current window's count goes up by `cost`, the windows rolled
///   as the check rolls them; kept as the check keeps it;
/// - token bucket: the theoretical arrival time becomes `max(tat, now) + cost` emission
///   intervals;
/// - sliding log: `cost` stamps at now (the log keeps its last `limit`);
/// - calendar quota: as the fixed window, kept to the period's end.
///
/// "Now" is clamped as the check clamps it when the clock went back, and state a check
/// reads as foreign is charged as fresh state. `None` for an in-flight policy, whose
/// slots are held by requests, never charged: its state stays as it is.
pub(crate) fn charge(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    cost: u64,
) -> Option<(State, u64)> {
    // Cost units are charged; requests are counted by their checks alone.
    if policy.counts_requests() {
        return None;
    }
    let (next, ttl) = match policy.algorithm() {
        Algorithm::FixedWindow => fixed_window::charge(policy, state, now, cost),
        Algorithm::SlidingWindow => sliding_window::charge(policy, state, now, cost),
        Algorithm::TokenBucket => token_bucket::charge(policy, state, now, cost),
        Algorithm::SlidingLog => sliding_log::charge(policy, state, now, cost),
        Algorithm::Calendar => calendar::charge(policy, state, now, cost),
        Algorithm::InFlight => return None,
    };
    Some((next, ttl.max(1)))
}

/// What `change` by this instance's holder makes of `policy`'s `state`, and how long
/// (ms from `now`) it must be kept (`None`: nothing left to keep, the state removed). A
/// policy that counts units has no holders: its state stays as it is, `None`.
pub(crate) fn hold(
    policy: &Policy,
    state: &mut Option<State>,
    now: u64,
    change: in_flight::Hold,
) -> Option<u64> {
    match policy.algorithm() {
        Algorithm::InFlight => {
            let next = in_flight::hold(policy, state.as_ref(), now, change);
            let keep = next.as_ref().map(|(_, ms)| *ms);
            *state = next.map(|(state, _)| state);
            keep
        }
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs one policy over `(time_ms, cost)` steps, keeping state like a store would.
    pub(crate) fn run(policy: &Policy, steps: &[(u64, u64)]) -> Vec<PolicyOutcome> {
        let mut state = None;
        let mut expires = 0;
        steps
            .iter()
            .map(|&(t, cost)| {
                if t >= expires {
                    state = None;
                }
                let step = decide(policy, state.as_ref(), t, cost);
                if let Some(commit) = step.commit {
                    commit.apply(&mut state);
                    expires = t + step.ttl_ms;
                }
                step.outcome
            })
            .collect()
    }

    /// The state after `steps` (each `(time_ms, cost)`), then a refund at `now`.
    pub(crate) fn refunded_after(
        policy: &Policy,
        steps: &[(u64, u64)],
        now: u64,
        cost: u64,
    ) -> Option<State> {
        let mut state = None;
        for &(t, c) in steps {
            if let Some(commit) = decide(policy, state.as_ref(), t, c).commit {
                commit.apply(&mut state);
            }
        }
        refund(policy, state.as_ref(), now, cost)
    }

    /// The state after `steps` (each `(time_ms, cost)`, checks), then a charge of
    /// `units` at `at`.
    pub(crate) fn charged_after(
        policy: &Policy,
        steps: &[(u64, u64)],
        at: u64,
        units: u64,
    ) -> (State, u64) {
        let mut state = None;
        for &(t, c) in steps {
            if let Some(commit) = decide(policy, state.as_ref(), t, c).commit {
                commit.apply(&mut state);
            }
        }
        rate_charge(policy, state.as_ref(), at, units)
    }

    /// [`charge`] of a rate policy, which always takes the charge.
    fn rate_charge(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> (State, u64) {
        charge(policy, state, now, cost).expect("a rate policy is charged")
    }

    #[test]
    fn a_charge_and_a_hold_each_leave_the_other_kind_alone() {
        let s = Duration::from_secs(1);
        let slots = Policy::in_flight("running", 3, s).unwrap();
        let rate = Policy::fixed_window("rate", 3, s).unwrap();
        assert_eq!(charge(&slots, None, 1_000, 5), None);
        assert_eq!(max_charge(&slots), None);
        assert_eq!(max_charge(&rate), Some(MAX_DEBT * 3));
        let mut counted = Some(rate_charge(&rate, None, 1_000, 2).0);
        let before = counted.clone();
        let renewal = in_flight::Hold::Renew { held: 2 };
        assert_eq!(hold(&rate, &mut counted, 1_000, renewal), None);
        assert_eq!(counted, before, "a rate's state is not a holder's");
        let mut held = None;
        assert_eq!(hold(&slots, &mut held, 1_000, renewal), Some(1_000));
        assert!(held.is_some());
    }

    /// When a check of 1 admits again after `charged` (written at `at` and kept `ttl`
    /// ms): the time its denial at `at` names, checked exact, every millisecond
    /// before it denied (never early) and the state kept at least until then.
    pub(crate) fn readmitted_at(policy: &Policy, charged: &State, ttl: u64, at: u64) -> u64 {
        let denied = decide(policy, Some(charged), at, 1).outcome;
        assert!(!denied.allowed, "{policy:?}: a debt denies: {charged:?}");
        let again = at + denied.retry_after_ms;
        for t in at..again {
            let step = decide(policy, Some(charged), t, 1).outcome;
            assert!(!step.allowed, "{policy:?}: admitted at {t}, before {again}");
        }
        assert!(
            decide(policy, Some(charged), again, 1).outcome.allowed,
            "{policy:?}: not admitted at {again}, as retry_after said"
        );
        assert!(
            at + ttl >= again,
            "{policy:?}: dropped at {} before {again}",
            at + ttl
        );
        again
    }

    #[test]
    fn a_huge_charge_denies_within_the_debt_bound_and_no_longer() {
        let s = 1_000;
        for p in boundary_policies() {
            let fill = p.window_ms();
            // Fresh, partly used, and with the clock 1.5 s back of the state.
            for (steps, at) in [
                (&[][..], 5_300),
                (&[(5_000, 3), (5_200, 40)][..], 5_300),
                (&[(6_700, 10)][..], 5_200),
            ] {
                let (charged, ttl) = charged_after(&p, steps, at, u64::MAX);
                // Twice is the same: the bound is reached.
                assert_eq!(
                    rate_charge(&p, Some(&charged), at, u64::MAX).0,
                    charged,
                    "{p:?}"
                );
                let again = readmitted_at(&p, &charged, ttl, at);
                let latest = match p.algorithm() {
                    // The next window (of the stored window, when the clock is behind).
                    Algorithm::FixedWindow => (at.max(steps.last().map_or(0, |s| s.0)) / s + 1) * s,
                    // Within the next window.
                    Algorithm::SlidingWindow => {
                        (at.max(steps.last().map_or(0, |s| s.0)) / s + 2) * s
                    }
                    // MAX_DEBT - 1 fill times and an interval after (the clock behind
                    // the state: the stored time first).
                    Algorithm::TokenBucket => {
                        let base = at.max(steps.last().map_or(0, |s| s.0));
                        base + (MAX_DEBT - 1) * fill + p.emission_interval_us().div_ceil(1_000)
                    }
                    // One window.
                    _ => at.max(steps.last().map_or(0, |s| s.0)) + s,
                };
                assert!(again <= latest, "{p:?} after {steps:?}: {again} > {latest}");
                assert!(again > at, "{p:?}");
                // Never read as foreign: a clock gone back a fill time (less, for
                // windows: the state's own window) still sees the debt.
                let back = match p.algorithm() {
                    Algorithm::TokenBucket => at - fill,
                    _ => at - at % s,
                };
                assert!(
                    !decide(&p, Some(&charged), back, 1).outcome.allowed,
                    "{p:?}: the debt read as foreign at {back}"
                );
            }
        }
    }

    #[test]
    fn charges_add_up_and_foreign_state_is_charged_as_fresh() {
        for p in boundary_policies() {
            // A charge where there is no state makes one; one of 1 then another of 1
            // is a charge of 2.
            let (once, _) = rate_charge(&p, None, 7_000, 2);
            let (one, _) = rate_charge(&p, None, 7_000, 1);
            assert_eq!(rate_charge(&p, Some(&one), 7_000, 1).0, once, "{p:?}");
            // Foreign state (far ahead) is charged as fresh state.
            let (far, _) = rate_charge(&p, None, 900_000, 1);
            assert_eq!(rate_charge(&p, Some(&far), 7_000, 2).0, once, "{p:?}");
        }
    }

    fn admitted(outcomes: &[PolicyOutcome]) -> usize {
        outcomes.iter().filter(|o| o.allowed).count()
    }

    /// the boundary test, on exact times: limit 100 per second, 200 requests
    /// spread over the last 130 ms of a window, then 200 over the first 20 ms of the
    /// next (150 ms in all).
    pub(crate) fn boundary_times(boundary_ms: u64) -> (Vec<u64>, Vec<u64>) {
        let end = (0..200)
            .map(|i| boundary_ms - 130 + i * 130 / 200)
            .collect();
        let start = (0..200).map(|i| boundary_ms + i * 21 / 200).collect();
        (end, start)
    }

    pub(crate) fn boundary_policies() -> Vec<Policy> {
        let s = Duration::from_secs(1);
        vec![
            Policy::fixed_window("fw", 100, s).unwrap(),
            Policy::sliding_window("sw", 100, s).unwrap(),
            Policy::token_bucket("tb", 100, 100, s).unwrap(),
            Policy::sliding_log("sl", 100, s).unwrap(),
        ]
    }

    #[test]
    fn boundary_scenario() {
        let (end, start) = boundary_times(10_000);
        let mut totals = Vec::new();
        for policy in boundary_policies() {
            let steps: Vec<_> = end.iter().chain(&start).map(|t| (*t, 1)).collect();
            let out = run(&policy, &steps);
            totals.push((admitted(&out[..200]), admitted(&out[200..])));
        }
        assert_eq!(totals[0], (100, 100), "fixed window");
        assert_eq!(totals[1], (100, 2), "sliding window");
        let tb = totals[2].0 + totals[2].1;
        assert!((110..=120).contains(&tb), "token bucket {totals:?}");
        assert_eq!(totals[3], (100, 0), "sliding log");
    }

    #[test]
    fn costs_consume_and_never_partially_admit() {
        let p = Policy::fixed_window("p", 5, Duration::from_secs(1)).unwrap();
        let out = run(&p, &[(0, 3), (1, 3), (2, 2)]);
        assert_eq!(
            out.iter()
                .map(|o| (o.allowed, o.remaining))
                .collect::<Vec<_>>(),
            [(true, 2), (false, 2), (true, 0)]
        );
    }

    #[test]
    fn the_model_admits_exactly_the_hand_written_traces() {
        use crate::decision::Decision;
        use std::sync::Arc;
        for trace in super::traces::TRACES {
            let policies: Arc<[Policy]> = trace.built_policies().into();
            let mut states: Vec<Option<State>> = vec![None; policies.len()];
            let mut expires = 0;
            for (i, (&(_, cost, expected), now)) in
                trace.steps.iter().zip(trace.times()).enumerate()
            {
                // Kept like the memory store keeps it: dropped once every policy's
                // state has decayed.
                if now >= expires {
                    states.iter_mut().for_each(|s| *s = None);
                }
                if let Some(back) = trace.refund_before(i) {
                    for (p, s) in policies.iter().zip(states.iter_mut()) {
                        if let Some(next) = refund(p, s.as_ref(), now, u64::from(back)) {
                            *s = Some(next);
                        }
                    }
                }
                let (outcomes, keep) = decide_all(&policies, &mut states, now, u64::from(cost));
                let decision =
                    Decision::from_outcomes(&policies, outcomes.iter().copied(), u64::from(cost));
                assert_eq!(
                    (decision.is_allowed(), decision.would_deny()),
                    (expected, trace.would_deny.contains(&i)),
                    "{}: step {i} at {now} ms: {outcomes:?}",
                    trace.name
                );
                if let Some(keep) = keep {
                    expires = expires.max(now + keep);
                }
            }
        }
    }

    #[test]
    fn one_policy_alone_decides_as_the_rule_for_many_does() {
        // Times that go forward, repeat, jump a window, and go back; costs that fit
        // and costs that do not.
        let steps = [
            (5_000, 1),
            (5_000, 60),
            (5_001, 50),
            (5_400, 3),
            (4_000, 1),
            (6_200, 100),
            (6_300, 1),
            (9_999, 2),
            (12_000, 1),
        ];
        for base in boundary_policies() {
            for policy in [base.clone(), base.shadow()] {
                let set = [policy];
                let (mut one, mut each) = (vec![None], vec![None]);
                for (now, cost) in steps {
                    let by_one = decide_all(&set, &mut one, now, cost);
                    let by_each = decide_each(&set, &mut each, now, cost);
                    assert_eq!(by_one.0, by_each.0, "{:?} at {now}", set[0]);
                    assert_eq!(by_one.1, by_each.1, "{:?} at {now}", set[0]);
                    assert_eq!(one, each, "{:?} at {now}", set[0]);
                }
            }
        }
    }

    #[test]
    fn state_written_while_the_clock_is_behind_lives_until_it_decays() {
        let s = Duration::from_secs(1);
        for p in boundary_policies() {
            // State up to 5 000, then the clock jumps back 1.5 s and one more passes.
            let mut state = None;
            for t in [4_500, 4_999, 5_000] {
                if let Some(commit) = decide(&p, state.as_ref(), t, 1).commit {
                    commit.apply(&mut state);
                }
            }
            let step = decide(&p, state.as_ref(), 3_500, 1);
            if p.algorithm() == Algorithm::TokenBucket {
                // Clamped to the moment the bucket was empty: nothing to write.
                assert!(!step.outcome.allowed, "{p:?}");
                continue;
            }
            assert!(step.outcome.allowed, "{p:?}");
            let decays_at = match p.algorithm() {
                Algorithm::FixedWindow => 6_000,
                Algorithm::SlidingWindow => 7_000,
                _ => 5_000 + s.as_millis() as u64,
            };
            assert_eq!(3_500 + step.ttl_ms, decays_at, "{p:?}");
        }
    }

    #[test]
    fn a_clock_that_goes_back_never_floods() {
        for p in boundary_policies() {
            let mut state = None;
            let mut admitted = 0;
            for t in (0..400u64).map(|i| 5_000 + i) {
                let s = decide(&p, state.as_ref(), t, 1);
                if s.outcome.allowed {
                    admitted += 1;
                }
                if let Some(commit) = s.commit {
                    commit.apply(&mut state);
                }
            }
            // Jump back 3 seconds: nothing may reset.
            let before = admitted;
            for _ in 0..200 {
                let s = decide(&p, state.as_ref(), 2_000, 1);
                if s.outcome.allowed {
                    admitted += 1;
                }
                if let Some(commit) = s.commit {
                    commit.apply(&mut state);
                }
            }
            assert_eq!(admitted, before, "{p:?} admitted after a backwards step");
        }
    }

    #[test]
    fn waits_count_from_the_time_asked_when_the_clock_went_back() {
        // When each policy of the boundary test admits again, and when its state is unused.
        let expected = [
            (6_000, 6_000),
            (6_010, 7_000),
            (5_010, 6_000),
            (6_000, 6_000),
        ];
        for (p, (expected_at, unused_at)) in boundary_policies().iter().zip(expected) {
            let mut state = None;
            for _ in 0..100 {
                if let Some(commit) = decide(p, state.as_ref(), 5_000, 1).commit {
                    commit.apply(&mut state);
                }
            }
            // The clock jumps back 1.5 s: the decision is made on the stored time, and
            // the wait it names counts from the time asked.
            let denied = decide(p, state.as_ref(), 3_500, 1).outcome;
            assert!(!denied.allowed, "{p:?}");
            let at = 3_500 + denied.retry_after_ms;
            assert_eq!(at, expected_at, "{p:?}");
            assert_eq!(3_500 + denied.reset_after_ms, unused_at, "{p:?}");
            assert!(
                !decide(p, state.as_ref(), at - 1, 1).outcome.allowed,
                "{p:?}"
            );
            assert!(decide(p, state.as_ref(), at, 1).outcome.allowed, "{p:?}");
        }
    }
}
