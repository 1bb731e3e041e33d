//! The states the Lua keeps, read back in Rust: for the crate's tests and benches
//! that look at what a call wrote (each `lua/<algorithm>.lua` describes its layout).

use crate::algorithm::{sliding_log_ring_stamps, Holder, State};
use crate::policy::{Algorithm, Policy};

/// Big-endian integers of `width` bytes each, all of `raw`.
fn integers(raw: &[u8], width: usize) -> Vec<u64> {
    raw.chunks_exact(width)
        .map(|bytes| bytes.iter().fold(0, |n, &b| n << 8 | u64::from(b)))
        .collect()
}

/// The state `raw` holds for `policy`, as the model keeps it; `None` for bytes the
/// Lua would read as no state.
pub(crate) fn decode(policy: &Policy, raw: &[u8]) -> Option<State> {
    let pair = |raw: &[u8]| match raw.len() {
        12 => Some(integers(raw, 6)),
        14 => Some(integers(raw, 7)),
        _ => None,
    };
    Some(match policy.algorithm() {
        Algorithm::FixedWindow => {
            let n = pair(raw)?;
            State::FixedWindow {
                window: n[0],
                count: n[1],
            }
        }
        Algorithm::Calendar => {
            let n = pair(raw)?;
            State::Calendar {
                end: n[0],
                count: n[1],
            }
        }
        Algorithm::SlidingWindow => {
            let n = match raw.len() {
                12 => integers(raw, 4),
                21 => integers(raw, 7),
                _ => return None,
            };
            State::SlidingWindow {
                window: n[0],
                prev: n[1],
                cur: n[2],
            }
        }
        Algorithm::TokenBucket => State::TokenBucket {
            tat_us: std::str::from_utf8(raw).ok()?.parse().ok()?,
        },
        Algorithm::SlidingLog => State::SlidingLog {
            stamps: sliding_log_ring_stamps(raw, policy.limit())?,
        },
        Algorithm::InFlight => {
            let holders = if raw.len() == 12 {
                let n = integers(raw, 6);
                vec![Holder {
                    id: n[0],
                    count: 1,
                    expires_ms: n[1],
                }]
            } else if raw.len() >= 35 && (raw.len() - 18).is_multiple_of(17) {
                raw[18..]
                    .chunks_exact(17)
                    .map(|entry| Holder {
                        id: integers(&entry[..6], 6)[0],
                        count: integers(&entry[6..10], 4)[0],
                        expires_ms: integers(&entry[10..], 7)[0],
                    })
                    .collect()
            } else {
                return None;
            };
            State::InFlight { holders }
        }
    })
}

/// The states a joint set's key holds (lua/decide.lua's split), one per policy of its
/// `n`: for each but the last, its length (one byte below 255, else 255 and four bytes
/// big-endian) and its bytes; the last takes the rest. `None` for an empty one, and
/// for all when `raw` is no such layout (the Lua reads it as no state).
pub(crate) fn joint_parts(raw: &[u8], n: usize) -> Vec<Option<&[u8]>> {
    let mut parts = Vec::with_capacity(n);
    let mut rest = raw;
    for _ in 1..n {
        let Some((&first, tail)) = rest.split_first() else {
            return vec![None; n];
        };
        let (len, tail) = if first == 255 {
            let Some((len, tail)) = tail.split_first_chunk::<4>() else {
                return vec![None; n];
            };
            (u32::from_be_bytes(*len) as usize, tail)
        } else {
            (usize::from(first), tail)
        };
        if tail.len() < len {
            return vec![None; n];
        }
        let (part, tail) = tail.split_at(len);
        parts.push((!part.is_empty()).then_some(part));
        rest = tail;
    }
    parts.push((!rest.is_empty()).then_some(rest));
    parts
}

/// The state `raw` holds for `policy` as text: `<window>:<count>`,
/// `<window>:<prev>:<cur>`, `<tat>`, `<end>:<count>`, the stamps joined by `,`, or
/// `<holder, 12 hex digits>:<count>:<expiry>;` per holder; `None` for bytes the Lua
/// would read as no state.
pub(crate) fn render(policy: &Policy, raw: &[u8]) -> Option<String> {
    Some(match decode(policy, raw)? {
        State::FixedWindow { window, count } => format!("{window}:{count}"),
        State::SlidingWindow { window, prev, cur } => format!("{window}:{prev}:{cur}"),
        State::TokenBucket { tat_us } => tat_us.to_string(),
        State::Calendar { end, count } => format!("{end}:{count}"),
        State::SlidingLog { stamps } => {
            let stamps: Vec<String> = stamps.iter().map(u64::to_string).collect();
            stamps.join(",")
        }
        State::InFlight { holders } => holders
            .iter()
            .map(|h| format!("{:012x}:{}:{};", h.id, h.count, h.expires_ms))
            .collect(),
    })
}
