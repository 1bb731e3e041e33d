//! Rules: one layer that limits each route (or gRPC method) by its own policies.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::Method;

use crate::error::debug_as_display;
use crate::key::KeyExtractor;
use crate::layer::plan::{Keyed, Limit, Pick, Sealed};
use crate::limiter::Limiter;
use crate::store::Store;

/// Rules: one layer that limits each route (or gRPC method) by its own policies.
///
/// ```
/// use std::time::Duration;
///
/// use http::{Method, Request, Response, StatusCode};
/// use redlimit::key::{ClientIp, Global, Header, Secret};
/// use redlimit::layer::Rules;
/// use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let login = Limiter::new(store.clone(), Policy::fixed_window("login", 3, Duration::from_secs(60))?);
/// let api = Limiter::new(store.clone(), Policy::sliding_window("api", 10, Duration::from_secs(1))?);
/// let rest = Limiter::new(store, Policy::sliding_window("default", 100, Duration::from_secs(60))?);
/// let secret = Secret::new("from your secret store, the same on every instance")?;
///
/// let rules = Rules::builder()
///     .route(Method::POST, "/login", login, ClientIp::new())   // 3 a minute per address
///     .path("/api/*", api, Header::new("x-api-key", &secret)?) // 10 a second per API key
///     .grpc("shop.Orders", Some("Place"), Limiter::new(MemoryStore::new(),
///         Policy::token_bucket("orders", 5, 1, Duration::from_secs(1))?), Global)
///     .default(rest, Global)                           // everything else
///     .build()?;
///
/// let service = ServiceBuilder::new()
///     .layer(RateLimitLayer::rules(rules))
///     .service_fn(|_req: Request<String>| async {
///         Ok::<_, std::convert::Infallible>(Response::new(String::new()))
///     });
///
/// let call = Request::get("/api/users/7").header("x-api-key", "k1").body(String::new())?;
/// let response = service.oneshot(call).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// assert_eq!(response.headers()["ratelimit-policy"], r#""api";q=10;w=1"#);
/// # Ok(()) }
/// ```
///
/// The first rule that matches a request decides which limiter checks it and which key
/// extractor names its subject; a request no rule matches goes to the default, or passes
/// unchecked (and without rate-limit headers) when there is none. Limiters shared by
/// several rules share their counters, as one limiter behind several `route_layer`s
/// would.
///
/// Path patterns are matched segment by segment against the request's URI path (the
/// query is not part of it), exactly and case-sensitively:
///
/// | pattern | matches | does not match |
/// |---|---|---|
/// | `/login` | `/login` | `/login/`, `/login/x` |
/// | `/users/{id}`, `/users/*` | `/users/7` | `/users`, `/users/`, `/users/7/posts` |
/// | `/files/{*rest}`, `/files/*` (last) | `/files/a`, `/files/a/b`, `/files/` | `/files` |
///
/// gRPC calls are `POST /package.Service/Method`: [`RulesBuilder::grpc`] matches the
/// service and, optionally, one method.
pub struct Rules<S> {
    rules: Box<[Rule<S>]>,
    default: Option<Keyed<S, Arc<dyn KeyExtractor>>>,
}

/// Collects rules in order; [`RulesBuilder::build`] checks their patterns.
pub struct RulesBuilder<S> {
    rules: Vec<Rule<S>>,
    default: Option<Keyed<S, Arc<dyn KeyExtractor>>>,
    error: Option<RuleError>,
}

/// A pattern that cannot be matched, found by [`RulesBuilder::build`]: which rule (from
/// 0, in the order added), its pattern and what is wrong with it.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {index}: pattern {pattern:?} {reason}")]
pub struct RuleError {
    index: usize,
    pattern: String,
    reason: &'static str,
}

debug_as_display!(RuleError);

