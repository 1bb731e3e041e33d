//! The contract between the store and its Lua: the operation letters, where each
//! argument goes, the reply's packing, the algorithm codes. Rust encodes with these
//! constants ([`command`](super::command)), decodes with them ([`reply`]), and
//! resolves them in the Lua: the Lua files read `OP_REFUND` or `ARGV[ARG_COST]` where
//! they would read a literal, and composition writes the values in ([`inline`]; the
//! library also starts with the generated [`preamble`]): one side cannot change a
//! letter or a position without the other.
//!
//! Positions are 1-based, as Lua's `ARGV` and tables count them.
//!
//! # The layout
//!
//! A batch (lua/batch.lua: checks, and the operations that queue beside them; a lone
//! check or admin operation is a batch of one):
//!
//! ```text
//! KEYS  the keys its records name, each once
//! ARGV  the head (three bytes: HEAD_REDIS_CLOCK or HEAD_CLIENT_CLOCK; the flags
//!       FLAG_MAP, FLAG_OPS, FLAG_COSTS; the number of policy sets), each set's
//!       definition, the records (per record: [its operation's letter] its set's
//!       number [a key slot per policy]), then the costs and the times the flags ask
//! reply each record's outcomes, a packed outcome per policy, as one string of
//!       big-endian doubles (8 bytes an integer); a lone outcome of one integer as
//!       that integer
//! ```
//!
//! A single call (lua/main.lua: a reset, a leasing check, a give-back) of `n`
//! policies:
//!
//! ```text
//! KEYS  state key of each policy, then the subject's lease generation key
//! ARGV  ARG_SET the set's definition, ARG_COST the cost, then the shape's own
//!       arguments (leasing check: ARG_WANT, ARG_BATCH; give-back: ARG_BEFORE,
//!       ARG_EPOCH), then optionally the client's clock in ms (else Redis TIME)
//! reply a packed outcome per policy; a leasing check adds LEASE_FIELDS (LEASE_*);
//!       one string of big-endian doubles, as a batch's
//! ```
//!
//! A set's definition is `<code><flags>:<limit>:<n>[:<holder>];` per policy, after
//! [`SET_JOINT`] for a joint set, whose policies' states share one key
//! ([`write_set_definition`](super::command)); the Lua reads it once into its own table,
//! SET_FIELDS a policy (SET_READ, SET_STEP, SET_ENCODE, SET_LIMIT, SET_N, SET_SHADOW,
//! SET_CODE, SET_ARG), and keeps it for the calls after (SETS_KEPT at most). Every
//! algorithm is three functions, registered by its code (lua/common.lua says what
//! each takes and returns):
//!
//! ```text
//! READ[code](raw) -> a, b, c, keep
//! STEP[code](limit, n, now_ms, cost, a, b, c, peek) -> allowed, remaining, reset_ms, retry_ms, a, b, c
//! ENCODE[code](n, now_ms, a, b, c, keep) -> raw, ttl_ms, kept
//! ```
//!
//! `n` the policy's window (ms) or emission interval (us) (a calendar quota's: the
//! end of the current period in ms, computed by the encoder: lua/calendar.lua), the
//! state `a, b, c` numbers (or the string the sliding log and in flight work on). An
//! outcome is packed into one integer ([`pack`]), a denial's retry after it, and
//! spelled out after a marker when it does not fit.

use std::fmt::Write as _;

use crate::policy::Algorithm;
use crate::store::backend::Operation;

