//! What each operation makes this instance forget of a subject: the one place that
//! knows which of the limiter's local answers (the block cache, a lease's kept
//! denial, a lease) an operation may have made untrue.
//!
//! | operation | before the store call | after its answer |
//! |---|---|---|
//! | refund | the cached denial and the kept denial: the store may admit again (the lease stays: the store still counts its units) | - |
//! | reset | the cached denial and the lease with its kept denial: the state they came from is gone | - |
//! | charge | nothing: a charge can only deny more | the lease, when the subject is left denied: it would go on admitting what the store denies |
//! | peek, release, renew | nothing | - |
//!
//! A check forgets the cached denial when the store admits (see `future.rs`).

use super::parts::Guard;
use crate::decision::Decision;
use crate::store::Operation;
use crate::subject::Subject;

impl Guard {
    /// Forgets what `op` on `subject` makes untrue before it runs.
    pub(super) fn forget_before(&self, op: Operation, subject: &Subject) {
        let (blocks, leases) = match op {
            Operation::Refund => (true, Lease::Denial),
            Operation::Reset => (true, Lease::All),
            _ => (false, Lease::Keep),
        };
        if blocks {
            if let Some(blocks) = &self.blocks {
                blocks.forget(subject);
            }
        }
        if let Some(table) = &self.leases {
            match leases {
                Lease::Keep => {}
                Lease::Denial => table.forget_denial(subject),
                Lease::All => table.forget(subject),
            }
        }
    }

    /// Whether `op`'s answer may make this instance forget more: the caller keeps
    /// the subject for [`Guard::forget_after`].
    pub(super) fn forgets_after(&self, op: Operation) -> bool {
        op == Operation::Charge && self.leases.is_some()
    }

    /// Forgets what the store's answer to `op` on `subject` makes untrue.
    pub(super) fn forget_after(&self, op: Operation, subject: &Subject, decision: &Decision) {
        if op == Operation::Charge && !decision.is_allowed() {
            if let Some(table) = &self.leases {
                table.forget(subject);
            }
        }
    }
}

/// What an operation makes a lease table forget of a subject.
enum Lease {
    Keep,
    Denial,
    All,
}
