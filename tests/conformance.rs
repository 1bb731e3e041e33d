//! One truth per algorithm: the memory store (the Rust model) and the Redis store (the
//! Lua scripts) make identical decisions on the same traces, on a shared fake clock,
//! with shadow policies among the checked ones and peeks, refunds and resets between
//! the checks (each compared too).
//!
//! Redis counts key TTLs in real time, not on the fake clock, so after each step the
//! runner stretches the trace's keys' TTLs: state then disappears only as the fake
//! clock says (the memory store drops it; Redis keeps stale state, which every
//! algorithm reads as unused). TTL values themselves are checked in redis_store.rs.

mod support;

use std::time::Duration;

use deadpool_redis::redis;
use redlimit::clock::FakeClock;
use redlimit::{Decision, Limiter, MemoryStore, Policy, RedisStore, Store, Subject};
use support::traces::{Spec, TRACES};
use support::RedisServer;

/// An admin operation run side by side between checks.
#[derive(Debug, Clone, Copy)]
enum Admin {
    Peek(u32),
    Refund(u32),
    Reset,
}

fn limiter<S: Store>(store: S, policies: &[Policy]) -> Limiter<S> {
    let mut policies = policies.iter().cloned();
    let first = policies.next().expect("a trace has at least one policy");
    policies.fold(Limiter::new(store, first), Limiter::policy)
}

/// Runs the memory and Redis stores side by side over `steps` of (time, cost).
struct SideBySide {
    clock: FakeClock,
    memory: Limiter<MemoryStore>,
    redis: Limiter<RedisStore>,
    subject: String,
    keys: Vec<String>,
    conn: redis::aio::MultiplexedConnection,
}

impl SideBySide {
    async fn new(
        server: &RedisServer,
        policies: &[Policy],
        start_ms: u64,
        subject: String,
    ) -> Self {
        let clock = FakeClock::new(start_ms);
        let store = RedisStore::new(server.pool())
            .client_clock(clock.clone())
            .timeout(Duration::from_secs(5));
        let keys = policies
            .iter()
            .map(|p| store.key(&Subject::new(&subject), p))
            .collect();
        Self {
            memory: limiter(MemoryStore::with_clock(clock.clone()), policies),
            redis: limiter(store, policies),
            clock,
            subject,
            keys,
            conn: server.conn().await,
        }
    }

    /// An admin operation at `now` on both stores: the same answer, and (checked by
    /// the steps that follow) the same state.
    async fn admin(&mut self, now: u64, op: Admin, what: &str, server: &RedisServer) {
        self.clock.set_ms(now);
        let subject = self.subject.as_str();
        let (memory, redis) = match op {
            Admin::Peek(cost) => (
                self.memory.peek(subject, cost).await.map(Some),
                self.redis.peek(subject, cost).await.map(Some),
            ),
            Admin::Refund(cost) => (
                self.memory.refund(subject, cost).await.map(Some),
                self.redis.refund(subject, cost).await.map(Some),
            ),
            Admin::Reset => (
                self.memory.reset(subject).await.map(|()| None),
                self.redis.reset(subject).await.map(|()| None),
            ),
        };
        let memory = memory.unwrap();
        let redis = match redis {
            Ok(d) => d,
            Err(e) => panic!("{what}: Redis failed {op:?}: {e}\n{}", server.log_tail()),
        };
        assert_eq!(
            redis, memory,
            "{what}: {op:?}: Redis (left) and memory (right) differ"
        );
    }

    /// One step at `now`: both decisions, which must be identical.
    async fn step(&mut self, now: u64, cost: u32, what: &str, server: &RedisServer) -> Decision {
        self.clock.set_ms(now);
        let memory = self
            .memory
            .check(self.subject.as_str(), cost)
            .await
            .unwrap();
        let redis = match self.redis.check(self.subject.as_str(), cost).await {
            Ok(d) => d,
            Err(e) => panic!("{what}: Redis failed: {e}\n{}", server.log_tail()),
        };
        assert_eq!(
            redis, memory,
            "{what}: Redis (left) and memory (right) differ"
        );
        let mut stretch = redis::pipe();
        for key in &self.keys {
            stretch.cmd("PEXPIRE").arg(key).arg(600_000).ignore();
        }
        stretch
            .query_async::<()>(&mut self.conn)
            .await
            .expect("PEXPIRE failed");
        memory
    }
}

