//! One truth per algorithm: the memory store (the Rust model) and the Redis store (the
//! Lua scripts) make identical decisions on the same traces, on a shared fake clock,
//! with shadow policies among the checked ones and peeks, refunds and resets between
//! the checks (each compared too).
//!
//! Redis counts key TTLs in real time, not on the fake clock: the runner
//! (`support::props::SideBySide`) stretches them after each step, so state disappears
//! only as the fake clock says, and puts back a step's state when a key expired in
//! real time before the stretch (a TTL of a millisecond on a busy machine), so no run
//! depends on the machine's load. TTL values themselves are checked in redis_store.rs.
//! Random policies and traces are in properties.rs.

use crate::support;

use redlimit::internals::traces::{Spec, TRACES};
use redlimit::Policy;
use support::props::{Admin, Lcg, SideBySide};
use support::RedisServer;

#[tokio::test]
async fn memory_and_redis_match_every_hand_written_trace() {
    let server = RedisServer::start();
    for (t, trace) in TRACES.iter().enumerate() {
        let policies = trace.built_policies();
        let subject = format!("trace-{t}");
        let mut run = SideBySide::new(&server, &policies, trace.start_ms, subject).await;
        run_trace(&mut run, trace, &server).await;
    }
    server.assert_every_key_expires().await;
}

/// The runner survives what a busy machine does to it: a check at the last
/// millisecond of a fixed window writes a TTL of 1 ms, and the runner, stalled 20 ms
/// before its stretch, finds the key gone. It puts the state back, so the checks after
/// it, still in that window, decide in Redis as in memory (they would find a fresh
/// window: 3 admitted of 2). The control, at the first millisecond of the window (a
/// TTL of 999 ms) with the same stall, has nothing to put back.
#[tokio::test]
async fn a_step_s_state_lost_to_a_real_time_expiry_is_put_back() {
    let server = RedisServer::start();
    let policies = [Policy::fixed_window("fw", 2, std::time::Duration::from_secs(1)).unwrap()];
    for (now, lost) in [(1_000_999, true), (1_000_000, false)] {
        let mut run = SideBySide::new(&server, &policies, now, format!("stalled-{now}")).await;
        run.stall_before_stretch(std::time::Duration::from_millis(20));
        let mut admitted = 0;
        let mut restored = Vec::new();
        for i in 0..3 {
            let pair = match run.step(now, 1).await {
                Ok(pair) => pair,
                Err(e) => panic!("step {i}: {e}\n{}", server.log_tail()),
            };
            assert_eq!(
                pair.redis, pair.memory,
                "at {now}, step {i}: Redis (left) and memory (right) differ"
            );
            admitted += u32::from(pair.memory.is_allowed());
            restored.push(pair.restored);
        }
        assert_eq!(admitted, 2, "at {now}: the limit of the window");
        // Each admission wrote its TTL; the denial wrote nothing.
        assert_eq!(restored, [lost, lost, false], "at {now}");
        assert_eq!(run.restored(), if lost { 2 } else { 0 }, "at {now}");
    }
    server.assert_every_key_expires().await;
}

