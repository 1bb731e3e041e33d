//! Leases: a hot subject's units taken from a shared store in batches and spent
//! locally, so a subject sending thousands of requests a second costs the store a few
//! calls a second, with one budget across every instance.
//!
//! ```
//! use redlimit::{clock::FakeClock, lease::Leases, Limiter, MemoryStore, Origin, Policy};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = FakeClock::new(0);
//! // 1000 a second per subject; subjects asking 50 a second or more of this instance
//! // spend leases of up to 100 units, each living at most 100 ms.
//! let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
//!     .policy(Policy::sliding_window("api", 1000, Duration::from_secs(1))?)
//!     .local_clock(clock.clone())
//!     .leases(Leases::new())
//!     .build()?;
//! // Below the rate, each request is one exact store call.
//! for _ in 0..4 {
//!     assert_eq!(limiter.check("key-7", 1).await?.origin(), Origin::Store);
//! }
//! // The fifth unit in a lifetime makes a leasing check: its own unit and a lease of 5
//! // (990 left in the store; what this instance may admit counts the lease too).
//! let leasing = limiter.check("key-7", 1).await?;
//! assert_eq!((leasing.origin(), leasing.remaining()), (Origin::Store, 995));
//! // The next ones are spent from the lease, with no store call.
//! let leased = limiter.check("key-7", 1).await?;
//! assert_eq!((leased.origin(), leased.remaining()), (Origin::Lease, 994));
//! # Ok(()) }
//! ```
//!
#![doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/leases.md"))]

// The public face of leases: their settings (a setting that cannot work is a
// `BuildError::Lease*` from `build()`). The lease runtime (the table of subjects, the
// one leasing check in flight, give-backs and the sweep) is the limiter's, in
// limiter/lease; what a store does for leases is in store/lease.rs.
pub use crate::limiter::lease::Leases;
