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
//! algorithm = "fixed_window"         # sliding_window, sliding_log, token_bucket
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
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use crate::key::{ClientIp, Global, Header, KeyExtractor, KeyExtractorExt, Route, Secret};
use crate::layer::rules::{Pattern, Rule, Rules, Target};
use crate::limiter::{Limiter, LimiterBuilder};
use crate::policy::Policy;
use crate::store::Store;

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
#[derive(Debug, Clone, PartialEq, Eq)]
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

#[derive(Debug, Clone)]
struct RuleSpec {
    method: Option<Method>,
    pattern: Pattern,
    target: TargetSpec,
}

#[derive(Debug, Clone)]
struct TargetSpec {
    /// At least one policy by construction: the first, then the others.
    first: Policy,
    more: Vec<Policy>,
    key: Vec<KeyPart>,
    /// Where the key is written (`rules[1].key` and its line), for the error when a
    /// header key has no secret.
    key_field: String,
    key_line: usize,
}

#[derive(Debug, Clone)]
enum KeyPart {
    Ip,
    Global,
    Route,
    Header(HeaderName),
}

// The file as written: every value keeps its span, for the line in errors.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    ipv6_prefix: Option<Spanned<u8>>,
    #[serde(default)]
    policies: Vec<Spanned<RawPolicy>>,
    #[serde(default)]
    rules: Vec<Spanned<RawRule>>,
    default: Option<Spanned<RawTarget>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: Spanned<String>,
    algorithm: Spanned<String>,
    limit: Option<Spanned<u32>>,
    window: Option<Spanned<String>>,
    capacity: Option<Spanned<u32>>,
    refill: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    method: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    grpc: Option<Spanned<String>>,
    policy: Option<Spanned<String>>,
    policies: Option<Spanned<Vec<Spanned<String>>>>,
    key: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    policy: Option<Spanned<String>>,
    policies: Option<Spanned<Vec<Spanned<String>>>>,
    key: Option<Spanned<String>>,
}

/// Turns byte spans into line numbers and errors.
struct Source<'a> {
    text: &'a str,
}

impl Source<'_> {
    fn line(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn error(&self, span: Range<usize>, field: String, message: impl Into<String>) -> ConfigError {
        ConfigError {
            path: None,
            line: Some(self.line(span)),
            field,
            message: message.into(),
        }
    }
}

impl Config {
    /// Parses and checks a configuration.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let source = Source { text };
        let raw = parse(&source)?;
        validate(&source, raw)
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
        let target = |spec: &TargetSpec| -> Result<Target<S>, ConfigError> {
            let limiter = spec
                .more
                .iter()
                .cloned()
                .fold(
                    Limiter::builder(store.clone()).policy(spec.first.clone()),
                    LimiterBuilder::policy,
                )
                .build()
                .map_err(|error| ConfigError {
                    path: self.path.clone(),
                    line: None,
                    field: String::new(),
                    message: error.to_string(),
                })?;
            Ok(Target::shared(Arc::new(limiter), self.key(spec)?))
        };
        Ok(Rules {
            rules: self
                .rules
                .iter()
                .map(|rule| {
                    Ok(Rule {
                        method: rule.method.clone(),
                        pattern: rule.pattern.clone(),
                        target: target(&rule.target)?,
                    })
                })
                .collect::<Result<_, ConfigError>>()?,
            default: self.default.as_ref().map(target).transpose()?,
        })
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

    fn key(&self, spec: &TargetSpec) -> Result<Arc<dyn KeyExtractor>, ConfigError> {
        let one = |part: &KeyPart| -> Result<Box<dyn KeyExtractor>, ConfigError> {
            Ok(match part {
                KeyPart::Ip => self.client_ip.clone().boxed(),
                KeyPart::Global => Global.boxed(),
                KeyPart::Route => Route::new().boxed(),
                KeyPart::Header(name) => match &self.header_secret {
                    Some(secret) => Header::new(name.clone(), secret).boxed(),
                    None => return Err(self.no_secret(spec, name)),
                },
            })
        };
        let mut parts = spec.key.iter();
        let first = parts.next().map_or_else(|| Ok(Global.boxed()), one)?;
        let key = parts.try_fold(first, |key, part| Ok(key.and(one(part)?).boxed()))?;
        Ok(Arc::from(key))
    }

