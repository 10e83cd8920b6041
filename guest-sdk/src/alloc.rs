//! The guest's global allocator (feature `allocator`, on by default): small blocks from
//! pages of its own, so that an idle process touches as few pages of its linear memory
//! as it can.
//!
//! Why: Rust's standard library on `wasm32-wasip2` allocates with wasi-libc's `malloc`
//! (dlmalloc), whose first call takes the whole rest of the initial memory as its heap
//! and writes a boundary marker at its end, 30-odd KiB past anything the process uses:
//! one page (4 KiB) of every process's memory touched for nothing, and the heap's first
//! page beside it. Here a block is carved from memory grown for the purpose
//! (`memory.grow`), from its start up, and nothing is written past the last block
//! handed out; an SDK process that waits for a message touches one heap page where
//! dlmalloc touched two (see `docs/perf/wait.md`).
//!
//! # How
//!
//! Blocks of up to [`LARGEST`] bytes (with an alignment of at most [`ALIGN`]) come in
//! size classes; a freed block goes on its class's free list and is handed out again
//! for the next request of the class, first the last freed. A class with none free
//! takes a block from the end of the current run of grown pages, which grows by whole
//! Wasm pages when it runs out. The size of a block is its layout's, which
//! `dealloc` and `realloc` are given, so blocks carry no header. Larger blocks, and
//! stricter alignments, go to wasi-libc's `malloc` (`System`), which only then sets
//! itself up; it grows the memory for itself, beside these pages, as it would beside
//! anyone's.
//!
//! What a class's blocks hold stays that class's: memory freed in one size class is not
//! given to another. A process whose small allocations change size over time keeps, per
//! class, its largest number of live blocks so far: the price of having no headers and
//! no coalescing, which large blocks (dlmalloc's) do not pay. A guest that would rather
//! have dlmalloc for everything, or an allocator of its own, turns the `allocator`
//! feature off.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::{self, NonNull};

/// The largest block served from the size classes; larger ones go to `System`.
pub(crate) const LARGEST: usize = 8 * 1024;

/// Every block is aligned to this (blocks are carved at multiples of it); a stricter
/// alignment goes to `System`.
pub(crate) const ALIGN: usize = 16;

/// The size classes: multiples of [`ALIGN`], two a doubling from 64 bytes to 4 KiB, then
/// one a KiB, so a block wastes at most a third of itself.
const CLASSES: [usize; 20] =
    [16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, LARGEST];

/// The size class of a request of `size` bytes (at least 1) and alignment `align`, or
/// `None` if `System` serves it.
fn class_of(size: usize, align: usize) -> Option<usize> {
    if size > LARGEST || align > ALIGN {
        return None;
    }
    // A short scan: sizes cluster at the small end.
    CLASSES.iter().position(|&class| class >= size)
}

/// Where the pages come from: the guest's memory (`memory.grow`), or a buffer in the
/// SDK's native tests.
pub(crate) trait Pages {
    /// Adds `count` pages of [`PAGE`] bytes, zeroed, and returns where they start, or
    /// `None` if the memory cannot grow.
    fn grow(&mut self, count: usize) -> Option<NonNull<u8>>;
}

/// A Wasm page.
pub(crate) const PAGE: usize = 64 * 1024;

/// The classes' free lists and the run of grown memory new blocks are carved from.
pub(crate) struct Classes<P> {
    pages: P,
    /// The first free block of each class; each free block holds the address of the
    /// next in its first bytes.
    free: [*mut u8; CLASSES.len()],
    /// The unused rest of the pages last grown: `[next, end)`.
    next: usize,
    end: usize,
}

impl<P: Pages> Classes<P> {
    pub(crate) const fn new(pages: P) -> Self {
        Classes { pages, free: [ptr::null_mut(); CLASSES.len()], next: 0, end: 0 }
    }

    /// A block of class `class`, or null if the memory cannot grow.
    fn take(&mut self, class: usize) -> *mut u8 {
        let head = self.free[class];
        if !head.is_null() {
            // SAFETY: `head` is a free block of this class, which `give` left holding
            // the next one's address in its first bytes (blocks are `ALIGN`-aligned and
            // at least a pointer long).
            self.free[class] = unsafe { head.cast::<*mut u8>().read() };
            return head;
        }
        let size = CLASSES[class];
        if self.end - self.next < size {
            let count = size.div_ceil(PAGE);
            let Some(start) = self.pages.grow(count) else {
                return ptr::null_mut();
            };
            let start = start.as_ptr() as usize;
            // What was left of the last run, if the new pages do not follow it, stays
            // unused: less than a block of this class.
            if start != self.end {
                self.next = start;
            }
            self.end = start + count * PAGE;
        }
        let block = self.next;
        self.next += size;
        block as *mut u8
    }

