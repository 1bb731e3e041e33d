//! Hooks into the crate for its own tests and benches (feature `internals`): they look
//! inside a limiter or build what the stores send. Not part of the API: no stability
//! promise, and applications have no use for them.

pub use crate::algorithm::grant::Grant;
pub use crate::algorithm::traces;
use crate::limiter::Limiter;
#[cfg(feature = "redis")]
use crate::policy::Policy;
pub use crate::store::backend::{AdminStore, Backend, CheckNow, Operation, PolicySet};
pub use crate::store::lease::{GiveBack, LeaseAsk, LeaseStore};
pub use crate::store::Store;
use crate::subject::Subject;

/// A look inside a limiter's leases and slots.
#[allow(async_fn_in_trait)]
pub trait LimiterInternals {
    /// Gives back the units of every expired lease now and waits for the store, as the
    /// background sweep does every quarter lifetime; returns how many calls it made.
    async fn sweep_leases(&self) -> usize;
    /// Units this instance holds now in unexpired leases, over all subjects: what it
    /// could admit without the store.
    fn held_units(&self) -> u64;
    /// Subjects whose rate or lease this limiter tracks.
    fn leased_subjects(&self) -> usize;
    /// The policies with their fingerprint, as stores see them.
    fn policy_set(&self) -> &PolicySet;
    /// In-flight slots this instance holds of `subject` (unreleased [`Permit`](crate::Permit)s).
    fn held_slots(&self, subject: &Subject) -> u64;
    /// Renews every slot this instance holds now and waits for the store, as the
    /// renewal task does every third of the slot lifetime; returns how many subjects.
    async fn renew_slots(&self) -> usize;
}

impl<S: crate::store::Store> LimiterInternals for Limiter<S> {
    async fn sweep_leases(&self) -> usize {
        match self.lease_table() {
            Some(table) => table.sweep_now().await,
            None => 0,
        }
    }

    fn held_units(&self) -> u64 {
        self.lease_table().map_or(0, |table| table.held_units())
    }

    fn leased_subjects(&self) -> usize {
        self.lease_table().map_or(0, |table| table.len())
    }

    fn policy_set(&self) -> &PolicySet {
        Limiter::policy_set(self)
    }

    fn held_slots(&self, subject: &Subject) -> u64 {
        self.slot_table().map_or(0, |table| table.held(subject))
    }

    async fn renew_slots(&self) -> usize {
        Limiter::renew_slots(self, false).await.unwrap_or(0)
    }
}

/// What the Redis store sends and keeps, for benchmarks that send exactly what it sends
/// and tests that read its state (implemented in `store/redis/hooks.rs`, beside the code
/// it reaches).
#[cfg(feature = "redis")]
pub trait RedisStoreInternals {
    /// The Redis key that holds `subject`'s state for `policy` of `set`.
    fn key(&self, subject: &Subject, set: &PolicySet, policy: &Policy) -> String;
    /// The command this store sends for one call: `FCALL` of its library's function,
    /// or (`script: true`) `EVALSHA` of the call's script, with the store's clock.
    fn command(
        &self,
        op: Operation,
        subject: &Subject,
        set: &PolicySet,
        cost: u64,
        script: bool,
    ) -> deadpool_redis::redis::Cmd;
    /// The Lua source of the script a limiter with `policies` runs for its checks on a
    /// server without functions.
    fn script_source(policies: &[Policy]) -> &'static str;
    /// The SHA-1 of [`RedisStoreInternals::script_source`], as `EVALSHA` takes it.
    fn script_sha1(policies: &[Policy]) -> &'static str;
    /// The stamps a sliding log's state in Redis holds, oldest first; `None` for bytes
    /// that are not such a state.
    fn sliding_log_stamps(raw: &[u8], limit: u64) -> Option<Vec<u64>>;
    /// The state of `policy` of `set` as text (`<window>:<count>`,
    /// `<window>:<prev>:<cur>`, `<tat>`, `<end>:<count>`, stamps joined by `,`,
    /// `<holder>:<count>:<expiry>;` per in-flight holder), from `raw`, what its
    /// [`key`](RedisStoreInternals::key) holds (a joint set's states all); `None` for
    /// bytes the Lua would read as no state.
    fn stored_state(set: &PolicySet, policy: &Policy, raw: &[u8]) -> Option<String>;
    /// How many checks the store's batch queue holds without allocating: what it
    /// keeps of its memory after a burst.
    fn queue_capacity(&self) -> usize;
    /// The integers of a reply of the store's Lua (one alone, or several packed into
    /// one string), as the store reads them; `None` for a reply of any other shape.
    fn reply_integers(reply: deadpool_redis::redis::Value) -> Option<Vec<i64>>;
}

#[cfg(feature = "redis")]
impl RedisStoreInternals for crate::RedisStore {
    fn key(&self, subject: &Subject, set: &PolicySet, policy: &Policy) -> String {
        crate::RedisStore::key(self, subject, set, policy)
    }

    fn command(
        &self,
        op: Operation,
        subject: &Subject,
        set: &PolicySet,
        cost: u64,
        script: bool,
    ) -> deadpool_redis::redis::Cmd {
        self.bare_command(op, subject, set, cost, script)
    }

    fn script_source(policies: &[Policy]) -> &'static str {
        crate::RedisStore::check_script(policies).0
    }

    fn script_sha1(policies: &[Policy]) -> &'static str {
        crate::RedisStore::check_script(policies).1
    }

    /// The newest `limit` stamps, as the Rust model keeps them.
    fn sliding_log_stamps(raw: &[u8], limit: u64) -> Option<Vec<u64>> {
        crate::algorithm::sliding_log_ring_stamps(raw, limit).map(Vec::from)
    }

    fn stored_state(set: &PolicySet, policy: &Policy, raw: &[u8]) -> Option<String> {
        crate::RedisStore::stored_state(set, policy, raw)
    }

    fn queue_capacity(&self) -> usize {
        crate::RedisStore::queue_capacity(self)
    }

    fn reply_integers(reply: deadpool_redis::redis::Value) -> Option<Vec<i64>> {
        crate::RedisStore::reply_integers(reply)
    }
}

/// How a subject appears in a Redis key.
pub trait SubjectInternals {
    /// Appends the subject as it appears inside a Redis hash tag: raw values keep
    /// `[A-Za-z0-9._=:/@-]` and percent-escape every other byte, hashes are `#` and hex.
    fn write_key_part(&self, out: &mut String);
}

impl SubjectInternals for Subject {
    fn write_key_part(&self, out: &mut String) {
        Subject::write_key_part(self, out);
    }
}
