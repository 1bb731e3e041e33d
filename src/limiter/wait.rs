//! Waiting on the limiter: [`Limiter::check_within`] checks, and when denied sleeps
//! until the time its denial names, then checks again, for as long as that time comes
//! within its bound. The layer's [`OverLimit::Wait`](crate::layer::OverLimit::Wait)
//! waits with the same loop, after its own first check.

use std::borrow::Borrow;
use std::time::Duration;

use tokio::time::Instant;

use super::parts::Limiter;
use crate::decision::Decision;
use crate::error::Error;
use crate::store::Store;
use crate::subject::Subject;
use crate::telemetry::{self, WaitOutcome};

impl<S: Store> Limiter<S> {
    /// Like [`Limiter::check`], but a denial whose time comes within `max_wait` is
    /// waited out: the check runs again at that time, and again after each denial
    /// (another caller took the room) whose time is still within `max_wait` of the
    /// first denial. The answer is the first admission, or the latest denial once its
    /// time is past that bound (at once when the first one's already is).
    ///
    /// The waits sleep on Tokio's timer (`tokio::time::pause` moves them in tests);
    /// outside a Tokio runtime the first denial is returned as it is. A store failure
    /// is the error it is for a check, never a wait. Dropping the future while it waits
    /// takes nothing: only an admission consumes. Callers that wait on one subject
    /// together each wake at their own denial's time, and those that lose the race
    /// wait again; the layer's waiting also queues them (see
    /// [`OverLimit::Wait`](crate::layer::OverLimit::Wait)). A denied call is counted in
    /// `redlimit_waited_total` by how its wait ended (feature `metrics`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // One a tenth of a second: a batch job that would rather wait than fail.
    /// let limiter = Limiter::new(
    ///     MemoryStore::new(),
    ///     Policy::token_bucket("export", 1, 1, Duration::from_millis(100))?,
    /// );
    /// assert!(limiter.check("job-1", 1).await?.is_allowed());
    /// // Its next turn comes within a second: it waits for it, then is admitted.
    /// assert!(limiter.check_within("job-1", 1, Duration::from_secs(1)).await?.is_allowed());
    /// // Not within 10 ms: the denial comes back at once, with its `retry_after`.
    /// let denied = limiter.check_within("job-1", 1, Duration::from_millis(10)).await?;
    /// assert!(!denied.is_allowed());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Limiter::check`]: a cost of 0 or above what a policy admits at once,
    /// and a store failure without a fallback.
    pub async fn check_within(
        &self,
        subject: impl Into<Subject>,
        cost: u32,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let subject = subject.into();
        match self.check(subject.clone(), cost).await {
            Ok(denial) if !denial.is_allowed() => {
                if !may_wait(&denial, max_wait) {
                    telemetry::waited(&denial, WaitOutcome::Refused);
                    return Ok(denial);
                }
                let turn = Turn::new(denial, max_wait);
                wait_turn(self, subject, cost, turn, 0, || 0).await
            }
            checked => checked,
        }
    }
}

/// Waits out `turn`'s denial of `limiter` and checks again, until admitted, refused by
/// its deadline or failed. `ahead` is the cost of those queued before it when it starts
/// (its time is then when their costs and its own fit, from a peek of the total),
/// `others` that of the others queued when it is denied again. A free function, not a
/// method: the layer's wait owns its limiter (an `Arc`), `check_within` borrows it.
pub(crate) async fn wait_turn<S: Store>(
    limiter: impl Borrow<Limiter<S>> + Send + Sync,
    subject: Subject,
    cost: u32,
    mut turn: Turn,
    ahead: u64,
    others: impl Fn() -> u64 + Send + Sync,
) -> Result<Decision, Error> {
    let limiter = limiter.borrow();
    let mut ahead = ahead;
    loop {
        let wait_ms = if ahead == 0 {
            turn.denial.outcome().retry_after_ms
        } else {
            // Above what a policy admits at once: its turn never comes.
            let total = u32::try_from(ahead.saturating_add(u64::from(cost)));
            let Some(total) = total.ok().filter(|t| limiter.valid_cost(*t).is_ok()) else {
                return Ok(turn.refused());
            };
            // Boxed: only a request with others queued ahead peeks, and the peek is the
            // largest of the wait's futures.
            match Box::pin(limiter.peek(subject.clone(), total)).await {
                Ok(decision) if decision.is_allowed() => 0,
                Ok(decision) => {
                    // Its refusal names the time its turn would have come.
                    turn.denial = decision;
                    turn.denial.outcome().retry_after_ms
                }
                Err(error) => return Err(turn.failed(error)),
            }
        };
        let wake = Instant::now().checked_add(Duration::from_millis(wait_ms));
        let Some(wake) = wake.filter(|wake| turn.deadline.is_none_or(|d| *wake <= d)) else {
            return Ok(turn.refused());
        };
        tokio::time::sleep_until(wake).await;
        match limiter.check(subject.clone(), cost).await {
            Ok(decision) if decision.is_allowed() => {
                turn.end(WaitOutcome::Admitted);
                return Ok(decision);
            }
            Ok(denial) => {
                turn.denial = denial;
                ahead = others();
            }
            Err(error) => return Err(turn.failed(error)),
        }
    }
}

