//! Long-lived allocations kept apart from short-lived ones ([`Segregating`]).
//!
//! A host at rest holding many suspended workflows keeps, for each, a few small
//! allocations that last as long as the workflow (its process cell, the service's record
//! of it), made among the far larger allocations of the instance that ran its first steps
//! and was freed when it was suspended. In one heap the survivors end up one or two to a
//! page, and a page holding any of them stays resident however much of it is free: the
//! sleepers' pages outweigh their live bytes several times over. So the allocations made
//! inside [`lasting`] come, when the program's global allocator is [`Segregating`], from a
//! pool of their own, packed by size class; everything else goes to the system allocator.
//!
//! The pool is one reserved range of address space, so a deallocation finds its allocator
//! by its address alone, wherever it is freed and whatever scope it is freed in. The range
//! is cut into [`CHUNK`]-byte chunks, each serving one size class; a chunk whose blocks are
//! all free again can serve any class next. Up to [`KEEP_EMPTY`] such chunks are kept
//! ready, so that a host starting and ending workflows at a high rate does not give pages
//! back and fault them in again for each; the others are given back to the kernel. Requests
//! larger than [`LARGEST`] or aligned beyond what a class gives, and any request once the
//! range is full or could not be reserved, go to the system allocator, so a scope never
//! changes whether an allocation succeeds.
//!
//! The pool takes a lock for each of its allocations and frees: it serves the few
//! allocations of a spawn, not a hot path.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A chunk of the pool: the unit handed to a size class and given back to the kernel.
pub(crate) const CHUNK: usize = 16 << 10;

/// Empty chunks kept, not given back to the kernel: their pages are reused at once.
pub(crate) const KEEP_EMPTY: u32 = 64;

/// The largest allocation the pool serves.
pub(crate) const LARGEST: usize = 2048;

/// The pool's size classes: every multiple of 16 up to 256, then multiples of 64 a
/// quarter apart. A class serves alignments up to its size's largest power-of-two factor.
const CLASSES: [u32; 28] = [
    16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
    1280, 1536, 1792, 2048,
];

/// No chunk: the end of a list.
const NONE: u32 = u32::MAX;

/// A chunk serving no class.
const UNASSIGNED: u16 = u16::MAX;

thread_local! {
    /// How many [`lasting`] scopes this thread is in.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` with the allocations it makes on this thread taken from the pool of long-lived
/// allocations, when the global allocator is [`Segregating`] (otherwise it only runs `f`).
/// For allocations that outlive most of what is allocated around them: a suspended
/// workflow's records. Scopes nest; a panic leaves the scope.
pub fn lasting<T>(f: impl FnOnce() -> T) -> T {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            DEPTH.with(|depth| depth.set(depth.get() - 1));
        }
    }
    DEPTH.with(|depth| depth.set(depth.get() + 1));
    let _leave = Leave;
    f()
}

/// Runs `f` outside any [`lasting`] scope this thread is in: for what a lasting scope
/// calls that allocates short-lived memory, such as a process's instance and its `init`.
pub fn transient<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEPTH.with(|depth| depth.set(self.0));
        }
    }
    let _restore = Restore(DEPTH.with(|depth| depth.replace(0)));
    f()
}

/// Whether this thread is in a [`lasting`] scope. A thread being torn down is in none.
fn in_lasting() -> bool {
    DEPTH.try_with(|depth| depth.get() > 0).unwrap_or(false)
}

/// A global allocator that serves allocations made in a [`lasting`] scope from a pool of
/// their own (see the module's docs), and the rest from the system allocator:
///
/// ```no_run
/// #[global_allocator]
/// static ALLOCATOR: wasmproc::heap::Segregating = wasmproc::heap::Segregating::new();
/// ```
pub struct Segregating {
    pool: Pool,
}

impl Segregating {
    /// The allocator, whose pool reserves its address space on its first lasting
    /// allocation.
    #[must_use]
    pub const fn new() -> Self {
        Self { pool: Pool::new(DEFAULT_RESERVE) }
    }
}

impl Default for Segregating {
    fn default() -> Self {
        Self::new()
    }
}

/// The address space the global pool reserves: room for millions of suspended
/// workflows' records, none of it committed until written.
const DEFAULT_RESERVE: usize = 16 << 30;

