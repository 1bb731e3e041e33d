//! A 30-second audit: what the rate limiter keeps in a Redis.
//!
//! ```text
//! cargo run --example audit -- redis://127.0.0.1:6379 [prefix]
//! ```
//!
//! Scans the keys under `prefix` (default `rl`) with a bounded `SCAN ... COUNT 1000`,
//! and prints, as plain text: the keys by algorithm (from the key's code) and by Redis
//! type, the keys without a TTL (state that never expires), the server's memory, and
//! the ten largest keys. A zset or hash among them is a layout of another limiter
//! (a sorted-set log or a hash bucket): check its memory first.

use std::collections::BTreeMap;
use std::error::Error;

use redlimit::redis::{self, aio::MultiplexedConnection};

/// How many keys one `SCAN` step asks for, and how many are inspected per pipeline.
const BATCH: usize = 1_000;
/// How many keys without a TTL are named in the report.
const SHOWN_ETERNAL: usize = 10;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let Some(url) = args.next() else {
        eprintln!("usage: cargo run --example audit -- redis://HOST:PORT [prefix]");
        std::process::exit(2);
    };
    let prefix = args.next().unwrap_or_else(|| "rl".to_owned());
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    let mut report = Report::default();
    let pattern = format!("{}:*", glob_escape(&prefix));
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(&mut conn)
            .await?;
        report.inspect(&mut conn, keys).await?;
        if next == 0 {
            break;
        }
        cursor = next;
    }

    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await?;
    let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await?;
    report.print(&url, &prefix, dbsize, &info);
    Ok(())
}

#[derive(Default)]
struct Report {
    keys: u64,
    by_algorithm: BTreeMap<String, u64>,
    by_type: BTreeMap<String, u64>,
    eternal: u64,
    eternal_examples: Vec<String>,
    /// The largest keys seen, largest first, at most ten.
    largest: Vec<(u64, String)>,
    bytes: u64,
}

impl Report {
    async fn inspect(
        &mut self,
        conn: &mut MultiplexedConnection,
        keys: Vec<Vec<u8>>,
    ) -> Result<(), Box<dyn Error>> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("TYPE").arg(key);
            pipe.cmd("PTTL").arg(key);
            pipe.cmd("MEMORY").arg("USAGE").arg(key);
        }
        let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        for (key, reply) in keys.iter().zip(replies.chunks_exact(3)) {
            let kind: String = redis::from_redis_value(reply[0].clone()).unwrap_or_default();
            if kind == "none" {
                continue; // expired between SCAN and now
            }
            let ttl: i64 = redis::from_redis_value(reply[1].clone()).unwrap_or(-2);
            let bytes: u64 = redis::from_redis_value(reply[2].clone()).unwrap_or(0);
            let name = String::from_utf8_lossy(key).into_owned();
            self.keys += 1;
            self.bytes += bytes;
            *self
                .by_algorithm
                .entry(algorithm(&name).to_owned())
                .or_default() += 1;
            *self.by_type.entry(kind).or_default() += 1;
            if ttl == -1 {
                self.eternal += 1;
                if self.eternal_examples.len() < SHOWN_ETERNAL {
                    self.eternal_examples.push(name.clone());
                }
            }
            if self.largest.len() < 10 || self.largest.last().is_some_and(|(b, _)| bytes > *b) {
                let at = self.largest.partition_point(|(b, _)| *b >= bytes);
                self.largest.insert(at, (bytes, name));
                self.largest.truncate(10);
            }
        }
        Ok(())
    }

    fn print(&self, url: &str, prefix: &str, dbsize: u64, info: &str) {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        println!("redlimit audit of {url}, keys {prefix}:*");
        println!();
        println!(
            "keys: {} of {dbsize} in the database, {} bytes by MEMORY USAGE",
            self.keys, self.bytes
        );
        println!(
            "server memory: used_memory {} ({})",
            field("used_memory"),
            field("used_memory_human")
        );
        println!();
        println!("by algorithm:");
        if self.by_algorithm.is_empty() {
            println!("  (none)");
        }
        for (name, n) in &self.by_algorithm {
            println!("  {name:<16} {n:>10}");
        }
        println!("by Redis type:");
        if self.by_type.is_empty() {
            println!("  (none)");
        }
        for (kind, n) in &self.by_type {
            let note = match kind.as_str() {
                "string" => "",
                "zset" => "  <- a sorted-set log: about 100 B per entry, check its memory",
                _ => "  <- not a redlimit layout",
            };
            println!("  {kind:<16} {n:>10}{note}");
        }
        println!();
        if self.eternal == 0 {
            println!("keys without a TTL: none");
        } else {
            println!(
                "keys without a TTL: {} <- state that never expires",
                self.eternal
            );
            for name in &self.eternal_examples {
                println!("  {name}");
            }
        }
        println!();
        println!("largest keys (MEMORY USAGE):");
        if self.largest.is_empty() {
            println!("  (none)");
        }
        for (bytes, name) in &self.largest {
            println!("  {bytes:>10} B  {name}");
        }
    }
}

/// The algorithm of a redlimit key, from its last segment.
fn algorithm(key: &str) -> &'static str {
    match key.rsplit(':').next() {
        Some("fw") => "fixed_window",
        Some("sw") => "sliding_window",
        Some("tb") => "token_bucket",
        Some("sl") => "sliding_log",
        // A limiter of several policies: their states in one key.
        Some("~") => "policy_set",
        // A leasing subject's lease generation.
        Some("~lease") => "lease_generation",
        _ => "other",
    }
}

/// Escapes the characters `SCAN MATCH` treats as a pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
