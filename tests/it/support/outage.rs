//! Watching clients during an outage: a listener on a dead server's port that counts
//! every connection attempt and drops it, so a test can tell a paced reconnection
//! from a reconnect storm.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Accepts and closes every connection to some loopback ports, counting them, until
/// dropped (which frees the ports for the servers to come back on).
#[derive(Debug)]
pub struct ConnectionCounter {
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl ConnectionCounter {
    /// Listens on `ports`, which must be free (their servers stopped).
    pub fn listen(ports: impl IntoIterator<Item = u16>) -> Self {
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = ports
            .into_iter()
            .map(|port| {
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap_or_else(|e| {
                    panic!("cannot listen on the dead server's port {port}: {e}")
                });
                listener
                    .set_nonblocking(true)
                    .expect("cannot make a listener non-blocking");
                let (count, stop) = (Arc::clone(&count), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((stream, _)) => {
                                count.fetch_add(1, Ordering::Relaxed);
                                drop(stream);
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(1)),
                        }
                    }
                })
            })
            .collect();
        Self {
            count,
            stop,
            threads,
        }
    }

    /// Connections attempted so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for ConnectionCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