    fn no_secret(&self, spec: &TargetSpec, name: &HeaderName) -> ConfigError {
        ConfigError {
            path: self.path.clone(),
            line: Some(spec.key_line),
            field: spec.key_field.clone(),
            message: format!(
                "\"header:{}\" hashes its values with a secret that is not in the file: \
                 pass one with Config::header_secret (say, Secret::from_env(..)) before \
                 Config::rules",
                name.as_str()
            ),
        }
    }
}

fn parse(source: &Source<'_>) -> Result<RawConfig, ConfigError> {
    let syntax = |error: toml::de::Error, field: String| ConfigError {
        path: None,
        line: error.span().map(|span| source.line(span)),
        field,
        message: error.message().trim_end().to_owned(),
    };
    let deserializer =
        toml::Deserializer::parse(source.text).map_err(|e| syntax(e, String::new()))?;
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let field = field_path(error.path());
        syntax(error.into_inner(), field)
    })
}

/// The path to the failing value, without the segments `Spanned` adds.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if key.starts_with("$__") {
                    continue;
                }
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

fn validate(source: &Source<'_>, raw: RawConfig) -> Result<Config, ConfigError> {
    let mut client_ip = ClientIp::new();
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
    client_ip = client_ip.trust_proxies(proxies);
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

    let mut policies: Vec<Policy> = Vec::with_capacity(raw.policies.len());
    for (i, policy) in raw.policies.iter().enumerate() {
        let field = |name: &str| format!("policies[{i}].{name}");
        let built = build_policy(source, policy, &field)?;
        if policies.iter().any(|p| p.name() == built.name()) {
            let name = &policy.get_ref().name;
            return Err(source.error(
                name.span(),
                field("name"),
                format!("policy {:?} is defined twice", name.get_ref()),
            ));
        }
        policies.push(built);
    }

    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, rule) in raw.rules.iter().enumerate() {
        let field = |name: &str| format!("rules[{i}].{name}");
        let raw_rule = rule.get_ref();
        let (method, pattern) = match (&raw_rule.path, &raw_rule.grpc) {
            (Some(path), None) => {
                let method = raw_rule
                    .method
                    .as_ref()
                    .map(|m| parse_method(source, m, field("method")))
                    .transpose()?;
                let pattern = Pattern::parse(path.get_ref()).map_err(|reason| {
                    source.error(
                        path.span(),
                        field("path"),
                        format!("pattern {:?} {reason}", path.get_ref()),
                    )
                })?;
                (method, pattern)
            }
            (None, Some(grpc)) => {
                if let Some(method) = &raw_rule.method {
                    return Err(source.error(
                        method.span(),
                        field("method"),
                        "a gRPC rule has no HTTP method (gRPC calls are all POST)",
                    ));
                }
                let (service, name) = match grpc.get_ref().split_once('/') {
                    Some((service, name)) => (service, Some(name)),
                    None => (grpc.get_ref().as_str(), None),
                };
                let pattern = Pattern::grpc(service, name).map_err(|reason| {
                    source.error(
                        grpc.span(),
                        field("grpc"),
                        format!(
                            "{:?} {reason}; write \"package.Service\" or \"package.Service/Method\"",
                            grpc.get_ref()
                        ),
                    )
                })?;
                (Some(Method::POST), pattern)
            }
            (Some(_), Some(grpc)) => {
                return Err(source.error(
                    grpc.span(),
                    field("grpc"),
                    "a rule has either `path` or `grpc`, not both",
                ));
            }
            (None, None) => {
                return Err(source.error(
                    rule.span(),
                    format!("rules[{i}]"),
                    "a rule needs `path` or `grpc`",
                ));
            }
        };
        let target = target(
            source,
            &policies,
            rule.span(),
            &format!("rules[{i}]"),
            &raw_rule.policy,
            &raw_rule.policies,
            &raw_rule.key,
        )?;
        rules.push(RuleSpec {
            method,
            pattern,
            target,
        });
    }

    let default = match &raw.default {
        Some(default) => {
            let raw_default = default.get_ref();
            Some(target(
                source,
                &policies,
                default.span(),
                "default",
                &raw_default.policy,
                &raw_default.policies,
                &raw_default.key,
            )?)
        }
        None => None,
    };

    Ok(Config {
        policies,
        rules,
        default,
        client_ip,
        header_secret: None,
        path: None,
    })
}

