//! Live limits as a store keeps them, for every instance that shares it: a limit per
//! policy and subject, and a version every write moves on, so an instance that polls
//! reads the whole table only when something changed. What a store does for them,
//! private to the crate; the limiter's side (the table it checks by, the polling) is
//! `limiter/limits.rs`. Public items of a private module, as `LeaseStore`'s: a bound
//! of a public method, never nameable outside the crate.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::StoreError;

/// A store's answer, later.
pub(crate) type LimitFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// Every live limit at one version: `(field, limit)`, a field being
/// [`field`]`(policy, subject)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitsAt {
    pub(crate) version: u64,
    pub(crate) limits: Vec<(String, u64)>,
}

/// What a store does for live limits.
pub trait LimitStore: Send + Sync + 'static {
    /// The version the limits are at (0 before any write): cheap, asked every poll.
    fn limits_version(&self) -> LimitFuture<u64>;
    /// Every limit, and the version they are at.
    fn read_limits(&self) -> LimitFuture<LimitsAt>;
    /// Sets (`Some`) or removes (`None`) the limit of `field`, then moves the version
    /// on (in that order: an instance that reads the new version reads the change).
    fn write_limit(&self, field: String, limit: Option<u64>) -> LimitFuture<()>;
}

impl<S: LimitStore> LimitStore for Arc<S> {
    fn limits_version(&self) -> LimitFuture<u64> {
        (**self).limits_version()
    }
    fn read_limits(&self) -> LimitFuture<LimitsAt> {
        (**self).read_limits()
    }
    fn write_limit(&self, field: String, limit: Option<u64>) -> LimitFuture<()> {
        (**self).write_limit(field, limit)
    }
}

/// The field of `policy`'s limit for a subject (its stored bytes): the policy's name,
/// `:`, the bytes in hex. Names never hold `:`; a secret subject's bytes are already
/// a keyed hash, so no raw API key reaches the store.
pub(crate) fn field(policy: &str, subject: &[u8]) -> String {
    let mut field = String::with_capacity(policy.len() + 1 + 2 * subject.len());
    field.push_str(policy);
    field.push(':');
    crate::subject::push_hex(&mut field, subject);
    field
}

/// A field read back: the policy's name and the subject's bytes, or `None` for one
/// this crate did not write.
pub(crate) fn parse_field(field: &str) -> Option<(&str, Vec<u8>)> {
    let (policy, hex) = field.split_once(':')?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((policy, bytes))
}

/// The memory store's live limits.
#[derive(Debug, Default)]
pub(crate) struct StoredLimits {
    version: u64,
    limits: HashMap<String, u64>,
}

impl StoredLimits {
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    pub(crate) fn read(&self) -> LimitsAt {
        LimitsAt {
            version: self.version,
            limits: self.limits.iter().map(|(f, l)| (f.clone(), *l)).collect(),
        }
    }

    pub(crate) fn write(&mut self, field: String, limit: Option<u64>) {
        match limit {
            Some(limit) => {
                self.limits.insert(field, limit);
            }
            None => {
                self.limits.remove(&field);
            }
        }
        self.version += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_reads_back_as_written() {
        let f = field("tokens", b"s\x00\xff:");
        assert_eq!(f, "tokens:7300ff3a");
        assert_eq!(parse_field(&f), Some(("tokens", b"s\x00\xff:".to_vec())));
        assert_eq!(parse_field("tokens:7"), None);
        assert_eq!(parse_field("tokens"), None);
        assert_eq!(parse_field("tokens:zz"), None);
    }
}
