//! How a [`RedisStore`] is made and set: its constructors (one server or a cluster, a
//! pool or URLs), its settings, its call counters, and the error of the URLs and
//! prefixes it refuses (a URL's password never shown).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::cluster::Pool as ClusterPool;
use deadpool_redis::Pool;

use super::batch::{self, Batching};
use super::conn::Source;
use super::link::Link;
use super::{RedisStore, Settings, DEFAULT_PREFIX, DEFAULT_TIMEOUT, MAX_PREFIX_LEN};
use crate::clock::Clock;
use crate::error::debug_as_display;

/// A setting a [`RedisStore`] cannot take: a URL it cannot read, or a key prefix that
/// would break its keys.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A Redis URL that [`RedisStore::from_url`] or [`RedisStore::cluster_from_urls`]
    /// cannot read: `urls` names it (or the cluster's URLs), each with its password
    /// shown as `***`, and `reason` says why.
    #[error("cannot read {}: {reason}", Shown(urls))]
    #[non_exhaustive]
    Url {
        /// The URL refused, or all of a cluster's when they do not go together
        /// (none when none was given), passwords shown as `***`.
        urls: Vec<String>,
        /// Why it was refused.
        reason: String,
    },
    /// A key prefix ([`RedisStore::prefix`]) that is empty, too long, or has
    /// characters that could break the key's layout (`{`, `}`, spaces, control bytes).
    #[error(
        "Redis key prefix {0:?} must be 1 to 32 characters of A-Z, a-z, 0-9, '_', '-', '.' or ':'"
    )]
    Prefix(String),
}

impl SetupError {
    /// `urls` refused for `reason`: the one URL that did not parse, or all of a
    /// cluster's when they do not go together (different passwords, say).
    fn url<'a>(urls: impl IntoIterator<Item = &'a str>, reason: impl fmt::Display) -> Self {
        Self::Url {
            urls: urls.into_iter().map(without_password).collect(),
            reason: reason.to_string(),
        }
    }
}

debug_as_display!(SetupError);

/// The URLs of a [`SetupError::Url`], as its message names them.
struct Shown<'a>(&'a [String]);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("the Redis Cluster URLs"),
            [url] => write!(f, "the Redis URL {url:?}"),
            urls => {
                f.write_str("the Redis Cluster URLs ")?;
                for (i, url) in urls.iter().enumerate() {
                    let comma = if i == 0 { "" } else { ", " };
                    write!(f, "{comma}{url:?}")?;
                }
                Ok(())
            }
        }
    }
}

