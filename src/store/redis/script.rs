//! The Lua script of a call, composed from `lua/` for the algorithms its policies use,
//! and how a call becomes an `EVALSHA`.

use std::sync::{Arc, OnceLock};

use deadpool_redis::redis::{Cmd, Script};
use smallvec::SmallVec;

use crate::policy::{Algorithm, Policy};
use crate::store::{GiveBack, LeaseAsk, Operation};

/// The helpers every script starts with.
const COMMON: &str = include_str!("../../../lua/common.lua");
/// Deciding one subject's policies and writing their states: what a single call
/// and a batch share.
const DECIDE: &str = include_str!("../../../lua/decide.lua");
/// The entry point of a single call.
const MAIN: &str = include_str!("../../../lua/main.lua");
/// The entry point of a batch of plain checks.
const BATCH: &str = include_str!("../../../lua/batch.lua");

/// The file of each algorithm, in the order of [`Algorithm::ALL`].
const ALGORITHM_FILES: [&str; 4] = [
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/sliding_log.lua"),
];

/// Which algorithms a call's policies use (one bit per [`Algorithm::ALL`] position),
/// and whether the call is a check or an admin operation.
///
/// Lua defines a script's functions again on every call, so one script of all four
/// algorithms made each call pay for creating the closures of the three it does not
/// use, and a check paid for the refund functions it never runs. One script per shape
/// (at most 30, each built and hashed once per process) is still one `EVALSHA` per
/// call, and a check of a limiter with one algorithm pays for that one's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape(u8);

/// The bit of a [`Shape`] that says the script serves the admin operations.
const ADMIN: u8 = 0x10;
/// The bit of a [`Shape`] that says the script is the leasing check.
const LEASE: u8 = 0x20;

impl Shape {
    /// The shape of a call of `op` on `policies` (`lease`: a check that also asks for
    /// a lease).
    pub(super) fn of(policies: &[Policy], op: Operation, lease: bool) -> Self {
        let algorithms = policies
            .iter()
            .fold(0, |bits, p| bits | 1 << index(p.algorithm()));
        Self(match (op, lease) {
            (Operation::Check, false) => algorithms,
            (Operation::Check, true) => algorithms | LEASE,
            _ => algorithms | ADMIN,
        })
    }

    fn is_admin(self) -> bool {
        self.0 & ADMIN != 0
    }

    fn is_lease(self) -> bool {
        self.0 & LEASE != 0
    }

    /// The script of this shape.
    pub(super) fn script(self) -> &'static ShapeScript {
        static SCRIPTS: [OnceLock<ShapeScript>; 64] = [const { OnceLock::new() }; 64];
        SCRIPTS[usize::from(self.0 & 0x3f)].get_or_init(|| ShapeScript::compose(self))
    }
}

/// The position of an algorithm in [`Algorithm::ALL`].
const fn index(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingWindow => 1,
        Algorithm::TokenBucket => 2,
        Algorithm::SlidingLog => 3,
    }
}

/// One shape's source and SHA-1.
pub(super) struct ShapeScript {
    source: String,
    script: Script,
}

impl ShapeScript {
    fn compose(shape: Shape) -> Self {
        let admin = shape.is_admin();
        let mut source = String::from(COMMON);
        if admin {
            source.push_str("local REFUND = {}\n");
        }
        for (i, file) in ALGORITHM_FILES.iter().enumerate() {
            if shape.0 & (1 << i) != 0 {
                // An algorithm's refund function, after its admin line, only where it
                // can run.
                let (check, rest) = file.split_at(file.find(ADMIN_LINE).unwrap_or(file.len()));
                source.push_str(check);
                if admin {
                    source.push_str(rest);
                }
            }
        }
        source.push_str(DECIDE);
        // Where main.lua's per-policy arguments start, after the cost (and the
        // operation of an admin call).
        source.push_str(if admin {
            "local op, first = ARGV[2], 3\n"
        } else if shape.is_lease() {
            "local op, first = \"l\", 4\n"
        } else {
            "local op, first = \"c\", 2\n"
        });
        source.push_str(MAIN);
        let script = Script::new(&source);
        Self { source, script }
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
    check: String,
    admin: String,
    lease: String,
    batch: String,
}

impl Library {
    /// The library of this build.
    pub(super) fn get() -> &'static Library {
        static LIBRARY: OnceLock<Library> = OnceLock::new();
        LIBRARY.get_or_init(Library::compose)
    }

