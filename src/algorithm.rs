//! The four algorithms as pure functions of (policy, state, now, cost).
//!
//! This is the one Rust truth of each algorithm: the memory store keeps these states in
//! a map, and the Lua scripts in `lua/` are line-for-line translations of the same
//! arithmetic (integers only, exact in Lua's doubles because policies keep every
//! product under 2^53). The conformance suite runs both on the same traces.
//!
//! A decision never changes state when it denies, so a request that one of several
//! policies denies can be rolled back simply by not committing the others.
//!
//! Several policies decide together by one rule ([`admits_all`]): each policy whose
//! step admits commits it if every enforced policy admits. Enforced policies are thus
//! all or nothing among themselves, and a shadow policy consumes exactly when enforcing
//! it would have: when it admits and the enforced ones do.
//!
//! Beside the check, [`refund`] gives back what a check consumed (the admin operation
//! of [`Limiter::refund`](crate::Limiter::refund)); a peek is a check whose commit is
//! dropped, and a reset forgets the state.

use std::collections::VecDeque;

use crate::decision::PolicyOutcome;
use crate::policy::{Algorithm, Policy};

/// The state one subject holds for one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Window index and the count admitted in it.
    FixedWindow { window: u64, count: u64 },
    /// Index of the current window and the counts of it and the one before.
    SlidingWindow { window: u64, prev: u64, cur: u64 },
    /// Theoretical arrival time in microseconds (GCRA).
    TokenBucket { tat_us: u64 },
    /// The last `limit` admitted stamps in ms, oldest first (non-decreasing).
    SlidingLog { stamps: VecDeque<u64> },
}

/// A decision for one policy, and the change to make if every policy admits.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) outcome: PolicyOutcome,
    /// The change to the state when admitted; `None` when denied (nothing changes).
    pub(crate) commit: Option<Commit>,
    /// How long the state must be kept, in ms from the time asked (not the clamped
    /// time, when the clock went back): after that it is "unused".
    pub(crate) ttl_ms: u64,
}

/// How an admission changes a state. The log is appended to in place rather than
/// copied, so a decision costs O(log limit), not O(limit).
#[derive(Debug, Clone)]
pub(crate) enum Commit {
    /// Replace the state.
    Set(State),
    /// Append `count` copies of `stamp` to the sliding log, keeping the last `limit`.
    Push { stamp: u64, count: u64, limit: u64 },
}

impl Commit {
    /// Applies the change to `state`.
    pub(crate) fn apply(self, state: &mut Option<State>) {
        match self {
            Commit::Set(next) => *state = Some(next),
            Commit::Push {
                stamp,
                count,
                limit,
            } => {
                if !matches!(state, Some(State::SlidingLog { .. })) {
                    *state = Some(State::SlidingLog {
                        stamps: VecDeque::new(),
                    });
                }
                if let Some(State::SlidingLog { stamps }) = state {
                    for _ in 0..count {
                        if stamps.len() as u64 >= limit {
                            stamps.pop_front();
                        }
                        stamps.push_back(stamp);
                    }
                }
            }
        }
    }
}

/// Decides one policy. `state` is `None` for a subject never seen (or expired).
///
/// `cost` must be at least 1 and at most `policy.max_cost()`; the limiter checks that.
pub(crate) fn decide(policy: &Policy, state: Option<&State>, now_ms: u64, cost: u64) -> Step {
    match policy.algorithm() {
        Algorithm::FixedWindow => fixed_window(policy, state, now_ms, cost),
        Algorithm::SlidingWindow => sliding_window(policy, state, now_ms, cost),
        Algorithm::TokenBucket => token_bucket(policy, state, now_ms, cost),
        Algorithm::SlidingLog => sliding_log(policy, state, now_ms, cost),
    }
}

/// Whether the steps may commit: every enforced (non-shadow) policy admits. Then each
/// step that admits commits, shadow ones included; otherwise none does.
pub(crate) fn admits_all<'a>(
    policies: &[Policy],
    outcomes: impl IntoIterator<Item = &'a PolicyOutcome>,
) -> bool {
    policies
        .iter()
        .zip(outcomes)
        .all(|(p, o)| o.allowed || p.is_shadow())
}

