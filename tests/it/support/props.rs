//! The memory store and the Redis store run side by side on one fake clock, for the
//! conformance suite and the property tests.
//!
//! Redis counts key TTLs in real time, not on the fake clock, so after each step the
//! runner stretches the subject's keys' TTLs: state then disappears only as the fake
//! clock says (the memory store drops it; Redis keeps stale state, which every
//! algorithm reads as unused). TTL values themselves are checked in redis_store.rs.
//!
//! One race remains: a key written with a TTL of a millisecond or two (an admission in
//! the last milliseconds of a window) can expire in real time before the stretch
//! reaches Redis. The runner sees it (the stretch finds a key that the admission has
//! just written missing) and reports it in [`Pair::lost_state`], so a caller can tell
//! that race from a disagreement between the stores.

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
    /// A key this step wrote expired in real time before its TTL was stretched: Redis
    /// has lost state the memory store still holds, and later steps may differ for
    /// that reason alone.
    pub lost_state: bool,
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
    lost_state: bool,
    /// A comparison failed after Redis lost state to a real-time expiry: the run
    /// proves nothing more, and [`SideBySide::spoiled`] tells its caller to run it
    /// again.
    spoiled: bool,
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
        let store = RedisStore::new(server.pool())
            .client_clock(clock.clone())
            .timeout(Duration::from_secs(5));
        let redis = limiter(store.clone(), policies);
        let keys = policies
            .iter()
            .map(|p| store.key(&subject, redis.policy_set(), p))
            .collect();
        let memory_store = MemoryStore::with_clock(clock.clone());
        Self {
            memory: limiter(memory_store.clone(), policies),
            memory_store,
            redis_store: store,
            redis,
            clock,
            subject,
            keys,
            conn: server.conn().await,
            lost_state: false,
            spoiled: false,
        }
    }

    /// Whether a comparison failed after Redis lost state to a real-time expiry (a key
    /// written with a TTL of a few ms, gone before the stretch on a busy machine): the
    /// memory side's answers still hold, the comparison does not, so the caller runs
    /// the trace again on a fresh subject.
    pub fn spoiled(&self) -> bool {
        self.spoiled
    }

    /// Fails the test unless `redis` and `memory` agree; once Redis has lost state to
    /// a real-time expiry, marks the run spoiled instead.
    fn compare<T: PartialEq + std::fmt::Debug>(
        &mut self,
        lost_before: bool,
        redis: &T,
        memory: &T,
        what: &str,
    ) {
        if self.spoiled || redis == memory {
            return;
        }
        if lost_before {
            self.spoiled = true;
            return;
        }
        assert_eq!(
            redis, memory,
            "{what}: Redis (left) and memory (right) differ"
        );
    }

    /// One step at `now`: both decisions, then the TTL stretch. `Err` when a call
    /// failed (the message says which).
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
        let stretched = self.stretch().await?;
        // An admission (by Redis) writes every key: each must still be there.
        let lost_state = redis.is_allowed() && stretched.contains(&0);
        self.lost_state |= lost_state;
        Ok(Pair {
            memory,
            redis,
            lost_state,
        })
    }

    /// Stretches the subject's keys' TTLs (see the module's doc): whether each was
    /// there (1) or not (0).
    async fn stretch(&mut self) -> Result<Vec<i64>, String> {
        let mut stretch = redis::pipe();
        for key in &self.keys {
            stretch.cmd("PEXPIRE").arg(key).arg(600_000);
        }
        stretch
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("PEXPIRE failed: {e}"))
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
        let lost_before = self.lost_state;
        let pair = match self.step(now, cost).await {
            Ok(pair) => pair,
            Err(e) => panic!("{what}: {e}\n{}", server.log_tail()),
        };
        self.compare(lost_before, &pair.redis, &pair.memory, what);
        pair.memory
    }

    /// An admin operation at `now` on both stores: the same answer, and (checked by
    /// the steps that follow) the same state.
    pub async fn admin(&mut self, now: u64, op: Admin, what: &str, server: &RedisServer) {
        let lost_before = self.lost_state;
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
                // A charge writes every key: each must be there.
                match self.stretch().await {
                    Ok(stretched) if stretched.contains(&0) => self.lost_state = true,
                    Ok(_) => {}
                    Err(e) => panic!("{what}: {e}"),
                }
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
        self.compare(lost_before, &redis, &memory, &format!("{what}: {op:?}"));
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
