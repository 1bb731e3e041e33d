//! Sliding log: the last `limit` admitted stamps, exact in every window. The Rust twin
//! of `lua/sliding_log.lua`, which keeps the same stamps as a ring of 6-byte stamps in
//! one string.

use std::collections::VecDeque;

use super::state::{Commit, State, Step, MAX_CLOCK_BACK};
use crate::decision::PolicyOutcome;
use crate::policy::Policy;

#[inline]
pub(super) fn decide(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let empty = VecDeque::new();
    let stamps = match state {
        Some(State::SlidingLog { stamps }) if !ahead(stamps, now, w) => stamps,
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

/// Whether the newest stamp lies more than [`MAX_CLOCK_BACK`]
/// windows after `now`: foreign state, not a clock that went back; read as an empty
/// log (and replaced by the next admission).
#[inline(always)]
fn ahead(stamps: &VecDeque<u64>, now: u64, w: u64) -> bool {
    stamps
        .back()
        .is_some_and(|newest| *newest > now + MAX_CLOCK_BACK * w)
}

/// The `cost` most recent stamps leave, only those still in the window (now clamped to
/// the newest stamp).
pub(super) fn refund(
    policy: &Policy,
    stamps: &VecDeque<u64>,
    now: u64,
    cost: u64,
) -> Option<State> {
    let w = policy.window_ms();
    if ahead(stamps, now, w) {
        return None;
    }
    let now = stamps.back().map_or(now, |newest| now.max(*newest));
    let in_window = stamps.len() - stamps.partition_point(|x| x + w <= now);
    let drop = in_window.min(usize::try_from(cost).unwrap_or(usize::MAX));
    (drop > 0).then(|| {
        let mut stamps = stamps.clone();
        stamps.truncate(stamps.len() - drop);
        State::SlidingLog { stamps }
    })
}

/// `cost` stamps at now (clamped to the newest stamp, as the check clamps it), the log
/// keeping its last `limit`: at most `limit` stamps are pushed, so a sliding log's debt
/// is at most one full window (the subject is admitted again one window after the
/// charge at the latest). Kept as the check keeps what it admits. A log a check reads
/// as foreign is charged as an empty one.
pub(super) fn charge(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> (State, u64) {
    let (limit, w) = (policy.limit(), policy.window_ms());
    let empty = VecDeque::new();
    let stamps = match state {
        Some(State::SlidingLog { stamps }) if !ahead(stamps, now, w) => stamps,
        _ => &empty,
    };
    let asked = now;
    let now = stamps.back().map_or(now, |newest| now.max(*newest));
    let count = usize::try_from(cost.min(limit)).unwrap_or(usize::MAX);
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let keep = stamps.len().min(limit - count);
    let mut next: VecDeque<u64> = stamps.range(stamps.len() - keep..).copied().collect();
    next.extend(std::iter::repeat_n(now, count));
    (State::SlidingLog { stamps: next }, now + w - asked)
}

/// Bytes of the ring's header: the slot of its oldest stamp, big-endian.
#[cfg(any(test, all(feature = "redis", feature = "internals")))]
const RING_HEAD: usize = 4;
/// Bytes of one stamp in the ring: milliseconds, big-endian (good for 8,900 years).
#[cfg(any(test, all(feature = "redis", feature = "internals")))]
const RING_STAMP: usize = 6;

/// The stamps of the ring `lua/sliding_log.lua` keeps in Redis, oldest first, as this
/// model keeps them: the ring's newest `limit` (a ring written under a larger limit
/// holds more). `None` for bytes that are no such ring (the script starts over on
/// them).
///
/// The ring is one string: a 4-byte head (the slot of the oldest stamp), then `n`
/// stamps of 6 bytes; logical stamp `i` (0 = oldest) is in slot `(head + i) % n`.
/// While it fills, the head is 0 and the stamps are in order; once full, an admission
/// overwrites the oldest slots in place and moves the head.
#[cfg(any(test, all(feature = "redis", feature = "internals")))]
pub(crate) fn ring_stamps(raw: &[u8], limit: u64) -> Option<VecDeque<u64>> {
    let body = raw.get(RING_HEAD..)?;
    if body.is_empty() || body.len() % RING_STAMP != 0 {
        return None;
    }
    let n = body.len() / RING_STAMP;
    let head = usize::try_from(u32::from_be_bytes(raw[..RING_HEAD].try_into().ok()?)).ok()?;
    if head >= n {
        return None;
    }
    let base = n.saturating_sub(usize::try_from(limit).unwrap_or(usize::MAX));
    let stamp = |slot: usize| {
        let at = slot * RING_STAMP;
        body[at..at + RING_STAMP]
            .iter()
            .fold(0u64, |n, byte| (n << 8) | u64::from(*byte))
    };
    Some((base..n).map(|i| stamp((head + i) % n)).collect())
}

#[cfg(test)]
mod tests {
    use super::super::refund as refund_any;
    use super::super::tests::{charged_after, readmitted_at, refunded_after, run};
    use super::*;
    use std::time::Duration;

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
    fn a_ring_reads_oldest_first_from_its_head() {
        let ring = |head: u32, stamps: &[u64]| {
            let mut raw = head.to_be_bytes().to_vec();
            for s in stamps {
                raw.extend_from_slice(&s.to_be_bytes()[2..]);
            }
            raw
        };
        // Filling: in order from slot 0.
        assert_eq!(
            ring_stamps(&ring(0, &[5, 7, 9]), 4),
            Some(VecDeque::from([5, 7, 9]))
        );
        // Full and turned: the oldest is at the head.
        assert_eq!(
            ring_stamps(&ring(2, &[30, 40, 10, 20]), 4),
            Some(VecDeque::from([10, 20, 30, 40]))
        );
        // Kept under a larger limit: the newest `limit` count.
        assert_eq!(
            ring_stamps(&ring(0, &[1, 2, 3, 4]), 2),
            Some(VecDeque::from([3, 4]))
        );
        // Stamps are 48 bits.
        let big = (1 << 47) + 3;
        assert_eq!(
            ring_stamps(&ring(0, &[big]), 4),
            Some(VecDeque::from([big]))
        );
        // Not a ring: too short, a torn stamp, a head past the end.
        assert_eq!(ring_stamps(b"abc", 4), None);
        assert_eq!(ring_stamps(&ring(0, &[]), 4), None);
        assert_eq!(ring_stamps(&[ring(0, &[1]), vec![0]].concat(), 4), None);
        assert_eq!(ring_stamps(&ring(1, &[1]), 4), None);
    }

    #[test]
    fn a_refund_takes_back_only_stamps_still_in_the_window() {
        let sl = Policy::sliding_log("sl", 4, Duration::from_secs(1)).unwrap();
        assert_eq!(
            refunded_after(&sl, &[(0, 1), (600, 2)], 1_200, 4),
            Some(State::SlidingLog {
                stamps: VecDeque::from([0])
            }),
            "only stamps still in the window leave"
        );
        assert_eq!(refunded_after(&sl, &[(0, 1)], 1_000, 1), None);
        assert_eq!(refund_any(&sl, None, 0, 1), None);
    }

    #[test]
    fn a_charge_past_the_limit_fills_the_log_for_one_window() {
        let sl = Policy::sliding_log("sl", 3, Duration::from_secs(1)).unwrap();
        // 5 stamps at 100: the log keeps its last 3, so the debt is one full window.
        let (charged, ttl) = charged_after(&sl, &[(0, 1)], 100, 5);
        assert_eq!(
            charged,
            State::SlidingLog {
                stamps: VecDeque::from([100, 100, 100])
            }
        );
        assert_eq!(ttl, 1_000);
        assert_eq!(readmitted_at(&sl, &charged, ttl, 200), 1_100);
        // Fewer than the limit keep the stamps before them.
        assert_eq!(
            charged_after(&sl, &[(0, 1)], 100, 1).0,
            State::SlidingLog {
                stamps: VecDeque::from([0, 100])
            }
        );
        // A clock gone back stamps at the newest stamp, as the check does.
        assert_eq!(
            charged_after(&sl, &[(900, 1)], 400, 1),
            (
                State::SlidingLog {
                    stamps: VecDeque::from([900, 900])
                },
                1_500
            )
        );
    }
}
