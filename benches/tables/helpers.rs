//! What every section shares: the machine, the reference scripts, connections, formatting.

pub(crate) use std::time::Duration;

use crate::support::RedisServer;
use redlimit::internals::RedisStoreInternals;
pub(crate) use redlimit::redis::{self, aio::MultiplexedConnection, Value};
pub(crate) use redlimit::{Algorithm, Policy, RedisStore, Subject};
pub(crate) use std::time::Instant;

/// The machine facts every table is read against.
pub(crate) mod machine {
    use super::*;
    use std::process::Command;

    fn command(program: &str, args: &[&str]) -> String {
        Command::new(program)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("({program} unavailable)"))
    }

    pub(crate) fn load() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".to_owned())
    }

    /// CPU time of this whole process (every thread), in ns, from /proc.
    pub(crate) fn process_cpu_ns() -> u64 {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(|task| {
                        let stat =
                            std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
                        stat.split_whitespace().next()?.parse::<u64>().ok()
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    /// CPU time of this process's threads named `name` (as `/proc/self/task/<tid>/comm`
    /// shows them: at most 15 bytes), in ns, from each thread's `schedstat` (time on a
    /// CPU, user and system). For the share of one runtime whose threads carry a name.
    pub(crate) fn threads_cpu_ns(name: &str) -> u64 {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(|task| {
                        let dir = task.ok()?.path();
                        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
                        if comm.trim_end() != name {
                            return None;
                        }
                        let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
                        stat.split_whitespace().next()?.parse::<u64>().ok()
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    pub(crate) fn print_load() {
        println!("\nload average (1, 5, 15 min): {}", load());
    }

    pub(crate) async fn print(conn: &mut MultiplexedConnection) {
        let info = info(conn, "server").await;
        let field = |name: &str| info_field(&info, name).unwrap_or("?").to_owned();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
                    .map(|s| s.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".to_owned());
        println!("## Machine");
        println!();
        println!(
            "- date: {}",
            command("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
        );
        println!(
            "- cores: {} ({cpu})",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!(
            "- Redis {} ({}-bit), loopback, no persistence",
            field("redis_version"),
            field("arch_bits"),
        );
        println!("- {}", command("redis-benchmark", &["--version"]));
        println!("- {}", command("rustc", &["--version"]));
        println!("- load average (1, 5, 15 min) at start: {}", load());
    }
}

/// Our own scripts of the common layouts and the smallest fixed-window script (see
/// `benches/reference/`): the references the store is measured against.
pub(crate) mod reference {
    use super::*;
    use std::sync::LazyLock;

    macro_rules! script {
        ($name:ident, $file:literal) => {
            pub(crate) static $name: LazyLock<redis::Script> =
                LazyLock::new(|| redis::Script::new(include_str!(concat!("../reference/", $file))));
        };
    }
    script!(FIXED_WINDOW, "fixed_window.lua");
    script!(SLIDING_WINDOW, "sliding_window.lua");
    script!(TOKEN_BUCKET, "token_bucket.lua");
    script!(SLIDING_LOG, "sliding_log.lua");
    script!(SMALLEST_FIXED_WINDOW, "smallest_fixed_window.lua");
    script!(
        SMALLEST_FIXED_WINDOW_BATCH,
        "smallest_fixed_window_batch.lua"
    );
    script!(
        SLIDING_WINDOW_TOKEN_BUCKET,
        "sliding_window_token_bucket.lua"
    );

    /// Every reference script, for `SCRIPT LOAD`.
    pub(crate) fn all() -> [&'static redis::Script; 7] {
        [
            &FIXED_WINDOW,
            &SLIDING_WINDOW,
            &TOKEN_BUCKET,
            &SLIDING_LOG,
            &SMALLEST_FIXED_WINDOW,
            &SMALLEST_FIXED_WINDOW_BATCH,
            &SLIDING_WINDOW_TOKEN_BUCKET,
        ]
    }

    /// The common layout of `algorithm`: hash-tag-free names, as they are usually written.
    pub(crate) fn script(algorithm: Algorithm) -> &'static redis::Script {
        match algorithm {
            Algorithm::FixedWindow => &FIXED_WINDOW,
            Algorithm::SlidingWindow => &SLIDING_WINDOW,
            Algorithm::TokenBucket => &TOKEN_BUCKET,
            _ => &SLIDING_LOG,
        }
    }

    pub(crate) fn name(algorithm: Algorithm) -> &'static str {
        match algorithm {
            Algorithm::FixedWindow => "INCR on a key per window",
            Algorithm::SlidingWindow => "two keys (previous, current window)",
            Algorithm::TokenBucket => "hash (tokens, ts)",
            _ => "sorted set of timestamps",
        }
    }

    /// `EVALSHA` of the common script for one call: the same key as ours (the window
    /// number is appended to it by the fixed and sliding window scripts), then clock,
    /// cost, limit (capacity) and window (refill period) in ms, and a request id for
    /// the sorted set's unique members.
    pub(crate) fn command(
        algorithm: Algorithm,
        key: &str,
        clock: &str,
        cost: u64,
        policy: &Policy,
        id: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script(algorithm).get_hash())
            .arg(1)
            .arg(key)
            .arg(clock)
            .arg(cost)
            .arg(policy.limit())
            .arg(policy.window_ms());
        if algorithm == Algorithm::SlidingLog {
            cmd.arg(id);
        }
        cmd
    }

    /// `EVALSHA` of the smallest fixed-window script: Redis `TIME`, `INCR` of
    /// `key:<window number>`, `PEXPIRE` when new; the reply is the count.
    pub(crate) fn smallest_fixed_window(key: &str, window_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(SMALLEST_FIXED_WINDOW.get_hash())
            .arg(1)
            .arg(key)
            .arg(window_ms);
        cmd
    }

    /// `EVALSHA` of the smallest fixed-window script batched: Redis `TIME` once, then
    /// for each key `INCR` of `key:<window number>` and `PEXPIRE` when new; the reply is
    /// the counts, in the order of `keys`.
    pub(crate) fn smallest_fixed_window_batch<'k>(
        keys: impl ExactSizeIterator<Item = &'k str>,
        window_ms: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(SMALLEST_FIXED_WINDOW_BATCH.get_hash())
            .arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        cmd.arg(window_ms);
        cmd
    }

    /// `EVALSHA` of the common sliding window and token bucket in one script, on Redis
    /// `TIME`, cost 1.
    pub(crate) fn sliding_window_token_bucket(
        window_key: &str,
        bucket_key: &str,
        window: &Policy,
        bucket: &Policy,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(SLIDING_WINDOW_TOKEN_BUCKET.get_hash())
            .arg(2)
            .arg(window_key)
            .arg(bucket_key)
            .arg("s")
            .arg(1)
            .arg(window.limit())
            .arg(window.window_ms())
            .arg(bucket.limit())
            .arg(bucket.window_ms());
        cmd
    }
}

/// Loads the store's function library and the reference scripts, which the bare
/// loops, the HTTP handler and `redis-benchmark` call by name or SHA: they cannot
/// recover from a missing function or `NOSCRIPT` as the store does. `FLUSHALL` keeps
/// both.
pub(crate) async fn load_scripts(conn: &mut MultiplexedConnection) {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(RedisStore::function_library())
        .query_async::<Value>(conn)
        .await
        .expect("FUNCTION LOAD of the store's library");
    for script in reference::all() {
        script
            .prepare_invoke()
            .load_async(conn)
            .await
            .expect("SCRIPT LOAD of a reference script");
    }
}

/// One section of `INFO`.
pub(crate) async fn info(conn: &mut MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
}

/// The value of `name` in an `INFO` answer.
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// The Redis main thread's CPU time (user + system) in an `INFO cpu` answer, in
/// seconds; the whole server's on a Redis without the per-thread fields.
pub(crate) fn redis_cpu_s_of(info: &str) -> f64 {
    let field = |name: &str| -> Option<f64> { info_field(info, name)?.parse().ok() };
    let main_thread = field("used_cpu_user_main_thread")
        .zip(field("used_cpu_sys_main_thread"))
        .map(|(u, s)| u + s);
    main_thread
        .or_else(|| Some(field("used_cpu_user")? + field("used_cpu_sys")?))
        .expect("INFO cpu has used_cpu_user and used_cpu_sys")
}

/// The Redis main thread's CPU time, in seconds, read on a blocking connection: for
/// the sections that time their runtimes from outside, so the reading runs on none of
/// them.
pub(crate) fn redis_cpu_s_blocking(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(conn).expect("INFO cpu");
    redis_cpu_s_of(&info)
}

/// The script calls Redis has run (`FCALL`, `EVALSHA`, `EVAL`: `INFO commandstats`).
pub(crate) fn script_calls_blocking(conn: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            if !matches!(name, "fcall" | "evalsha" | "eval") {
                return None;
            }
            rest.strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A blocking connection, for [`redis_cpu_s_blocking`].
pub(crate) fn blocking_conn(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("a blocking Redis connection")
}

/// `default` times `REDLIMIT_BENCH_TURN_SCALE` (a factor, 1 when unset): shorter turns
/// for a smoke run of the sections that read it (latency, http). Their tables print the
/// turn they ran, so a scaled run cannot pass for a full one.
pub(crate) fn scaled(default: Duration) -> Duration {
    let scale = std::env::var("REDLIMIT_BENCH_TURN_SCALE")
        .ok()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|x| *x > 0.0 && x.is_finite())
                .unwrap_or_else(|| panic!("REDLIMIT_BENCH_TURN_SCALE={s:?}: a positive number"))
        })
        .unwrap_or(1.0);
    default.mul_f64(scale)
}

/// A connection for the bench's own commands: long answers (a `FLUSHALL` of a
/// gigabyte of sorted sets, a fill of 1000 entries) must not time out.
pub(crate) async fn connect(server: &RedisServer) -> MultiplexedConnection {
    let mut conn = server.conn().await;
    conn.set_response_timeout(Duration::from_secs(120));
    conn
}

pub(crate) async fn flushall(conn: &mut MultiplexedConnection) {
    redis::cmd("FLUSHALL")
        .query_async::<()>(conn)
        .await
        .expect("FLUSHALL");
}

/// The subjects: 12-digit numbers, as `redis-benchmark -r` writes `__rand_int__`.
pub(crate) fn subject(i: usize) -> Subject {
    Subject::new(format!("{i:012}"))
}

/// Whether a reply admits its first policy: the store's, a packed outcome (its lowest
/// bit) or the marker of an admission too wide to pack (-2), as
/// src/store/redis/contract packs them (a lone outcome of one integer comes alone,
/// more as one string of big-endian doubles); a reference script's array, whose
/// first integer is 1 or 0.
pub(crate) fn admitted(reply: &Value) -> bool {
    let first = match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => *n,
            other => panic!("unexpected reference reply {other:?}"),
        },
        store => {
            match <RedisStore as RedisStoreInternals>::reply_integers(store.clone()).as_deref() {
                Some([first, ..]) => *first,
                _ => panic!("unexpected script reply {store:?}"),
            }
        }
    };
    if first >= 0 {
        first & 1 == 1
    } else {
        first == -2
    }
}

pub(crate) fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

pub(crate) fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// The median, halfway between the middle two of an even count.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A store setting from the environment, to measure other settings than the
/// defaults: `REDLIMIT_MAX_PIPELINED`, `REDLIMIT_MAX_BATCH`.
pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
