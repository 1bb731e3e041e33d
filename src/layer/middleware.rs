//! [`RateLimitLayer`], its options, and what it shares with the services it makes.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderMap, StatusCode};
use tower_layer::Layer;

use crate::error::Error;
use crate::key::KeyExtractor;
use crate::layer::aftercare::Refund;
use crate::layer::headers::HeaderStyle;
use crate::layer::options::{BodyStyle, Config, Cost, FailureMode, OverLimit, Shared};
use crate::layer::plan::{Keyed, Plan};
use crate::layer::rules::Rules;
use crate::layer::service::RateLimit;
use crate::layer::tiers::Tiers;
use crate::layer::wait::Room;
use crate::limiter::Limiter;
use crate::store::Store;

/// Middleware that limits requests by a key taken from each request.
///
/// Built from a [`Limiter`] and a [`KeyExtractor`] ([`RateLimitLayer::new`], whose plan
/// is a [`Keyed`]: its type is [`KeyedLayer<S, K>`](KeyedLayer)), or from a [`Plan`]
/// that picks the limiter per request:
/// [`RateLimitLayer::rules`], [`RateLimitLayer::tiers`]. The options are builder
/// methods. Cloning and [`Layer::layer`] share the limiters and their state. See the
/// [module docs](crate::layer) for an example.
pub struct RateLimitLayer<S, P: Plan<S>> {
    pub(super) shared: Arc<Shared<S, P>>,
}

/// The type of [`RateLimitLayer::new`]'s layer: a limiter on store `S`, keyed by the
/// key extractor `K`. Write it to keep a layer in a struct field or return one from a
/// function (see the [module docs](crate::layer#naming-the-layers-type)):
///
/// ```
/// use std::time::Duration;
///
/// use redlimit::key::ClientIp;
/// use redlimit::layer::KeyedLayer;
/// use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer};
///
/// fn login_limit() -> Result<KeyedLayer<MemoryStore, ClientIp>, redlimit::PolicyError> {
///     let policy = Policy::fixed_window("login", 5, Duration::from_secs(60))?;
///     Ok(RateLimitLayer::new(Limiter::new(MemoryStore::new(), policy), ClientIp::new()))
/// }
/// # login_limit().unwrap();
/// ```
///
/// The second parameter of [`RateLimitLayer`] is its [`Plan`], not the extractor:
/// `KeyedLayer<S, K>` is `RateLimitLayer<S, Keyed<S, K>>`.
pub type KeyedLayer<S, K> = RateLimitLayer<S, Keyed<S, K>>;

impl<S, P: Plan<S>> Clone for RateLimitLayer<S, P> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Store, P: Plan<S>> fmt::Debug for RateLimitLayer<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("plan", &std::any::type_name::<P>())
            .field("config", &self.shared.config)
            .field("refund", &self.shared.refund)
            .finish()
    }
}

impl<S: Store, K: KeyExtractor> RateLimitLayer<S, Keyed<S, K>> {
    /// Limits requests with `limiter`, keyed by `key`, with the defaults: IETF headers
    /// on every response, plain-text denials, fail open, cost 1.
    pub fn new(limiter: Limiter<S>, key: K) -> Self {
        Self::from_shared(Arc::new(limiter), key)
    }

    /// Like [`RateLimitLayer::new`], for a limiter the application also uses elsewhere
    /// (the same limits checked outside HTTP).
    pub fn from_shared(limiter: Arc<Limiter<S>>, key: K) -> Self {
        Self::with_plan(Keyed::new(limiter, key))
    }

    /// The limiter the layer checks.
    pub fn limiter(&self) -> &Arc<Limiter<S>> {
        &self.shared.plan.limit.limiter
    }
}

impl<S: Store> RateLimitLayer<S, Rules<S>> {
    /// Checks each request against the first of `rules` that matches it (method and
    /// path, or gRPC service and method), with that rule's limiter and key; a request
    /// no rule matches passes unchecked unless the rules have a default.
    pub fn rules(rules: Rules<S>) -> Self {
        Self::with_plan(rules)
    }
}

impl<S: Store, K: KeyExtractor> RateLimitLayer<S, Tiers<S, K>> {
    /// Checks each request against the limiter of its tier (a user's plan, say), all
    /// in one layer; see [`Tiers`].
    pub fn tiers(tiers: Tiers<S, K>) -> Self {
        Self::with_plan(tiers)
    }
}

