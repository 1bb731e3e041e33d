//! What one decision costs Redis, in instructions: `cargo bench -p redlimit-bench --bench lua_cost`.
//!
//! Runs `redis-server` under `valgrind --tool=callgrind` on a free loopback port, sends
//! each contender's command `N` times with `redis-benchmark` (random subjects among
//! 100,000, pipelined, so the count is the server's work per call and not the network's
//! waits), and reads the server's instruction count over exactly those calls
//! (`callgrind_control --zero`, then `--dump`). Instruction counts do not drift with the
//! load of a shared machine the way CPU seconds do, so ratios between contenders are
//! repeatable to a fraction of a percent; the CPU-seconds view of the same question is
//! the throughput table of `cargo bench -p redlimit-bench --bench tables`.
//!
//! Contenders: the smallest script that makes a fixed-window decision at all (`TIME`,
//! `INCR` of a key per window, `PEXPIRE` when new: the reference), then each algorithm
//! as the store sends it: `FCALL` of the function library, and `EVALSHA` of the
//! per-shape script that a server without functions gets. The commands are rendered
//! by the crate (`RedisStore::command`), so the bench sends what the store sends.
//! Then where a decision's instructions go: diagnostic functions added to the
//! library, each one piece of a decision, and the batch function (lua/batch.lua) at
//! several sizes, over distinct subjects and over one hot subject, its arguments
//! built from the store's own command for one check as the store writes a batch.
//!
//! Then the in-flight section (`cargo bench -p redlimit-bench --bench lua_cost -- in-flight` runs it
//! alone, about 5 minutes): a check of a fixed window with an in-flight policy (no
//! state, 1 holder, 8 holders in the state), the in-flight release and renewal, and
//! the settlements of a reservation (`Operation::Charge`, `Operation::Refund`), each
//! beside the plain fixed-window check and the smallest script of the same run. The
//! states a row's calls find are written for a probe subject by the store's own
//! commands, then copied to every subject redis-benchmark draws (one Lua loop,
//! outside the count, with callgrind's instrumentation off). The same rows on a
//! redis-server without valgrind give Redis CPU per call (`INFO` main-thread CPU
//! delta over 20,000 calls, 7 rounds in rotation; `LUA_COST_CPU_ROUNDS=0` leaves
//! the CPU out, on a machine where someone else times things), and the copied states
//! their memory (`MEMORY USAGE`, and the `used_memory` delta over 100,000 subjects),
//! with the target that an in-flight key with 1 holder (1 slot) is no larger than a
//! fixed-window key.
//!
//! Needs `valgrind` (with `callgrind_control`), `redis-server` and `redis-benchmark`
//! (Debian: valgrind, redis-server, redis-tools). About a minute and a half, and the
//! in-flight section.

use redlimit::internals::{LimiterInternals, Operation, RedisStoreInternals};
use std::process::Command;
use std::time::{Duration, Instant};

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
    // `cargo bench -p redlimit-bench --bench lua_cost -- in-flight`: that section alone (its references
    // are measured again inside it).
    if std::env::args().any(|a| a == "in-flight") {
        in_flight_and_settlements();
        return;
    }
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
    parts(&server, library, &store);
    drop(server);
    in_flight_and_settlements();
}

/// Where a decision's instructions go: the library with diagnostic functions added,
/// each doing one piece of a decision, and the batch function at several sizes, over
/// distinct subjects and over one hot subject.
fn parts(server: &Server, library: &str, store: &RedisStore) {
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
            "pack",
            "+ a fixed window's state packed (`>I6I6`, 12 bytes)",
            "if not pack then init() end local s = pack('>I6I6', 29000000, 1) return 1",
        ),
        (
            "reply1",
            "+ a reply of one packed outcome (one policy's)",
            "return { 2013265921 }",
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
        ("distinct subjects", 1usize),
        ("distinct subjects", 8),
        ("distinct subjects", 32),
        ("one hot subject", 16),
    ] {
        let args = batch_args(store, size, subjects == "one hot subject");
        let cost = instructions_per_call(server, &args) / size as f64;
        println!("| {subjects} | {size} | {cost:.0} |");
    }
}