/// Whether `denial` may be waited out within `max_wait`: its own time comes by then (a
/// queued turn never comes earlier), and there is a Tokio runtime to sleep on.
#[inline]
pub(crate) fn may_wait(denial: &Decision, max_wait: Duration) -> bool {
    Duration::from_millis(denial.outcome().retry_after_ms) <= max_wait
        && tokio::runtime::Handle::try_current().is_ok()
}

/// One wait: its latest denial and its deadline. Its outcome is counted once, when it
/// ends, or as cancelled when it is dropped first.
pub(crate) struct Turn {
    denial: Decision,
    /// The first denial plus `max_wait`; `None` when that is beyond any instant.
    deadline: Option<Instant>,
    ended: bool,
}

impl Turn {
    /// A wait for `denial`, made now, of at most `max_wait`.
    pub(crate) fn new(denial: Decision, max_wait: Duration) -> Self {
        Self {
            denial,
            deadline: Instant::now().checked_add(max_wait),
            ended: false,
        }
    }

    fn end(&mut self, outcome: WaitOutcome) {
        if !self.ended {
            self.ended = true;
            telemetry::waited(&self.denial, outcome);
        }
    }

    fn refused(&mut self) -> Decision {
        self.end(WaitOutcome::Refused);
        self.denial.clone()
    }