fn build_policy(
    source: &Source<'_>,
    policy: &Spanned<RawPolicy>,
    field: &dyn Fn(&str) -> String,
) -> Result<Policy, ConfigError> {
    let raw = policy.get_ref();
    let name = raw.name.get_ref().clone();
    let missing = |what: &str| {
        source.error(
            policy.span(),
            field(what),
            format!("policy {name:?} needs `{what}`"),
        )
    };
    let unused = |value: Option<Range<usize>>, what: &str, why: &str| match value {
        Some(span) => Err(source.error(span, field(what), why.to_owned())),
        None => Ok(()),
    };
    let window = match &raw.window {
        Some(window) => parse_duration(window.get_ref()).ok_or_else(|| {
            source.error(
                window.span(),
                field("window"),
                format!(
                    "{:?} is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\" or \"1d\"",
                    window.get_ref()
                ),
            )
        })?,
        None => return Err(missing("window")),
    };
    let algorithm = raw.algorithm.get_ref().as_str();
    // The field a constructor's complaint is about, for the line.
    let (built, blamed) = match algorithm {
        "fixed_window" | "sliding_window" | "sliding_log" => {
            unused(
                raw.capacity.as_ref().map(Spanned::span),
                "capacity",
                "only a token_bucket has a capacity; the others have a `limit`",
            )?;
            unused(
                raw.refill.as_ref().map(Spanned::span),
                "refill",
                "only a token_bucket has a refill",
            )?;
            let limit = raw.limit.as_ref().ok_or_else(|| missing("limit"))?;
            let make = match algorithm {
                "fixed_window" => Policy::fixed_window,
                "sliding_window" => Policy::sliding_window,
                _ => Policy::sliding_log,
            };
            (make(name, *limit.get_ref(), window), limit.span())
        }
        "token_bucket" => {
            unused(
                raw.limit.as_ref().map(Spanned::span),
                "limit",
                "a token_bucket has a `capacity` (its burst) and a `refill` per `window`, not a `limit`",
            )?;
            let capacity = raw.capacity.as_ref().ok_or_else(|| missing("capacity"))?;
            let refill = raw.refill.as_ref().ok_or_else(|| missing("refill"))?;
            (
                Policy::token_bucket(name, *capacity.get_ref(), *refill.get_ref(), window),
                capacity.span(),
            )
        }
        other => {
            return Err(source.error(
                raw.algorithm.span(),
                field("algorithm"),
                format!(
                    "unknown algorithm {other:?}: use fixed_window, sliding_window, sliding_log or token_bucket"
                ),
            ));
        }
    };
    built.map_err(|error| {
        use crate::policy::PolicyError;
        let (span, what) = match &error {
            PolicyError::BadName(_) => (raw.name.span(), "name"),
            PolicyError::WindowTooShort(_) => (
                raw.window.as_ref().map_or(policy.span(), Spanned::span),
                "window",
            ),
            PolicyError::ZeroRefill(_) => (
                raw.refill.as_ref().map_or(policy.span(), Spanned::span),
                "refill",
            ),
            _ if algorithm == "token_bucket" => (blamed, "capacity"),
            _ => (blamed, "limit"),
        };
        source.error(span, field(what), error.to_string())
    })
}

/// `500ms`, `10s`, `1m`, `1h`, `1d`: a whole number and a unit.
fn parse_duration(text: &str) -> Option<Duration> {
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number.checked_mul(ms_per_unit).map(Duration::from_millis)
}

