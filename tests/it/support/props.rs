//! The memory store and the Redis store run side by side on one fake clock, for the
//! conformance suite and the property tests.
//!
//! Redis counts key TTLs in real time, not on the fake clock, so after each call the
//! runner stretches the subject's keys' TTLs: state then disappears only as the fake
//! clock says (the memory store drops it; Redis keeps stale state, which every
//! algorithm reads as unused). TTL values themselves are checked in redis_store.rs.
//!
//! A key a call writes with a TTL of a millisecond or two (an admission in the last
//! milliseconds of a window) can still expire in real time before the stretch reaches
//! Redis, on a busy machine often. So the runner keeps the state each call started
//! from (`DUMP`), and when a call that writes leaves a key missing, it runs that call
//! again on that state inside `MULTI`/`EXEC`, stretch included: Redis (7.0 and later)
//! judges expiry by the time the transaction started, so nothing it writes there can
//! expire before the stretch. The call is deterministic (same state, same arguments,
//! the fake clock), so the state is what the first run wrote, and no run is ever
//! spoiled by load; [`Pair::restored`] says when it happened.

use redlimit::internals::{AdminStore, LimiterInternals, Operation, RedisStoreInternals, Store};
use std::time::Duration;

use deadpool_redis::redis;
use redlimit::clock::FakeClock;
use redlimit::{Decision, Limiter, LimiterBuilder, MemoryStore, Policy, RedisStore, Subject};

use super::RedisServer;

/// A limiter on `store` with all of `policies`, in order.
pub fn limiter<S: Store>(store: S, policies: &[Policy]) -> Limiter<S> {
    builder(store, policies)
        .build()
        .expect("one or more policies, named apart")
}

/// The builder of [`limiter`], for settings beside the policies.
pub fn builder<S: Store>(store: S, policies: &[Policy]) -> LimiterBuilder<S> {
    policies
        .iter()
        .cloned()
        .fold(Limiter::builder(store), LimiterBuilder::policy)
}

/// One step's decisions from both stores.
#[derive(Debug)]
pub struct Pair {
    /// The memory store's decision.
    pub memory: Decision,
    /// The Redis store's decision.
    pub redis: Decision,
    /// A key this step wrote expired in real time before its TTL was stretched, and
    /// the runner put back what the step wrote (see the module's doc).
    pub restored: bool,
}

/// An admin operation run on both stores between checks.
#[derive(Debug, Clone, Copy)]
pub enum Admin {
    /// `Limiter::peek` with this cost.
    Peek(u32),
    /// `Limiter::refund` of this cost.
    Refund(u32),
    /// `Limiter::reset`.
    Reset,
    /// `Operation::Charge` of this many units, on the stores themselves (the limiter
    /// charges only where a decision's cost went).
    Charge(u64),
}

/// The TTL every key of the subject gets after each call: longer than any run.
const STRETCH_MS: u64 = 600_000;

/// The memory and Redis stores on one fake clock, deciding for one subject.
pub struct SideBySide {
    clock: FakeClock,
    memory: Limiter<MemoryStore>,
    redis: Limiter<RedisStore>,
    memory_store: MemoryStore,
    redis_store: RedisStore,
    subject: Subject,
    keys: Vec<String>,
    conn: redis::aio::MultiplexedConnection,
    /// The subject's keys as the last call left them (`DUMP`; `None` where absent):
    /// the state a replay starts from.
    saved: Vec<Option<Vec<u8>>>,
    /// Whether this runner has loaded the store's function library for its replays.
    library_loaded: bool,
    /// Calls whose lost state was put back.
    restored: u64,
    /// How long to wait between a call and its stretch: a test's stand-in for a
    /// machine too busy to stretch in time.
    stall: Duration,
}

impl SideBySide {
    /// Fresh stores for `subject` (use a subject no other run uses on `server`).
    pub async fn new(
        server: &RedisServer,
        policies: &[Policy],
        start_ms: u64,
        subject: impl Into<Subject>,
    ) -> Self {
        let subject = subject.into();
        let clock = FakeClock::new(start_ms);
        let store = server
            .store()
            .client_clock(clock.clone())
            .timeout(Duration::from_secs(5));
        let redis = limiter(store.clone(), policies);
        let keys: Vec<String> = policies
            .iter()
            .map(|p| store.key(&subject, redis.policy_set(), p))
            .collect();
        let memory_store = MemoryStore::with_clock(clock.clone());
        let mut run = Self {
            memory: limiter(memory_store.clone(), policies),
            memory_store,
            redis_store: store,
            redis,
            clock,
            subject,
            saved: vec![None; keys.len()],
            keys,
            conn: server.conn().await,
            library_loaded: false,
            restored: 0,
            stall: Duration::ZERO,
        };
        if let Err(e) = run.save().await {
            panic!("{e}\n{}", server.log_tail());
        }
        run
    }