/// The store's batch of `size` fixed-window checks (limit 1,000,000 a minute), as
/// `redis-benchmark` arguments: built from the store's own command for one check
/// (`FCALL <batch function> 1 <key> <head and set>`, lua/batch.lua: the head's three
/// bytes go before the set's definition, and a batch of one set's checks at cost 1
/// on Redis TIME sends no records), as the store writes a batch
/// (src/store/redis/command.rs): checks of one set on distinct keys name `size` keys
/// and still send no records (each key `__rand_int__`, drawn apart by
/// redis-benchmark); checks of one `hot` subject name its key once, set the head's
/// map flag (`FLAG_MAP`, 1) and send a record per check: the set's number and the
/// key's slot (bytes 1 and 1).
fn batch_args(store: &RedisStore, size: usize, hot: bool) -> Vec<String> {
    let minute = Duration::from_secs(60);
    let policy = Policy::fixed_window("p", 1_000_000, minute).expect("a valid policy");
    let one = store_args(store, &[policy], false);
    assert!(
        one.len() == 5 && one[0] == "FCALL" && one[2] == "1",
        "one check: FCALL, its function, 1 key, the key, the head and set: {one:?}"
    );
    let (function, key, head_and_set) = (&one[1], &one[3], &one[4]);
    let mut args = vec!["FCALL".to_owned(), function.clone()];
    if hot {
        let mut head_and_set = head_and_set.as_bytes().to_vec();
        assert!(
            head_and_set.len() > 3,
            "the head (clock, flags, sets), then the set"
        );
        head_and_set[1] |= 1;
        args.extend([
            "1".to_owned(),
            key.replace("__rand_int__", "hot"),
            String::from_utf8(head_and_set).expect("an ASCII head"),
            "\u{1}\u{1}".repeat(size),
        ]);
    } else {
        args.push(size.to_string());
        args.extend(std::iter::repeat_n(key.clone(), size));
        args.push(head_and_set.clone());
    }
    args
}

/// The subject every command is rendered for, replaced by `__rand_int__` (the counted
/// calls) or by [`PROBE`] (the calls that write the states the counted calls find).
const MARK: &str = "subjectmark";
/// A subject outside redis-benchmark's range (12-digit numbers).
const PROBE: &str = "probe";
/// The in-flight section's calls per turn on the server without valgrind.
const CPU_CALLS: u64 = 20_000;
/// Its rounds; `LUA_COST_CPU_ROUNDS` sets another number, 0 none (the instructions
/// and the memory alone, on a machine where someone else times things).
const CPU_ROUNDS: usize = 7;
/// Subjects whose states a row finds written: redis-benchmark's `-r`.
const SUBJECTS: u64 = 100_000;
/// The in-flight policy's slot lifetime: a row's copied entries must still count
/// when its last call runs, and copying 100,000 states under valgrind takes tens of
/// seconds. The figures do not depend on it (an expiry is packed in 6 bytes either
/// way).
const SLOT_TTL: Duration = Duration::from_secs(300);
/// The window of the rows whose states hold a count (they must not roll over during
/// a row: an hour; the plain check keeps the first table's minute).
const HOUR: Duration = Duration::from_secs(3600);

/// `op` of `cost` as `set`'s store sends it, as arguments, for the subject [`MARK`].
fn render(
    store: &RedisStore,
    set: &redlimit::internals::PolicySet,
    op: Operation,
    cost: u64,
) -> Vec<String> {
    store
        .command(op, &Subject::new(MARK), set, cost, false)
        .args_iter()
        .map(|arg| match arg {
            redlimit::redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => panic!("a store call has plain arguments only"),
        })
        .collect()
}

fn for_subject(args: &[String], subject: &str) -> Vec<String> {
    args.iter().map(|a| a.replace(MARK, subject)).collect()
}

/// One row of the section: the counted command, and what its calls find.
struct Row {
    label: String,
    /// With the subject [`MARK`].
    args: Vec<String>,
    /// Commands (subject [`MARK`]) run for the probe before the copy: they write the
    /// states every subject then holds.
    prepare: Vec<Vec<String>>,
    /// The keys (subject [`MARK`]) whose probe state is copied to every subject.
    copy: Vec<String>,
    /// Its state holds a window's count: the row runs within one minute's window.
    windowed_state: bool,
    /// (policy index, remaining) the command's reply on the probe must show.
    expect: Option<(usize, i64)>,
}

