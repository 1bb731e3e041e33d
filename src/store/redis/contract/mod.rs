//! The contract between the store and its Lua: the operation letters, where each
//! argument goes, the reply's layout, the algorithm codes. Rust encodes with these
//! constants ([`args`]), decodes with them ([`reply`]), and resolves them in the Lua:
//! the Lua files read `OP_REFUND` or `ARGV[ARG_COST]` where they used to read a
//! literal, and composition writes the values in ([`inline`]; the library also
//! starts with the generated [`preamble`]): one side cannot change a letter or a
//! position without the other.
//!
//! Positions are 1-based, as Lua's `ARGV` and reply tables count them.
//!
//! # The layout
//!
//! A single call (lua/main.lua) of `n` policies:
//!
//! ```text
//! KEYS  state key of each policy, then (leasing check, give-back, reset) the
//!       subject's lease generation key
//! ARGV  ARG_COST, then the shape's own arguments (admin: ARG_OP; leasing check:
//!       ARG_WANT, ARG_BATCH; give-back: ARG_BEFORE, ARG_EPOCH), then from the
//!       shape's FIRST_* each policy's POLICY_ARGS (POLICY_CODE, POLICY_LIMIT
//!       negative for a shadow policy, POLICY_N), then optionally the client's
//!       clock in ms (else Redis TIME)
//! reply REPLY_FIELDS integers per policy (REPLY_ALLOWED, REPLY_REMAINING,
//!       REPLY_RESET, REPLY_RETRY); a leasing check adds LEASE_FIELDS (LEASE_*)
//! ```
//!
//! A batch (lua/batch.lua) starts with BATCH_MODE and BATCH_SETS; its reply is every
//! check's policies' REPLY_FIELDS integers, check after check ([`Batch`](super::command::Batch)).
//!
//! Inside the Lua, every call reads its policies' arguments once into the `set`
//! table, SET_FIELDS a policy (SET_DECIDE, SET_LIMIT, SET_WINDOW, SET_SHADOW,
//! SET_CODE), and every algorithm's decide function, registered in `DECIDE` by its
//! code, has one signature:
//!
//! ```text
//! decide(limit, n, now_ms, cost, raw) -> allowed, remaining, reset_ms, retry_ms, ttl_ms, next
//! ```
//!
//! `n` the policy's window (ms) or emission interval (us) (a calendar quota's: the end
//! of the current period in ms, computed by the encoder: lua/calendar.lua), `raw` its stored state
//! (`false` when there is none), `next` the state to write (`nil` for none; a string,
//! or the sliding log's ranges to overwrite). An in-flight policy's takes its holder
//! where the others take the cost, and a sixth argument, whether the call only peeks.
//! The refund and charge functions (`REFUND`, `CHARGE`) take the same five
//! arguments and return the state to write (a charge with its TTL). Each algorithm
//! reads its state in one place its decide, refund and charge share: a decide
//! function called with a `nil` cost returns its reading of the state and decides
//! nothing (the sliding log's is `sl_read`, in-flight's `in_flight_live`).

use std::fmt::Write as _;

use crate::policy::Algorithm;
use crate::store::backend::Operation;

pub(super) mod reply;

#[cfg(test)]
mod tests;

/// What one call of the Lua does: a store [`Operation`], or a leasing check or a
/// lease's give-back (entry points of their own). The contract's one list of
/// operations: each one's letter in the Lua's arguments, its name in the Lua
/// (`OP_` and its name in capitals: `OP_REFUND`, `OP_GIVE_BACK`) and its entry point
/// ([`Entry`]) come from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// A check or an admin operation (see [`Operation`] for what each does).
    Run(Operation),
    /// A check that also takes a lease.
    Lease,
    /// A lease's give-back: a refund while its window and lease generation stand, else
    /// a peek.
    GiveBack,
}

impl Op {
    /// Every operation of the Lua: the store's, then a leasing check and a give-back.
    const ALL: [Op; Operation::ALL.len() + 2] = {
        let mut all = [Op::GiveBack; Operation::ALL.len() + 2];
        let mut i = 0;
        while i < Operation::ALL.len() {
            all[i] = Op::Run(Operation::ALL[i]);
            i += 1;
        }
        all[i] = Op::Lease;
        all
    };

