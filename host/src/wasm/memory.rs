//! [`MemoryArena`]: every process's linear memory, carved out of one memory mapping.
//!
//! Why: the kernel caps the memory mappings of a process (`vm.max_map_count`, 65,530 by
//! default). wasmtime's pooling allocator splits each memory slot into a read-write part,
//! an inaccessible part and, with copy-on-write images, a file-backed part: about 4
//! mappings a live instance, so a default kernel stops near 16k live processes. The arena
//! is one anonymous read-write mapping that nothing ever `mprotect`s or remaps piecewise,
//! so the kernel keeps it as one mapping whatever the number of live memories.
//!
//! # Layout
//!
//! `slots` slots of `slot_size` bytes (the runtime's `max_memory`, rounded up to whole
//! host pages), back to back; slot `i` starts at `base + i × slot_size`. The mapping is
//! `MAP_NORESERVE` (nothing is committed until touched) and, on Linux, `MADV_NOHUGEPAGE`
//! (a guest that touches one byte must not be given a 2 MiB page where transparent huge
//! pages are on for every mapping).
//!
//! A memory is one slot for its whole life: it never moves, and it grows in place up to
//! the slot's end. Nothing here enforces a process's cap: the store's limiter refuses
//! growth past it first and names the limit (`store.rs`); the slot's end is a backstop.
//!
//! # The zero invariant
//!
//! Every byte of a slot that is handed out is zero, as Wasm requires of a new memory and
//! of the pages a `memory.grow` adds. The argument:
//!
//! 1. A slot never used is fresh anonymous memory, which reads as zero.
//! 2. While a memory lives, only bytes below its current size can be written: compiled
//!    code checks every access against the current size (there is no guard region to
//!    lean on, and the engine leaves wasmtime's reservation tunable at 0 so that no
//!    check is made against the slot's end instead; see `engine.rs`), and the host writes
//!    guest memory only through wasmtime's bounds-checked views.
//! 3. A memory's size never shrinks, so when it is dropped its size covers every byte
//!    that was written.
//! 4. On drop, in the first `keep_resident` bytes of that range every page that has a
//!    page-table entry is zeroed with `memset` (one without reads as zero already; see
//!    `Arena::zero_touched`), and the rest of the range is given back with
//!    `MADV_DONTNEED`, after which private anonymous pages read as zero on Linux
//!    (elsewhere, and if `madvise` fails, it is zeroed with `memset` too). Only then does
//!    the slot go back on the free list.
//!
//! # What a freed slot keeps
//!
//! A warm slot keeps the pages its last process touched in its first `keep_resident`
//! bytes (the engine's `KEEP_RESIDENT`, 256 KiB) resident, zeroed, so that the next
//! process in it does not fault them in again: `madvise` and the faults after it
//! interrupt every other core for a TLB flush (see `KEEP_RESIDENT` for what that cost
//! where it was measured). At most `warm_slots` free slots are warm (the engine's
//! `WARM_SLOTS`); past that a freed slot is cold, all its pages given back, so that a
//! burst of processes ending does not leave all their memory resident. Warm slots are
//! reused first, last-in first-out, so the slots that churn stay warm; a warm slot that
//! no process took for a second goes cold ([`FreeSlots::take_idle`], which the engine's
//! epoch thread runs every [`COOL_EVERY`]), so that a host at rest after a burst holds
//! none of its memory.
//!
//! # Images
//!
//! A memory made for a component with a large initial image (`image.rs`) gets the image
//! laid over its slot when it is made: mapped private from the image's sealed `memfd`
//! (`MAP_FIXED` over the image's range of the slot), so its pages are shared with every
//! other instance until written, and only written pages cost memory. Each such mapping
//! splits the arena's one mapping in up to three, so at most `max_images` memories have
//! one at a time (an eighth of `vm.max_map_count`, see [`max_images`]); past that bound,
//! or if the `mmap` fails, the image is copied into the slot instead, as a small one
//! always is. The zero invariant holds: the image's range reads as the image, the rest
//! of the slot as zero; when the memory is dropped the range is mapped anonymous again
//! (with the arena's flags, so the kernel merges it back into one mapping), reading as
//! zero, and the rest of the slot is zeroed as any other's. A range that cannot be mapped
//! back loses its slot for good rather than hand it out with an image in it.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustix::mm::{MapFlags, ProtFlags};
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

use super::image::{self, GuestImage};

/// The [`MemoryCreator`] the engine uses for every linear memory: hands out the slots of
/// one [`Arena`].
pub(crate) struct MemoryArena {
    arena: Arc<Arena>,
}

struct Arena {
    mapping: Mapping,
    /// Bytes of a freed slot zeroed in place and left resident; a multiple of the host
    /// page size.
    keep_resident: usize,
    /// How many free slots may keep `keep_resident` bytes resident; past it a freed slot
    /// gives all its pages back.
    warm_slots: usize,
    page_size: usize,
    /// `/proc/self/pagemap`, to find which pages of a freed slot were touched, and the
    /// process it was opened in.
    pagemap: Option<(std::fs::File, u32)>,
    free: Mutex<FreeSlots>,
    /// How many memories may have a copy-on-write image mapped at once (see "Images"
    /// in the module's docs); past it an image is copied.
    max_images: usize,
    /// Memories with an image mapped now. Counted before the `mmap`, so never past
    /// `max_images`.
    images: AtomicUsize,
    /// Whether the fallback to copying was logged (once a runtime).
    told_full: AtomicBool,
}

