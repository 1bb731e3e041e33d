//! The replies, decoded once by their `FromRedisValue` impls into one type per
//! layout: [`Reply`] (a check, an admin operation, a give-back), [`LeaseReply`]
//! (a leasing check), [`BatchReply`] (a batch). Anything else the server sends is a
//! protocol error, never a decision and never a panic.

use std::sync::Arc;

use deadpool_redis::redis::{FromRedisValue, ParsingError, Value};
use smallvec::SmallVec;

use super::*;
use crate::algorithm::Grant;
use crate::decision::{Decision, PolicyOutcome};
use crate::error::{StoreError, StoreErrorKind};
use crate::policy::Policy;
use crate::store::backend::Operation;

/// One policy's outcome, as the Lua packs it ([`PACK_REMAINING_BITS`]...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PolicyReply {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_ms: u64,
    pub(crate) retry_after_ms: u64,
}

impl PolicyReply {
    fn outcome(self, policy: &Policy) -> PolicyOutcome {
        PolicyOutcome {
            allowed: self.allowed,
            limit: policy.limit(),
            remaining: self.remaining,
            reset_after_ms: self.reset_after_ms,
            retry_after_ms: self.retry_after_ms,
        }
    }
}

/// The largest integer a reply may hold, and every smaller one: a double's exact
/// integers (2^53).
const EXACT: f64 = 9_007_199_254_740_992.0;

/// A reply's integers: one alone (a lone outcome that packs into one integer), or
/// the string the Lua packs them into (lua/common.lua's `packed`: big-endian doubles,
/// 8 bytes each, every one an integer below 2^53 in magnitude).
pub(crate) fn integers<C: Default + Extend<i64>>(value: Value) -> Result<C, ParsingError> {
    let mut ints = C::default();
    match value {
        Value::Int(n) => ints.extend([n]),
        Value::BulkString(bytes) if bytes.len() % 8 == 0 => {
            for chunk in bytes.chunks_exact(8) {
                let mut be = [0u8; 8];
                be.copy_from_slice(chunk);
                let x = f64::from_be_bytes(be);
                if !(x.fract() == 0.0 && x.abs() < EXACT) {
                    return Err(format!("expected packed integers, got {x}").into());
                }
                ints.extend([x as i64]);
            }
        }
        other => return Err(format!("expected packed integers, got {other:?}").into()),
    }
    Ok(ints)
}

/// `ints` as the Lua packs a reply of more than one integer (lua/common.lua's
/// `packed`), for tests that hand the decoder a reply.
#[cfg(test)]
pub(crate) fn packed(ints: &[i64]) -> Value {
    Value::BulkString(
        ints.iter()
            .flat_map(|&n| (n as f64).to_be_bytes())
            .collect(),
    )
}

/// The packed outcomes in `ints`, every one of them (see [`PACK_REMAINING_BITS`]).
fn policies_of<C: Default + Extend<PolicyReply>>(ints: &[i64]) -> Result<C, ParsingError> {
    const REMAINING_MASK: u64 = (1 << PACK_REMAINING_BITS) - 1;
    let mut replies = C::default();
    let mut rest = ints.iter().copied();
    while let Some(first) = rest.next() {
        let mut next = || {
            rest.next()
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| {
                    ParsingError::from(format!("a packed outcome ends early after {first}"))
                })
        };
        let reply = if let Ok(n) = u64::try_from(first) {
            let allowed = n & 1 == 1;
            PolicyReply {
                allowed,
                remaining: (n >> 1) & REMAINING_MASK,
                reset_after_ms: n >> (1 + PACK_REMAINING_BITS),
                retry_after_ms: if allowed { 0 } else { next()? },
            }
        } else if first == PACK_WIDE_ALLOWED || first == PACK_WIDE_DENIED {
            PolicyReply {
                allowed: first == PACK_WIDE_ALLOWED,
                remaining: next()?,
                reset_after_ms: next()?,
                retry_after_ms: next()?,
            }
        } else {
            return Err(format!("expected a packed outcome, got {first}").into());
        };
        replies.extend([reply]);
    }
    Ok(replies)
}

/// The reply of a check, an admin operation or a give-back: every policy's
/// outcome, in the order of the call's policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply(pub(crate) SmallVec<[PolicyReply; 4]>);

impl FromRedisValue for Reply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let ints: SmallVec<[i64; 8]> = integers(value)?;
        Ok(Self(policies_of(&ints)?))
    }
}

/// A reply for `policies` that has another number of them: a protocol error.
fn count_error(expected: usize, got: usize) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("expected {expected} outcomes, got {got}"),
    )
}

