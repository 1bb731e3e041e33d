//! The tables of BENCHMARKS.md, every figure measured in one run beside its reference.
//!
//! ```text
//! cargo bench -p redlimit-bench --bench tables   # every section
//! # some of: throughput, memory, flood, latency, http
//! cargo bench -p redlimit-bench --bench tables -- throughput memory
//! # a smoke run
//! REDLIMIT_BENCH_TURN_SCALE=0.1 cargo bench -p redlimit-bench --bench tables -- latency http
//! # with tower-rate-limiter in the http section (see benches/Cargo.toml for why the flags; a
//! # target directory of its own keeps the default build's artifacts):
//! RUSTFLAGS="--cfg redlimit_peers" CARGO_TARGET_DIR=target/peers \
//!     cargo bench -p redlimit-bench --bench tables --ignore-rust-version -- http
//! # the http section's turns driven by `wrk -t1 -c32` instead of its own generator
//! REDLIMIT_HTTP_LOAD=wrk cargo bench -p redlimit-bench --bench tables -- http
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (the test harness in
//! `tests/it/support`), and needs `redis-benchmark` on PATH for the throughput
//! references (Debian: package `redis-tools`). Prints the machine, then markdown
//! tables: paste them into BENCHMARKS.md with the command that made them. Contenders
//! take turns in rounds so a noisy neighbour hurts them alike.
//!
//! - [`throughput`]: each algorithm through `Limiter::check` on a `RedisStore`, beside a
//!   bare redis-rs loop sending the store's own command (`RedisStore::command`) and the
//!   smallest script of each algorithm (`benches/reference/`), with Redis CPU per
//!   decision against the smallest fixed-window script of the same run, the store's
//!   decisions per Redis call, and the smallest fixed-window script batched as many
//!   decisions a call as the store's.
//! - [`memory`]: Redis `used_memory` delta per subject for each algorithm, beside the
//!   common layouts on the same server, and the published "1 million users at 1,000 per
//!   minute" table recomputed from those figures.
//! - [`flood`]: everyone else's rate under a flood from one subject.
//! - [`latency`]: p50 and p99 of one task's calls, one at a time, through
//!   `Limiter::check` beside the smallest fixed-window script, and where the
//!   difference goes.
//! - [`http`]: hello world over HTTP, bare, behind the layer, and behind a handler that
//!   sends the smallest script (and, built with `--cfg redlimit_peers`, behind
//!   tower-rate-limiter's Redis store), with Redis CPU and the server's CPU per request.
//!
//! `REDLIMIT_BENCH_TURN_SCALE` (a factor, 1 when unset) scales the turns of the
//! latency and http sections, for smoke runs; their tables print the turns they ran.
//!
//! [`helpers`] holds what the sections share.

#[path = "../../tests/it/support/mod.rs"]
mod support;

mod flood;
mod helpers;
mod http;
mod latency;
mod memory;
mod throughput;

use std::time::Instant;

use helpers::{connect, load_scripts, machine};
use support::RedisServer;

const SECTIONS: [&str; 5] = ["throughput", "memory", "flood", "latency", "http"];

fn main() {
    // `cargo bench` appends `--bench`; anything else not starting with '-' is a section.
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for a in &asked {
        assert!(
            SECTIONS.contains(&a.as_str()),
            "unknown section {a:?}: choose among {SECTIONS:?}"
        );
    }
    let wanted = |s: &str| asked.is_empty() || asked.iter().any(|a| a == s);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let server = RedisServer::start();
    let started = Instant::now();
    rt.block_on(async {
        let mut conn = connect(&server).await;
        machine::print(&mut conn).await;
        load_scripts(&mut conn).await;
        if wanted("throughput") {
            throughput::run(&server).await;
            machine::print_load();
        }
        if wanted("memory") {
            memory::run(&server).await;
            machine::print_load();
        }
        if wanted("flood") {
            flood::run(&server).await;
            machine::print_load();
        }
    });
    // The latency and HTTP sections run their own runtimes (latency: the one it
    // measures; http: server, load generator).
    if wanted("latency") {
        latency::run(&server);
        machine::print_load();
    }
    if wanted("http") {
        http::run(&server);
        machine::print_load();
    }
    println!("\nwhole run: {:.0} s", started.elapsed().as_secs_f64());
}