/// The slots of an arena not in use (of this one, all zero; of the fiber stacks', any
/// contents): warm ones first, then cold ones, then fresh ones.
pub(crate) struct FreeSlots {
    /// Given back with some pages still resident. The last one pushed is handed out
    /// first, so the few slots that churn stay warm and the others cool.
    pub(crate) warm: Vec<u32>,
    /// The fewest warm slots since the last [`FreeSlots::take_idle`]: the warm slots below
    /// it in `warm` (the oldest) were not handed out since.
    low: usize,
    /// Given back with all their pages returned to the kernel. Preferred to fresh slots:
    /// their page tables are already there.
    pub(crate) cold: Vec<u32>,
    /// The lowest slot never handed out; `fresh..slots` are all untouched.
    pub(crate) fresh: u32,
}

impl FreeSlots {
    pub(crate) const fn new() -> FreeSlots {
        FreeSlots { warm: Vec::new(), low: 0, cold: Vec::new(), fresh: 0 }
    }

    /// A free slot, the most recently freed first; `None` past `slots`.
    pub(crate) fn take(&mut self, slots: u32) -> Option<u32> {
        if let Some(slot) = self.warm.pop() {
            self.low = self.low.min(self.warm.len());
            return Some(slot);
        }
        if let Some(slot) = self.cold.pop() {
            return Some(slot);
        }
        (self.fresh < slots).then(|| {
            self.fresh += 1;
            self.fresh - 1
        })
    }

    /// Takes out the warm slots no one was handed since the last call, for the caller to
    /// give their pages back and put them on `cold`: a burst's slots do not stay resident
    /// for ever once the burst is over, and the slots that churn stay warm.
    pub(crate) fn take_idle(&mut self) -> Vec<u32> {
        let idle: Vec<u32> = self.warm.drain(..self.low.min(self.warm.len())).collect();
        self.low = self.warm.len();
        idle
    }
}

/// Gives back, with `give_back`, the warm slots of `free` that no one was handed since
/// the last call ([`FreeSlots::take_idle`]) and puts them on `cold`; how many. They are
/// off the free list while `give_back` runs, outside its lock, so nothing takes one
/// meanwhile.
pub(crate) fn cool(free: &Mutex<FreeSlots>, mut give_back: impl FnMut(u32)) -> usize {
    let idle = free.lock().take_idle();
    idle.iter().copied().for_each(&mut give_back);
    let cooled = idle.len();
    free.lock().cold.extend(idle);
    cooled
}

/// How often the warm slots of the arenas that no process took are given back
/// ([`FreeSlots::take_idle`]; the engine's epoch thread does it): a slot kept warm for a
/// second that nothing wanted is memory a quiet host holds for nothing.
pub(crate) const COOL_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One anonymous read-write mapping of `slots` slots of `slot_size` bytes, back to back:
/// slot `i` starts at `base + i × slot_size`. `MAP_NORESERVE` (nothing is committed until
/// touched) and, on Linux, `MADV_NOHUGEPAGE` (a slot that touches one byte must not be
/// given a 2 MiB page where transparent huge pages are on for every mapping). Nothing
/// ever `mprotect`s or remaps it piecewise, so the kernel keeps it as one mapping.
/// Unmapped on drop.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    pub(crate) slot_size: usize,
    pub(crate) slots: u32,
}

// SAFETY: `base` is the address of a mapping the owner of the `Mapping` owns, not a
// reference to shared Rust data. Its users (the two arenas) hand each slot to one owner
// at a time through a free list under a mutex, so sharing the mapping between threads
// shares no slot.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`; nothing of the mapping itself is mutated through `&Mapping`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Reserves `slots` slots of at least `slot_size` bytes each (rounded up to whole host
    /// pages), for `what` (named in errors).
    ///
    /// # Errors
    ///
    /// No slot, slots too large for the address space, or the reservation refused (for
    /// example by a `ulimit -v`, or strict overcommit, `vm.overcommit_memory = 2`).
    pub(crate) fn new(slots: u32, slot_size: usize, what: &str) -> anyhow::Result<Mapping> {
        anyhow::ensure!(slots > 0, "the {what} arena needs at least one slot");
        let page_size = rustix::param::page_size();
        let slot_size = slot_size
            .checked_next_multiple_of(page_size)
            .filter(|&size| size > 0)
            .ok_or_else(|| anyhow::anyhow!("a slot of {slot_size} bytes for {what} does not fit the address space"))?;
        let len = slot_size.checked_mul(slots as usize).ok_or_else(|| {
            anyhow::anyhow!("{slots} slots of {slot_size} bytes for {what} do not fit the address space")
        })?;
        // SAFETY: a null address lets the kernel place a new anonymous mapping where
        // nothing else is, so no existing memory is replaced.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| {
            // Under strict overcommit the kernel ignores `MAP_NORESERVE` and counts the
            // whole reservation as committed memory.
            let strict = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|mode| mode.trim() == "2");
            let hint =
                if strict { " (`vm.overcommit_memory` is 2: the kernel counts all of it as committed)" } else { "" };
            anyhow::Error::from(std::io::Error::from(e))
                .context(format!("failed to reserve {len} bytes of address space for {slots} slots of {what}{hint}"))
        })?;
        let base = NonNull::new(base.cast::<u8>()).expect("a successful `mmap` does not return null");
        // Failure only costs memory when huge pages are on for every mapping; carry on.
        #[cfg(target_os = "linux")]
        // SAFETY: the range is exactly the mapping just made, which nothing else uses yet.
        let _ = unsafe { rustix::mm::madvise(base.as_ptr().cast(), len, rustix::mm::Advice::LinuxNoHugepage) };
        Ok(Mapping { base, slot_size, slots })
    }

    fn len(&self) -> usize {
        self.slot_size * self.slots as usize
    }

    pub(crate) fn slot_ptr(&self, slot: u32) -> *mut u8 {
        debug_assert!(slot < self.slots, "slot {slot} out of {}", self.slots);
        // SAFETY: `slot < slots`, so the offset stays inside the mapping (`new` checked
        // that its length fits a `usize`).
        unsafe { self.base.as_ptr().add(slot as usize * self.slot_size) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping's owner outlives every user of its slots (each holds the
        // arena alive), so nothing points into the mapping any more.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast::<c_void>(), self.len()) };
    }
}

