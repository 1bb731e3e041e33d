//! What the crate's own benches send bare and its tests read back: the store's commands
//! and scripts, built by the same code as its calls (feature `internals`).

use super::contract::args::Request;
use super::contract::Entry;
use super::script::{self, Via};
use super::RedisStore;
use crate::internals::RedisStoreInternals;
use crate::policy::Policy;
use crate::store::{Operation, PolicySet};
use crate::subject::Subject;

impl RedisStoreInternals for RedisStore {
    fn key(&self, subject: &Subject, set: &PolicySet, policy: &Policy) -> String {
        RedisStore::key(self, subject, set, policy)
    }

    /// `FCALL` of the library's function (`script: true`: `EVALSHA` of the call's
    /// script, what a server without functions gets), with the subject's keys and the
    /// call's arguments; the clock is this store's (Redis `TIME`, or its client clock
    /// read now). Load the library first with [`RedisStore::function_library`].
    fn command(
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
    fn script_source(policies: &[Policy]) -> &'static str {
        script::Shape::of(policies, Entry::Check).script().source()
    }

    fn script_sha1(policies: &[Policy]) -> &'static str {
        script::Shape::of(policies, Entry::Check).script().sha1()
    }

    /// The newest `limit` stamps, as the Rust model keeps them.
    fn sliding_log_stamps(raw: &[u8], limit: u64) -> Option<Vec<u64>> {
        crate::algorithm::sliding_log_ring_stamps(raw, limit).map(Vec::from)
    }

    fn queue_capacity(&self) -> usize {
        self.link.queue.capacity()
    }
}
