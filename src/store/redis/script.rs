//! The Lua of every call, composed from `lua/` by explicit code: the function
//! library (Redis 7 and later) and, for servers without functions, one script per
//! call shape with the algorithms its policies use. The Lua files read the constants
//! of [`contract`](super::contract) by name; composed, the code has their values in
//! place of the names (see [`inline`]), and the library starts with the preamble
//! generated from them.

use std::sync::OnceLock;

use deadpool_redis::redis::{Cmd, Script};

use super::contract::{inline, preamble, Entry};
use crate::policy::{Algorithm, Policy};

/// The helpers every script starts with.
const COMMON: &str = include_str!("../../../lua/common.lua");
/// Deciding one subject's policies and writing their states: what a single call
/// and a batch share.
const DECIDE: &str = include_str!("../../../lua/decide.lua");
/// The lease rule of a leasing check, on the states its decision read.
const LEASE: &str = include_str!("../../../lua/lease.lua");
/// The entry point of a reset, a leasing check and a give-back.
const MAIN: &str = include_str!("../../../lua/main.lua");
/// The entry point of a batch: checks and the operations that batch with them.
const BATCH: &str = include_str!("../../../lua/batch.lua");

/// Each algorithm's Lua, in the order of [`Algorithm::ALL`]: its decide function,
/// its refund function, composed only where units are given back, and its charge
/// function, composed only where units are charged (the admin operations).
const ALGORITHMS: [AlgorithmLua; 6] = [
    AlgorithmLua {
        check: include_str!("../../../lua/fixed_window.lua"),
        refund: include_str!("../../../lua/fixed_window_refund.lua"),
        charge: include_str!("../../../lua/fixed_window_charge.lua"),
    },
    AlgorithmLua {
        check: include_str!("../../../lua/sliding_window.lua"),
        refund: include_str!("../../../lua/sliding_window_refund.lua"),
        charge: include_str!("../../../lua/sliding_window_charge.lua"),
    },
    AlgorithmLua {
        check: include_str!("../../../lua/token_bucket.lua"),
        refund: include_str!("../../../lua/token_bucket_refund.lua"),
        charge: include_str!("../../../lua/token_bucket_charge.lua"),
    },
    AlgorithmLua {
        check: include_str!("../../../lua/sliding_log.lua"),
        refund: include_str!("../../../lua/sliding_log_refund.lua"),
        charge: include_str!("../../../lua/sliding_log_charge.lua"),
    },
    AlgorithmLua {
        check: include_str!("../../../lua/in_flight.lua"),
        // A slot's release and renewal: what in-flight policies give back.
        refund: include_str!("../../../lua/in_flight_release.lua"),
        // Units are charged, never slots: decide.lua leaves in-flight policies out.
        charge: "",
    },
    AlgorithmLua {
        check: include_str!("../../../lua/calendar.lua"),
        refund: include_str!("../../../lua/calendar_refund.lua"),
        charge: include_str!("../../../lua/calendar_charge.lua"),
    },
];

struct AlgorithmLua {
    check: &'static str,
    refund: &'static str,
    charge: &'static str,
}

/// What the refund functions register in, and the in-flight release: declared only
/// where they are composed (code that never runs them may name them).
const REFUND_TABLE: &str = "local REFUND, IN_FLIGHT_HOLD = {}\n";
/// What the charge functions register in: declared only where they are composed.
const CHARGE_TABLE: &str = "local CHARGE = {}\n";

/// `common.lua`, and the refund and charge tables of an entry point that gives back
/// or charges: what every composition starts with (the library after its preamble).
fn head(entry: Option<Entry>) -> String {
    let mut source = String::from(COMMON);
    if entry.is_none_or(Entry::refunds) {
        source.push_str(REFUND_TABLE);
    }
    if entry.is_none_or(Entry::charges) {
        source.push_str(CHARGE_TABLE);
    }
    source
}

/// Which algorithms a call's policies use (one bit per [`Algorithm::ALL`] position),
/// and its entry point (three bits).
///
/// Lua defines a script's functions again on every call, so one script of all six
/// algorithms made each call pay for creating the closures of those it does not
/// use, and a check paid for the refund functions it never runs. One script per shape
/// (at most 320, each built and hashed once per process) is still one `EVALSHA` per
/// call, and a check of a limiter with one algorithm pays for that one's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape(u16);

/// Where a [`Shape`]'s entry point sits.
const ENTRY_SHIFT: u16 = 6;

impl Shape {
    /// The shape of a call of `entry` on `policies`.
    pub(super) fn of(policies: &[Policy], entry: Entry) -> Self {
        Self::of_many([policies], entry)
    }

    /// The shape of a call of `entry` on the policies of several sets (a batch's).
    pub(super) fn of_many<'a>(sets: impl IntoIterator<Item = &'a [Policy]>, entry: Entry) -> Self {
        let algorithms = sets
            .into_iter()
            .flatten()
            .fold(0, |bits, p| bits | 1 << index(p.algorithm()));
        Self(algorithms | (entry as u16) << ENTRY_SHIFT)
    }

    fn entry(self) -> Entry {
        Entry::ALL[usize::from(self.0 >> ENTRY_SHIFT) % Entry::ALL.len()]
    }

    /// The script of this shape.
    pub(super) fn script(self) -> &'static ShapeScript {
        const SHAPES: usize = Entry::ALL.len() << ENTRY_SHIFT;
        static SCRIPTS: [OnceLock<ShapeScript>; SHAPES] = [const { OnceLock::new() }; SHAPES];
        SCRIPTS[usize::from(self.0) % SHAPES].get_or_init(|| ShapeScript::compose(self))
    }
}