impl MemoryArena {
    /// Reserves `slots` slots of at least `slot_size` bytes each (rounded up to whole host
    /// pages). A freed slot keeps `keep_resident` bytes (rounded down to whole pages)
    /// resident as long as no more than `warm_slots` free slots do.
    ///
    /// # Errors
    ///
    /// No slot, slots too large for the address space, or the reservation refused (for
    /// example by a `ulimit -v`, or strict overcommit, `vm.overcommit_memory = 2`).
    pub(crate) fn new(
        slots: u32,
        slot_size: usize,
        keep_resident: usize,
        warm_slots: usize,
        max_images: usize,
    ) -> anyhow::Result<MemoryArena> {
        let mapping = Mapping::new(slots, slot_size, "linear memories")?;
        let page_size = rustix::param::page_size();
        let slot_size = mapping.slot_size;
        let arena = Arena {
            mapping,
            keep_resident: keep_resident.min(slot_size) / page_size * page_size,
            warm_slots,
            page_size,
            // Without it (not Linux, no `/proc`) every kept byte is zeroed.
            pagemap: cfg!(target_os = "linux")
                .then(|| std::fs::File::open("/proc/self/pagemap").ok())
                .flatten()
                .map(|file| (file, std::process::id())),
            free: Mutex::new(FreeSlots::new()),
            max_images,
            images: AtomicUsize::new(0),
            told_full: AtomicBool::new(false),
        };
        Ok(MemoryArena { arena: Arc::new(arena) })
    }

    /// What the engine's epoch thread calls every [`COOL_EVERY`] (see
    /// [`FreeSlots::take_idle`]): how many slots went cold. It holds the arena only
    /// weakly, so it does nothing once the engine is gone.
    pub(crate) fn cooler(&self) -> impl Fn() -> usize + Send + 'static {
        let arena = Arc::downgrade(&self.arena);
        move || arena.upgrade().map_or(0, |arena| arena.cool())
    }

    /// Memories with a copy-on-write image mapped now.
    #[cfg(test)]
    pub(crate) fn mapped_images(&self) -> usize {
        self.arena.images.load(Ordering::Relaxed)
    }
}

/// How many copy-on-write images the arena of a process may keep mapped at once: an
/// eighth of `vm.max_map_count` (65,530 by default, so 8,191), each splitting the arena's
/// one mapping in up to three (two more mappings), so that images take at most a quarter
/// of the limit and leave the rest to the host (threads, libraries, compiled code).
pub(crate) fn max_images() -> usize {
    let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|text| text.trim().parse::<usize>().ok())
        .unwrap_or(65_530);
    limit / 8
}

impl Arena {
    fn slot_size(&self) -> usize {
        self.mapping.slot_size
    }

    fn slot_ptr(&self, slot: u32) -> *mut u8 {
        self.mapping.slot_ptr(slot)
    }

    /// A free slot, all zero (see the module's invariant); the most recently freed first.
    fn take(&self) -> Option<u32> {
        self.free.lock().take(self.mapping.slots)
    }

    /// Gives back every page of the warm slots no memory took since the last call,
    /// making them cold; how many.
    fn cool(&self) -> usize {
        cool(&self.free, |slot| {
            // SAFETY: a free slot, off the free list while it is given back, so nothing
            // uses it; its kept bytes are zero, and read as zero once given back. If
            // `madvise` fails they stay resident and zero: cold in all but the memory
            // they hold.
            let _ = unsafe { dont_need(self.slot_ptr(slot), self.keep_resident) };
        })
    }

