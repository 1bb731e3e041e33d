//! The configuration a file holds, parsed and checked: everything but the patterns,
//! which the rules API judges when [`Config::rules`] builds them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;

use super::error::ConfigError;
use super::file::{RawConfig, Source};
use super::policy::policies;
use super::rules::{self, RuleSpec, TargetSpec};
#[cfg(doc)]
use crate::key::Header;
use crate::key::{ClientIp, Secret};
use crate::layer::Rules;
use crate::policy::Policy;
use crate::store::Store;

/// A validated configuration: named policies, rules in order, a default, and how client
/// addresses are found. Built by [`Config::from_toml_str`] or [`Config::from_path`].
#[derive(Debug, Clone)]
pub struct Config {
    pub(super) policies: Vec<Policy>,
    pub(super) rules: Vec<RuleSpec>,
    pub(super) default: Option<TargetSpec>,
    pub(super) client_ip: ClientIp,
    /// What `header:NAME` keys hash with; its `Debug` shows nothing of it.
    pub(super) header_secret: Option<Secret>,
    /// The file it came from, for the errors of [`Config::rules`].
    pub(super) path: Option<PathBuf>,
}

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
    let policies = policies(source, &raw.policies)?;
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
