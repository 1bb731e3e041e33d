//! A loopback TCP forwarder: what a proxy, a DNS name or a network link is to the
//! client behind it. A test moves it to another server as a proxy in front of a
//! primary would at a failover, cuts the sessions it carries, or holds every byte
//! either side sends (a link that stalls, as a replication link over a network can).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long connecting to the target may take: it is on loopback, so a refusal is
/// immediate and a live server accepts at once.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Listens on a free loopback port and forwards every connection to the target
/// server's port, byte for byte, until dropped.
#[derive(Debug)]
pub struct Forwarder {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    target: AtomicU16,
    stop: AtomicBool,
    /// While set, what either side sends is kept, not delivered.
    hold: AtomicBool,
    /// Bytes kept while holding, over every session and both directions.
    held: AtomicUsize,
    /// Each session's two sockets, to cut them.
    sessions: Mutex<Vec<(TcpStream, TcpStream)>>,
    accepted: AtomicUsize,
}

impl Forwarder {
    /// Forwards to `127.0.0.1:<target>`.
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("no free loopback port");
        let port = listener.local_addr().expect("a bound listener").port();
        listener
            .set_nonblocking(true)
            .expect("cannot make a listener non-blocking");
        let shared = Arc::new(Shared {
            target: AtomicU16::new(target),
            ..Shared::default()
        });
        let accept = std::thread::spawn({
            let shared = Arc::clone(&shared);
            move || accept_loop(&listener, &shared)
        });
        Self {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A deadpool-redis pool on the forwarder, as an application would build it for
    /// the address of its Redis.
    pub fn pool(&self) -> deadpool_redis::Pool {
        deadpool_redis::Config::from_url(self.url())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("cannot build a deadpool-redis pool")
    }

    /// New connections go to `127.0.0.1:<target>` from now on; the sessions open now
    /// stay with their server, as a proxy's established sessions do.
    pub fn switch_to(&self, target: u16) {
        self.shared.target.store(target, Ordering::SeqCst);
    }

    /// Closes every session open now, both sides (a proxy dropping the sessions to a
    /// server it marked down).
    pub fn cut(&self) {
        let sessions = std::mem::take(
            &mut *self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (client, server) in sessions {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// From now on, what either side sends is kept and never delivered (dropped with
    /// its session): a link that stalls, both ways.
    pub fn hold(&self) {
        self.shared.hold.store(true, Ordering::SeqCst);
    }

    /// Bytes kept since [`Forwarder::hold`].
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, shared.target.load(Ordering::SeqCst)));
        // A target that refuses: the client sees its connection closed, as behind a
        // proxy whose server is down.
        let Ok(server) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
            drop(client);
            continue;
        };
        let pair = (|| {
            client.set_nonblocking(false)?;
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            // (read, write) for each direction.
            Ok::<_, std::io::Error>((
                (client.try_clone()?, server.try_clone()?),
                (server.try_clone()?, client.try_clone()?),
            ))
        })();
        let Ok(((client_r, server_w), (server_r, client_w))) = pair else {
            continue;
        };
        shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((client, server));
        let up = Arc::clone(shared);
        std::thread::spawn(move || pump(client_r, server_w, &up));
        let down = Arc::clone(shared);
        std::thread::spawn(move || pump(server_r, client_w, &down));
    }
}

/// Copies `from` to `to` until either side ends, then closes both; what arrives
/// while the forwarder holds is kept (counted), not delivered.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if shared.hold.load(Ordering::SeqCst) {
            shared.held.fetch_add(n, Ordering::SeqCst);
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
