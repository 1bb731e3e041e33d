//! What one decision costs Redis, in instructions: `cargo bench --bench lua_cost`.
//!
//! Runs `redis-server` under `valgrind --tool=callgrind` on a free loopback port, sends
//! each contender's command `N` times with `redis-benchmark` (random subjects among
//! 100,000, pipelined, so the count is the server's work per call and not the network's
//! waits), and reads the server's instruction count over exactly those calls
//! (`callgrind_control --zero`, then `--dump`). Instruction counts do not drift with the
//! load of a shared machine the way CPU seconds do, so ratios between contenders are
//! repeatable to a fraction of a percent; the CPU-seconds view of the same question is
//! the throughput table of `cargo bench --bench tables`.
//!
//! Contenders: the smallest script that makes a fixed-window decision at all (`TIME`,
//! `INCR` of a key per window, `PEXPIRE` when new: the reference), then each algorithm
//! as the store sends it: `FCALL` of the function library, and `EVALSHA` of the
//! per-shape script that a server without functions gets. The commands are rendered
//! by the crate (`RedisStore::command`), so the bench sends what the store sends.
//!
//! Needs `valgrind` (with `callgrind_control`), `redis-server` and `redis-benchmark`
//! (Debian: valgrind, redis-server, redis-tools). About a minute and a half.

use redlimit::internals::{LimiterInternals, Operation, RedisStoreInternals};
use std::process::Command;
use std::time::Duration;

use redlimit::{Limiter, MemoryStore, Policy, RedisStore, Subject};

mod callgrind;
use callgrind::Server;

/// Calls per contender: enough that the per-call figure is stable to a few
/// instructions, few enough that callgrind's slowdown keeps the run short.
const CALLS: u64 = 5_000;

/// The reference: the common fixed-window layout, the least a decision can do.
const SMALLEST: &str = r#"local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local w = tonumber(ARGV[1])
local key = KEYS[1] .. ":" .. math.floor(now / w)
local c = redis.call("INCR", key)
if c == 1 then redis.call("PEXPIRE", key, w) end
return c
"#;

/// The server's instructions per call over `CALLS` calls of `args`, sent by
/// `redis-benchmark`.
fn instructions_per_call(server: &Server, args: &[String]) -> f64 {
    let (total, ()) = server.instructions(|| {
        let out = Command::new("redis-benchmark")
            .args([
                "-p",
                &server.port().to_string(),
                "-c",
                "4",
                "-P",
                "16",
                "-r",
                "100000",
            ])
            .args(["-n", &CALLS.to_string(), "-q"])
            .args(args)
            .output()
            .expect("redis-benchmark must be installed (Debian: redis-tools)");
        assert!(out.status.success(), "redis-benchmark failed");
    });
    total as f64 / CALLS as f64
}

/// The store's command for a check of `policies`, as `redis-benchmark` arguments, with
/// the subject's key part replaced by `__rand_int__` (a plain subject is its own key
/// part, so the replacement is exact).
fn store_args(store: &RedisStore, policies: &[Policy], script: bool) -> Vec<String> {
    let limiter = policies
        .iter()
        .fold(Limiter::builder(MemoryStore::new()), |l, p| {
            l.policy(p.clone())
        })
        .build()
        .expect("policies named apart");
    const MARK: &str = "subjectmark";
    let cmd = store.command(
        Operation::Check,
        &Subject::new(MARK),
        limiter.policy_set(),
        1,
        script,
    );
    cmd.args_iter()
        .map(|arg| match arg {
            redlimit::redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => panic!("a store call has plain arguments only"),
        })
        .map(|arg| arg.replace(MARK, "__rand_int__"))
        .collect()
}

