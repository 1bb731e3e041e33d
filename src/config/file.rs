//! The file as written: TOML into structs whose every value keeps its span, and spans
//! into line numbers for the errors.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::error::ConfigError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) trusted_proxies: Vec<Spanned<String>>,
    pub(super) ipv6_prefix: Option<Spanned<u8>>,
    #[serde(default)]
    pub(super) policies: Vec<Spanned<RawPolicy>>,
    #[serde(default)]
    pub(super) rules: Vec<Spanned<RawRule>>,
    pub(super) default: Option<Spanned<RawTarget>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    pub(super) name: Spanned<String>,
    pub(super) algorithm: Spanned<String>,
    pub(super) limit: Option<Spanned<u32>>,
    pub(super) window: Option<Spanned<String>>,
    pub(super) capacity: Option<Spanned<u32>>,
    pub(super) refill: Option<Spanned<u32>>,
    pub(super) slot_ttl: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) method: Option<Spanned<String>>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) grpc: Option<Spanned<String>>,
    pub(super) policy: Option<Spanned<String>>,
    pub(super) policies: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) key: Option<Spanned<String>>,
}

/// The default: what checks requests no rule matches.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) policy: Option<Spanned<String>>,
    pub(super) policies: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) key: Option<Spanned<String>>,
}

/// Turns byte spans into line numbers and errors.
pub(super) struct Source<'a> {
    pub(super) text: &'a str,
}

impl Source<'_> {
    pub(super) fn line(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    pub(super) fn error(
        &self,
        span: Range<usize>,
        field: String,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            path: None,
            line: Some(self.line(span)),
            field,
            message: message.into(),
        }
    }

    /// The file's tables, or the first syntax error or value of the wrong type.
    pub(super) fn parse(&self) -> Result<RawConfig, ConfigError> {
        let syntax = |error: toml::de::Error, field: String| ConfigError {
            path: None,
            line: error.span().map(|span| self.line(span)),
            field,
            message: error.message().trim_end().to_owned(),
        };
        let deserializer =
            toml::Deserializer::parse(self.text).map_err(|e| syntax(e, String::new()))?;
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let field = field_path(error.path());
            syntax(error.into_inner(), field)
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_from_one() {
        let source = Source { text: "a\nb\nc" };
        assert_eq!(source.line(0..1), 1);
        assert_eq!(source.line(2..3), 2);
        assert_eq!(source.line(4..5), 3);
        assert_eq!(source.line(99..100), 3);
    }
}