    fn compose() -> Self {
        let mut body = String::from(COMMON);
        body.push_str("local REFUND = {}\n");
        for file in ALGORITHM_FILES {
            body.push_str(file);
        }
        body.push_str(DECIDE);
        body.push_str("local function run(KEYS, ARGV, op, first)\n");
        body.push_str(MAIN);
        body.push_str("end\nlocal function batch(KEYS, ARGV)\n");
        body.push_str(BATCH);
        body.push_str("end\n");
        let hash = Script::new(&body);
        let name = format!("redlimit_{}", &hash.get_hash()[..16]);
        let (check, admin) = (format!("{name}_check"), format!("{name}_admin"));
        let (lease, batch) = (format!("{name}_lease"), format!("{name}_batch"));
        let source = format!(
            "#!lua name={name}\n{body}\
             redis.register_function('{check}', function(keys, args) return run(keys, args, 'c', 2) end)\n\
             redis.register_function('{admin}', function(keys, args) return run(keys, args, args[2], 3) end)\n\
             redis.register_function('{lease}', function(keys, args) return run(keys, args, 'l', 4) end)\n\
             redis.register_function('{batch}', function(keys, args) return batch(keys, args) end)\n"
        );
        Self {
            source,
            check,
            admin,
            lease,
            batch,
        }
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

/// The two-letter code of an algorithm, in keys and in the script's arguments.
pub(super) const fn code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket => "tb",
        Algorithm::SlidingLog => "sl",
    }
}

/// The line of an algorithm file after which its admin part (the refund) begins.
const ADMIN_LINE: &str = "\n-- admin:";

/// The one-letter code of an admin operation, the admin script's `ARGV[2]`.
const fn op_code(op: Operation) -> &'static str {
    match op {
        Operation::Check => "c",
        Operation::Peek => "p",
        Operation::Refund => "r",
        Operation::Reset => "x",
    }
}

/// Everything one call sends, kept so the same call can be resent as `EVAL` when the
/// server has lost the script.
#[derive(Debug)]
pub(super) struct Call {
    /// `prefix:{subject}:`, the part every key of the subject shares.
    pub(super) key_base: String,
    /// The client's time in ms, or `None` for Redis `TIME`.
    pub(super) now_ms: Option<u64>,
    pub(super) cost: u64,
    pub(super) op: Operation,
    pub(super) policies: Arc<[Policy]>,
    /// A check that also asks for a lease: the units wanted and the batch.
    pub(super) lease: Option<LeaseAsk>,
    /// A refund that is a lease's give-back: only before its time (ms, the store's
    /// clock) and while the subject's lease generation is its epoch, sent as the
    /// operation `g:<ms>:<epoch>`.
    pub(super) give_back: Option<GiveBack>,
}

impl Call {
    fn shape(&self) -> Shape {
        Shape::of(&self.policies, self.op, self.lease.is_some())
    }

    /// Whether the call names the subject's lease generation key after its policies'
    /// keys: a leasing check, a give-back and a reset do.
    fn names_lease_key(&self) -> bool {
        self.lease.is_some() || self.give_back.is_some() || self.op == Operation::Reset
    }
}

/// Appends a policy's three arguments: its algorithm's code, its limit (negative for
/// a shadow policy: one argument fewer per policy) and the one duration its algorithm
/// reads.
fn push_policy_args(cmd: &mut Cmd, policy: &Policy) {
    let algorithm = policy.algorithm();
    let limit = i64::try_from(policy.limit()).unwrap_or(i64::MAX);
    let limit = if policy.is_shadow() { -limit } else { limit };
    let n = match algorithm {
        Algorithm::TokenBucket => policy.emission_interval_us(),
        _ => policy.window_ms(),
    };
    cmd.arg(code(algorithm)).arg(limit).arg(n);
}

/// Plain checks sent as one call of the library's batch function (`lua/batch.lua`):
/// each decided as its own call would be, in order.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) calls: Vec<Call>,
}

/// What the store sends in one round trip: one call, or a batch of checks.
pub(super) trait Request: Send + Sync {
    /// The command, sent `via` a function or a script.
    fn command(&self, via: Via) -> Cmd;
}

