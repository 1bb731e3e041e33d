//! Tiers: the limiter for a request chosen by its tier (a user's plan), in one layer.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use crate::key::KeyExtractor;
use crate::layer::plan::{Limit, Pick, Sealed};
use crate::limiter::Limiter;
use crate::store::Store;

type TierOf = dyn for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync;

/// Tiers: the limiter for a request chosen by its tier (a user's plan), in one layer.
///
/// ```
/// use std::net::SocketAddr;
/// use std::time::Duration;
///
/// use http::{Request, Response, StatusCode};
/// use redlimit::key::{ClientIp, Extension, KeyExtractorExt};
/// use redlimit::layer::Tiers;
/// use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// /// What the authentication layer puts in the request's extensions.
/// #[derive(Clone)]
/// struct User { id: u64, plan: String }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let minute = Duration::from_secs(60);
/// let tiers = Tiers::new(
///     // Users by id; anonymous callers (no `User`) by address, for the default tier.
///     Extension::new(|user: &User| Subject::new(format!("user:{}", user.id))).or(ClientIp::new()),
///     |parts| parts.extensions.get::<User>().map(|user| user.plan.as_str()),
/// )
/// .tier("free", Limiter::new(store.clone(), Policy::sliding_window("free", 60, minute)?))
/// .tier("pro", Limiter::new(store.clone(), Policy::sliding_window("pro", 600, minute)?))
/// .default(Limiter::new(store, Policy::sliding_window("anonymous", 10, minute)?));
///
/// let service = ServiceBuilder::new()
///     .layer(RateLimitLayer::tiers(tiers))
///     .service_fn(|_req: Request<String>| async {
///         Ok::<_, std::convert::Infallible>(Response::new(String::new()))
///     });
///
/// let request = |user: Option<User>| {
///     let mut request = Request::new(String::new());
///     request.extensions_mut().insert(SocketAddr::from(([192, 0, 2, 1], 40000)));
///     if let Some(user) = user {
///         request.extensions_mut().insert(user);
///     }
///     request
/// };
/// let pro = service.clone().oneshot(request(Some(User { id: 7, plan: "pro".into() }))).await?;
/// assert_eq!(pro.headers()["ratelimit-policy"], r#""pro";q=600;w=60"#);
/// let anonymous = service.oneshot(request(None)).await?;
/// assert_eq!(anonymous.status(), StatusCode::OK);
/// assert_eq!(anonymous.headers()["ratelimit-policy"], r#""anonymous";q=10;w=60"#);
/// # Ok(()) }
/// ```
///
/// The tier function reads the request's head (typically an extension that the
/// authentication layer, placed outside this one, inserted: in axum, added after it);
/// the key extractor names the subject within the tier. A request without a tier, or
/// with one not listed, is checked by the default; without a default it passes
/// unchecked, so set one unless another layer limits such requests. The key must name
/// such requests too: `Extension` alone refuses a request without its value (401)
/// before the default applies, hence the `.or(ClientIp::new())` above.
pub struct Tiers<S, K> {
    key: K,
    tier_of: Box<TierOf>,
    /// Few tiers, so a scan beats hashing the name.
    tiers: Vec<(Box<str>, Limit<S>)>,
    default: Option<Limit<S>>,
}

impl<S: Store, K: KeyExtractor> Tiers<S, K> {
    /// Tiers keyed by `key`, with each request's tier named by `tier_of` (`None`: it
    /// has none, so the default applies).
    pub fn new<F>(key: K, tier_of: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync + 'static,
    {
        Self {
            key,
            tier_of: Box::new(tier_of),
            tiers: Vec::new(),
            default: None,
        }
    }

    /// Requests of tier `name` are checked by `limiter`. Naming a tier again replaces
    /// its limiter.
    pub fn tier(mut self, name: &str, limiter: impl Into<Arc<Limiter<S>>>) -> Self {
        let limit = Limit::new(limiter.into());
        match self.tiers.iter_mut().find(|(n, _)| &**n == name) {
            Some((_, existing)) => *existing = limit,
            None => self.tiers.push((name.into(), limit)),
        }
        self
    }

    /// What checks requests without a tier or with an unlisted one.
    pub fn default(mut self, limiter: impl Into<Arc<Limiter<S>>>) -> Self {
        self.default = Some(Limit::new(limiter.into()));
        self
    }

    /// The limiter of tier `name`, if it has one of its own.
    pub fn limiter(&self, name: &str) -> Option<&Arc<Limiter<S>>> {
        self.tiers
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, limit)| &limit.limiter)
    }
}

impl<S: Store, K: KeyExtractor> Sealed<S> for Tiers<S, K> {
    fn pick(&self, parts: &Parts) -> Pick<'_, S> {
        let tier = (self.tier_of)(parts)
            .and_then(|name| self.tiers.iter().find(|(n, _)| &**n == name))
            .map(|(_, limit)| limit);
        match tier.or(self.default.as_ref()) {
            Some(limit) => Pick::keyed(limit, self.key.extract(parts)),
            None => Pick::Pass,
        }
    }

    fn each_limit<'a>(&'a self, visit: &mut dyn FnMut(&'a Limit<S>)) {
        self.tiers
            .iter()
            .map(|(_, limit)| limit)
            .chain(&self.default)
            .for_each(visit);
    }
}

impl<S: Store, K> fmt::Debug for Tiers<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, limit) in &self.tiers {
            map.entry(name, limit);
        }
        if let Some(default) = &self.default {
            map.entry(&"(default)", default);
        }
        map.finish()
    }
}
