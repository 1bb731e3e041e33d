//! Errors of [`Limiter::check`](crate::Limiter::check) and of the stores, and how every
//! error of the crate shows itself. They sit on the bottom floor: every other module
//! may name them.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// Why a check could not be decided.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cost of zero would consume nothing; use a peek instead.
    #[error("the cost of a request must be at least 1")]
    ZeroCost,
    /// A cost larger than some policy can ever admit would be denied forever.
    #[error("cost {cost} exceeds {max}, the most policy {policy:?} can ever admit")]
    CostTooHigh {
        /// The cost asked for.
        cost: u64,
        /// The largest admissible cost.
        max: u64,
        /// The policy that could never admit it.
        policy: String,
    },
    /// The limiter's policies count a named scope the check's subject does not carry
    /// ([`Subject::within`](crate::Subject::within)): a setup mistake (the layer's
    /// key extractor's [`within`](crate::key::KeyExtractorExt::within) gives each), never a denial.
    #[error("the limiter counts scope {0:?}, which the check's subject does not carry (Subject::within)")]
    MissingScope(String),
    /// A live limit names no policy of the limiter, or a limit it cannot take.
    #[error("live limit: {0}")]
    BadLimit(String),
    /// The store failed; this is never a denial.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Implements `Debug` as the type's `Display`: the crate's errors show their message,
/// never their variant (`ZeroLimit("login")`), since `Debug` is what a `main` that
/// returns an error prints (`Error: policy "login": the limit must be at least 1`), and
/// what `unwrap` and `expect` print. Each message names the value it refuses, so
/// nothing the variant said is lost; code that needs the variant matches on it.
macro_rules! debug_as_display {
    ($($error:ty),+ $(,)?) => {$(
        impl ::std::fmt::Debug for $error {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Display::fmt(self, f)
            }
        }
    )+};
}
pub(crate) use debug_as_display;

debug_as_display!(Error);

/// What went wrong with a store: it is never shown to clients as a 429.
///
/// A clone is the same failure with the same cause (shared): the requests waiting for
/// one leasing check all answer with its error.
#[derive(Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

/// The broad class of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer within its timeout.
    Timeout,
    /// The store could not be reached or refused the call.
    Unavailable,
    /// The store answered with something that is not a decision.
    Protocol,
    /// The store had more checks waiting than it takes
    /// ([`RedisStore::max_queue`](crate::RedisStore::max_queue)): this one was
    /// shed before Redis saw it. The layer answers it with the limiter's fallback,
    /// or 503 even when failing open: shedding load never lets a request through
    /// unchecked.
    Overloaded,
}

