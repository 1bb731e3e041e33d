//! A flood from one subject beside everyone else's traffic: what the block cache keeps
//! for the others (the target: at least 0.9x their throughput without the flood).

use crate::helpers::*;
use crate::support::RedisServer;
use redlimit::Limiter;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::task::JoinSet;

/// Everyone else: 64 tasks over 10,000 subjects, as many calls as they get answered.
const OTHERS: usize = 64;
const SUBJECTS: usize = 10_000;
/// The flood: 64 tasks, each sending a burst of the one subject's calls every
/// millisecond, sized so that the flood is a multiple of everyone else's rate.
const FLOODERS: usize = 64;
const TURN: Duration = Duration::from_millis(500);
const ROUNDS: u32 = 5;
/// 100 per minute: the others stay far below it, the flooder is over it from the
/// start of each turn.
const LIMIT: u32 = 100;

#[derive(Clone, Copy, PartialEq)]
struct Variant {
    /// The flood's rate as a multiple of everyone else's rate without it (0: none).
    times: u32,
    block_cache: bool,
}

impl Variant {
    fn label(self) -> String {
        match (self.times, self.block_cache) {
            (0, _) => "no flood".to_owned(),
            (n, true) => format!("flood of {n}x everyone else's rate, block cache on"),
            (n, false) => format!("flood of {n}x everyone else's rate, no block cache"),
        }
    }
}

struct Turn {
    others: u64,
    flood: u64,
    redis_calls: u64,
    time: Duration,
}

/// The store's calls Redis has run: `FCALL`, or `EVALSHA` and `EVAL` on a server
/// without functions.
async fn store_calls(conn: &mut MultiplexedConnection) -> u64 {
    let calls = crate::support::command_calls(conn).await;
    ["fcall", "evalsha", "eval"]
        .iter()
        .filter_map(|c| calls.get(*c))
        .sum()
}

/// One turn of `variant`; `burst` is each flood task's calls per millisecond.
async fn turn(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    variant: Variant,
    burst: u64,
) -> Turn {
    flushall(conn).await;
    let policy = Policy::sliding_window("flood", LIMIT, Duration::from_secs(60)).expect("policy");
    let store = RedisStore::new(server.pool()).timeout(Duration::from_secs(5));
    let mut limiter = Limiter::builder(store).policy(policy);
    if variant.block_cache {
        limiter = limiter.block_cache(10_000);
    }
    let limiter = Arc::new(limiter.build().expect("one policy"));
    let flooder = Subject::new("flooder");
    // Over the limit before the turn starts.
    for _ in 0..=LIMIT {
        limiter
            .check(flooder.clone(), 1)
            .await
            .expect("fill the flooder");
    }
    let done = Arc::new(AtomicBool::new(false));
    let (others, flood) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let before = store_calls(conn).await;
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for t in 0..OTHERS {
        let (limiter, done, others) =
            (Arc::clone(&limiter), Arc::clone(&done), Arc::clone(&others));
        tasks.spawn(async move {
            let mut i = t * (SUBJECTS / OTHERS);
            while !done.load(Ordering::Relaxed) {
                let d = limiter
                    .check(subject(i % SUBJECTS), 1)
                    .await
                    .expect("check");
                assert!(d.is_allowed(), "everyone else stays under the limit");
                i += 1;
                others.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    if variant.times > 0 {
        for _ in 0..FLOODERS {
            let (limiter, done, flood, flooder) = (
                Arc::clone(&limiter),
                Arc::clone(&done),
                Arc::clone(&flood),
                flooder.clone(),
            );
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                while !done.load(Ordering::Relaxed) {
                    tick.tick().await;
                    for _ in 0..burst {
                        let d = limiter.check(flooder.clone(), 1).await.expect("check");
                        assert!(!d.is_allowed(), "the flooder is over its limit");
                        flood.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
    tokio::time::sleep(TURN).await;
    done.store(true, Ordering::Relaxed);
    while let Some(finished) = tasks.join_next().await {
        finished.expect("task");
    }
    let time = start.elapsed();
    let redis_calls = store_calls(conn).await - before;
    let others = others.load(Ordering::Relaxed);
    Turn {
        others,
        flood: flood.load(Ordering::Relaxed),
        // The flood's share: every call of the others is one store call.
        redis_calls: redis_calls.saturating_sub(others),
        time,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn rate(n: u64, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64()
}

pub(crate) async fn run(server: &RedisServer) {
    let mut conn = connect(server).await;
    let quiet = Variant {
        times: 0,
        block_cache: true,
    };
    // Everyone else's rate without a flood sizes the floods.
    let calibration = turn(server, &mut conn, quiet, 0).await;
    let others_rate = rate(calibration.others, calibration.time);
    let variants = [
        quiet,
        Variant {
            times: 1,
            block_cache: true,
        },
        Variant {
            times: 10,
            block_cache: true,
        },
        Variant {
            times: 1,
            block_cache: false,
        },
    ];
    let burst =
        |v: &Variant| (f64::from(v.times) * others_rate / 1_000.0 / FLOODERS as f64).ceil() as u64;
    let mut turns: Vec<Vec<Turn>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        // In rotation, starting from a different variant each round.
        for k in 0..variants.len() {
            let v = (k + round as usize) % variants.len();
            let t = turn(server, &mut conn, variants[v], burst(&variants[v])).await;
            turns[v].push(t);
        }
        eprintln!("flood: round {} of {ROUNDS} done", round + 1);
    }
    let quiet_rates: Vec<f64> = turns[0].iter().map(|t| rate(t.others, t.time)).collect();
    println!("\n## Flood from one subject\n");
    println!(
        "{OTHERS} tasks over {SUBJECTS} subjects (everyone else) on one `RedisStore`, sliding window {LIMIT} per minute, as many calls as they get answered. A flood: {FLOODERS} more tasks, each sending a burst of the one over-limit subject's calls every millisecond, sized from everyone else's rate in a first turn without flood ({} calls/s). {ROUNDS} turns of {} ms per variant, in rotation; rates are medians of turns, a ratio the median of each round's ratio to that round's turn without flood. The flood's calls reaching Redis: `INFO commandstats` calls of the store's function (`FCALL`) in the turn minus those of everyone else.\n",
        thousands(others_rate),
        TURN.as_millis()
    );
    println!("| variant | everyone else, calls/s | vs no flood | flood, calls/s | flood's calls reaching Redis, per s |");
    println!("|---|---|---|---|---|");
    let mut targets = Vec::new();
    for (v, variant) in variants.iter().enumerate() {
        let others = median(turns[v].iter().map(|t| rate(t.others, t.time)).collect());
        let ratio = median(
            turns[v]
                .iter()
                .zip(&quiet_rates)
                .map(|(t, q)| rate(t.others, t.time) / q)
                .collect(),
        );
        let flood = median(turns[v].iter().map(|t| rate(t.flood, t.time)).collect());
        let redis = median(
            turns[v]
                .iter()
                .map(|t| rate(t.redis_calls, t.time))
                .collect(),
        );
        if variant.times > 0 && variant.block_cache {
            targets.push((variant.times, ratio));
        }
        println!(
            "| {} | {} | {ratio:.3}x | {} | {} |",
            variant.label(),
            thousands(others),
            thousands(flood),
            thousands(redis)
        );
    }
    println!("\n### Target\n");
    for (times, ratio) in targets {
        println!(
            "- everyone else under a flood of {times}x their rate, block cache on: {ratio:.3}x their rate without it (target >= 0.9x: {})",
            met(ratio >= 0.9)
        );
    }
}