/// Copies the probe's state of each of `keys` (subject [`MARK`]) to the subjects
/// `0..SUBJECTS` as redis-benchmark names them, with the probe key's TTL: one Lua
/// loop, outside any count.
const COPY: &str = r#"local n = tonumber(ARGV[1])
for k = 1, #KEYS do
  local v = redis.call('GET', KEYS[k])
  local ttl = redis.call('PTTL', KEYS[k])
  if not v or ttl <= 0 then return redis.error_reply('no probe state at ' .. KEYS[k]) end
  local pre, suf = ARGV[2 * k], ARGV[2 * k + 1]
  for i = 0, n - 1 do
    redis.call('SET', pre .. string.format('%012d', i) .. suf, v, 'PX', ttl)
  end
end
return n
"#;

impl Row {
    /// Writes the probe's states and copies them to every subject.
    fn setup(&self, server: &Server) {
        for cmd in &self.prepare {
            let args = for_subject(cmd, PROBE);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            server.cli(&refs);
        }
        if self.copy.is_empty() {
            return;
        }
        let mut args = vec![
            "EVAL".to_owned(),
            COPY.to_owned(),
            self.copy.len().to_string(),
        ];
        args.extend(self.copy.iter().map(|k| k.replace(MARK, PROBE)));
        args.push(SUBJECTS.to_string());
        for key in &self.copy {
            let (pre, suf) = key.split_once(MARK).expect("the subject in the key");
            args.extend([pre.to_owned(), suf.to_owned()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = server.cli(&refs);
        assert_eq!(out.trim(), SUBJECTS.to_string(), "the copy: {out}");
        // The probe's own states stay: the verify call runs on them.
    }

    /// The row's command once on the probe (outside redis-benchmark's range): its
    /// reply, checked against `expect`.
    fn verify(&self, server: &Server) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| a.replace("__rand_int__", PROBE))
            .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = server.cli_bytes(&refs);
        if self.args[0] != "FCALL" {
            // The smallest script's reply: its count.
            return String::from_utf8_lossy(&out).trim().to_owned();
        }
        let fields = reply_integers(&out);
        let out = format!("{fields:?}");
        let outcomes = unpack(&fields);
        if let Some((policy, remaining)) = self.expect {
            assert_eq!(
                outcomes.get(policy).map(|o| o.1),
                Some(remaining),
                "{}: the reply on the probe: {out}",
                self.label
            );
        }
        outcomes
            .iter()
            .map(|(allowed, remaining, reset)| {
                format!(
                    "{} {remaining} left, reset {reset} ms",
                    if *allowed { "allowed" } else { "denied" }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// A row whose state holds a window's count runs within one window of an hour:
    /// waits for the next one when less than `need` is left of this one.
    fn align(&self, need: Duration) {
        if !self.windowed_state {
            return;
        }
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970");
        let into = Duration::from_millis((since.as_millis() % HOUR.as_millis()) as u64);
        if HOUR - into < need {
            std::thread::sleep(HOUR - into + Duration::from_millis(200));
        }
    }
}

/// The integers of a store's reply as `redis-cli` prints it (raw, then a newline): one
/// integer as text, or more packed into one string, read as the store reads them.
fn reply_integers(out: &[u8]) -> Vec<i64> {
    let out = out.strip_suffix(b"\n").unwrap_or(out);
    let reply = match std::str::from_utf8(out).ok().and_then(|s| s.parse().ok()) {
        Some(n) => redlimit::redis::Value::Int(n),
        None => redlimit::redis::Value::BulkString(out.to_vec()),
    };
    <RedisStore as RedisStoreInternals>::reply_integers(reply)
        .unwrap_or_else(|| panic!("a store's reply: {out:?}"))
}

/// A reply's packed outcomes, as (allowed, remaining, reset ms). Each is one integer,
/// `((reset * 2^25 + remaining) * 2 + allowed)`, a denial's retry after it; or -2 or
/// -1, an admission or a denial too wide to pack, then remaining, reset and retry
/// (src/store/redis/contract).
fn unpack(fields: &[i64]) -> Vec<(bool, i64, i64)> {
    const REMAINING_BITS: u32 = 25;
    let mut out = Vec::new();
    let mut rest = fields.iter().copied();
    while let Some(first) = rest.next() {
        let mut next = || rest.next().expect("a packed outcome ends early");
        if first < 0 {
            assert!(first == -1 || first == -2, "a packed outcome: {fields:?}");
            let (remaining, reset, _retry) = (next(), next(), next());
            out.push((first == -2, remaining, reset));
            continue;
        }
        let allowed = first & 1 == 1;
        let remaining = (first >> 1) & ((1 << REMAINING_BITS) - 1);
        let reset = first >> (1 + REMAINING_BITS);
        if !allowed {
            next();
        }
        out.push((allowed, remaining, reset));
    }
    out
}

/// `redis-benchmark` sends `args` `calls` times on `server` (as in
/// [`instructions_per_call`]).
fn bench_calls(server: &Server, args: &[String], calls: u64) {
    let out = Command::new("redis-benchmark")
        .args(["-p", &server.port().to_string(), "-c", "4", "-P", "16"])
        .args(["-r", &SUBJECTS.to_string(), "-n", &calls.to_string(), "-q"])
        .args(args)
        .output()
        .expect("redis-benchmark must be installed (Debian: redis-tools)");
    assert!(out.status.success(), "redis-benchmark failed");
}

fn rows(store: &RedisStore, smallest_sha: &str) -> Vec<Row> {
    let minute = Duration::from_secs(60);
    let policy = |p: Result<Policy, redlimit::PolicyError>| p.expect("a valid policy");
    let limiter = |policies: Vec<Policy>| {
        policies
            .into_iter()
            .fold(Limiter::builder(MemoryStore::new()), |l, p| l.policy(p))
            .build()
            .expect("policies named apart")
    };
    let fixed = || policy(Policy::fixed_window("p", 1_000_000, HOUR));
    let sliding = || policy(Policy::sliding_window("p", 1_000_000, HOUR));
    let in_flight = || policy(Policy::in_flight("q", 100, SLOT_TTL));
    // Eight instances of one limiter: the same set (one key per policy), each set its
    // own holder. The first is the one whose calls are counted.
    let instances: Vec<_> = (0..8)
        .map(|_| limiter(vec![fixed(), in_flight()]))
        .collect();
    let sets: Vec<_> = instances.iter().map(|l| l.policy_set().clone()).collect();
    assert!(
        sets.iter().all(|s| s.key_tag() == sets[0].key_tag()),
        "one set"
    );
    let me = &sets[0];
    let check = |set| render(store, set, Operation::Check, 1);
    let keys = |set: &redlimit::internals::PolicySet| -> Vec<String> {
        set.policies()
            .iter()
            .map(|p| store.key(&Subject::new(MARK), set, p))
            .collect()
    };
    let in_flight_key = keys(me)[1].clone();
    // The others' checks first, then this instance's: its entry is the last.
    let holders =
        |n: usize| -> Vec<Vec<String>> { sets[1..n].iter().chain([me]).map(check).collect() };
    let plain = limiter(vec![policy(Policy::fixed_window("p", 1_000_000, minute))]);
    let fw_limiter = limiter(vec![fixed()]);
    let fw = fw_limiter.policy_set();
    let sw_limiter = limiter(vec![sliding()]);
    let sw = sw_limiter.policy_set();
    let row = |label: &str, args, prepare, copy, windowed_state, expect| Row {
        label: label.to_owned(),
        args,
        prepare,
        copy,
        windowed_state,
        expect,
    };
    let mut out = vec![
        row(
            "smallest fixed-window script (TIME + INCR + PEXPIRE), the reference",
            vec![
                "EVALSHA".to_owned(),
                smallest_sha.to_owned(),
                "1".to_owned(),
                format!("rl:{{{MARK}}}:p:fw"),
                "60000".to_owned(),
            ],
            vec![],
            vec![],
            false,
            None,
        ),
        row(
            "plain check, fixed window (as in the first table)",
            check(plain.policy_set()),
            vec![],
            vec![],
            false,
            Some((0, 999_999)),
        ),
        row(
            "check, fixed window (1 h) + in-flight (100, 5 min): no state (the first request)",
            check(me),
            vec![],
            vec![],
            false,
            Some((1, 99)),
        ),
        row(
            "check, fixed window + in-flight: 1 holder in the state (this instance's)",
            check(me),
            holders(1),
            vec![in_flight_key.clone()],
            false,
            Some((1, 98)),
        ),
        row(
            "check, fixed window + in-flight: 8 holders in the state (7 instances' and this one's)",
            check(me),
            holders(8),
            vec![in_flight_key.clone()],
            false,
            Some((1, 91)),
        ),
    ];
    for (op, name) in [
        (Operation::Release, "release"),
        (Operation::Renew, "renewal (holding 1)"),
    ] {
        for (n, remaining) in [
            (1usize, if op == Operation::Release { 99 } else { 98 }),
            (8, if op == Operation::Release { 92 } else { 91 }),
        ] {
            out.push(row(
                &format!(
                    "{name}, fixed window + in-flight: {n} holder{} in the state",
                    if n == 1 { "" } else { "s" }
                ),
                render(store, me, op, 1),
                holders(n),
                keys(me),
                true,
                // A holder's change is answered for the in-flight policy alone.
                Some((0, remaining)),
            ));
        }
    }
    for (set, algorithm) in [(fw, "fixed window"), (sw, "sliding window")] {
        for (op, name) in [(Operation::Charge, "charge"), (Operation::Refund, "refund")] {
            out.push(row(
                &format!("settlement: {name} of 3 after a check of 5, {algorithm}"),
                render(store, set, op, 3),
                vec![render(store, set, Operation::Check, 5)],
                keys(set),
                true,
                None,
            ));
        }
    }
    // The counted calls' subjects: redis-benchmark's random 12-digit numbers.
    for row in &mut out {
        row.args = for_subject(&row.args, "__rand_int__");
    }
    out
}

/// The in-flight policy's check, its release and renewal, and the settlements of a
/// reservation, each beside the plain check and the smallest script: Redis
/// instructions per call (callgrind), Redis CPU per call (a server without valgrind,
/// `INFO` deltas over rounds), and the bytes of an in-flight state.
fn in_flight_and_settlements() {
    let started = Instant::now();
    let library = RedisStore::function_library();
    let load = |server: &Server| -> String {
        let loaded = server.cli(&["FUNCTION", "LOAD", "REPLACE", library]);
        assert!(
            loaded.trim().starts_with("redlimit_"),
            "FUNCTION LOAD: {loaded}"
        );
        server.cli(&["SCRIPT", "LOAD", SMALLEST]).trim().to_owned()
    };
    let server = Server::start("lua-cost-in-flight");
    let sha = load(&server);
    let pool = redlimit::deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))
        .expect("a pool");
    let store = RedisStore::new(pool);
    let rows = rows(&store, &sha);

    // Instructions, one turn each (they do not move with the load).
    let mut instructions = Vec::new();
    for row in &rows {
        row.align(Duration::from_secs(240));
        let at = Instant::now();
        let mut reply = String::new();
        let (total, ()) = server.instructions_after(
            || {
                row.setup(&server);
                reply = row.verify(&server);
            },
            || bench_calls(&server, &row.args, CALLS),
        );
        assert!(
            at.elapsed() < SLOT_TTL - Duration::from_secs(10),
            "{}: the copied entries expired during the turn ({:?})",
            row.label,
            at.elapsed()
        );
        eprintln!(
            "lua_cost: {} -> reply on the probe: {reply} ({:.0} s)",
            row.label,
            at.elapsed().as_secs_f64()
        );
        instructions.push(total as f64 / CALLS as f64);
    }
    drop(server);

    // CPU seconds, rows in rotation, CPU_ROUNDS rounds.
    let cpu_rounds = std::env::var("LUA_COST_CPU_ROUNDS").map_or(CPU_ROUNDS, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("LUA_COST_CPU_ROUNDS={v:?}: a count"))
    });
    let native = Server::start_native("lua-cost-in-flight");
    load(&native);
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for round in 0..cpu_rounds {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.rotate_left(round % rows.len());
        for i in order {
            let row = &rows[i];
            row.align(Duration::from_secs(5));
            let seconds = native.cpu_seconds_after(
                || {
                    row.setup(&native);
                    row.verify(&native);
                },
                || bench_calls(&native, &row.args, CPU_CALLS),
            );
            cpu[i].push(seconds * 1e6 / CPU_CALLS as f64);
        }
    }

    let cpu_how = if cpu_rounds == 0 {
        "CPU: not measured (LUA_COST_CPU_ROUNDS=0)".to_owned()
    } else {
        format!(
            "CPU: redis-server without valgrind, INFO used_cpu_sys_main_thread + \
             used_cpu_user_main_thread delta over {CPU_CALLS} calls, {cpu_rounds} rounds in \
             rotation, median (min-max)"
        )
    };
    println!(
        "\nIn-flight policies and settlements: Redis per call (instructions: callgrind, {CALLS} calls; \
         {cpu_how}); redis-benchmark -c 4 -P 16 -r {SUBJECTS}; the states a row finds written for \
         every subject\n"
    );
    println!("| call | instructions | / plain check | / smallest script | Redis CPU per call, µs | CPU / smallest, same round |");
    println!("|---|---|---|---|---|---|");
    let (smallest, plain) = (instructions[0], instructions[1]);
    for (i, row) in rows.iter().enumerate() {
        let ratios: Vec<f64> = cpu[i].iter().zip(&cpu[0]).map(|(a, b)| a / b).collect();
        let (lo, hi) = spread(&cpu[i]);
        let (rlo, rhi) = spread(&ratios);
        let cpu = if cpu_rounds == 0 {
            "not measured | not measured".to_owned()
        } else {
            format!(
                "{:.2} ({lo:.2}-{hi:.2}) | {:.2}x ({rlo:.2}-{rhi:.2})",
                median(&cpu[i]),
                median(&ratios)
            )
        };
        println!(
            "| {} | {:.0} | {:.2}x | {:.2}x | {cpu} |",
            row.label,
            instructions[i],
            instructions[i] / plain,
            instructions[i] / smallest,
        );
    }

    // Memory: one state copied to every subject, `used_memory` delta / subjects, and
    // `MEMORY USAGE` of the probe's key.
    println!("\n| key (its state as the store wrote it) | MEMORY USAGE, B | used_memory delta / {SUBJECTS} subjects, B | state bytes (STRLEN) |");
    println!("|---|---|---|---|");
    // (MEMORY USAGE, used_memory delta per subject) of each key.
    let mut sizes: Vec<(f64, f64)> = Vec::new();
    for (label, i, key) in [
        ("fixed window, one check", 1usize, 0usize),
        ("in-flight, 1 holder", 3, 0),
        ("in-flight, 8 holders", 4, 0),
    ] {
        let row = &rows[i];
        native.cli(&["FLUSHALL"]);
        for cmd in &row.prepare {
            let args = for_subject(cmd, PROBE);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            native.cli(&refs);
        }
        let copy = if row.copy.is_empty() {
            // The plain check's only key.
            let args: Vec<String> = row
                .args
                .iter()
                .map(|a| a.replace("__rand_int__", PROBE))
                .collect();
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            native.cli(&refs);
            row.args[3].replace("__rand_int__", MARK)
        } else {
            row.copy[key].clone()
        };
        let probe_key = copy.replace(MARK, PROBE);
        let usage = native.cli(&["MEMORY", "USAGE", &probe_key]);
        let strlen = native.cli(&["STRLEN", &probe_key]);
        let before = native.used_memory();
        let only = Row {
            label: label.to_owned(),
            args: vec![],
            prepare: vec![],
            copy: vec![copy],
            windowed_state: false,
            expect: None,
        };
        only.setup(&native);
        let after = native.used_memory();
        let per_subject = (after - before) as f64 / SUBJECTS as f64;
        println!(
            "| {label} (`{}`) | {} | {per_subject:.1} | {} |",
            probe_key,
            usage.trim(),
            strlen.trim()
        );
        let usage: f64 = usage
            .trim()
            .parse()
            .expect("MEMORY USAGE of the probe's key");
        sizes.push((usage, per_subject));
    }
    // `used_memory` moves by a few bytes per 100,000 keys between identical runs.
    let jitter = 1.0;
    let ((fixed_usage, fixed), (one_usage, one)) = (sizes[0], sizes[1]);
    println!(
        "\n- an in-flight key with 1 holder (1 slot) no larger than a fixed-window key: MEMORY USAGE \
         {one_usage:.0} B <= {fixed_usage:.0} B, used_memory {one:.1} B <= {fixed:.1} B per subject \
         (within {jitter} B of jitter): {}",
        if one_usage <= fixed_usage && one <= fixed + jitter {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "\nin-flight section: {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}