impl StoreError {
    /// A store error of `kind` caused by `source`.
    pub fn new(kind: StoreErrorKind, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind,
            source: Some(Arc::from(source.into())),
        }
    }

    /// A timeout, with no further cause.
    pub fn timeout() -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            source: None,
        }
    }

    /// The class of failure.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The same failure for another caller (the checks of one batch share its
    /// failure); the cause is kept as its text.
    #[cfg(feature = "redis")]
    pub(crate) fn duplicate(&self) -> Self {
        Self {
            kind: self.kind,
            source: self
                .source
                .as_ref()
                .map(|s| Arc::from(Box::<dyn StdError + Send + Sync>::from(s.to_string()))),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Timeout => "timed out",
            StoreErrorKind::Unavailable => "is unavailable",
            StoreErrorKind::Protocol => "answered something unexpected",
            StoreErrorKind::Overloaded => "is overloaded (check shed)",
        };
        write!(f, "rate-limit store {what}")?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

debug_as_display!(StoreError);

/// What a user sees: every public error's `Debug` (what `main` prints) is its message,
/// naming the value it refuses, never the variant.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::key::{Global, Header, KeyRejection, Secret};
    use crate::layer::Rules;
    use crate::lease::Leases;
    use crate::store::{StoreError, StoreErrorKind};
    #[cfg(feature = "redis")]
    use crate::RedisStore;
    use crate::{Error, Limiter, MemoryStore, Policy, RateLimitLayer};

    const MINUTE: Duration = Duration::from_secs(60);

    /// What a `main` returning `Result<(), Box<dyn std::error::Error>>` prints when
    /// `?` hands it `error`: the standard library writes `Error: {:?}`.
    fn printed(error: impl std::error::Error + 'static) -> String {
        let boxed: Box<dyn std::error::Error> = Box::new(error);
        format!("Error: {boxed:?}")
    }

    /// `error` prints as `Error: ` and its message, which holds each of `names`, and
    /// does not hold `variant`.
    fn reads<E: std::error::Error + 'static>(error: E, names: &[&str], variant: &str) {
        let message = error.to_string();
        let shown = printed(error);
        assert_eq!(shown, format!("Error: {message}"));
        for name in names {
            assert!(shown.contains(name), "{name:?} is not in {shown:?}");
        }
        assert!(!shown.contains(variant), "{variant:?} is in {shown:?}");
    }

    #[test]
    fn policy_errors() {
        let zero = Policy::sliding_window("login", 0, MINUTE).unwrap_err();
        reads(zero, &["\"login\"", "at least 1"], "ZeroLimit");
        let bad = Policy::fixed_window("log in", 5, MINUTE).unwrap_err();
        reads(bad, &["\"log in\""], "BadName");
        let short = Policy::token_bucket("api", 5, 1, Duration::ZERO).unwrap_err();
        reads(short, &["\"api\"", "1 ms"], "WindowTooShort");
    }

    #[test]
    fn check_errors() {
        let limiter = Limiter::new(
            MemoryStore::new(),
            Policy::fixed_window("login", 3, MINUTE).unwrap(),
        );
        let layer = RateLimitLayer::new(limiter, Global);
        let too_high = layer.clone().cost(100).unwrap_err();
        reads(too_high, &["100", "\"login\"", "3"], "CostTooHigh");
        reads(layer.cost(0).unwrap_err(), &["at least 1"], "ZeroCost");
        let store = Error::from(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        ));
        reads(store, &["unavailable", "connection refused"], "Store(");
        reads(StoreError::timeout(), &["timed out"], "Timeout");
    }

    #[test]
    fn build_errors() {
        let none = Limiter::builder(MemoryStore::new()).build().unwrap_err();
        reads(none, &["at least one policy"], "NoPolicy");
        let twice = Limiter::builder(MemoryStore::new())
            .policy(Policy::fixed_window("login", 3, MINUTE).unwrap())
            .policy(Policy::sliding_window("login", 3, MINUTE).unwrap())
            .build()
            .unwrap_err();
        reads(twice, &["\"login\"", "unique"], "DuplicateName");
        let leased_log = Limiter::builder(MemoryStore::new())
            .policy(Policy::sliding_log("exact", 3, MINUTE).unwrap())
            .leases(Leases::new())
            .build()
            .unwrap_err();
        reads(leased_log, &["\"exact\"", "sliding log"], "LeaseSlidingLog");
    }

    #[test]
    fn key_errors() {
        let unset = "REDLIMIT_ERROR_TEST_UNSET_SECRET";
        std::env::remove_var(unset);
        reads(Secret::from_env(unset).unwrap_err(), &[unset], "MissingEnv");
        reads(Secret::new("").unwrap_err(), &["empty"], "Empty");
        let secret = Secret::new("s").unwrap();
        let header = Header::new("x api key", &secret).unwrap_err();
        reads(
            header,
            &["\"x api key\"", "header name"],
            "InvalidHeaderName",
        );
        let rejection = KeyRejection::new(http::StatusCode::UNAUTHORIZED, "not authenticated");
        reads(rejection, &["401", "not authenticated"], "KeyRejection");
    }

    #[test]
    fn rule_errors() {
        let limiter = Limiter::new(
            MemoryStore::new(),
            Policy::fixed_window("api", 3, MINUTE).unwrap(),
        );
        let err = Rules::builder()
            .path("/users/{id", limiter, Global)
            .build()
            .unwrap_err();
        reads(err, &["rule 0", "\"/users/{id\""], "RuleError");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_url_errors_hide_the_password() {
        let err = RedisStore::from_url("redis://app:hunter2@db.internal:port/0").unwrap_err();
        let shown = printed(err.clone());
        assert!(!shown.contains("hunter2"), "{shown}");
        reads(err, &["\"redis://app:***@db.internal:port/0\""], "Url {");
        let socket =
            RedisStore::from_url("redis+unix:///run/r.sock?db=x&pass=hunter2").unwrap_err();
        assert!(!printed(socket.clone()).contains("hunter2"), "{socket}");
        reads(socket, &["redis+unix:///run/r.sock?db=x&pass=***"], "Url {");

        // The cluster's nodes: the one that does not parse, or all of them when they
        // do not go together.
        let err = RedisStore::cluster_from_urls(["redis://h1:7000", "redis://:hunter2@h2:x"])
            .unwrap_err();
        assert!(!printed(err.clone()).contains("hunter2"), "{err}");
        reads(err, &["\"redis://:***@h2:x\""], "Config(");
        let err = RedisStore::cluster_from_urls(["redis://:pw1@h1:7000", "redis://:pw2@h2:7000"])
            .unwrap_err();
        let shown = printed(err.clone());
        assert!(!shown.contains("pw1") && !shown.contains("pw2"), "{shown}");
        reads(
            err,
            &[
                "\"redis://:***@h1:7000\", \"redis://:***@h2:7000\"",
                "password",
            ],
            "Config(",
        );
        let none = RedisStore::cluster_from_urls([" ", ""]).unwrap_err();
        reads(none, &["Redis Cluster URLs: none given"], "Config(");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn prefix_errors() {
        let store = RedisStore::from_url("redis://127.0.0.1:1/").unwrap();
        reads(store.prefix("a b").unwrap_err(), &["\"a b\""], "Prefix(");
    }

    #[cfg(feature = "config")]
    #[test]
    fn config_errors() {
        let toml = "[[policies]]\nname = \"login\"\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1m\"\n";
        let err = crate::config::Config::from_toml_str(toml).unwrap_err();
        reads(err, &["line 4", "policies[0]", "at least 1"], "ConfigError");
    }
}
