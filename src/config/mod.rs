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

#[cfg(doc)]
use crate::key::Header;
#[cfg(doc)]
use crate::layer::Rules;
#[cfg(doc)]
use crate::limiter::Limiter;

mod build;
mod error;
mod file;
mod load;
mod policy;
mod rules;

pub use error::ConfigError;
pub use load::Config;