/// One hand-written trace on both stores, the memory store's answers checked against
/// the trace.
async fn run_trace(
    run: &mut SideBySide,
    trace: &redlimit::internals::traces::Trace,
    server: &RedisServer,
) {
    for (i, (&(_, cost, expected), now)) in trace.steps.iter().zip(trace.times()).enumerate() {
        let what = format!("{}: step {i} at {now} ms, cost {cost}", trace.name);
        if let Some(back) = trace.refund_before(i) {
            run.admin(now, Admin::Refund(back), &what, server).await;
        }
        let decision = run.step_checked(now, cost, &what, server).await;
        assert_eq!(decision.is_allowed(), expected, "{what}: {decision:?}");
        assert_eq!(
            decision.would_deny(),
            trace.would_deny.contains(&i),
            "{what}: {decision:?}"
        );
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
    let mut restored = 0;
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
            let decision = run.step_checked(now, cost, &what, &server).await;
            if decision.would_deny() {
                shadow_denials += 1;
            }
            if decision.is_allowed() {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
        restored += run.restored();
    }
    eprintln!("{restored} steps had state lost to a real-time expiry put back");
    // The traces must exercise both answers, or they prove little.
    assert!(
        admitted > 500 && denied > 500 && admin_ops > 300 && shadow_denials > 100,
        "{admitted} admitted, {denied} denied, {admin_ops} admin operations, \
         {shadow_denials} shadow denials"
    );
    server.assert_every_key_expires().await;
}

/// Calendar quotas: the Lua, given the period's end the store computed, decides as the
/// model on random traces that cross days, weeks and months (the changes of clocks of
/// March and November 2026 among them), go back up to a day, and now and then jump a
/// week back, past the stored period's bound (foreign state, read as fresh).
#[tokio::test]
async fn memory_and_redis_match_on_calendar_quotas() {
    use redlimit::Period;
    let server = RedisServer::start();
    let quota = |name: &str, limit, period, zone: &str, anchor| {
        Policy::calendar(name, limit, period, zone, anchor).unwrap()
    };
    let sets: Vec<Vec<Policy>> = vec![
        vec![quota("day", 9, Period::Day, "America/New_York", 1)],
        vec![quota("week", 25, Period::Week, "Europe/Paris", 7)],
        vec![quota("month", 60, Period::Month, "Australia/Lord_Howe", 3)],
        vec![
            Policy::fixed_window("fw", 6, std::time::Duration::from_secs(3_600)).unwrap(),
            quota("day", 12, Period::Day, "Asia/Kolkata", 1),
        ],
        vec![
            quota("day", 8, Period::Day, "America/New_York", 1),
            quota("week", 20, Period::Week, "America/New_York", 1).shadow(),
        ],
    ];
    // 2026-03-07T12:00Z and 2026-10-28T12:00Z: days before clocks change.
    let starts = [1_772_884_800_000u64, 1_793_188_800_000];
    let mut rng = Lcg(0xca1e_2026);
    let (mut admitted, mut denied, mut admin_ops) = (0, 0, 0);
    for (s, policies) in sets.iter().enumerate() {
        for (k, start) in starts.into_iter().enumerate() {
            let hour = 3_600_000;
            let mut now = start + rng.below(hour);
            let subject = format!("calendar-{s}-{k}");
            let mut run = SideBySide::new(&server, policies, now, subject).await;
            for i in 0..200 {
                now = match rng.below(40) {
                    0..=19 => now + rng.below(2 * hour),
                    20..=29 => now,
                    30..=35 => now + rng.below(3 * 24 * hour),
                    36..=38 => now.saturating_sub(rng.below(24 * hour)),
                    // Past the bound of a clock that went back: foreign state.
                    _ => now.saturating_sub(6 * 24 * hour),
                };
                let cost = if rng.below(4) == 0 {
                    1 + rng.below(5)
                } else {
                    1
                };
                let cost = u32::try_from(cost).unwrap();
                let what = format!("set {s} from {start}: step {i} at {now} ms, cost {cost}");
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
                if run
                    .step_checked(now, cost, &what, &server)
                    .await
                    .is_allowed()
                {
                    admitted += 1;
                } else {
                    denied += 1;
                }
            }
        }
    }
    assert!(
        admitted > 300 && denied > 300 && admin_ops > 100,
        "{admitted} admitted, {denied} denied, {admin_ops} admin operations"
    );
    server.assert_every_key_expires().await;
}

/// Numbers at the edge of what the constructors accept decide the same in Redis (Lua
/// doubles) as in memory (u64): a window or fill time of ten years, the largest limits
/// and costs, a clock far into this century. Past the edge, the constructors refuse:
/// the token buckets that once admitted 5 of 5 in Redis and 1 of 5 in memory.
#[tokio::test]
async fn memory_and_redis_match_at_the_largest_numbers_the_constructors_accept() {
    use std::time::Duration;
    const MAX_WINDOW: Duration = Policy::MAX_WINDOW;
    let day = Duration::from_secs(86_400);
    for refused in [
        Policy::token_bucket("tb", 100_000, 1, day),
        Policy::token_bucket("tb", 1, 1, day * 365 * 250),
        Policy::token_bucket("tb", u32::MAX, 1, Duration::from_secs(2)),
        Policy::fixed_window("fw", 1, MAX_WINDOW + Duration::from_millis(1)),
        Policy::sliding_log("sl", 1, MAX_WINDOW * 2),
    ] {
        assert!(
            matches!(refused, Err(redlimit::PolicyError::OutOfRange(..))),
            "{refused:?}"
        );
    }
    let server = RedisServer::start();
    let largest = [
        // A fill time of exactly ten years, one token at a time or all at once.
        Policy::token_bucket("tb", 1, 1, MAX_WINDOW).unwrap(),
        Policy::token_bucket("tb", 3_653, 1, day).unwrap(),
        Policy::token_bucket("tb", 3_653 * 86_400, 1, Duration::from_secs(1)).unwrap(),
        Policy::fixed_window("fw", 1, MAX_WINDOW).unwrap(),
        Policy::fixed_window("fw", u32::MAX, Duration::from_secs(2_000)).unwrap(),
        Policy::sliding_window("sw", 1, MAX_WINDOW).unwrap(),
        Policy::sliding_window("sw", u32::MAX, Duration::from_secs(2_000)).unwrap(),
        Policy::sliding_log("sl", 3, MAX_WINDOW).unwrap(),
        Policy::calendar(
            "cq",
            u32::MAX,
            redlimit::Period::Month,
            "Pacific/Auckland",
            28,
        )
        .unwrap(),
    ];
    // 2096: about 3.9e15 µs since the epoch, where a ten-year bucket stores up to
    // five fill times ahead (clock back) well under 2^53 µs.
    for start in [1_800_000_000_000u64, 3_900_000_000_000] {
        for (p, policy) in largest.iter().enumerate() {
            let max = u32::try_from(policy.max_cost()).unwrap_or(u32::MAX);
            let mut run = SideBySide::new(
                &server,
                std::slice::from_ref(policy),
                start,
                format!("edge-{start}-{p}"),
            )
            .await;
            let mut admitted = 0;
            let mut now = start;
            for (i, (advance, cost)) in [
                (0, max),
                (0, 1),
                (1, max),
                (policy.window_ms() / 2, 1),
                (policy.window_ms() / 2, max / 2 + 1),
                (policy.window_ms() * 3, max),
            ]
            .into_iter()
            .enumerate()
            {
                now += advance;
                let what = format!("{policy:?} from {start}: step {i} at {now}, cost {cost}");
                if run
                    .step_checked(now, cost, &what, &server)
                    .await
                    .is_allowed()
                {
                    admitted += 1;
                }
            }
            assert!(
                (2..6).contains(&admitted),
                "{policy:?} from {start}: {admitted} of 6 (the first, the last, never all)"
            );
        }
    }
}
