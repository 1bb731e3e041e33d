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
//! The memory store leases as the model of a shared store's leasing check (one
//! process's memory gains nothing from leases); with instances sharing a Redis:
//!
//! ```no_run
//! use redlimit::{deadpool_redis, lease::Leases, Limiter, Policy, RedisStore};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379/")
//!     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
//! // 1000 a second per API key across the fleet; keys sending 50 a second or more to
//! // this instance spend leases of up to 100 units, each living at most 100 ms.
//! let limiter = Limiter::builder(RedisStore::new(pool))
//!     .policy(Policy::sliding_window("api", 1000, Duration::from_secs(1))?)
//!     .leases(Leases::new())
//!     .build()?;
//! let decision = limiter.check("key-7", 1).await?;
//! # let _ = decision; Ok(()) }
//! ```
//!
//! # How a lease works
//!
//! Each instance counts, per subject, the units asked of it in the current and the last
//! lease lifetime. A subject below [`Leases::min_rate`] is checked as without leases:
//! one store call per request, exact. Above it, the instance's next store call for the
//! subject is a *leasing check*
//! (the store's leasing check): in the one
//! atomic call a check makes, the store decides the request, and if every policy
//! admits it also takes up to `want` more units from every policy (all or nothing,
//! never more than each admits now). `want` is the units the subject asked of this
//! instance in a lifetime, at most [`Leases::max_units`]: it grows with the subject's
//! rate and shrinks when leases go unspent. The instance then admits the subject's requests
//! from the lease without a store call until the units run out or the lease expires.
//! A lease lives at most [`Leases::lifetime`] and never past the end of the current
//! window of any window policy of the set (the store says how far that is). Both are
//! measured on the store's clock as this instance reads it
//! (the store's lease clock: the memory store's
//! clock, a Redis store's client clock, or for Redis `TIME` a monotonic clock), from
//! the moment the leasing call was sent, never on the limiter's local clock. Units left
//! when it expires are given back through the refund path
//! ([`Limiter::refund`](crate::Limiter::refund)): a window policy takes them back while
//! its window lasts. A set with a token bucket writes them off: its refund moves the
//! arrival time back, which after the bucket has refilled past the lease would credit
//! the same units twice; written-off units come back by refill within
//! `units x interval`.
//!
//! A leasing check admits only when the cost and a batch ([`Leases::batch`], half the
//! lease by default) fit: a sliding window or a token bucket under steady overload
//! frees units one at a time, and asking for each would cost a call per unit. A
//! denied leasing check is kept: the instance answers the subject locally with that
//! denial until the store said the cost and a batch will fit, so a denied hot subject
//! costs the store nothing.
//!
//! # What leases promise
//!
//! With `L` the lease lifetime and `n` instances:
//!
//! - **Fixed window and sliding window counter: no over-admission** while the store
//!   keeps its counts (when it loses them, see [below](#when-things-go-wrong)). A
//!   unit is counted in the store when its lease is taken, in the window the lease was
//!   taken in, and spent in that same window (a lease ends with it, on the store's
//!   clock). So the store's counts are never
//!   below what the instances admitted, and every admission satisfies the policy's own
//!   inequality: for a fixed window `admitted(window) <= limit`; for a sliding window
//!   counter, at every admission `previous * (w - elapsed) / w + current <= limit`.
//! - **Token bucket: a burst at most `L / emission interval` larger.** Units leave the
//!   bucket when leased and are spent up to `L` later; over any interval of length `d`
//!   the instances admit at most `capacity + ceil(L / interval) + d / interval`:
//!   the refill rate times the lifetime more than one store would.
//! - **Under-admission: units are stranded at most one lifetime, plus a quarter of one
//!   for the sweep.** When a subject's demand on an instance stops, its lease's units
//!   wait for the lease to expire, then go back to the store (a background task looks
//!   every `L / 4`). With a token bucket they are written off and come back by refill,
//!   within `units x interval` (at most [`Leases::max_units`] intervals).
//! - **Denials come from the store.** A leasing subject is denied by a store call on
//!   the whole budget, when the cost and a batch ([`Leases::batch`]) do not fit; the
//!   store says when they will, and the instance answers the subject locally with that
//!   denial until then, its `Retry-After` counting down to that time: the store's
//!   retry time for the request plus, at most, the time a batch takes to free up. A
//!   fixed window needs no batch: its denials and retry times are exactly those of a
//!   limiter without leases (the window's end).
//! - **Headers:** a decision from a lease reports the binding policy's remaining as the
//!   store last said it, plus the lease's unspent units: what this instance knows.
//!   Other instances' spending since is not in it.
//!
//! # When things go wrong
//!
//! - **The store loses the subject's counts** (`FLUSHALL`, a restart without
//!   persistence, a failover that lost writes, or [`Limiter::reset`](crate::Limiter::reset)
//!   from any instance). An instance cannot see it before its next call, and until
//!   then spends the lease it holds, whose units the store no longer counts. Bound:
//!   in the window of the loss, the instances admit at most **the limit plus the
//!   units they held in leases at that moment** (for a token bucket, those units on
//!   top of its burst). Each instance holds at most [`Leases::max_units`] (a tenth
//!   of the smallest limit by default) and at most what the subject asked of it in a
//!   lifetime, and spends it within one lifetime. Give-backs do not add to it: a
//!   leasing check that grants units also names the subject's *lease generation*
//!   (made by the first grant, kept as long as the states, forgotten with them), the
//!   lease and its give-back carry it, and the store gives units back only while its
//!   generation is still theirs. Measured (`tests/it/leases.rs`): four instances, 2,000
//!   per 2 s at twice the limit, a flush 300 ms into a window: 2,200 admitted after it
//!   with 204 units held (2,101 with 102 held when two instances are drained), 2,000
//!   without leases; a sliding window counter 2,023 (27 held). A reset costs the
//!   same, less the units of the instance that reset: it forgets its own lease.
//! - **An admin operation on this instance.** [`Limiter::reset`](crate::Limiter::reset)
//!   forgets the subject's lease and kept denial here (the units are gone with the
//!   state), so its next check asks the store; [`Limiter::refund`](crate::Limiter::refund)
//!   forgets the kept denial (the store may admit again) and keeps the lease (the
//!   store still counts its units, so a refund on every failed request, as the
//!   layer's refund rules make, costs no lease). Other instances keep a denial they
//!   were given until its time: fewer admissions, never more.
//! - **The limiter's local clock runs wrong** (slow, fast, or stepped back as
//!   `SystemClock` is by an NTP step). Leases and kept denials are timed on the
//!   store's clock, so it cannot carry units into the store's next window; the local
//!   clock only measures rates and idle time, so at worst a subject leases later or
//!   its idle entry is swept later. (A Redis store's client clock *is* the store's
//!   clock: instances whose client clocks disagree disagree on windows, leases or
//!   not.)
//! - **The store fails** during a leasing check: the request and those waiting for
//!   the same check answer with the failure (the limiter's fallback or failure mode);
//!   a lease held keeps being spent until it expires (its units are counted).
//! - **The request making a leasing check is cancelled** (its future dropped): the
//!   requests waiting for that check are not left waiting; the first of them asks in
//!   its place, the others wait for that one.
//! - **More subjects than [`Leases::max_subjects`]**: the others are checked without
//!   leases until idle subjects (two lifetimes without a request, holding nothing)
//!   make room: the sweep looks every quarter lifetime from the first subject
//!   tracked, and a full shard makes room itself when a new subject arrives.
//! - **Settings out of range** are a [`LeaseError`] (a lifetime under 1 ms, 0 units,
//!   0 subjects) or are taken at the largest value that works (a lifetime past the
//!   shortest window, more units than the smallest limit, a batch larger than a
//!   lease): never a panic, never another limit.
//!
//! A sliding log never leases: exactness is its promise, and
//! [`LimiterBuilder::leases`](crate::LimiterBuilder::leases) refuses it ([`LeaseError::SlidingLog`]).

// The public face of leases: their settings and errors. The lease runtime (the
// table of subjects, the one leasing check in flight, give-backs and the sweep) is
// the limiter's, in limiter/lease; what a store does for leases is in store/lease.rs.
pub use crate::limiter::lease::{LeaseError, Leases};
