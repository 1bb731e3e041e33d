//! The tower middleware: [`RateLimitLayer`](crate::RateLimitLayer) wraps a service in [`RateLimit`].
//!
//! ```
//! use std::time::Duration;
//!
//! use http::{request::Parts, Request, Response, StatusCode};
//! use redlimit::key::{KeyExtractor, KeyRejection, Secret};
//! use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer, Subject};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! /// Limits each API key on its own; only a keyed hash of the key is kept.
//! struct ApiKey(Secret);
//!
//! impl KeyExtractor for ApiKey {
//!     fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
//!         match parts.headers.get("x-api-key") {
//!             Some(key) => Ok(self.0.subject(key.as_bytes())),
//!             None => Err(KeyRejection::new(StatusCode::UNAUTHORIZED, "missing x-api-key")),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # std::env::set_var("API_KEY_SECRET", "a long random value");
//! // The same secret on every instance that shares a store, from configuration.
//! let secret = Secret::from_env("API_KEY_SECRET")?;
//! let limiter = Limiter::new(
//!     MemoryStore::new(),
//!     Policy::sliding_log("default", 2, Duration::from_secs(60))?,
//! );
//! let service = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(limiter, ApiKey(secret)))
//!     .service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
//!     });
//!
//! let request = || Request::builder().header("x-api-key", "k1").body(String::new());
//! let ok = service.clone().oneshot(request()?).await?;
//! assert_eq!(ok.status(), StatusCode::OK);
//! assert_eq!(ok.headers()["ratelimit-policy"], r#""default";q=2;w=60"#);
//! assert_eq!(ok.headers()["ratelimit"], r#""default";r=1;t=60"#);
//!
//! service.clone().oneshot(request()?).await?;
//! let denied = service.clone().oneshot(request()?).await?;
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["retry-after"], "60");
//!
//! let anonymous = service.oneshot(Request::new(String::new())).await?;
//! assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
//! # Ok(()) }
//! ```
//!
//! One layer can also choose the limiter per request: [`RateLimitLayer::rules`](crate::RateLimitLayer::rules) by
//! method and path (or gRPC method), [`RateLimitLayer::tiers`](crate::RateLimitLayer::tiers) by a tier such as the
//! user's plan. Both are [`Plan`]s, served by the same [`RateLimit`] service.
//!
//! Under axum the same layer goes on a `Router` with `.layer(..)` or `.route_layer(..)`;
//! handlers read the [`Decision`](crate::Decision) with `Extension<Decision>`. Every
//! request the layer lets through carries one, also when the store failed and
//! [`FailureMode::Open`] let it pass
//! ([`Decision::is_checked`](crate::Decision::is_checked) is then `false`); only a
//! request that a [`Rules`] or [`Tiers`] plan leaves unlimited carries none.
//!
//! # Naming the layer's type
//!
//! To keep a layer in a struct field or return it from a function, name it
//! [`KeyedLayer<S, K>`](KeyedLayer): see
//! [naming the layer's type](crate::key#naming-the-layers-type).

mod aftercare;
pub(crate) mod future;
mod grpc;
mod headers;
pub(crate) mod middleware;
mod options;
mod plan;
pub(crate) mod response;
mod rules;
pub(crate) mod service;
mod tiers;
mod verdict;
mod wait;

pub use aftercare::Usage;
pub use middleware::KeyedLayer;
pub use options::{BodyStyle, FailureMode, OverLimit};
pub use plan::{Keyed, Plan};
pub use rules::{RuleError, Rules, RulesBuilder};
pub use tiers::Tiers;
pub use wait::Wait;

pub use crate::layer::future::ResponseFuture;
pub use crate::layer::headers::HeaderStyle;
pub use crate::layer::response::ResponseBody;
pub use crate::layer::service::RateLimit;

#[cfg(test)]
mod tests;
