//! In flight: requests of a subject running at once. The Rust twin of
//! `lua/in_flight.lua` (and of `lua/in_flight_release.lua` for the release and the
//! renewal).
//!
//! The state is one entry per holder (the limiter instance that admitted the
//! requests): how many of its requests run, and until when the entry stands unless
//! its holder renews it. The script keeps it packed in one string: 12 bytes (the
//! holder's 48-bit id and the expiry) while one holder holds one slot, else an 18-byte
//! header (the total, bounds of the soonest and latest expiries) and 17 bytes an
//! entry, in the order the entries were first written (see `lua/in_flight.lua`). Counting per holder, not per request, is what makes
//! the slots of a vanished instance free themselves: nobody renews its entry, and it
//! stops counting once its time passes, while each live instance renews its own with
//! the count it holds, which also corrects a release that was lost on the way.
//!
//! A check admits when the live entries' counts and one more fit the limit, and
//! writes the holder's entry one up with a fresh expiry. A release takes one off the
//! holder's entry (keeping its expiry), a renewal sets it to the holder's count with
//! a fresh expiry; both drop entries that have expired. Entries expiring more than
//! `MAX_CLOCK_BACK + 1` slot lifetimes after now cannot have been written by this
//! clock: they are dropped as foreign, like the rate algorithms' state ahead of the
//! clock.

pub(crate) use super::state::Holder;
use super::state::{Commit, State, Step, MAX_CLOCK_BACK};
use crate::decision::PolicyOutcome;
use crate::policy::Policy;

/// The longest a denial tells a client to wait: a slot frees whenever a request
/// ends, so this is a hint (ask again in a second), never a promise.
pub(crate) const RETRY_HINT_MS: u64 = 1_000;

/// What a holder does to its own entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// One request ended: one fewer, same expiry.
    Release,
    /// Its requests still run: the entry counts `held` (what the holder knows it
    /// holds), for another slot lifetime.
    Renew { held: u64 },
}

/// The entries of `state` still counting at `now`, in order.
fn live(state: Option<&State>, now: u64, ttl: u64) -> Vec<Holder> {
    let horizon = now.saturating_add(ttl.saturating_mul(MAX_CLOCK_BACK + 1));
    match state {
        Some(State::InFlight { holders }) => holders
            .iter()
            .filter(|h| h.expires_ms > now && h.expires_ms <= horizon && h.count > 0)
            .copied()
            .collect(),
        _ => Vec::new(),
    }
}

fn running(holders: &[Holder]) -> u64 {
    holders
        .iter()
        .fold(0u64, |sum, h| sum.saturating_add(h.count))
}

/// Milliseconds until the last entry stops counting (0: none).
fn keep_ms(holders: &[Holder], now: u64) -> u64 {
    holders
        .iter()
        .map(|h| h.expires_ms - now)
        .max()
        .unwrap_or(0)
}

#[inline]
pub(super) fn decide(policy: &Policy, state: Option<&State>, now: u64) -> Step {
    let (limit, ttl, me) = (policy.limit(), policy.window_ms(), policy.holder());
    let mut holders = live(state, now, ttl);
    let count = running(&holders);
    if count >= limit {
        // The soonest a slot would free itself, if no request ends before.
        let soonest = holders
            .iter()
            .map(|h| h.expires_ms - now)
            .min()
            .unwrap_or(RETRY_HINT_MS);
        return Step {
            outcome: PolicyOutcome {
                allowed: false,
                limit,
                remaining: 0,
                reset_after_ms: keep_ms(&holders, now),
                retry_after_ms: soonest.clamp(1, RETRY_HINT_MS),
            },
            commit: None,
            ttl_ms: 0,
        };
    }
    let expires_ms = now + ttl;
    match holders.iter_mut().find(|h| h.id == me) {
        Some(mine) => {
            mine.count += 1;
            mine.expires_ms = expires_ms;
        }
        None => holders.push(Holder {
            id: me,
            count: 1,
            expires_ms,
        }),
    }
    let keep = keep_ms(&holders, now);
    Step {
        outcome: PolicyOutcome {
            allowed: true,
            limit,
            remaining: limit - count - 1,
            reset_after_ms: keep,
            retry_after_ms: 0,
        },
        commit: Some(Commit::Set(State::InFlight { holders })),
        ttl_ms: keep,
    }
}

