//! Live limits in Redis: one hash, `<prefix>:~limits`, a field per policy and subject
//! ([`field`](crate::store::limits::field)) and `~version`, which every write moves on
//! after its change. Instances poll the version (one `HGET`) and read the hash
//! (`HGETALL`) only when it moved; a check never reads it.

use std::sync::Arc;

use deadpool_redis::redis::{cmd, Cmd, Value};

use super::command::Plain;
use super::contract::reply::decode;
use super::RedisStore;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::limits::{LimitFuture, LimitStore, LimitsAt};

/// The hash field that holds the version (`~` is never in a policy name).
const VERSION: &str = "~version";

impl RedisStore {
    fn limits_key(&self) -> String {
        format!("{}:~limits", self.settings.prefix)
    }

    /// `cmd` on the store's connection, within its timeout, its reply as it came.
    fn plain(&self, cmd: Cmd) -> LimitFuture<Value> {
        let (link, timeout) = (Arc::clone(&self.link), self.settings.timeout);
        Box::pin(async move { link.exchange(&Plain(cmd), timeout, None, 0).await })
    }
}

impl LimitStore for RedisStore {
    fn limits_version(&self) -> LimitFuture<u64> {
        let mut get = cmd("HGET");
        get.arg(self.limits_key()).arg(VERSION);
        let sent = self.plain(get);
        Box::pin(async move { Ok(decode::<Option<u64>>(sent.await?)?.unwrap_or(0)) })
    }

    fn read_limits(&self) -> LimitFuture<LimitsAt> {
        let mut all = cmd("HGETALL");
        all.arg(self.limits_key());
        let sent = self.plain(all);
        Box::pin(async move {
            let fields: Vec<(String, String)> = decode(sent.await?)?;
            let mut at = LimitsAt::default();
            for (field, value) in fields {
                let Ok(n) = value.parse::<u64>() else {
                    return Err(StoreError::new(
                        StoreErrorKind::Protocol,
                        format!("live limit {field:?} is not a number: {value:?}"),
                    ));
                };
                if field == VERSION {
                    at.version = n;
                } else {
                    at.limits.push((field, n));
                }
            }
            Ok(at)
        })
    }

    fn write_limit(&self, field: String, limit: Option<u64>) -> LimitFuture<()> {
        let key = self.limits_key();
        let mut change = match limit {
            Some(_) => cmd("HSET"),
            None => cmd("HDEL"),
        };
        change.arg(&key).arg(&field);
        if let Some(limit) = limit {
            change.arg(limit);
        }
        let mut bump = cmd("HINCRBY");
        bump.arg(&key).arg(VERSION).arg(1);
        let (changed, bumped) = (self.plain(change), self.plain(bump));
        Box::pin(async move {
            changed.await?;
            bumped.await?;
            Ok(())
        })
    }
}