pub(super) mod reply;
#[cfg(any(test, feature = "internals"))]
pub(super) mod state;

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

    /// The entry point of the Lua that runs it: checks and the operations that batch
    /// with them go through the batch, the others their own.
    pub(crate) const fn entry(self) -> Entry {
        match self {
            Op::Run(Operation::Check) => Entry::Check,
            Op::Run(Operation::Reset) => Entry::Reset,
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

/// The entry points of the Lua: a function of the library each (a check and the
/// admin operations share the batch's), and a script shape each for servers without
/// functions; an operation's is [`Op::entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A batch of checks only (lua/batch.lua): its script has no refund or charge.
    Check,
    /// A batch of any operations that batch with checks (lua/batch.lua).
    Admin,
    /// lua/main.lua's operations.
    Reset,
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
    pub(crate) const ALL: [Entry; 5] = [
        Entry::Check,
        Entry::Admin,
        Entry::Reset,
        Entry::Lease,
        Entry::GiveBack,
    ];

    /// The suffix of its function's name in the library.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Entry::Check | Entry::Admin => "batch",
            Entry::Reset => "reset",
            Entry::Lease => "lease",
            Entry::GiveBack => "give_back",
        }
    }

    /// Whether it runs lua/batch.lua (else lua/main.lua).
    pub(crate) const fn is_batch(self) -> bool {
        matches!(self, Entry::Check | Entry::Admin)
    }

    /// The Lua name of main.lua's operation (`None` for the batch).
    pub(crate) const fn main_op(self) -> Option<&'static str> {
        match self {
            Entry::Check | Entry::Admin => None,
            Entry::Reset => Some("OP_RESET"),
            Entry::Lease => Some("OP_LEASE"),
            Entry::GiveBack => Some("OP_GIVE_BACK"),
        }
    }

    /// Whether its Lua gives units or slots back: the refund functions and the
    /// in-flight release go only there.
    pub(crate) fn refunds(self) -> bool {
        matches!(self, Entry::Admin | Entry::GiveBack)
    }

    /// Whether its Lua charges units whatever the limit: the charge functions go only
    /// there.
    pub(crate) fn charges(self) -> bool {
        matches!(self, Entry::Admin)
    }
}

/// A single call's policy set, then its cost.
pub(super) const ARG_SET: usize = 1;
pub(super) const ARG_COST: usize = 2;
/// A leasing check's units wanted, then its batch.
pub(super) const ARG_WANT: usize = 3;
pub(super) const ARG_BATCH: usize = 4;
/// A give-back's end of the lease's window (ms, the store's clock), then its lease
/// generation.
pub(super) const ARG_BEFORE: usize = 3;
pub(super) const ARG_EPOCH: usize = 4;

/// A batch's head: its clock (first byte; as the byte's value in the Lua)...
pub(super) const HEAD_REDIS_CLOCK: u8 = b't';
pub(super) const HEAD_CLIENT_CLOCK: u8 = b'c';
/// ...its flags (second byte, over FLAGS_BASE: no byte of a batch's arguments is 0,
/// so a batch can go on a command line, as `redis-benchmark` takes it): each record
/// names its keys' slots...
pub(super) const FLAGS_BASE: u8 = b'@';
pub(super) const FLAG_MAP: u8 = 1;
/// ...each record starts with its operation's letter...
pub(super) const FLAG_OPS: u8 = 2;
/// ...a cost per record follows the records (else each costs 1).
pub(super) const FLAG_COSTS: u8 = 4;
// The Lua reads the flags by their bits.
const _: () = assert!(FLAG_MAP == 1 && FLAG_OPS == 2 && FLAG_COSTS == 4);
const _: () = assert!(FLAGS_BASE.is_multiple_of(8));

/// In a set's definition, after a policy's code: it counts requests, one a request
/// whatever its cost (refunds and charges leave it alone)...
pub(super) const FLAG_REQUESTS: &str = "r";
/// ...it is a shadow policy (decides, never denies).
pub(super) const FLAG_SHADOW: &str = "s";

/// Before a set's definition: its policies' states share one key, the key base's
/// [`JOINT_SUFFIX`](super::keys::JOINT_SUFFIX) (see lua/decide.lua's split).
pub(super) const SET_JOINT: &str = "=";

/// Fields per policy in the Lua's own reading of a set's definition (read_set in
/// lua/decide.lua), and their offsets (from 1): the algorithm's READ, STEP and ENCODE
/// functions, the limit, the window or interval, the shadow flag, the algorithm's
/// code, and the policy's unit argument (an in-flight holder's id, `true` for a
/// policy counting requests).
pub(super) const SET_FIELDS: usize = 8;
pub(super) const SET_READ: usize = 1;
pub(super) const SET_STEP: usize = 2;
pub(super) const SET_ENCODE: usize = 3;
pub(super) const SET_LIMIT: usize = 4;
pub(super) const SET_N: usize = 5;
pub(super) const SET_SHADOW: usize = 6;
pub(super) const SET_CODE: usize = 7;
pub(super) const SET_ARG: usize = 8;
/// The most set definitions the function library keeps read (then it starts over).
const SETS_KEPT: u64 = 512;

/// How a batch writes a key, the strongest asked winning: a refund's state keeps its
/// TTL, a check's keeps it when the stored one already runs as far, a charge's or
/// a holder's sets it anew.
const WRITE_KEEP: u64 = 1;
const WRITE_CHECK: u64 = 2;
const WRITE_TTL: u64 = 3;