#[tokio::test]
async fn memory_and_redis_match_every_hand_written_trace() {
    let server = RedisServer::start();
    for (t, trace) in TRACES.iter().enumerate() {
        let policies = trace.built_policies();
        let mut run =
            SideBySide::new(&server, &policies, trace.start_ms, format!("trace-{t}")).await;
        for (i, (&(_, cost, expected), now)) in trace.steps.iter().zip(trace.times()).enumerate() {
            let what = format!("{}: step {i} at {now} ms, cost {cost}", trace.name);
            if let Some(back) = trace.refund_before(i) {
                run.admin(now, Admin::Refund(back), &what, &server).await;
            }
            let decision = run.step(now, cost, &what, &server).await;
            assert_eq!(decision.is_allowed(), expected, "{what}: {decision:?}");
            assert_eq!(
                decision.would_deny(),
                trace.would_deny.contains(&i),
                "{what}: {decision:?}"
            );
        }
    }
    server.assert_every_key_expires().await;
}

/// A small deterministic generator (64-bit LCG), so failures replay exactly.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[tokio::test]
async fn memory_and_redis_match_on_generated_traces() {
    let server = RedisServer::start();
    let sets: &[&[Spec]] = &[
        &[Spec::Fixed("fw", 7, 1_000)],
        &[Spec::Sliding("sw", 9, 1_000)],
        &[Spec::Sliding("sw", 3, 700)],
        &[Spec::Bucket("tb", 6, 3, 1_000)],
        &[Spec::Bucket("tb", 2, 1, 300)],
        &[Spec::Log("sl", 5, 1_000)],
        &[Spec::Log("sl", 1, 250)],
        &[Spec::Fixed("a", 5, 500), Spec::Log("b", 8, 2_000)],
        &[
            Spec::Bucket("a", 4, 4, 1_000),
            Spec::Sliding("b", 10, 3_000),
            Spec::Log("c", 6, 1_500),
            Spec::Fixed("d", 12, 5_000),
        ],
        &[
            Spec::Fixed("a", 4, 1_000),
            Spec::Shadow(&Spec::Sliding("b", 3, 1_000)),
        ],
        &[
            Spec::Shadow(&Spec::Log("a", 3, 800)),
            Spec::Bucket("b", 5, 2, 1_000),
            Spec::Shadow(&Spec::Bucket("c", 2, 1, 500)),
        ],
        &[Spec::Shadow(&Spec::Fixed("a", 3, 700))],
    ];
    let mut rng = Lcg(0x5eed_2026);
    let mut admitted = 0;
    let mut denied = 0;
    let mut admin_ops = 0;
    let mut shadow_denials = 0;
    for (s, specs) in sets.iter().enumerate() {
        let policies: Vec<Policy> = specs.iter().map(|p| p.policy()).collect();
        let max_cost = policies.iter().map(|p| p.max_cost()).min().unwrap_or(1);
        let window = policies
            .iter()
            .map(|p| p.window_ms())
            .max()
            .unwrap_or(1_000);
        let mut now = 1_000_000 + rng.below(10_000);
        let mut run = SideBySide::new(&server, &policies, now, format!("generated-{s}")).await;
        for i in 0..300 {
            now = match rng.below(20) {
                0..=9 => now + rng.below(window / 10),
                10..=14 => now,
                15..=17 => now + rng.below(2 * window),
                // The clock goes back, up to a window.
                _ => now.saturating_sub(rng.below(window)),
            };
            let cost = if rng.below(4) == 0 {
                1 + rng.below(max_cost)
            } else {
                1
            };
            let what = format!("set {s} {specs:?}: step {i} at {now} ms, cost {cost}");
            let cost = u32::try_from(cost).unwrap();
            // Now and then an admin operation first, at the same time.
            let op = match rng.below(20) {
                0 => Some(Admin::Peek(cost)),
                1 | 2 => Some(Admin::Refund(cost)),
                3 if rng.below(4) == 0 => Some(Admin::Reset),
                _ => None,
            };
            if let Some(op) = op {
                run.admin(now, op, &what, &server).await;
                admin_ops += 1;
            }
            let decision = run.step(now, cost, &what, &server).await;
            if decision.would_deny() {
                shadow_denials += 1;
            }
            if decision.is_allowed() {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
    }
    // The traces must exercise both answers, or they prove little.
    assert!(
        admitted > 500 && denied > 500 && admin_ops > 300 && shadow_denials > 100,
        "{admitted} admitted, {denied} denied, {admin_ops} admin operations, \
         {shadow_denials} shadow denials"
    );
    server.assert_every_key_expires().await;
}