    /// Its letter in the Lua's arguments and code.
    pub(crate) const fn letter(self) -> &'static str {
        match self {
            Op::Run(Operation::Check) => "c",
            Op::Run(Operation::Peek) => "p",
            Op::Run(Operation::Refund) => "r",
            Op::Run(Operation::Reset) => "x",
            Op::Run(Operation::Charge) => "o",
            Op::Run(Operation::Release) => "d",
            Op::Run(Operation::Renew) => "n",
            Op::Lease => "l",
            Op::GiveBack => "g",
        }
    }

    /// Its name in the Lua: `OP_` and its name in capitals.
    fn lua_name(self) -> String {
        let name = match self {
            Op::Run(op) => op.as_str(),
            Op::Lease => "lease",
            Op::GiveBack => "give_back",
        };
        format!("OP_{}", name.to_ascii_uppercase())
    }

    /// The entry point of the Lua that runs it: a check its own, the admin operations
    /// one that reads the operation from its arguments.
    pub(crate) const fn entry(self) -> Entry {
        match self {
            Op::Run(Operation::Check) => Entry::Check,
            Op::Run(_) => Entry::Admin,
            Op::Lease => Entry::Lease,
            Op::GiveBack => Entry::GiveBack,
        }
    }

    /// Whether its call names the subject's lease generation key after its policies'
    /// keys: a leasing check and a give-back read it, a reset deletes it.
    pub(crate) const fn names_lease_key(self) -> bool {
        matches!(self, Op::Lease | Op::GiveBack | Op::Run(Operation::Reset))
    }

    /// The cost its reply's outcomes are figured for, the call's being `cost`: a
    /// charge, a release and a renewal answer as a peek of 1 would (their cost is
    /// units owed or slots held); the others as their cost.
    pub(crate) const fn answered_cost(self, cost: u64) -> u64 {
        match self {
            Op::Run(Operation::Charge | Operation::Release | Operation::Renew) => 1,
            _ => cost,
        }
    }
}

/// The entry points of the Lua: a function of the library each, and a script shape
/// each for servers without functions; an operation's is [`Op::entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Check,
    Admin,
    Lease,
    GiveBack,
}

// `Entry::ALL` is in the order of the discriminants, which index it.
const _: () = {
    let mut i = 0;
    while i < Entry::ALL.len() {
        assert!(Entry::ALL[i] as usize == i);
        i += 1;
    }
};

impl Entry {
    /// Every entry point, in the order of their discriminants.
    pub(crate) const ALL: [Entry; 4] = [Entry::Check, Entry::Admin, Entry::Lease, Entry::GiveBack];

    /// The suffix of its function's name in the library.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Entry::Check => "check",
            Entry::Admin => "admin",
            Entry::Lease => "lease",
            Entry::GiveBack => "give_back",
        }
    }

    /// The Lua expressions of this entry point's `op` and `first` (main.lua), with
    /// the call's arguments named `argv`.
    pub(crate) fn op_first(self, argv: &str) -> String {
        match self {
            Entry::Check => "OP_CHECK, FIRST_CHECK".to_owned(),
            Entry::Admin => format!("{argv}[ARG_OP], FIRST_ADMIN"),
            Entry::Lease => "OP_LEASE, FIRST_LEASE".to_owned(),
            Entry::GiveBack => "OP_GIVE_BACK, FIRST_GIVE_BACK".to_owned(),
        }
    }

    /// Whether its Lua gives units back: the refund functions go only there.
    pub(crate) fn refunds(self) -> bool {
        matches!(self, Entry::Admin | Entry::GiveBack)
    }

    /// Whether its Lua charges units whatever the limit: the charge functions go only
    /// there.
    pub(crate) fn charges(self) -> bool {
        matches!(self, Entry::Admin)
    }
}

/// Every single call's first argument: the cost.
pub(super) const ARG_COST: usize = 1;
/// An admin call's operation: its [`Op::letter`].
pub(super) const ARG_OP: usize = 2;
/// A leasing check's units wanted, then its batch.
pub(super) const ARG_WANT: usize = 2;
pub(super) const ARG_BATCH: usize = 3;
/// A give-back's end of the lease's window (ms, the store's clock), then its lease
/// generation.
pub(super) const ARG_BEFORE: usize = 2;
pub(super) const ARG_EPOCH: usize = 3;

/// Where each call shape's per-policy arguments start: after its cost and the
/// arguments of its own.
pub(super) const FIRST_CHECK: usize = ARG_COST + 1;
pub(super) const FIRST_ADMIN: usize = ARG_OP + 1;
pub(super) const FIRST_LEASE: usize = ARG_BATCH + 1;
pub(super) const FIRST_GIVE_BACK: usize = ARG_EPOCH + 1;

/// Arguments per policy: its algorithm's code, its limit (negative for a shadow
/// policy), the one duration its algorithm reads; offsets from the policy's first.
pub(super) const POLICY_ARGS: usize = 3;
pub(super) const POLICY_CODE: usize = 0;
pub(super) const POLICY_LIMIT: usize = 1;
pub(super) const POLICY_N: usize = 2;