    /// How many calls lost state to a real-time expiry and had it put back.
    pub fn restored(&self) -> u64 {
        self.restored
    }

    /// Waits `stall` (real time) between each call and its stretch, as a descheduled
    /// test would: for the test that the runner puts lost state back.
    pub fn stall_before_stretch(&mut self, stall: Duration) {
        self.stall = stall;
    }

    /// Fails the test unless `redis` and `memory` agree.
    fn compare<T: PartialEq + std::fmt::Debug>(redis: &T, memory: &T, what: &str) {
        assert_eq!(
            redis, memory,
            "{what}: Redis (left) and memory (right) differ"
        );
    }

    /// One step at `now`: both decisions, then the TTL stretch (and the replay, when
    /// the step lost state). `Err` when a call failed (the message says which).
    pub async fn step(&mut self, now: u64, cost: u32) -> Result<Pair, String> {
        self.clock.set_ms(now);
        let memory = self
            .memory
            .check(self.subject.clone(), cost)
            .await
            .map_err(|e| format!("the memory store failed: {e}"))?;
        let redis = self
            .redis
            .check(self.subject.clone(), cost)
            .await
            .map_err(|e| format!("the Redis store failed: {e}"))?;
        let restored = self.settle(Operation::Check, u64::from(cost)).await?;
        Ok(Pair {
            memory,
            redis,
            restored,
        })
    }

    /// After a call `op` of `cost` that may write with a TTL: stretches and saves the
    /// keys, and if one is missing (never written, or written and expired in real time
    /// already), runs the call again from the state it started from, atomically with
    /// the stretch. Whether state was lost and put back.
    async fn settle(&mut self, op: Operation, cost: u64) -> Result<bool, String> {
        let before = self.saved.clone();
        let after = self.save().await?;
        if after.iter().all(|&present| present) {
            return Ok(false);
        }
        let first = std::mem::replace(&mut self.saved, before);
        let again = self.replay(op, cost).await?;
        // The same call on the same state writes the same: whatever survived the
        // first run is as the replay wrote it.
        for (i, key) in self.keys.iter().enumerate() {
            if after[i] && first[i] != self.saved[i] {
                return Err(format!(
                    "the replay of {op:?} of {cost} wrote {key} otherwise: {:?}, then {:?}",
                    first[i], self.saved[i]
                ));
            }
        }
        let lost = again.iter().zip(&after).any(|(&now, &then)| now && !then);
        self.restored += u64::from(lost);
        Ok(lost)
    }