impl<S: Store, P: Plan<S>> RateLimitLayer<S, P> {
    fn with_plan(plan: P) -> Self {
        Self {
            shared: Arc::new(Shared {
                plan: Arc::new(plan),
                config: Config {
                    header_style: HeaderStyle::default(),
                    headers_on_allowed: true,
                    body_style: BodyStyle::default(),
                    quota_status: StatusCode::TOO_MANY_REQUESTS,
                    failure_mode: FailureMode::default(),
                    over_limit: OverLimit::default(),
                    cost: Cost::Fixed(1),
                    settles: false,
                },
                refund: None,
                room: None,
            }),
        }
    }

    /// Which rate-limit headers to send ([`HeaderStyle::Ietf`] by default).
    pub fn header_style(mut self, style: HeaderStyle) -> Self {
        self.config_mut().header_style = style;
        self
    }

    /// Whether allowed responses carry the rate-limit headers too (yes by default), so
    /// well-behaved clients can slow down before they are denied.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.config_mut().headers_on_allowed = on;
        self
    }

    /// How the bodies of 429, 503 and key rejections are written (plain text by default).
    pub fn body_style(mut self, style: BodyStyle) -> Self {
        self.config_mut().body_style = style;
        self
    }

    /// The status of a denial by a calendar quota
    /// ([`Policy::calendar`](crate::Policy::calendar)), to tell a quota spent for the
    /// period from a rate to slow down to: `429 Too Many Requests` by default, any
    /// 4xx otherwise (`402 Payment Required` for a plan's allowance, `403 Forbidden`).
    /// A status outside 400 to 499 is refused: the denial stays a 429, and a warning
    /// is logged.
    ///
    /// The answer is the 429's otherwise: `Retry-After` the seconds to the period's
    /// end, the rate-limit headers, a body naming the quota and when it resets. It
    /// applies when the policy that denied (the longest wait among those that did) is
    /// an enforced calendar quota; gRPC requests get `RESOURCE_EXHAUSTED` as for
    /// every denial.
    pub fn quota_status(mut self, status: StatusCode) -> Self {
        if status.is_client_error() {
            self.config_mut().quota_status = status;
        } else {
            tracing::warn!(
                status = status.as_u16(),
                "quota_status takes a 4xx status; calendar quota denials stay 429"
            );
        }
        self
    }

    /// What to answer when the store cannot decide ([`FailureMode::Open`] by default).
    pub fn failure_mode(mut self, mode: FailureMode) -> Self {
        self.config_mut().failure_mode = mode;
        self
    }

    /// What every request costs (1 by default).
    ///
    /// # Errors
    ///
    /// [`Error::ZeroCost`] for 0, [`Error::CostTooHigh`] when some limiter of the layer
    /// could never admit `cost`: found now, not at the first request.
    pub fn cost(mut self, cost: u32) -> Result<Self, Error> {
        let mut refused = None;
        self.shared.plan.each_limit(&mut |limit| {
            if refused.is_none() {
                refused = limit.limiter.valid_cost(cost).err();
            }
        });
        match refused {
            Some(error) => Err(error),
            None => {
                self.config_mut().cost = Cost::Fixed(cost);
                Ok(self)
            }
        }
    }

    /// Computes each request's cost from its head (a bulk endpoint charging per item,
    /// say).
    ///
    /// The cost is then the client's input. A request whose cost no policy of its
    /// limiter could ever admit is refused and counts nothing, whatever the
    /// [`FailureMode`] and the store: a cost of 0 is answered `400 Bad Request`, a cost
    /// above what a policy admits at once `429` without `Retry-After` (no wait makes
    /// it fit); gRPC gets `INVALID_ARGUMENT` and `RESOURCE_EXHAUSTED`.
    /// [`Limiter::check`] still returns [`Error::ZeroCost`] and
    /// [`Error::CostTooHigh`] to callers outside HTTP.
    pub fn cost_fn(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.config_mut().cost = Cost::PerRequest(Arc::new(cost));
        self
    }

    /// Treats each request's cost ([`cost`](Self::cost) or [`cost_fn`](Self::cost_fn))
    /// as a reservation, settled on the actual cost the inner service reports: the
    /// most a request may use is taken before it runs, so concurrent requests cannot
    /// overshoot the limit by their number times their cost, and the client pays what
    /// it used, not the estimate.
    ///
    /// Every request the layer lets through finds a [`Usage`](crate::layer::Usage) in
    /// its extensions (beside its [`Decision`](crate::Decision)), so an
    /// `Extension<Usage>` handler never fails for want of one; the handler, or the
    /// body it streams, reports the actual on it. When the response body ends or is
    /// dropped (the client went away, the handler panicked), the layer settles in one
    /// store call, off the response's path, where the check took the reservation (the
    /// store, or the fallback): less than reserved gives the rest back (which also
    /// lifts this instance's cached denial of the subject), more charges the excess
    /// even past the limit, a debt the next requests wait out (bounded: at most four
    /// limits in all, after which more is not taken). Nothing reported settles at the
    /// reserved cost, with no call. A response the [`refund_on`](Self::refund_on) rule
    /// refunds gives back the whole reservation instead.
    ///
    /// A request let through unchecked ([`FailureMode::Open`]), over its limit
    /// ([`OverLimit::Degrade`]) or unlimited (no rule or tier applies) reserved
    /// nothing: its `Usage` says so ([`settles`](crate::layer::Usage::settles) is
    /// `false`), and what is reported on it settles nothing, with no store call.
    pub fn settle(mut self) -> Self {
        self.config_mut().settles = true;
        self
    }

    fn config_mut(&mut self) -> &mut Config {
        &mut Arc::make_mut(&mut self.shared).config
    }
}

