//! What every algorithm reads and writes: the state one subject holds for one policy,
//! the step a decision takes and the commit it makes, and the bounds that keep every
//! state close to the clock and exact in Lua's doubles.

use std::collections::VecDeque;

use crate::decision::PolicyOutcome;

/// One holder's requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The limiter instance ([`Policy::holder`](crate::policy::Policy::holder)).
    pub(crate) id: u64,
    /// Its requests running.
    pub(crate) count: u64,
    /// When the entry stops counting unless renewed, in ms.
    pub(crate) expires_ms: u64,
}

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
    /// Per holder (limiter instance), its requests running and until when they count.
    InFlight { holders: Vec<Holder> },
    /// The end of the calendar period counted (ms) and the count admitted in it.
    Calendar { end: u64, count: u64 },
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
    #[inline]
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
                    // Stamps newer than this one are foreign state the decision read
                    // as an empty log (a clock more than a window behind them).
                    if stamps.back().is_some_and(|newest| *newest > stamp) {
                        stamps.clear();
                    }
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

/// How far a clock may go back, in windows (a token bucket: fill times), and still
/// decide on the stored state: it stays in the stored window, waits for the stored
/// time, never floods. State further ahead of the clock than this is not a clock that
/// went back but state this clock cannot have written (another clock, another
/// release): it is read as fresh, which admits at most one limit more, and never
/// makes a subject wait longer than `MAX_CLOCK_BACK + 1` windows. The Lua reads it as
/// `MAX_BACK`, from the preamble `store/redis/contract` generates.
pub(crate) const MAX_CLOCK_BACK: u64 = 4;

/// Whether a stored window (of a fixed or sliding window of `w` ms) starts more than
/// [`MAX_CLOCK_BACK`] windows after `now`, its index above `now / w + MAX_CLOCK_BACK`:
/// foreign state, not a clock that went back.
#[inline(always)]
pub(crate) fn window_ahead(window: u64, now: u64, w: u64) -> bool {
    window * w > now + MAX_CLOCK_BACK * w
}

/// How much a charge may leave a subject owing, in limits (a token bucket: fill times),
/// all it has consumed and not yet paid back counted (so at most `MAX_DEBT - 1` limits
/// past the limit): [`MAX_CLOCK_BACK`], so that a charged state is never read back as
/// foreign (state ahead of the clock by more than that is).
///
/// A charge consumes `cost` units from a policy whatever its limit, at most up to this
/// bound, counted with what the subject already holds:
///
/// - fixed window: the current window's count is at most `MAX_DEBT` limits; the debt
///   ends with the window (the next window starts at 0), so the subject is admitted
///   again at the next window's start at the latest;
/// - sliding window: the sliding count (the current window's count and the previous
///   one's weighted) is at most `MAX_DEBT` limits, and every product of a count and the
///   window stays under 2^53 (the count at most `(2^53 - 1) / window`); the current
///   count carries into the next window as its previous one, so the subject is admitted
///   again by the end of the next window at the latest (by the check's own rule);
/// - token bucket: the arrival time is at most `MAX_DEBT` fill times after now, one
///   fill time short of what a check reads as foreign (`MAX_CLOCK_BACK + 1` fill
///   times), so a clock may still go back a fill time after the largest charge; the
///   subject is admitted again (a cost of 1) at most `MAX_DEBT - 1` fill times and one
///   emission interval after the charge;
/// - sliding log: the log keeps its last `limit` stamps, so its debt is at most one
///   full window: `cost` is at most `limit` stamps, and the subject is admitted again
///   one window after the charge at the latest.
///
/// Each state stays as close to the clock as a check's own: a window index is never
/// moved ahead of the one a check uses, a token bucket's arrival time stays within
/// [`MAX_CLOCK_BACK`] fill times of now, a log's newest stamp is the check's clamped
/// now. Every number is at most `MAX_DEBT` times what a check stores, exact in Lua's
/// doubles (policies keep limit x window under 2^53, and the sliding window is bounded
/// apart since it multiplies counts by the window).
pub(crate) const MAX_DEBT: u64 = MAX_CLOCK_BACK;

/// Largest integer below 2^53: every product the Lua computes must stay at most this.
pub(crate) const MAX_EXACT: u64 = (1 << 53) - 1;