/// The position of an algorithm in [`Algorithm::ALL`].
const fn index(algorithm: Algorithm) -> u16 {
    match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingWindow => 1,
        Algorithm::TokenBucket => 2,
        Algorithm::SlidingLog => 3,
        Algorithm::InFlight => 4,
        Algorithm::Calendar => 5,
    }
}

/// One shape's source and SHA-1.
pub(super) struct ShapeScript {
    source: String,
    script: Script,
}

impl ShapeScript {
    fn new(source: String) -> Self {
        let script = Script::new(&source);
        Self { source, script }
    }

    fn compose(shape: Shape) -> Self {
        let entry = shape.entry();
        let mut source = head(Some(entry));
        for (i, algorithm) in ALGORITHMS.iter().enumerate() {
            if shape.0 & (1 << i) != 0 {
                source.push_str(algorithm.check);
                if entry.refunds() {
                    source.push_str(algorithm.refund);
                }
                if entry.charges() {
                    source.push_str(algorithm.charge);
                }
            }
        }
        source.push_str(DECIDE);
        if entry == Entry::Lease {
            source.push_str(LEASE);
        }
        match entry.main_op() {
            Some(op) => {
                source.push_str(&format!("local op = {op}\n"));
                source.push_str(MAIN);
            }
            None => source.push_str(BATCH),
        }
        Self::new(inline(&source))
    }

    /// The Lua source, as `EVAL` and `SCRIPT LOAD` take it.
    pub(super) fn source(&self) -> &str {
        &self.source
    }

    /// The SHA-1 of the source, as `EVALSHA` takes it.
    pub(super) fn sha1(&self) -> &str {
        self.script.get_hash()
    }
}

/// The Redis 7 function library of every algorithm: `FUNCTION LOAD` once per server,
/// then one `FCALL` per call.
///
/// A script's chunk runs again on every `EVALSHA`, creating the closures and tables it
/// defines each time; a library's functions are defined once, when it is loaded. On
/// Redis 7.0 that is about a tenth of a fixed-window check's instructions (callgrind,
/// BENCHMARKS.md). The same `lua/` files, the same arithmetic: the library wraps
/// main.lua in a function instead of running it as a chunk.
///
/// The library and its functions are named after a hash of its source, so instances of
/// two releases sharing a Redis each call their own (a library is kept by Redis, with
/// its data, until deleted: one per release that ran against it).
pub(super) struct Library {
    source: String,
    /// Each entry point's function, in the order of [`Entry::ALL`].
    functions: [String; 5],
}

impl Library {
    /// The library of this build.
    pub(super) fn get() -> &'static Library {
        static LIBRARY: OnceLock<Library> = OnceLock::new();
        LIBRARY.get_or_init(Library::compose)
    }

    fn compose() -> Self {
        // Every entry point's: all of them.
        let mut code = head(None);
        for algorithm in &ALGORITHMS {
            code.push_str(algorithm.check);
            code.push_str(algorithm.refund);
            code.push_str(algorithm.charge);
        }
        code.push_str(DECIDE);
        code.push_str(LEASE);
        code.push_str("local function main_entry(KEYS, ARGV, op)\n");
        code.push_str(MAIN);
        code.push_str("end\nlocal function batch_entry(KEYS, ARGV)\n");
        code.push_str(BATCH);
        code.push_str("end\n");
        // The preamble, then the code with the values in place of the names; the
        // registrations below, run once at load, read the preamble's names.
        let mut body = preamble();
        body.push_str(&inline(&code));
        let hash = Script::new(&body);
        let name = format!("redlimit_{}", &hash.get_hash()[..16]);
        let mut source = format!("#!lua name={name}\n{body}");
        for entry in Entry::ALL {
            let call = match entry.main_op() {
                Some(op) => format!("main_entry(keys, args, {op})"),
                None => "batch_entry(keys, args)".to_owned(),
            };
            // The batch's function serves two entry points: registered once.
            if entry != Entry::Admin {
                source.push_str(&format!(
                    "redis.register_function('{name}_{}', function(keys, args) return {call} end)\n",
                    entry.name(),
                ));
            }
        }
        Self {
            source,
            functions: Entry::ALL.map(|entry| format!("{name}_{}", entry.name())),
        }
    }

    /// The name of `entry`'s function.
    pub(super) fn function(&self, entry: Entry) -> &str {
        &self.functions[entry as usize]
    }

    /// The source, as `FUNCTION LOAD` takes it.
    pub(super) fn source(&self) -> &str {
        &self.source
    }

    /// `FUNCTION LOAD REPLACE` of this library.
    pub(super) fn load_command(&self) -> Cmd {
        let mut cmd = deadpool_redis::redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(self.source());
        cmd
    }
}

/// How a call reaches the server's Lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    /// `FCALL` of the [`Library`]'s function (Redis 7 and later).
    Function,
    /// `EVALSHA` of the call shape's script (servers without functions).
    Script,
    /// `EVAL` of the call shape's script: after `NOSCRIPT`, it runs and caches it.
    ScriptSource,
}
