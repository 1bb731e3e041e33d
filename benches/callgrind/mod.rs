//! `redis-server` under `valgrind --tool=callgrind`, for the benches that count what a
//! decision costs Redis in instructions (`lua_cost`, `redis_cost`); another build with
//! `REDLIMIT_REDIS_SERVER`, as the tests take it (Redis 8: `bash .ci/redis8.sh`).
//!
//! Instruction counts do not drift with the load of a shared machine the way CPU
//! seconds do: ratios between contenders measured this way are repeatable to a
//! fraction of a percent. [`Server::instructions`] counts exactly the server's work
//! while a closure runs: zeroed (`callgrind_control --zero`) just before, dumped
//! (`--dump`) just after, with the flush and the statistics reset outside the count.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `redis-server` under callgrind on a free loopback port, killed on drop.
pub struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
    callgrind: bool,
}

impl Server {
    /// Starts the server (no persistence), in a temporary directory named after `bench`,
    /// and waits until it answers.
    pub fn start(bench: &str) -> Self {
        Self::spawn(bench, true)
    }

    /// The same server without valgrind, for what callgrind cannot measure: Redis's
    /// CPU seconds ([`Server::cpu_seconds_after`]) and memory.
    #[allow(dead_code)]
    pub fn start_native(bench: &str) -> Self {
        Self::spawn(&format!("{bench}-native"), false)
    }

    fn spawn(bench: &str, callgrind: bool) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = std::env::temp_dir().join(format!("redlimit-{bench}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        // The tests' server: `REDLIMIT_REDIS_SERVER` names another build (Redis 8:
        // `bash .ci/redis8.sh`).
        let server =
            std::env::var("REDLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let mut command = if callgrind {
            let mut c = Command::new("valgrind");
            c.arg("--tool=callgrind")
                .arg(format!("--callgrind-out-file={}/cg.out", dir.display()))
                .arg(&server);
            c
        } else {
            Command::new(&server)
        };
        let child = command
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("valgrind and redis-server must be installed (Debian: valgrind, redis-server)");
        let server = Self {
            child,
            port,
            dir,
            callgrind,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.cli(&["PING"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    #[allow(dead_code)]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    #[allow(dead_code)]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// One `redis-cli` command; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.cli_bytes(args)).into_owned()
    }

    /// One `redis-cli` command; its output as bytes (a reply string is printed raw).
    pub fn cli_bytes(&self, args: &[&str]) -> Vec<u8> {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli must be installed (Debian: redis-tools)")
            .stdout
    }

    /// The instructions the server executed while `work` ran, and what `work` returned.
    ///
    /// Before the count: `FLUSHALL` (every contender starts from an empty keyspace, so
    /// its calls create their subjects: the path that writes) and `CONFIG RESETSTAT`
    /// (errors and command counts from here on). After it: no call may have failed, for
    /// a failed call costs little and would flatter its contender. Command counts since
    /// the reset stay readable with [`Server::script_calls`].
    pub fn instructions<T>(&self, work: impl FnOnce() -> T) -> (u64, T) {
        self.cli(&["FLUSHALL"]);
        self.cli(&["CONFIG", "RESETSTAT"]);
        self.callgrind("--zero");
        let out = work();
        self.callgrind("--dump");
        let total = self.last_dump_total();
        let errors = self.cli(&["INFO", "errorstats"]);
        assert!(!errors.contains("errorstat_"), "calls failed: {errors}");
        (total, out)
    }

    /// [`Server::instructions`] with `setup` run after the `FLUSHALL` and outside the
    /// count: state the counted calls find (a subject's state written before). The
    /// setup runs with callgrind's instrumentation off (`--instr=off`), several times
    /// faster; instruction counts are the server's own, whatever valgrind translates.
    #[allow(dead_code)]
    pub fn instructions_after<T>(
        &self,
        setup: impl FnOnce(),
        work: impl FnOnce() -> T,
    ) -> (u64, T) {
        self.cli(&["FLUSHALL"]);
        self.callgrind("--instr=off");
        setup();
        self.callgrind("--instr=on");
        self.cli(&["CONFIG", "RESETSTAT"]);
        self.callgrind("--zero");
        let out = work();
        self.callgrind("--dump");
        let total = self.last_dump_total();
        let errors = self.cli(&["INFO", "errorstats"]);
        assert!(!errors.contains("errorstat_"), "calls failed: {errors}");
        (total, out)
    }

    /// Redis's main-thread CPU seconds (`INFO cpu`: `used_cpu_sys_main_thread` +
    /// `used_cpu_user_main_thread`, delta) while `work` ran, after a `FLUSHALL` and
    /// `setup` (outside the delta). No call may have failed, as for the instructions.
    #[allow(dead_code)]
    pub fn cpu_seconds_after(&self, setup: impl FnOnce(), work: impl FnOnce()) -> f64 {
        self.cli(&["FLUSHALL"]);
        setup();
        self.cli(&["CONFIG", "RESETSTAT"]);
        let before = self.main_thread_cpu();
        work();
        let after = self.main_thread_cpu();
        let errors = self.cli(&["INFO", "errorstats"]);
        assert!(!errors.contains("errorstat_"), "calls failed: {errors}");
        after - before
    }

    /// `used_cpu_sys_main_thread` + `used_cpu_user_main_thread`, in seconds.
    #[allow(dead_code)]
    fn main_thread_cpu(&self) -> f64 {
        let info = self.cli(&["INFO", "cpu"]);
        ["used_cpu_sys_main_thread:", "used_cpu_user_main_thread:"]
            .iter()
            .map(|field| {
                info.lines()
                    .find_map(|l| l.trim().strip_prefix(field))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("INFO cpu has {field}"))
            })
            .sum()
    }

    /// `INFO memory`'s `used_memory`, in bytes.
    #[allow(dead_code)]
    pub fn used_memory(&self) -> i64 {
        self.cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("used_memory:"))
            .and_then(|v| v.parse().ok())
            .expect("INFO memory has used_memory")
    }

    /// The script calls Redis ran since the last [`Server::instructions`] began
    /// (`FCALL`, `FCALL_RO`, `EVALSHA`, `EVAL`, from `INFO commandstats`): the number
    /// of calls as the server counts them.
    #[allow(dead_code)]
    pub fn script_calls(&self) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        stats
            .lines()
            .filter_map(|l| l.trim().strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                if !matches!(name, "fcall" | "fcall_ro" | "evalsha" | "eval") {
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

    fn callgrind(&self, what: &str) {
        assert!(self.callgrind, "a native server counts no instructions");
        let ok = Command::new("callgrind_control")
            .arg(what)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("callgrind_control (valgrind) must be installed")
            .success();
        assert!(ok, "callgrind_control {what} failed");
    }

    /// The `summary:` of the newest dump, and the dumps removed.
    fn last_dump_total(&self) -> u64 {
        let mut dumps: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .expect("the dump directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("cg.out."))
            })
            .collect();
        dumps.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        let newest = dumps.last().expect("callgrind wrote a dump");
        let total = summary(newest);
        for dump in dumps {
            let _ = std::fs::remove_file(dump);
        }
        total
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The total instruction count of a callgrind dump.
fn summary(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).expect("a callgrind dump");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .expect("a callgrind summary line")
}
