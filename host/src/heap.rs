//! The host's heap: long-lived allocations kept apart from the rest ([`Segregating`],
//! [`lasting`]), and the allocator's free memory given back to the kernel after a wave of
//! frees.
//!
//! glibc's `free` returns memory to the kernel only from the top of a heap, so the heap a
//! burst of processes grew stays resident once they are gone: on a host at rest holding
//! 10,000 suspended workflows, about a third of its memory. `malloc_trim` gives back every
//! free page of every arena, but it walks the heaps under their locks, stalling the
//! threads that allocate meanwhile (about 0.1 s after 100,000 processes hibernated), so
//! it runs only once a wave is over: when the processes released since the last trim
//! (those [`suspended`], and the memory slots and stacks the engine [`cooled`]; a
//! component [`compiled`] counts as a wave) reach [`TRIM_AFTER`], none was suspended in
//! the last second (a cooled slot is itself a sign of rest: no process took it for a
//! second), and at most once every [`TRIM_EVERY`]. The engine's epoch thread looks once
//! a second ([`trim_if_due`]). A host whose processes never stop being suspended keeps
//! its heap as it is.

mod lasting;

pub use lasting::{Segregating, lasting, transient};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Sets the system allocator (glibc's) for a long-running host: call it once, at the
/// start of `main`. Elsewhere it does nothing.
///
/// - **No fast bins.** A small chunk freed into a fast bin is merged with its neighbours
///   only when the arena is next consolidated, which `malloc_trim` does without giving
///   back the top of a thread's arena: the memory of a burst of processes ends in arena
///   tops that nothing returns, megabytes each, in whichever arenas the burst's threads
///   used. Freed chunks merged at once instead grow the top in the `free` that can shrink
///   it. The per-thread cache in front of the bins keeps small allocations fast.
/// - **Fixed thresholds.** glibc raises its mmap threshold to the largest mapped chunk
///   freed (the compiler frees buffers of megabytes) and its trim threshold to twice
///   that, up to 64 MiB an arena. Fixed, an arena's top is given back past [`TRIM_TOP`],
///   and requests from [`MAP_FROM`] on are mapped on their own.
pub fn tune_system_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets the allocator's parameters; it is thread-safe.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_TOP as libc::c_int);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MAP_FROM as libc::c_int);
    }
}

/// The free top of an arena past which it is given back to the kernel.
const TRIM_TOP: usize = 1 << 20;

/// The size from which a request gets a mapping of its own.
const MAP_FROM: usize = 4 << 20;

/// Processes released since the last trim past which the heap is trimmed.
const TRIM_AFTER: usize = 64;

/// The least time between two trims.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// When the heap was last trimmed.
static TRIMMED: parking_lot::Mutex<Option<Instant>> = parking_lot::Mutex::new(None);

/// Processes suspended since the last look: a wave still going on.
static SUSPENDED: AtomicUsize = AtomicUsize::new(0);

/// Released since the last trim (or the last look that found too few).
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// Notes that `count` memory slots or stacks no process took for a second were given
/// back: their processes' host-side memory was freed too.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn cooled(count: usize) {
    RELEASED.fetch_add(count, Ordering::Relaxed);
}

/// Notes that a component was compiled: the compiler's working memory, tens of MB for a
/// guest written in Rust, went back to the heap, as much as a wave of processes gives.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn compiled() {
    RELEASED.fetch_add(TRIM_AFTER, Ordering::Relaxed);
}

/// Notes that a process was suspended, its memory given back to the heap.
pub(crate) fn suspended() {
    RELEASED.fetch_add(1, Ordering::Relaxed);
    SUSPENDED.fetch_add(1, Ordering::Relaxed);
}

/// Trims the heap if it is due (see the module's docs); otherwise what was released
/// carries over to the next look.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn trim_if_due() {
    let wave = SUSPENDED.swap(0, Ordering::Relaxed) > 0;
    // Another runtime's epoch thread trimming now does it for both.
    let Some(mut trimmed) = TRIMMED.try_lock() else { return };
    let now = Instant::now();
    if !due(RELEASED.load(Ordering::Relaxed), wave, *trimmed, now) {
        return;
    }
    RELEASED.store(0, Ordering::Relaxed);
    *trimmed = Some(now);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
    tracing::debug!(took = ?now.elapsed(), "trimmed the heap");
}

/// Whether to trim now: `released` processes since the last trim, `wave` if one was
/// suspended in the last second, the last trim at `last`.
fn due(released: usize, wave: bool, last: Option<Instant>, now: Instant) -> bool {
    released >= TRIM_AFTER && !wave && last.is_none_or(|at| now.duration_since(at) >= TRIM_EVERY)
}

// The library's tests run on the allocator its binary uses.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: Segregating = Segregating::new();

#[cfg(test)]
mod tests {
    use super::*;

    /// A trim waits for enough releases, for a second without suspensions, and for
    /// [`TRIM_EVERY`] since the last one.
    #[test]
    fn the_heap_is_trimmed_once_a_wave_is_over_and_not_too_often() {
        let long_ago = Instant::now();
        let now = long_ago + TRIM_EVERY;
        assert!(due(TRIM_AFTER, false, None, now), "a wave of releases, over");
        assert!(!due(TRIM_AFTER - 1, false, None, now), "too few released");
        assert!(!due(TRIM_AFTER * 100, true, None, now), "suspensions still under way");
        let recent = long_ago + TRIM_EVERY / 2;
        assert!(!due(TRIM_AFTER, false, Some(recent), now), "trimmed too recently");
        assert!(due(TRIM_AFTER, false, Some(long_ago), now), "trimmed long enough ago");
    }
}
