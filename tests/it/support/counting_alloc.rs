//! A global allocator that counts live heap bytes, so a program measures memory
//! exactly instead of guessing from RSS (the system allocator keeps freed pages).
//! Included with `#[path]` by `tests/memory_store.rs` and `benches/programs/burst.rs`
//! (a binary of its own each: a global allocator is one per program), not a module of
//! the `it` support.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting.
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The most live heap bytes since [`reset_peak`].
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Live heap bytes now.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The most live heap bytes since the last [`reset_peak`] (burst.rs: what a burst
/// holds while it waits).
#[allow(dead_code)]
pub fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts [`peak`] again from the live heap now.
#[allow(dead_code)]
pub fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is
// only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
