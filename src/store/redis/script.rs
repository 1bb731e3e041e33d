//! The one Lua script, composed at compile time from `lua/`, and how a call becomes
//! an `EVALSHA`.

use std::sync::{Arc, LazyLock};

use deadpool_redis::redis::{Cmd, Script};

use crate::policy::{Algorithm, Policy};
use crate::store::Operation;

/// The whole script: the helpers, the four algorithms, then the entry point.
pub(super) const SOURCE: &str = concat!(
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/sliding_log.lua"),
    include_str!("../../../lua/main.lua"),
);

/// The script with its SHA-1, hashed once per process.
pub(super) static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The two-letter code of an algorithm, in keys and in the script's arguments.
pub(super) const fn code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket => "tb",
        Algorithm::SlidingLog => "sl",
    }
}

/// The one-letter code of an operation, the script's `ARGV[3]`.
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
}

impl Call {
    /// The command: `EVALSHA sha` normally, `EVAL source` when the script is missing.
    pub(super) fn command(&self, with_source: bool) -> Cmd {
        let mut cmd = if with_source {
            let mut cmd = deadpool_redis::redis::cmd("EVAL");
            cmd.arg(SOURCE);
            cmd
        } else {
            let mut cmd = deadpool_redis::redis::cmd("EVALSHA");
            cmd.arg(SCRIPT.get_hash());
            cmd
        };
        cmd.arg(self.policies.len());
        let mut key = String::with_capacity(self.key_base.len() + 24);
        for policy in self.policies.iter() {
            key.clear();
            key.push_str(&self.key_base);
            push_policy_suffix(&mut key, policy);
            cmd.arg(key.as_str());
        }
        match self.now_ms {
            Some(ms) => cmd.arg(ms),
            None => cmd.arg("s"),
        };
        cmd.arg(self.cost).arg(op_code(self.op));
        for policy in self.policies.iter() {
            cmd.arg(code(policy.algorithm()))
                .arg(policy.limit())
                .arg(policy.window_ms())
                .arg(policy.emission_interval_us())
                .arg(if policy.is_shadow() { "1" } else { "0" });
        }
        cmd
    }
}

/// Appends `<policy name>:<algorithm code>` to a key base.
pub(super) fn push_policy_suffix(key: &mut String, policy: &Policy) {
    key.push_str(policy.name());
    key.push(':');
    key.push_str(code(policy.algorithm()));
}
