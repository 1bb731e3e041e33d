//! What a check that waits on the store becomes: the future [`Limiter::check`] returns,
//! and what runs once the store has answered (the block cache, the fallback).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::lease::DecisionFuture;
use super::parts::Guard;
use crate::decision::{Decision, Origin};
use crate::error::Error;
use crate::store::{PolicySet, StoreError};
use crate::subject::Subject;

/// What a guarded check needs once the store has answered.
#[derive(Debug)]
pub(super) struct After {
    pub(super) guard: Arc<Guard>,
    pub(super) subject: Subject,
    pub(super) set: PolicySet,
    pub(super) cost: u64,
}

impl After {
    pub(super) fn finish(self, result: Result<Decision, StoreError>) -> Result<Decision, Error> {
        let Self {
            guard,
            subject,
            set,
            cost,
        } = self;
        match result {
            Ok(decision) => {
                if let Some(blocks) = &guard.blocks {
                    if decision.is_allowed() {
                        blocks.forget(&subject);
                    } else {
                        blocks.insert(subject, cost, &decision, guard.clock.now_ms());
                    }
                }
                Ok(decision)
            }
            Err(error) => {
                // The call may have run: a slot it took would be nobody's.
                if let Some(slots) = &guard.slots {
                    slots.unsettle(subject.clone());
                }
                match &guard.fallback {
                    Some(fallback) => {
                        crate::telemetry::store_failed(&error, true);
                        Ok(fallback
                            .decide(subject, &set, cost)
                            .with_origin(Origin::Fallback))
                    }
                    None => Err(Error::Store(error)),
                }
            }
        }
    }
}

pin_project! {
    /// The pending result of [`Limiter::check`].
    #[derive(Debug)]
    pub struct CheckFuture<F> {
        #[pin]
        pub(super) state: CheckState<F>,
        pub(super) after: Option<After>,
    }
}

pin_project! {
    #[project = CheckStateProj]
    #[derive(Debug)]
    pub(super) enum CheckState<F> {
        Store { #[pin] future: F },
        Lease { future: PendingLease },
        Ready { result: Option<Result<Decision, Error>> },
    }
}

/// A leasing check, or a wait for one, on its way (boxed: it holds the store's call).
pub(super) struct PendingLease(pub(super) DecisionFuture);

impl std::fmt::Debug for PendingLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingLease")
    }
}

impl<F> CheckFuture<F> {
    /// A check decided already (and reported), as a future.
    #[inline]
    pub(super) fn ready(result: Result<Decision, Error>) -> Self {
        CheckFuture {
            state: CheckState::Ready {
                result: Some(result),
            },
            after: None,
        }
    }
}

/// A check as [`Limiter::check_or_later`](crate::Limiter::check_or_later) gives it.
#[derive(Debug)]
pub(crate) enum Checked<F> {
    /// Decided already (by the block cache, a store that decides at once, a lease, or
    /// a refused cost), and reported as a completed check is.
    Now(Result<Decision, Error>),
    /// On its way: the future completes it (and reports it).
    Later(CheckFuture<F>),
}

impl<F> Checked<F> {
    /// A check decided already: reported now.
    #[inline]
    pub(super) fn now(result: Result<Decision, Error>) -> Self {
        report(&result);
        Checked::Now(result)
    }
}

/// Logs and counts a check's result.
#[inline]
fn report(outcome: &Result<Decision, Error>) {
    match outcome {
        Ok(decision) => crate::telemetry::decided(decision),
        Err(Error::Store(error)) => crate::telemetry::store_failed(error, false),
        Err(_) => {}
    }
}

impl<F> Future for CheckFuture<F>
where
    F: Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Decision, Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            CheckStateProj::Store { future } => {
                let result = std::task::ready!(future.poll(cx));
                let outcome = match this.after.take() {
                    Some(after) => after.finish(result),
                    None => result.map_err(Error::from),
                };
                report(&outcome);
                Poll::Ready(outcome)
            }
            CheckStateProj::Lease { future } => {
                let result = std::task::ready!(future.0.as_mut().poll(cx));
                let outcome = match this.after.take() {
                    Some(after) => after.finish(result),
                    None => result.map_err(Error::from),
                };
                report(&outcome);
                Poll::Ready(outcome)
            }
            CheckStateProj::Ready { result } => match result.take() {
                Some(result) => Poll::Ready(result),
                None => Poll::Pending,
            },
        }
    }
}
