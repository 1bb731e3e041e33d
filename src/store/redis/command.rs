//! One encoder per call shape: a [`Call`] of a [`CallShape`] (a check, any store
//! operation, a leasing check, a give-back) or a [`Batch`] of checks writes its
//! keys and arguments in the order [`contract`](super::contract)'s positions name, so the Lua finds
//! each where it reads it.

use std::sync::Arc;

use deadpool_redis::redis::{Cmd, FromRedisValue};
use smallvec::SmallVec;

use super::contract::reply::{BatchReply, Checked, LeaseReply, Reply};
use super::contract::*;
use super::keys::{lease_key_of, push_policy_suffix};
use super::script::{batch_script, Library, Shape, ShapeScript, Via};
use crate::algorithm::calendar;
use crate::clock::{Clock, SystemClock};
use crate::policy::{Algorithm, Policy, Unit};
use crate::store::backend::Operation;
use crate::store::lease::{GiveBack, LeaseAsk};

// The encoders write a call's arguments one after the other: these are the
// positions that order gives, checked where the positions are defined.
const _: () = assert!(ARG_COST == 1 && FIRST_CHECK == ARG_COST + 1);
const _: () = assert!(ARG_OP == ARG_COST + 1 && FIRST_ADMIN == ARG_OP + 1);
const _: () = assert!(ARG_WANT == ARG_COST + 1 && ARG_BATCH == ARG_WANT + 1);
const _: () = assert!(FIRST_LEASE == ARG_BATCH + 1);
const _: () = assert!(ARG_BEFORE == ARG_COST + 1 && ARG_EPOCH == ARG_BEFORE + 1);
const _: () = assert!(FIRST_GIVE_BACK == ARG_EPOCH + 1);
const _: () = assert!(POLICY_CODE == 0 && POLICY_LIMIT == 1 && POLICY_N == 2 && POLICY_ARGS == 3);
const _: () = assert!(BATCH_MODE == 1 && BATCH_SETS == 2);

/// What one call of one subject carries, whatever its shape: kept whole so the
/// same call can be sent again as `EVAL` when the server lost its script.
#[derive(Debug)]
pub(crate) struct Call<S> {
    /// `prefix:{subject}:<set tag>:`, the part every key of the subject shares.
    pub(crate) key_base: String,
    /// A scoped set's keys, one per policy in order (their subjects differ), in place
    /// of `key_base` and the policies' suffixes.
    pub(crate) own_keys: Option<Box<[String]>>,
    /// The client's time in ms, or `None` for Redis `TIME`.
    pub(crate) now_ms: Option<u64>,
    pub(crate) cost: u64,
    pub(crate) policies: Arc<[Policy]>,
    pub(crate) shape: S,
}

impl Checked for Call<Check> {
    fn policies(&self) -> &Arc<[Policy]> {
        &self.policies
    }
    fn cost(&self) -> u64 {
        self.cost
    }
}

/// A call shape: its operation (whence its entry point and whether it names the lease
/// generation key), the arguments between its cost and its policies', and its typed
/// reply.
pub(crate) trait CallShape: Send + Sync {
    type Reply: FromRedisValue;
    fn op(&self) -> Op;
    /// Writes its own arguments, from `ARG_COST + 1` to its first policy's.
    fn push_head(&self, _cmd: &mut Cmd) {}
}

/// A plain check: `cost, policies.., [clock]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Check;

impl CallShape for Check {
    type Reply = Reply;
    fn op(&self) -> Op {
        Op::Run(Operation::Check)
    }
}

/// Any store operation: a check as [`Check`] sends it, an admin operation as `cost,
/// op, policies.., [clock]`; a reset names the lease generation key too, to delete
/// it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run(pub(crate) Operation);

impl CallShape for Run {
    type Reply = Reply;
    fn op(&self) -> Op {
        Op::Run(self.0)
    }
    fn push_head(&self, cmd: &mut Cmd) {
        if self.op().entry() == Entry::Admin {
            cmd.arg(self.op().letter());
        }
    }
}

/// A leasing check: `cost, want, batch, policies.., [clock]`, and the lease
/// generation key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leasing(pub(crate) LeaseAsk);

