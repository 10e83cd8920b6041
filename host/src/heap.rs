//! Giving the allocator's free memory back to the kernel after a wave of frees.
//!
//! glibc's `free` returns memory to the kernel only from the top of a heap, so the heap a
//! burst of processes grew stays resident once they are gone: on a host at rest holding
//! 10,000 suspended workflows, about a third of its memory. `malloc_trim` gives back every
//! free page of every arena; it walks the heaps under their locks, so it runs only after a
//! wave: when the processes released since the last trim ([`released`], counted by
//! whoever frees a process's memory: suspension, the arenas' cooling) reach
//! [`TRIM_AFTER`]. The engine's epoch thread looks once a second ([`trim_if_due`]).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Processes released since the last trim past which the heap is trimmed.
const TRIM_AFTER: usize = 64;

/// Released since the last trim (or the last look that found too few).
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// Notes that `count` processes gave their memory back to the heap.
pub(crate) fn released(count: usize) {
    RELEASED.fetch_add(count, Ordering::Relaxed);
}

/// Trims the heap if [`TRIM_AFTER`] processes or more were released since the last
/// trim; otherwise the count carries over to the next look.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn trim_if_due() {
    if RELEASED.load(Ordering::Relaxed) < TRIM_AFTER {
        return;
    }
    RELEASED.store(0, Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
