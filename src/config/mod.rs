//! Policies, rules and trusted proxies from a TOML file (feature `config`).
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use redlimit::config::Config;
//! use redlimit::key::Secret;
//! use redlimit::{MemoryStore, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! let config = Config::from_toml_str(r#"
//! trusted_proxies = ["10.0.0.0/8"]   # X-Forwarded-For is believed only from these
//! ipv6_prefix = 64                   # one IPv6 client = one /64
//!
//! [[policies]]
//! name = "login"
//! algorithm = "fixed_window"         # sliding_window, sliding_log, token_bucket, in_flight
//! limit = 3
//! window = "1m"                      # 500ms, 10s, 1m, 1h, 1d
//!
//! [[policies]]
//! name = "api-burst"
//! algorithm = "token_bucket"
//! capacity = 20                      # the largest burst
//! refill = 10                        # tokens added every `window`
//! window = "1s"
//!
//! [[policies]]
//! name = "api-hour"
//! algorithm = "sliding_window"
//! limit = 1000
//! window = "1h"
//!
//! [[rules]]
//! method = "POST"
//! path = "/login"
//! policy = "login"
//! key = "ip"                          # ip, global, route, header:NAME, or a+b
//!
//! [[rules]]
//! path = "/api/{*rest}"
//! policies = ["api-burst", "api-hour"]
//! key = "header:x-api-key"
//!
//! [[rules]]
//! grpc = "shop.v1.Orders/Place"      # or a whole service: "shop.v1.Orders"
//! policy = "login"
//! key = "ip+route"
//!
//! [default]                          # requests no rule matches (none: they pass)
//! policy = "api-hour"
//! key = "ip"
//! "#)?;
//!
//! // API keys are hashed with a secret kept out of the file (read it from the
//! // environment or a secret store). Without it, `rules` names the key that needs it.
//! assert_eq!(
//!     config.rules(MemoryStore::new()).unwrap_err().to_string(),
//!     "line 33, rules[1].key: \"header:x-api-key\" hashes its values with a secret that is \
//!      not in the file: pass one with Config::header_secret (say, Secret::from_env(..)) \
//!      before Config::rules",
//! );
//! # std::env::set_var("REDLIMIT_SECRET", "a long random value");
//! let secret = Secret::from_env("REDLIMIT_SECRET").expect("REDLIMIT_SECRET");
//! let layer = RateLimitLayer::rules(config.header_secret(secret).rules(MemoryStore::new())?);
//! # let _ = layer;
//!
//! let typo = Config::from_toml_str("[[policies]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1 min\"\n");
//! assert_eq!(
//!     typo.unwrap_err().to_string(),
//!     r#"line 5, policies[0].window: "1 min" is not a duration such as "500ms", "10s", "1m", "1h" or "1d""#,
//! );
//! # Ok::<(), redlimit::config::ConfigError>(())
//! ```
//!
//! Every field, key and algorithm (`in_flight` too: `limit` and `slot_ttl`) is in the
//! crate's docs/config.md, whose complete example the tests load.
//!
//! Loading checks everything: unknown fields, types, policy names and their numbers,
//! path patterns, methods, keys, proxy networks. Each error names the line and the field
//! (`line 7, rules[1].policy: unknown policy "logn"`), so a bad file fails at start-up
//! and says where. [`Config::rules`] then builds the [`Rules`] on a store, one
//! [`Limiter`] per rule. The store keeps state by policies and subject, so rules with the
//! same policies whose keys give the same subject share one count; add `+route` to the
//! key for a count per route. API keys named by `header:NAME` are kept only as keyed
//! hashes (see [`Header`]), keyed by [`Config::header_secret`], which [`Config::rules`]
//! requires when a key names a header.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;

use crate::error::debug_as_display;
#[cfg(doc)]
use crate::key::Header;
use crate::key::{ClientIp, Secret};
use crate::layer::Rules;
#[cfg(doc)]
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::store::Store;

mod build;
mod file;
mod policy;
mod rules;

use file::{RawConfig, Source};
use rules::{RuleSpec, TargetSpec};

/// A validated configuration: named policies, rules in order, a default, and how client
/// addresses are found. Built by [`Config::from_toml_str`] or [`Config::from_path`].
#[derive(Debug, Clone)]
pub struct Config {
    policies: Vec<Policy>,
    rules: Vec<RuleSpec>,
    default: Option<TargetSpec>,
    client_ip: ClientIp,
    /// What `header:NAME` keys hash with; its `Debug` shows nothing of it.
    header_secret: Option<Secret>,
    /// The file it came from, for the errors of [`Config::rules`].
    path: Option<PathBuf>,
}

