//! The integration tests, in one binary: one build and one link of the crate with every
//! feature, where each file used to be a binary of its own. One module per area; the
//! promise each one checks is in ARCHITECTURE.md's table. They start their own
//! `redis-server` processes (a cluster too) on free loopback ports through `support`.
//!
//! `tests/memory_store.rs` stays a binary of its own: it counts the process's live
//! allocations with a global allocator, which other tests running beside it would move.

mod support;

mod admin;
mod config;
mod conformance;
mod flood;
mod grpc;
mod layer_promises;
mod leases;
mod outages;
mod properties;
mod redis_cluster;
mod redis_memory;
mod redis_outage;
mod redis_store;
mod rules;
