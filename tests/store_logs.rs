//! What a Redis store says on the default output of a program with a plain
//! `tracing_subscriber::fmt()` subscriber: a store that cannot connect warns, naming
//! the host and port it connects to, and says once, at info, when Redis answers
//! again; a healthy store says nothing at warn.
//!
//! A program of its own: its subscriber is the global default, as an application's
//! is. (`tracing` caches per call site whether anyone listens; a subscriber scoped to
//! one test thread can miss the lines that another test's thread reached first.)

#[path = "it/support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redlimit::{Error, Limiter, Policy, RedisStore};
use support::RedisServer;

/// What the program's subscriber wrote, formatted as `tracing_subscriber::fmt()`
/// writes it (without colours).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The global subscriber's buffer, installed once.
    fn installed() -> &'static Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .init();
            logs
        })
    }

    fn lines_at(&self, level: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines()
            .filter(|line| line.contains(level))
            .map(str::to_owned)
            .collect()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn policy() -> Policy {
    Policy::fixed_window("logs", 100, Duration::from_secs(60)).unwrap()
}

/// The issue's own case: `RedisStore::new(pool)` for `redis://127.0.0.1:1/`.
#[tokio::test]
async fn a_store_on_a_pool_for_a_closed_port_names_it_in_its_warning() {
    let logs = Logs::installed();
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1/")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let limiter = Limiter::new(RedisStore::new(pool), policy());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(
            matches!(limiter.check("a", 1).await, Err(Error::Store(_))),
            "nothing listens on port 1"
        );
        let warned = logs.lines_at(" WARN ");
        if warned
            .iter()
            .any(|l| l.contains("cannot connect to Redis at 127.0.0.1:1;"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no warning within 5 s:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_store_warns_with_its_address_and_says_when_redis_answers_again() {
    let logs = Logs::installed();
    let mut server = RedisServer::start();
    let port = server.port();
    let address = format!("127.0.0.1:{port}");
    let mine = |level: &str| -> Vec<String> {
        logs.lines_at(level)
            .into_iter()
            .filter(|l| l.contains(&address))
            .collect()
    };
    for store in [
        RedisStore::new(server.pool()),
        RedisStore::from_url(&server.url()).unwrap(),
    ] {
        let before = (mine(" WARN ").len(), mine(" INFO ").len());
        let limiter = Limiter::new(store.timeout(Duration::from_millis(200)), policy());
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        // The control: a healthy store says nothing at warn.
        assert_eq!(mine(" WARN ").len(), before.0, "{}", logs.text());

        server.stop();
        let unreachable = format!("cannot connect to Redis at {address};");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !mine(" WARN ").iter().any(|l| l.contains(&unreachable)) {
            assert!(
                Instant::now() < deadline,
                "no warning within 5 s:\n{}",
                logs.text()
            );
            assert!(
                matches!(limiter.check("a", 1).await, Err(Error::Store(_))),
                "a stopped Redis decided"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(mine(" INFO ").len(), before.1, "{}", logs.text());

        server.restart();
        let deadline = Instant::now() + Duration::from_secs(5);
        while limiter.check("a", 1).await.is_err() {
            assert!(Instant::now() < deadline, "not decided again within 5 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..5 {
            assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        }
        let back: Vec<String> = mine(" INFO ")
            .into_iter()
            .skip(before.1)
            .filter(|l| l.contains("answers again"))
            .collect();
        assert_eq!(back.len(), 1, "{}", logs.text());
        assert!(
            back[0].contains(&format!("Redis at {address} answers again")),
            "{back:?}"
        );
    }
}
