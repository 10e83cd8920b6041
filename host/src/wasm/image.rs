//! Copy-on-write initial memory images: a component whose initial memory is megabytes of
//! data (CPython in a componentize-py guest, SpiderMonkey in a componentize-js one) starts
//! each instance from one shared image instead of copying it.
//!
//! wasmtime lays its own copy-on-write images only over memories it mapped itself:
//! `memory_init_cow` with a custom [`MemoryCreator`](wasmtime::MemoryCreator), as the
//! memory arena is (`memory.rs`), panics, since a `LinearMemory` can only give it a raw
//! pointer. So the host does it itself, in two halves:
//!
//! - at load, [`split`] takes the component's image out of it: the one core module that
//!   defines a memory keeps its active data segments, each emptied (offset kept, no
//!   bytes), and their bytes go to a sealed `memfd`, [`GuestImage`]. wasmtime compiles the
//!   emptied component, so instantiating it copies nothing;
//! - at instantiation, [`instantiating`] hands the image to the arena through this
//!   thread (a `MemoryCreator` is told nothing of the module it makes a memory for), and
//!   the arena maps it over the new memory's slot, private: pages are shared with the
//!   image until written. The arena bounds how many such mappings are live (each splits its
//!   one mapping in up to three) and copies the image past that bound (`memory.rs`).
//!
//! Only a component of one defined memory, in a core module instantiated once, whose
//! active segments all have constant offsets inside the memory's initial size and carry
//! at least [`MIN_IMAGE_BYTES`] is split: the image then belongs to the one memory its
//! instantiation makes, and laying it before the module's segments would have been
//! applied is invisible (nothing runs in between, and later modules' segments, applied
//! after, still land on top). Anything else is compiled as it is and copied as before.

use std::cell::Cell;
use std::ops::Range;
use std::sync::Arc;

use wasmparser::{ComponentAlias, ComponentExternalKind, ComponentOuterAliasKind, ComponentTypeRef, Parser, Payload};

/// Bytes of data segments below which a component's image is copied into each instance,
/// as before: a Rust guest's few KiB copy in microseconds, and a mapping (two more of the
/// process's `vm.max_map_count` while the instance lives, a `mmap` at its start and its
/// end) is the scarcer resource. Copying 1 MiB into fresh pages costs about what a
/// spawn of a small guest does several times over; past it the copy dominates a spawn.
pub(crate) const MIN_IMAGE_BYTES: usize = 1 << 20;

/// A component with its image taken out, by [`split`].
pub(crate) struct Split {
    /// The component, its image's segments emptied.
    pub(crate) stripped: Vec<u8>,
    /// The segments, in the order Wasm applies them: (offset in the memory, byte range in
    /// the original component).
    segments: Vec<(usize, Range<usize>)>,
    /// Bytes in all segments.
    pub(crate) data_bytes: usize,
}

/// A top-level core module of a component, as [`split`] reads it.
struct ModuleInfo {
    range: Range<usize>,
    imported_memories: usize,
    /// Initial sizes in bytes of the memories it defines, `None` for one it cannot split
    /// (64-bit, shared, custom page size).
    memories: Vec<Option<usize>>,
}

