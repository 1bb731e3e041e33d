//! Redis memory per subject for each algorithm beside the common layouts, and an
//! in-flight policy's state (one holder with one slot: the state of a subject with
//! one request running, on one instance) beside our fixed window's.

use crate::helpers::*;
use crate::support::RedisServer;
use redlimit::clock::FakeClock;
use redlimit::internals::{LimiterInternals, RedisStoreInternals};
use redlimit::Limiter;
use std::sync::Arc;
use tokio::task::JoinSet;

/// 2026-01-01T00:00:00Z: realistic numbers in the states, aligned to every window.
const START_MS: u64 = 1_767_225_600_000;
const SUBJECTS: usize = 100_000;
const LOG_SUBJECTS: usize = 10_000;
/// The common sorted sets: 2 000 subjects of 1 000 entries. The figure per subject
/// does not depend on the count (a key costs under 100 B of the 96 KB), and
/// 10 000 took 90 s to fill on a 2-core machine: Redis inserts each entry.
const COMMON_LOG_SUBJECTS: usize = 2_000;
const WORKERS: usize = 32;
/// `MB` as the published figure counts it (its 53.4 MB is 56 B x 1 million in MiB).
const MB: f64 = 1_048_576.0;

async fn used_memory(conn: &mut MultiplexedConnection) -> i64 {
    info_field(&info(conn, "memory").await, "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("INFO memory has used_memory")
}

async fn dbsize(conn: &mut MultiplexedConnection) -> usize {
    redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .expect("DBSIZE")
}

/// Bytes and keys per subject after each pass (pass k one window after pass k-1).
#[derive(Debug, Clone, Copy)]
struct Figure {
    bytes: f64,
    keys: f64,
}

/// Which layout is measured.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// One limiter of every policy.
    Ours,
    /// A limiter per policy: the store's states one key a policy, as it kept a set's
    /// before a set's states shared a key (for comparison, not a reference).
    OursApart,
    /// The common layout of each policy, a key a policy.
    Common,
}

