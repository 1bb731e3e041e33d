//! Plain checks that queue behind calls pipelined on the store's connection go to
//! Redis as one call that decides them all.
//!
//! A check that finds fewer than `max_pipelined` calls pipelined goes at once, as
//! its own call: at low load nothing waits. Past that, checks queue; when a call in
//! flight ends, the queue (up to `max_batch` checks) goes as one `FCALL` of the
//! library's batch function, sent by a task of its own so the caller whose call
//! ended is not held up, once the runtime has run what was ready (the checks of
//! requests that arrived meanwhile join the batch). Redis pays the call itself, its
//! parsing and its reply once per batch instead of once per check: what a
//! one-call-per-check design cannot shed.
//!
//! Each check of a batch is decided as its own call would be (all or nothing
//! across its own policies, exact), in the order the checks queued; a denial never
//! touches another check. A check whose caller went away before its batch left is
//! not sent. A batch's silence (see [`RedisStore::timeout`](super::RedisStore::timeout))
//! counts from when its first check queued, so being batched never lengthens the
//! wait for a silent Redis, and a batch whose Redis has been silent that long is not
//! sent at all. While Redis answers, a queued check waits for its turn however long
//! the queue ahead of it: the queue drains at Redis's pace, and a check is failed
//! for Redis's silence, never for its place in line. Past
//! [`RedisStore::max_queue`](super::RedisStore::max_queue) checks waiting, a new
//! check is shed at once ([`StoreErrorKind::Overloaded`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::command::{Batch, Call, Run};
use super::contract::reply::{decode, BatchReply, Checked, Reply};
use super::link::Link;
use super::queue::Waiting;
use super::reader::Since;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};

/// The most checks one call decides, by default: past about 32 a batch saves Redis
/// little more per check (BENCHMARKS.md), while one call holds Redis longer.
pub(super) const DEFAULT_MAX_BATCH: usize = 32;
/// The most checks one call may decide: the batch names each check's policy set in
/// one byte.
pub(super) const MAX_BATCH: usize = 255;
/// The most policy decisions one batch makes (but one check's, whatever its size): a
/// call that keeps Redis busy longer gains little more per decision, holds every other
/// client of Redis for longer, and on a contended CPU takes Redis several time slices,
/// which a reply must not wait through (32 checks of 17 policies each timed out beside
/// busy loops; 3 at a time did not).
const MAX_BATCH_DECISIONS: usize = 64;
/// The calls pipelined before checks queue, by default.
pub(super) const DEFAULT_MAX_IN_FLIGHT: usize = 2;
/// The most checks that wait for a batch, by default: a burst of this many at once
/// is decided (a few hundred bytes each while it waits).
pub(super) const DEFAULT_MAX_QUEUE: usize = 100_000;
/// A drained queue that held more than this many checks gives its memory back.
const KEEP_CAPACITY: usize = 1_024;

/// How checks are batched (see [`RedisStore::max_batch`](super::RedisStore::max_batch)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Batching {
    pub(super) max_batch: usize,
    pub(super) max_pipelined: usize,
    pub(super) max_queue: usize,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            max_pipelined: DEFAULT_MAX_IN_FLIGHT,
            max_queue: DEFAULT_MAX_QUEUE,
        }
    }
}

/// A check's future, boxed: what [`check`] returns.
pub(super) type CheckFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Decision, StoreError>> + Send>>;

/// Decides one plain check: at once when fewer than `max_pipelined` calls are in
/// flight (or the store does not batch), else in the next batch.
pub(super) fn check(
    link: Arc<Link>,
    call: Call<Run>,
    timeout: Duration,
    batching: Batching,
) -> CheckFuture {
    if link.batches() && batching.max_batch > 1 {
        Box::pin(batched(link, call, timeout, batching))
    } else {
        Box::pin(alone(None, link, call, timeout))
    }
}