/// An outcome packed into one integer: `((reset * 2^PACK_REMAINING_BITS +
/// remaining) * 2 + allowed)`, under 2^53 (a double's exact integers), a denial's
/// retry after it. One that does not fit is PACK_WIDE_ALLOWED or PACK_WIDE_DENIED,
/// then remaining, reset and retry.
pub(super) const PACK_REMAINING_BITS: u32 = 25;
pub(super) const PACK_RESET_BITS: u32 = 27;
pub(super) const PACK_WIDE_ALLOWED: i64 = -2;
pub(super) const PACK_WIDE_DENIED: i64 = -1;
const _: () = assert!(1 + PACK_REMAINING_BITS + PACK_RESET_BITS == 53);

/// Integers a leasing check's reply adds after its policies', and their offsets.
pub(super) const LEASE_FIELDS: usize = 5;
pub(super) const LEASE_GRANT: usize = 1;
pub(super) const LEASE_WINDOW_LEFT: usize = 2;
pub(super) const LEASE_AGAIN: usize = 3;
pub(super) const LEASE_WINDOW_END: usize = 4;
pub(super) const LEASE_EPOCH: usize = 5;

/// The two-letter code of an algorithm, in keys and in the sets' definitions.
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
    Int(i64),
}

/// Positions and small numbers as preamble values.
const fn at(position: usize) -> Lua {
    Lua::Int(position as i64)
}

/// Every constant the Lua reads, by its Lua name, but the operations' letters
/// ([`constants`] adds them, from [`Op`]).
const PREAMBLE: &[(&str, Lua)] = &[
    ("ARG_SET", at(ARG_SET)),
    ("ARG_COST", at(ARG_COST)),
    ("ARG_WANT", at(ARG_WANT)),
    ("ARG_BATCH", at(ARG_BATCH)),
    ("ARG_BEFORE", at(ARG_BEFORE)),
    ("ARG_EPOCH", at(ARG_EPOCH)),
    ("HEAD_REDIS_CLOCK", Lua::Int(HEAD_REDIS_CLOCK as i64)),
    ("HEAD_CLIENT_CLOCK", Lua::Int(HEAD_CLIENT_CLOCK as i64)),
    ("FLAGS_BASE", Lua::Int(FLAGS_BASE as i64)),
    ("FLAG_REQUESTS", Lua::Str(FLAG_REQUESTS)),
    ("FLAG_SHADOW", Lua::Str(FLAG_SHADOW)),
    ("SET_FIELDS", at(SET_FIELDS)),
    ("SET_READ", at(SET_READ)),
    ("SET_STEP", at(SET_STEP)),
    ("SET_ENCODE", at(SET_ENCODE)),
    ("SET_JOINT", Lua::Str(SET_JOINT)),
    ("SET_LIMIT", at(SET_LIMIT)),
    ("SET_N", at(SET_N)),
    ("SET_SHADOW", at(SET_SHADOW)),
    ("SET_CODE", at(SET_CODE)),
    ("SET_ARG", at(SET_ARG)),
    ("SETS_KEPT", Lua::Int(SETS_KEPT as i64)),
    ("WRITE_KEEP", Lua::Int(WRITE_KEEP as i64)),
    ("WRITE_CHECK", Lua::Int(WRITE_CHECK as i64)),
    ("WRITE_TTL", Lua::Int(WRITE_TTL as i64)),
    ("PACK_REMAINING_LIMIT", Lua::Int(1 << PACK_REMAINING_BITS)),
    ("PACK_RESET_LIMIT", Lua::Int(1 << PACK_RESET_BITS)),
    ("PACK_WIDE_ALLOWED", Lua::Int(PACK_WIDE_ALLOWED)),
    ("PACK_WIDE_DENIED", Lua::Int(PACK_WIDE_DENIED)),
    ("LEASE_FIELDS", at(LEASE_FIELDS)),
    ("LEASE_GRANT", at(LEASE_GRANT)),
    ("LEASE_WINDOW_LEFT", at(LEASE_WINDOW_LEFT)),
    ("LEASE_AGAIN", at(LEASE_AGAIN)),
    ("LEASE_WINDOW_END", at(LEASE_WINDOW_END)),
    ("LEASE_EPOCH", at(LEASE_EPOCH)),
    ("ALG_FIXED_WINDOW", Lua::Str(code(Algorithm::FixedWindow))),
    (
        "ALG_SLIDING_WINDOW",
        Lua::Str(code(Algorithm::SlidingWindow)),
    ),
    ("ALG_TOKEN_BUCKET", Lua::Str(code(Algorithm::TokenBucket))),
    ("ALG_SLIDING_LOG", Lua::Str(code(Algorithm::SlidingLog))),
    ("ALG_IN_FLIGHT", Lua::Str(code(Algorithm::InFlight))),
    ("ALG_CALENDAR", Lua::Str(code(Algorithm::Calendar))),
    (
        "CALENDAR_MAX_AHEAD",
        Lua::Int(crate::algorithm::calendar::MAX_AHEAD_MS as i64),
    ),
    (
        "IN_FLIGHT_RETRY_HINT",
        Lua::Int(crate::algorithm::in_flight::RETRY_HINT_MS as i64),
    ),
    (
        "MAX_BACK",
        Lua::Int(crate::algorithm::MAX_CLOCK_BACK as i64),
    ),
    ("MAX_DEBT", Lua::Int(crate::algorithm::MAX_DEBT as i64)),
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

/// `lua` with every [`constants`] name replaced by its value where it is code: how the
/// composed code (the library's and every script's) reads the constants. Comments and
/// string literals are left as written, so the library Redis keeps still reads the
/// names in its comments, and no text can be changed by a name it happens to hold.
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
    for (is_code, text) in lua_spans(lua) {
        if is_code {
            inline_code(text, &constants, &mut out);
        } else {
            out.push_str(text);
        }
    }
    out
}

