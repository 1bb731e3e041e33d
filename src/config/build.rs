//! The checked configuration as [`Rules`] on a store, built through the public rules
//! API: one [`Limiter`] per rule, its key, and a pattern error put back on its line.

use std::future::{ready, Ready};

use http::request::Parts;

use super::error::ConfigError;
use super::load::Config;
use super::rules::{Applies, KeyPart, TargetSpec};
use crate::decision::Decision;
use crate::key::{ClientIp, Global, Header, KeyExtractor, KeyRejection, Pair, Route};
use crate::layer::{RuleError, Rules};
use crate::limiter::{Limiter, LimiterBuilder};
use crate::store::backend::Backend;
use crate::store::{AdminStore, Operation, PolicySet, Store, StoreError, StoreErrorKind};
use crate::subject::Subject;

/// A key as the file writes it: one extractor, or one joined with the next (`ip+route`).
/// One type, so a rule calls it through the one pointer it keeps for any key.
pub(super) enum FileKey {
    Ip(ClientIp),
    Global,
    Route(Route),
    Header(Header),
    Both(Box<Pair<FileKey, FileKey>>),
}

impl KeyExtractor for FileKey {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        match self {
            FileKey::Ip(key) => key.extract(parts),
            FileKey::Global => Global.extract(parts),
            FileKey::Route(key) => key.extract(parts),
            FileKey::Header(key) => key.extract(parts),
            FileKey::Both(pair) => pair.extract(parts),
        }
    }
}

impl Config {
    /// The rules on `store`, each target's key made by `key`; the rules API judges the
    /// patterns, and its refusal is reported on the rule's line.
    pub(super) fn build<S: Store + Clone>(
        &self,
        store: S,
        key: impl Fn(&TargetSpec) -> Result<FileKey, ConfigError>,
    ) -> Result<Rules<S>, ConfigError> {
        // The file's checks have refused empty and duplicate policy lists already.
        let limiter = |spec: &TargetSpec| {
            spec.more
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
                })
        };
        let mut builder = Rules::builder();
        for rule in &self.rules {
            let (limiter, key) = (limiter(&rule.target)?, key(&rule.target)?);
            builder = match &rule.applies {
                Applies::Path {
                    method: Some(method),
                    pattern,
                } => builder.route(method.clone(), pattern, limiter, key),
                Applies::Path {
                    method: None,
                    pattern,
                } => builder.path(pattern, limiter, key),
                Applies::Grpc {
                    service, method, ..
                } => builder.grpc(service, method.as_deref(), limiter, key),
            };
        }
        if let Some(default) = &self.default {
            builder = builder.default(limiter(default)?, key(default)?);
        }
        builder.build().map_err(|error| self.refused(&error))
    }

    /// Whether the rules API takes every pattern, found when the file is loaded, before
    /// any store exists: the rules are built on one that is never asked, with keys that
    /// need no secret.
    pub(super) fn check_patterns(&self) -> Result<(), ConfigError> {
        self.build(Unasked, |_| Ok(FileKey::Global)).map(drop)
    }

    fn refused(&self, error: &RuleError) -> ConfigError {
        let mut refused = match self.rules.get(error.index()) {
            Some(rule) => rule.refused(error),
            // The builder counts the rules as they were added, so this is not reached.
            None => ConfigError {
                path: None,
                line: None,
                field: "rules".to_owned(),
                message: error.to_string(),
            },
        };
        refused.path.clone_from(&self.path);
        refused
    }

    /// The extractor of a target's key; a header key needs [`Config::header_secret`].
    pub(super) fn key(&self, spec: &TargetSpec) -> Result<FileKey, ConfigError> {
        let one = |part: &KeyPart| -> Result<FileKey, ConfigError> {
            Ok(match part {
                KeyPart::Ip => FileKey::Ip(self.client_ip.clone()),
                KeyPart::Global => FileKey::Global,
                KeyPart::Route => FileKey::Route(Route::new()),
                KeyPart::Header(name) => match &self.header_secret {
                    Some(secret) => FileKey::Header(Header::secret(name.clone(), secret)),
                    None => return Err(self.no_secret(spec, name)),
                },
            })
        };
        let mut parts = spec.key.iter();
        let first = parts.next().map_or(Ok(FileKey::Global), one)?;
        parts.try_fold(first, |key, part| {
            Ok(FileKey::Both(Box::new(Pair(key, one(part)?))))
        })
    }

    fn no_secret(&self, spec: &TargetSpec, name: &http::HeaderName) -> ConfigError {
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

/// The store of the rules built at load only to have their patterns judged: nothing is
/// ever checked on it.
#[derive(Clone)]
struct Unasked;

impl Backend for Unasked {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _: Subject, _: &PolicySet, _: u64) -> Self::Future {
        ready(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "the configuration's rules built at load have no store",
        )))
    }
}

impl AdminStore for Unasked {
    fn run(&self, _: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.check(subject, set, cost)
    }
}