impl Request for Call {
    /// The command, sent `via` a function or a script; the arguments are the same.
    fn command(&self, via: Via) -> Cmd {
        let mut cmd = match via {
            Via::Function => {
                let library = Library::get();
                let mut cmd = deadpool_redis::redis::cmd("FCALL");
                cmd.arg(match (self.op, self.lease) {
                    (Operation::Check, None) => &library.check,
                    (Operation::Check, Some(_)) => &library.lease,
                    _ => &library.admin,
                });
                cmd
            }
            Via::Script => {
                let mut cmd = deadpool_redis::redis::cmd("EVALSHA");
                cmd.arg(self.shape().script().sha1());
                cmd
            }
            Via::ScriptSource => {
                let mut cmd = deadpool_redis::redis::cmd("EVAL");
                cmd.arg(self.shape().script().source());
                cmd
            }
        };
        let lease_key = self.names_lease_key();
        cmd.arg(self.policies.len() + usize::from(lease_key));
        let mut key = String::with_capacity(self.key_base.len() + 24);
        for policy in self.policies.iter() {
            key.clear();
            key.push_str(&self.key_base);
            push_policy_suffix(&mut key, policy);
            cmd.arg(key.as_str());
        }
        if lease_key {
            cmd.arg(lease_key_of(&self.key_base));
        }
        cmd.arg(self.cost);
        if let Some(back) = self.give_back {
            cmd.arg(format!("g:{}:{}", back.before_ms, back.epoch));
        } else if self.op != Operation::Check {
            cmd.arg(op_code(self.op));
        } else if let Some(ask) = self.lease {
            cmd.arg(ask.want).arg(ask.batch);
        }
        for policy in self.policies.iter() {
            push_policy_args(&mut cmd, policy);
        }
        // Without a client clock the script reads Redis `TIME`.
        if let Some(ms) = self.now_ms {
            cmd.arg(ms);
        }
        cmd
    }
}

impl Request for Batch {
    /// `FCALL <batch> numkeys keys.. t|c[r] nsets (p (code limit n)*p)* sets 1|n costs.. ms..`:
    /// each policy set is sent once, however many of the batch's checks use it.
    fn command(&self, via: Via) -> Cmd {
        let mut cmd = match via {
            Via::Function => {
                let mut cmd = deadpool_redis::redis::cmd("FCALL");
                cmd.arg(&Library::get().batch);
                cmd
            }
            Via::Script => {
                let mut cmd = deadpool_redis::redis::cmd("EVALSHA");
                cmd.arg(batch_script().sha1());
                cmd
            }
            Via::ScriptSource => {
                let mut cmd = deadpool_redis::redis::cmd("EVAL");
                cmd.arg(batch_script().source());
                cmd
            }
        };
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
        let mut key = String::new();
        for call in &self.calls {
            for policy in call.policies.iter() {
                key.clear();
                key.push_str(&call.key_base);
                push_policy_suffix(&mut key, policy);
                cmd.arg(key.as_str());
            }
        }
        // The batcher never mixes the two clocks in one batch.
        let client_clock = self.calls.iter().any(|c| c.now_ms.is_some());
        // Whether a subject comes twice: only then does the batch keep what it
        // writes for the checks after, and write each state once.
        let mut subjects = std::collections::HashSet::with_capacity(self.calls.len());
        let repeats = !self
            .calls
            .iter()
            .all(|c| subjects.insert(c.key_base.as_str()));
        let mode = match (client_clock, repeats) {
            (false, false) => "t",
            (false, true) => "tr",
            (true, false) => "c",
            (true, true) => "cr",
        };
        cmd.arg(mode).arg(sets.len());
        for set in &sets {
            cmd.arg(set.len());
            for policy in set.iter() {
                push_policy_args(&mut cmd, policy);
            }
        }
        // One byte per check: its set, from 1 (a batch holds at most 255 checks).
        let order: Vec<u8> = set_of
            .iter()
            .map(|&set| u8::try_from(set + 1).unwrap_or(u8::MAX))
            .collect();
        cmd.arg(order);
        if self.calls.iter().all(|c| c.cost == 1) {
            cmd.arg("1");
        } else {
            cmd.arg("n");
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

/// The batch as a script, for a server without functions or without the library:
/// every algorithm's check, no admin part.
fn batch_script() -> &'static ShapeScript {
    static SCRIPT: OnceLock<ShapeScript> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let mut source = String::from(COMMON);
        for file in ALGORITHM_FILES {
            source.push_str(&file[..file.find(ADMIN_LINE).unwrap_or(file.len())]);
        }
        source.push_str(DECIDE);
        source.push_str(BATCH);
        let script = Script::new(&source);
        ShapeScript { source, script }
    })
}

/// The key of a subject's lease generation, from its key base (`prefix:{subject}:`):
/// `~` is never in a policy name, so no policy's key is this one.
pub(super) fn lease_key_of(key_base: &str) -> String {
    let mut key = String::with_capacity(key_base.len() + 6);
    key.push_str(key_base);
    key.push_str("~lease");
    key
}

/// Appends `<policy name>:<algorithm code>` to a key base.
pub(super) fn push_policy_suffix(key: &mut String, policy: &Policy) {
    key.push_str(policy.name());
    key.push(':');
    key.push_str(code(policy.algorithm()));
}
