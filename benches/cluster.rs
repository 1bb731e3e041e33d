//! Redis Cluster throughput beside a single node, measured in the same run:
//! `cargo bench -p redlimit-bench --bench cluster`.
//!
//! Starts one `redis-server` and a local cluster of three masters and three replicas
//! (all on loopback, from `tests/it/support`), then drives each through one `RedisStore`
//! with 64 concurrent tasks over 10,000 subjects for a fixed time, and prints decisions
//! per second. On one machine every node shares the same cores, so the cluster shows
//! what the client side sustains across slots, not what three separate machines would.
//!
//! Then one hot subject: four limiters, each with its own cluster store (its
//! own pools and connections, as four instances would have), 16 tasks each sending the
//! one subject as fast as answers come, against a sliding window of 1000 a second;
//! leases off, then on. Every decision of that subject lands on the one master that
//! owns its slot: the table shows that master's main-thread CPU (`INFO`
//! `used_cpu_sys_main_thread` + `used_cpu_user_main_thread`, delta over the turn)
//! beside the other two masters', per second and per decision.

#[path = "../tests/it/support/mod.rs"]
#[allow(dead_code, unused_imports, clippy::all)]
mod support;

use redlimit::internals::Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::lease::Leases;
use redlimit::{Limiter, Policy, RedisStore};

const TASKS: usize = 64;
const RUN: Duration = Duration::from_secs(5);

async fn drive<S: Store + Clone>(store: S) -> (f64, u64) {
    let limiter = Arc::new(Limiter::new(
        store,
        Policy::sliding_window("bench", 1_000_000, Duration::from_secs(60)).expect("valid"),
    ));
    // Warm up: connection, script cache, slot map.
    for i in 0..200 {
        let _ = limiter.check(format!("warm-{i}"), 1).await;
    }
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (limiter, done, errors) = (limiter.clone(), done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while start.elapsed() < RUN {
                match limiter.check(format!("subject-{}", i % 10_000), 1).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
                i += TASKS;
            }
        }));
    }
    for task in tasks {
        task.await.expect("bench task");
    }
    let secs = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        errors.load(Ordering::Relaxed),
    )
}

/// Main-thread CPU seconds of each master, by port.
async fn masters_cpu(cluster: &support::cluster::RedisCluster) -> Vec<(u16, f64)> {
    let mut out = Vec::new();
    for master in cluster.masters().await {
        let mut conn = cluster.node(master.port).conn().await;
        let info: String = redlimit::redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn)
            .await
            .expect("INFO cpu");
        let field = |name| {
            support::cluster::info_field(&info, name)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        out.push((
            master.port,
            field("used_cpu_sys_main_thread") + field("used_cpu_user_main_thread"),
        ));
    }
    out
}

/// One hot subject through four instances for `RUN`: decisions, admitted, and each
/// master's CPU seconds over the turn.
async fn hot_subject(
    cluster: &support::cluster::RedisCluster,
    leases: bool,
) -> (u64, u64, f64, Vec<(u16, f64)>) {
    let policy = Policy::sliding_window("hot", 1_000, Duration::from_secs(1)).expect("valid");
    let mut limiters = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::cluster(cluster.pool()).timeout(Duration::from_secs(1));
        let mut limiter = Limiter::builder(store).policy(policy.clone());
        if leases {
            limiter = limiter.leases(Leases::new());
        }
        let limiter = limiter.build().expect("a sliding window leases");
        let _ = limiter.check("warm", 1).await;
        limiters.push(Arc::new(limiter));
    }
    let subject = if leases { "hot-leased" } else { "hot-plain" };
    let (decisions, admitted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let before = masters_cpu(cluster).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for _ in 0..16 {
            let (limiter, decisions, admitted) =
                (limiter.clone(), decisions.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < RUN {
                    if let Ok(decision) = limiter.check(subject, 1).await {
                        decisions.fetch_add(1, Ordering::Relaxed);
                        if decision.is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // A request's own work: without it, local answers would starve the
                    // timer of the tasks' runtime.
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("bench task");
    }
    let secs = start.elapsed().as_secs_f64();
    let after = masters_cpu(cluster).await;
    let cpu = before
        .iter()
        .zip(&after)
        .map(|((port, a), (_, b))| (*port, b - a))
        .collect();
    (
        decisions.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
        secs,
        cpu,
    )
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let single = support::RedisServer::start();
    let cluster = support::cluster::RedisCluster::start();
    let (single_rate, single_errors) = runtime.block_on(drive(
        RedisStore::new(single.pool()).timeout(Duration::from_secs(1)),
    ));
    let (cluster_rate, cluster_errors) = runtime.block_on(drive(
        RedisStore::cluster(cluster.pool()).timeout(Duration::from_secs(1)),
    ));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {cores} cores; {TASKS} tasks, {} s each, sliding window, 10,000 subjects",
        RUN.as_secs()
    );
    println!();
    println!("| target | decisions/s | errors | ratio to single node |");
    println!("|---|---|---|---|");
    println!("| single node | {single_rate:.0} | {single_errors} | 1.00x |");
    println!(
        "| cluster, 3 masters + 3 replicas | {cluster_rate:.0} | {cluster_errors} | {:.2}x |",
        cluster_rate / single_rate
    );

    let owner = |subject: &str| {
        let slot = runtime.block_on(cluster.slot(&format!("rl:{{{subject}}}:hot:sw")));
        let masters = runtime.block_on(cluster.masters());
        masters
            .iter()
            .find(|m| m.serves(slot))
            .map_or(0, |m| m.port)
    };
    println!();
    println!(
        "One hot subject, 4 instances x 16 tasks, sliding window 1000/s, {} s each; CPU is \
         each master's main thread (INFO delta)",
        RUN.as_secs()
    );
    println!();
    println!("| leases | decisions/s | admitted/s | owning master CPU | per decision | other masters CPU |");
    println!("|---|---|---|---|---|---|");
    for leases in [false, true] {
        let (decisions, admitted, secs, cpu) = runtime.block_on(hot_subject(&cluster, leases));
        // Keys hash the subject's bytes as they are: the subjects here are plain.
        let port = owner(if leases { "hot-leased" } else { "hot-plain" });
        let own: f64 = cpu.iter().filter(|(p, _)| *p == port).map(|(_, c)| c).sum();
        let others: f64 = cpu.iter().filter(|(p, _)| *p != port).map(|(_, c)| c).sum();
        println!(
            "| {} | {:.0} | {:.0} | {:.1}% ({port}) | {:.2} us | {:.1}% |",
            if leases { "on" } else { "off" },
            decisions as f64 / secs,
            admitted as f64 / secs,
            own / secs * 100.0,
            own * 1e6 / decisions.max(1) as f64,
            others / secs * 100.0,
        );
    }
}
