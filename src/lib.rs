//! Rate limiting for tower services, decided atomically in Redis or in memory.
//!
//! ```
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{body::Body, http::{Request, StatusCode}, routing::get, Router};
//! use redlimit::{key::ClientIp, Limiter, MemoryStore, Policy, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two requests per minute per client IP, on a sliding window.
//! let limiter = Limiter::new(
//!     MemoryStore::new(),
//!     Policy::sliding_window("default", 2, Duration::from_secs(60))?,
//! );
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter, ClientIp::new()));
//!
//! // A server gives the peer address through `into_make_service_with_connect_info`;
//! // here each request carries it as an extension.
//! let request = || {
//!     let mut request = Request::new(Body::empty());
//!     request.extensions_mut().insert(SocketAddr::from(([203, 0, 113, 7], 4711)));
//!     request
//! };
//! assert_eq!(app.clone().oneshot(request()).await?.status(), StatusCode::OK);
//! assert_eq!(app.clone().oneshot(request()).await?.status(), StatusCode::OK);
//! let denied = app.oneshot(request()).await?;
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(denied.headers().contains_key("retry-after"));
//! assert_eq!(denied.headers()["ratelimit-policy"], r#""default";q=2;w=60"#);
//! # Ok(()) }
//! ```
//!
//! The names you type are here at the root; the rest is in a module each:
//!
//! - [`Policy`]: an algorithm (fixed window, sliding window, token bucket, sliding
//!   log), its numbers and a name, valid by construction.
//! - [`Limiter`]: a store and the policies checked together; `check(subject, cost)`
//!   works without HTTP too. Several policies, a block cache, an in-memory fallback
//!   and leases through [`Limiter::builder`].
//! - [`MemoryStore`] for one process, [`RedisStore`] (one Lua script, one round trip,
//!   single node or cluster) for many; [`store`] holds their errors and the `Store`
//!   bound for code generic over both. `RedisStore`, and the `deadpool_redis` and
//!   `redis` crates it takes, are the `redis` feature's (on by default): without it
//!   the build holds no Redis client.
//! - [`key`]: which subject a request is limited as (client IP with a trusted-proxy
//!   walk, hashed API key header, authenticated user, route, combinations).
//! - [`RateLimitLayer`], answering 429 with `Retry-After` and the IETF `RateLimit`
//!   headers; [`layer`] holds its options, its service and the plans that pick a
//!   limiter per request ([`layer::Rules`], [`layer::Tiers`]).
//! - [`lease`]: hot subjects served from units leased from the store.
//! - [`clock`]: where time comes from; a fake clock makes every boundary test exact.
//!
//! Dependencies run one way: the core (policy, the algorithms, decision, subject,
//! clock, limiter, block cache, stores, key extractors, telemetry) knows nothing of
//! HTTP responses or tower; [`layer`] is built on the core; `config` builds values of
//! both. `ARCHITECTURE.md` draws the map.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    unreachable_pub,
    rust_2018_idioms,
    missing_debug_implementations
)]

// The core: limits and where they are kept, without HTTP.
pub(crate) mod algorithm;
pub mod clock;
mod decision;
mod error;
pub mod key;
pub mod lease;
mod limiter;
mod policy;
pub mod store;
mod subject;
mod telemetry;

// The tower middleware, on top of the core.
pub mod layer;

// Hooks for the crate's own tests and benches, never for applications.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;

// Policies, rules and proxies from a file: builds core and middleware values.
#[cfg(feature = "config")]
pub mod config;

pub use decision::{Decision, Origin, PolicyOutcome};
pub use error::Error;
pub use layer::middleware::RateLimitLayer;
pub use limiter::{BuildError, CheckFuture, Limiter, LimiterBuilder, Permit};
#[cfg(feature = "calendar")]
pub use policy::Period;
pub use policy::{Algorithm, Policy, PolicyError, Scope, Unit};
pub use store::memory::MemoryStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
pub use subject::Subject;

/// The pool crate [`RedisStore::new`] and [`RedisStore::cluster`] take, at the version
/// they take: `redlimit::deadpool_redis::Config::from_url(..)` always builds a pool the
/// store accepts, whatever version the application depends on itself.
#[cfg(feature = "redis")]
pub use deadpool_redis;
/// The Redis client under [`deadpool_redis`], at the same version (for connections
/// and commands of your own on the pool the store uses).
#[cfg(feature = "redis")]
pub use deadpool_redis::redis;

/// The README's code blocks marked `rust` compile as doctests, warning-free (readers
/// copy them into crates that deny warnings).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[doc(test(attr(deny(warnings))))]
pub struct ReadmeDoctests;

/// The code blocks of the pages under `docs/` compile as doctests too.
#[cfg(doctest)]
mod docs_doctests {
    macro_rules! page {
        ($name:ident, $path:literal) => {
            #[doc = include_str!($path)]
            #[doc(test(attr(deny(warnings))))]
            pub struct $name;
        };
    }
    page!(Admin, "../docs/admin.md");
    page!(Algorithms, "../docs/algorithms.md");
    page!(Config, "../docs/config.md");
    page!(Costs, "../docs/costs.md");
    page!(Failures, "../docs/failures.md");
    page!(Grpc, "../docs/grpc.md");
    page!(Hierarchies, "../docs/hierarchies.md");
    page!(InFlight, "../docs/in_flight.md");
    #[cfg(feature = "calendar")]
    page!(Quotas, "../docs/quotas.md");
    page!(Redis, "../docs/redis.md");
    page!(Responses, "../docs/responses.md");
    page!(Rules, "../docs/rules.md");
}
