//! Redis Cluster throughput beside a single node, measured in the same run:
//! `cargo bench --bench cluster`.
//!
//! Starts one `redis-server` and a local cluster of three masters and three replicas
//! (all on loopback, from `tests/support`), then drives each through one `RedisStore`
//! with 64 concurrent tasks over 10,000 subjects for a fixed time, and prints decisions
//! per second. On one machine every node shares the same cores, so the cluster shows
//! what the client side sustains across slots, not what three separate machines would.

#[path = "../tests/support/mod.rs"]
#[allow(dead_code, unused_imports, clippy::all)]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::{Limiter, Policy, RedisStore, Store};

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
}