impl RuleError {
    /// The rule's position, from 0, in the order the rules were added.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The pattern as it was given.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// What is wrong with the pattern.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

struct Rule<S> {
    method: Option<Method>,
    pattern: Pattern,
    keyed: Keyed<S, Arc<dyn KeyExtractor>>,
}

/// What a rule (or the default) checks: its limit, keyed by its extractor. Each rule
/// has a key type of its own, so the extractor is behind a pointer.
fn keyed<S: Store>(
    limiter: impl Into<Arc<Limiter<S>>>,
    key: impl KeyExtractor,
) -> Keyed<S, Arc<dyn KeyExtractor>> {
    Keyed::new(limiter.into(), Arc::new(key))
}

/// A parsed path pattern: its segments after the leading `/`.
#[derive(Clone, PartialEq, Eq)]
struct Pattern {
    segments: Box<[Segment]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// This exact text.
    Literal(Box<str>),
    /// Any one non-empty segment (`*` or `{name}`).
    One,
    /// One or more remaining segments, the last one possibly empty (a trailing `*` or
    /// `{*name}`).
    Rest,
}

impl Pattern {
    fn parse(pattern: &str) -> Result<Self, &'static str> {
        let Some(path) = pattern.strip_prefix('/') else {
            return Err("must start with '/'");
        };
        let parts: Vec<&str> = path.split('/').collect();
        let last = parts.len() - 1;
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let segment = if *part == "*" {
                if i == last {
                    Segment::Rest
                } else {
                    Segment::One
                }
            } else if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if let Some(rest) = name.strip_prefix('*') {
                    if i != last {
                        return Err("has a `{*rest}` segment that is not the last");
                    }
                    if rest.is_empty() {
                        return Err("has a `{*}` without a name");
                    }
                    Segment::Rest
                } else if name.is_empty() {
                    return Err("has a `{}` without a name");
                } else {
                    Segment::One
                }
            } else if part.contains(['{', '}', '*']) {
                return Err("mixes text with `*`, `{` or `}` in one segment");
            } else {
                Segment::Literal((*part).into())
            };
            segments.push(segment);
        }
        Ok(Self {
            segments: segments.into_boxed_slice(),
        })
    }

    /// A gRPC service (`package.Service`) and method, or any method of the service.
    fn grpc(service: &str, method: Option<&str>) -> Result<Self, &'static str> {
        let valid = |name: &str| !name.is_empty() && !name.contains(['/', '{', '}', '*']);
        if !valid(service) {
            return Err("is not a gRPC service name (`package.Service`)");
        }
        let last = match method {
            Some(method) if valid(method) => Segment::Literal(method.into()),
            Some(_) => return Err("has a method that is not a gRPC method name"),
            None => Segment::Rest,
        };
        Ok(Self {
            segments: Box::new([Segment::Literal(service.into()), last]),
        })
    }

    fn matches(&self, path: &str) -> bool {
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = path.split('/');
        for segment in self.segments.iter() {
            match segment {
                Segment::Rest => return parts.next().is_some(),
                Segment::One => match parts.next() {
                    Some(part) if !part.is_empty() => {}
                    _ => return false,
                },
                Segment::Literal(text) => match parts.next() {
                    Some(part) if part == &**text => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }
}

impl<S: Store> Rules<S> {
    /// Starts an empty set of rules: add them in the order they are to be tried.
    pub fn builder() -> RulesBuilder<S> {
        RulesBuilder {
            rules: Vec::new(),
            default: None,
            error: None,
        }
    }

    /// How many rules there are, the default not counted.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are no rules (a default may still apply).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

impl<S: Store> RulesBuilder<S> {
    /// Requests with `method` whose path matches `pattern` are checked by `limiter`,
    /// keyed by `key`.
    pub fn route(
        self,
        method: Method,
        pattern: &str,
        limiter: impl Into<Arc<Limiter<S>>>,
        key: impl KeyExtractor,
    ) -> Self {
        self.push(Some(method), Pattern::parse(pattern), pattern, limiter, key)
    }

    /// Requests of any method whose path matches `pattern` are checked by `limiter`,
    /// keyed by `key`.
    pub fn path(
        self,
        pattern: &str,
        limiter: impl Into<Arc<Limiter<S>>>,
        key: impl KeyExtractor,
    ) -> Self {
        self.push(None, Pattern::parse(pattern), pattern, limiter, key)
    }

    /// Calls to the gRPC `service` (its full name, `package.Service`), to its `method`
    /// only when one is given, are checked by `limiter`, keyed by `key`.
    pub fn grpc(
        self,
        service: &str,
        method: Option<&str>,
        limiter: impl Into<Arc<Limiter<S>>>,
        key: impl KeyExtractor,
    ) -> Self {
        let shown = format!("/{service}/{}", method.unwrap_or("*"));
        self.push(
            Some(Method::POST),
            Pattern::grpc(service, method),
            &shown,
            limiter,
            key,
        )
    }

    /// What checks requests no rule matches (without one, they pass unchecked).
    pub fn default(mut self, limiter: impl Into<Arc<Limiter<S>>>, key: impl KeyExtractor) -> Self {
        self.default = Some(keyed(limiter, key));
        self
    }

    /// The rules, or the first pattern that cannot be matched.
    pub fn build(self) -> Result<Rules<S>, RuleError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        Ok(Rules {
            rules: self.rules.into_boxed_slice(),
            default: self.default,
        })
    }

    fn push(
        mut self,
        method: Option<Method>,
        pattern: Result<Pattern, &'static str>,
        shown: &str,
        limiter: impl Into<Arc<Limiter<S>>>,
        key: impl KeyExtractor,
    ) -> Self {
        let index = self.rules.len();
        match pattern {
            Ok(pattern) => self.rules.push(Rule {
                method,
                pattern,
                keyed: keyed(limiter, key),
            }),
            Err(reason) => {
                self.error.get_or_insert_with(|| RuleError {
                    index,
                    pattern: shown.to_owned(),
                    reason,
                });
                // A placeholder keeps later rules' indices right; `build` fails anyway.
                self.rules.push(Rule {
                    method,
                    pattern: Pattern {
                        segments: Box::new([]),
                    },
                    keyed: keyed(limiter, key),
                });
            }
        }
        self
    }
}

impl<S: Store> Sealed<S> for Rules<S> {
    fn pick(&self, parts: &Parts) -> Pick<'_, S> {
        let path = parts.uri.path();
        let rule = self.rules.iter().find(|rule| {
            rule.method.as_ref().is_none_or(|m| *m == parts.method) && rule.pattern.matches(path)
        });
        match rule.map(|rule| &rule.keyed).or(self.default.as_ref()) {
            Some(keyed) => keyed.pick(parts),
            None => Pick::Pass,
        }
    }

    fn each_limit<'a>(&'a self, visit: &mut dyn FnMut(&'a Limit<S>)) {
        self.rules
            .iter()
            .map(|rule| &rule.keyed)
            .chain(&self.default)
            .for_each(|keyed| keyed.each_limit(visit));
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for segment in self.segments.iter() {
            match segment {
                Segment::Literal(text) => write!(f, "/{text}")?,
                Segment::One => f.write_str("/{}")?,
                Segment::Rest => f.write_str("/{*}")?,
            }
        }
        Ok(())
    }
}

impl<S: Store> fmt::Debug for Rules<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for rule in self.rules.iter() {
            list.entry(&format_args!(
                "{} {:?} -> {:?}",
                rule.method.as_ref().map_or("*", Method::as_str),
                rule.pattern,
                rule.keyed.limit
            ));
        }
        if let Some(default) = &self.default {
            list.entry(&format_args!("default -> {:?}", default.limit));
        }
        list.finish()
    }
}