    fn failed(&mut self, error: Error) -> Error {
        self.end(WaitOutcome::Failed);
        error
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.end(WaitOutcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Future, Ready};
    use std::pin::pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use crate::clock::Clock;
    use crate::store::backend::Backend;
    use crate::store::{AdminStore, Operation, PolicySet, StoreError, StoreErrorKind};
    use crate::{Decision, Error, Limiter, MemoryStore, Policy, Subject};

    /// The store's clock, following Tokio's (paused) time from `base_ms`.
    #[derive(Debug, Clone)]
    struct TokioClock {
        start: tokio::time::Instant,
        base_ms: u64,
    }

    impl Clock for TokioClock {
        fn now_ms(&self) -> u64 {
            self.base_ms + u64::try_from(self.start.elapsed().as_millis()).unwrap()
        }
    }

    fn memory(base_ms: u64) -> MemoryStore {
        MemoryStore::with_clock(TokioClock {
            start: tokio::time::Instant::now(),
            base_ms,
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// One token, one more every 100 ms.
    fn bucket() -> Policy {
        Policy::token_bucket("tb", 1, 1, ms(100)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn admits_once_the_time_comes_and_waits_again_when_another_took_it() {
        let limiter = Arc::new(Limiter::new(memory(0), bucket()));
        let start = tokio::time::Instant::now();
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        let admitted = limiter.check_within("a", 1, ms(500)).await.unwrap();
        assert!(admitted.is_allowed());
        assert_eq!(start.elapsed(), ms(100), "admitted at its time, not later");
        // Two wait together: both wake at 200 ms, one is admitted, the other is denied
        // again and waits again, to be admitted at 300 ms.
        let (one, other) = tokio::join!(
            timed(start, limiter.check_within("a", 1, ms(500))),
            timed(start, limiter.check_within("a", 1, ms(500)))
        );
        let mut times = [one, other].map(|(decision, at)| {
            assert!(decision.unwrap().is_allowed());
            at
        });
        times.sort();
        assert_eq!(times, [ms(200), ms(300)]);
    }

    /// `future`'s output, and when it came (since `start`).
    async fn timed<T>(
        start: tokio::time::Instant,
        future: impl Future<Output = T>,
    ) -> (T, Duration) {
        let output = future.await;
        (output, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_at_once_when_the_wait_exceeds_the_bound() {
        let window = Policy::fixed_window("fw", 1, Duration::from_secs(1)).unwrap();
        let limiter = Limiter::new(memory(0), window);
        let start = tokio::time::Instant::now();
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        let denied = limiter.check_within("a", 1, ms(999)).await.unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.outcome().retry_after_ms, 1_000);
        assert_eq!(start.elapsed(), Duration::ZERO, "refused without a wait");
        // A wait that ends past the bound after a denial at its time is refused then.
        let limiter = Arc::new(Limiter::new(memory(0), bucket()));
        assert!(limiter.check("b", 1).await.unwrap().is_allowed());
        let (one, other) = tokio::join!(
            limiter.check_within("b", 1, ms(150)),
            limiter.check_within("b", 1, ms(150))
        );
        let mut allowed = [one.unwrap(), other.unwrap()].map(|d| d.is_allowed());
        allowed.sort();
        // One is admitted at 100 ms; the other's next turn, 200 ms, is past 150 ms.
        assert_eq!(allowed, [false, true]);
        assert_eq!(start.elapsed(), ms(100));
        // Costs other than 1 are errors as for a check, never waits.
        assert!(matches!(
            limiter.check_within("b", 0, ms(500)).await,
            Err(Error::ZeroCost)
        ));
        assert!(matches!(
            limiter.check_within("b", 2, ms(500)).await,
            Err(Error::CostTooHigh { .. })
        ));
    }

    /// A memory store that fails every call once told to.
    struct Failing {
        store: MemoryStore,
        failing: Arc<AtomicBool>,
    }

    impl Failing {
        /// `decide`'s answer, or a failure that decided nothing.
        fn answer(
            &self,
            decide: impl FnOnce() -> Ready<Result<Decision, StoreError>>,
        ) -> Ready<Result<Decision, StoreError>> {
            if self.failing.load(Ordering::SeqCst) {
                ready(Err(StoreError::new(StoreErrorKind::Unavailable, "gone")))
            } else {
                decide()
            }
        }
    }

    impl Backend for Failing {
        type Future = Ready<Result<Decision, StoreError>>;

        fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
            self.answer(|| self.store.check(subject, set, cost))
        }
    }

    impl AdminStore for Failing {
        fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
            self.answer(|| self.store.run(op, subject, set, cost))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_failure_is_an_error_never_a_wait() {
        let failing = Arc::new(AtomicBool::new(true));
        let store = Failing {
            store: memory(0),
            failing: Arc::clone(&failing),
        };
        let limiter = Arc::new(Limiter::new(store, bucket()));
        let start = tokio::time::Instant::now();
        let failed = limiter.check_within("a", 1, ms(500)).await;
        assert!(matches!(failed, Err(Error::Store(_))), "{failed:?}");
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Failing while it waits: the error at its time, not another wait.
        failing.store(false, Ordering::SeqCst);
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.check_within("a", 1, ms(500)).await })
        };
        tokio::task::yield_now().await;
        failing.store(true, Ordering::SeqCst);
        let failed = waiter.await.unwrap();
        assert!(matches!(failed, Err(Error::Store(_))), "{failed:?}");
        assert_eq!(start.elapsed(), ms(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_dropped_while_it_waits_takes_nothing() {
        let limiter = Limiter::new(memory(0), bucket());
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        {
            let mut waiting = pin!(limiter.check_within("a", 1, ms(500)));
            let polled = waiting
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            assert!(matches!(polled, Poll::Pending), "it waits");
        }
        tokio::time::advance(ms(100)).await;
        // The token that came at 100 ms is still there for the next caller.
        assert!(limiter.peek("a", 1).await.unwrap().is_allowed());
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
    }
}