    /// Gives back `block`, of class `class`.
    ///
    /// # Safety
    ///
    /// `block` came from [`Classes::take`] for `class` and is no longer used.
    unsafe fn give(&mut self, block: *mut u8, class: usize) {
        // SAFETY: the block is free, aligned to `ALIGN` and at least a pointer long, so
        // its first bytes can hold the list's link.
        unsafe { block.cast::<*mut u8>().write(self.free[class]) };
        self.free[class] = block;
    }
}

/// The allocator: [`Classes`] over the guest's memory, `System` past them.
pub(crate) struct Allocator<P> {
    classes: UnsafeCell<Classes<P>>,
}

impl<P: Pages> Allocator<P> {
    pub(crate) const fn new(pages: P) -> Self {
        Allocator { classes: UnsafeCell::new(Classes::new(pages)) }
    }

    /// # Safety
    ///
    /// No other call of this allocator runs (a guest has one thread; see `Sync` below).
    #[allow(clippy::mut_from_ref, reason = "the allocator's calls never overlap: a guest has one thread")]
    unsafe fn classes(&self) -> &mut Classes<P> {
        // SAFETY: by the caller's contract, this is the only reference while it lives.
        unsafe { &mut *self.classes.get() }
    }
}

// SAFETY: the SDK's guests run on one thread (`wasm32-wasip2` without the `atomics`
// feature, which the global allocator below requires), so the allocator's calls never
// overlap. The SDK's native tests share an allocator only within one test.
unsafe impl<P> Sync for Allocator<P> {}

// SAFETY: a block of a class is `CLASSES[class]` bytes, at least the layout's size,
// aligned to `ALIGN`, at least its alignment, and handed out once until given back;
// every other layout is `System`'s, and a block goes back to whoever made it, since
// the class depends only on the layout `dealloc` and `realloc` are given.
unsafe impl<P: Pages> GlobalAlloc for Allocator<P> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout.size().max(1), layout.align()) {
            // SAFETY: one call at a time (see `Sync`).
            Some(class) => unsafe { self.classes() }.take(class),
            // SAFETY: the caller's contract is `System`'s.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match class_of(layout.size().max(1), layout.align()) {
            // SAFETY: `block` was allocated with `layout`, so from this class, and the
            // caller no longer uses it; one call at a time (see `Sync`).
            Some(class) => unsafe { self.classes().give(block, class) },
            // SAFETY: allocated by `System` with `layout`, as `alloc` decided.
            None => unsafe { System.dealloc(block, layout) },
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = class_of(layout.size().max(1), layout.align());
        let new = class_of(new_size.max(1), layout.align());
        match (old, new) {
            // The block already has room: a growing `Vec` of small items stays put
            // within its class.
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: both `System`'s, the caller's contract is its `realloc`'s.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            _ => {
                // SAFETY: `new_size` with the same alignment is a valid layout (the
                // caller's contract for `realloc`).
                let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                // SAFETY: as `alloc`, with a non-zero size.
                let moved = unsafe { self.alloc(new_layout) };
                if !moved.is_null() {
                    // SAFETY: both blocks hold at least the smaller size, and are
                    // distinct (the old one is still allocated).
                    unsafe { ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size)) };
                    // SAFETY: the caller's block, allocated with `layout`, now unused.
                    unsafe { self.dealloc(block, layout) };
                }
                moved
            }
        }
    }
}

/// The guest's linear memory, grown by `memory.grow`.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub(crate) struct LinearMemory;

#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
impl Pages for LinearMemory {
    fn grow(&mut self, count: usize) -> Option<NonNull<u8>> {
        let previous = core::arch::wasm32::memory_grow(0, count);
        if previous == usize::MAX {
            return None;
        }
        // Memory index 0 starts at address 0: the new pages start at its old size.
        NonNull::new((previous * PAGE) as *mut u8)
    }
}

