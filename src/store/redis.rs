//! The Redis store: [`RedisStore`](crate::RedisStore).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

mod batch;
mod command;
mod conn;
mod contract;
#[cfg(feature = "internals")]
mod hooks;
mod keys;
mod limits;
mod link;
mod ops;
mod queue;
mod reader;
mod script;
pub(super) mod setup;

use batch::Batching;
use link::Link;

/// Longest key prefix: it is repeated in every key.
const MAX_PREFIX_LEN: usize = 32;

/// The default prefix of every key.
const DEFAULT_PREFIX: &str = "rl";

/// The default time a call may take before it fails with a timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Limit state in Redis, shared by every instance of a service.
///
/// Built from a URL, on a connection of its own ([`RedisStore::from_url`]), from the
/// application's own `deadpool_redis::Pool` ([`RedisStore::new`]) or, for a Redis
/// Cluster, from node URLs ([`RedisStore::cluster_from_urls`]) or a
/// `deadpool_redis::cluster::Pool` ([`RedisStore::cluster`]); below: the connection
/// it keeps and the keys it writes. Cloning is cheap and shares the connection. Every
/// decision is made atomically by one Lua script, in one round trip, whatever the
/// number of policies.
///
/// ```
/// use redlimit::{Limiter, Policy, RedisStore};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("REDIS_URL");
/// let store = RedisStore::from_url(url.as_deref().unwrap_or("redis://127.0.0.1/"))?
///     .prefix("rl")?
///     .timeout(Duration::from_millis(50));
/// # if url.is_ok() {
/// // At start: an unreachable Redis fails here, naming its host and port.
/// store.connect().await?;
/// # }
/// let limiter = Limiter::builder(store)
///     .policy(Policy::sliding_window("api", 100, Duration::from_secs(60))?)
///     .policy(Policy::token_bucket("burst", 10, 10, Duration::from_secs(1))?)
///     .build()?;
/// # if url.is_ok() {
/// // Both policies are checked by one FCALL; a denial by either consumes from neither.
/// let decision = limiter.check("user:42", 1).await?;
/// assert!(decision.is_allowed());
/// # }
/// # Ok(()) }
/// ```
///
/// # One connection, one round trip, many checks per call under load
///
/// A call costs exactly one round trip: an `FCALL` of the store's Redis 7 function
/// library, which reads Redis `TIME` (by default), decides every policy, and writes
/// state only if all admit. The library is loaded (`FUNCTION LOAD`) when a server
/// answers that it lacks it, after a restart or a `FUNCTION FLUSH`; that call is sent
/// as its script in full (`EVAL`) meanwhile, so no call fails for it, and its reply
/// is its answer at once: the load runs in a task of its own, so a call that ran is
/// never reported as a timeout because the load was slow. A library's
/// functions are defined once, when it is loaded, where a script's chunk defines them
/// anew on every call: about a tenth of a check's Redis instructions. A server without
/// functions (before Redis 7.0) gets scripts instead: `EVALSHA`, and `EVAL` after
/// `NOSCRIPT`; each script holds the code of the algorithms its limiter's policies
/// use, and no other.
///
/// Under load, one call decides many checks. While [`RedisStore::max_pipelined`]
/// calls (2) are pipelined on the store's connection, further checks queue; when one
/// of those calls ends, up to [`RedisStore::max_batch`] (32) of them go as one
/// `FCALL` of the library's batch function, which reads `TIME` once and decides each
/// check as its own call would: all or nothing across its own policies, exact, in
/// the order they queued, never all or nothing across checks. Redis pays the call,
/// its parsing and its reply once per batch, which is most of what a one-call check
/// costs it (BENCHMARKS.md). Each key in a batch is read once (one `MGET`), its
/// state parsed once, decided as often as its checks ask and written once: a hot
/// subject's checks cost Redis one read and one write of its state per batch. Peeks,
/// refunds, charges and in-flight releases and renewals queue and batch with the
/// checks. At low load nothing queues, so a lone check is never slower for it (it is
/// a batch of one); a queued check's timeout counts from when it queued. Leasing
/// checks, give-backs and resets always go alone: leases already make them rare. So
/// does every call on a Redis Cluster: a batch's keys must share one slot,
/// and the checks of 100,000 subjects over 16,384 slots almost never do (16 queued
/// checks hold two of one slot with odds of about 0.7%).
///
/// The store keeps ONE connection and sends every call on it: on one server a
/// `redis::aio::MultiplexedConnection` (on a cluster, [see below](#redis-cluster)),
/// whose clones share one socket and pipeline the calls of all tasks, which is faster
/// than a pool of connections used one call at a time. [`RedisStore::from_url`] opens
/// it on a socket of the store's own, and drives it itself (see
/// [`RedisStore::timeout`]). [`RedisStore::new`] takes it out of the application's
/// pool (`Connection::take`, so the pool opens another for the application) rather
/// than checking one out per call: deadpool-redis recycles each checked-out
/// connection with an `UNWATCH` + `PING` round trip of its own, which would double the
/// cost of every decision, and its small default pool would cap concurrency. Either
/// way the socket is the store's alone, never stalled by a blocking command or
/// redirected by a `SELECT` the application sends on its own connections.
///
/// When a call fails with a connection error (or the connection has answered nothing
/// for a second while calls time out), the store drops it and gets a fresh one from
/// the pool in a background task. Only one such attempt runs at a time, failed
/// attempts back off (25 ms doubling to 250 ms), and calls made meanwhile fail at once
/// with [`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind): no reconnect
/// storm, no queue of waiting calls during an outage. Only the calls made before the
/// very first connection exists wait for it, within their timeout; call
/// [`RedisStore::connect`] at start instead, so that none waits. A connection to a
/// primary that a failover demoted (every call answered `READONLY`) is replaced the
/// same way, at the same pace, until the address leads to the new primary. Failed
/// attempts are logged at warn (at most a line a second) with the address, and once
/// calls are answered again, one line at info says so.
///
/// # Timeouts, and what counts as a failure
///
/// The timeout ([`RedisStore::timeout`], 50 ms by default) measures Redis, not the
/// application: a call fails with [`StoreErrorKind::Timeout`](crate::store::StoreErrorKind)
/// when the connection has delivered nothing at all for that long, which is what a
/// stopped, paused or unreachable server looks like. Redis answers in order on one
/// connection, so while replies to the calls sent before it keep arriving, a call is
/// only behind a busy app or a deep pipeline, and it waits for its own reply, at most
/// 1 s from its send; a check queued for a batch waits for its turn however long the
/// line (see [`RedisStore::max_queue`]): under a flood of connections or a burst,
/// limits stay on. On the store's own connection ([`RedisStore::from_url`]) a reply
/// that arrived is a decision however starved the app: see [`RedisStore::timeout`].
/// A call that timed out may still have run; it is never sent again, and the layer
/// never refunds a request it let through for it.
///
/// Every call that ends without a decision (timed out, refused, failed on the
/// connection) is counted: [`RedisStore::calls_failed`] and
/// [`RedisStore::calls_timed_out`], beside [`RedisStore::calls_sent`], for an operator
/// without a log subscriber; under the `metrics` feature, `redlimit_store_errors_total`
/// by kind; and a request the layer let through undecided carries an
/// [`Origin::FailOpen`](crate::Origin) decision.
///
/// # Redis Cluster
///
/// Past one machine, the store runs on a Redis Cluster through redis's cluster
/// client, built from the application's `deadpool_redis::cluster::Pool`
/// ([`RedisStore::cluster`]) or from a list of node URLs
/// ([`RedisStore::cluster_from_urls`]):
///
/// ```
/// use redlimit::{Limiter, Policy, RedisStore};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let nodes = std::env::var("REDIS_CLUSTER");
/// // REDIS_CLUSTER=redis://10.0.0.1:6379,redis://10.0.0.2:6379 (any of its nodes)
/// let nodes = nodes.as_deref().unwrap_or("redis://127.0.0.1:7000");
/// let store = RedisStore::cluster_from_urls(nodes.split(','))?;
/// let limiter = Limiter::builder(store)
///     .policy(Policy::sliding_window("api", 100, Duration::from_secs(60))?)
///     .policy(Policy::token_bucket("burst", 10, 10, Duration::from_secs(1))?)
///     .build()?;
/// # if std::env::var("REDIS_CLUSTER").is_ok() {
/// // Still one FCALL, sent to the master of the slot of "user:42"'s hash tag.
/// assert!(limiter.check("user:42", 1).await?.is_allowed());
/// # }
/// # Ok(()) }
/// ```
///
/// Everything above holds on a cluster, with one connection that is itself
/// multiplexed: it keeps one socket per node and sends each call straight to the
/// master of the slot of its first key. All keys of one call share the subject's hash
/// tag (see [Keys](#keys)), so they lie in one slot: a call never fails with
/// `CROSSSLOT`, however many policies it checks, and subjects spread over the
/// masters by the hash of their tag. `FUNCTION LOAD` goes to every master at once, and
/// replicas receive the library from their master, so a promoted replica has it; a
/// node that lacks it is handled as on one server.
///
/// The cluster client repairs a failed node by itself, in the background and with
/// backoff, and refreshes its slot map when a node answers `MOVED`; so, unlike the
/// single-server connection, the store does not replace the cluster connection when
/// a call fails with a connection error. It replaces it in two cases only, with the
/// same single, paced attempt as above: when the client reports that it has lost
/// every node (left alone, it would then retry every node at once, over and over, as
/// long as calls keep coming: thousands of connections a second), and when the
/// connection has answered nothing at all for a second while calls fail or time out
/// (its background task gone, half-open sockets, or a whole cluster refusing
/// commands for that long).
///
/// During a failover, the calls of the subjects whose slots the lost master served
/// fail (with a timeout, or [`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind))
/// until its replica is promoted, which takes the cluster's `cluster-node-timeout`
/// plus an election: about 2.5 s with a 1 s timeout in the tests. With Redis's
/// default `cluster-require-full-coverage yes`, every node also refuses every
/// command from the moment the master is flagged failed until the promotion (about
/// one second there), so all subjects fail for that moment; with
/// `cluster-require-full-coverage no`, which suits a rate limiter, the other
/// masters' subjects are not affected at all. Within about 0.1 s of the promotion
/// the store decides correctly again, on the same connection.
///
/// A call is sent again only when a node refused it, which proves it did not run
/// there: `MOVED` and `ASK` (a slot that moved or is moving), followed by the store
/// itself to the node named, at most three times. It is never sent again after an
/// error that leaves its fate unknown (a connection reset, a node lost while the call
/// was in flight): the call may have run, and a second one would count the request
/// twice. [`RedisStore::cluster_from_urls`] builds its own cluster client with no
/// retries of its own for that reason. The client of a `deadpool_redis` cluster pool
/// ([`RedisStore::cluster`]) resends a command after an I/O error (up to 16 times),
/// and deadpool-redis has no setting to stop it: on that path a call cut off after
/// it ran may be counted twice. Prefer `cluster_from_urls` where counts must be
/// exact.
///
/// Replication is asynchronous: decisions the lost master made in its last moments
/// may not have reached its replica, so their subjects may be admitted those few
/// requests again. That is the price of Redis replication, not of the store; what
/// the replica had acknowledged (`WAIT`) survives the failover.
///
/// # Keys
///
/// `<prefix>:{<subject>}:<set tag>:<policy name>:<algorithm code>` (`fw`, `sw`, `tb`,
/// `sl`), one string per subject and policy; a limiter of two or more policies of one
/// subject (no named scope, no global counter, no in-flight policy) keeps them all
/// in one string, `<prefix>:{<subject>}:<set tag>:~`: one read and one write a check
/// where it would take one a policy, and one key's overhead in memory. Its TTL is
/// the longest any of its states needs. The set tag (12 hex digits) is a hash of
/// every policy of the limiter, names, algorithms and numbers: a policy changed under the same name (a rolling deploy that
/// lengthens a window, a second service on the same Redis that also calls its policy
/// "api") writes other keys, so no limiter ever reads state written under other
/// numbers. Instances of the old and the new configuration count apart while both
/// run; the new one starts from zero, which admits at most one window's limit again,
/// and the old keys expire within two of their own windows. The subject is escaped
/// (raw bytes outside `[A-Za-z0-9._=:/@-]` percent-escaped, hashes in hex), which
/// never emits `{` or `}`, so the hash tag is exactly the subject: all of a
/// subject's policies share one cluster slot, and no input can choose another slot or
/// reach another subject's key. Every write sets a
/// TTL equal to the time the state needs to decay back to unused (at most two
/// windows, three for a sliding window read with a clock that went back); no key
/// lives without one.
///
/// A shadow policy ([`Policy::shadow`](crate::Policy::shadow)) has the key and state it would have when
/// enforced, so switching it on carries its state over; the script writes it when it
/// admits and every enforced policy admits.
///
/// # Admin operations
///
/// [`Limiter::peek`](crate::Limiter::peek) and [`refund`](crate::Limiter::refund) are
/// records of the batch function with another operation, batched with the checks
/// beside them: a peek reads and writes nothing; a refund rewrites each state smaller
/// with `SET .. KEEPTTL` (the state only shrinks, so its TTL still covers it; Redis
/// 6.0 or later). [`reset`](crate::Limiter::reset) is a call of its own: a `DEL` of
/// the subject's keys for the limiter's policies and of its lease generation key.
///
/// With leases ([`crate::lease`]), a subject also has one more key,
/// `<prefix>:{<subject>}:~lease`, its lease generation (`~` is never in a policy
/// name, so it cannot be a policy's key, nor a joint one's `~`): written by leasing checks that grant units
/// (with the TTL of the states they write), read by give-backs, deleted by a reset.
/// Plain checks never touch it.
#[derive(Clone)]
pub struct RedisStore {
    link: Arc<Link>,
    settings: Arc<Settings>,
}

