//! A `redis-server` of the measuring programs' own, on a free loopback port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A `redis-server` on a free loopback port, stopped on drop.
pub struct Server {
    pub port: u16,
    child: Child,
}

impl Server {
    pub fn start() -> Result<Self, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self { port, child })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn version(&self) -> String {
        let out = Command::new("redis-server").arg("--version").output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .unwrap_or("?")
                .to_owned()
        })
        .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