/// `code` (Lua with no comment or string in it) with every name of `constants` replaced
/// by its value, onto `out`.
fn inline_code(code: &str, constants: &[(String, Lua)], out: &mut String) {
    let mut rest = code;
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
            // In parentheses when negative: `a - -1` reads as Lua means it, `a --1` not.
            Some((_, Lua::Int(n))) if *n < 0 => out.push_str(&format!("({n})")),
            Some((_, Lua::Int(n))) => out.push_str(&n.to_string()),
            None => out.push_str(name),
        }
        rest = after;
    }
    out.push_str(rest);
}

/// `lua` cut into its code (`true`) and its comments and string literals (`false`),
/// in order: the pieces joined are `lua`. Lua 5.1's lexing of them: `--` to the end of
/// the line, `--[[ ]]` and `[[ ]]` with any level of `=`, quotes with backslash
/// escapes (an unclosed one ends at its line's end, as Lua refuses it anyway).
pub(super) fn lua_spans(lua: &str) -> Vec<(bool, &str)> {
    let bytes = lua.as_bytes();
    let mut spans = Vec::new();
    let (mut code_from, mut i) = (0, 0);
    while i < bytes.len() {
        let end = match bytes[i] {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                Some(long_bracket_end(bytes, i + 2).unwrap_or_else(|| line_end(bytes, i)))
            }
            b'[' => long_bracket_end(bytes, i),
            quote @ (b'"' | b'\'') => Some(quoted_end(bytes, i, quote)),
            _ => None,
        };
        match end {
            Some(end) => {
                if code_from < i {
                    spans.push((true, &lua[code_from..i]));
                }
                spans.push((false, &lua[i..end]));
                (code_from, i) = (end, end);
            }
            None => i += 1,
        }
    }
    if code_from < bytes.len() {
        spans.push((true, &lua[code_from..]));
    }
    spans
}

/// Where the line holding `at` ends (at its newline, or the text's end).
fn line_end(bytes: &[u8], at: usize) -> usize {
    bytes[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |n| at + n)
}

/// Past the long bracket that opens at `at` (`[[`, `[=[`, ...), `None` when none opens
/// there; an unclosed one runs to the text's end.
fn long_bracket_end(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    let level = bytes[at + 1..].iter().take_while(|&&b| b == b'=').count();
    if bytes.get(at + 1 + level) != Some(&b'[') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b']')
        .chain(std::iter::repeat_n(b'=', level))
        .chain(std::iter::once(b']'))
        .collect();
    let from = at + 2 + level;
    Some(
        bytes[from..]
            .windows(close.len())
            .position(|w| w == close.as_slice())
            .map_or(bytes.len(), |n| from + n + close.len()),
    )
}

/// Past the string literal that opens with `quote` at `at`.
fn quoted_end(bytes: &[u8], at: usize, quote: u8) -> usize {
    let mut i = at + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\n' => return i,
            b if b == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}