fn main() {
    let server = Server::start("lua-cost");
    let smallest_sha = server.cli(&["SCRIPT", "LOAD", SMALLEST]).trim().to_owned();
    let library = RedisStore::function_library();
    let loaded = server.cli(&["FUNCTION", "LOAD", "REPLACE", library]);
    assert!(
        loaded.trim().starts_with("redlimit_"),
        "FUNCTION LOAD: {loaded}"
    );

    let minute = Duration::from_secs(60);
    let policy = |p: Result<Policy, redlimit::PolicyError>| p.expect("a valid policy");
    // Limits no call reaches: every call is an admission, the path that writes.
    let rows: Vec<(&str, Vec<Policy>, f64)> = vec![
        (
            "fixed window",
            vec![policy(Policy::fixed_window("p", 1_000_000, minute))],
            1.3,
        ),
        (
            "sliding window",
            vec![policy(Policy::sliding_window("p", 1_000_000, minute))],
            1.6,
        ),
        (
            "token bucket",
            vec![policy(Policy::token_bucket(
                "p",
                1_000_000,
                1_000,
                Duration::from_secs(1),
            ))],
            1.3,
        ),
        (
            "sliding log (limit 100)",
            vec![policy(Policy::sliding_log("p", 100, minute))],
            1.6,
        ),
        (
            "sliding window + token bucket",
            vec![
                policy(Policy::sliding_window("p", 1_000_000, minute)),
                policy(Policy::token_bucket(
                    "q",
                    1_000_000,
                    1_000,
                    Duration::from_secs(1),
                )),
            ],
            2.2,
        ),
    ];
    // Any store renders the same command; this one never connects.
    let pool = redlimit::deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))
        .expect("a pool");
    let store = RedisStore::new(pool);

    let reference = instructions_per_call(
        &server,
        &[
            "EVALSHA".to_owned(),
            smallest_sha,
            "1".to_owned(),
            "rl:{__rand_int__}:p:fw".to_owned(),
            "60000".to_owned(),
        ],
    );
    println!("Redis instructions per decision (callgrind, {CALLS} calls each, redis-benchmark -c 4 -P 16 -r 100000)\n");
    println!("| contender | FCALL (function library) | ratio to the smallest script | target | met | EVALSHA (script, servers without functions) | ratio |");
    println!("|---|---|---|---|---|---|---|");
    println!("| smallest fixed-window script (TIME + INCR + PEXPIRE), the reference | {reference:.0} | 1.00x | | | | |");
    for (name, policies, target) in rows {
        let function = instructions_per_call(&server, &store_args(&store, &policies, false));
        let script_args = store_args(&store, &policies, true);
        let sha = RedisStore::script_sha1(&policies);
        server.cli(&["SCRIPT", "LOAD", RedisStore::script_source(&policies)]);
        assert_eq!(script_args[1], sha);
        let script = instructions_per_call(&server, &script_args);
        let ratio = function / reference;
        println!(
            "| {name} | {function:.0} | {ratio:.2}x | <= {target}x | {} | {script:.0} | {:.2}x |",
            if ratio <= target { "met" } else { "NOT met" },
            script / reference
        );
    }
    parts(&server, library);
}