// SAFETY: every pointer handed out is either the system allocator's, for a layout the
// system allocator was given, or a pool block of at least the layout's size and alignment
// that no other live allocation overlaps (see `Pool`); each is freed by the allocator that
// made it, told apart by `Pool::owns`.
unsafe impl GlobalAlloc for Segregating {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if in_lasting()
            && let Some(block) = self.pool.alloc(layout)
        {
            return block;
        }
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if in_lasting()
            && let Some(block) = self.pool.alloc(layout)
        {
            // SAFETY: the block has room for `layout.size()` bytes.
            unsafe { ptr::write_bytes(block, 0, layout.size()) };
            return block;
        }
        // SAFETY: as the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if self.pool.owns(block) {
            // SAFETY: a live block of the pool, freed once (the caller's contract).
            unsafe { self.pool.free(block) };
        } else {
            // SAFETY: as the caller's contract: the system allocator made it.
            unsafe { System.dealloc(block, layout) }
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let pooled = self.pool.owns(block);
        if !pooled && !in_lasting() {
            // SAFETY: as the caller's contract.
            return unsafe { System.realloc(block, layout, new_size) };
        }
        // A pooled block keeps its place while its class still fits.
        if pooled && class_of(new_size, layout.align()).is_some_and(|class| Some(class) == self.pool.class_at(block)) {
            return block;
        }
        // SAFETY: `new_size` is non-zero and, rounded to the alignment, fits `isize` (the
        // caller's contract).
        let layout_new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // What a pooled block grows into stays lasting, wherever it grows.
        let moved = match self.pool.alloc(layout_new) {
            Some(moved) => moved,
            // SAFETY: as above.
            None => unsafe { System.alloc(layout_new) },
        };
        if !moved.is_null() {
            // SAFETY: both hold at least the smaller size and do not overlap.
            unsafe { ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size)) };
            // SAFETY: as the caller's contract; freed by the allocator that made it.
            unsafe { self.dealloc(block, layout) };
        }
        moved
    }
}

/// The index in [`CLASSES`] of the class that serves `size` bytes aligned to `align`.
fn class_of(size: usize, align: usize) -> Option<usize> {
    if size > LARGEST || align > LARGEST {
        return None;
    }
    let size = size.max(1);
    CLASSES.iter().position(|&class| class as usize >= size && (class as usize).is_multiple_of(align))
}

/// One chunk's bookkeeping, kept apart from the chunk so that its blocks start at the
/// chunk's start and take every alignment their size allows.
#[derive(Clone, Copy)]
#[repr(C)]
struct Header {
    /// The index in [`CLASSES`] served, or [`UNASSIGNED`].
    class: u16,
    /// Whether the chunk is in its class's list of chunks with room.
    listed: bool,
    /// Blocks handed out and not freed.
    live: u32,
    /// Blocks ever carved from the chunk, from its start.
    carved: u32,
    /// The first freed block, whose first word points to the next (null at the end).
    free: usize,
    /// The neighbours in the chunk's list ([`NONE`] at the ends).
    prev: u32,
    next: u32,
}

/// The pool's state, behind its lock.
struct State {
    /// The headers, one per chunk of the range (null until reserved).
    headers: *mut Header,
    /// The first chunk's address.
    chunks: usize,
    /// How many chunks the range holds.
    capacity: u32,
    /// Chunks ever used, from the range's start.
    used: u32,
    /// Chunks given back to the kernel, for any class (linked through `next`).
    spare: u32,
    /// Empty chunks kept with their pages, for any class (linked through `next`).
    kept: u32,
    /// How many chunks `kept` lists, at most [`KEEP_EMPTY`].
    kept_count: u32,
    /// Per class, the chunks with room.
    room: [u32; CLASSES.len()],
    /// Whether reserving the range failed, for good.
    failed: bool,
}

/// A pool of small blocks in one reserved range (see the module's docs).
pub(crate) struct Pool {
    /// The range's first and one-past-last chunk addresses, once reserved (0 and 0
    /// before): what `owns` reads without the lock. Written once, under the lock, before
    /// any block of the range exists.
    start: AtomicUsize,
    end: AtomicUsize,
    reserve: usize,
    locked: AtomicBool,
    state: std::cell::UnsafeCell<State>,
}

// SAFETY: `state` is only touched with `locked` held.
unsafe impl Sync for Pool {}