/// `subjects` subjects each spend `cost` under `policies`, `passes` times one window
/// (the first policy's) apart, on a client clock starting at a window boundary: every
/// key lives at least a window in real time, so none expires while the figures are
/// taken.
async fn measure(
    server: &RedisServer,
    layout: Layout,
    policies: &[Policy],
    cost: u64,
    subjects: usize,
    passes: u64,
) -> Vec<Figure> {
    let mut conn = connect(server).await;
    let clock = FakeClock::new(START_MS);
    let store = RedisStore::new(server.pool())
        .timeout(Duration::from_secs(30))
        .client_clock(clock.clone());
    let limiter = policies
        .iter()
        .cloned()
        .fold(Limiter::builder(store.clone()), |b, p| b.policy(p))
        .build()
        .expect("limiter");
    let apart: Arc<Vec<Limiter<RedisStore>>> = Arc::new(
        policies
            .iter()
            .map(|p| Limiter::new(store.clone(), p.clone()))
            .collect(),
    );
    let policy = &policies[0];
    let common_conn = connect(server).await;
    // Open the store's connection before the baseline.
    limiter.check("warm-up", 1).await.expect("warm-up");
    flushall(&mut conn).await;
    let before = used_memory(&mut conn).await;
    let mut figures = Vec::new();
    let next_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for pass in 0..passes {
        let now = START_MS + pass * policy.window_ms();
        clock.set_ms(now);
        let mut tasks = JoinSet::new();
        for w in 0..WORKERS {
            let limiter = limiter.clone();
            let apart = Arc::clone(&apart);
            let mut common_conn = common_conn.clone();
            let policies = policies.to_vec();
            let store = store.clone();
            let next_id = Arc::clone(&next_id);
            tasks.spawn(async move {
                for i in (w..subjects).step_by(WORKERS) {
                    let cost32 = u32::try_from(cost).expect("small cost");
                    let allowed = match layout {
                        Layout::Ours => limiter
                            .check(subject(i), cost32)
                            .await
                            .expect("store call")
                            .is_allowed(),
                        Layout::OursApart => {
                            let mut all = true;
                            for one in apart.iter() {
                                let decision = one.check(subject(i), cost32).await;
                                all &= decision.expect("store call").is_allowed();
                            }
                            all
                        }
                        Layout::Common => {
                            let mut all = true;
                            for policy in &policies {
                                let id = next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                // A key a policy: the store's own name beside it when
                                // the store keeps the set in one key.
                                let mut key = store.key(&subject(i), limiter.policy_set(), policy);
                                if policies.len() > 1 {
                                    key.push_str(policy.name());
                                }
                                let cmd = reference::command(
                                    policy.algorithm(),
                                    &key,
                                    &now.to_string(),
                                    cost,
                                    policy,
                                    id,
                                );
                                let reply: Value = cmd
                                    .query_async(&mut common_conn)
                                    .await
                                    .expect("common call");
                                all &= admitted(&reply);
                            }
                            all
                        }
                    };
                    assert!(allowed, "every fill call is admitted");
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("fill task");
        }
        let after = used_memory(&mut conn).await;
        let keys = dbsize(&mut conn).await;
        figures.push(Figure {
            bytes: (after - before) as f64 / subjects as f64,
            keys: keys as f64 / subjects as f64,
        });
    }
    flushall(&mut conn).await;
    figures
}

struct Row {
    label: &'static str,
    subjects: usize,
    common_subjects: usize,
    ours: Figure,
    /// `None` where no common layout is measured (in flight).
    common: Option<Figure>,
    common_layout: &'static str,
}

pub(crate) async fn run(server: &RedisServer) {
    let started = Instant::now();
    let minute = Duration::from_secs(60);
    let fixed = Policy::fixed_window("api", 1_000, minute).expect("policy");
    let sliding = Policy::sliding_window("api", 1_000, minute).expect("policy");
    let bucket = Policy::token_bucket("api", 1_000, 1_000, minute).expect("policy");
    let log = Policy::sliding_log("api", 1_000, minute).expect("policy");
    let in_flight = Policy::in_flight("api", 1_000, minute).expect("policy");

    let mut rows = Vec::new();
    for (policy, label_one, label_two) in [
        (
            &fixed,
            "fixed window, one window",
            "fixed window, two consecutive windows",
        ),
        (
            &sliding,
            "sliding window, one window",
            "sliding window, two consecutive windows",
        ),
    ] {
        let ours = measure(
            server,
            Layout::Ours,
            std::slice::from_ref(policy),
            1,
            SUBJECTS,
            2,
        )
        .await;
        let common = measure(
            server,
            Layout::Common,
            std::slice::from_ref(policy),
            1,
            SUBJECTS,
            2,
        )
        .await;
        let layout = reference::name(policy.algorithm());
        rows.push(Row {
            label: label_one,
            subjects: SUBJECTS,
            common_subjects: SUBJECTS,
            ours: ours[0],
            common: Some(common[0]),
            common_layout: layout,
        });
        rows.push(Row {
            label: label_two,
            subjects: SUBJECTS,
            common_subjects: SUBJECTS,
            ours: ours[1],
            common: Some(common[1]),
            common_layout: layout,
        });
        eprintln!(
            "memory: {label_two} done at {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    // An emptied bucket (cost 1000): its state lives the minute it takes to refill.
    let ours = measure(
        server,
        Layout::Ours,
        std::slice::from_ref(&bucket),
        1_000,
        SUBJECTS,
        1,
    )
    .await;
    let common = measure(
        server,
        Layout::Common,
        std::slice::from_ref(&bucket),
        1_000,
        SUBJECTS,
        1,
    )
    .await;
    rows.push(Row {
        label: "token bucket, emptied (cost 1000)",
        subjects: SUBJECTS,
        common_subjects: SUBJECTS,
        ours: ours[0],
        common: Some(common[0]),
        common_layout: reference::name(Algorithm::TokenBucket),
    });
    eprintln!(
        "memory: token bucket done at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // A full log: 1 000 admitted requests in the window.
    let ours = measure(
        server,
        Layout::Ours,
        std::slice::from_ref(&log),
        1_000,
        LOG_SUBJECTS,
        1,
    )
    .await;
    eprintln!(
        "memory: our sliding log done at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let common = measure(
        server,
        Layout::Common,
        std::slice::from_ref(&log),
        1_000,
        COMMON_LOG_SUBJECTS,
        1,
    )
    .await;
    rows.push(Row {
        label: "sliding log, full (1000 admitted in the window)",
        subjects: LOG_SUBJECTS,
        common_subjects: COMMON_LOG_SUBJECTS,
        ours: ours[0],
        common: Some(common[0]),
        common_layout: reference::name(Algorithm::SlidingLog),
    });
    eprintln!(
        "memory: sliding log done at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // In flight: each subject checked once and its slot left held (no `Permit` takes
    // it, no release comes), so its state holds one holder (this limiter) with one
    // slot until the slot lifetime (a minute) ends.
    let ours = measure(
        server,
        Layout::Ours,
        std::slice::from_ref(&in_flight),
        1,
        SUBJECTS,
        1,
    )
    .await;
    rows.push(Row {
        label: "in-flight, 1 holder with 1 slot",
        subjects: SUBJECTS,
        common_subjects: 0,
        ours: ours[0],
        common: None,
        common_layout: "—",
    });
    eprintln!(
        "memory: in flight done at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // Two policies of one subject, their states in one key; beside them the same two
    // policies a limiter each (a key a policy, as the store kept a set before), and the
    // common layouts, a key a policy. A cost of 1000, as the bucket's row: a bucket
    // state lives as long as it takes to refill, 60 ms after a cost of 1.
    let pair = [
        sliding.clone(),
        Policy::token_bucket("burst", 1_000, 1_000, minute).expect("policy"),
    ];
    let ours = measure(server, Layout::Ours, &pair, 1_000, SUBJECTS, 1).await;
    let apart = measure(server, Layout::OursApart, &pair, 1_000, SUBJECTS, 1).await;
    let common = measure(server, Layout::Common, &pair, 1_000, SUBJECTS, 1).await;
    rows.push(Row {
        label: "sliding window + token bucket, both full (cost 1000)",
        subjects: SUBJECTS,
        common_subjects: SUBJECTS,
        ours: ours[0],
        common: Some(common[0]),
        common_layout: "common two keys + common hash",
    });
    eprintln!(
        "memory: two policies done at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    report(&rows, apart[0]);
}

/// `apart`: the two-policy row's policies, a limiter each.
fn report(rows: &[Row], apart: Figure) {
    println!();
    println!("## Redis memory per subject");
    println!();
    println!(
        "`used_memory` delta / subjects, one policy per subject at 1000 per minute, `FLUSHALL` between \
         measurements; keys named `rl:{{<12-digit subject>}}:<set tag>:api:<code>` for both layouts (the common's \
         window scripts append the window number). In flight (1000 slots of a minute): one check per subject, its slot never released, \
         beside no common layout (the target: no more than our fixed window)."
    );
    println!();
    println!("| state | subjects | redlimit B/subject | keys/subject | common layout | subjects | B/subject | keys/subject | redlimit / common's |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let common = match r.common {
            Some(c) => format!(
                "{} | {:.1} | {:.0} | {:.2}x",
                thousands(r.common_subjects as f64),
                c.bytes,
                c.keys,
                r.ours.bytes / c.bytes
            ),
            None => "— | — | — | —".to_owned(),
        };
        println!(
            "| {} | {} | {:.1} | {:.0} | {} | {common} |",
            r.label,
            thousands(r.subjects as f64),
            r.ours.bytes,
            r.ours.keys,
            r.common_layout,
        );
    }
    let find = |label: &str| {
        rows.iter()
            .find(|r| r.label.starts_with(label))
            .expect("row")
    };
    let fixed = find("fixed window, one").ours.bytes;
    let sliding = find("sliding window, one").ours.bytes;
    let bucket = find("token bucket").ours.bytes;
    let log = find("sliding log").ours.bytes;
    let in_flight = find("in-flight").ours.bytes;
    let pair = find("sliding window + token bucket").ours;
    println!();
    println!("### Targets");
    println!();
    // `used_memory` moves by a few bytes per 100 000 keys between identical runs.
    let jitter = 1.0;
    println!(
        "- two policies in one key {:.1} B ({:.2} keys a subject) < the same two a limiter each {:.1} B ({:.2} keys, the layout before one key a set): {} ({:.2}x)",
        pair.bytes,
        pair.keys,
        apart.bytes,
        apart.keys,
        met(pair.bytes < apart.bytes),
        pair.bytes / apart.bytes
    );
    println!(
        "- token bucket {bucket:.1} B <= fixed window {fixed:.1} B (within {jitter} B of jitter): {}",
        met(bucket <= fixed + jitter)
    );
    println!(
        "- sliding window {sliding:.1} B <= fixed window {fixed:.1} B (within {jitter} B of jitter): {}",
        met(sliding <= fixed + jitter)
    );
    println!(
        "- sliding log at limit 1000 {} B < 8,500 B: {} ({:.1} B per admitted request; the common sorted set here: {:.1} B)",
        thousands(log),
        met(log < 8_500.0),
        log / 1_000.0,
        find("sliding log").common.map_or(f64::NAN, |c| c.bytes) / 1_000.0
    );
    println!(
        "- in-flight, 1 holder with 1 slot {in_flight:.1} B <= fixed window {fixed:.1} B (within {jitter} B of jitter): {}",
        met(in_flight <= fixed + jitter)
    );

    println!();
    println!("## 1 million users at 1,000 per minute");
    println!();
    println!("The per-subject figures above x 1,000,000, in MB as the common counts them (MiB).");
    println!();
    println!("| algorithm | the common document | common layout, measured here | redlimit, measured here | redlimit / common layout |");
    println!("|---|---|---|---|---|");
    let mb = |b: f64| {
        let v = b * 1e6 / MB;
        if v >= 1_000.0 {
            thousands(v)
        } else {
            format!("{v:.1}")
        }
    };
    for (label, row, doc) in [
        ("fixed window (one window)", "fixed window, one", "53.4"),
        (
            "fixed window (steady: two windows)",
            "fixed window, two",
            "—",
        ),
        ("sliding window (one window)", "sliding window, one", "—"),
        (
            "sliding window (steady: two windows)",
            "sliding window, two",
            "—",
        ),
        ("token bucket", "token bucket", "68.7"),
        ("sliding log (full)", "sliding log", "87,913.5"),
    ] {
        let r = find(row);
        let common = r.common.expect("a common layout");
        println!(
            "| {label} | {doc} | {} | {} | {:.2}x |",
            mb(common.bytes),
            mb(r.ours.bytes),
            r.ours.bytes / common.bytes
        );
    }
}