impl<S: Store, P: Plan<S>> RateLimitLayer<S, P> {
    /// What to do with a request over its limit ([`OverLimit::Refuse`] by default).
    ///
    /// Each call with [`OverLimit::Wait`] gives the layer places of its own to wait in;
    /// its clones (and the services made of them) share them.
    pub fn over_limit(mut self, over: OverLimit) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        shared.config.over_limit = over;
        shared.room = match over {
            OverLimit::Wait(_) => Some(Arc::new(Room::default())),
            OverLimit::Refuse | OverLimit::Degrade => None,
        };
        self
    }

    /// Gives back an allowed request's cost when the inner service answers with a
    /// status `when` picks: a client should not lose its budget to the server's own
    /// failures.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redlimit::{key::Global, Limiter, MemoryStore, Policy, RateLimitLayer};
    /// # let limiter = Limiter::new(MemoryStore::new(), Policy::fixed_window("api", 5, Duration::from_secs(1)).unwrap());
    /// let layer = RateLimitLayer::new(limiter, Global).refund_on(|status| status.is_server_error());
    /// ```
    ///
    /// Pick statuses a client cannot cause at will: a refunded request is free, so if
    /// malformed input makes the handler answer 500, refunding every 5xx lets a client
    /// bypass the limit by sending it. `502..=504` (an upstream failed) is the safer
    /// rule when handlers can answer 500 to bad input.
    ///
    /// The refund is [`Limiter::refund`] of the request's subject and cost, after the
    /// response head is known; it never delays the response. The memory store refunds
    /// at once; a Redis refund runs as a Tokio task, and its failure is logged. Not
    /// refunded: a request whose response future is dropped before the inner service
    /// answers, or whose inner service returns an error instead of a response.
    pub fn refund_on(self, when: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.refund_when(move |status, _| when(status))
    }

    /// Like [`RateLimitLayer::refund_on`], deciding on the response's headers as well.
    ///
    /// For gRPC, whose errors come with HTTP 200: a tonic error answered at once (a
    /// trailers-only response) carries its `grpc-status` in the headers.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redlimit::{key::Global, Limiter, MemoryStore, Policy, RateLimitLayer};
    /// # let limiter = Limiter::new(MemoryStore::new(), Policy::fixed_window("api", 5, Duration::from_secs(1)).unwrap());
    /// // UNAVAILABLE (14) and INTERNAL (13) are the server's fault, not the caller's.
    /// let layer = RateLimitLayer::new(limiter, Global).refund_when(|status, headers| {
    ///     status.is_server_error()
    ///         || matches!(headers.get("grpc-status").map(|v| v.as_bytes()), Some(b"13" | b"14"))
    /// });
    /// ```
    pub fn refund_when(
        mut self,
        when: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.shared).refund = Some(Refund::new(when));
        self
    }
}

impl<S, P: Plan<S>, Inner> Layer<Inner> for RateLimitLayer<S, P> {
    type Service = RateLimit<S, P, Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}