#[cfg(all(feature = "allocator", target_arch = "wasm32", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: Allocator<LinearMemory> = Allocator::new(LinearMemory);

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages from a buffer, as many as it holds.
    struct Buffer {
        memory: Vec<u8>,
        used: usize,
        grown: usize,
    }

    impl Pages for Buffer {
        fn grow(&mut self, count: usize) -> Option<NonNull<u8>> {
            let start = self.used.next_multiple_of(PAGE);
            let base = self.memory.as_mut_ptr() as usize;
            // Pages start at a multiple of `PAGE` from address 0, as in Wasm.
            let aligned = base.next_multiple_of(PAGE) - base;
            if aligned + start + count * PAGE > self.memory.len() {
                return None;
            }
            self.used = start + count * PAGE;
            self.grown += count;
            NonNull::new(self.memory[aligned + start..].as_mut_ptr())
        }
    }

    fn allocator(pages: usize) -> Allocator<Buffer> {
        Allocator::new(Buffer { memory: vec![0; (pages + 1) * PAGE], used: 0, grown: 0 })
    }

    fn grown(allocator: &Allocator<Buffer>) -> usize {
        // SAFETY: no other call of the allocator runs.
        unsafe { allocator.classes() }.pages.grown
    }

    #[test]
    fn classes_cover_every_small_size_and_alignment() {
        for size in 1..=LARGEST {
            let class = class_of(size, 8).expect("a small size has a class");
            assert!(CLASSES[class] >= size && CLASSES[class].is_multiple_of(ALIGN));
            assert!(class == 0 || CLASSES[class - 1] < size, "{size} is in the smallest class that holds it");
        }
        assert_eq!(class_of(LARGEST + 1, 8), None);
        assert_eq!(class_of(16, 32), None);
    }

    #[test]
    fn blocks_are_aligned_distinct_and_reused_last_freed_first() {
        let a = allocator(4);
        let layout = Layout::from_size_align(40, 8).unwrap();
        // SAFETY: layouts of non-zero size; every block is freed with its own layout.
        unsafe {
            let blocks: Vec<*mut u8> = (0..100).map(|_| a.alloc(layout)).collect();
            for (i, &block) in blocks.iter().enumerate() {
                assert!((block as usize).is_multiple_of(ALIGN));
                ptr::write_bytes(block, i as u8, layout.size());
            }
            for (i, &block) in blocks.iter().enumerate() {
                assert!((0..layout.size()).all(|k| *block.add(k) == i as u8), "block {i} was not overwritten");
            }
            a.dealloc(blocks[7], layout);
            a.dealloc(blocks[3], layout);
            assert_eq!(a.alloc(layout), blocks[3]);
            assert_eq!(a.alloc(layout), blocks[7]);
        }
        assert_eq!(grown(&a), 1, "100 blocks of 48 bytes fit one page");
    }

    #[test]
    fn realloc_keeps_the_contents_within_and_across_classes() {
        let a = allocator(4);
        // SAFETY: as above; `realloc` is given each block's current layout.
        unsafe {
            let layout = Layout::from_size_align(20, 4).unwrap();
            let block = a.alloc(layout);
            ptr::copy_nonoverlapping(b"0123456789abcdefghij".as_ptr(), block, 20);
            // 20 and 30 bytes are both of the 32-byte class: the block stays.
            assert_eq!(a.realloc(block, layout, 30), block);
            let grown = a.realloc(block, Layout::from_size_align(30, 4).unwrap(), 1000);
            assert_ne!(grown, block);
            assert_eq!(std::slice::from_raw_parts(grown, 20), b"0123456789abcdefghij");
            // The old block is free again, first in line for its class.
            assert_eq!(a.alloc(layout), block);
            let shrunk = a.realloc(grown, Layout::from_size_align(1000, 4).unwrap(), 5);
            assert_eq!(std::slice::from_raw_parts(shrunk, 5), b"01234");
        }
    }

    #[test]
    fn large_blocks_go_to_the_system_allocator_and_back() {
        let a = allocator(1);
        let large = Layout::from_size_align(LARGEST + 1, 8).unwrap();
        // SAFETY: as above.
        unsafe {
            let block = a.alloc(large);
            assert!(!block.is_null());
            ptr::write_bytes(block, 7, large.size());
            let small = a.realloc(block, large, 100);
            assert!((0..100).all(|k| *small.add(k) == 7));
            a.dealloc(small, Layout::from_size_align(100, 8).unwrap());
        }
        assert_eq!(grown(&a), 1, "only the small block took pages");
    }

    #[test]
    fn a_memory_that_cannot_grow_is_an_allocation_failure() {
        let a = allocator(1);
        let layout = Layout::from_size_align(LARGEST, 8).unwrap();
        // SAFETY: as above.
        let blocks: Vec<*mut u8> = (0..PAGE / LARGEST + 1).map(|_| unsafe { a.alloc(layout) }).collect();
        assert!(blocks[..PAGE / LARGEST].iter().all(|b| !b.is_null()));
        assert!(blocks[PAGE / LARGEST].is_null(), "past the one page the buffer holds");
    }
}
