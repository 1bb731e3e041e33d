//! What the crate's own benches send bare and its tests read back: the store's commands
//! and scripts, built by the same code as its calls (feature `internals`, which wires
//! them to `redlimit::internals::RedisStoreInternals`; the store never looks up at it).

use super::command::Request;
use super::contract::Entry;
use super::script::{self, Via};
use super::RedisStore;
use crate::policy::Policy;
use crate::store::backend::{Operation, PolicySet};
use crate::subject::Subject;

impl RedisStore {
    /// `FCALL` of the library's function (`script: true`: `EVALSHA` of the call's
    /// script, what a server without functions gets), with the subject's keys and the
    /// call's arguments; the clock is this store's (Redis `TIME`, or its client clock
    /// read now). Load the library first with [`RedisStore::function_library`].
    pub(crate) fn bare_command(
        &self,
        op: Operation,
        subject: &Subject,
        set: &PolicySet,
        cost: u64,
        script: bool,
    ) -> deadpool_redis::redis::Cmd {
        let via = if script { Via::Script } else { Via::Function };
        self.op_call(op, subject, set, cost).command(via)
    }

    /// The script holds the code of the algorithms `policies` use, so limiters of
    /// different algorithms run different scripts.
    pub(crate) fn check_script(policies: &[Policy]) -> (&'static str, &'static str) {
        let script = script::Shape::of(policies, Entry::Check).script();
        (script.source(), script.sha1())
    }

    /// The state of `policy` of `set`, as text, from what its key holds: the whole of
    /// it, or its part of a joint set's.
    pub(crate) fn stored_state(set: &PolicySet, policy: &Policy, raw: &[u8]) -> Option<String> {
        let policies = set.policies();
        if !super::keys::is_joint(policies, set.is_scoped()) {
            return super::contract::state::render(policy, raw);
        }
        let at = policies.iter().position(|p| p.name() == policy.name())?;
        let part = super::contract::state::joint_parts(raw, policies.len())[at]?;
        super::contract::state::render(policy, part)
    }

    /// How many checks the batch queue holds without allocating.
    pub(crate) fn queue_capacity(&self) -> usize {
        self.link.queue.capacity()
    }

    /// The integers of a reply of the store's Lua, as its decoder reads them.
    pub(crate) fn reply_integers(reply: deadpool_redis::redis::Value) -> Option<Vec<i64>> {
        super::contract::reply::integers(reply).ok()
    }
}