impl CallShape for Leasing {
    type Reply = LeaseReply;
    fn op(&self) -> Op {
        Op::Lease
    }
    fn push_head(&self, cmd: &mut Cmd) {
        cmd.arg(self.0.want).arg(self.0.batch);
    }
}

/// A lease's give-back: `units, before_ms, epoch, policies.., [clock]`, and the
/// lease generation key (read: the units go back only while it is `epoch`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GivingBack(pub(crate) GiveBack);

impl CallShape for GivingBack {
    type Reply = Reply;
    fn op(&self) -> Op {
        Op::GiveBack
    }
    fn push_head(&self, cmd: &mut Cmd) {
        cmd.arg(self.0.before_ms).arg(self.0.epoch);
    }
}

/// What the store sends in one round trip: one call, or a batch of checks.
pub(crate) trait Request: Send + Sync {
    /// The reply, decoded once.
    type Reply: FromRedisValue;
    /// The command, sent `via` a function or a script.
    fn command(&self, via: Via) -> Cmd;
}

/// A plain command (live limits: `HGET`, `HSET`...), the same whichever way the
/// store's calls reach the Lua.
pub(crate) struct Plain(pub(crate) Cmd);

impl Request for Plain {
    type Reply = deadpool_redis::redis::Value;
    fn command(&self, _via: Via) -> Cmd {
        self.0.clone()
    }
}

/// The start of a command: the library's function, or the script by hash or source.
fn start(via: Via, function: &str, script: impl FnOnce() -> &'static ShapeScript) -> Cmd {
    match via {
        Via::Function => {
            let mut cmd = deadpool_redis::redis::cmd("FCALL");
            cmd.arg(function);
            cmd
        }
        Via::Script => {
            let mut cmd = deadpool_redis::redis::cmd("EVALSHA");
            cmd.arg(script().sha1());
            cmd
        }
        Via::ScriptSource => {
            let mut cmd = deadpool_redis::redis::cmd("EVAL");
            cmd.arg(script().source());
            cmd
        }
    }
}

impl<S: CallShape> Request for Call<S> {
    type Reply = S::Reply;

    /// `numkeys, keys.., cost, head.., policies.., [clock]`, whichever way it goes.
    fn command(&self, via: Via) -> Cmd {
        let op = self.shape.op();
        let entry = op.entry();
        let mut cmd = start(via, Library::get().function(entry), || {
            Shape::of(&self.policies, entry).script()
        });
        let lease_key = op.names_lease_key();
        cmd.arg(self.policies.len() + usize::from(lease_key));
        push_keys(&mut cmd, self);
        if lease_key {
            cmd.arg(lease_key_of(&self.key_base));
        }
        cmd.arg(self.cost);
        self.shape.push_head(&mut cmd);
        for policy in self.policies.iter() {
            push_policy_args(&mut cmd, policy, self.now_ms);
        }
        // Without a client clock the Lua reads Redis `TIME`.
        if let Some(ms) = self.now_ms {
            cmd.arg(ms);
        }
        cmd
    }
}

/// Appends the key of each policy of `call`, in order.
fn push_keys<S>(cmd: &mut Cmd, call: &Call<S>) {
    if let Some(keys) = &call.own_keys {
        for key in keys.iter() {
            cmd.arg(key.as_str());
        }
        return;
    }
    let mut key = String::with_capacity(call.key_base.len() + 24);
    for policy in call.policies.iter() {
        key.clear();
        key.push_str(&call.key_base);
        push_policy_suffix(&mut key, policy);
        cmd.arg(key.as_str());
    }
}