// SAFETY: the pointers in `state` point into the pool's own mapping, valid from any thread.
unsafe impl Send for Pool {}

impl Pool {
    /// A pool that reserves `reserve` bytes of address space on its first allocation.
    pub(crate) const fn new(reserve: usize) -> Self {
        Self {
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            reserve,
            locked: AtomicBool::new(false),
            state: std::cell::UnsafeCell::new(State {
                headers: null_mut(),
                chunks: 0,
                capacity: 0,
                used: 0,
                spare: NONE,
                kept: NONE,
                kept_count: 0,
                room: [NONE; CLASSES.len()],
                failed: false,
            }),
        }
    }

    /// Whether `block` is in this pool's range. A block freed from any thread was
    /// allocated after the range was recorded, and its hand-over to that thread orders
    /// the record before this read.
    pub(crate) fn owns(&self, block: *mut u8) -> bool {
        let address = block as usize;
        address >= self.start.load(Ordering::Relaxed) && address < self.end.load(Ordering::Relaxed)
    }

    /// A block for `layout`, or `None` when no class serves it or the range is full or
    /// could not be reserved.
    pub(crate) fn alloc(&self, layout: Layout) -> Option<*mut u8> {
        let class = class_of(layout.size(), layout.align())?;
        let size = CLASSES[class] as usize;
        let _guard = self.lock();
        // SAFETY: the lock is held.
        let state = unsafe { &mut *self.state.get() };
        if state.headers.is_null() && !self.reserve_range(state) {
            return None;
        }
        let index = match state.room[class] {
            NONE => {
                let index = Self::fresh_chunk(state)?;
                // SAFETY: `index` is below `capacity`.
                let header = unsafe { &mut *state.headers.add(index as usize) };
                *header =
                    Header { class: class as u16, listed: false, live: 0, carved: 0, free: 0, prev: NONE, next: NONE };
                Self::push(state, class, index);
                index
            }
            index => index,
        };
        // SAFETY: `index` is below `capacity`.
        let header = unsafe { &mut *state.headers.add(index as usize) };
        let base = state.chunks + index as usize * CHUNK;
        let block = if header.free != 0 {
            let block = header.free;
            // SAFETY: a freed block of this chunk, whose first word links the next.
            header.free = unsafe { ptr::read(block as *const usize) };
            block
        } else {
            let block = base + header.carved as usize * size;
            header.carved += 1;
            block
        };
        header.live += 1;
        if header.free == 0 && header.carved as usize == CHUNK / size {
            Self::unlink(state, index);
        }
        Some(block as *mut u8)
    }

    /// Frees a block of this pool.
    ///
    /// # Safety
    ///
    /// `block` was returned by [`Pool::alloc`] and not freed since.
    pub(crate) unsafe fn free(&self, block: *mut u8) {
        let guard = self.lock();
        // SAFETY: the lock is held.
        let state = unsafe { &mut *self.state.get() };
        let index = ((block as usize - state.chunks) / CHUNK) as u32;
        // SAFETY: a block of the range lies in one of its chunks.
        let header = unsafe { &mut *state.headers.add(index as usize) };
        let class = header.class as usize;
        // SAFETY: the block is the caller's to give back, at least a word long and aligned.
        unsafe { ptr::write(block.cast::<usize>(), header.free) };
        header.free = block as usize;
        header.live -= 1;
        if !header.listed {
            Self::push(state, class, index);
        }
        // SAFETY: as above; `push` may have moved nothing but links.
        let header = unsafe { &mut *state.headers.add(index as usize) };
        // An empty chunk leaves its class unless it is the class's only one with room,
        // which a class that frees and allocates in turn would otherwise give up and take
        // again each time.
        if header.live == 0 && (header.prev != NONE || header.next != NONE) {
            Self::unlink(state, index);
            let keep = state.kept_count < KEEP_EMPTY;
            // SAFETY: as above.
            let header = unsafe { &mut *state.headers.add(index as usize) };
            let next = if keep { state.kept } else { NONE };
            *header = Header { class: UNASSIGNED, listed: false, live: 0, carved: 0, free: 0, prev: NONE, next };
            if keep {
                state.kept = index;
                state.kept_count += 1;
                return;
            }
            // Given back outside the lock: the chunk is in no list meanwhile, so nothing
            // else touches it.
            let address = state.chunks + index as usize * CHUNK;
            drop(guard);
            // SAFETY: the chunk is in the range and holds no live block; its pages read
            // as zeros when next touched.
            unsafe { libc::madvise(address as *mut libc::c_void, CHUNK, libc::MADV_DONTNEED) };
            let _guard = self.lock();
            // SAFETY: the lock is held; the chunk is below `capacity`.
            unsafe {
                let state = &mut *self.state.get();
                (*state.headers.add(index as usize)).next = state.spare;
                state.spare = index;
            }
        }
    }

