//! The checks waiting for a pipelined call to end (see batch.rs, which queues and
//! sends them): kept apart so that the connection, which every clone of a store
//! shares, holds the queue without knowing how batches are made.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::command::{Call, Run};
use super::reader::Since;
use crate::decision::Decision;
use crate::error::StoreError;

/// The checks waiting for a pipelined call to end, shared by every clone of a store.
#[derive(Debug, Default)]
pub(in crate::store::redis) struct Queue {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Checks and batches sent and not yet answered.
    pub(super) in_flight: usize,
    pub(super) waiting: VecDeque<Waiting>,
}

/// A queued check, with where its decision goes.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) call: Call<Run>,
    pub(super) answer: oneshot::Sender<Result<Decision, StoreError>>,
    pub(super) since: Since,
    pub(super) timeout: Duration,
    pub(super) max_batch: usize,
}

impl Queue {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many checks the queue holds without allocating.
    #[cfg(feature = "internals")]
    pub(in crate::store::redis) fn capacity(&self) -> usize {
        self.lock().waiting.capacity()
    }
}