/// Appends a policy's [`POLICY_ARGS`] arguments: its algorithm's code, its limit
/// (negative for a shadow policy: one argument fewer per policy) and the one
/// duration its algorithm reads; a calendar quota's is the end of the period that
/// `now_ms` (the client's clock), else the system clock, is in: the Lua has no zone
/// database (lua/calendar.lua says what it makes of a now past that end).
fn push_policy_args(cmd: &mut Cmd, policy: &Policy, now_ms: Option<u64>) {
    let algorithm = policy.algorithm();
    let limit = i64::try_from(policy.limit()).unwrap_or(i64::MAX);
    let limit = if policy.is_shadow() { -limit } else { limit };
    let n = match algorithm {
        Algorithm::TokenBucket => policy.emission_interval_us(),
        Algorithm::Calendar => {
            let now = now_ms.unwrap_or_else(|| SystemClock.now_ms());
            calendar::period_at(policy, now).1
        }
        _ => policy.window_ms(),
    };
    if algorithm == Algorithm::InFlight {
        // The code carries whose slots these are, in 16 hex digits after it
        // (`if00000000000000ab`), read in read_policies.
        cmd.arg(format!("{}{:016x}", code(algorithm), policy.holder()));
    } else if policy.unit() == Unit::Requests {
        // One unit a request whatever its cost: the code, then UNIT_REQUESTS.
        cmd.arg(format!("{}{UNIT_REQUESTS}", code(algorithm)));
    } else {
        cmd.arg(code(algorithm));
    }
    cmd.arg(limit).arg(n);
}

/// Plain checks sent as one call of the library's batch function (`lua/batch.lua`):
/// each decided as its own call would be, in order.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) calls: Vec<Call<Check>>,
}

impl Request for Batch {
    type Reply = BatchReply;

    /// `numkeys keys.. mode nsets (p (code limit n)*p)* sets 1|n costs.. ms..`: each
    /// policy set is sent once, however many of the batch's checks use it.
    fn command(&self, via: Via) -> Cmd {
        let mut cmd = start(via, &Library::get().batch, batch_script);
        // The batch's policy sets, by identity: a limiter's checks share its set.
        let mut sets: SmallVec<[&Arc<[Policy]>; 4]> = SmallVec::new();
        let mut set_of: SmallVec<[usize; 64]> = SmallVec::new();
        for call in &self.calls {
            let found = sets.iter().position(|s| Arc::ptr_eq(s, &call.policies));
            set_of.push(found.unwrap_or_else(|| {
                sets.push(&call.policies);
                sets.len() - 1
            }));
        }
        let keys: usize = self.calls.iter().map(|c| c.policies.len()).sum();
        cmd.arg(keys);
        for call in &self.calls {
            push_keys(&mut cmd, call);
        }
        // The batcher never mixes the two clocks in one batch.
        let client_clock = self.calls.iter().any(|c| c.now_ms.is_some());
        // Whether a subject comes twice: only then does the batch keep what it
        // writes for the checks after, and write each state once.
        // A scoped check's keys meet other subjects' (an org's, everyone's): taken as
        // a repeat.
        let mut subjects = std::collections::HashSet::with_capacity(self.calls.len());
        let repeats = !self
            .calls
            .iter()
            .all(|c| c.own_keys.is_none() && subjects.insert(c.key_base.as_str()));
        let mut mode = String::with_capacity(2);
        mode.push_str(if client_clock {
            BATCH_CLIENT_CLOCK
        } else {
            BATCH_REDIS_CLOCK
        });
        if repeats {
            mode.push_str(BATCH_REPEATS);
        }
        cmd.arg(mode).arg(sets.len());
        // A set is sent once for all its checks: a calendar quota's period is the one
        // its first check's clock is in (the Lua decides a later check past its end
        // as at the period's last millisecond).
        let first_now = self.calls.first().and_then(|c| c.now_ms);
        for set in &sets {
            cmd.arg(set.len());
            for policy in set.iter() {
                push_policy_args(&mut cmd, policy, first_now);
            }
        }
        // One byte per check: its set, from 1 (a batch holds at most 255 checks).
        let order: Vec<u8> = set_of
            .iter()
            .map(|&set| u8::try_from(set + 1).unwrap_or(u8::MAX))
            .collect();
        cmd.arg(order);
        if self.calls.iter().all(|c| c.cost == 1) {
            cmd.arg(BATCH_UNIT_COSTS);
        } else {
            cmd.arg(BATCH_COSTS);
            for call in &self.calls {
                cmd.arg(call.cost);
            }
        }
        if client_clock {
            for call in &self.calls {
                cmd.arg(call.now_ms.unwrap_or(0));
            }
        }
        cmd
    }
}
