//! What the store knows of its connection's reads: when it last heard from Redis,
//! and, on a connection the store opened itself, the reading itself.
//!
//! A redis multiplexed connection is driven by one future that writes the calls
//! and reads the replies. Spawned as a task of its own (as the application's pool
//! does it), its reads wait for that task's turn: on a starved runtime or host, a
//! call's timer can fire while its reply sits unread in the socket, and Redis looks
//! silent when it is not. On the store's own connection ([`Reader`]) the driving
//! future is the store's: a call whose timer fired drives it once itself before it
//! judges, so a reply that arrived is read, and is a decision.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// When a call's time started, and how much the connection had delivered by then.
#[derive(Debug, Clone, Copy)]
pub(in crate::store::redis) struct Since {
    pub(in crate::store::redis) at: tokio::time::Instant,
    pub(in crate::store::redis) heard: u64,
}

/// Signs of life of the store's connection, shared with the socket it reads.
#[derive(Debug)]
pub(in crate::store::redis) struct Activity {
    /// Time origin of `last_ms`.
    epoch: Instant,
    /// Counts what the connection delivered: reads from the socket (the store's own
    /// connection) and replies read by calls (every connection). A call that finds it
    /// unchanged over its timeout met a Redis that said nothing.
    heard: AtomicU64,
    /// When the connection last delivered anything, in ms since `epoch`.
    last_ms: AtomicU64,
    /// Bytes written to the socket: a call that had to write them itself knows Redis
    /// had not been asked yet.
    written: AtomicU64,
}

impl Activity {
    pub(in crate::store::redis) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            heard: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            written: AtomicU64::new(0),
        }
    }

    /// Something arrived from Redis.
    pub(in crate::store::redis) fn heard_now(&self) {
        self.heard.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        // Written only when it changes: every reply passes here.
        if self.last_ms.load(Ordering::Relaxed) != now {
            self.last_ms.store(now, Ordering::Relaxed);
        }
    }

    fn wrote(&self, written: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = written {
            self.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
    }

    /// How many bytes the store's own connection has written.
    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// How many times the connection has delivered something.
    pub(in crate::store::redis) fn heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    /// A new connection starts its silence now.
    pub(in crate::store::redis) fn reset_silence(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the connection last delivered anything.
    pub(in crate::store::redis) fn silent_ms(&self) -> u64 {
        self.now_ms()
            .saturating_sub(self.last_ms.load(Ordering::Relaxed))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

pin_project! {
    /// A socket that tells [`Activity`] whenever it reads something.
    pub(in crate::store::redis) struct Heard<S> {
        #[pin]
        inner: S,
        activity: Arc<Activity>,
    }
}

impl<S> Heard<S> {
    pub(in crate::store::redis) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<S: AsyncRead> AsyncRead for Heard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let read = this.inner.poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.heard_now();
        }
        read
    }
}

impl<S: AsyncWrite> AsyncWrite for Heard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let written = this.inner.poll_write(cx, buf);
        this.activity.wrote(&written);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let written = this.inner.poll_write_vectored(cx, bufs);
        this.activity.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

type Driver = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The future that drives the store's own connection (writes its calls, reads its
/// replies), polled by a task of its own and, when a call's timer fires, by that
/// call ([`Reader::read_now`]).
pub(in crate::store::redis) struct Reader {
    /// `None` once the connection is closed (every handle dropped, or the socket
    /// failed).
    driver: Mutex<Option<Driver>>,
    /// The driving task's waker: woken after a call drove the future, since that poll
    /// left the call's (no-op) waker where the task's was.
    task: Mutex<Option<Waker>>,
    /// The same socket (a duplicate handle), to see whether bytes wait in it unread:
    /// the runtime learns of them only when its reactor next runs.
    peek: Option<std::net::TcpStream>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

/// What [`Reader::read_now`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::redis) enum Read {
    /// It read (and wrote) what it could, and nothing else waits.
    Done,
    /// The driving task is reading at this very moment.
    Busy,
    /// It wrote calls that had waited unwritten (the driving task had not run):
    /// Redis is only now asked.
    Wrote,
    /// Bytes from Redis wait in the socket that the runtime has not yet seen (its
    /// reactor has not run since they came): Redis answered.
    Waiting,
}

impl Reader {
    /// Drives `driver` in a task of its own, on the current Tokio runtime.
    pub(in crate::store::redis) fn spawn(
        driver: impl Future<Output = ()> + Send + 'static,
        peek: Option<std::net::TcpStream>,
    ) -> Arc<Self> {
        let reader = Arc::new(Self {
            driver: Mutex::new(Some(Box::pin(driver))),
            task: Mutex::new(None),
            peek,
        });
        let task = Arc::clone(&reader);
        tokio::spawn(std::future::poll_fn(move |cx| task.drive(cx)));
        reader
    }

    /// The driving task's poll. A call that is driving the future at this moment
    /// wakes the task when it is done, so the task never waits on the lock.
    fn drive(&self, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut driver = match self.driver.try_lock() {
            Ok(driver) => driver,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Poll::Pending,
        };
        poll_driver(&mut driver, cx, false)
    }

    /// Whether bytes from Redis wait in the socket, read by nobody yet (a syscall:
    /// for a call about to judge Redis silent, not for every call).
    pub(in crate::store::redis) fn waiting(&self) -> bool {
        let mut byte = [0u8; 1];
        self.peek
            .as_ref()
            .is_some_and(|socket| matches!(socket.peek(&mut byte), Ok(n) if n > 0))
    }

    /// Drives the connection once on the caller's task: what arrived is read and
    /// handed to its calls, what waits is written. Unconstrained by the caller's
    /// cooperative budget, which a call that waited long may have spent.
    pub(in crate::store::redis) fn read_now(&self, activity: &Activity) -> Read {
        let written = activity.written();
        let mut driver = match self.driver.try_lock() {
            Ok(driver) => driver,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Read::Busy,
        };
        let mut cx = Context::from_waker(Waker::noop());
        let _ = poll_driver(&mut driver, &mut cx, true);
        drop(driver);
        // The poll left the no-op waker on the socket and the calls' channel: the
        // task polls again and puts its own back.
        if let Some(task) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            task.wake_by_ref();
        }
        if activity.written() != written {
            Read::Wrote
        } else if self.waiting() {
            Read::Waiting
        } else {
            Read::Done
        }
    }
}

/// Polls the driving future, within the task's cooperative budget or, for a call
/// that drives it, `unconstrained`.
fn poll_driver(driver: &mut Option<Driver>, cx: &mut Context<'_>, unconstrained: bool) -> Poll<()> {
    let Some(future) = driver.as_mut() else {
        return Poll::Ready(());
    };
    let polled = if unconstrained {
        Pin::new(&mut tokio::task::unconstrained(future.as_mut())).poll(cx)
    } else {
        future.as_mut().poll(cx)
    };
    match polled {
        Poll::Ready(()) => {
            *driver = None;
            Poll::Ready(())
        }
        Poll::Pending => Poll::Pending,
    }
}