/// `url` with its password shown as `***`: the user part's
/// (`redis://user:password@host`) and a socket URL's `pass` parameter
/// (`redis+unix:///run/redis.sock?pass=password`).
///
/// It is shown for URLs that did not parse, so it reads them warily: the user part runs
/// from the scheme's `://` (or the start, when there is none) to the last `@`, and all
/// of it after the first `:` is hidden, whatever it holds (an unescaped `@`, `/` or
/// `:` in a password, a `:` missing from `redis://`).
pub(super) fn without_password(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let mut shown = url.to_owned();
    if let Some(at) = url[start..].rfind('@').map(|at| start + at) {
        if let Some(colon) = url[start..at].find(':').map(|colon| start + colon) {
            shown = format!("{}:***{}", &url[..colon], &url[at..]);
        }
    }
    if let Some(query_at) = shown.find('?') {
        let (head, query) = shown.split_at(query_at + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if name == "pass" || name == "password" => format!("{name}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        shown = format!("{head}{}", query.join("&"));
    }
    shown
}

impl RedisStore {
    /// A store on a connection it takes out of `pool`, deciding on Redis `TIME`, with
    /// the prefix `rl` and a 50 ms timeout.
    ///
    /// For an application that already has a pool, or needs its TLS: the pool's
    /// connection reads its replies on a task of redis's own, which a starved runtime
    /// or host may run only after a call's timeout fired, so under such load a call
    /// can time out (and fail open) on a reply that had arrived. Prefer
    /// [`RedisStore::from_url`], whose connection the store drives itself. Connects
    /// lazily; [`RedisStore::connect`] connects now.
    pub fn new(pool: Pool) -> Self {
        Self::on(Source::Node(pool))
    }

    /// A store on the Redis server at `url` (`redis://[user:password@]host:port/[db]`,
    /// or `redis+unix:///path/to/socket`), on a connection of its own, with the same
    /// defaults as [`RedisStore::new`]. Connects lazily; [`RedisStore::connect`]
    /// connects now.
    ///
    /// Prefer it to a pool: the store then drives its connection itself, so a call
    /// whose timer fires late (a starved app or host) first reads the replies that
    /// have arrived, and a reply that arrived is a decision (see
    /// [`RedisStore::timeout`]). On a pool's connection, replies are read by a task
    /// of redis's own, which a starved runtime may run too late. No TLS: for
    /// `rediss://`, give [`RedisStore::new`] a pool built with TLS.
    ///
    /// Fails when `url` does not parse ([`SetupError::Url`]); the error shows it
    /// without its password.
    pub fn from_url(url: &str) -> Result<Self, SetupError> {
        use deadpool_redis::redis::IntoConnectionInfo;
        let info = url
            .into_connection_info()
            .map_err(|e| SetupError::url([url], e))?;
        Ok(Self::on(Source::Direct(Box::new(info))))
    }

    /// A store on a Redis Cluster, through the application's cluster pool, with the
    /// same defaults as [`RedisStore::new`].
    ///
    /// Each call goes to the master of its subject's slot in one round trip; the
    /// connection follows failovers and resharding by itself. Connects lazily.
    ///
    /// The pool's client resends a command after an I/O error, when it may have run,
    /// so a call cut off after it ran may be counted twice (see
    /// [Redis Cluster](RedisStore#redis-cluster)); [`RedisStore::cluster_from_urls`] does not.
    pub fn cluster(pool: ClusterPool) -> Self {
        Self::on(Source::Cluster(pool))
    }

    /// A store on the Redis Cluster that `urls` lead to (`redis://host:port`, any
    /// number of its nodes; the others are discovered), for a list such as
    /// `REDIS_CLUSTER=redis://h1:p1,redis://h2:p2` split at its commas.
    ///
    /// Blank entries are skipped, so a trailing comma is harmless. Connects lazily.
    /// Fails when no URL is left, one does not parse, or they do not go together
    /// (different passwords, a socket path): a [`SetupError::Url`] that names the
    /// URLs without their passwords.
    ///
    /// The store builds its own cluster client, with no retries: a call is sent again
    /// only after a node's `MOVED` or `ASK` (it did not run), never after an error
    /// that leaves its fate unknown (see [Redis Cluster](RedisStore#redis-cluster)).
    pub fn cluster_from_urls<I>(urls: I) -> Result<Self, SetupError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        use deadpool_redis::redis::IntoConnectionInfo;
        let urls: Vec<String> = urls
            .into_iter()
            .map(|url| url.as_ref().trim().to_owned())
            .filter(|url| !url.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(SetupError::url(
                [],
                "none given (blank entries are skipped)",
            ));
        }
        let nodes = urls
            .iter()
            .map(|url| {
                url.as_str()
                    .into_connection_info()
                    .map_err(|e| SetupError::url([url.as_str()], e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // No retries: the client would resend a call after an I/O error, when it may
        // have run (a double count); the store follows redirects itself. What is left
        // to refuse is about the URLs together (different passwords, say).
        let client = deadpool_redis::cluster::ClusterClient::builder(nodes)
            .retries(0)
            .build()
            .map_err(|e| SetupError::url(urls.iter().map(String::as_str), e))?;
        Ok(Self::on(Source::ClusterClient(Box::new(client))))
    }

    fn on(source: Source) -> Self {
        Self {
            link: Arc::new(Link::new(source)),
            settings: Arc::new(Settings {
                prefix: DEFAULT_PREFIX.into(),
                clock: None,
                timeout: DEFAULT_TIMEOUT,
                batching: Batching::default(),
            }),
        }
    }

    /// Sets the prefix of every key, so several limiters (or apps) can share a Redis.
    ///
    /// Short, since it is repeated in every key: 1 to 32 characters of `A-Z a-z 0-9 _ - . :`;
    /// anything else is a [`SetupError::Prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, SetupError> {
        let prefix = prefix.into();
        let valid = !prefix.is_empty()
            && prefix.len() <= MAX_PREFIX_LEN
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if !valid {
            return Err(SetupError::Prefix(prefix));
        }
        Arc::make_mut(&mut self.settings).prefix = prefix.into();
        Ok(self)
    }

    /// Decides on `clock` instead of Redis `TIME`.
    ///
    /// For tests on a [`FakeClock`](crate::clock::FakeClock), and for deployments
    /// that keep their clocks in sync and want Redis to do less. Instances with skewed
    /// clocks disagree on windows, so prefer the default. Key TTLs still run on the
    /// Redis server's clock.
    pub fn client_clock(mut self, clock: impl Clock) -> Self {
        Arc::make_mut(&mut self.settings).clock = Some(Arc::new(clock));
        self
    }

    /// Sets how long Redis may stay silent (default 50 ms) before a call fails with
    /// [`StoreErrorKind::Timeout`](crate::store::StoreErrorKind::Timeout):
    /// a rate limiter must not become the slow part of a request.
    ///
    /// The timeout measures Redis, not the application: a call times out when the
    /// connection has delivered nothing at all for `timeout` after the call (or, for a
    /// queued check, its queueing): Redis stopped, paused or unreachable. While
    /// replies keep arriving for the calls sent before it (Redis answers in order on
    /// one connection), the call is only behind a busy app or a deep pipeline, and it
    /// waits for its own reply, at most 1 s (or `timeout`, if longer) from its send.
    ///
    /// On the store's own connection ([`RedisStore::from_url`]), a call whose timer
    /// fires drives the connection itself before it judges: it reads what has
    /// arrived, writes what waited unwritten, and looks into the socket for bytes the
    /// runtime has not seen yet. A reply that arrived is a decision, however starved
    /// the app that reads it late (2,000 checks of 17 policies at once, beside two
    /// busy loops per core: all decided, BENCHMARKS.md). On a pool's connection
    /// ([`RedisStore::new`]) replies are counted when the calls they answer read them,
    /// so a runtime starved so badly that no call completes for a whole `timeout`
    /// still looks like a silent Redis. On a Redis Cluster, whose connection
    /// multiplexes several nodes (one node's replies say nothing of another's), the
    /// timeout runs from the send.
    ///
    /// `Duration::MAX`, or any timeout too large to add to the clock, means no timeout
    /// at all. A timeout under 1 ms (tokio's timer resolution) is read as 1 ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.settings).timeout = timeout;
        self
    }

    /// Sets the most checks one call to Redis decides (default 32, at most 255).
    ///
    /// While [`RedisStore::max_pipelined`] calls are pipelined on the store's
    /// connection (sent, not yet answered), further checks queue; when one of those calls ends, up to
    /// `max_batch` of them go as one `FCALL` that decides each as its own call would
    /// (all or nothing across its own policies, in the order they queued, never
    /// across checks). Redis then pays the call, its parsing and its reply once per
    /// batch: a fraction of the Redis CPU per decision under load, and more
    /// decisions a second (BENCHMARKS.md). A batch also makes at most 64 policy
    /// decisions (one check's, however many policies it has): 32 checks of one or two
    /// policies, 3 of seventeen, so no call holds Redis long. At low load nothing
    /// queues. `1` (or `0`)
    /// turns batching off. Leasing checks, give-backs and resets always go
    /// alone (they are rare), and so does every call on a Redis Cluster, where the
    /// checks of different subjects mostly lie in different slots.
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        Arc::make_mut(&mut self.settings).batching.max_batch = max_batch.clamp(1, batch::MAX_BATCH);
        self
    }

    /// Sets how many calls may be pipelined on the store's connection (sent, not yet
    /// answered) before checks queue for the next batch (default 2; `0` is read as 1, `usize::MAX` never
    /// queues): more lets Redis work while a reply travels, fewer makes larger
    /// batches. See [`RedisStore::max_batch`].
    pub fn max_pipelined(mut self, max_pipelined: usize) -> Self {
        Arc::make_mut(&mut self.settings).batching.max_pipelined = max_pipelined.max(1);
        self
    }

    /// Sets how many checks may wait for the next batch (default 100,000; `0` sheds
    /// every check that would wait, `usize::MAX` never sheds).
    ///
    /// While Redis answers, a queued check waits for its turn however long the queue
    /// ahead of it: it is decided, never failed for its place in line (it fails only
    /// when Redis says nothing for the whole [`RedisStore::timeout`]). A burst of
    /// 100,000 checks at once is decided at Redis's pace (BENCHMARKS.md). A check
    /// that finds the queue full is shed at once with
    /// [`StoreErrorKind::Overloaded`](crate::store::StoreErrorKind::Overloaded),
    /// which the layer answers with the limiter's fallback, or 503 even when it
    /// fails open: shedding load never lets a request through unchecked. Counted in
    /// [`RedisStore::calls_shed`].
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        Arc::make_mut(&mut self.settings).batching.max_queue = max_queue;
        self
    }

    /// How many calls this store and its clones have sent to Redis (each one round
    /// trip, whatever came back): for metrics, and for measuring what leases save.
    pub fn calls_sent(&self) -> u64 {
        self.link.calls.load(Ordering::Relaxed)
    }

    /// How many calls of this store and its clones ended without a decision: timed
    /// out, refused by the server, or failed on the connection (or found it being
    /// replaced), or queued for a batch that went with the runtime that was to send
    /// it; a batch that failed counts each of its checks. Each went to the limiter's
    /// fallback or the layer's failure mode, so an operator can watch this (beside
    /// [`RedisStore::calls_sent`]) without a log subscriber; the `metrics` feature
    /// counts the same by kind.
    pub fn calls_failed(&self) -> u64 {
        self.link.failures.load(Ordering::Relaxed)
    }

    /// How many of [`RedisStore::calls_failed`] timed out: Redis answered nothing
    /// for the whole timeout (see [`RedisStore::timeout`]).
    pub fn calls_timed_out(&self) -> u64 {
        self.link.timeouts.load(Ordering::Relaxed)
    }

    /// How many of [`RedisStore::calls_failed`] were checks shed because
    /// [`RedisStore::max_queue`] checks already waited.
    pub fn calls_shed(&self) -> u64 {
        self.link.shed.load(Ordering::Relaxed)
    }
}
