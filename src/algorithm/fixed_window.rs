//! Fixed window: one counter per window aligned to the epoch. The Rust twin of
//! `lua/fixed_window.lua`; the state is `(window index, count)`, which the script keeps
//! packed in 12 bytes (`>I6I6`; 7 bytes each past 2^48).

use super::state::{window_ahead, Commit, State, Step, MAX_DEBT};
use crate::decision::PolicyOutcome;
use crate::policy::Policy;

#[inline(always)]
pub(super) fn decide(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let (idx, mut count) = current(state, now, w);
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

/// The window `now` counts in and its count so far: the stored window while `now` is
/// in it, or up to [`MAX_CLOCK_BACK`](super::state::MAX_CLOCK_BACK) windows before it (a
/// clock that went back: stay in the stored window); else a new one. A stored window
/// further ahead is no clock that went back but state this clock cannot have written:
/// it starts fresh, so a wait is never longer than `MAX_CLOCK_BACK + 1` windows. The
/// same as comparing `now / w` with the stored window, without dividing on the common
/// path.
#[inline(always)]
fn current(state: Option<&State>, now: u64, w: u64) -> (u64, u64) {
    match state {
        Some(State::FixedWindow { window, count })
            if now < (window + 1) * w && !window_ahead(*window, now, w) =>
        {
            (*window, *count)
        }
        _ => (now / w, 0),
    }
}

/// The current window's count goes down by `cost`, not below 0; if the window has
/// changed since, nothing is refunded. A stored window ahead of the clock is the one a
/// check would use (within the clamp's bound; foreign state refunds nothing).
pub(super) fn refund(
    policy: &Policy,
    window: u64,
    count: u64,
    now: u64,
    cost: u64,
) -> Option<State> {
    let w = policy.window_ms();
    (window >= now / w && !window_ahead(window, now, w) && count > 0).then(|| State::FixedWindow {
        window,
        count: count.saturating_sub(cost),
    })
}

/// The current window's count goes up by `cost` (a new window starts at `cost`), to at
/// most [`MAX_DEBT`] limits; kept to the window's end (counted from the time asked, as
/// the check's). The window is the one a check would count in.
pub(super) fn charge(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> (State, u64) {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let (idx, count) = current(state, now, w);
    let most = MAX_DEBT * limit;
    let count = count.max(most.min(count.saturating_add(cost)));
    (
        State::FixedWindow { window: idx, count },
        (idx + 1) * w - now,
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{charged_after, readmitted_at, refunded_after, run};
    use super::*;
    use std::time::Duration;

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
    fn the_window_is_chosen_as_by_dividing() {
        for w in [1, 7, 1_000, 60_000] {
            for window in [0, 1, 5, 1_000] {
                let state = State::FixedWindow { window, count: 3 };
                for now in (0..(window + 4) * w).step_by((w as usize / 3).max(1)) {
                    // By division: the stored window while `now / w` is in it or at most
                    // MAX_CLOCK_BACK windows before it.
                    let idx = now / w;
                    let by_division =
                        if window >= idx && window <= idx + super::super::state::MAX_CLOCK_BACK {
                            (window, 3)
                        } else {
                            (now / w, 0)
                        };
                    assert_eq!(
                        current(Some(&state), now, w),
                        by_division,
                        "{w} {window} {now}"
                    );
                }
            }
        }
        assert_eq!(current(None, 2_500, 1_000), (2, 0));
    }

    #[test]
    fn a_refund_lowers_the_current_window_only() {
        let fw = Policy::fixed_window("fw", 5, Duration::from_secs(1)).unwrap();
        assert_eq!(
            refunded_after(&fw, &[(100, 3)], 200, 9),
            Some(State::FixedWindow {
                window: 0,
                count: 0
            })
        );
        assert_eq!(
            refunded_after(&fw, &[(100, 3)], 1_000, 1),
            None,
            "the window changed"
        );
    }

    #[test]
    fn a_charge_past_the_limit_denies_until_the_window_ends() {
        let fw = Policy::fixed_window("fw", 5, Duration::from_secs(1)).unwrap();
        // 3 checked, 4 charged: 7 of 5, two owed until the window ends.
        let (charged, ttl) = charged_after(&fw, &[(100, 3)], 200, 4);
        assert_eq!(
            charged,
            State::FixedWindow {
                window: 0,
                count: 7
            }
        );
        assert_eq!(ttl, 800);
        assert_eq!(readmitted_at(&fw, &charged, ttl, 300), 1_000);
        // A new window starts at the cost; the debt is at most MAX_DEBT limits.
        assert_eq!(
            charged_after(&fw, &[(100, 3)], 1_500, 9),
            (
                State::FixedWindow {
                    window: 1,
                    count: 9
                },
                500
            )
        );
        assert_eq!(
            charged_after(&fw, &[], 1_500, u64::MAX).0,
            State::FixedWindow {
                window: 1,
                count: 20
            }
        );
    }
}