    /// The class of the chunk `block` lies in.
    fn class_at(&self, block: *mut u8) -> Option<usize> {
        let _guard = self.lock();
        // SAFETY: the lock is held.
        let state = unsafe { &*self.state.get() };
        let index = (block as usize - state.chunks) / CHUNK;
        // SAFETY: a block of the range lies in one of its chunks.
        let class = unsafe { (*state.headers.add(index)).class };
        (class != UNASSIGNED).then_some(class as usize)
    }

    /// Reserves the range, unless that failed before; whether the pool has one.
    fn reserve_range(&self, state: &mut State) -> bool {
        if state.failed {
            return false;
        }
        let chunks = self.reserve / CHUNK;
        let headers = (chunks * size_of::<Header>()).next_multiple_of(CHUNK);
        let length = headers + chunks * CHUNK;
        // SAFETY: a new private anonymous mapping; `MAP_NORESERVE` commits nothing until
        // touched.
        let mapped = unsafe {
            libc::mmap(
                null_mut(),
                length + CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        // Nothing is logged: logging allocates, and the lock is held.
        if mapped == libc::MAP_FAILED {
            state.failed = true;
            return false;
        }
        // Chunks aligned to their size, so that a block's alignment follows from its size.
        let first = (mapped as usize + headers).next_multiple_of(CHUNK);
        state.headers = mapped.cast();
        state.chunks = first;
        state.capacity = chunks as u32;
        self.start.store(first, Ordering::Relaxed);
        self.end.store(first + chunks * CHUNK, Ordering::Relaxed);
        true
    }

    /// A chunk serving no class: a kept one, a spare one, or one never used; `None` once
    /// the range is full.
    fn fresh_chunk(state: &mut State) -> Option<u32> {
        if state.kept != NONE {
            let index = state.kept;
            // SAFETY: kept chunks are below `capacity`.
            state.kept = unsafe { (*state.headers.add(index as usize)).next };
            state.kept_count -= 1;
            return Some(index);
        }
        if state.spare != NONE {
            let index = state.spare;
            // SAFETY: spare chunks are below `capacity`.
            state.spare = unsafe { (*state.headers.add(index as usize)).next };
            return Some(index);
        }
        (state.used < state.capacity).then(|| {
            state.used += 1;
            state.used - 1
        })
    }

    /// Puts chunk `index` at the head of `class`'s list of chunks with room.
    fn push(state: &mut State, class: usize, index: u32) {
        let head = state.room[class];
        // SAFETY: chunks in lists are below `capacity`.
        unsafe {
            let header = &mut *state.headers.add(index as usize);
            header.prev = NONE;
            header.next = head;
            header.listed = true;
            if head != NONE {
                (*state.headers.add(head as usize)).prev = index;
            }
        }
        state.room[class] = index;
    }

    /// Takes chunk `index` out of its class's list of chunks with room.
    fn unlink(state: &mut State, index: u32) {
        // SAFETY: chunks in lists are below `capacity`.
        unsafe {
            let Header { prev, next, class, .. } = *state.headers.add(index as usize);
            if prev == NONE {
                state.room[class as usize] = next;
            } else {
                (*state.headers.add(prev as usize)).next = next;
            }
            if next != NONE {
                (*state.headers.add(next as usize)).prev = prev;
            }
            let header = &mut *state.headers.add(index as usize);
            header.prev = NONE;
            header.next = NONE;
            header.listed = false;
        }
    }

    /// Takes the lock, spinning: waiting must not allocate, and the lock is held for a
    /// few instructions.
    fn lock(&self) -> Guard<'_> {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Guard(&self.locked)
    }

    /// What `look` reads of the state, under the lock, for tests.
    #[cfg(test)]
    fn inspect<T>(&self, look: impl FnOnce(&State) -> T) -> T {
        let _guard = self.lock();
        // SAFETY: the lock is held.
        look(unsafe { &*self.state.get() })
    }

    /// Chunks in use by a class, for tests.
    #[cfg(test)]
    fn chunks_in_use(&self) -> usize {
        self.inspect(|state| {
            (0..state.used as usize)
                // SAFETY: below `used`, so below `capacity`.
                .filter(|&index| unsafe { (*state.headers.add(index)).class } != UNASSIGNED)
                .count()
        })
    }
}

/// The pool's lock, released on drop.
struct Guard<'a>(&'a AtomicBool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn a_class_serves_its_size_and_alignment() {
        for size in 1..=LARGEST {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 256] {
                if let Some(class) = class_of(size, align) {
                    let served = CLASSES[class] as usize;
                    assert!(served >= size && served.is_multiple_of(align), "{size} aligned {align}: {served}");
                    assert!(
                        class == 0
                            || (CLASSES[class - 1] as usize) < size
                            || !(CLASSES[class - 1] as usize).is_multiple_of(align)
                    );
                } else {
                    assert!(align > 128, "{size} aligned {align} has no class");
                }
            }
        }
        assert_eq!(class_of(LARGEST + 1, 8), None);
    }

    /// Blocks are aligned, disjoint, and keep what was written in them while others come
    /// and go; a chunk emptied serves another class.
    #[test]
    fn blocks_are_disjoint_and_empty_chunks_serve_any_class() {
        let pool = Pool::new(64 << 20);
        let sizes = [24usize, 72, 200, 512, 1000, 2048];
        let mut live: Vec<(usize, *mut u8, u8)> = Vec::new();
        let mut classes = std::collections::HashSet::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if live.is_empty() || !seed.is_multiple_of(3) {
                let size = sizes[(seed >> 8) as usize % sizes.len()];
                let align = 1 << ((seed >> 16) % 7);
                classes.insert(class_of(size, align).unwrap());
                let block = pool.alloc(layout(size, align)).unwrap();
                assert!(pool.owns(block));
                assert!((block as usize).is_multiple_of(align));
                let mark = round as u8;
                // SAFETY: the block holds `size` bytes.
                unsafe { ptr::write_bytes(block, mark, size) };
                live.push((size, block, mark));
            } else {
                let (size, block, mark) = live.swap_remove((seed >> 24) as usize % live.len());
                // SAFETY: written above, still live.
                let bytes = unsafe { std::slice::from_raw_parts(block, size) };
                assert!(bytes.iter().all(|&b| b == mark), "a block kept what was written in it");
                // SAFETY: allocated by the pool, freed once.
                unsafe { pool.free(block) };
            }
        }
        let mut spans: Vec<(usize, usize)> = live.iter().map(|&(size, block, _)| (block as usize, size)).collect();
        spans.sort_unstable();
        assert!(spans.windows(2).all(|pair| pair[0].0 + pair[0].1 <= pair[1].0), "no two live blocks overlap");
        for (_, block, _) in live.drain(..) {
            // SAFETY: as above.
            unsafe { pool.free(block) };
        }
        assert!(pool.chunks_in_use() <= classes.len(), "each class keeps at most one empty chunk");
        // An emptied chunk, kept or given back, serves any class before a new one does.
        let used = pool.inspect(|state| state.used);
        for _ in 0..CHUNK / 64 {
            pool.alloc(layout(64, 8)).unwrap();
        }
        assert_eq!(used, pool.inspect(|state| state.used), "a spare chunk was taken before a new one");
    }

    /// Threads allocating at once, each freeing half of its blocks and handing the other
    /// half to the next thread to free: no block is given twice, and all come back.
    #[test]
    fn threads_allocate_and_free_each_others_blocks() {
        let pool = std::sync::Arc::new(Pool::new(64 << 20));
        let threads = 4;
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..threads).map(|_| std::sync::mpsc::channel::<Vec<usize>>()).unzip();
        let mut receivers = receivers.into_iter().map(Some).collect::<Vec<_>>();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let pool = pool.clone();
                let next = senders[(t + 1) % threads].clone();
                let mine = receivers[t].take().unwrap();
                std::thread::spawn(move || {
                    let mut kept = Vec::new();
                    for i in 0..5_000usize {
                        let size = 16 + (i * 37 + t * 11) % 500;
                        let block = pool.alloc(layout(size, 8)).unwrap();
                        // SAFETY: the block holds at least `size` bytes.
                        unsafe { ptr::write_bytes(block, t as u8, size) };
                        if i % 2 == 0 {
                            kept.push(block as usize);
                        } else {
                            // SAFETY: allocated above, freed once.
                            unsafe { pool.free(block) };
                        }
                    }
                    next.send(kept).unwrap();
                    let theirs = mine.recv().unwrap();
                    let unique: std::collections::HashSet<_> = theirs.iter().collect();
                    assert_eq!(unique.len(), theirs.len(), "no block given twice");
                    for block in theirs {
                        // SAFETY: allocated by another thread, handed over, freed once.
                        unsafe { pool.free(block as *mut u8) };
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        let classes =
            (16..=516).step_by(1).filter_map(|size| class_of(size, 8)).collect::<std::collections::HashSet<_>>();
        assert!(pool.chunks_in_use() <= classes.len(), "every block came back");
    }

    /// Emptied chunks are kept up to [`KEEP_EMPTY`], and the rest given back; a kept chunk
    /// serves the next class that needs one before a given-back or a new one.
    #[test]
    fn empty_chunks_are_kept_up_to_a_bound_and_the_rest_given_back() {
        let pool = Pool::new(64 << 20);
        let per_chunk = CHUNK / 64;
        let chunks = KEEP_EMPTY as usize + 10;
        let blocks: Vec<_> = (0..chunks * per_chunk).map(|_| pool.alloc(layout(64, 8)).unwrap()).collect();
        assert_eq!(pool.chunks_in_use(), chunks);
        for block in blocks {
            // SAFETY: allocated above, freed once.
            unsafe { pool.free(block) };
        }
        let (kept, spare, used) = pool.inspect(|state| {
            let mut spare = 0;
            let mut index = state.spare;
            while index != NONE {
                spare += 1;
                // SAFETY: spare chunks are below `capacity`.
                index = unsafe { (*state.headers.add(index as usize)).next };
            }
            (state.kept_count as usize, spare, state.used)
        });
        assert_eq!(pool.chunks_in_use(), 1, "the class keeps one chunk with room");
        assert_eq!(kept, KEEP_EMPTY as usize);
        assert_eq!(spare, chunks - 1 - KEEP_EMPTY as usize, "the others were given back");
        let block = pool.alloc(layout(1024, 8)).unwrap();
        assert_eq!(pool.inspect(|state| state.kept_count as usize), kept - 1, "another class took a kept chunk");
        // SAFETY: the block holds 1024 bytes; a kept chunk's old contents are overwritten.
        unsafe { ptr::write_bytes(block, 7, 1024) };
        assert_eq!(used, pool.inspect(|state| state.used), "no new chunk was used");
    }

    #[test]
    fn a_full_range_refuses_and_leaves_the_rest_to_the_system() {
        let pool = Pool::new(2 * CHUNK);
        let taken: Vec<_> = (0..2 * CHUNK / LARGEST).map(|_| pool.alloc(layout(LARGEST, 8)).unwrap()).collect();
        assert_eq!(pool.alloc(layout(LARGEST, 8)), None, "full");
        assert_eq!(pool.alloc(layout(16, 8)), None, "no chunk for another class");
        // SAFETY: allocated by the pool, freed once.
        unsafe { pool.free(taken[0]) };
        assert!(pool.alloc(layout(LARGEST, 8)).is_some(), "room again");
        let boxed = Box::into_raw(Box::new(0u64));
        assert!(!pool.owns(boxed.cast()), "a system block is not the pool's");
        // SAFETY: made by `Box::into_raw` above.
        drop(unsafe { Box::from_raw(boxed) });
    }

    #[test]
    fn scopes_nest_and_survive_a_panic() {
        assert!(!in_lasting());
        lasting(|| {
            assert!(in_lasting());
            lasting(|| assert!(in_lasting()));
            assert!(in_lasting());
        });
        assert!(std::panic::catch_unwind(|| lasting(|| panic!("inside"))).is_err());
        assert!(!in_lasting());
        lasting(|| {
            transient(|| {
                assert!(!in_lasting());
                lasting(|| assert!(in_lasting()));
                assert!(!in_lasting());
            });
            assert!(in_lasting());
            assert!(std::panic::catch_unwind(|| transient(|| panic!("inside"))).is_err());
            assert!(in_lasting());
        });
    }
}