/// `bytes` (a component) with its image taken out, if it is one [`split`] handles (see
/// the module's docs) and its image has at least [`MIN_IMAGE_BYTES`]; `None` otherwise,
/// including for bytes it cannot read (wasmtime reports what is wrong with them).
pub(crate) fn split(bytes: &[u8]) -> Option<Split> {
    let mut modules: Vec<ModuleInfo> = Vec::new();
    let mut instantiated: Vec<u32> = Vec::new();
    // Frames of what is being read: `true` for a top-level core module.
    let mut frames: Vec<bool> = Vec::new();
    let mut nested_memories = false;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.ok()?;
        let top = frames.len() == 1;
        let in_top_module = frames.len() == 2 && frames[1];
        match payload {
            Payload::Version { .. } => {
                if frames.is_empty() {
                    frames.push(false);
                }
                continue;
            }
            Payload::ModuleSection { unchecked_range, .. } => {
                if top {
                    modules.push(ModuleInfo { range: unchecked_range, imported_memories: 0, memories: Vec::new() });
                }
                frames.push(top);
                continue;
            }
            Payload::ComponentSection { .. } => {
                frames.push(false);
                continue;
            }
            Payload::End(_) => {
                frames.pop();
                continue;
            }
            Payload::ImportSection(reader) if in_top_module => {
                for import in reader.into_imports() {
                    if matches!(import.ok()?.ty, wasmparser::TypeRef::Memory(_)) {
                        modules.last_mut()?.imported_memories += 1;
                    }
                }
            }
            Payload::MemorySection(reader) => {
                if !in_top_module {
                    nested_memories = true;
                    continue;
                }
                for memory in reader {
                    let memory = memory.ok()?;
                    let plain = !memory.memory64 && !memory.shared && memory.page_size_log2.is_none_or(|log| log == 16);
                    let initial = usize::try_from(memory.initial).ok().and_then(|pages| pages.checked_mul(65536));
                    modules.last_mut()?.memories.push(initial.filter(|_| plain));
                }
            }
            Payload::InstanceSection(reader) if top => {
                for instance in reader {
                    if let wasmparser::Instance::Instantiate { module_index, .. } = instance.ok()? {
                        instantiated.push(module_index);
                    }
                }
            }
            // The core module index space must be the top-level module sections alone
            // for `instantiated` to count the right module.
            Payload::ComponentAliasSection(reader) if top => {
                for alias in reader {
                    match alias.ok()? {
                        ComponentAlias::Outer { kind: ComponentOuterAliasKind::CoreModule, .. }
                        | ComponentAlias::InstanceExport { kind: ComponentExternalKind::Module, .. } => return None,
                        _ => {}
                    }
                }
            }
            Payload::ComponentImportSection(reader) if top => {
                for import in reader {
                    if matches!(import.ok()?.ty, ComponentTypeRef::Module(_)) {
                        return None;
                    }
                }
            }
            _ => {}
        }
        if frames.is_empty() {
            break;
        }
    }
    if nested_memories {
        return None;
    }
    let mut defining = modules.iter().enumerate().filter(|(_, module)| !module.memories.is_empty());
    let (index, module) = defining.next()?;
    if defining.next().is_some() || module.memories.len() != 1 || module.imported_memories != 0 {
        return None;
    }
    let initial = module.memories[0]?;
    if instantiated.iter().filter(|&&i| i as usize == index).count() != 1 {
        return None;
    }
    let (module_bytes, segments) = strip_module(bytes, module.range.clone(), initial)?;
    let data_bytes = segments.iter().map(|(_, range)| range.len()).sum();
    if data_bytes < MIN_IMAGE_BYTES {
        return None;
    }
    let stripped = replace_module(bytes, index, &module_bytes)?;
    Some(Split { stripped, segments, data_bytes })
}

/// [`split`], with the image written out ([`GuestImage::new`]); `None` where `split`
/// gives none, or where the image cannot be written (logged: the component is then
/// compiled whole and its image copied, as for a small one).
pub(crate) fn split_with_image(bytes: &[u8]) -> Option<(Split, Arc<GuestImage>)> {
    let split = split(bytes)?;
    match GuestImage::new(bytes, &split) {
        Ok(image) => {
            tracing::debug!(bytes = split.data_bytes, "the component's memory image is mapped copy-on-write");
            Some((split, Arc::new(image)))
        }
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), "the component's memory image is copied into each instance");
            None
        }
    }
}

/// Reads an unsigned LEB128 `u32` at `*at`.
pub(crate) fn read_u32(bytes: &[u8], at: &mut usize) -> Option<u32> {
    let mut result: u64 = 0;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        result |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return u32::try_from(result).ok();
        }
    }
    None
}

/// Reads a signed LEB128 `i32` at `*at`.
fn read_i32(bytes: &[u8], at: &mut usize) -> Option<i32> {
    let mut result: i64 = 0;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*at)?;
        *at += 1;
        result |= i64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            if shift < 64 && byte & 0x40 != 0 {
                result |= -1 << shift;
            }
            return i32::try_from(result).ok();
        }
        if shift >= 35 {
            return None;
        }
    }
}