/// A check on a store that batches. Under load most checks wait in the queue, and
/// this future holds no round trip of its own (248 bytes, where one with its round
/// trip inline is 1,920): a burst of 50,000 checks at once holds about 1.1 KB a
/// check while it waits, task and subject included, not 2.3-2.7 KB
/// (BENCHMARKS.md). A check that goes at once boxes its round trip apart.
async fn batched(
    link: Arc<Link>,
    call: Call<Run>,
    timeout: Duration,
    batching: Batching,
) -> Result<Decision, StoreError> {
    match enqueue(&link, call, timeout, batching) {
        Turn::Queued(decided) => decided.await.unwrap_or_else(|_| {
            link.count_dropped_batch();
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the batch of this check was dropped (its runtime shut down)",
            ))
        }),
        Turn::Shed => {
            let error = StoreError::new(
                StoreErrorKind::Overloaded,
                format!(
                    "{} checks already wait for Redis at {} (RedisStore::max_queue)",
                    batching.max_queue,
                    link.address()
                ),
            );
            link.count_failures(&error, 1);
            Err(error)
        }
        Turn::Now(call) => {
            // Taken here, before the box is made: a caller that goes away gives it up.
            let slot = Place::taken(Arc::clone(&link));
            Box::pin(alone(Some(slot), link, call, timeout)).await
        }
    }
}

/// One check as its own call, holding `slot` (a place among the calls pipelined)
/// until it ends or its caller goes away: the slot then goes to the checks queued
/// meanwhile. An `async` block, not an `async fn`: one keeps its arguments twice
/// (as given, and as the body's own), and this future is boxed for every such check.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
fn alone(
    slot: Option<Place>,
    link: Arc<Link>,
    call: Call<Run>,
    timeout: Duration,
) -> impl std::future::Future<Output = Result<Decision, StoreError>> + Send {
    async move {
        let _held = &slot;
        one(&link, &call, timeout, None).await
    }
}

/// When a check goes: now, alone, or in the next batch.
enum Turn {
    /// A place among the calls pipelined is taken for it.
    Now(Call<Run>),
    /// It waits in the queue; its decision arrives here.
    Queued(oneshot::Receiver<Result<Decision, StoreError>>),
    /// The queue is full: it is shed, undecided.
    Shed,
}

/// Takes a place among the calls pipelined for `call` (fewer than `max_pipelined`
/// are), or queues it for the next batch, or sheds it when `max_queue` wait already.
fn enqueue(link: &Link, call: Call<Run>, timeout: Duration, batching: Batching) -> Turn {
    let mut state = link.queue.lock();
    if state.in_flight < batching.max_pipelined.max(1) {
        state.in_flight += 1;
        return Turn::Now(call);
    }
    if state.waiting.len() >= batching.max_queue {
        return Turn::Shed;
    }
    let (answer, decided) = oneshot::channel();
    state.waiting.push_back(Waiting {
        call,
        answer,
        since: link.since(),
        timeout,
        max_batch: batching.max_batch.clamp(1, MAX_BATCH),
    });
    Turn::Queued(decided)
}

/// One check as its own call (an `async` block, as [`alone`] says why).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
fn one<'a>(
    link: &'a Arc<Link>,
    call: &'a Call<Run>,
    timeout: Duration,
    since: Option<Since>,
) -> impl std::future::Future<Output = Result<Decision, StoreError>> + Send + 'a {
    async move {
        let reply: Reply = decode(link.exchange(call, timeout, since, 1).await?)?;
        reply.decision_of(call.op(), &call.policies, call.cost)
    }
}

/// A place among the calls pipelined, held by a check that went at once: when it is
/// given up, the checks queued meanwhile take it, sent by a task of their own
/// ([`send_batches`]).
struct Place {
    link: Option<Arc<Link>>,
}

impl Place {
    fn taken(link: Arc<Link>) -> Self {
        Self { link: Some(link) }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some(link) = self.link.take() else {
            return;
        };
        {
            let mut state = link.queue.lock();
            if state.waiting.is_empty() {
                state.in_flight = state.in_flight.saturating_sub(1);
                return;
            }
        }
        let sending = Sending { link: Some(link) };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(send_batches(sending));
        }
        // Else `sending` is dropped here: no runtime to send on.
    }
}

/// The place among the calls pipelined that the task sending the queued checks
/// holds. Given up by [`next_batch`] when none wait; if the task is dropped first (its
/// runtime shut down, before or while it ran), every queued check gets an error
/// (its sender dropped) and the place is free again. Never a new task from here:
/// a runtime that drops what is spawned on it would drop it again.
struct Sending {
    link: Option<Arc<Link>>,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            let mut state = link.queue.lock();
            state.waiting.clear();
            state.in_flight = state.in_flight.saturating_sub(1);
        }
    }
}