    /// Lays `image` over `slot`, just taken and all zero: mapped private (pages shared
    /// with the image until written) while fewer than `max_images` memories have one,
    /// else copied. Whether it was mapped; `Err` if the slot could not be made whole again
    /// after a failed `mmap` (the slot is then never handed out again).
    fn lay(&self, slot: u32, image: &GuestImage) -> Result<bool, String> {
        let range = image.range();
        // SAFETY: the image lies inside the slot (`new_memory` checked it against the
        // memory's minimum, at most the slot's size).
        let start = unsafe { self.slot_ptr(slot).add(range.start) };
        let counted = self
            .images
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < self.max_images).then_some(n + 1))
            .is_ok();
        if counted {
            // SAFETY: the range is inside this slot, which belongs to the memory being
            // made; nothing else points into it.
            let mapped = unsafe {
                rustix::mm::mmap(
                    start.cast(),
                    range.len(),
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE | MapFlags::FIXED,
                    image.file(),
                    range.start as u64,
                )
            };
            match mapped {
                Ok(_) => return Ok(true),
                Err(error) => {
                    self.images.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!(%error, "mapping a copy-on-write memory image failed; copying it instead");
                    // A failed `MAP_FIXED` may have unmapped the range already.
                    // SAFETY: as above.
                    if !unsafe { anonymous(start, range.len()) } {
                        return Err(format!(
                            "failed to map a memory image ({error}) and to restore the memory slot after it"
                        ));
                    }
                }
            }
        } else if !self.told_full.swap(true, Ordering::Relaxed) {
            tracing::info!(
                max = self.max_images,
                "as many copy-on-write memory images are mapped as `vm.max_map_count` allows them; further \
                 instances copy their image"
            );
        }
        // SAFETY: the image's range is inside the slot, which belongs to the memory.
        unsafe { image.copy_to(self.slot_ptr(slot)) };
        Ok(false)
    }

    /// Gives back `slot` of a memory that had `range` mapped from an image: the range
    /// becomes part of the arena's anonymous mapping again (which the kernel merges back
    /// into one), then the slot is zeroed as any other.
    fn give_back_image(&self, slot: u32, range: std::ops::Range<usize>, used: usize) {
        // SAFETY: the range is inside the slot, whose memory was dropped.
        let restored = unsafe { anonymous(self.slot_ptr(slot).add(range.start), range.len()) };
        if !restored {
            // The image's pages stay mapped and counted: the slot is lost, never reused
            // with another process's data in it.
            tracing::error!(slot, "failed to unmap a memory image from its slot; the slot is not reused");
            return;
        }
        self.images.fetch_sub(1, Ordering::Relaxed);
        self.give_back(slot, used);
    }

    /// Zeroes the first `used` bytes of `slot` (all a memory of that size can have
    /// written) and puts it back on the free list: warm (its first `keep_resident` bytes
    /// zeroed in place, the rest given back to the kernel) while fewer than `warm_slots`
    /// are, else cold (all given back).
    fn give_back(&self, slot: u32, used: usize) {
        // Accepted race: releasers that check at once may all see room and push warm, so
        // the bound can be passed by the number of threads releasing at that moment.
        let warm = self.free.lock().warm.len() < self.warm_slots;
        let start = self.slot_ptr(slot);
        let used = used.min(self.slot_size()).next_multiple_of(self.page_size).min(self.slot_size());
        let kept = if warm { used.min(self.keep_resident) } else { 0 };
        // SAFETY: `[start, start + used)` lies inside this slot, whose memory was dropped:
        // nothing else reads or writes the slot until it is handed out again, below.
        unsafe {
            self.zero_touched(start, kept);
            if used > kept {
                let rest = start.add(kept);
                if !dont_need(rest, used - kept) {
                    rest.write_bytes(0, used - kept);
                }
            }
        }
        let mut free = self.free.lock();
        if warm { free.warm.push(slot) } else { free.cold.push(slot) }
    }

    /// Zeroes the pages of `[start, start + len)` that may hold something other than
    /// zeros, with `memset`, leaving them resident; pages never touched are skipped, so
    /// zeroing does not fault them in. `/proc/self/pagemap` tells them apart: a page whose
    /// entry is neither present (bit 63) nor swapped (bit 62, set for every non-present
    /// entry that is not empty, migration entries included) has no page-table entry at
    /// all, and a private anonymous page without one reads as zero. The check is sound
    /// for a freed slot: nothing touches it, so an empty entry stays empty until the
    /// slot is handed out again (a present page may be swapped out meanwhile, but it is
    /// zeroed whatever its state, `memset` swapping it back in).
    ///
    /// Why not `mincore`: it reports a swapped-out page as not resident, which would
    /// leave it holding the last tenant's data. Why not zero every page: for a guest that
    /// touches 3 pages of its 128 KiB this is 8 times less `memset`, and a warm slot keeps
    /// no more resident than its last process touched. On the lifecycle benchmark (six
    /// alternating runs of each on a noisy 2-core VM) it gave a median of 190k
    /// lifecycles/s against 160k/s for zeroing every kept byte (1.14 against 1.18 times
    /// raw wasmtime's time).
    ///
    /// # Safety
    ///
    /// `[start, start + len)` is page-aligned, inside a freed slot, and not in use.
    unsafe fn zero_touched(&self, start: *mut u8, len: usize) {
        /// Pages looked up with one `pread`: 256 KiB of 4 KiB pages.
        const CHUNK: usize = 64;
        const PRESENT_OR_SWAPPED: u64 = 0b11 << 62;
        let page = self.page_size;
        // After a `fork` the file still describes the parent's pages.
        let Some(pagemap) = self.pagemap.as_ref().filter(|(_, pid)| *pid == std::process::id()).map(|(file, _)| file)
        else {
            // SAFETY: the caller's contract.
            return unsafe { start.write_bytes(0, len) };
        };
        let mut entries = [0u8; CHUNK * 8];
        let mut done = 0;
        while done < len {
            let chunk = (len - done).min(CHUNK * page);
            let pages = chunk / page;
            let first_page = (start as usize + done) / page;
            let buffer = &mut entries[..pages * 8];
            let read = std::os::unix::fs::FileExt::read_exact_at(pagemap, buffer, first_page as u64 * 8);
            let touched = |i: usize| {
                read.is_err() || {
                    let entry = u64::from_le_bytes(buffer[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                    entry & PRESENT_OR_SWAPPED != 0
                }
            };
            let mut i = 0;
            while i < pages {
                if !touched(i) {
                    i += 1;
                    continue;
                }
                let run = i;
                while i < pages && touched(i) {
                    i += 1;
                }
                // SAFETY: pages `run..i` of this chunk lie inside the caller's range.
                unsafe { start.add(done + run * page).write_bytes(0, (i - run) * page) };
            }
            done += chunk;
        }
    }
}

/// Replaces `[start, start + len)` with fresh anonymous memory, flagged as the arena's
/// mapping is (`MAP_NORESERVE`, `MADV_NOHUGEPAGE`) so that the kernel merges it with its
/// neighbours into one mapping again. Whether it was done.
///
/// # Safety
///
/// `[start, start + len)` is page-aligned, inside the arena, and not in use.
unsafe fn anonymous(start: *mut u8, len: usize) -> bool {
    // SAFETY: the caller's contract; `MAP_FIXED` replaces only that range.
    let mapped = unsafe {
        rustix::mm::mmap_anonymous(
            start.cast(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
        )
    };
    #[cfg(target_os = "linux")]
    if mapped.is_ok() {
        // SAFETY: the range just mapped. Failing only leaves it a mapping of its own.
        let _ = unsafe { rustix::mm::madvise(start.cast(), len, rustix::mm::Advice::LinuxNoHugepage) };
    }
    mapped.is_ok()
}

/// Gives `len` bytes at `start` back to the kernel so that they read as zero again;
/// `false` if that could not be done (then the caller zeroes them itself).
///
/// # Safety
///
/// `[start, start + len)` is page-aligned, inside the arena, and not in use.
pub(crate) unsafe fn dont_need(start: *mut u8, len: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the caller's contract. On Linux, private anonymous pages read as zero
        // after `MADV_DONTNEED`; POSIX does not promise this, hence the `memset` elsewhere.
        unsafe { rustix::mm::madvise(start.cast::<c_void>(), len, rustix::mm::Advice::LinuxDontNeed).is_ok() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (start, len);
        false
    }
}

// SAFETY: every memory it returns satisfies `LinearMemory`'s contract (see `SlotMemory`),
// is zero-filled (the module's invariant), and reserves at least the
// `reserved_size_in_bytes` asked for and exactly the `guard_size_in_bytes` of 0 that
// `new_memory` accepts.
unsafe impl MemoryCreator for MemoryArena {
    fn new_memory(
        &self,
        ty: MemoryType,
        minimum: usize,
        _maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let arena = &self.arena;
        // Compiled code elides bounds checks that a guard region would catch; the arena
        // has none, so it must not be asked for one.
        if guard_size_in_bytes != 0 {
            return Err(format!("the memory arena has no guard region, but {guard_size_in_bytes} bytes were asked"));
        }
        if ty.is_shared() {
            return Err("the memory arena does not provide shared memories".to_owned());
        }
        if let Some(reserved) = reserved_size_in_bytes.filter(|&reserved| reserved > arena.slot_size()) {
            return Err(format!(
                "a memory reservation of {reserved} bytes was asked, above the arena's slots of {} bytes",
                arena.slot_size()
            ));
        }
        if minimum > arena.slot_size() {
            return Err(format!(
                "the memory's minimum size of {minimum} bytes is above the arena's slots of {} bytes",
                arena.slot_size()
            ));
        }
        let image = image::take_pending();
        if let Some(image) = image.as_ref().filter(|image| image.range().end > minimum) {
            return Err(format!(
                "the memory's initial image ends at byte {}, past its minimum size of {minimum} bytes",
                image.range().end
            ));
        }
        let slot = arena.take().ok_or_else(|| {
            format!(
                "`max_instances` reached: all {} linear-memory slots (`max_instances` × `max_memories`) are in use \
                 by live instances",
                arena.mapping.slots
            )
        })?;
        let mapped = match &image {
            Some(image) => arena.lay(slot, image)?.then(|| image.range()),
            None => None,
        };
        MADE.set(arena.slot_ptr(slot) as usize);
        Ok(Box::new(SlotMemory { arena: arena.clone(), slot, size: minimum, mapped }))
    }
}

thread_local! {
    /// The address of the last memory made on this thread (0: none since the last
    /// [`take_made`]).
    static MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The address of the last memory made on this thread since the last call, if any: a
/// process reads its instance's memory through it (`hibernate.rs`).
pub(crate) fn take_made() -> Option<usize> {
    Some(MADE.replace(0)).filter(|&made| made != 0)
}

/// One linear memory: a slot of the arena, and how much of it the memory has grown to.
struct SlotMemory {
    arena: Arc<Arena>,
    slot: u32,
    size: usize,
    /// The bytes of the slot a copy-on-write image is mapped over, if one is.
    mapped: Option<std::ops::Range<usize>>,
}

// SAFETY: the base pointer is the slot's start and never changes; growth up to the
// capacity (the slot's size) only records the new size, so the base never moves; the
// bytes below `byte_size` are readable and writable (the whole slot is, and it belongs
// to this memory alone until dropped); and bytes past the old size are zero when grown
// into (the module's invariant).
unsafe impl LinearMemory for SlotMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.arena.slot_size()
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        // The store's limiter has already refused growth past the process's cap, with a
        // message naming it; this only guards the slot.
        if new_size > self.arena.slot_size() {
            wasmtime::bail!(
                "memory of {new_size} bytes does not fit a memory slot of {} bytes",
                self.arena.slot_size()
            );
        }
        // wasmtime only ever grows a memory; `max` keeps the size a bound on every byte
        // written (the zero invariant, step 3) even if it asked for less.
        self.size = self.size.max(new_size);
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.arena.slot_ptr(self.slot)
    }
}

impl Drop for SlotMemory {
    fn drop(&mut self) {
        match self.mapped.take() {
            Some(range) => self.arena.give_back_image(self.slot, range, self.size),
            None => self.arena.give_back(self.slot, self.size),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const PAGE: usize = 64 * 1024;

    fn memory(arena: &MemoryArena, pages: u32) -> Result<Box<dyn LinearMemory>, String> {
        let minimum = pages as usize * PAGE;
        arena.new_memory(MemoryType::new(pages, None), minimum, None, Some(0), 0)
    }

    /// Bytes `[offset, offset + len)` of `memory`.
    fn bytes(memory: &dyn LinearMemory, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= memory.byte_size());
        // SAFETY: inside the memory's current size, which it owns.
        unsafe { std::slice::from_raw_parts(memory.as_ptr().add(offset), len).to_vec() }
    }

    fn fill(memory: &dyn LinearMemory, offset: usize, len: usize, byte: u8) {
        assert!(offset + len <= memory.byte_size());
        // SAFETY: inside the memory's current size, which it owns.
        unsafe { memory.as_ptr().add(offset).write_bytes(byte, len) };
    }

    /// Whether the page holding `addr` is resident, from `/proc/self/pagemap` (bit 63 of
    /// the page's entry; readable without privileges).
    #[cfg(target_os = "linux")]
    pub(crate) fn resident(addr: *const u8) -> bool {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let page = addr as u64 / rustix::param::page_size() as u64;
        let mut file = std::fs::File::open("/proc/self/pagemap").expect("/proc/self/pagemap is readable");
        file.seek(SeekFrom::Start(page * 8)).expect("the entry exists");
        let mut entry = [0; 8];
        file.read_exact(&mut entry).expect("the entry exists");
        u64::from_le_bytes(entry) >> 63 == 1
    }

    #[test]
    fn a_reused_slot_is_zero_after_a_guest_like_write_pattern() {
        let arena = MemoryArena::new(1, 16 * PAGE, 2 * PAGE, 8, 8).unwrap();
        let mut first = memory(&arena, 2).unwrap();
        let base = first.as_ptr();
        // What a guest does: data near the start, its stack at the top of the initial
        // memory, then a `memory.grow` and heap writes in the new pages, both below and
        // past `keep_resident`.
        fill(&*first, 1024, 4096, 0xd1);
        fill(&*first, 2 * PAGE - 8192, 8192, 0x5c);
        first.grow_to(10 * PAGE).unwrap();
        fill(&*first, 2 * PAGE, PAGE, 0xaa);
        fill(&*first, 10 * PAGE - 100, 100, 0xee);
        drop(first);

        let mut second = memory(&arena, 1).unwrap();
        assert_eq!(second.as_ptr(), base, "the one slot is reused");
        assert!(bytes(&*second, 0, PAGE).iter().all(|&b| b == 0));
        // Growing back over what the first tenant wrote finds zeros too.
        second.grow_to(16 * PAGE).unwrap();
        assert!(bytes(&*second, 0, 16 * PAGE).iter().all(|&b| b == 0));
    }

    #[test]
    fn the_last_freed_slot_is_reused_first() {
        let arena = MemoryArena::new(3, PAGE, 0, 8, 8).unwrap();
        let a = memory(&arena, 1).unwrap();
        let b = memory(&arena, 1).unwrap();
        let b_base = b.as_ptr();
        drop(b);
        drop(a);
        let a_base = memory(&arena, 1).unwrap().as_ptr();
        assert_ne!(a_base, b_base);
        let c = memory(&arena, 1).unwrap();
        let d = memory(&arena, 1).unwrap();
        assert_eq!(c.as_ptr(), a_base, "after `a`'s slot was reused and freed again");
        assert_eq!(d.as_ptr(), b_base);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_freed_slot_keeps_only_keep_resident_bytes_resident() {
        let keep = 2 * PAGE;
        let arena = MemoryArena::new(1, 8 * PAGE, keep, 8, 8).unwrap();
        let memory = memory(&arena, 4).unwrap();
        let base = memory.as_ptr();
        fill(&*memory, 0, 4 * PAGE, 0xff);
        drop(memory);
        let page = rustix::param::page_size();
        // SAFETY (both): inside the one slot of the arena, which is alive.
        let (last_kept, first_given_back) = unsafe { (base.add(keep - page), base.add(keep)) };
        assert!(resident(base) && resident(last_kept), "the first `keep_resident` bytes stay resident");
        assert!(!resident(first_given_back), "the rest is given back to the kernel");
        let again = self::memory(&arena, 4).unwrap();
        assert!(bytes(&*again, 0, 4 * PAGE).iter().all(|&b| b == 0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn zeroing_a_freed_slot_faults_in_no_page_the_process_did_not_touch() {
        let arena = MemoryArena::new(1, 4 * PAGE, 4 * PAGE, 8, 8).unwrap();
        let memory = memory(&arena, 4).unwrap();
        let base = memory.as_ptr();
        fill(&*memory, 100, 10, 7);
        fill(&*memory, 3 * PAGE + 5, 10, 9);
        drop(memory);
        // SAFETY (all): inside the one slot of the arena, which is alive.
        let (touched, untouched, last) = unsafe { (base.add(3 * PAGE + 5), base.add(PAGE), base.add(4 * PAGE - 1)) };
        assert!(resident(base) && resident(touched), "touched pages are zeroed in place");
        assert!(!resident(untouched) && !resident(last), "the others are left alone");
        let again = self::memory(&arena, 4).unwrap();
        assert!(bytes(&*again, 0, 4 * PAGE).iter().all(|&b| b == 0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn past_warm_slots_a_freed_slot_gives_all_its_pages_back() {
        let arena = MemoryArena::new(3, 4 * PAGE, 4 * PAGE, 1, 8).unwrap();
        let (first, second) = (memory(&arena, 2).unwrap(), memory(&arena, 2).unwrap());
        let (warm, cold) = (first.as_ptr(), second.as_ptr());
        fill(&*first, 0, 2 * PAGE, 1);
        fill(&*second, 0, 2 * PAGE, 2);
        drop(first);
        drop(second);
        assert!(resident(warm), "the first slot freed stays warm");
        assert!(!resident(cold), "the second is past `warm_slots`: cold");
        let (again, later) = (memory(&arena, 2).unwrap(), memory(&arena, 2).unwrap());
        assert_eq!((again.as_ptr(), later.as_ptr()), (warm, cold), "warm slots are handed out first");
        assert!(bytes(&*again, 0, 2 * PAGE).iter().chain(&bytes(&*later, 0, 2 * PAGE)).all(|&b| b == 0));
    }

    /// A warm slot that no memory took between two coolings gives its pages back and
    /// goes cold; one taken meanwhile stays warm, and is handed out first.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_warm_slot_no_memory_took_since_the_last_cooling_goes_cold() {
        let arena = MemoryArena::new(3, 4 * PAGE, 4 * PAGE, 8, 8).unwrap();
        let cool = arena.cooler();
        let (first, second) = (memory(&arena, 2).unwrap(), memory(&arena, 2).unwrap());
        let (idle, churned) = (first.as_ptr(), second.as_ptr());
        fill(&*first, 0, 2 * PAGE, 1);
        fill(&*second, 0, 2 * PAGE, 2);
        drop(first);
        drop(second);
        assert!(resident(idle) && resident(churned), "both are warm");
        // The first cooling has none before it to compare with: it only notes what is warm.
        cool();
        assert!(resident(idle) && resident(churned), "a cooling takes only slots idle since the last one");
        let again = memory(&arena, 2).unwrap();
        assert_eq!(again.as_ptr(), churned, "the last freed is handed out first");
        fill(&*again, 0, PAGE, 3);
        drop(again);
        cool();
        assert!(!resident(idle), "the slot no memory took went cold");
        assert!(resident(churned), "the slot taken since stays warm");
        let (warm, cold) = (memory(&arena, 2).unwrap(), memory(&arena, 2).unwrap());
        assert_eq!((warm.as_ptr(), cold.as_ptr()), (churned, idle), "warm slots are handed out before cold ones");
        assert!(bytes(&*warm, 0, 2 * PAGE).iter().chain(&bytes(&*cold, 0, 2 * PAGE)).all(|&b| b == 0));
    }

    #[test]
    fn out_of_slots_names_max_instances_and_a_freed_slot_is_taken_again() {
        let arena = MemoryArena::new(2, PAGE, 0, 8, 8).unwrap();
        let a = memory(&arena, 1).unwrap();
        let _b = memory(&arena, 1).unwrap();
        let error = memory(&arena, 1).err().expect("both slots are taken");
        assert!(error.contains("`max_instances` reached") && error.contains("all 2"), "{error}");
        drop(a);
        memory(&arena, 1).expect("the freed slot is handed out again");
    }

    #[test]
    fn growth_stays_in_place_up_to_the_slot_and_no_further() {
        let arena = MemoryArena::new(2, 4 * PAGE, 0, 8, 8).unwrap();
        let mut memory = memory(&arena, 1).unwrap();
        let base = memory.as_ptr();
        assert_eq!((memory.byte_size(), memory.byte_capacity()), (PAGE, 4 * PAGE));
        memory.grow_to(4 * PAGE).unwrap();
        assert_eq!((memory.byte_size(), memory.as_ptr()), (4 * PAGE, base));
        fill(&*memory, 3 * PAGE, PAGE, 1);
        let error = memory.grow_to(5 * PAGE).unwrap_err().to_string();
        assert!(error.contains("does not fit a memory slot of 262144 bytes"), "{error}");
        assert_eq!(memory.byte_size(), 4 * PAGE);
    }

    #[test]
    fn refuses_what_it_cannot_give() {
        let arena = MemoryArena::new(1, PAGE, 0, 8, 8).unwrap();
        let guarded = arena.new_memory(MemoryType::new(1, None), PAGE, None, Some(0), PAGE);
        assert!(guarded.err().unwrap().contains("no guard region"));
        let reserved = arena.new_memory(MemoryType::new(1, None), PAGE, None, Some(2 * PAGE), 0);
        assert!(reserved.err().unwrap().contains("reservation of 131072 bytes"));
        let large = arena.new_memory(MemoryType::new(2, None), 2 * PAGE, None, Some(0), 0);
        assert!(large.err().unwrap().contains("minimum size of 131072 bytes"));
    }

    /// The memory mappings of this process that overlap `arena`'s, from `/proc/self/maps`.
    #[cfg(target_os = "linux")]
    fn arena_mappings(arena: &MemoryArena) -> usize {
        let (start, end) = (arena.arena.mapping.base.as_ptr() as usize, arena.arena.slot_ptr(0) as usize);
        let end = end + arena.arena.mapping.len();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|line| {
                let (range, _) = line.split_once(' ')?;
                let (from, to) = range.split_once('-')?;
                Some((usize::from_str_radix(from, 16).ok()?, usize::from_str_radix(to, 16).ok()?))
            })
            .filter(|&(from, to)| from < end && to > start)
            .count()
    }

    /// More memories with an image than `max_images`: the first ones get it mapped, the
    /// others copied, all read it and write their own pages alone; the arena's mappings
    /// stay within two a mapped image, and are one again once they are all dropped; a
    /// slot that had an image is zero for the next memory.
    #[cfg(target_os = "linux")]
    #[test]
    fn images_past_max_images_are_copied_and_the_arena_is_one_mapping_again() {
        let big = vec![7u8; image::MIN_IMAGE_BYTES];
        let wasm = image::tests::component(32, &[(65536, big), (100, b"abc".to_vec())]);
        let (_, guest_image) = image::split_with_image(&wasm).expect("a large image");
        let image_end = guest_image.range().end;
        const MAX: usize = 3;
        let arena = MemoryArena::new(8, 64 * PAGE, 2 * PAGE, 8, MAX).unwrap();
        assert_eq!(arena_mappings(&arena), 1);
        let memories: Vec<_> = (0..6)
            .map(|_| {
                image::instantiating(Some(&guest_image), || Ok(memory(&arena, 32).unwrap())).expect("the image is laid")
            })
            .collect();
        assert_eq!(arena.mapped_images(), MAX);
        assert!(arena_mappings(&arena) <= 1 + 2 * MAX, "{} mappings", arena_mappings(&arena));
        for (i, memory) in memories.iter().enumerate() {
            assert_eq!(bytes(&**memory, 100, 4), b"abc\0", "memory {i}");
            assert!(bytes(&**memory, 65536, image::MIN_IMAGE_BYTES).iter().all(|&b| b == 7), "memory {i}");
            assert!(bytes(&**memory, 0, 100).iter().chain(&bytes(&**memory, image_end, PAGE)).all(|&b| b == 0));
        }
        fill(&*memories[0], 65536, 10, 1);
        fill(&*memories[5], 70000, 10, 2);
        assert!(memories[1..].iter().all(|m| bytes(&**m, 65536, 10) == [7; 10]), "a write is its memory's alone");
        assert_eq!(bytes(&*memories[0], 70000, 10), [7; 10]);
        drop(memories);
        assert_eq!(arena.mapped_images(), 0);
        assert_eq!(arena_mappings(&arena), 1, "the arena is one mapping again");
        for _ in 0..8 {
            let again = memory(&arena, 32).unwrap();
            assert!(bytes(&*again, 0, 32 * PAGE).iter().all(|&b| b == 0), "a slot that had an image is zero");
            std::mem::forget(again);
        }
    }

    /// A memory too small for the image it is given is refused, not made without it.
    #[test]
    fn an_image_past_the_minimum_is_refused() {
        let wasm = image::tests::component(32, &[(65536, vec![7u8; image::MIN_IMAGE_BYTES])]);
        let (_, guest_image) = image::split_with_image(&wasm).expect("a large image");
        let arena = MemoryArena::new(1, 64 * PAGE, 0, 8, 8).unwrap();
        let error =
            image::instantiating(Some(&guest_image), || memory(&arena, 1).map_err(|e| wasmtime::format_err!("{e}")))
                .err()
                .expect("refused");
        assert!(error.to_string().contains("past its minimum size of 65536 bytes"), "{error}");
        let made = image::instantiating(Some(&guest_image), || Ok(())).unwrap_err();
        assert!(made.to_string().contains("made no memory"), "{made}");
    }

    #[test]
    fn sizes_that_overflow_the_address_space_are_refused() {
        let error = MemoryArena::new(u32::MAX, usize::MAX / 2, 0, 8, 8).err().unwrap().to_string();
        assert!(error.contains("do not fit the address space"), "{error}");
        assert!(MemoryArena::new(0, PAGE, 0, 8, 8).is_err());
    }
}
