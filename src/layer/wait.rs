//! Waiting instead of refusing ([`OverLimit::Wait`](crate::layer::OverLimit::Wait)): the
//! settings ([`Wait`]), and the places a layer counts its waiting requests in ([`Room`],
//! [`Place`]). The wait itself is the limiter's
//! ([`Limiter::check_within`](crate::Limiter::check_within)'s loop): a request's place
//! tells it how much waits ahead of it, and is freed when its wait ends.
//!
//! None of it exists for a layer that does not wait: its [`Room`] is made by
//! [`RateLimitLayer::over_limit`](crate::RateLimitLayer::over_limit), and a request only
//! gets a place once the limiter has denied it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::decision::Decision;
use crate::error::Error;
use crate::limiter::{may_wait, wait_turn, Limiter, Turn};
use crate::store::Store;
use crate::subject::Subject;

/// How long a request over its limit may wait for its turn, and how many may wait at
/// once: the settings of [`OverLimit::Wait`](crate::layer::OverLimit::Wait).
///
/// ```
/// use std::time::Duration;
/// use redlimit::layer::Wait;
///
/// let wait = Wait::up_to(Duration::from_millis(500)).per_subject(4).per_instance(256);
/// assert_eq!(wait.max_wait(), Duration::from_millis(500));
/// ```
///
/// Every value is accepted and means what it says: `per_subject(0)` or
/// `per_instance(0)` lets nobody wait (every request over its limit is refused, as
/// without waiting), `usize::MAX` sets no bound of its own, `Duration::ZERO` holds only
/// a request whose time has already come, and `Duration::MAX` has no deadline (a request
/// waits as long as the limiter says, however long that is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    max_wait: Duration,
    per_subject: usize,
    per_instance: usize,
}

impl Wait {
    /// How many requests of one subject may wait at once on a layer, by default.
    ///
    /// Waiting smooths a short burst over the limit; a subject with more than 16
    /// requests over it at once is a client that does not slow down, and each of its
    /// waiting requests holds a connection and its request on this instance. 16 also
    /// keeps one subject from taking more than a sixty-fourth of the instance's places.
    pub const DEFAULT_PER_SUBJECT: usize = 16;

    /// How many requests may wait at once on a layer, all subjects together, by default.
    ///
    /// Each holds its request (the head and the body not yet read) and about 1 KB of the
    /// layer's own (two boxes: what its answer needs, and its wait with its timer and
    /// its place): 1024 bound the layer's share to about a megabyte beside the
    /// requests, and the connections held to far fewer than a server's usual
    /// file-descriptor limit.
    pub const DEFAULT_PER_INSTANCE: usize = 1024;

    /// Requests whose time comes within `max_wait` of their denial wait for it; the
    /// others are refused. [`Wait::DEFAULT_PER_SUBJECT`] and
    /// [`Wait::DEFAULT_PER_INSTANCE`] bound how many wait.
    pub const fn up_to(max_wait: Duration) -> Self {
        Self {
            max_wait,
            per_subject: Self::DEFAULT_PER_SUBJECT,
            per_instance: Self::DEFAULT_PER_INSTANCE,
        }
    }

    /// How many requests of one subject (of one limiter) may wait at once on the layer;
    /// the next one is refused at once.
    #[must_use]
    pub const fn per_subject(mut self, n: usize) -> Self {
        self.per_subject = n;
        self
    }

    /// How many requests may wait at once on the layer, all subjects together; the next
    /// one is refused at once.
    #[must_use]
    pub const fn per_instance(mut self, n: usize) -> Self {
        self.per_instance = n;
        self
    }

    /// The longest a request waits, counted from its first denial.
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The bound of one subject's waiting requests.
    pub const fn max_per_subject(&self) -> usize {
        self.per_subject
    }

    /// The bound of all waiting requests on the layer.
    pub const fn max_per_instance(&self) -> usize {
        self.per_instance
    }
}

/// A denied request's wait, boxed: it holds the limiter's calls and sleep, and the
/// request's place until it ends.
pub(crate) type Waiting = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send>>;

/// The requests waiting on one layer: how many in all, and per subject of each limiter
/// how many and what they cost together.
#[derive(Default)]
pub(crate) struct Room {
    waiting: AtomicUsize,
    queues: Mutex<HashMap<QueueKey, Queue>>,
}

/// A subject of one limiter (by the limiter's address: a layer's limiters live as long
/// as it does, and a place holds its limiter).
type QueueKey = (usize, Subject);

#[derive(Default)]
struct Queue {
    count: usize,
    cost: u64,
}

/// One waiting request's place: counted from when it starts to wait until it is
/// admitted, refused or dropped.
struct Place {
    room: Arc<Room>,
    key: QueueKey,
    cost: u64,
}

impl Room {
    /// Starts the wait of a request of `subject` costing `cost` that `limiter` denied
    /// (`denial`), in a place of its own; or gives the denial back when it may not wait:
    /// its time is past `max_wait`, no place is free, or there is no runtime to wait on.
    pub(crate) fn hold<S: Store>(
        self: &Arc<Self>,
        limiter: &Arc<Limiter<S>>,
        subject: Subject,
        cost: u32,
        denial: Decision,
        wait: &Wait,
    ) -> Result<Waiting, Decision> {
        if !may_wait(&denial, wait.max_wait) {
            return Err(denial);
        }
        let key = (Arc::as_ptr(limiter) as usize, subject.clone());
        let Some((place, ahead)) = self.enter(key, u64::from(cost), wait) else {
            return Err(denial);
        };
        let turn = Turn::new(denial, wait.max_wait);
        let others = move || place.others();
        let limiter = Arc::clone(limiter);
        Ok(Box::pin(wait_turn(
            limiter, subject, cost, turn, ahead, others,
        )))
    }

    /// A place for a request of `key` costing `cost`, with the cost of those waiting
    /// ahead of it; `None` when the subject or the layer has no place free.
    fn enter(self: &Arc<Self>, key: QueueKey, cost: u64, wait: &Wait) -> Option<(Place, u64)> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < wait.per_instance).then(|| n + 1)
            })
            .ok()?;
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = queues.entry(key.clone()).or_default();
        if queue.count >= wait.per_subject {
            if queue.count == 0 {
                queues.remove(&key);
            }
            drop(queues);
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let ahead = queue.cost;
        queue.count += 1;
        queue.cost = queue.cost.saturating_add(cost);
        drop(queues);
        let place = Place {
            room: Arc::clone(self),
            key,
            cost,
        };
        Some((place, ahead))
    }
}

impl Place {
    /// The cost of the others of this subject who wait now.
    fn others(&self) -> u64 {
        let queues = self
            .room
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        queues
            .get(&self.key)
            .map_or(0, |q| q.cost.saturating_sub(self.cost))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut queues = self
            .room
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = queues.get_mut(&self.key) {
            queue.count = queue.count.saturating_sub(1);
            queue.cost = queue.cost.saturating_sub(self.cost);
            if queue.count == 0 {
                queues.remove(&self.key);
            }
        }
        drop(queues);
        self.room.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}
