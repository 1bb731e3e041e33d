//! The local block cache: a subject the store denied is answered locally until its
//! retry time, without a store call.
//!
//! A flood from one over-limit subject then costs the store one call per retry period
//! instead of one per request. The cache is exact, not a heuristic: the store said the
//! request would not be admitted before `retry_after`, and nothing the cache blocks
//! could have been admitted sooner. It answers only the same cost as the denied
//! request (another cost has another retry time), and forgets a subject as soon as the
//! store admits one of its requests (its state changed).
//!
//! ```
//! use redlimit::{clock::FakeClock, Limiter, MemoryStore, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = FakeClock::new(0);
//! let limiter = Limiter::new(
//!     MemoryStore::with_clock(clock.clone()),
//!     Policy::fixed_window("p", 1, Duration::from_secs(1))?,
//! )
//! .block_cache(10_000)
//! .local_clock(clock.clone());
//! limiter.check("flooder", 1).await?;
//! let denied = limiter.check("flooder", 1).await?;
//! assert!(!denied.is_allowed());
//! // Answered from the cache until the retry time.
//! assert_eq!(limiter.check("flooder", 1).await?.origin(), redlimit::Origin::BlockCache);
//! # Ok(()) }
//! ```

use dashmap::DashMap;

use crate::decision::{Decision, Origin};
use crate::subject::Subject;

/// Denied subjects and until when, bounded in entries.
#[derive(Debug)]
pub(crate) struct BlockCache {
    blocked: DashMap<Subject, Blocked>,
    max_entries: usize,
}

#[derive(Debug)]
struct Blocked {
    until_ms: u64,
    since_ms: u64,
    cost: u64,
    decision: Decision,
}

impl BlockCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            blocked: DashMap::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// A new, empty cache of the same size.
    pub(crate) fn empty_like(&self) -> Self {
        Self::new(self.max_entries)
    }

    /// The cached denial for `subject` at `now_ms`, if it still holds for `cost`.
    pub(crate) fn lookup(&self, subject: &Subject, cost: u64, now_ms: u64) -> Option<Decision> {
        let entry = self.blocked.get(subject)?;
        if now_ms >= entry.until_ms {
            drop(entry);
            self.blocked.remove_if(subject, |_, b| now_ms >= b.until_ms);
            return None;
        }
        if cost != entry.cost {
            // A smaller request may fit earlier, a larger one later: ask the store.
            return None;
        }
        let mut decision = entry.decision.clone();
        // Both waits end at fixed times: count them from now, which may be before the
        // denial if the local clock went back (a `SystemClock` after an NTP step).
        let reset_at = entry
            .since_ms
            .saturating_add(decision.outcome().reset_after_ms);
        decision.rebase(
            entry.until_ms - now_ms,
            reset_at.saturating_sub(now_ms),
            Origin::BlockCache,
        );
        Some(decision)
    }

    /// Remembers a denial made at `now_ms`.
    pub(crate) fn insert(&self, subject: Subject, cost: u64, decision: &Decision, now_ms: u64) {
        let Some(wait) = decision.retry_after() else {
            return;
        };
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        if wait_ms == 0 {
            return;
        }
        if self.blocked.len() >= self.max_entries {
            self.blocked.retain(|_, b| b.until_ms > now_ms);
            if self.blocked.len() >= self.max_entries {
                // Full of live blocks: those subjects keep going to the store.
                return;
            }
        }
        self.blocked.insert(
            subject,
            Blocked {
                until_ms: now_ms.saturating_add(wait_ms),
                since_ms: now_ms,
                cost,
                decision: decision.clone(),
            },
        );
    }

    /// Drops `subject`'s block once its state changed (the store admitted one of its
    /// requests, or it was refunded or reset): the cached retry time may no longer hold.
    pub(crate) fn forget(&self, subject: &Subject) {
        // Most admitted subjects are not blocked: look before taking a write lock.
        if self.blocked.contains_key(subject) {
            self.blocked.remove(subject);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.blocked.len()
    }
}
