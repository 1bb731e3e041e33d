//! One encoder per call shape: a [`Batch`] of records (checks and the operations
//! that batch with them; a lone one is a batch of one), and a [`Call`] of a reset, a
//! leasing check or a give-back, each writing its keys and arguments in the order
//! [`contract`](super::contract)'s layout names, so the Lua finds each where it
//! reads it.

use std::hash::BuildHasher;
use std::io::Write;
use std::sync::Arc;

use deadpool_redis::redis::{Cmd, FromRedisValue, RedisWrite};
use smallvec::SmallVec;

use super::contract::reply::{BatchReply, Checked, LeaseReply, Reply};
use super::contract::*;
use super::keys::{is_joint, lease_key_of, policy_suffix, push_policy_suffix, JOINT_SUFFIX};
use super::script::{Library, Shape, ShapeScript, Via};
use crate::algorithm::calendar;
use crate::clock::{Clock, SystemClock};
use crate::policy::{Algorithm, Policy, Unit};
use crate::store::backend::Operation;
use crate::store::lease::{GiveBack, LeaseAsk};

// main.lua's arguments follow one another: these are the positions that order
// gives, checked where the positions are defined.
const _: () = assert!(ARG_SET == 1 && ARG_COST == 2);
const _: () = assert!(ARG_WANT == ARG_COST + 1 && ARG_BATCH == ARG_WANT + 1);
const _: () = assert!(ARG_BEFORE == ARG_COST + 1 && ARG_EPOCH == ARG_BEFORE + 1);
const _: () = assert!(ARG_EPOCH == ARG_BATCH);

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

impl<S> Call<S> {
    /// Whether its policies' states share one key ([`is_joint`]).
    fn joint(&self) -> bool {
        is_joint(&self.policies, self.own_keys.is_some())
    }

    /// How many keys it names: one a policy, or one for a joint set.
    fn key_count(&self) -> usize {
        if self.joint() {
            1
        } else {
            self.policies.len()
        }
    }
}

impl Checked for Call<Run> {
    fn op(&self) -> Op {
        Op::Run(self.shape.0)
    }
    fn policies(&self) -> &Arc<[Policy]> {
        &self.policies
    }
    fn cost(&self) -> u64 {
        self.cost
    }
}

/// A call shape: its operation (whence its entry point and whether it names the lease
/// generation key), the arguments between its cost and its clock, and its typed
/// reply.
pub(crate) trait CallShape: Send + Sync {
    type Reply: FromRedisValue;
    fn op(&self) -> Op;
    /// Writes its own arguments, after the cost.
    fn push_head(&self, _cmd: &mut Cmd) {}
}

/// Any store operation: a check or an operation that batches with checks goes as a
/// batch of one record, a reset as main.lua's call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run(pub(crate) Operation);

impl CallShape for Run {
    type Reply = Reply;
    fn op(&self) -> Op {
        Op::Run(self.0)
    }
}

/// A leasing check: `set, cost, want, batch, [clock]`, and the lease generation key.
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

/// A lease's give-back: `set, units, before_ms, epoch, [clock]`, and the lease
/// generation key (read: the units go back only while it is `epoch`).
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

/// What the store sends in one round trip: one call, or a batch of records.
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

/// The start of a command: the library's function, or the script by hash or source;
/// with room for `args` arguments more of `bytes` bytes in all, so that the command
/// is allocated once rather than grown as it is written (each growth a copy).
fn start(
    via: Via,
    entry: Entry,
    script: impl FnOnce() -> &'static ShapeScript,
    args: usize,
    bytes: usize,
) -> Cmd {
    let (name, body) = match via {
        Via::Function => ("FCALL", Library::get().function(entry)),
        Via::Script => ("EVALSHA", script().sha1()),
        Via::ScriptSource => ("EVAL", script().source()),
    };
    let mut cmd = Cmd::with_capacity(args + 2, name.len() + body.len() + bytes);
    cmd.arg(name).arg(body);
    cmd
}

