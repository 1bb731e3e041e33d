// The conformance traces: policies, steps of (time advance in ms, cost), and whether
// each step is admitted, written by hand from each algorithm's definition.
//
// One table for the model's tests (a module of src/algorithm/) and the store tests
// (through `redlimit::internals::traces`).
//
// A trace runs on a fake clock that starts at `start_ms`; a negative advance is a
// clock going backwards (a failover to a server whose clock is behind).

use std::time::Duration;

use crate::policy::Policy;

/// One policy of a trace, as plain numbers.
#[derive(Debug, Clone, Copy)]
pub enum Spec {
    /// `Policy::fixed_window(name, limit, window_ms)`.
    Fixed(&'static str, u32, u64),
    /// `Policy::sliding_window(name, limit, window_ms)`.
    Sliding(&'static str, u32, u64),
    /// `Policy::sliding_log(name, limit, window_ms)`.
    Log(&'static str, u32, u64),
    /// `Policy::token_bucket(name, capacity, refill, period_ms)`.
    Bucket(&'static str, u32, u32, u64),
    /// The inner policy in shadow mode (`.shadow()`): decides, never denies.
    Shadow(&'static Spec),
}

impl Spec {
    /// The policy these numbers describe.
    pub fn policy(self) -> Policy {
        let ms = Duration::from_millis;
        let built = match self {
            Spec::Fixed(name, limit, w) => Policy::fixed_window(name, limit, ms(w)),
            Spec::Sliding(name, limit, w) => Policy::sliding_window(name, limit, ms(w)),
            Spec::Log(name, limit, w) => Policy::sliding_log(name, limit, ms(w)),
            Spec::Bucket(name, capacity, refill, period) => {
                Policy::token_bucket(name, capacity, refill, ms(period))
            }
            Spec::Shadow(inner) => Ok(inner.policy().shadow()),
        };
        match built {
            Ok(policy) => policy,
            Err(e) => panic!("trace policy {self:?} is invalid: {e}"),
        }
    }
}

/// A step: advance the clock by this many ms (negative: backwards), ask for `cost`,
/// expect `allowed`.
pub type Step = (i64, u32, bool);

/// One trace of the table.
#[derive(Debug)]
pub struct Trace {
    /// What the trace shows.
    pub name: &'static str,
    /// The fake clock's reading before the first step.
    pub start_ms: u64,
    /// The policies checked together, in order.
    pub policies: &'static [Spec],
    /// Refunds `(i, cost)`: at step `i`'s time, before its check, give back `cost`.
    pub refunds: &'static [(usize, u32)],
    /// The steps, in order.
    pub steps: &'static [Step],
    /// The steps that are allowed only because a shadow policy does not deny.
    pub would_deny: &'static [usize],
}

impl Trace {
    /// The trace's policies, built.
    pub fn built_policies(&self) -> Vec<Policy> {
        self.policies.iter().map(|s| s.policy()).collect()
    }

    /// The refund to make before step `i`, if any.
    pub fn refund_before(&self, i: usize) -> Option<u32> {
        self.refunds
            .iter()
            .find(|(at, _)| *at == i)
            .map(|(_, cost)| *cost)
    }

    /// The clock reading at each step.
    pub fn times(&self) -> Vec<u64> {
        let mut now = self.start_ms as i64;
        self.steps
            .iter()
            .map(|&(advance, _, _)| {
                now += advance;
                now as u64
            })
            .collect()
    }
}

const Y: bool = true;
const N: bool = false;

/// The table.
pub const TRACES: &[Trace] = &[
    Trace {
        name: "fixed window: fills, denies to the end of the window, resets on the aligned boundary",
        start_ms: 10_000,
        policies: &[Spec::Fixed("fw", 3, 1_000)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, N),
            (999, 1, N), // 10 999: last ms of the window
            (1, 1, Y),   // 11 000: a new window
            (0, 2, Y),
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "fixed window: a cost above what is left is denied and consumes nothing",
        start_ms: 20_500,
        policies: &[Spec::Fixed("fw", 5, 1_000)],
        refunds: &[],
        steps: &[
            (0, 3, Y),
            (1, 3, N),
            (1, 2, Y),
            (1, 1, N),
            (496, 1, N), // 20 999
            (1, 5, Y),   // 21 000: the whole limit at once
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "fixed window: a clock that goes back stays in the stored window",
        start_ms: 30_000,
        policies: &[Spec::Fixed("fw", 2, 1_000)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (-1_500, 1, N), // 28 500: window 30 is kept, and full
            (1_500, 1, N),  // 30 000
            (1_000, 1, Y),  // 31 000
            (-200, 1, Y),   // 30 800: clamped into window 31, which has room for one
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "sliding window: the previous window's weight decays with the elapsed time",
        start_ms: 40_000,
        policies: &[Spec::Sliding("sw", 10, 1_000)],
        refunds: &[],
        steps: &[
            (0, 5, Y),
            (0, 5, Y),
            (0, 1, N),
            (999, 1, N),   // 40 999
            (1, 1, N),     // 41 000: 10 x 1.0 + 1 > 10
            (100, 1, Y),   // 41 100: 10 x 0.9 + 1 <= 10
            (0, 1, N),     // 10 x 0.9 + 2 > 10
            (100, 1, Y),   // 41 200: 10 x 0.8 + 2 <= 10
            (50, 1, N),    // 41 250: 10 x 0.75 + 3 > 10
            (50, 1, Y),    // 41 300: 10 x 0.7 + 3 <= 10, exactly
            (2_000, 10, Y), // 43 300: two windows later, nothing is left
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "sliding window: a clock that goes back is clamped to the stored window's start",
        start_ms: 50_500,
        policies: &[Spec::Sliding("sw", 4, 1_000)],
        refunds: &[],
        steps: &[
            (0, 4, Y),
            (-2_000, 1, N), // 48 500: clamped to 50 000, window 50 is full
            (1_500, 1, N),  // 50 000
            (1_000, 1, N),  // 51 000: 4 x 1.0 + 1 > 4
            (250, 1, Y),    // 51 250: 4 x 0.75 + 1 <= 4
            (-1_000, 1, N), // 50 250: clamped to 51 000: 4 x 1.0 + 2 > 4
        ],
        would_deny: &[],
    },
    Trace {
        name: "token bucket: a burst of the capacity, then one token per second",
        start_ms: 60_000,
        policies: &[Spec::Bucket("tb", 5, 1, 1_000)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, N),
            (999, 1, N), // 60 999: the first token is 1 ms away
            (1, 1, Y),   // 61 000
            (0, 1, N),
            (2_000, 2, Y), // 63 000: two tokens
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "token bucket: a clock that goes back never refills; idle time refills to the capacity only",
        start_ms: 70_000,
        policies: &[Spec::Bucket("tb", 3, 2, 1_000)],
        refunds: &[],
        steps: &[
            (0, 3, Y),
            (0, 1, N),
            (-5_000, 1, N), // 65 000: clamped to the moment the bucket was empty
            (5_499, 1, N),  // 70 499: the first token comes at 70 500
            (1, 1, Y),      // 70 500
            (10_000, 3, Y), // 80 500: full again, never more than the capacity
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "sliding log: exact in every window, costs need that many stamps to leave",
        start_ms: 80_000,
        policies: &[Spec::Log("sl", 3, 1_000)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (100, 1, Y),
            (100, 1, Y),   // 80 200: full
            (799, 1, N),   // 80 999: 80 000 is still in the window
            (1, 1, Y),     // 81 000: 80 000 has left it
            (0, 1, N),
            (100, 2, N),   // 81 100: cost 2 needs 80 100 and 80 200 gone
            (100, 2, Y),   // 81 200
            (-4_000, 1, N), // 77 200: four windows back, clamped to the newest stamp
            (5_000, 3, Y), // 82 200: the whole limit once 81 200 has left
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "fixed window: a window more than four windows ahead of the clock is foreign",
        start_ms: 100_000,
        policies: &[Spec::Fixed("fw", 2, 1_000)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, N),
            (-4_000, 1, N), // 96 000: window 100 is four ahead: kept, full
            (-1, 1, Y),     // 95 999: five ahead: foreign, counting starts fresh
            (0, 1, Y),
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "sliding window: a window more than four windows ahead of the clock is foreign",
        start_ms: 110_000,
        policies: &[Spec::Sliding("sw", 2, 1_000)],
        refunds: &[],
        steps: &[
            (0, 2, Y),
            (0, 1, N),
            (-4_000, 1, N), // 106 000: clamped to 110 000, full
            (-1, 1, Y),     // 105 999: window 110 is five ahead: foreign
            (0, 1, Y),
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "token bucket: an arrival time more than five fill times ahead is foreign",
        start_ms: 120_000,
        policies: &[Spec::Bucket("tb", 2, 1, 1_000)],
        refunds: &[],
        steps: &[
            (0, 2, Y),      // arrival time 122 000; the fill time is 2 000
            (0, 1, N),
            (-8_000, 1, N), // 112 000: five fill times ahead: clamped, empty
            (-1, 1, Y),     // 111 999: further: foreign, a full bucket
            (0, 1, Y),
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "sliding log: a newest stamp more than four windows ahead is foreign",
        start_ms: 130_000,
        policies: &[Spec::Log("sl", 2, 1_000)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, N),
            (-4_000, 1, N), // 126 000: clamped to the newest stamp, 130 000
            (-1, 1, Y),     // 125 999: foreign: an empty log
            (0, 1, Y),
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "sliding log: the ring wraps, costs > 1 across the end of the ring",
        start_ms: 90_000,
        policies: &[Spec::Log("sl", 4, 100)],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (10, 1, Y),
            (10, 1, Y),
            (10, 1, Y),   // 90 030: full
            (70, 1, Y),   // 90 100: 90 000 leaves, its slot is reused
            (10, 2, N),   // 90 110: 90 010 and 90 020 must leave
            (10, 2, Y),   // 90 120
            (10, 2, N),   // 90 130
            (70, 2, Y),   // 90 200: written across the ring's end
            (0, 1, N),
            (20, 1, Y),   // 90 220
            (1_000, 4, Y), // 91 220: the whole limit
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "two policies: a denial by either consumes from neither",
        start_ms: 120_000,
        policies: &[
            Spec::Fixed("second", 2, 1_000),
            Spec::Sliding("minute", 5, 60_000),
        ],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, N),     // "second" denies; "minute" keeps 2
            (1_000, 1, Y), // minute: 3
            (0, 1, Y),     // minute: 4
            (1_000, 1, Y), // minute: 5
            (0, 1, N),     // "minute" denies; "second" keeps 1
            (1_000, 2, N), // "minute" still denies
        ],
        would_deny: &[],
    },
    Trace {
        name: "three policies, costs > 1: burst, log and day each bind in turn",
        start_ms: 86_400_000,
        policies: &[
            Spec::Bucket("burst", 4, 2, 1_000),
            Spec::Log("log", 6, 10_000),
            Spec::Fixed("day", 100, 86_400_000),
        ],
        refunds: &[],
        steps: &[
            (0, 2, Y),
            (0, 2, Y),     // burst empty
            (0, 1, N),     // burst denies
            (500, 1, Y),   // one token back
            (1_000, 2, N), // burst has 2, the log holds 5 of 6: log denies
            (0, 1, Y),
            (0, 1, N),     // the log is full
            (8_500, 1, Y), // 10 000 ms after the first stamps
        ],
        would_deny: &[],
    },
    Trace {
        name: "shadow: never denies; consumes only when it and the enforced policies admit",
        start_ms: 300_000,
        policies: &[
            Spec::Fixed("second", 2, 1_000),
            Spec::Shadow(&Spec::Fixed("minute", 5, 60_000)),
        ],
        refunds: &[],
        steps: &[
            (0, 1, Y),     // second 1, minute 1
            (0, 1, Y),     // second 2, minute 2
            (0, 1, N),     // "second" denies: "minute" consumes nothing
            (1_000, 1, Y), // minute 3
            (0, 1, Y),     // minute 4
            (1_000, 1, Y), // minute 5
            (0, 1, Y),     // "minute" would deny: allowed, and it stays at 5
            (0, 1, N),     // "second" denies
            (1_000, 1, Y), // "minute" would deny
        ],
        would_deny: &[6, 8],
    },
    Trace {
        name: "shadow only: every request passes; the bucket drains only by what it admits",
        start_ms: 400_000,
        policies: &[Spec::Shadow(&Spec::Bucket("tb", 2, 1, 1_000))],
        refunds: &[],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, Y),     // would deny
            (1_000, 1, Y), // one token came back
            (0, 1, Y),     // would deny
        ],
        would_deny: &[2, 4],
    },
    Trace {
        name: "refund, fixed window: gives back in the current window, never below 0",
        start_ms: 500_000,
        policies: &[Spec::Fixed("fw", 3, 1_000)],
        refunds: &[(1, 3), (4, 3)],
        steps: &[
            (0, 2, Y),
            (0, 3, Y),     // after a refund of 3: the count is 0, not below
            (0, 1, N),
            (1_000, 1, Y), // a new window
            (0, 3, Y),     // after a refund of 3: back to 0
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "refund, sliding window: once the window has changed, nothing is refunded",
        start_ms: 600_000,
        policies: &[Spec::Sliding("sw", 4, 1_000)],
        refunds: &[(1, 2), (4, 4)],
        steps: &[
            (0, 4, Y),
            (0, 2, Y),   // after a refund of 2
            (0, 1, N),
            (1_000, 1, N), // 601 000: 4 x 1.0 + 1 > 4
            (250, 2, N), // 601 250: the refund found no current count; 4 x 0.75 + 2 > 4
            (0, 1, Y),   // 4 x 0.75 + 1 <= 4
        ],
        would_deny: &[],
    },
    Trace {
        name: "refund, token bucket: the arrival time moves back, not before now",
        start_ms: 700_000,
        policies: &[Spec::Bucket("tb", 3, 1, 1_000)],
        refunds: &[(2, 1), (4, 3)],
        steps: &[
            (0, 3, Y),
            (0, 1, N),
            (0, 1, Y), // after a refund of 1
            (0, 1, N),
            (0, 3, Y), // after a refund of 3: full again, no fuller
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "refund, sliding log: the most recent stamps still in the window leave",
        start_ms: 800_000,
        policies: &[Spec::Log("sl", 3, 1_000)],
        refunds: &[(4, 2), (6, 3)],
        steps: &[
            (0, 1, Y),   // 800 000
            (500, 1, Y), // 800 500
            (0, 1, Y),   // 800 500: full
            (0, 1, N),
            (0, 2, Y),   // after a refund of 2: only 800 000 is left
            (0, 1, N),
            (700, 3, Y), // 801 200: the refund took both 800 500 stamps, 800 000 had left
            (0, 1, N),
        ],
        would_deny: &[],
    },
    Trace {
        name: "refund, two policies with a shadow: every policy gets the cost back",
        start_ms: 900_000,
        policies: &[
            Spec::Fixed("a", 2, 1_000),
            Spec::Shadow(&Spec::Log("b", 2, 1_000)),
        ],
        refunds: &[(3, 1), (4, 2)],
        steps: &[
            (0, 1, Y),
            (0, 1, Y),
            (0, 1, N),
            (0, 1, Y), // after a refund of 1 from both
            (0, 2, Y), // after a refund of 2 from both
            (0, 1, N),
        ],
        would_deny: &[],
    },
];