impl<S: Store> fmt::Debug for RulesBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RulesBuilder")
            .field("rules", &self.rules.len())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, path: &str) -> bool {
        Pattern::parse(pattern).unwrap().matches(path)
    }

    #[test]
    fn literal_patterns_match_exactly() {
        assert!(matches("/login", "/login"));
        assert!(!matches("/login", "/login/"));
        assert!(!matches("/login", "/login/x"));
        assert!(!matches("/login", "/Login"));
        assert!(matches("/", "/"));
        assert!(!matches("/", "/x"));
    }

    #[test]
    fn one_segment_wildcards_need_a_non_empty_segment() {
        for pattern in ["/users/*/posts", "/users/{id}/posts"] {
            assert!(matches(pattern, "/users/7/posts"), "{pattern}");
            assert!(!matches(pattern, "/users//posts"), "{pattern}");
            assert!(!matches(pattern, "/users/7/8/posts"), "{pattern}");
        }
        assert!(matches("/users/{id}", "/users/7"));
        assert!(!matches("/users/{id}", "/users/"));
        assert!(!matches("/users/{id}", "/users"));
    }

    #[test]
    fn trailing_wildcards_take_the_rest() {
        for pattern in ["/api/*", "/api/{*rest}"] {
            assert!(matches(pattern, "/api/a"), "{pattern}");
            assert!(matches(pattern, "/api/a/b/c"), "{pattern}");
            assert!(matches(pattern, "/api/"), "{pattern}");
            assert!(!matches(pattern, "/api"), "{pattern}");
            assert!(!matches(pattern, "/apis/a"), "{pattern}");
        }
    }

    #[test]
    fn grpc_patterns_match_service_and_method() {
        let one = Pattern::grpc("shop.v1.Orders", Some("Place")).unwrap();
        assert!(one.matches("/shop.v1.Orders/Place"));
        assert!(!one.matches("/shop.v1.Orders/Cancel"));
        let any = Pattern::grpc("shop.v1.Orders", None).unwrap();
        assert!(any.matches("/shop.v1.Orders/Cancel"));
        assert!(!any.matches("/shop.v1.Orders"));
        assert!(!any.matches("/shop.v1.Carts/Add"));
        assert!(Pattern::grpc("", None).is_err());
        assert!(Pattern::grpc("a/b", None).is_err());
        assert!(Pattern::grpc("a.B", Some("")).is_err());
    }

    #[test]
    fn bad_patterns_say_why() {
        assert_eq!(Pattern::parse("login"), Err("must start with '/'"));
        assert_eq!(
            Pattern::parse("/a/{*rest}/b"),
            Err("has a `{*rest}` segment that is not the last")
        );
        assert_eq!(Pattern::parse("/a/{}"), Err("has a `{}` without a name"));
        assert_eq!(Pattern::parse("/a/{*}"), Err("has a `{*}` without a name"));
        assert_eq!(
            Pattern::parse("/a/x{id}"),
            Err("mixes text with `*`, `{` or `}` in one segment")
        );
        assert_eq!(
            Pattern::parse("/a/b*"),
            Err("mixes text with `*`, `{` or `}` in one segment")
        );
    }

    #[test]
    fn the_builder_names_the_first_bad_rule() {
        let limiter = || {
            Limiter::new(
                crate::MemoryStore::new(),
                crate::Policy::fixed_window("p", 1, std::time::Duration::from_secs(1)).unwrap(),
            )
        };
        let error = Rules::builder()
            .path("/ok", limiter(), crate::key::Global)
            .path("bad", limiter(), crate::key::Global)
            .path("/{}", limiter(), crate::key::Global)
            .build()
            .unwrap_err();
        assert_eq!(error.index(), 1);
        assert_eq!(error.pattern(), "bad");
        assert_eq!(
            error.to_string(),
            r#"rule 1: pattern "bad" must start with '/'"#
        );
    }
}