pub(crate) fn write_u32(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The sections of a module or component body starting at `at`: (id, content range).
pub(crate) fn sections(bytes: &[u8], mut at: usize, end: usize) -> Option<Vec<(u8, Range<usize>)>> {
    let mut found = Vec::new();
    while at < end {
        let id = *bytes.get(at)?;
        at += 1;
        let size = read_u32(bytes, &mut at)? as usize;
        let content = at..at.checked_add(size).filter(|&e| e <= end)?;
        at = content.end;
        found.push((id, content));
    }
    Some(found)
}

/// The module at `range` of `bytes` with its active segments emptied, and those
/// segments; `None` if a segment is not an `i32.const` offset into memory 0 inside
/// `initial` bytes.
#[expect(clippy::type_complexity, reason = "a module and its segments, named by the caller")]
fn strip_module(bytes: &[u8], range: Range<usize>, initial: usize) -> Option<(Vec<u8>, Vec<(usize, Range<usize>)>)> {
    let header = range.start.checked_add(8)?;
    let mut out = bytes.get(range.start..header)?.to_vec();
    let mut segments = Vec::new();
    for (id, content) in sections(bytes, header, range.end)? {
        if id != 11 {
            out.push(id);
            write_u32(&mut out, u32::try_from(content.len()).ok()?);
            out.extend_from_slice(&bytes[content]);
            continue;
        }
        let mut at = content.start;
        let count = read_u32(bytes, &mut at)?;
        let mut data = Vec::new();
        write_u32(&mut data, count);
        for _ in 0..count {
            let entry = at;
            let flags = read_u32(bytes, &mut at)?;
            let memory = match flags {
                0 => 0,
                2 => read_u32(bytes, &mut at)?,
                1 => {
                    let len = read_u32(bytes, &mut at)? as usize;
                    at = at.checked_add(len).filter(|&e| e <= content.end)?;
                    data.extend_from_slice(&bytes[entry..at]);
                    continue;
                }
                _ => return None,
            };
            if memory != 0 || *bytes.get(at)? != 0x41 {
                return None;
            }
            at += 1;
            let offset = usize::try_from(read_i32(bytes, &mut at)? as u32).ok()?;
            if *bytes.get(at)? != 0x0b {
                return None;
            }
            at += 1;
            data.extend_from_slice(&bytes[entry..at]);
            data.push(0);
            let len = read_u32(bytes, &mut at)? as usize;
            let body = at..at.checked_add(len).filter(|&e| e <= content.end)?;
            at = body.end;
            if offset.checked_add(len)? > initial {
                return None;
            }
            segments.push((offset, body));
        }
        if at != content.end {
            return None;
        }
        out.push(11);
        write_u32(&mut out, u32::try_from(data.len()).ok()?);
        out.extend_from_slice(&data);
    }
    Some((out, segments))
}

/// `component` with its `index`th top-level core module replaced by `module`.
fn replace_module(component: &[u8], index: usize, module: &[u8]) -> Option<Vec<u8>> {
    let mut out = component.get(..8)?.to_vec();
    let mut modules = 0;
    for (id, content) in sections(component, 8, component.len())? {
        out.push(id);
        if id == 1 {
            modules += 1;
            if modules - 1 == index {
                write_u32(&mut out, u32::try_from(module.len()).ok()?);
                out.extend_from_slice(module);
                continue;
            }
        }
        write_u32(&mut out, u32::try_from(content.len()).ok()?);
        out.extend_from_slice(&component[content]);
    }
    Some(out)
}

/// The initial memory image of a split component, in a sealed `memfd`: the bytes of its
/// data segments at their offsets in the memory (file offset = memory offset), holes
/// elsewhere. Mapped private over a new memory (by the arena, `memory.rs`), or copied
/// from [`GuestImage::view`] when the arena's bound on mappings is reached.
pub(crate) struct GuestImage {
    file: std::os::fd::OwnedFd,
    /// The bytes of the memory it covers, host-page-aligned.
    range: Range<usize>,
    /// The file's `range`, mapped shared and read-only: what a copy reads.
    view: std::ptr::NonNull<u8>,
    /// Where the data is, sorted and merged: what a copy writes.
    extents: Vec<Range<usize>>,
}

// SAFETY: `view` is a read-only mapping this value owns; nothing writes through it, and
// the file behind it is sealed against writes.
unsafe impl Send for GuestImage {}
// SAFETY: as for `Send`.
unsafe impl Sync for GuestImage {}

impl GuestImage {
    /// Writes the segments `split` took out of `original` (the bytes it was given) into a
    /// new sealed `memfd`.
    ///
    /// # Errors
    ///
    /// The file cannot be made, written, sealed or mapped (the caller compiles the
    /// component unsplit instead).
    pub(crate) fn new(original: &[u8], split: &Split) -> anyhow::Result<GuestImage> {
        use anyhow::Context as _;
        use rustix::fs::{MemfdFlags, SealFlags};
        let page = rustix::param::page_size();
        let start = split.segments.iter().map(|(offset, _)| *offset).min().unwrap_or(0) / page * page;
        let end =
            split.segments.iter().map(|(offset, body)| offset + body.len()).max().unwrap_or(0).next_multiple_of(page);
        anyhow::ensure!(end > start, "the image is empty");
        let file = rustix::fs::memfd_create("wasmproc-image", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .context("failed to create a memfd for a memory image")?;
        rustix::fs::ftruncate(&file, end as u64).context("failed to size a memory image")?;
        for (offset, body) in &split.segments {
            let mut written = 0;
            while written < body.len() {
                let n = rustix::io::pwrite(&file, &original[body.start + written..body.end], (offset + written) as u64)
                    .context("failed to write a memory image")?;
                anyhow::ensure!(n > 0, "a memory image's write wrote nothing");
                written += n;
            }
        }
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL)
            .context("failed to seal a memory image")?;
        // SAFETY: a null address lets the kernel place the new mapping where nothing is.
        let view = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                end - start,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                &file,
                start as u64,
            )
        }
        .context("failed to map a memory image")?;
        let view = std::ptr::NonNull::new(view.cast::<u8>()).expect("a successful `mmap` does not return null");
        let mut extents: Vec<Range<usize>> = split
            .segments
            .iter()
            .map(|(offset, body)| *offset..offset + body.len())
            .filter(|r| !r.is_empty())
            .collect();
        extents.sort_by_key(|range| range.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(extents.len());
        for range in extents {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        Ok(GuestImage { file, range: start..end, view, extents: merged })
    }

    /// The bytes of the memory the image covers, host-page-aligned.
    pub(crate) fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The file to map, at file offset [`GuestImage::range`]'s start.
    pub(crate) fn file(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.file.as_fd()
    }

    /// Copies the image's data into the memory at `base`, leaving the holes alone.
    ///
    /// # Safety
    ///
    /// `[base + range.start, base + range.end)` is writable and belongs to the caller.
    pub(crate) unsafe fn copy_to(&self, base: *mut u8) {
        for extent in &self.extents {
            // SAFETY: `extent` lies inside `range`, which the view maps and the caller's
            // memory holds.
            unsafe {
                let from = self.view.as_ptr().add(extent.start - self.range.start);
                std::ptr::copy_nonoverlapping(from, base.add(extent.start), extent.len());
            }
        }
    }
}

impl Drop for GuestImage {
    fn drop(&mut self) {
        // SAFETY: the view is this value's alone; copies from it are done (they hold it).
        let _ = unsafe { rustix::mm::munmap(self.view.as_ptr().cast(), self.range.len()) };
    }
}

impl std::fmt::Debug for GuestImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestImage").field("range", &self.range).field("extents", &self.extents.len()).finish()
    }
}