/// Fields per policy in the Lua's own reading of the policies' arguments (the `set`
/// table of `read_policies` in lua/decide.lua, read by every decision), and their
/// offsets (from 1): the policy's decide function, its limit (positive), its window
/// or interval, whether it is a shadow policy, its algorithm's code.
pub(super) const SET_FIELDS: usize = 5;
pub(super) const SET_DECIDE: usize = 1;
pub(super) const SET_LIMIT: usize = 2;
pub(super) const SET_WINDOW: usize = 3;
pub(super) const SET_SHADOW: usize = 4;
pub(super) const SET_CODE: usize = 5;

/// Integers per policy in every reply, and their offsets (from 1).
pub(super) const REPLY_FIELDS: usize = 4;
pub(super) const REPLY_ALLOWED: usize = 1;
pub(super) const REPLY_REMAINING: usize = 2;
pub(super) const REPLY_RESET: usize = 3;
pub(super) const REPLY_RETRY: usize = 4;

/// Integers a leasing check's reply adds after its policies', and their offsets.
pub(super) const LEASE_FIELDS: usize = 5;
pub(super) const LEASE_GRANT: usize = 1;
pub(super) const LEASE_WINDOW_LEFT: usize = 2;
pub(super) const LEASE_AGAIN: usize = 3;
pub(super) const LEASE_WINDOW_END: usize = 4;
pub(super) const LEASE_EPOCH: usize = 5;

/// A batch's clock and repeats (its first argument), then its number of policy
/// sets; the sets follow.
pub(super) const BATCH_MODE: usize = 1;
pub(super) const BATCH_SETS: usize = 2;
/// The batch's checks decide at one Redis `TIME`.
pub(super) const BATCH_REDIS_CLOCK: &str = "t";
/// Each of the batch's checks carries the client's clock.
pub(super) const BATCH_CLIENT_CLOCK: &str = "c";
/// After the clock: a subject comes more than once in the batch.
pub(super) const BATCH_REPEATS: &str = "r";
/// Every check of the batch costs 1 (no costs follow).
pub(super) const BATCH_UNIT_COSTS: &str = "1";
/// A cost per check follows.
pub(super) const BATCH_COSTS: &str = "n";

/// After a rate policy's code: it counts requests, one a request whatever its cost
/// (`fwr`); refunds and charges leave it alone.
pub(super) const UNIT_REQUESTS: &str = "r";

/// The two-letter code of an algorithm, in keys and in the Lua's arguments.
pub(super) const fn code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket => "tb",
        Algorithm::SlidingLog => "sl",
        Algorithm::InFlight => "if",
        Algorithm::Calendar => "cq",
    }
}