impl Reply {
    /// The decision over `policies`, the call's of `cost`.
    pub(crate) fn decision(
        self,
        policies: &Arc<[Policy]>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        if self.0.len() != policies.len() {
            return Err(count_error(policies.len(), self.0.len()));
        }
        let outcomes = policies.iter().zip(self.0).map(|(p, r)| r.outcome(p));
        Ok(Decision::from_outcomes(policies, outcomes, cost))
    }

    /// The decision of a call of `op` over `policies`, the call's of `cost`: a
    /// check's ([`Reply::decision`]), or an admin operation's, every policy's outcome
    /// kept, figured for the cost it answers for ([`Op::answered_cost`]).
    pub(crate) fn decision_of(
        self,
        op: Op,
        policies: &Arc<[Policy]>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        match op {
            Op::Run(Operation::Check) | Op::Lease | Op::GiveBack => self.decision(policies, cost),
            _ => self.decision_each(policies, op.answered_cost(cost)),
        }
    }

    /// [`Reply::decision`] with every policy's outcome kept (an admin operation's).
    pub(crate) fn decision_each(
        self,
        policies: &Arc<[Policy]>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        if self.0.len() != policies.len() {
            return Err(count_error(policies.len(), self.0.len()));
        }
        let outcomes: Arc<[_]> = policies
            .iter()
            .zip(self.0)
            .map(|(p, r)| r.outcome(p))
            .collect();
        Ok(Decision::from_outcomes(policies, outcomes.iter().copied(), cost).with_each(outcomes))
    }
}

/// The reply of a leasing check: the policies' outcomes, then the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    pub(crate) policies: Reply,
    pub(crate) grant: Grant,
}

impl FromRedisValue for LeaseReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let ints: SmallVec<[i64; 16]> = integers(value)?;
        let Some(split) = ints.len().checked_sub(LEASE_FIELDS) else {
            return Err(format!(
                "expected {LEASE_FIELDS} lease integers after the policies', got {}",
                ints.len()
            )
            .into());
        };
        let (per_policy, lease) = ints.split_at(split);
        let field = |at: usize| u64::try_from(lease[at - 1]).ok();
        let (Some(units), Some(window_left), Some(again), Some(window_end), Some(epoch)) = (
            field(LEASE_GRANT),
            field(LEASE_WINDOW_LEFT),
            field(LEASE_AGAIN),
            field(LEASE_WINDOW_END),
            field(LEASE_EPOCH),
        ) else {
            return Err(
                format!("expected {LEASE_FIELDS} non-negative integers, got {lease:?}").into(),
            );
        };
        Ok(Self {
            policies: Reply(policies_of(per_policy)?),
            grant: Grant {
                units,
                window_left_ms: (window_left > 0).then_some(window_left),
                ask_again_ms: again,
                window_end_ms: (window_end > 0).then_some(window_end),
                epoch,
            },
        })
    }
}

impl LeaseReply {
    /// The decision over `policies`, the call's of `cost`, and the lease.
    pub(crate) fn decision(
        self,
        policies: &Arc<[Policy]>,
        cost: u64,
    ) -> Result<(Decision, Grant), StoreError> {
        Ok((self.policies.decision(policies, cost)?, self.grant))
    }
}

/// A record of a batch, as its reply is read: its operation, policies and cost (a
/// call the arguments sent; the reply knows nothing of how).
pub(crate) trait Checked {
    fn op(&self) -> Op;
    fn policies(&self) -> &Arc<[Policy]>;
    fn cost(&self) -> u64;
}

/// The reply of a batch: every record's policies' outcomes, record after record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchReply(pub(crate) Vec<PolicyReply>);

impl FromRedisValue for BatchReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let ints: Vec<i64> = integers(value)?;
        Ok(Self(policies_of(&ints)?))
    }
}

impl BatchReply {
    /// Each record's decision, in the order of `calls`, the batch's (as
    /// [`Reply::decision_of`]); a protocol error when the reply holds another number
    /// of outcomes than they have policies.
    pub(crate) fn decisions<C: Checked>(self, calls: &[C]) -> Result<Vec<Decision>, StoreError> {
        let expected: usize = calls.iter().map(|c| c.policies().len()).sum();
        if self.0.len() != expected {
            return Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!(
                    "expected {expected} outcomes for a batch of {} records, got {}",
                    calls.len(),
                    self.0.len()
                ),
            ));
        }
        let mut replies = self.0.into_iter();
        calls
            .iter()
            .map(|call| {
                let outcomes: SmallVec<[_; 4]> =
                    replies.by_ref().take(call.policies().len()).collect();
                Reply(outcomes).decision_of(call.op(), call.policies(), call.cost())
            })
            .collect()
    }
}

/// Decodes `value` as `T`: a reply of another shape is a protocol error.
pub(crate) fn decode<T: FromRedisValue>(value: Value) -> Result<T, StoreError> {
    T::from_redis_value(value).map_err(|e| StoreError::new(StoreErrorKind::Protocol, e.to_string()))
}
