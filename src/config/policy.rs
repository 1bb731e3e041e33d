//! The `[[policies]]` tables: each one a [`Policy`], built by its own constructor, whose
//! complaints are put on the line of the field they are about.

use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::error::ConfigError;
use super::file::{RawPolicy, Source};
use crate::policy::{Policy, PolicyError};

/// Every policy of the file, in order; a name may be used once.
pub(super) fn policies(
    source: &Source<'_>,
    raw: &[Spanned<RawPolicy>],
) -> Result<Vec<Policy>, ConfigError> {
    let mut policies: Vec<Policy> = Vec::with_capacity(raw.len());
    for (i, policy) in raw.iter().enumerate() {
        let field = |name: &str| format!("policies[{i}].{name}");
        let built = policy_of(source, policy, &field)?;
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
    Ok(policies)
}

fn policy_of(
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
    let duration = |value: &Option<Spanned<String>>, what: &str| match value {
        Some(value) => parse_duration(value.get_ref()).ok_or_else(|| {
            source.error(
                value.span(),
                field(what),
                format!(
                    "{:?} is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\" or \"1d\"",
                    value.get_ref()
                ),
            )
        }),
        None => Err(missing(what)),
    };
    let span = |value: &Option<Spanned<String>>| value.as_ref().map(Spanned::span);
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
            unused(
                span(&raw.slot_ttl),
                "slot_ttl",
                "only an in_flight policy has a `slot_ttl`; the others have a `window`",
            )?;
            let window = duration(&raw.window, "window")?;
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
            unused(
                span(&raw.slot_ttl),
                "slot_ttl",
                "only an in_flight policy has a `slot_ttl`; a token_bucket refills per `window`",
            )?;
            let window = duration(&raw.window, "window")?;
            let capacity = raw.capacity.as_ref().ok_or_else(|| missing("capacity"))?;
            let refill = raw.refill.as_ref().ok_or_else(|| missing("refill"))?;
            (
                Policy::token_bucket(name, *capacity.get_ref(), *refill.get_ref(), window),
                capacity.span(),
            )
        }
        "in_flight" => {
            let rate_only = "an in_flight policy counts requests running at once: it has a \
                             `limit` and a `slot_ttl`";
            unused(
                span(&raw.window),
                "window",
                &format!("{rate_only}, not a `window`"),
            )?;
            unused(
                raw.capacity.as_ref().map(Spanned::span),
                "capacity",
                &format!("{rate_only}, not a `capacity`"),
            )?;
            unused(
                raw.refill.as_ref().map(Spanned::span),
                "refill",
                &format!("{rate_only}, not a `refill`"),
            )?;
            let slot_ttl = duration(&raw.slot_ttl, "slot_ttl")?;
            let limit = raw.limit.as_ref().ok_or_else(|| missing("limit"))?;
            (
                Policy::in_flight(name, *limit.get_ref(), slot_ttl),
                limit.span(),
            )
        }
        other => {
            return Err(source.error(
                raw.algorithm.span(),
                field("algorithm"),
                format!(
                    "unknown algorithm {other:?}: use fixed_window, sliding_window, sliding_log, token_bucket or in_flight"
                ),
            ));
        }
    };
    built.map_err(|error| {
        let (span, what) = match &error {
            PolicyError::BadName(_) => (raw.name.span(), "name"),
            PolicyError::WindowTooShort(_) if algorithm == "in_flight" => {
                (span(&raw.slot_ttl).unwrap_or(policy.span()), "slot_ttl")
            }
            PolicyError::WindowTooShort(_) => {
                (span(&raw.window).unwrap_or(policy.span()), "window")
            }
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
}