/// Writes `parts` as the command's next argument, with no string of its own.
fn arg_of(cmd: &mut Cmd, parts: &[&str]) {
    let mut arg = cmd.writer_for_next_arg();
    for part in parts {
        // Writing into the command's own buffer (a `Vec`) cannot fail.
        let _ = arg.write_all(part.as_bytes());
    }
}

impl<S: CallShape> Request for Call<S> {
    type Reply = S::Reply;

    /// A batch of one record, or main.lua's `numkeys, keys.., lease key, set, cost,
    /// head.., [clock]`, whichever way it goes.
    fn command(&self, via: Via) -> Cmd {
        let op = self.shape.op();
        let entry = op.entry();
        if entry.is_batch() {
            if let Op::Run(op) = op {
                return encode_batch(std::slice::from_ref(self), |_| op, via);
            }
        }
        let keys = self.key_count();
        let bytes =
            keys * (self.key_base.len() + 24) + SET_DEFINITION_BYTES * self.policies.len() + 64;
        let mut cmd = start(
            via,
            entry,
            || Shape::of(&self.policies, entry).script(),
            keys + 6,
            bytes,
        );
        let lease_key = op.names_lease_key();
        cmd.arg(keys + usize::from(lease_key));
        for key in keys_of(self).iter() {
            cmd.arg(key.as_str());
        }
        if lease_key {
            cmd.arg(lease_key_of(&self.key_base));
        }
        write_set_definition(
            &mut cmd.writer_for_next_arg(),
            &self.policies,
            self.joint(),
            self.now_ms,
        );
        cmd.arg(self.cost);
        self.shape.push_head(&mut cmd);
        // Without a client clock the Lua reads Redis `TIME`.
        if let Some(ms) = self.now_ms {
            cmd.arg(ms);
        }
        cmd
    }
}

/// The key of each policy of `call`, in order, or a joint set's one key.
fn keys_of<S>(call: &Call<S>) -> SmallVec<[String; 2]> {
    if let Some(keys) = &call.own_keys {
        return keys.iter().cloned().collect();
    }
    if call.joint() {
        let mut key = String::with_capacity(call.key_base.len() + JOINT_SUFFIX.len());
        key.push_str(&call.key_base);
        key.push_str(JOINT_SUFFIX);
        return SmallVec::from_iter([key]);
    }
    call.policies
        .iter()
        .map(|policy| {
            let mut key = String::with_capacity(call.key_base.len() + 24);
            key.push_str(&call.key_base);
            push_policy_suffix(&mut key, policy);
            key
        })
        .collect()
}

/// About the most bytes a policy's definition takes (code, flags, limit, duration; an
/// in-flight policy's holder is 13 more), for sizing a command.
const SET_DEFINITION_BYTES: usize = 40;

/// Writes a policy set as the Lua reads it (lua/decide.lua) into `out`: per policy its
/// algorithm's code, its flags ([`FLAG_REQUESTS`], [`FLAG_SHADOW`]), its limit and the
/// one duration its algorithm reads, and an in-flight policy's holder in 12 hex
/// digits. A calendar quota's duration is the end of the period that `now_ms` (the
/// client's clock), else the system clock, is in: the Lua has no zone database
/// (lua/calendar.lua says what it makes of a now past that end). A joint set's
/// starts with [`SET_JOINT`].
fn write_set_definition(
    out: &mut impl Write,
    policies: &[Policy],
    joint: bool,
    now_ms: Option<u64>,
) {
    let mut digits = itoa::Buffer::new();
    if joint {
        // Writing into a command's buffer or a `Vec` cannot fail.
        let _ = out.write_all(SET_JOINT.as_bytes());
    }
    for policy in policies {
        let algorithm = policy.algorithm();
        let n = match algorithm {
            Algorithm::TokenBucket => policy.emission_interval_us(),
            Algorithm::Calendar => {
                let now = now_ms.unwrap_or_else(|| SystemClock.now_ms());
                calendar::period_at(policy, now).1
            }
            _ => policy.window_ms(),
        };
        let requests = policy.unit() == Unit::Requests && algorithm != Algorithm::InFlight;
        // Writing into a command's buffer or a `Vec` cannot fail.
        let _ = out.write_all(code(algorithm).as_bytes());
        if requests {
            let _ = out.write_all(FLAG_REQUESTS.as_bytes());
        }
        if policy.is_shadow() {
            let _ = out.write_all(FLAG_SHADOW.as_bytes());
        }
        let _ = out.write_all(b":");
        let _ = out.write_all(digits.format(policy.limit()).as_bytes());
        let _ = out.write_all(b":");
        let _ = out.write_all(digits.format(n).as_bytes());
        if algorithm == Algorithm::InFlight {
            let _ = write!(out, ":{:012x}", policy.holder());
        }
        let _ = out.write_all(b";");
    }
}

