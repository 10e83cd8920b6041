//! [`StackArena`]: the fibers' stacks of preemptible steps, carved out of one mapping.
//!
//! Why: a preemptible step runs on a fiber stack, and wasmtime keeps the last one a store
//! used for its next call, so every live process that has stepped holds one. wasmtime's
//! own stacks are a mapping each (with a guard page, two): 100k processes would pass the
//! kernel's 65,530 mappings, and mapping and unmapping one per process interrupts every
//! other core for a TLB flush. Like the memory arena
//! (`memory.rs`), this is one `MAP_NORESERVE` read-write mapping whatever the number of
//! stacks, and a freed stack goes back on a last-in first-out free list, so the stacks
//! that churn stay resident.
//!
//! # No guard pages
//!
//! A guard page splits the mapping, one more mapping per stack, which is what the arena
//! is for avoiding. What a guard page would catch is an overflow by host code: Wasm
//! frames are bounded by wasmtime's own check against `max_wasm_stack`, which the engine
//! sets to a quarter of a stack, so the host code below them (wasmtime's calls into and
//! out of the guest, the WASI and `log` imports) has three quarters, 768 KiB, for frames
//! that need a few KiB. An overflow past that would run into the stack below it.
//!
//! # What a freed stack keeps
//!
//! Its top [`KEEP_RESIDENT`] bytes stay resident (not zeroed: a stack's old contents are
//! never read before they are written, and wasmtime does not ask for zeroed stacks);
//! anything below, touched only by a deep call, is given back to the kernel, as are all
//! of a stack's pages once [`WARM_STACKS`] free stacks are warm, or once no fiber took it
//! for a second (as for memory slots, see `memory.rs`). Only if a call went below
//! the kept part, though (see `Drop for Stack`): giving back the other 960 KiB
//! unconditionally, an `madvise` that walks their page tables under the address space's
//! lock, costs on every process's exit (a large share of the workers' time on the
//! lifecycle benchmark: `docs/perf/profiles.md`).

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::{StackCreator, StackMemory};

use super::memory::{FreeSlots, Mapping, cool, dont_need};

/// Bytes at the top of a freed stack left resident for the next fiber: what a step of
/// our guests touches, with room to spare.
const KEEP_RESIDENT: usize = 64 * 1024;

/// Free stacks that keep [`KEEP_RESIDENT`] bytes resident; past it a freed stack gives
/// all its pages back (as `WARM_SLOTS` for memories).
const WARM_STACKS: usize = 1024;

thread_local! {
    /// The stack [`StackArena::new_stack`] last made on this thread. wasmtime makes a
    /// store's fiber stack inside the first async call that needs one, on the thread that
    /// polls the call, and then keeps it for the store's next calls; the process that
    /// polled takes this right after ([`take_made`]) to learn which stack its store keeps.
    static MADE: std::cell::Cell<Option<Range<usize>>> = const { std::cell::Cell::new(None) };
}

/// The stack made on this thread since the last call, if any (see `MADE`).
pub(crate) fn take_made() -> Option<Range<usize>> {
    MADE.take()
}

/// Gives back the resident top of `stack`, a range [`take_made`] returned, so that a
/// waiting process does not hold those pages (`WasmProcess::hibernate`). They read as
/// zero after, which a stack allows: what a finished call left there is never read.
///
/// # Safety
///
/// No fiber runs on `stack`, and none is suspended on it: the call that made it, and
/// every later call of the same store, has returned.
pub(crate) unsafe fn release_top(stack: &Range<usize>) {
    let start = stack.end.saturating_sub(KEEP_RESIDENT).max(stack.start);
    // SAFETY: a page-aligned part of a stack of the arena (slots and `KEEP_RESIDENT` are
    // whole pages) that nothing uses, by the caller's contract. If `madvise` fails the
    // pages stay resident, which only costs memory.
    let _ = unsafe { dont_need(start as *mut u8, stack.end - start) };
}

/// The [`StackCreator`] of the engine: hands out the stacks of one mapping.
pub(crate) struct StackArena {
    arena: Arc<Arena>,
}

struct Arena {
    mapping: Mapping,
    page_size: usize,
    /// Warm stacks keep their top [`KEEP_RESIDENT`] bytes resident, cold ones nothing.
    free: Mutex<FreeSlots>,
}

impl StackArena {
    /// Reserves `stacks` stacks of `size` bytes (rounded up to whole host pages).
    ///
    /// # Errors
    ///
    /// The reservation refused, or too large for the address space.
    pub(crate) fn new(stacks: u32, size: usize) -> anyhow::Result<StackArena> {
        let mapping = Mapping::new(stacks, size, "fiber stacks")?;
        let free = Mutex::new(FreeSlots::new());
        let page_size = rustix::param::page_size();
        Ok(StackArena { arena: Arc::new(Arena { mapping, page_size, free }) })
    }

    /// As `MemoryArena::cooler`: gives back the top of every warm stack no fiber took
    /// since the last call.
    pub(crate) fn cooler(&self) -> impl Fn() -> usize + Send + 'static {
        let arena = Arc::downgrade(&self.arena);
        move || {
            let Some(arena) = arena.upgrade() else { return 0 };
            cool(&arena.free, |slot| {
                let start = arena.mapping.slot_ptr(slot) as usize;
                // SAFETY: as `release_top`'s contract: the stack is off the free list
                // while it is given back, so no fiber runs or is suspended on it.
                unsafe { release_top(&(start..start + arena.mapping.slot_size)) };
            })
        }
    }
}