#[derive(Clone)]
struct Settings {
    prefix: Box<str>,
    clock: Option<Arc<dyn Clock>>,
    timeout: Duration,
    batching: Batching,
}

impl RedisStore {
    /// The Redis key that holds `subject`'s state for `policy` of `set`.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn key(
        &self,
        subject: &crate::subject::Subject,
        set: &crate::store::backend::PolicySet,
        policy: &crate::policy::Policy,
    ) -> String {
        keys::key(&self.settings.prefix, subject, set, policy)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.settings.prefix)
            .field(
                "clock",
                &if self.settings.clock.is_some() {
                    "client"
                } else {
                    "redis TIME"
                },
            )
            .field("timeout", &self.settings.timeout)
            .field("max_batch", &self.settings.batching.max_batch)
            .field("max_pipelined", &self.settings.batching.max_pipelined)
            .field("max_queue", &self.settings.batching.max_queue)
            .field("link", &self.link)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::contract::reply::{decode, Reply};
    use super::contract::Entry;
    use super::setup::without_password;
    use super::*;
    use crate::error::{StoreError, StoreErrorKind};
    use crate::internals::RedisStoreInternals;
    use crate::policy::Policy;
    use crate::store::backend::{Backend, PolicySet};
    use crate::subject::Subject;
    use deadpool_redis::redis::Value;
    use std::time::Duration;

    /// The decision of a check's `reply` over `policies`, as the store reads it.
    fn decision(
        policies: &Arc<[Policy]>,
        reply: Value,
    ) -> Result<crate::decision::Decision, StoreError> {
        decode::<Reply>(reply)?.decision(policies, 1)
    }

    fn store() -> RedisStore {
        let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1/")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        RedisStore::new(pool)
    }

    fn policies() -> Arc<[Policy]> {
        vec![
            Policy::fixed_window("a", 3, Duration::from_secs(1)).unwrap(),
            Policy::sliding_log("b", 5, Duration::from_secs(1)).unwrap(),
        ]
        .into()
    }

    #[tokio::test]
    async fn keys_keep_the_subject_in_one_hash_tag() {
        let store = store().prefix("app:rl").unwrap();
        let p = Policy::token_bucket("burst", 10, 1, Duration::from_secs(1)).unwrap();
        let set = PolicySet::new(vec![p.clone()]);
        let tag = set.key_tag();
        assert_eq!(
            store.key(&Subject::new("user:42"), &set, &p),
            format!("app:rl:{{user:42}}:{tag}:burst:tb")
        );
        assert_eq!(
            store.key(&Subject::new("}{"), &set, &p),
            format!("app:rl:{{%7D%7B}}:{tag}:burst:tb")
        );
        assert_eq!(
            store.key(&Subject::new(""), &set, &p),
            format!("app:rl:{{%}}:{tag}:burst:tb")
        );
    }

    #[tokio::test]
    async fn a_policy_changed_under_its_name_has_other_keys() {
        let store = store();
        let s = Subject::new("s");
        let second = Duration::from_secs(1);
        let fw = |limit, window| Policy::fixed_window("api", limit, window).unwrap();
        let key = |policies: Vec<Policy>| {
            let set = PolicySet::new(policies.clone());
            store.key(&s, &set, &policies[0])
        };
        let base = key(vec![fw(5, second)]);
        assert_eq!(base, key(vec![fw(5, second).shadow()]), "shadow keeps it");
        // A state means the same under another limit: the count is kept.
        assert_eq!(base, key(vec![fw(6, second)]), "a limit keeps it");
        for other in [
            key(vec![fw(5, second * 3_600)]),
            key(vec![fw(5, second).counting(crate::policy::Unit::Requests)]),
            key(vec![Policy::sliding_window("api", 5, second).unwrap()]),
            key(vec![fw(5, second), fw(1, second * 60).shadow()]),
        ] {
            assert_ne!(base, other);
            assert_eq!(hash_tag_of(&base), hash_tag_of(&other), "one slot");
        }
        // The tag is stable across processes and releases (a release changes it only
        // when it lays its states out anew): this value is what instances already
        // running compute.
        assert_eq!(
            PolicySet::new(vec![fw(5, second)]).key_tag(),
            "7b61b3ab4e1e"
        );
    }

    fn hash_tag_of(key: &str) -> &str {
        &key[key.find('{').unwrap()..=key.find('}').unwrap()]
    }

    #[tokio::test]
    async fn prefixes_that_could_break_keys_are_refused() {
        for bad in ["", "a{", "}", "a b", "x\n", &"p".repeat(33)] {
            assert!(store().prefix(bad).is_err(), "{bad:?}");
        }
        assert!(store().prefix("svc-1.rl:v2").is_ok());
    }

    #[test]
    fn passwords_are_hidden_in_urls_that_do_not_parse() {
        for (url, shown) in [
            ("redis://u:p@ss@h:1/", "redis://u:***@h:1/"),
            ("redis://u:p/ss:x@h", "redis://u:***@h"),
            ("redis//u:pw@h", "redis//u:***@h"),
            ("redis://:pw@h", "redis://:***@h"),
            ("redis://user@h:1", "redis://user@h:1"),
            ("redis://h:1/?password=pw", "redis://h:1/?password=***"),
            ("redis://h:1", "redis://h:1"),
            ("", ""),
        ] {
            assert_eq!(without_password(url), shown);
        }
    }

    #[tokio::test]
    async fn cluster_urls_are_checked_when_the_store_is_built() {
        let store =
            RedisStore::cluster_from_urls("redis://127.0.0.1:1, redis://127.0.0.1:2,".split(','))
                .unwrap();
        assert!(format!("{store:?}").contains("cluster"), "{store:?}");
        assert!(RedisStore::cluster_from_urls(["", " "]).is_err());
        assert!(RedisStore::cluster_from_urls(Vec::<String>::new()).is_err());
        assert!(RedisStore::cluster_from_urls(["not a url"]).is_err());
    }

    #[tokio::test]
    async fn a_cluster_that_cannot_be_reached_is_a_store_error_within_the_timeout() {
        let store = RedisStore::cluster_from_urls(["redis://127.0.0.1:1"])
            .unwrap()
            .timeout(Duration::from_millis(200));
        let set = PolicySet::new(policies().to_vec());
        let started = std::time::Instant::now();
        let err = store.check(Subject::new("s"), &set, 1).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            matches!(
                err.kind(),
                StoreErrorKind::Unavailable | StoreErrorKind::Timeout
            ),
            "{err}"
        );
    }

    /// A check's future is boxed, then moved and polled on every call: what a rare
    /// path awaits inline (a redirect, a load) is paid in copies by every call. 9,400
    /// bytes with the cluster's redirects inline cost about 8% of the requests/s of
    /// an HTTP app at 1,024 connections. A check that may queue holds no round trip
    /// (what a burst holds while it waits: BENCHMARKS.md); one that cannot (a
    /// cluster's) is its round trip.
    #[tokio::test]
    async fn a_check_s_future_stays_small() {
        let set = PolicySet::new(policies().to_vec());
        for (store, most) in [(store(), 1_024), (store().max_batch(1), 2_048)] {
            let check = store.check(Subject::new("s"), &set, 1);
            let size = std::mem::size_of_val(&*check);
            assert!(size <= most, "a check's future is {size} bytes");
        }
    }

    #[test]
    fn replies_map_to_outcomes_with_the_policy_limits() {
        let policies = policies();
        // a: allowed, 2 left, reset in 500 ms; b: denied, none left, reset in 400
        // ms, retry in 30 ms (packed as the Lua packs them).
        let packed = |allowed: i64, remaining: i64, reset: i64| {
            (reset << (1 + contract::PACK_REMAINING_BITS)) | (remaining << 1) | allowed
        };
        let reply = super::contract::reply::packed(&[packed(1, 2, 500), packed(0, 0, 400), 30]);
        let d = decision(&policies, reply).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.denied_by(), Some("b"));
        assert_eq!(d.limit(), 5);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(30)));
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let policies = policies();
        let bad = [
            Value::Nil,
            super::contract::reply::packed(&[1; 3]),
            super::contract::reply::packed(&[0]),
            super::contract::reply::packed(&[1, -5]),
            Value::Array(vec![Value::Okay; 2]),
        ];
        for reply in bad {
            let err = decision(&policies, reply).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol);
        }
    }

    #[test]
    fn each_script_holds_the_algorithms_of_its_policies_only() {
        use crate::policy::Algorithm;
        let policy = |algorithm, name: &str| {
            let w = std::time::Duration::from_secs(1);
            match algorithm {
                Algorithm::FixedWindow => Policy::fixed_window(name, 5, w),
                Algorithm::SlidingWindow => Policy::sliding_window(name, 5, w),
                Algorithm::TokenBucket => Policy::token_bucket(name, 5, 5, w),
                Algorithm::SlidingLog => Policy::sliding_log(name, 5, w),
                Algorithm::InFlight => Policy::in_flight(name, 5, w),
                #[cfg(feature = "calendar")]
                Algorithm::Calendar => {
                    Policy::calendar(name, 5, crate::policy::Period::Day, "UTC", 1)
                }
                // Without the feature no calendar quota can be made: the shapes below
                // leave it out.
                #[cfg(not(feature = "calendar"))]
                Algorithm::Calendar => Policy::fixed_window(name, 5, w),
            }
            .unwrap()
        };
        let defines = |source: &str, a: Algorithm| {
            source.contains(&format!("local function {}_read(", a.as_str()))
        };
        let mut hashes = std::collections::HashSet::new();
        let shapes = if cfg!(feature = "calendar") { 64u8 } else { 32 };
        for shape in 1..shapes {
            let policies: Vec<Policy> = Algorithm::ALL
                .into_iter()
                .enumerate()
                .filter(|(i, _)| shape & (1 << i) != 0)
                .map(|(i, a)| policy(a, &format!("p{i}")))
                .collect();
            let source = RedisStore::script_source(&policies);
            let admin = script::Shape::of(&policies, Entry::Admin).script().source();
            for a in Algorithm::ALL {
                let used = policies.iter().any(|p| p.algorithm() == a);
                assert_eq!(defines(source, a), used, "{a} in shape {shape:06b}");
                assert_eq!(defines(admin, a), used, "{a} in admin shape {shape:05b}");
                // A check never defines the refund functions it never runs.
                let refund = format!("REFUND[\"{}\"] = function(", contract::code(a));
                assert!(!source.contains(&refund), "{a} in shape {shape:05b}");
                assert_eq!(admin.contains(&refund), used, "{a} in admin {shape:05b}");
            }
            // Two policies of one algorithm, in any order, share the script.
            let mut twice = policies.clone();
            twice.push(policy(policies[0].algorithm(), "again"));
            twice.reverse();
            assert_eq!(
                RedisStore::script_sha1(&twice),
                RedisStore::script_sha1(&policies)
            );
            assert_eq!(RedisStore::script_sha1(&policies).len(), 40);
            hashes.insert(RedisStore::script_sha1(&policies));
        }
        assert_eq!(hashes.len(), usize::from(shapes) - 1);
        assert!(!hashes.contains(RedisStore::script_sha1(&[])));
    }
}