/// Where a decision's instructions go: the library with diagnostic functions added,
/// each doing one piece of a decision, and the batch function at several sizes, over
/// distinct subjects and over one hot subject.
fn parts(server: &Server, library: &str) {
    let name = library
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!lua name="))
        .expect("the library's name line")
        .to_owned();
    // Functions of the same chunk see the library's local functions.
    let pieces: [(&str, &str, &str); 10] = [
        (
            "nop",
            "an FCALL that does nothing (1 key, 3 arguments)",
            "return 1",
        ),
        ("time", "+ Redis TIME", "redis.call('TIME') return 1"),
        (
            "tonumber",
            "+ 2 tonumber of arguments",
            "local a, b = tonumber(args[2]), tonumber(args[3]) return 1",
        ),
        (
            "coerce",
            "+ 2 arithmetic coercions of arguments",
            "local a, b = args[2] + 0, args[3] + 0 return 1",
        ),
        (
            "get",
            "+ GET of a new key",
            "redis.call('GET', keys[1]) return 1",
        ),
        (
            "set",
            "+ SET of a new key, no TTL",
            "redis.call('SET', keys[1], '29000000:1') return 1",
        ),
        (
            "set_px",
            "+ SET .. PX of a new key",
            "redis.call('SET', keys[1], '29000000:1', 'PX', 60000) return 1",
        ),
        (
            "incr_pexpire",
            "+ INCR and PEXPIRE of a new key (the smallest script's writes)",
            "redis.call('INCR', keys[1]) redis.call('PEXPIRE', keys[1], 60000) return 1",
        ),
        (
            "format",
            "+ a fixed window's state formatted (`ints`)",
            "local s = ints(29000000, 1) return 1",
        ),
        (
            "reply4",
            "+ a reply of 4 integers (one policy's)",
            "return { 1, 5, 100, 0 }",
        ),
    ];
    let mut source = library.to_owned();
    for (piece, _, body) in &pieces {
        source.push_str(&format!(
            "redis.register_function('{name}_diag_{piece}', function(keys, args) {body} end)\n"
        ));
    }
    let loaded = server.cli(&["FUNCTION", "LOAD", "REPLACE", &source]);
    assert!(
        loaded.trim().starts_with("redlimit_"),
        "FUNCTION LOAD: {loaded}"
    );
    let key = "rl:{__rand_int__}:p:fw".to_owned();
    let mut nop = 0.0;
    println!("\nWhere a decision's Redis instructions go (the same run: functions added to the library, each one piece; redis-benchmark as above)\n");
    println!("| piece | instructions per call | over the empty FCALL |");
    println!("|---|---|---|");
    for (piece, label, _) in &pieces {
        let args = [
            "FCALL".to_owned(),
            format!("{name}_diag_{piece}"),
            "1".to_owned(),
            key.clone(),
            "fw".to_owned(),
            "1000000".to_owned(),
            "60000".to_owned(),
        ];
        let cost = instructions_per_call(server, &args);
        if *piece == "nop" {
            nop = cost;
        }
        println!("| {label} | {cost:.0} | {:+.0} |", cost - nop);
    }
    // The batch function as the store sends it (lua/batch.lua): `t` (Redis TIME) or
    // `tr` (a subject comes again), one policy set, one byte per check naming it,
    // `1` (every cost is 1).
    // One hot subject: the smallest script's key exists, so it only INCRs.
    let sha = server.cli(&["SCRIPT", "LOAD", SMALLEST]).trim().to_owned();
    let hot_key = "rl:{hot}:p:fw".to_owned();
    let hot = instructions_per_call(
        server,
        &[
            "EVALSHA".to_owned(),
            sha,
            "1".to_owned(),
            hot_key,
            "60000".to_owned(),
        ],
    );
    println!(
        "\nThe smallest script on one hot subject (its key exists: TIME + INCR): {hot:.0} instructions per decision"
    );
    println!(
        "\n| the batch function, fixed window | decisions per call | instructions per decision |"
    );
    println!("|---|---|---|");
    for (subjects, size) in [
        ("distinct", 1usize),
        ("distinct", 8),
        ("distinct", 32),
        ("one hot", 16),
    ] {
        let hot = subjects == "one hot";
        let key = if hot {
            "rl:{hot}:p:fw"
        } else {
            "rl:{__rand_int__}:p:fw"
        };
        let mut args = vec![
            "FCALL".to_owned(),
            format!("{name}_batch"),
            size.to_string(),
        ];
        args.extend(std::iter::repeat_n(key.to_owned(), size));
        args.extend([
            if hot { "tr" } else { "t" }.to_owned(),
            "1".to_owned(),
            "1".to_owned(),
            "fw".to_owned(),
            "1000000000".to_owned(),
            "60000".to_owned(),
            "\u{1}".repeat(size),
            "1".to_owned(),
        ]);
        let cost = instructions_per_call(server, &args) / size as f64;
        println!("| {subjects} subjects | {size} | {cost:.0} |");
    }
}