/// Where the key slots of the record after `calls` start: the slots `calls` named.
fn slots_of<S>(calls: &[Call<S>]) -> usize {
    calls.iter().map(Call::key_count).sum()
}

/// Records sent as one call of the library's batch function (`lua/batch.lua`): each
/// decided as its own call would be, in order. The batcher never mixes the two
/// clocks in one batch.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) calls: Vec<Call<Run>>,
}

impl Request for Batch {
    type Reply = BatchReply;

    fn command(&self, via: Via) -> Cmd {
        encode_batch(&self.calls, |call| call.shape.0, via)
    }
}

/// `numkeys keys.. head+set sets.. [records] costs.. times..` (contract's layout): each
/// policy set is sent once, however many records use it, and each key once, however
/// many records name it.
fn encode_batch<S>(calls: &[Call<S>], op_of: impl Fn(&Call<S>) -> Operation, via: Via) -> Cmd {
    // The batch's policy sets, by identity: a limiter's records share its set.
    // Each with whether it is joint (a set is scoped, or not, in every call).
    type Set<'a> = (&'a Arc<[Policy]>, bool);
    let mut sets: SmallVec<[Set<'_>; 4]> = SmallVec::new();
    let mut set_of: SmallVec<[u8; 64]> = SmallVec::new();
    for call in calls {
        let found = sets
            .iter()
            .position(|(s, _)| Arc::ptr_eq(s, &call.policies));
        let index = found.unwrap_or_else(|| {
            sets.push((&call.policies, call.joint()));
            sets.len() - 1
        });
        // A batch holds at most 255 records (`MAX_BATCH`), so at most 255 sets.
        set_of.push(u8::try_from(index + 1).unwrap_or(u8::MAX));
    }
    // Every key once: a subject named twice reads and writes its state once. Records
    // of one key base and one set name the same keys; a scoped record's keys are its
    // own strings, compared with the other scoped records' (a scoped set's keys never
    // meet an unscoped one's: their tags differ). No key is made here but once, as
    // it goes into the command.
    let mut slots: SmallVec<[u8; 64]> = SmallVec::new();
    let mut new_keys: SmallVec<[(usize, usize); 64]> = SmallVec::new();
    let mut map = false;
    // Each key base's hash, so that a record is compared in full only with the
    // records whose hash it shares: key bases are of one length and differ in the
    // middle, and a batch of 32 would compare 496 pairs byte by byte.
    let hasher = foldhash::fast::FixedState::default();
    let hashes: SmallVec<[u64; 64]> = calls
        .iter()
        .map(|c| hasher.hash_one(c.key_base.as_str()))
        .collect();
    for (i, call) in calls.iter().enumerate() {
        let slot = |n: usize| u8::try_from(n).unwrap_or(u8::MAX);
        match &call.own_keys {
            None => {
                let same = calls[..i].iter().zip(&hashes).position(|(c, &hash)| {
                    hash == hashes[i]
                        && c.own_keys.is_none()
                        && Arc::ptr_eq(&c.policies, &call.policies)
                        && c.key_base == call.key_base
                });
                match same {
                    Some(j) => {
                        map = true;
                        let at = slots_of(&calls[..j]);
                        let first: SmallVec<[u8; 4]> =
                            slots[at..at + call.key_count()].iter().copied().collect();
                        slots.extend(first);
                    }
                    None => {
                        for p in 0..call.key_count() {
                            new_keys.push((i, p));
                            slots.push(slot(new_keys.len()));
                        }
                    }
                }
            }
            Some(own) => {
                for (p, key) in own.iter().enumerate() {
                    let same = new_keys.iter().position(|&(j, q)| {
                        calls[j].own_keys.as_ref().is_some_and(|k| k[q] == *key)
                    });
                    match same {
                        Some(at) => {
                            map = true;
                            slots.push(slot(at + 1));
                        }
                        None => {
                            new_keys.push((i, p));
                            slots.push(slot(new_keys.len()));
                        }
                    }
                }
            }
        }
    }
    let client_clock = calls.iter().any(|c| c.now_ms.is_some());
    let ops = calls.iter().any(|c| op_of(c) != Operation::Check);
    let costs = calls.iter().any(|c| c.cost != 1);
    let entry = if ops { Entry::Admin } else { Entry::Check };
    let per_call = usize::from(costs) + usize::from(client_clock);
    let bytes = new_keys
        .iter()
        .map(|&(i, _)| calls[i].key_base.len() + 24)
        .sum::<usize>()
        + sets
            .iter()
            .map(|(set, _)| SET_DEFINITION_BYTES * set.len())
            .sum::<usize>()
        + calls.len() * (3 + 20 * per_call)
        + 16;
    let mut cmd = start(
        via,
        entry,
        || Shape::of_many(calls.iter().map(|c| &*c.policies), entry).script(),
        2 + new_keys.len() + sets.len() + per_call * calls.len(),
        bytes,
    );
    cmd.arg(new_keys.len());
    for &(i, p) in &new_keys {
        let call = &calls[i];
        match &call.own_keys {
            Some(own) => {
                cmd.arg(own[p].as_str());
            }
            None if call.joint() => arg_of(&mut cmd, &[&call.key_base, JOINT_SUFFIX]),
            None => {
                let [name, colon, code] = policy_suffix(&call.policies[p]);
                arg_of(&mut cmd, &[&call.key_base, name, colon, code]);
            }
        }
    }
    let mut flags = FLAGS_BASE;
    if map {
        flags |= FLAG_MAP;
    }
    if ops {
        flags |= FLAG_OPS;
    }
    if costs {
        flags |= FLAG_COSTS;
    }
    let clock = if client_clock {
        HEAD_CLIENT_CLOCK
    } else {
        HEAD_REDIS_CLOCK
    };
    // A set is sent once for all its records: a calendar quota's period is the one
    // its first record's clock is in (the Lua decides a later record past its end
    // as at the period's last millisecond). The head goes before the first.
    let first_now = calls.first().and_then(|c| c.now_ms);
    for (i, &(set, joint)) in sets.iter().enumerate() {
        let mut arg = cmd.writer_for_next_arg();
        if i == 0 {
            let head = [clock, flags, u8::try_from(sets.len()).unwrap_or(u8::MAX)];
            // Writing into the command's own buffer cannot fail.
            let _ = arg.write_all(&head);
        }
        write_set_definition(&mut arg, set, joint, first_now);
    }
    // Checks of one set, each naming its own keys, need no records: the Lua counts
    // them from the keys.
    let mut records: SmallVec<[u8; 64]> = SmallVec::new();
    let mut slot = slots.iter();
    let implicit = sets.len() == 1 && !map && !ops;
    for (call, &set) in calls.iter().zip(&set_of).filter(|_| !implicit) {
        if ops {
            records.extend_from_slice(Op::Run(op_of(call)).letter().as_bytes());
        }
        records.push(set);
        if map {
            records.extend(slot.by_ref().take(call.key_count()).copied());
        } else {
            slot.by_ref().take(call.key_count()).for_each(drop);
        }
    }
    // Checks of one set at cost 1 on Redis TIME need no records argument at all.
    if !(implicit && !costs && !client_clock) {
        cmd.arg(&records[..]);
    }
    if costs {
        for call in calls {
            cmd.arg(call.cost);
        }
    }
    if client_clock {
        for call in calls {
            cmd.arg(call.now_ms.unwrap_or(0));
        }
    }
    cmd
}
