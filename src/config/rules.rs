//! The `[[rules]]` and `[default]` tables: where each rule applies, which policies
//! check it and which key names its subject. Path patterns and gRPC names are the rules
//! API's to judge ([`RulesBuilder`](crate::layer::RulesBuilder)); what is checked here
//! is what only the file can get wrong.

use std::ops::Range;

use http::{HeaderName, Method};
use toml::Spanned;

use super::error::ConfigError;
use super::file::{RawRule, RawTarget, Source};
use crate::layer::RuleError;
use crate::policy::Policy;

/// One `[[rules]]` table, checked.
#[derive(Debug, Clone)]
pub(super) struct RuleSpec {
    pub(super) applies: Applies,
    pub(super) target: TargetSpec,
    /// Where the pattern is written (`rules[1].path` and its line), for a pattern the
    /// rules API refuses.
    pattern_field: String,
    pattern_line: usize,
}

/// Where a rule applies, as [`RulesBuilder`](crate::layer::RulesBuilder) takes it.
#[derive(Debug, Clone)]
pub(super) enum Applies {
    /// `path`, for `method` only when one is given.
    Path {
        method: Option<Method>,
        pattern: String,
    },
    /// `grpc`: a service, or one of its methods when written `package.Service/Method`.
    Grpc {
        written: String,
        service: String,
        method: Option<String>,
    },
}

/// What checks the requests of a rule or of the default.
#[derive(Debug, Clone)]
pub(super) struct TargetSpec {
    /// At least one policy by construction: the first, then the others.
    pub(super) first: Policy,
    pub(super) more: Vec<Policy>,
    pub(super) key: Vec<KeyPart>,
    /// Where the key is written (`rules[1].key` and its line), for the error when a
    /// header key has no secret.
    pub(super) key_field: String,
    pub(super) key_line: usize,
}

#[derive(Debug, Clone)]
pub(super) enum KeyPart {
    Ip,
    Global,
    Route,
    Header(HeaderName),
}

impl RuleSpec {
    /// The rules API's refusal of this rule's pattern, on the pattern's line.
    pub(super) fn refused(&self, error: &RuleError) -> ConfigError {
        let message = match &self.applies {
            Applies::Path { .. } => format!("pattern {:?} {}", error.pattern(), error.reason()),
            Applies::Grpc { written, .. } => format!(
                "{written:?} {}; write \"package.Service\" or \"package.Service/Method\"",
                error.reason()
            ),
        };
        ConfigError {
            path: None,
            line: Some(self.pattern_line),
            field: self.pattern_field.clone(),
            message,
        }
    }
}

/// Every rule of the file, in order.
pub(super) fn rules(
    source: &Source<'_>,
    policies: &[Policy],
    raw: &[Spanned<RawRule>],
) -> Result<Vec<RuleSpec>, ConfigError> {
    raw.iter()
        .enumerate()
        .map(|(i, rule)| rule_of(source, policies, i, rule))
        .collect()
}

fn rule_of(
    source: &Source<'_>,
    policies: &[Policy],
    i: usize,
    rule: &Spanned<RawRule>,
) -> Result<RuleSpec, ConfigError> {
    let at = format!("rules[{i}]");
    let field = |name: &str| format!("{at}.{name}");
    let raw = rule.get_ref();
    let (applies, pattern) = match (&raw.path, &raw.grpc) {
        (Some(path), None) => {
            let method = raw
                .method
                .as_ref()
                .map(|m| parse_method(source, m, field("method")))
                .transpose()?;
            let pattern = path.get_ref().clone();
            (Applies::Path { method, pattern }, (path, "path"))
        }
        (None, Some(grpc)) => {
            if let Some(method) = &raw.method {
                return Err(source.error(
                    method.span(),
                    field("method"),
                    "a gRPC rule has no HTTP method (gRPC calls are all POST)",
                ));
            }
            let written = grpc.get_ref().clone();
            let (service, method) = match written.split_once('/') {
                Some((service, method)) => (service.to_owned(), Some(method.to_owned())),
                None => (written.clone(), None),
            };
            let applies = Applies::Grpc {
                written,
                service,
                method,
            };
            (applies, (grpc, "grpc"))
        }
        (Some(_), Some(grpc)) => {
            return Err(source.error(
                grpc.span(),
                field("grpc"),
                "a rule has either `path` or `grpc`, not both",
            ));
        }
        (None, None) => {
            return Err(source.error(rule.span(), at, "a rule needs `path` or `grpc`"));
        }
    };
    let written = RawTarget {
        policy: raw.policy.clone(),
        policies: raw.policies.clone(),
        key: raw.key.clone(),
    };
    let target = target(source, policies, rule.span(), &at, &written)?;
    Ok(RuleSpec {
        applies,
        target,
        pattern_field: field(pattern.1),
        pattern_line: source.line(pattern.0.span()),
    })
}

/// The policies and key of a rule (`at` is `rules[1]`) or of the default, whose table
/// spans `table`.
pub(super) fn target(
    source: &Source<'_>,
    policies: &[Policy],
    table: Range<usize>,
    at: &str,
    raw: &RawTarget,
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
    let (first, more) = match (&raw.policy, &raw.policies) {
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
    let Some(key) = &raw.key else {
        return Err(source.error(
            table,
            key_field,
            "needs `key`: \"ip\", \"global\", \"route\", \"header:NAME\" or a combination such as \"ip+route\"",
        ));
    };
    let parts = parse_key(key.get_ref())
        .map_err(|message| source.error(key.span(), key_field.clone(), message))?;
    Ok(TargetSpec {
        first,
        more,
        key: parts,
        key_field,
        key_line: source.line(key.span()),
    })
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
}
