//! Sliding window counter: the previous and current windows' counts, the previous
//! one weighted by how much of it the sliding window still covers. The Rust twin of
//! `lua/sliding_window.lua`; the script keeps the state `(window, prev, cur)` packed in
//! 12 bytes (`>I4I4I4`; 7 bytes each past 2^32).

use super::state::{window_ahead, Commit, State, Step, MAX_DEBT, MAX_EXACT};
use crate::decision::PolicyOutcome;
use crate::policy::Policy;

#[inline(always)]
pub(super) fn decide(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let asked = now;
    let (idx, now, prev, mut cur) = current(state, now, w);
    let elapsed = now - idx * w;
    // The previous window's weight, scaled by w to stay in integers.
    let weighted = prev * (w - elapsed);
    let allowed = (cur + cost) * w + weighted <= limit * w;
    if allowed {
        cur += cost;
    }
    // No division while the previous window is empty (`limit * w / w`). A previous
    // window charged past the limit (a debt) may weigh more than the limit: no room.
    let room = if weighted == 0 {
        limit
    } else {
        (limit * w).saturating_sub(weighted) / w
    };
    let remaining = room.saturating_sub(cur);
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

/// The window `now` counts in, the time read (clamped to the stored window's start
/// when the clock went back), and the previous and current counts: the stored window
/// while `now` is in it or up to [`MAX_CLOCK_BACK`](super::state::MAX_CLOCK_BACK) windows
/// before it, the next one (the stored count becomes `prev`),
/// or a later one with nothing carried over. The same as comparing `now / w` with the
/// stored window, without dividing on the common paths.
#[inline(always)]
fn current(state: Option<&State>, now: u64, w: u64) -> (u64, u64, u64, u64) {
    match state {
        Some(State::SlidingWindow { window, prev, cur }) if !window_ahead(*window, now, w) => {
            let start = window * w;
            if now < start + w {
                (*window, now.max(start), *prev, *cur)
            } else if now < start + 2 * w {
                (window + 1, now, *cur, 0)
            } else {
                (now / w, now, 0, 0)
            }
        }
        _ => (now / w, now, 0, 0),
    }
}

/// The current window's count goes down by `cost`, not below 0; once the window has
/// changed (or lies past the clamp's bound), nothing is refunded.
pub(super) fn refund(
    policy: &Policy,
    (window, prev, cur): (u64, u64, u64),
    now: u64,
    cost: u64,
) -> Option<State> {
    let w = policy.window_ms();
    let current = window >= now / w && !window_ahead(window, now, w);
    (current && cur > 0).then(|| State::SlidingWindow {
        window,
        prev,
        cur: cur.saturating_sub(cost),
    })
}

/// The current window's count goes up by `cost`, the windows rolled as the check rolls
/// them, to at most what keeps the sliding count (`cur` and `prev` weighted) within
/// [`MAX_DEBT`] limits and every count times the window under 2^53; kept as the check
/// keeps what it admits.
pub(super) fn charge(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> (State, u64) {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let asked = now;
    let (idx, now, prev, cur) = current(state, now, w);
    let elapsed = now - idx * w;
    let weighted = prev * (w - elapsed);
    // The most counts a state may hold: `most * w` is exact in Lua.
    let most = (MAX_DEBT * limit).min(MAX_EXACT / w);
    let room = (most * w).saturating_sub(weighted) / w;
    let cur = cur.max(room.min(cur.saturating_add(cost)));
    // As the check's reset with `cur > 0`, from the time asked.
    let ttl = (now - asked) + 2 * w - elapsed;
    (
        State::SlidingWindow {
            window: idx,
            prev,
            cur,
        },
        ttl,
    )
}

#[cfg(test)]
mod tests {
    use super::super::decide as decide_any;
    use super::super::tests::{charged_after, readmitted_at, refunded_after};
    use super::*;
    use std::time::Duration;

    #[test]
    fn sliding_window_retry_after_is_exact() {
        let p = Policy::sliding_window("p", 10, Duration::from_millis(1_000)).unwrap();
        // Fill window 0, then probe window 1 until admitted; retry_after must point at
        // exactly the first admitted millisecond.
        let mut state = None;
        for _ in 0..10 {
            if let Some(commit) = decide_any(&p, state.as_ref(), 500, 1).commit {
                commit.apply(&mut state);
            }
        }
        let denied = decide_any(&p, state.as_ref(), 999, 1);
        assert!(!denied.outcome.allowed);
        let at = 999 + denied.outcome.retry_after_ms;
        assert!(decide_any(&p, state.as_ref(), at, 1).outcome.allowed);
        assert!(!decide_any(&p, state.as_ref(), at - 1, 1).outcome.allowed);
        assert_eq!(at, 1_100, "10*(1-e/1000)+1 <= 10 first at e=100");
    }

    #[test]
    fn the_window_is_chosen_as_by_dividing() {
        for w in [1, 7, 1_000, 60_000] {
            for window in [0, 1, 5, 1_000] {
                let state = State::SlidingWindow {
                    window,
                    prev: 2,
                    cur: 3,
                };
                for now in (0..(window + 4) * w).step_by((w as usize / 3).max(1)) {
                    // The rule as first written, dividing every time.
                    let idx = now / w;
                    let by_division = if window > idx + super::super::state::MAX_CLOCK_BACK {
                        (idx, now, 0, 0)
                    } else if window > idx {
                        (window, window * w, 2, 3)
                    } else if window == idx {
                        (idx, now, 2, 3)
                    } else if window + 1 == idx {
                        (idx, now, 3, 0)
                    } else {
                        (idx, now, 0, 0)
                    };
                    assert_eq!(
                        current(Some(&state), now, w),
                        by_division,
                        "{w} {window} {now}"
                    );
                }
            }
        }
        assert_eq!(current(None, 2_500, 1_000), (2, 2_500, 0, 0));
    }

    #[test]
    fn a_refund_lowers_the_current_window_only() {
        let sw = Policy::sliding_window("sw", 5, Duration::from_secs(1)).unwrap();
        assert_eq!(
            refunded_after(&sw, &[(100, 3), (1_100, 2)], 1_200, 1),
            Some(State::SlidingWindow {
                window: 1,
                prev: 3,
                cur: 1
            })
        );
        assert_eq!(refunded_after(&sw, &[(100, 3)], 1_100, 1), None);
    }

    #[test]
    fn a_charge_past_the_limit_carries_into_the_next_window() {
        let sw = Policy::sliding_window("sw", 10, Duration::from_secs(1)).unwrap();
        let (charged, ttl) = charged_after(&sw, &[], 500, 15);
        assert_eq!(
            charged,
            State::SlidingWindow {
                window: 0,
                prev: 0,
                cur: 15
            }
        );
        assert_eq!(ttl, 1_500);
        // Window 1 admits once 15 x (1 - e/1000) + 1 <= 10: e = 400.
        assert_eq!(readmitted_at(&sw, &charged, ttl, 600), 1_400);
        // Rolled as the check rolls: a charge in the next window keeps the debt as
        // the previous count, and its own in the current one.
        assert_eq!(
            charged_after(&sw, &[(500, 4)], 1_250, 3).0,
            State::SlidingWindow {
                window: 1,
                prev: 4,
                cur: 3
            }
        );
        // The sliding count is at most MAX_DEBT limits: at 1 250, 4 x 0.75 = 3 of
        // them are the previous window's.
        assert_eq!(
            charged_after(&sw, &[(500, 4)], 1_250, u64::MAX).0,
            State::SlidingWindow {
                window: 1,
                prev: 4,
                cur: 37
            }
        );
    }

    #[test]
    fn a_charged_count_times_the_window_stays_exact_in_lua() {
        // limit x window just under 2^53: MAX_DEBT limits would not be exact.
        let sw = Policy::sliding_window("sw", u32::MAX, Duration::from_secs(2_000)).unwrap();
        let (charged, _) = charged_after(&sw, &[], 0, u64::MAX);
        let State::SlidingWindow { cur, .. } = charged else {
            panic!("{charged:?}")
        };
        assert!(
            cur * sw.window_ms() <= super::super::state::MAX_EXACT,
            "{cur}"
        );
        assert!(cur >= sw.limit(), "{cur}");
        let next = decide_any(&sw, Some(&charged), 2_000_000, 1).outcome;
        assert!(!next.allowed && next.remaining == 0, "{next:?}");
    }
}
