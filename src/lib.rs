//! redlimit: rate limiting for tower services, decided atomically in Redis or in memory.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    unreachable_pub,
    rust_2018_idioms,
    missing_debug_implementations
)]

pub(crate) mod algorithm;
pub mod block_cache;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
mod error;
mod future;
pub mod headers;
pub mod key;
pub mod layer;
mod limiter;
pub mod policy;
mod response;
pub mod rules;
mod service;
pub mod store;
mod subject;
mod telemetry;
pub mod tiers;

pub use decision::{Decision, Origin, PolicyOutcome};
pub use error::Error;
pub use headers::HeaderStyle;
pub use layer::{BodyStyle, FailureMode, Plan, RateLimit, RateLimitLayer};
pub use limiter::{CheckFuture, Limiter};
pub use policy::{Algorithm, Policy, PolicyError};
pub use store::{MemoryStore, RedisStore, Store, StoreError};
pub use subject::Subject;