/// The state after giving back `cost` units, or `None` when there is nothing to give
/// back. The state only shrinks, so the expiry it had still covers it.
///
/// - fixed and sliding window: the current window's count goes down by `cost`, not
///   below 0; if the window has changed since, nothing is refunded;
/// - token bucket: the theoretical arrival time moves back by `cost` emission
///   intervals, not before now;
/// - sliding log: the `cost` most recent stamps are removed, only those still in the
///   window.
///
/// "Now" is clamped as the check clamps it when the clock went back.
pub(crate) fn refund(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Option<State> {
    let w = policy.window_ms();
    match state? {
        State::FixedWindow { window, count } => {
            // A stored window ahead of the clock is the one a check would use.
            (*window >= now / w && *count > 0).then(|| State::FixedWindow {
                window: *window,
                count: count.saturating_sub(cost),
            })
        }
        State::SlidingWindow { window, prev, cur } => {
            (*window >= now / w && *cur > 0).then(|| State::SlidingWindow {
                window: *window,
                prev: *prev,
                cur: cur.saturating_sub(cost),
            })
        }
        State::TokenBucket { tat_us } => {
            let t = policy.emission_interval_us();
            let now = (now * 1_000).max(tat_us.saturating_sub(policy.limit() * t));
            let back = tat_us.saturating_sub(cost * t).max(now);
            (back < *tat_us).then_some(State::TokenBucket { tat_us: back })
        }
        State::SlidingLog { stamps } => {
            let now = stamps.back().map_or(now, |newest| now.max(*newest));
            let in_window = stamps.len() - stamps.partition_point(|x| x + w <= now);
            let drop = in_window.min(usize::try_from(cost).unwrap_or(usize::MAX));
            (drop > 0).then(|| {
                let mut stamps = stamps.clone();
                stamps.truncate(stamps.len() - drop);
                State::SlidingLog { stamps }
            })
        }
    }
}

fn fixed_window(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let mut idx = now / w;
    let mut count = 0;
    if let Some(State::FixedWindow { window, count: c }) = state {
        if *window >= idx {
            // Same window, or a clock that went back: stay in the stored window.
            idx = *window;
            count = *c;
        }
    }
    // Counted from the time asked: a clock that went back waits out the stored window
    // too (the store decides on its stored time, the caller waits on its own clock).
    let reset = (idx + 1) * w - now;
    let allowed = count + cost <= limit;
    if allowed {
        count += cost;
    }
    Step {
        outcome: PolicyOutcome {
            allowed,
            limit,
            remaining: limit.saturating_sub(count),
            reset_after_ms: reset,
            retry_after_ms: if allowed { 0 } else { reset },
        },
        commit: allowed.then_some(Commit::Set(State::FixedWindow { window: idx, count })),
        ttl_ms: reset,
    }
}

fn sliding_window(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let mut idx = now / w;
    let asked = now;
    let mut now = now;
    let (mut prev, mut cur) = (0, 0);
    if let Some(State::SlidingWindow {
        window,
        prev: p,
        cur: c,
    }) = state
    {
        if *window > idx {
            // The clock went back: clamp to the start of the stored window.
            idx = *window;
            now = idx * w;
        }
        if *window == idx {
            (prev, cur) = (*p, *c);
        } else if *window + 1 == idx {
            prev = *c;
        }
    }
    let elapsed = now - idx * w;
    // The previous window's weight, scaled by w to stay in integers.
    let weighted = prev * (w - elapsed);
    let allowed = (cur + cost) * w + weighted <= limit * w;
    if allowed {
        cur += cost;
    }
    let remaining = ((limit * w - weighted) / w).saturating_sub(cur);
    // Waits are counted from the time asked, as for the fixed window.
    let behind = now - asked;
    let reset = if cur > 0 {
        behind + 2 * w - elapsed
    } else if prev > 0 {
        behind + w - elapsed
    } else {
        0
    };
    let retry = if allowed {
        0
    } else if cur + cost <= limit {
        // This window has room once the previous one has decayed enough.
        behind + w - ((limit - cur - cost) * w) / prev - elapsed
    } else {
        // Only the next window has room: its `prev` will be today's `cur`.
        let into_next = w.saturating_sub(((limit - cost) * w) / cur);
        behind + (w - elapsed) + into_next
    };
    Step {
        outcome: PolicyOutcome {
            allowed,
            limit,
            remaining,
            reset_after_ms: reset,
            retry_after_ms: retry,
        },
        commit: allowed.then_some(Commit::Set(State::SlidingWindow {
            window: idx,
            prev,
            cur,
        })),
        ttl_ms: reset,
    }
}

fn token_bucket(policy: &Policy, state: Option<&State>, now_ms: u64, cost: u64) -> Step {
    let t = policy.emission_interval_us();
    let tolerance = policy.limit() * t;
    let asked = now_ms * 1_000;
    let mut now = asked;
    let tat = match state {
        Some(State::TokenBucket { tat_us }) => {
            // A clock that went back is clamped to the last moment the stored state
            // can describe (an empty bucket), so the bucket never looks fuller.
            now = now.max(tat_us.saturating_sub(tolerance));
            (*tat_us).max(now)
        }
        _ => now,
    };
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

fn sliding_log(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let empty = VecDeque::new();
    let stamps = match state {
        Some(State::SlidingLog { stamps }) => stamps,
        _ => &empty,
    };
    // A clock that went back is clamped to the newest stamp: stamps stay sorted.
    let asked = now;
    let now = stamps.back().map_or(now, |newest| now.max(*newest));
    // Admit iff at most limit - cost stamps are in the window, that is iff the
    // (limit - cost + 1)-th most recent stamp (if any) has left it.
    let k = (limit - cost + 1) as usize;
    let deciding = stamps.len().checked_sub(k).map(|i| stamps[i]);
    let allowed = deciding.is_none_or(|s| s + w <= now);
    // Most logs start inside the window: then no search (a search of a long log
    // touches a cache line per step, the largest cost of a decision here).
    let expired = match stamps.front() {
        Some(oldest) if oldest + w <= now => stamps.partition_point(|x| x + w <= now),
        _ => 0,
    };
    let in_window = (stamps.len() - expired) as u64;
    // Admitting appends `cost` stamps; whatever falls off the ring is older than the
    // deciding stamp, hence already out of the window.
    let (count, newest) = if allowed {
        (in_window + cost, Some(now))
    } else {
        (in_window, stamps.back().copied())
    };
    // Waits are counted from the time asked: a clamped clock waits for the newest
    // stamp too.
    let reset = newest.map_or(0, |n| (n + w).saturating_sub(asked));
    Step {
        outcome: PolicyOutcome {
            allowed,
            limit,
            remaining: limit.saturating_sub(count),
            reset_after_ms: reset,
            retry_after_ms: match deciding {
                Some(s) if !allowed => s + w - asked,
                _ => 0,
            },
        },
        commit: allowed.then_some(Commit::Push {
            stamp: now,
            count: cost,
            limit,
        }),
        ttl_ms: reset,
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

    fn admitted(outcomes: &[PolicyOutcome]) -> usize {
        outcomes.iter().filter(|o| o.allowed).count()
    }

    /// The seed's boundary test, on exact times: limit 100 per second, 200 requests
    /// spread over the last 130 ms of a window, then 200 over the first 20 ms of the
    /// next (150 ms in all).
    pub(crate) fn seed_boundary_times(boundary_ms: u64) -> (Vec<u64>, Vec<u64>) {
        let end = (0..200)
            .map(|i| boundary_ms - 130 + i * 130 / 200)
            .collect();
        let start = (0..200).map(|i| boundary_ms + i * 21 / 200).collect();
        (end, start)
    }

    pub(crate) fn seed_policies() -> Vec<Policy> {
        let s = Duration::from_secs(1);
        vec![
            Policy::fixed_window("fw", 100, s).unwrap(),
            Policy::sliding_window("sw", 100, s).unwrap(),
            Policy::token_bucket("tb", 100, 100, s).unwrap(),
            Policy::sliding_log("sl", 100, s).unwrap(),
        ]
    }

    #[test]
    fn seed_boundary_scenario() {
        let (end, start) = seed_boundary_times(10_000);
        let mut totals = Vec::new();
        for policy in seed_policies() {
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
    fn fixed_window_resets_on_the_aligned_boundary() {
        let p = Policy::fixed_window("p", 2, Duration::from_millis(100)).unwrap();
        let out = run(&p, &[(150, 1), (160, 1), (199, 1), (200, 1)]);
        assert_eq!(
            out.iter().map(|o| o.allowed).collect::<Vec<_>>(),
            [true, true, false, true]
        );
        assert_eq!(out[1].remaining, 0);
        assert_eq!(out[2].retry_after_ms, 1);
        assert_eq!(out[0].reset_after_ms, 50);
    }

    #[test]
    fn sliding_window_retry_after_is_exact() {
        let p = Policy::sliding_window("p", 10, Duration::from_millis(1_000)).unwrap();
        // Fill window 0, then probe window 1 until admitted; retry_after must point at
        // exactly the first admitted millisecond.
        let mut state = None;
        for _ in 0..10 {
            if let Some(commit) = decide(&p, state.as_ref(), 500, 1).commit {
                commit.apply(&mut state);
            }
        }
        let denied = decide(&p, state.as_ref(), 999, 1);
        assert!(!denied.outcome.allowed);
        let at = 999 + denied.outcome.retry_after_ms;
        assert!(decide(&p, state.as_ref(), at, 1).outcome.allowed);
        assert!(!decide(&p, state.as_ref(), at - 1, 1).outcome.allowed);
        assert_eq!(at, 1_100, "10*(1-e/1000)+1 <= 10 first at e=100");
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
    fn sliding_log_is_exact_in_every_window() {
        let p = Policy::sliding_log("p", 3, Duration::from_millis(100)).unwrap();
        let out = run(&p, &[(0, 1), (10, 1), (20, 1), (99, 1), (100, 1), (105, 2)]);
        let allowed: Vec<_> = out.iter().map(|o| o.allowed).collect();
        assert_eq!(allowed, [true, true, true, false, true, false]);
        assert_eq!(out[3].retry_after_ms, 1);
        // At 105 the window (5, 105] holds 10, 20, 100: cost 2 needs two to leave.
        assert_eq!(out[5].retry_after_ms, 20 + 100 - 105);
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

    /// The conformance table the stores are held to (tests/conformance.rs), checked
    /// here against the model itself.
    #[allow(unreachable_pub)]
    mod traces {
        use crate::policy::Policy;
        use std::time::Duration;

        include!("../tests/support/traces.rs");
    }

    #[test]
    fn the_model_admits_exactly_the_hand_written_traces() {
        use crate::decision::Decision;
        use std::sync::Arc;
        for trace in traces::TRACES {
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
                let steps: Vec<Step> = policies
                    .iter()
                    .zip(&states)
                    .map(|(p, s)| decide(p, s.as_ref(), now, u64::from(cost)))
                    .collect();
                let outcomes: Vec<_> = steps.iter().map(|s| s.outcome).collect();
                let allowed = admits_all(&policies, &outcomes);
                let decision = Decision::from_outcomes(&policies, outcomes.iter().copied());
                assert_eq!(
                    (decision.is_allowed(), decision.would_deny()),
                    (expected, trace.would_deny.contains(&i)),
                    "{}: step {i} at {now} ms: {outcomes:?}",
                    trace.name
                );
                if allowed {
                    for (state, step) in states.iter_mut().zip(steps) {
                        if let Some(commit) = step.commit {
                            expires = expires.max(now + step.ttl_ms.max(1));
                            commit.apply(state);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn refunds_follow_each_algorithm_s_rule() {
        let s = Duration::from_secs(1);
        let after = |p: &Policy, steps: &[(u64, u64)], now: u64, cost: u64| {
            let mut state = None;
            for &(t, c) in steps {
                if let Some(commit) = decide(p, state.as_ref(), t, c).commit {
                    commit.apply(&mut state);
                }
            }
            refund(p, state.as_ref(), now, cost)
        };
        let fw = Policy::fixed_window("fw", 5, s).unwrap();
        assert_eq!(
            after(&fw, &[(100, 3)], 200, 9),
            Some(State::FixedWindow {
                window: 0,
                count: 0
            })
        );
        assert_eq!(
            after(&fw, &[(100, 3)], 1_000, 1),
            None,
            "the window changed"
        );
        let sw = Policy::sliding_window("sw", 5, s).unwrap();
        assert_eq!(
            after(&sw, &[(100, 3), (1_100, 2)], 1_200, 1),
            Some(State::SlidingWindow {
                window: 1,
                prev: 3,
                cur: 1
            })
        );
        assert_eq!(after(&sw, &[(100, 3)], 1_100, 1), None);
        let tb = Policy::token_bucket("tb", 4, 1, s).unwrap();
        assert_eq!(
            after(&tb, &[(0, 3)], 0, 1),
            Some(State::TokenBucket { tat_us: 2_000_000 })
        );
        assert_eq!(
            after(&tb, &[(0, 3)], 500, 4),
            Some(State::TokenBucket { tat_us: 500_000 }),
            "not before now"
        );
        assert_eq!(after(&tb, &[(0, 1)], 2_000, 1), None);
        let sl = Policy::sliding_log("sl", 4, s).unwrap();
        assert_eq!(
            after(&sl, &[(0, 1), (600, 2)], 1_200, 4),
            Some(State::SlidingLog {
                stamps: VecDeque::from([0])
            }),
            "only stamps still in the window leave"
        );
        assert_eq!(after(&sl, &[(0, 1)], 1_000, 1), None);
        assert_eq!(refund(&sl, None, 0, 1), None);
    }

    #[test]
    fn state_written_while_the_clock_is_behind_lives_until_it_decays() {
        let s = Duration::from_secs(1);
        for p in seed_policies() {
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
        for p in seed_policies() {
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
        // When each seed policy admits again, and when its state is unused.
        let expected = [
            (6_000, 6_000),
            (6_010, 7_000),
            (5_010, 6_000),
            (6_000, 6_000),
        ];
        for (p, (expected_at, unused_at)) in seed_policies().iter().zip(expected) {
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