    /// Stretches the subject's keys' TTLs (see the module's doc) and saves their
    /// state: whether each was there.
    async fn save(&mut self) -> Result<Vec<bool>, String> {
        if !self.stall.is_zero() {
            tokio::time::sleep(self.stall).await;
        }
        let mut pipe = redis::pipe();
        self.stretch_and_dump(&mut pipe);
        let replies: Vec<redis::Value> = pipe
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("PEXPIRE and DUMP failed: {e}"))?;
        self.saved_from(replies)
    }

    /// Runs `op` of `cost` again as the store sends it, on the saved state, in one
    /// transaction with the stretch; saves the state it leaves and says which keys
    /// are there.
    async fn replay(&mut self, op: Operation, cost: u64) -> Result<Vec<bool>, String> {
        if !self.library_loaded {
            let _: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(RedisStore::function_library())
                .query_async(&mut self.conn)
                .await
                .map_err(|e| format!("FUNCTION LOAD failed: {e}"))?;
            self.library_loaded = true;
        }
        let set = self.redis.policy_set();
        let call = self
            .redis_store
            .command(op, &self.subject, set, cost, false);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (key, saved) in self.keys.iter().zip(&self.saved) {
            pipe.cmd("DEL").arg(key).ignore();
            if let Some(dump) = saved {
                pipe.cmd("RESTORE").arg(key).arg(0).arg(dump).ignore();
            }
        }
        pipe.add_command(call).ignore();
        self.stretch_and_dump(&mut pipe);
        let replies: Vec<redis::Value> = pipe
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("the replay of {op:?} of {cost} failed: {e}"))?;
        self.saved_from(replies)
    }

    /// Adds `PEXPIRE` then `DUMP` of each key to `pipe`.
    fn stretch_and_dump(&self, pipe: &mut redis::Pipeline) {
        for key in &self.keys {
            pipe.cmd("PEXPIRE").arg(key).arg(STRETCH_MS);
        }
        for key in &self.keys {
            pipe.cmd("DUMP").arg(key);
        }
    }

    /// Saves the dumps of the replies of [`SideBySide::stretch_and_dump`]; whether
    /// each key was there.
    fn saved_from(&mut self, replies: Vec<redis::Value>) -> Result<Vec<bool>, String> {
        let n = self.keys.len();
        if replies.len() != 2 * n {
            return Err(format!(
                "{} replies for {n} keys: {replies:?}",
                replies.len()
            ));
        }
        let mut present = Vec::with_capacity(n);
        for (i, reply) in replies.into_iter().enumerate() {
            match (i < n, reply) {
                (true, redis::Value::Int(there)) => present.push(there == 1),
                (false, redis::Value::Nil) => self.saved[i - n] = None,
                (false, redis::Value::BulkString(dump)) => self.saved[i - n] = Some(dump),
                (_, other) => return Err(format!("unexpected reply {other:?}")),
            }
        }
        for (i, saved) in self.saved.iter().enumerate() {
            if saved.is_some() != present[i] {
                return Err(format!(
                    "{} is there for PEXPIRE, not for DUMP",
                    self.keys[i]
                ));
            }
        }
        Ok(present)
    }

    /// [`SideBySide::step`] that fails the test unless both decisions are identical;
    /// `what` names the step in failure messages.
    pub async fn step_checked(
        &mut self,
        now: u64,
        cost: u32,
        what: &str,
        server: &RedisServer,
    ) -> Decision {
        let pair = match self.step(now, cost).await {
            Ok(pair) => pair,
            Err(e) => panic!("{what}: {e}\n{}", server.log_tail()),
        };
        Self::compare(&pair.redis, &pair.memory, what);
        pair.memory
    }

    /// An admin operation at `now` on both stores: the same answer, and (checked by
    /// the steps that follow) the same state.
    pub async fn admin(&mut self, now: u64, op: Admin, what: &str, server: &RedisServer) {
        self.clock.set_ms(now);
        let subject = &self.subject;
        let (memory, redis) = match op {
            Admin::Peek(cost) => (
                self.memory.peek(subject.clone(), cost).await.map(Some),
                self.redis.peek(subject.clone(), cost).await.map(Some),
            ),
            Admin::Refund(cost) => (
                self.memory.refund(subject.clone(), cost).await.map(Some),
                self.redis.refund(subject.clone(), cost).await.map(Some),
            ),
            Admin::Reset => (
                self.memory.reset(subject.clone()).await.map(|()| None),
                self.redis.reset(subject.clone()).await.map(|()| None),
            ),
            Admin::Charge(units) => {
                let set = self.memory.policy_set();
                let memory = self
                    .memory_store
                    .run(Operation::Charge, subject.clone(), set, units)
                    .await;
                let redis = self
                    .redis_store
                    .run(Operation::Charge, subject.clone(), set, units)
                    .await;
                (
                    memory.map(Some).map_err(redlimit::Error::from),
                    redis.map(Some).map_err(redlimit::Error::from),
                )
            }
        };
        let memory = match memory {
            Ok(d) => d,
            Err(e) => panic!("{what}: the memory store failed {op:?}: {e}"),
        };
        let redis = match redis {
            Ok(d) => d,
            Err(e) => panic!("{what}: Redis failed {op:?}: {e}\n{}", server.log_tail()),
        };
        // A charge writes with a TTL, as a check does; a peek writes nothing, a refund
        // keeps the TTL, a reset deletes.
        let settled = match op {
            Admin::Charge(units) => self.settle(Operation::Charge, units).await.map(drop),
            _ => self.save().await.map(drop),
        };
        if let Err(e) = settled {
            panic!("{what}: {op:?}: {e}\n{}", server.log_tail());
        }
        Self::compare(&redis, &memory, &format!("{what}: {op:?}"));
    }
}

/// A small deterministic generator (64-bit LCG), so generated traces replay exactly.
#[derive(Debug, Clone, Copy)]
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// Uniform enough below `n` (0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