/// The checks the next batch takes, in the order they queued: at most the first's
/// `max_batch`, at most [`MAX_BATCH_DECISIONS`] policies in all (one check at least),
/// all on the same kind of clock. `None` (and the slot given up) when none wait.
fn next_batch(link: &Link) -> Option<Vec<Waiting>> {
    let mut state = link.queue.lock();
    // Sized once: grown a check at a time, it was copied at 4, 8, 16 and 32.
    let mut batch: Vec<Waiting> = Vec::with_capacity(state.waiting.len().min(MAX_BATCH_DECISIONS));
    let (mut client_clock, mut max, mut decisions) = (false, 1, 0);
    while let Some(next) = state.waiting.front() {
        // A check whose caller went away is not sent: no one waits for its decision.
        if next.answer.is_closed() {
            state.waiting.pop_front();
            continue;
        }
        let policies = next.call.policies.len();
        if batch.is_empty() {
            (client_clock, max) = (next.call.now_ms.is_some(), next.max_batch);
        } else if batch.len() >= max
            || next.call.now_ms.is_some() != client_clock
            || decisions + policies > MAX_BATCH_DECISIONS
        {
            break;
        }
        decisions += policies;
        batch.extend(state.waiting.pop_front());
    }
    // After a burst, the memory it queued in goes back, as soon as the last batch
    // takes the last check (before any of them is answered, so a caller that saw
    // every answer sees the memory back too: beside busy loops, the sending task's
    // next look at the empty queue came after them).
    if state.waiting.is_empty() && state.waiting.capacity() > KEEP_CAPACITY {
        state.waiting = VecDeque::new();
    }
    if batch.is_empty() {
        state.in_flight = state.in_flight.saturating_sub(1);
        return None;
    }
    Some(batch)
}

/// Sends the queued checks, a batch at a time, while checks keep queuing. Before each
/// batch it lets the runtime run what is ready (one yield): the tasks its last reply
/// woke, the requests that arrived meanwhile, whose checks then join this batch
/// instead of the next. Under HTTP load that is a fifth fewer calls, and about a
/// tenth less Redis CPU a request (BENCHMARKS.md); a check that finds a place free
/// never waits for it.
async fn send_batches(mut sending: Sending) {
    let Some(link) = sending.link.clone() else {
        return;
    };
    loop {
        tokio::task::yield_now().await;
        match next_batch(&link) {
            Some(batch) => send(&link, batch).await,
            None => {
                // `next_batch` gave the place up.
                sending.link = None;
                return;
            }
        }
    }
}

/// One batch's round trip, each check's decision sent to its caller.
async fn send(link: &Arc<Link>, mut batch: Vec<Waiting>) {
    let Some((since, timeout)) = batch.first().map(|w| (w.since, w.timeout)) else {
        return;
    };
    if link.silent_since(since, timeout) {
        // Redis has said nothing since these checks queued: sending them now would
        // only add calls that may run after their callers gave up.
        let error = link.silent_error(timeout);
        link.count_failures(&error, batch.len() as u64);
        for w in batch {
            let _ = w.answer.send(Err(error.duplicate()));
        }
        return;
    }
    if batch.len() == 1 {
        if let Some(w) = batch.pop() {
            let decided = one(link, &w.call, w.timeout, Some(w.since)).await;
            let _ = w.answer.send(decided);
        }
        return;
    }
    let (calls, answers): (Vec<Call<Run>>, Vec<_>) =
        batch.into_iter().map(|w| (w.call, w.answer)).unzip();
    let request = Batch { calls };
    let checks = request.calls.len() as u64;
    let reply = link.exchange(&request, timeout, Some(since), checks).await;
    // A reply that is no batch's, or another batch's, fails every check of it.
    let decided = reply.and_then(|reply| {
        decode::<BatchReply>(reply)
            .and_then(|reply| reply.decisions(&request.calls))
            .inspect_err(|error| link.count_failures(error, checks))
    });
    match decided {
        Ok(decisions) => {
            for (decision, answer) in decisions.into_iter().zip(answers) {
                let _ = answer.send(Ok(decision));
            }
        }
        Err(error) => {
            for answer in answers {
                let _ = answer.send(Err(error.duplicate()));
            }
        }
    }
}
