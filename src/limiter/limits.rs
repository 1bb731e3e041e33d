//! Live limits: a limit per policy and subject, changed at runtime on every instance
//! that shares the store, keeping the count (a state's identity is its algorithm and
//! window, not its limit: see [`PolicySet`]).
//!
//! The store holds them ([`LimitStore`]); each limiter keeps a copy it checks by,
//! and a task polls the store's version every `every`, reading the whole table only
//! when it moved: a change made on one instance reaches every other within `every`
//! and a round trip, while the store answers. A check reads only the copy: it costs
//! the store nothing, and a hash lookup per policy when any limit is set. While the
//! store does not answer, the copy stays as it was (and the failure is logged).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use crate::store::limits::{field, parse_field, LimitStore, LimitsAt};
use crate::store::PolicySet;
use crate::subject::Subject;

/// A limiter's live limits.
pub(crate) struct LiveLimits {
    store: Arc<dyn LimitStore>,
    every: Duration,
    /// The limiter's policies, by whose positions the copy is kept.
    set: PolicySet,
    table: RwLock<Table>,
}

impl std::fmt::Debug for LiveLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveLimits")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

/// The copy: per policy of the set (by index), the limit of each subject that has one.
#[derive(Debug, Default)]
struct Table {
    version: Option<u64>,
    per_policy: Vec<HashMap<Vec<u8>, u64>>,
    any: bool,
}

impl Table {
    fn of(set: &PolicySet, at: &LimitsAt) -> Self {
        let mut per_policy = vec![HashMap::new(); set.policies().len()];
        for (f, limit) in &at.limits {
            let Some((name, subject)) = parse_field(f) else {
                continue;
            };
            if let Some(i) = set.policies().iter().position(|p| p.name() == name) {
                per_policy[i].insert(subject, *limit);
            }
        }
        let any = per_policy.iter().any(|m| !m.is_empty());
        Self {
            version: Some(at.version),
            per_policy,
            any,
        }
    }
}

impl LiveLimits {
    pub(crate) fn new(store: Arc<dyn LimitStore>, every: Duration, set: PolicySet) -> Arc<Self> {
        let limits = Arc::new(Self {
            store,
            every,
            set,
            table: RwLock::new(Table::default()),
        });
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(poll(Arc::downgrade(&limits), every));
            }
            Err(_) => tracing::warn!(
                "live limits are not polled: no Tokio runtime (build the limiter inside one); \
                 only this instance's own changes apply"
            ),
        }
        limits
    }

    /// `set` with the limits of `subject` (narrowed to the set's scopes) in place of
    /// the policies' own, or `None` when it has none.
    #[inline]
    pub(crate) fn set_for(&self, set: &PolicySet, subject: &Subject) -> Option<PolicySet> {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        if !table.any {
            return None;
        }
        let mut limits: smallvec::SmallVec<[(usize, u64); 2]> = smallvec::SmallVec::new();
        for (i, policy) in set.policies().iter().enumerate() {
            let part = set.part_of(policy, subject);
            if let Some(limit) = table.per_policy.get(i).and_then(|m| lookup(m, part)) {
                limits.push((i, *limit));
            }
        }
        drop(table);
        (!limits.is_empty()).then(|| set.with_limits(&limits))
    }

    /// The live limit of policy `index` for the subject bytes `part` of its scope, if
    /// set.
    pub(crate) fn get(&self, index: usize, part: &[u8]) -> Option<u64> {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        lookup(table.per_policy.get(index)?, part).copied()
    }

    /// Writes a live limit to the store, then to this instance's copy at once.
    pub(crate) async fn write(
        &self,
        index: usize,
        part: &[u8],
        limit: Option<u64>,
    ) -> Result<(), crate::error::StoreError> {
        let set = &self.set;
        let Some(policy) = set.policies().get(index) else {
            return Ok(());
        };
        let name = policy.name();
        self.store.write_limit(field(name, part), limit).await?;
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if table.per_policy.len() != set.policies().len() {
            table.per_policy = vec![HashMap::new(); set.policies().len()];
        }
        let bytes = part.to_vec();
        match limit {
            Some(limit) => {
                table.per_policy[index].insert(bytes, limit);
            }
            None => {
                table.per_policy[index].remove(&bytes);
            }
        }
        table.any = table.per_policy.iter().any(|m| !m.is_empty());
        Ok(())
    }

    /// Reads the store's table if its version moved since the copy's.
    pub(crate) async fn refresh(&self) -> Result<(), crate::error::StoreError> {
        let set = &self.set;
        let version = self.store.limits_version().await?;
        let known = self
            .table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .version;
        if known == Some(version) {
            return Ok(());
        }
        let at = self.store.read_limits().await?;
        *self.table.write().unwrap_or_else(PoisonError::into_inner) = Table::of(set, &at);
        Ok(())
    }
}

/// The live limit of the subject `part`, else the policy's for every subject (kept
/// under the empty bytes, which no subject has: each starts with its kind's tag).
#[inline]
fn lookup<'m>(limits: &'m HashMap<Vec<u8>, u64>, part: &[u8]) -> Option<&'m u64> {
    limits.get(part).or_else(|| limits.get(&[][..]))
}

/// The polling task: it holds the limits weakly and ends with the limiter.
async fn poll(limits: Weak<LiveLimits>, every: Duration) {
    let mut failing = false;
    loop {
        let Some(live) = limits.upgrade() else {
            return;
        };
        match live.refresh().await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("live limits read from the store again");
            }
            Ok(()) => {}
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "live limits could not be read; the last ones read stay in force");
            }
            Err(_) => {}
        }
        drop(live);
        tokio::time::sleep(every).await;
    }
}