/// The state after the policy's holder `change`s its entry, and how long it must be
/// kept (ms from now); `None` for nothing left to keep.
pub(crate) fn hold(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    change: Hold,
) -> Option<(State, u64)> {
    let (ttl, me) = (policy.window_ms(), policy.holder());
    let mut holders = live(state, now, ttl);
    match change {
        Hold::Release => {
            if let Some(mine) = holders.iter_mut().find(|h| h.id == me) {
                mine.count -= 1;
            }
        }
        Hold::Renew { held } => match holders.iter_mut().find(|h| h.id == me) {
            Some(mine) => {
                mine.count = held;
                mine.expires_ms = now + ttl;
            }
            None => holders.push(Holder {
                id: me,
                count: held,
                expires_ms: now + ttl,
            }),
        },
    }
    holders.retain(|h| h.count > 0);
    let keep = keep_ms(&holders, now);
    (!holders.is_empty()).then_some((State::InFlight { holders }, keep))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy(limit: u32, holder: u64) -> Policy {
        Policy::in_flight("calls", limit, Duration::from_secs(30))
            .unwrap()
            .held_by(holder)
    }

    /// A check by `p` at `now`, committed when it admits.
    fn admit(p: &Policy, state: &mut Option<State>, now: u64) -> bool {
        let step = decide(p, state.as_ref(), now);
        if let Some(commit) = step.commit {
            commit.apply(state);
        }
        step.outcome.allowed
    }

    #[test]
    fn slots_are_counted_across_holders_and_released_by_their_own() {
        let (a, b) = (policy(3, 0xa), policy(3, 0xb));
        let mut state = None;
        assert!(admit(&a, &mut state, 1_000));
        assert!(admit(&a, &mut state, 1_001));
        assert_eq!(decide(&b, state.as_ref(), 1_002).outcome.remaining, 0);
        assert!(admit(&b, &mut state, 1_002));
        let fourth = decide(&b, state.as_ref(), 1_003);
        assert!(!fourth.outcome.allowed);
        assert_eq!(fourth.outcome.retry_after_ms, RETRY_HINT_MS);
        // B's release frees B's slot only: A's two still count.
        let (next, _) = hold(&b, state.as_ref(), 1_004, Hold::Release).unwrap();
        state = Some(next);
        assert!(admit(&b, &mut state, 1_005));
        assert!(!decide(&a, state.as_ref(), 1_006).outcome.allowed);
        // A release of a holder with nothing held changes nothing.
        let c = policy(3, 0xc);
        let (same, _) = hold(&c, state.as_ref(), 1_007, Hold::Release).unwrap();
        assert_eq!(running(&live(Some(&same), 1_007, 30_000)), 3);
    }

    #[test]
    fn a_vanished_holder_s_slots_free_themselves_one_lifetime_after_its_last_renewal() {
        let (gone, alive) = (policy(3, 1), policy(3, 2));
        let mut state = None;
        for t in 0..3 {
            assert!(admit(&gone, &mut state, t));
        }
        // Renewed once at 10 s, then the holder vanishes.
        state = hold(&gone, state.as_ref(), 10_000, Hold::Renew { held: 3 }).map(|(s, _)| s);
        assert!(!decide(&alive, state.as_ref(), 39_999).outcome.allowed);
        assert_eq!(
            decide(&alive, state.as_ref(), 39_999)
                .outcome
                .retry_after_ms,
            1
        );
        assert!(decide(&alive, state.as_ref(), 40_000).outcome.allowed);
    }

    #[test]
    fn a_renewal_sets_the_holder_s_count_and_restores_lost_state() {
        let p = policy(2, 7);
        // The store lost the state (flushed): the holder's renewal writes it again.
        let (state, keep) = hold(&p, None, 5_000, Hold::Renew { held: 2 }).unwrap();
        assert_eq!(keep, 30_000);
        assert!(!decide(&p, Some(&state), 5_001).outcome.allowed);
        // A lost release is corrected by the next renewal's count.
        let (state, _) = hold(&p, Some(&state), 6_000, Hold::Renew { held: 1 }).unwrap();
        assert!(decide(&p, Some(&state), 6_001).outcome.allowed);
        // Holding nothing leaves nothing to keep.
        assert!(hold(&p, Some(&state), 6_002, Hold::Renew { held: 0 }).is_none());
    }

    #[test]
    fn entries_too_far_ahead_of_the_clock_are_foreign_and_dropped() {
        let p = policy(1, 1);
        let far = State::InFlight {
            holders: vec![Holder {
                id: 9,
                count: 5,
                expires_ms: 1_000 + 30_000 * (MAX_CLOCK_BACK + 1) + 1,
            }],
        };
        assert!(decide(&p, Some(&far), 1_000).outcome.allowed);
        // Within the bound it is a clock that went back: still counted.
        let near = State::InFlight {
            holders: vec![Holder {
                id: 9,
                count: 1,
                expires_ms: 1_000 + 30_000 * (MAX_CLOCK_BACK + 1),
            }],
        };
        assert!(!decide(&p, Some(&near), 1_000).outcome.allowed);
    }
}
