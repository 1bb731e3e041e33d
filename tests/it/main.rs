//! The integration tests, in one binary: one build and one link of the crate with every
//! feature, where each file used to be a binary of its own. One module per area; the
//! promise each one checks is in ARCHITECTURE.md's table. They start their own
//! `redis-server` processes (a cluster too) on free loopback ports through `support`.
//!
//! Two tests that measure memory stay binaries of their own, so no test runs beside
//! them: `tests/memory_store.rs` counts the process's live allocations with a global
//! allocator, and `tests/redis_memory.rs` reads Redis `used_memory` deltas over 2,000
//! subjects, taken apart from the other tests' load.

mod support;

mod admin;
mod auth;
mod batching;
mod bursts;
mod calendar;
mod charges;
mod config;
mod conformance;
mod failover;
mod flood;
mod gateway;
mod grpc;
mod hierarchies;
mod in_flight;
mod keys;
mod layer;
mod layer_costs;
mod layer_promises;
mod layer_wait;
mod leases;
mod outages;
mod properties;
mod redis_cluster;
mod redis_outage;
mod redis_start;
mod redis_store;
mod refunds;
mod rules;
mod settle;
