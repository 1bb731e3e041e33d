//! What the crate's own benches send bare: the store's commands and scripts, built by the
//! same code as its calls (feature `internals`).

use super::contract::args::{Admin, AdminOp, Check, Entry, Request};
use super::script::{self, Via};
use super::RedisStore;
use crate::policy::Policy;
use crate::store::{Operation, PolicySet};
use crate::subject::Subject;

impl RedisStore {
    /// The Lua source of the script a limiter with `policies` runs for its checks on a
    /// server without functions (before Redis 7; others get
    /// [`RedisStore::function_library`]), for benchmarks that run it bare. It holds the
    /// code of the algorithms `policies` use, so limiters of different algorithms run
    /// different scripts (and the rare admin operations a script of their own).
    pub(crate) fn script_source(policies: &[Policy]) -> &'static str {
        script::Shape::of(policies, Entry::Check).script().source()
    }

    /// The SHA-1 of [`RedisStore::script_source`], as `EVALSHA` takes it.
    pub(crate) fn script_sha1(policies: &[Policy]) -> &'static str {
        script::Shape::of(policies, Entry::Check).script().sha1()
    }

    /// The command this store sends for one call: `FCALL` of its function library's
    /// function (`script: true`: `EVALSHA` of the call's script, what a server without
    /// functions gets), with the subject's keys and the call's arguments. The clock is
    /// this store's: Redis `TIME`, or its client clock read now. Load the library first
    /// with [`RedisStore::function_library`] (`FUNCTION LOAD REPLACE`), or the script
    /// with [`RedisStore::script_source`].
    ///
    /// For benchmarks that must send exactly what the store sends, without copying its
    /// wire format.
    pub(crate) fn command(
        &self,
        op: Operation,
        subject: &Subject,
        set: &PolicySet,
        cost: u64,
        script: bool,
    ) -> deadpool_redis::redis::Cmd {
        let via = if script { Via::Script } else { Via::Function };
        match AdminOp::of(op) {
            None => self.call(subject, set, cost, Check).command(via),
            Some(admin) => self.call(subject, set, cost, Admin(admin)).command(via),
        }
    }
}