thread_local! {
    /// The image of the memory that the instantiation under way on this thread makes.
    static PENDING: Cell<Option<Arc<GuestImage>>> = const { Cell::new(None) };
}

/// Runs `instantiate` (an instantiation of a component `split` made, when `image` is
/// given) with `image` waiting for the memory it makes. An instantiation that succeeds
/// without taking it fails: its memory would lack its data.
pub(crate) fn instantiating<T>(
    image: Option<&Arc<GuestImage>>,
    instantiate: impl FnOnce() -> wasmtime::Result<T>,
) -> wasmtime::Result<T> {
    let Some(image) = image else { return instantiate() };
    PENDING.set(Some(image.clone()));
    let result = instantiate();
    let left = PENDING.take();
    match result {
        Ok(_) if left.is_some() => Err(wasmtime::format_err!(
            "the instantiation made no memory for the component's initial image of {} bytes",
            image.range.len()
        )),
        result => result,
    }
}

/// The image [`instantiating`] left for the next memory made on this thread, taken.
pub(crate) fn take_pending() -> Option<Arc<GuestImage>> {
    PENDING.take()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A component of one core module defining one memory of `pages` pages with
    /// `segments` (offset, bytes) as active segments, instantiated once; it exports
    /// `load(at) -> byte` and `store(at)` (writes 9 there).
    pub(crate) fn component(pages: u32, segments: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let data: String = segments
            .iter()
            .map(|(offset, bytes)| {
                let escaped: String = bytes.iter().map(|b| format!("\\{b:02x}")).collect();
                format!("(data (i32.const {offset}) \"{escaped}\")")
            })
            .collect();
        let wat = format!(
            "(component
               (core module $m (memory (export \"memory\") {pages}) {data}
                 (func (export \"load\") (param i32) (result i32) (i32.load8_u (local.get 0)))
                 (func (export \"store\") (param i32) (i32.store8 (local.get 0) (i32.const 9))))
               (core instance $i (instantiate $m))
               (func (export \"load\") (param \"at\" u32) (result u32) (canon lift (core func $i \"load\")))
               (func (export \"store\") (param \"at\" u32) (canon lift (core func $i \"store\"))))"
        );
        wat::parse_str(wat).unwrap()
    }

    #[test]
    fn a_large_image_is_taken_out_and_a_small_one_left() {
        let big = vec![7u8; MIN_IMAGE_BYTES];
        let bytes = component(32, &[(65536, big.clone()), (100, b"abc".to_vec())]);
        let taken = split(&bytes).expect("an image of MIN_IMAGE_BYTES is split");
        assert_eq!(taken.data_bytes, MIN_IMAGE_BYTES + 3);
        assert!(taken.stripped.len() + MIN_IMAGE_BYTES <= bytes.len(), "the segments' bytes are gone");
        let image = GuestImage::new(&bytes, &taken).unwrap();
        assert_eq!(image.range(), 0..65536 + MIN_IMAGE_BYTES);
        let mut memory = vec![0u8; 32 * 65536];
        // SAFETY: the vector holds the image's range.
        unsafe { image.copy_to(memory.as_mut_ptr()) };
        assert_eq!(&memory[100..103], b"abc");
        assert!(memory[65536..65536 + MIN_IMAGE_BYTES].iter().all(|&b| b == 7));
        assert!(memory[103..65536].iter().all(|&b| b == 0));

        assert!(split(&component(32, &[(0, vec![1; MIN_IMAGE_BYTES - 1])])).is_none(), "below the threshold");
    }

    #[test]
    fn what_it_cannot_place_is_left_alone() {
        let big = vec![1u8; MIN_IMAGE_BYTES];
        // Past the initial size: instantiating it must trap as it would have.
        assert!(split(&component(16, &[(65536, big.clone())])).is_none());
        let offset_from_a_global = format!(
            "(component (core module $m (global $g i32 (i32.const 0)) (memory 32)
               (data (global.get $g) \"{}\")) (core instance (instantiate $m)))",
            "\\01".repeat(MIN_IMAGE_BYTES)
        );
        assert!(split(&wat::parse_str(offset_from_a_global).unwrap()).is_none());
        let twice = format!(
            "(component (core module $m (memory 32) (data (i32.const 0) \"{}\"))
               (core instance (instantiate $m)) (core instance (instantiate $m)))",
            "\\01".repeat(MIN_IMAGE_BYTES)
        );
        assert!(split(&wat::parse_str(twice).unwrap()).is_none(), "instantiated twice: two memories");
        assert!(split(b"not wasm").is_none());
    }
}