fn parse_method(
    source: &Source<'_>,
    method: &Spanned<String>,
    field: String,
) -> Result<Method, ConfigError> {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    let text = method.get_ref();
    KNOWN
        .into_iter()
        .find(|known| known.as_str().eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            source.error(
                method.span(),
                field,
                format!("unknown HTTP method {text:?}"),
            )
        })
}

fn target(
    source: &Source<'_>,
    policies: &[Policy],
    table: Range<usize>,
    at: &str,
    policy: &Option<Spanned<String>>,
    list: &Option<Spanned<Vec<Spanned<String>>>>,
    key: &Option<Spanned<String>>,
) -> Result<TargetSpec, ConfigError> {
    let lookup = |name: &Spanned<String>, field: String| {
        policies
            .iter()
            .find(|p| p.name() == name.get_ref())
            .cloned()
            .ok_or_else(|| {
                source.error(
                    name.span(),
                    field,
                    format!("unknown policy {:?}", name.get_ref()),
                )
            })
    };
    let (first, more) = match (policy, list) {
        (Some(name), None) => (lookup(name, format!("{at}.policy"))?, Vec::new()),
        (None, Some(names)) => {
            let mut found = names
                .get_ref()
                .iter()
                .enumerate()
                .map(|(i, name)| lookup(name, format!("{at}.policies[{i}]")));
            let Some(first) = found.next() else {
                return Err(source.error(
                    names.span(),
                    format!("{at}.policies"),
                    "names no policy",
                ));
            };
            (first?, found.collect::<Result<Vec<_>, _>>()?)
        }
        (Some(_), Some(names)) => {
            return Err(source.error(
                names.span(),
                format!("{at}.policies"),
                "give either `policy` or `policies`, not both",
            ));
        }
        (None, None) => {
            return Err(source.error(
                table,
                format!("{at}.policy"),
                "needs `policy` (a name) or `policies` (a list of names)",
            ));
        }
    };
    let key_field = format!("{at}.key");
    let (key, key_line) = match key {
        Some(key) => (
            parse_key(key.get_ref())
                .map_err(|message| source.error(key.span(), key_field.clone(), message))?,
            source.line(key.span()),
        ),
        None => {
            return Err(source.error(
                table,
                format!("{at}.key"),
                "needs `key`: \"ip\", \"global\", \"route\", \"header:NAME\" or a combination such as \"ip+route\"",
            ));
        }
    };
    Ok(TargetSpec {
        first,
        more,
        key,
        key_field,
        key_line,
    })
}

fn parse_key(text: &str) -> Result<Vec<KeyPart>, String> {
    text.split('+')
        .map(|part| {
            let part = part.trim();
            match part {
                "ip" => Ok(KeyPart::Ip),
                "global" => Ok(KeyPart::Global),
                "route" => Ok(KeyPart::Route),
                _ => match part.strip_prefix("header:") {
                    Some(name) => HeaderName::try_from(name.trim())
                        .map(KeyPart::Header)
                        .map_err(|_| format!("{name:?} is not a header name")),
                    None => Err(format!(
                        "unknown key {part:?}: use \"ip\", \"global\", \"route\", \"header:NAME\", or several joined by '+'"
                    )),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86_400)));
        for bad in [
            "",
            "10",
            "s",
            "1 m",
            "1.5s",
            "-1s",
            "1min",
            "99999999999999999999s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn keys() {
        assert!(matches!(parse_key("ip").unwrap()[..], [KeyPart::Ip]));
        assert!(matches!(
            parse_key("ip+route").unwrap()[..],
            [KeyPart::Ip, KeyPart::Route]
        ));
        assert!(matches!(
            parse_key("header:x-api-key").unwrap()[..],
            [KeyPart::Header(_)]
        ));
        assert!(parse_key("header:bad name").is_err());
        assert!(parse_key("ipp").is_err());
        assert!(parse_key("").is_err());
    }

    #[test]
    fn lines_count_from_one() {
        let source = Source { text: "a\nb\nc" };
        assert_eq!(source.line(0..1), 1);
        assert_eq!(source.line(2..3), 2);
        assert_eq!(source.line(4..5), 3);
        assert_eq!(source.line(99..100), 3);
    }
}
