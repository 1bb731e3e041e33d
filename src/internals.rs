//! Hooks into the crate for its own tests and benches (feature `internals`): they look
//! inside a limiter or build what the stores send. Not part of the API: no stability
//! promise, and applications have no use for them.

pub use crate::algorithm::traces;
use crate::limiter::Limiter;
use crate::subject::Subject;

/// A look inside a limiter's leases.
#[allow(async_fn_in_trait)]
pub trait LimiterInternals {
    /// Gives back the units of every expired lease now and waits for the store, as the
    /// background sweep does every quarter lifetime; returns how many calls it made.
    async fn sweep_leases(&self) -> usize;
    /// Units this instance holds now in unexpired leases, over all subjects: what it
    /// could admit without the store.
    fn held_units(&self) -> u64;
    /// Subjects whose rate or lease this limiter tracks.
    fn leased_subjects(&self) -> usize;
}

impl<S> LimiterInternals for Limiter<S> {
    async fn sweep_leases(&self) -> usize {
        match self.lease_table() {
            Some(table) => table.sweep_now().await,
            None => 0,
        }
    }

    fn held_units(&self) -> u64 {
        self.lease_table().map_or(0, |table| table.held_units())
    }

    fn leased_subjects(&self) -> usize {
        self.lease_table().map_or(0, |table| table.len())
    }
}

/// How a subject appears in a Redis key.
pub trait SubjectInternals {
    /// Appends the subject as it appears inside a Redis hash tag: raw values keep
    /// `[A-Za-z0-9._=:/@-]` and percent-escape every other byte, hashes are `#` and hex.
    fn write_key_part(&self, out: &mut String);
}

impl SubjectInternals for Subject {
    fn write_key_part(&self, out: &mut String) {
        Subject::write_key_part(self, out);
    }
}
