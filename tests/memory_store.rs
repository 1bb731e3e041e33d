//! The memory store under a flood of one-off subjects: memory must come back.

use std::time::Duration;

use redlimit::clock::FakeClock;
use redlimit::{Limiter, MemoryStore, Policy};

/// Counts live heap bytes, so the test measures memory exactly instead of guessing
/// from RSS.
#[path = "it/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{live, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[tokio::test(flavor = "current_thread")]
async fn a_million_subjects_leave_no_memory_behind() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    let limiter = Limiter::builder(store.clone())
        .policy(Policy::sliding_window("flood", 10, Duration::from_secs(1)).unwrap())
        .policy(Policy::token_bucket("burst", 5, 5, Duration::from_secs(1)).unwrap())
        .build()
        .unwrap();

    // Warm up whatever the runtime and the store allocate once.
    limiter.check("warm-up", 1).await.unwrap();
    clock.advance(Duration::from_secs(5));
    store.sweep();
    let before = live();

    const SUBJECTS: u32 = 1_000_000;
    for i in 0..SUBJECTS {
        let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        let decision = limiter.check(format!("ip={ip}"), 1).await.unwrap();
        assert!(decision.is_allowed());
        if i % 100_000 == 0 {
            // A flood spread over time: the store sweeps as it goes.
            clock.advance(Duration::from_millis(100));
        }
    }
    let peak = live();
    assert!(
        peak - before > 50 * SUBJECTS as isize,
        "the flood should hold state while its windows last ({} B)",
        peak - before
    );

    // Every window passes; the sweep gives everything back (calls, or the background
    // thread of a store on a real clock, do the same one shard at a time).
    clock.advance(Duration::from_secs(3));
    store.sweep();
    let after = live();
    assert!(store.len() <= 1, "{} entries left", store.len());
    assert!(
        after - before < 256 * 1024,
        "memory did not come back: {} B before, {} B at peak, {} B after",
        before,
        peak,
        after
    );
}