/// Why a configuration was refused: where (file, line) and which field, and what is
/// wrong. Its `Display` is `line 7, rules[1].policy: unknown policy "logn"`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    path: Option<PathBuf>,
    line: Option<usize>,
    field: String,
    message: String,
}

impl ConfigError {
    /// The line (from 1) the error is on, when it is about the file's content.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The field, as a path such as `rules[1].policy` (empty for a syntax error or a
    /// file that cannot be read).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The file, when loaded with [`Config::from_path`].
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        if let Some(line) = self.line {
            write!(f, "line {line}")?;
            if !self.field.is_empty() {
                f.write_str(", ")?;
            }
        }
        if !self.field.is_empty() {
            f.write_str(&self.field)?;
        }
        if self.line.is_some() || !self.field.is_empty() {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

debug_as_display!(ConfigError);

impl Config {
    /// Parses and checks a configuration.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let source = Source { text };
        let raw = source.parse()?;
        let config = validate(&source, &raw)?;
        config.check_patterns()?;
        Ok(config)
    }

    /// Reads, parses and checks the configuration in the file at `path`; errors name
    /// the file too.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let with_path = |mut error: ConfigError| {
            error.path = Some(path.to_owned());
            error
        };
        let text = std::fs::read_to_string(path).map_err(|error| {
            with_path(ConfigError {
                path: None,
                line: None,
                field: String::new(),
                message: error.to_string(),
            })
        })?;
        let mut config = Self::from_toml_str(&text).map_err(with_path)?;
        config.path = Some(path.to_owned());
        Ok(config)
    }

    /// The rules on `store`: one limiter per rule (and for the default), with the
    /// rule's policies and key.
    ///
    /// Fails only when a key names a header (`header:NAME`) and no
    /// [`Config::header_secret`] was given; the error names the key's line and field.
    pub fn rules<S: Store + Clone>(&self, store: S) -> Result<Rules<S>, ConfigError> {
        self.build(store, |spec| self.key(spec))
    }

    /// The server-side secret that `header:NAME` keys hash their values with (see
    /// [`Header`] and [`Secret`]); the same on every instance that shares a Redis.
    ///
    /// Not read from the file, so the file can be checked in: pass it from the
    /// environment ([`Secret::from_env`]) or a secret store. There is no default (it
    /// would be public): [`Config::rules`] refuses header keys without it.
    pub fn header_secret(mut self, secret: Secret) -> Self {
        self.header_secret = Some(secret);
        self
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.name() == name)
    }

    /// The client-address extractor with the file's trusted proxies and IPv6 prefix
    /// (what the `ip` key uses).
    pub fn client_ip(&self) -> &ClientIp {
        &self.client_ip
    }
}

/// The file's values, checked: everything but the patterns, which the rules API judges.
fn validate(source: &Source<'_>, raw: &RawConfig) -> Result<Config, ConfigError> {
    let policies = policy::policies(source, &raw.policies)?;
    let rules = rules::rules(source, &policies, &raw.rules)?;
    let default = raw
        .default
        .as_ref()
        .map(|default| {
            rules::target(
                source,
                &policies,
                default.span(),
                "default",
                default.get_ref(),
            )
        })
        .transpose()?;
    Ok(Config {
        policies,
        rules,
        default,
        client_ip: client_ip(source, raw)?,
        header_secret: None,
        path: None,
    })
}

/// The client-address extractor of the `ip` key: trusted proxies and IPv6 prefix.
fn client_ip(source: &Source<'_>, raw: &RawConfig) -> Result<ClientIp, ConfigError> {
    let mut proxies = Vec::with_capacity(raw.trusted_proxies.len());
    for (i, proxy) in raw.trusted_proxies.iter().enumerate() {
        let text = proxy.get_ref().trim();
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| {
                source.error(
                    proxy.span(),
                    format!("trusted_proxies[{i}]"),
                    format!("{text:?} is not an IP network such as \"10.0.0.0/8\" or an address"),
                )
            })?;
        proxies.push(net);
    }
    let mut client_ip = ClientIp::new().trust_proxies(proxies);
    if let Some(bits) = &raw.ipv6_prefix {
        if !(1..=128).contains(bits.get_ref()) {
            return Err(source.error(
                bits.span(),
                "ipv6_prefix".into(),
                format!("{} is not a prefix length from 1 to 128", bits.get_ref()),
            ));
        }
        client_ip = client_ip.ipv6_prefix(*bits.get_ref());
    }
    Ok(client_ip)
}