// SAFETY: every stack handed out is a page-aligned range of the arena's mapping that no
// other live `Stack` overlaps (the free list gives each slot out once until it is given
// back), readable and writable for its whole length. It is not zeroed, which `zeroed`
// permits only to be asked for as defense in depth; the engine never asks (it leaves
// `async_stack_zeroing` off), and a request for it is refused below rather than ignored.
unsafe impl StackCreator for StackArena {
    fn new_stack(&self, size: usize, zeroed: bool) -> wasmtime::Result<Box<dyn StackMemory>> {
        let arena = &self.arena;
        if zeroed {
            wasmtime::bail!("the fiber-stack arena does not zero its stacks");
        }
        if size > arena.mapping.slot_size {
            wasmtime::bail!("a fiber stack of {size} bytes was asked, above the arena's {}", arena.mapping.slot_size);
        }
        let Some(slot) = arena.free.lock().take(arena.mapping.slots) else {
            wasmtime::bail!(
                "`max_instances` reached: all {} fiber stacks are in use by live processes",
                arena.mapping.slots
            )
        };
        let stack = Stack { arena: arena.clone(), slot };
        MADE.set(Some(stack.range()));
        Ok(Box::new(stack))
    }
}

/// One fiber stack: a slot of the arena.
struct Stack {
    arena: Arc<Arena>,
    slot: u32,
}

impl Stack {
    fn range(&self) -> Range<usize> {
        let start = self.arena.mapping.slot_ptr(self.slot) as usize;
        start..start + self.arena.mapping.slot_size
    }
}

// SAFETY: as for `StackCreator` above; the range never changes while the stack lives.
unsafe impl StackMemory for Stack {
    fn top(&self) -> *mut u8 {
        self.range().end as *mut u8
    }

    fn range(&self) -> Range<usize> {
        Stack::range(self)
    }

    fn guard_range(&self) -> Range<*mut u8> {
        // None: see the module docs.
        let bottom = self.range().start as *mut u8;
        bottom..bottom
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let arena = &self.arena;
        let range = self.range();
        let warm = arena.free.lock().warm.len() < WARM_STACKS;
        let kept = if warm { KEEP_RESIDENT.min(range.len()) } else { 0 };
        let below = range.len() - kept;
        // A stack is used from its top down, so a call that reached below the kept part
        // wrote the page just below it on the way: return addresses and saved registers,
        // never a page of zeros. That page reads as zeros otherwise (never touched, or
        // given back at the last free), so looking at it needs no system call; the
        // kernel's page tables would (`/proc/self/pagemap`: a `pread` cost over half of
        // the `madvise` it saved). A frame larger than a page could step over it, or
        // leave it zero; the pages past it then stay resident until the stack is freed
        // again: memory, bounded by the warm stacks, never data a fiber reads (a stack's
        // contents are written before they are read).
        let edge = (range.start + below).saturating_sub(arena.page_size);
        let touched = below > 0
            && (kept == 0 || {
                // SAFETY: a page inside this stack's range, readable (the whole arena is), and
                // no fiber runs on the stack any more.
                let page = unsafe { std::slice::from_raw_parts(edge as *const u64, arena.page_size / 8) };
                page.iter().any(|&word| word != 0)
            });
        if touched {
            // SAFETY: the stack is dropped, so no fiber runs on it, and the range is
            // inside the arena; what it held is never read again, so failing to give it
            // back only costs memory.
            unsafe { dont_need(range.start as *mut u8, below) };
        }
        let mut free = arena.free.lock();
        if warm { free.warm.push(self.slot) } else { free.cold.push(self.slot) }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::wasm::memory::tests::resident;

    const SIZE: usize = 1 << 20;

    #[test]
    fn a_freed_stack_keeps_its_top_and_gives_back_what_a_deep_call_touched() {
        let arena = StackArena::new(2, SIZE).unwrap();
        let stack = arena.new_stack(SIZE, false).unwrap();
        let (top, bottom) = (stack.top(), stack.range().start as *mut u8);
        let near_top = top.wrapping_sub(100);
        // SAFETY: inside the stack, which no fiber runs on.
        unsafe { near_top.write(1) };
        drop(stack);
        assert!(resident(near_top), "a shallow call's page is kept for the next fiber");

        let again = arena.new_stack(SIZE, false).unwrap();
        assert_eq!(again.top(), top, "the last stack freed is handed out first");
        // A deep call: every page from the top down to the lowest.
        let page = rustix::param::page_size();
        for offset in (0..SIZE).step_by(page) {
            // SAFETY: as above.
            unsafe { bottom.add(offset).write(1) };
        }
        assert!(resident(bottom));
        drop(again);
        assert!(!resident(bottom), "what a deep call touched is given back");
        assert!(resident(near_top), "the top is still kept");
    }

    /// A warm stack no fiber took between two coolings gives back its top.
    #[test]
    fn a_warm_stack_no_fiber_took_since_the_last_cooling_gives_back_its_top() {
        let arena = StackArena::new(2, SIZE).unwrap();
        let cool = arena.cooler();
        let stack = arena.new_stack(SIZE, false).unwrap();
        let near_top = stack.top().wrapping_sub(100);
        // SAFETY: inside the stack, which no fiber runs on.
        unsafe { near_top.write(1) };
        drop(stack);
        cool();
        assert!(resident(near_top), "the first cooling only notes what is warm");
        cool();
        assert!(!resident(near_top), "a stack idle since the last cooling is given back");
        let again = arena.new_stack(SIZE, false).unwrap();
        assert_eq!(again.top(), near_top.wrapping_add(100), "a cold stack is handed out again");
    }
}