/// A preamble value.
#[derive(Debug, Clone, Copy)]
enum Lua {
    Str(&'static str),
    Int(u64),
}

/// Positions as preamble values (they are small).
const fn at(position: usize) -> Lua {
    Lua::Int(position as u64)
}

/// Every constant the Lua reads, by its Lua name, but the operations' letters
/// ([`constants`] adds them, from [`Op`]).
const PREAMBLE: &[(&str, Lua)] = &[
    ("ARG_COST", at(ARG_COST)),
    ("ARG_OP", at(ARG_OP)),
    ("ARG_WANT", at(ARG_WANT)),
    ("ARG_BATCH", at(ARG_BATCH)),
    ("ARG_BEFORE", at(ARG_BEFORE)),
    ("ARG_EPOCH", at(ARG_EPOCH)),
    ("FIRST_CHECK", at(FIRST_CHECK)),
    ("FIRST_ADMIN", at(FIRST_ADMIN)),
    ("FIRST_LEASE", at(FIRST_LEASE)),
    ("FIRST_GIVE_BACK", at(FIRST_GIVE_BACK)),
    ("POLICY_ARGS", at(POLICY_ARGS)),
    ("POLICY_CODE", at(POLICY_CODE)),
    ("POLICY_LIMIT", at(POLICY_LIMIT)),
    ("POLICY_N", at(POLICY_N)),
    ("SET_FIELDS", at(SET_FIELDS)),
    ("SET_DECIDE", at(SET_DECIDE)),
    ("SET_LIMIT", at(SET_LIMIT)),
    ("SET_WINDOW", at(SET_WINDOW)),
    ("SET_SHADOW", at(SET_SHADOW)),
    ("SET_CODE", at(SET_CODE)),
    ("REPLY_FIELDS", at(REPLY_FIELDS)),
    ("REPLY_ALLOWED", at(REPLY_ALLOWED)),
    ("REPLY_REMAINING", at(REPLY_REMAINING)),
    ("REPLY_RESET", at(REPLY_RESET)),
    ("REPLY_RETRY", at(REPLY_RETRY)),
    ("LEASE_FIELDS", at(LEASE_FIELDS)),
    ("LEASE_GRANT", at(LEASE_GRANT)),
    ("LEASE_WINDOW_LEFT", at(LEASE_WINDOW_LEFT)),
    ("LEASE_AGAIN", at(LEASE_AGAIN)),
    ("LEASE_WINDOW_END", at(LEASE_WINDOW_END)),
    ("LEASE_EPOCH", at(LEASE_EPOCH)),
    ("BATCH_MODE", at(BATCH_MODE)),
    ("BATCH_SETS", at(BATCH_SETS)),
    ("BATCH_REDIS_CLOCK", Lua::Str(BATCH_REDIS_CLOCK)),
    ("BATCH_CLIENT_CLOCK", Lua::Str(BATCH_CLIENT_CLOCK)),
    ("BATCH_REPEATS", Lua::Str(BATCH_REPEATS)),
    ("BATCH_UNIT_COSTS", Lua::Str(BATCH_UNIT_COSTS)),
    ("BATCH_COSTS", Lua::Str(BATCH_COSTS)),
    ("ALG_FIXED_WINDOW", Lua::Str(code(Algorithm::FixedWindow))),
    (
        "ALG_SLIDING_WINDOW",
        Lua::Str(code(Algorithm::SlidingWindow)),
    ),
    ("ALG_TOKEN_BUCKET", Lua::Str(code(Algorithm::TokenBucket))),
    ("ALG_SLIDING_LOG", Lua::Str(code(Algorithm::SlidingLog))),
    ("ALG_IN_FLIGHT", Lua::Str(code(Algorithm::InFlight))),
    ("UNIT_REQUESTS", Lua::Str(UNIT_REQUESTS)),
    ("ALG_CALENDAR", Lua::Str(code(Algorithm::Calendar))),
    (
        "CALENDAR_MAX_AHEAD",
        Lua::Int(crate::algorithm::calendar::MAX_AHEAD_MS),
    ),
    (
        "IN_FLIGHT_RETRY_HINT",
        Lua::Int(crate::algorithm::in_flight::RETRY_HINT_MS),
    ),
    ("MAX_BACK", Lua::Int(crate::algorithm::MAX_CLOCK_BACK)),
    ("MAX_DEBT", Lua::Int(crate::algorithm::MAX_DEBT)),
];

/// Every constant the Lua reads, by its Lua name: the operations' letters, then
/// [`PREAMBLE`].
fn constants() -> impl Iterator<Item = (String, Lua)> {
    let ops = Op::ALL
        .into_iter()
        .map(|op| (op.lua_name(), Lua::Str(op.letter())));
    ops.chain(
        PREAMBLE
            .iter()
            .map(|&(name, value)| (name.to_owned(), value)),
    )
}

/// The Lua the function library starts with: [`constants`] as locals, read by its
/// registrations (at load) and by whoever reads the loaded library or adds Lua to
/// its chunk (the benches' diagnostic functions); its code has the values in place
/// (see [`inline`]).
///
/// Locals, not globals: Redis forbids a script's globals.
pub(super) fn preamble() -> String {
    let mut lua = String::from(
        "-- Generated from src/store/redis/contract: the Rust side encodes and decodes with the same values.\n",
    );
    for (name, value) in constants() {
        // Writing to a String cannot fail.
        let _ = match value {
            Lua::Str(text) => writeln!(lua, "local {name} = \"{text}\""),
            Lua::Int(n) => writeln!(lua, "local {name} = {n}"),
        };
    }
    lua
}

/// `lua` with every [`constants`] name replaced by its value: how the composed code
/// (the library's and every script's) reads the constants.
///
/// Read as locals they cost instructions on every call (callgrind, against the
/// literals they replace): a script's chunk runs again on every call, and Lua 5.1
/// makes a new upvalue for each local that a function of the chunk captures, each
/// time the function is created (a fixed-window check's `EVALSHA` about 7% more); the
/// library's functions read them as upvalues, an instruction more per use (a batch
/// of 16 checks about 1% more). Values in place of the names cost nothing, and the
/// Lua files still read the names, so neither side can drift.
pub(super) fn inline(lua: &str) -> String {
    let constants: Vec<(String, Lua)> = constants().collect();
    let mut out = String::with_capacity(lua.len());
    let mut rest = lua;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.push_str(&rest[..start]);
        let word = &rest[start..];
        let len = word
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(word.len());
        let (name, after) = word.split_at(len);
        match constants.iter().find(|(n, _)| n == name) {
            Some((_, Lua::Str(text))) => {
                out.push('"');
                out.push_str(text);
                out.push('"');
            }
            Some((_, Lua::Int(n))) => out.push_str(&n.to_string()),
            None => out.push_str(name),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}
