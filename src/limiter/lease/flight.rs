//! One leasing check in flight per subject: one request asks the store, the subject's
//! other requests on this instance wait for its answer instead of asking too.
//!
//! The answer goes through one `tokio::sync::watch` channel: the asker holds its
//! sending end ([`Asker`]), the subject's entry in the table a receiving end that each
//! waiter clones ([`Waiter`]). The waiters get the asker's own answer: after a grant or
//! a denial, recorded in the table, they decide from it; after a failure, they answer
//! with that same failure at once (the error itself, shared), rather than each asking
//! a store that just failed and waiting out another timeout.
//!
//! An asker dropped before its answer (its request was cancelled) drops the sending
//! end with it: the channel closes with nothing in it, its waiters wake, and the first
//! of them to look again finds no check in flight and asks in its place; the others
//! wait for that one. No waiter is left waiting for an asker that is gone.
//!
//! Here, the channel; the table asks and waits through it in grant.rs.

use tokio::sync::watch;

use crate::error::StoreError;

/// What a leasing check's waiters learn: it was answered (the table holds what it
/// left), or it failed, with its error.
pub(crate) type Answer = Result<(), StoreError>;

/// The asking end of a flight: [`Asker::answer`] once, or drop it to leave without an
/// answer.
#[derive(Debug)]
pub(crate) struct Asker<T> {
    answer: watch::Sender<Option<T>>,
}

/// A waiting end of a flight; clones wait for the same answer.
#[derive(Debug)]
pub(crate) struct Waiter<T> {
    answer: watch::Receiver<Option<T>>,
}

impl<T> Clone for Waiter<T> {
    fn clone(&self) -> Self {
        Self {
            answer: self.answer.clone(),
        }
    }
}

/// A new flight: its asker, and a waiter to clone for the requests that wait for it.
pub(crate) fn flight<T>() -> (Asker<T>, Waiter<T>) {
    let (answer, waiting) = watch::channel(None);
    (Asker { answer }, Waiter { answer: waiting })
}

impl<T> Asker<T> {
    /// Gives every waiter, now and to come, `answer`.
    pub(crate) fn answer(self, answer: T) {
        // Kept in the channel even with no waiter yet: a waiter cloned from the
        // table's before it was cleared reads it when it looks.
        self.answer.send_replace(Some(answer));
    }
}

impl<T> Waiter<T> {
    /// Whether the asker is still asking: neither answered nor gone.
    pub(crate) fn in_flight(&self) -> bool {
        !self.answer.is_closed() && self.answer.borrow().is_none()
    }

    /// Whether this waits for `asker`'s answer.
    pub(crate) fn waits_for(&self, asker: &Asker<T>) -> bool {
        self.answer.same_channel(&asker.answer.subscribe())
    }
}

impl<T: Clone> Waiter<T> {
    /// The asker's answer, or `None` if it left without one.
    pub(crate) async fn answer(mut self) -> Option<T> {
        match self.answer.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone(),
            Err(_closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_waiter_gets_the_asker_s_answer() {
        let (asker, waiter) = flight::<u32>();
        let (early, late) = (waiter.clone(), waiter.clone());
        assert!(waiter.in_flight() && waiter.waits_for(&asker));
        let early = tokio::spawn(early.answer());
        tokio::task::yield_now().await;
        asker.answer(7);
        assert!(!waiter.in_flight());
        assert_eq!(early.await.unwrap(), Some(7));
        // A waiter that looks after the answer came still reads it.
        assert_eq!(late.answer().await, Some(7));
    }

    #[tokio::test]
    async fn an_asker_dropped_without_an_answer_leaves_no_waiter_waiting() {
        let (asker, waiter) = flight::<u32>();
        let waiting = tokio::spawn(waiter.clone().answer());
        tokio::task::yield_now().await;
        drop(asker);
        assert_eq!(waiting.await.unwrap(), None);
        assert!(!waiter.in_flight(), "a closed flight is no flight");
        assert_eq!(waiter.answer().await, None);
    }

    #[test]
    fn a_waiter_waits_for_its_own_asker_only() {
        let (first, waiter) = flight::<u32>();
        let (second, _) = flight::<u32>();
        assert!(waiter.waits_for(&first));
        assert!(!waiter.waits_for(&second));
    }
}
