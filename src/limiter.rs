//! The limiter: a store and the policies checked together, usable without HTTP.
//!
//! ```
//! use redlimit::{Limiter, MemoryStore, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 10 per second and 1000 per hour: both must admit, and a denial consumes nothing.
//! let limiter = Limiter::new(
//!     MemoryStore::new(),
//!     Policy::token_bucket("burst", 10, 10, Duration::from_secs(1))?,
//! )
//! .policy(Policy::sliding_window("hourly", 1000, Duration::from_secs(3600))?);
//!
//! let decision = limiter.check("tenant-7", 1).await?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 9);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::decision::Decision;
use crate::error::Error;
use crate::policy::Policy;
use crate::store::{PolicySet, Store};
use crate::subject::Subject;

/// A store and the policies one kind of request is checked against.
///
/// Built with at least one policy, so every check has something to decide. Wrap it in an
/// `Arc` (the layer does) to share it.
#[derive(Debug, Clone)]
pub struct Limiter<S> {
    store: S,
    set: PolicySet,
}

impl<S: Store> Limiter<S> {
    /// A limiter on `store` with its first policy.
    pub fn new(store: S, policy: Policy) -> Self {
        Self {
            store,
            set: PolicySet::new(vec![policy]),
        }
    }

    /// Adds a policy that must also admit every request. A policy with the same name
    /// as one already present replaces it (names key the state in Redis).
    pub fn policy(self, policy: Policy) -> Self {
        let mut policies: Vec<Policy> = self.set.policies().to_vec();
        match policies.iter_mut().find(|p| p.name() == policy.name()) {
            Some(existing) => *existing = policy,
            None => policies.push(policy),
        }
        Self {
            store: self.store,
            set: PolicySet::new(policies),
        }
    }

    /// The policies checked, in order.
    pub fn policies(&self) -> &[Policy] {
        self.set.policies()
    }

    /// The policies with their fingerprint, as stores see them.
    pub fn policy_set(&self) -> &PolicySet {
        &self.set
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides whether `subject` may spend `cost` now, and consumes it if so.
    ///
    /// A cost of 0, or above what some policy can ever admit, is an error rather than a
    /// denial that would never end.
    pub fn check(&self, subject: impl Into<Subject>, cost: u32) -> CheckFuture<S::Future> {
        let cost = u64::from(cost);
        let invalid = if cost == 0 {
            Some(Error::ZeroCost)
        } else if cost > self.set.max_cost() {
            let policy = self
                .set
                .policies()
                .iter()
                .find(|p| p.max_cost() < cost)
                .map(|p| p.name().to_owned())
                .unwrap_or_default();
            Some(Error::CostTooHigh {
                cost,
                max: self.set.max_cost(),
                policy,
            })
        } else {
            None
        };
        match invalid {
            Some(error) => CheckFuture {
                state: CheckState::Invalid { error: Some(error) },
            },
            None => CheckFuture {
                state: CheckState::Store {
                    future: self.store.check(subject.into(), &self.set, cost),
                },
            },
        }
    }
}

pin_project! {
    /// The pending result of [`Limiter::check`].
    #[derive(Debug)]
    pub struct CheckFuture<F> {
        #[pin]
        state: CheckState<F>,
    }
}

pin_project! {
    #[project = CheckStateProj]
    #[derive(Debug)]
    enum CheckState<F> {
        Store { #[pin] future: F },
        Invalid { error: Option<Error> },
    }
}

impl<F, E> Future for CheckFuture<F>
where
    F: Future<Output = Result<Decision, E>>,
    Error: From<E>,
{
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            CheckStateProj::Store { future } => future.poll(cx).map_err(Error::from),
            CheckStateProj::Invalid { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                None => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::MemoryStore;
    use std::time::Duration;

    fn two_policies(clock: &FakeClock) -> Limiter<MemoryStore> {
        Limiter::new(
            MemoryStore::with_clock(clock.clone()),
            Policy::fixed_window("second", 3, Duration::from_secs(1)).unwrap(),
        )
        .policy(Policy::fixed_window("minute", 5, Duration::from_secs(60)).unwrap())
    }

    #[tokio::test]
    async fn a_denial_by_one_policy_consumes_from_none() {
        let clock = FakeClock::new(0);
        let limiter = two_policies(&clock);
        for _ in 0..3 {
            assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        }
        let denied = limiter.check("s", 1).await.unwrap();
        assert_eq!(denied.denied_by(), Some("second"));
        assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
        clock.advance(Duration::from_secs(1));
        // "minute" saw 3, not 4: two more pass, then it denies.
        assert!(limiter.check("s", 1).await.unwrap().is_allowed());
        let last = limiter.check("s", 1).await.unwrap();
        assert!(last.is_allowed());
        assert_eq!(last.policy().name(), "minute");
        assert_eq!(last.remaining(), 0);
        let denied = limiter.check("s", 1).await.unwrap();
        assert_eq!(denied.denied_by(), Some("minute"));
    }

    #[tokio::test]
    async fn impossible_costs_are_errors_not_denials() {
        let limiter = two_policies(&FakeClock::new(0));
        assert!(matches!(limiter.check("s", 0).await, Err(Error::ZeroCost)));
        match limiter.check("s", 4).await {
            Err(Error::CostTooHigh { max, policy, .. }) => {
                assert_eq!((max, policy.as_str()), (3, "second"));
            }
            other => panic!("expected CostTooHigh, got {other:?}"),
        }
        assert!(limiter.check("s", 3).await.unwrap().is_allowed());
    }

    #[test]
    fn same_name_replaces() {
        let limiter = two_policies(&FakeClock::new(0))
            .policy(Policy::sliding_log("second", 9, Duration::from_secs(1)).unwrap());
        assert_eq!(limiter.policies().len(), 2);
        assert_eq!(limiter.policies()[0].limit(), 9);
    }
}
