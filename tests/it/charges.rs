//! Charges (a cost consumed whatever the limit: the debt of a request that cost more
//! than it reserved) decide alike in memory (the Rust model) and in Redis (the Lua),
//! decision by decision, on one fake clock: checks, charges small, past the limit and
//! huge, and refunds, on every algorithm, shadow policies among them.

use crate::support;

use redlimit::internals::traces::Spec;
use redlimit::Policy;
use support::props::{Admin, Lcg, SideBySide};
use support::RedisServer;

/// A charge past the limit denies the next check in both stores, and both admit
/// again at the same moment: a fresh subject charged first (the memory store must make
/// its entry), then checked every few milliseconds until admitted.
#[tokio::test]
async fn a_debt_denies_alike_until_it_is_paid() {
    let server = RedisServer::start();
    let sets: &[&[Spec]] = &[
        &[Spec::Fixed("fw", 5, 1_000)],
        &[Spec::Sliding("sw", 5, 1_000)],
        &[Spec::Bucket("tb", 5, 5, 1_000)],
        &[Spec::Log("sl", 5, 1_000)],
    ];
    for (s, specs) in sets.iter().enumerate() {
        let policies: Vec<Policy> = specs.iter().map(|p| p.policy()).collect();
        for (c, units) in [8, u64::MAX].into_iter().enumerate() {
            let start = 2_000_300;
            let mut run = SideBySide::new(&server, &policies, start, format!("debt-{s}-{c}")).await;
            let what = format!("{specs:?}: a charge of {units}");
            run.admin(start, Admin::Charge(units), &what, &server).await;
            let mut now = start;
            let denied = run.step_checked(now, 1, &what, &server).await;
            assert!(!denied.is_allowed(), "{what}: {denied:?}");
            let promised = start + denied.retry_after().unwrap().as_millis() as u64;
            loop {
                now += 7;
                let what = format!("{what}: at {now}");
                if run.step_checked(now, 1, &what, &server).await.is_allowed() {
                    break;
                }
            }
            // Never before the wait the denial named, at most a step after it.
            assert!(
                (promised..promised + 7).contains(&now),
                "{what}: admitted at {now}, promised {promised}"
            );
        }
    }
    server.assert_every_key_expires().await;
}

#[tokio::test]
async fn memory_and_redis_match_on_traces_with_charges() {
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
        ],
    ];
    let mut rng = Lcg(0xc4a2_6e5d);
    let (mut charges, mut denied_after_charge, mut admitted) = (0, 0, 0);
    let mut restored = 0;
    for (s, specs) in sets.iter().enumerate() {
        let policies: Vec<Policy> = specs.iter().map(|p| p.policy()).collect();
        let max_cost = policies.iter().map(|p| p.max_cost()).min().unwrap_or(1);
        let limit = policies.iter().map(|p| p.limit()).max().unwrap_or(1);
        let window = policies
            .iter()
            .map(|p| p.window_ms())
            .max()
            .unwrap_or(1_000);
        let mut now = 3_000_000 + rng.below(10_000);
        let mut run = SideBySide::new(&server, &policies, now, format!("charges-{s}")).await;
        let mut charged = false;
        for i in 0..300 {
            now = match rng.below(20) {
                0..=9 => now + rng.below(window / 10),
                10..=13 => now,
                14..=17 => now + rng.below(2 * window),
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
            let op = match rng.below(10) {
                // Small, past the limit, huge.
                0 | 1 => Some(Admin::Charge(1 + rng.below(limit))),
                2 => Some(Admin::Charge(limit + rng.below(6 * limit))),
                3 if rng.below(3) == 0 => Some(Admin::Charge(u64::MAX)),
                4 | 5 => Some(Admin::Refund(cost)),
                _ => None,
            };
            if let Some(op) = op {
                run.admin(now, op, &format!("{what}: {op:?}"), &server)
                    .await;
                if let Admin::Charge(_) = op {
                    charges += 1;
                    charged = true;
                }
            }
            let decision = run.step_checked(now, cost, &what, &server).await;
            if decision.is_allowed() {
                admitted += 1;
            } else if charged {
                denied_after_charge += 1;
            }
            charged = false;
        }
        restored += run.restored();
    }
    eprintln!("{restored} steps had state lost to a real-time expiry put back");
    // The traces must charge, be denied for it, and be admitted again.
    assert!(
        charges > 800 && denied_after_charge > 400 && admitted > 500,
        "{charges} charges, {denied_after_charge} denials after one, {admitted} admitted"
    );
    server.assert_every_key_expires().await;
}
