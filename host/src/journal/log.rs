//! [`LogStore`]: the journal as an append-only log in a directory of its own.
//!
//! The journal's access pattern is narrow: groups of small records appended, every record
//! of a finished process removed at once, everything read back once at start. A log does
//! that with one write and one `fdatasync` a commit, and keeps what is live in memory: an
//! index built by reading every frame at open, which [`Store::scan`] serves.
//!
//! # On disk
//!
//! The directory holds `log.lock` (held with `flock` while a host uses the log) and
//! segments, `<number>.log` (16 hex digits), read in number order. All integers are
//! little-endian; checksums are CRC-32 (`crc32fast`).
//!
//! A segment starts with a 32-byte header: the magic `wpj-log\n`, the format version
//! ([`LOG_VERSION`], `u32`), the kind (`u32`: 1 a log, 2 a snapshot), the segment's number
//! (`u64`, which must match its name), 4 bytes of zeros and the checksum of the 28 before.
//! Then frames, one a commit:
//!
//! - a 16-byte header: the magic `WPJF`, the body's length (`u32`), the body's checksum,
//!   and the checksum of the 12 bytes before it (so that a damaged length is never
//!   trusted, and a frame can be recognised when searching past a damaged one);
//! - the body: the number of removals (`u32`), each (process `u64`, count `u64`); the
//!   number of puts (`u32`), each (process `u64`, seq `u64`, length `u32`, the value).
//!
//! A batch is applied as [`MemoryStore`](super::MemoryStore) applies it: removals, then
//! puts. After the last frame the file holds zeros: the segment being written is extended
//! in steps of [`PREALLOCATE`] zeros written ahead, since `fdatasync` after a write that
//! changes the file's size (or fills a hole, or an unwritten extent of `fallocate`) also
//! commits the filesystem's metadata, and one that overwrites written blocks does not.
//!
//! # Opening
//!
//! 1. The lock is taken, or the open fails (`ResourceBusy`): two hosts never write one log.
//! 2. Every segment's header is checked; an unknown version is refused (`Unsupported`),
//!    a damaged header too (segments are named only once complete and synced, so a bad
//!    header is damage, never a crash's leftover). `*.tmp` files are leftovers of a crash
//!    and are deleted.
//! 3. The newest snapshot segment, if any, holds everything that the segments numbered
//!    below it held (see "Compaction"): those are ignored and deleted.
//! 4. Frames are read in order until the first whose header or checksum is wrong, or the
//!    end (nothing but zeros left). A wrong frame in the last segment is a commit torn by
//!    a crash, and never acknowledged (a commit returns only once its frame is written and,
//!    with `sync`, synced) *if no intact frame follows it*: the tail is cut there (with a
//!    warning) so that later frames follow an intact one. A wrong frame followed by an
//!    intact one, or in a segment that is not the last, is damage, and is refused naming
//!    the file and the offset: skipping it would silently drop committed records. (Commits
//!    without `sync` survive a crash of the host, not of the machine, which may lose any
//!    of them: such a log may be refused too, never misread.)
//!
//! Nothing of a file's contents can make opening panic, and no length read from a file
//! is trusted before it is checked against the file's size.
//!
//! [`LogStore::read_now`] reads a log a host is using, for tools: steps 2 to 4 without the
//! lock, and without deleting or cutting anything; a commit half-written at the end is
//! read as a torn one is.
//!
//! # Segments and compaction
//!
//! Past [`SEGMENT_SIZE`], the segment being written is sealed (synced and cut to its last
//! frame, whatever the commits' durability, so that a later segment never holds a frame
//! whose predecessors could be lost) and a new one started. A new segment is written
//! as `<number>.tmp` with its header, synced, renamed and the directory synced before any
//! frame goes into it, so a named segment always has a whole header.
//!
//! When the live records take less than half the log's bytes (and the log is past
//! [`COMPACT_AT`]), the committing thread, between two commits, seals the segment `A`
//! being written, starts segment `A + 2` for the commits that follow, and hands a copy of
//! the index (the records as of the end of `A`, values shared, not copied) to a thread
//! of its own, which:
//!
//! 1. writes them into `A+1.tmp`, a snapshot segment;
//! 2. syncs it;
//! 3. renames it to `A+1.log`;
//! 4. syncs the directory;
//! 5. deletes every segment numbered `A` or below;
//! 6. syncs the directory.
//!
//! A crash before 3 leaves a `.tmp`, deleted at the next open: the log is still segments
//! `..=A` then `A+2..`, which read in order give every commit. A crash after 3 leaves a
//! complete snapshot `A+1` (its contents were synced before its name; if the rename did
//! not reach the disk, the case before), which supersedes `..=A` whether or not they were
//! deleted yet, followed by `A+2..`: again every commit. No step ever removes the only
//! copy of a committed record.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::ControlFlow;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use super::store::{Batch, Key, MemoryStore, Store};

/// The version of the log's format, in every segment's header: a log written by a later
/// format is refused rather than misread.
pub const LOG_VERSION: u32 = 1;

/// The size past which the segment being written is sealed and a new one started. Picked
/// so that a segment is read at open in one allocation of a bounded size.
const SEGMENT_SIZE: u64 = 64 << 20;

/// The log's size below which it is never compacted: compacting a small log gains little
/// disk and costs a rewrite.
const COMPACT_AT: u64 = 16 << 20;

/// The step in which the segment being written is extended with zeros ahead of its
/// frames. A synced append over zeros already on disk writes data blocks only; one that
/// grows the file, or writes into `fallocate`d space, also commits the file system's
/// metadata on every sync. Larger steps cost longer stalls when their zeros are flushed.
/// The figures behind the choice are in `docs/perf/journal-store.md`.
const PREALLOCATE: u64 = 1 << 20;

/// The most bytes a frame of a snapshot segment holds (one record more if a single record
/// is larger): snapshot frames are read whole at open.
const SNAPSHOT_FRAME: usize = 1 << 20;

const LOCK_FILE: &str = "log.lock";
const SEGMENT_MAGIC: [u8; 8] = *b"wpj-log\n";
const SEGMENT_HEADER: usize = 32;
const FRAME_MAGIC: [u8; 4] = *b"WPJF";
const FRAME_HEADER: usize = 16;
/// What a put costs in a frame besides its value: process, seq, length.
const PUT_HEADER: u64 = 20;

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Commits, in order.
    Log = 1,
    /// Every live record as of the end of the segment numbered one below it: written by a
    /// compaction, it supersedes every segment numbered below it.
    Snapshot = 2,
}

/// The thresholds of a [`LogStore`]: the constants above, smaller in tests.
#[derive(Debug, Clone, Copy)]
struct Limits {
    segment_size: u64,
    compact_at: u64,
    preallocate: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { segment_size: SEGMENT_SIZE, compact_at: COMPACT_AT, preallocate: PREALLOCATE }
    }
}

/// The steps of a compaction (see the module's docs): where a test stops one, as a crash
/// there would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Half the snapshot's frames written.
    HalfWritten,
    Written,
    Synced,
    Renamed,
    DirSynced,
    /// The first of the superseded segments deleted.
    DeletedOne,
    Done,
}

/// The journal as an append-only log in a directory of its own; see the module's docs
/// for its format and its crash safety.
///
/// Every live record is held in memory (the index that [`Store::scan`] reads); what a
/// commit writes is one frame, appended and, with `sync`, `fdatasync`ed. A thread of its
/// own compacts the log now and then; dropping the store waits for it.
pub struct LogStore {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    limits: Limits,
    /// Lock order: `writer`, then `index`; the compactor takes `writer` alone.
    writer: Mutex<Writer>,
    index: RwLock<Index>,
    compaction: Mutex<Option<JoinHandle<()>>>,
    /// Held (`flock`) for as long as the store lives.
    _lock: File,
}

/// Every live record, by process: the journal appends each process's records in
/// sequence order and removes them from the first, so a process's records are a vector
/// pushed at its end and drained from its start, not a node each in one big tree (whose
/// upkeep, with many records live, costs as much as the write and the sync:
/// `docs/perf/journal-store.md`).
#[derive(Default)]
struct Index {
    processes: BTreeMap<u64, Records>,
    /// Records held.
    len: usize,
    /// The bytes the records would take in frames: values and their headers.
    live: u64,
}

/// One process's records, (seq, value) in sequence order.
type Records = Vec<(u64, Arc<[u8]>)>;

struct Writer {
    dir: PathBuf,
    active: Active,
    /// The bytes of every segment of the log, by number (the active one's up to the end
    /// of its last frame): what a compaction measures the live bytes against.
    sizes: BTreeMap<u64, u64>,
    /// The number the next new segment takes.
    next: u64,
    /// The log's size below which a compaction does not start again after one failed
    /// (0: none failed): a failing disk is not rewritten at every commit.
    compact_at: u64,
    /// The frame being written, kept to reuse its allocation.
    frame: Vec<u8>,
    /// Why an earlier write failed: the file may then hold anything after the last
    /// acknowledged frame, so nothing more is written.
    broken: Option<String>,
}

/// The segment being written.
struct Active {
    number: u64,
    file: File,
    /// Where the next frame goes: the end of the last one.
    end: u64,
    /// The file's length: zeros from `end` to here.
    allocated: u64,
}

impl LogStore {
    /// Opens the log in `dir`, creating the directory (private to this user, mode 0700)
    /// and the log if they do not exist.
    ///
    /// A commit torn by a crash (the last frame, damaged or cut short, with no intact
    /// frame after it) is dropped, with a warning, and the log resumes from the commit
    /// before it.
    ///
    /// # Errors
    ///
    /// The directory cannot be created or read, or is not private to this user
    /// (`PermissionDenied`); another process holds the log (`ResourceBusy`); the log was
    /// written by an unknown version of its format (`Unsupported`); the directory holds a
    /// journal written by [`FjallStore`](super::FjallStore), or the log is damaged before
    /// its last frame (`InvalidData`, naming the file and the offset).
    pub fn open(dir: impl AsRef<Path>) -> io::Result<LogStore> {
        LogStore::open_with(dir.as_ref(), Limits::default())
    }

    fn open_with(dir: &Path, limits: Limits) -> io::Result<LogStore> {
        super::private_dir(dir, "the journal", "a journal decides what its processes resume with")?;
        if super::written_by_fjall(dir) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} holds a journal written by fjall, not a log: open it with `FjallStore`", dir.display()),
            ));
        }
        let lock = lock(dir)?;
        let listing = list(dir)?;
        let Replayed { index, mut sizes, last } = replay_all(dir, &listing)?;
        let Listing { segments, superseded, leftovers, .. } = listing;

        // The log is whole: what a crash left over can go.
        let mut removed = false;
        for number in &superseded {
            tracing::info!(segment = number, dir = %dir.display(), "removing a segment a compaction superseded");
            remove(&segment_path(dir, *number))?;
            removed = true;
        }
        for number in &leftovers {
            tracing::info!(file = %tmp_path(dir, *number).display(), "removing what a crash left of a new segment");
            remove(&tmp_path(dir, *number))?;
            removed = true;
        }
        if removed {
            sync_dir(dir)?;
        }

        let next = segments.iter().chain(&superseded).chain(&leftovers).max().map_or(1, |n| n + 1);
        let (active, next) = match last {
            Some((number, end, len)) => {
                let path = segment_path(dir, number);
                let file = OpenOptions::new().read(true).write(true).open(&path)?;
                let mut allocated = len;
                if let Some(torn) = end.torn {
                    tracing::warn!(
                        segment = %path.display(),
                        offset = end.frames,
                        reason = torn,
                        "the journal's last commit was torn by a crash (never acknowledged): dropped it, \
                         the journal resumes from the commit before",
                    );
                    file.set_len(end.frames as u64)?;
                    file.sync_all()?;
                    allocated = end.frames as u64;
                }
                (Active { number, file, end: end.frames as u64, allocated }, next)
            }
            None => {
                let active = create_segment(dir, next)?;
                sizes.insert(next, SEGMENT_HEADER as u64);
                (active, next + 1)
            }
        };
        let writer =
            Writer { dir: dir.to_owned(), active, sizes, next, compact_at: 0, frame: Vec::new(), broken: None };
        Ok(LogStore {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                limits,
                writer: Mutex::new(writer),
                index: RwLock::new(index),
                compaction: Mutex::new(None),
                _lock: lock,
            }),
        })
    }

    /// Records held now.
    pub fn len(&self) -> usize {
        self.inner.index.read().len
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.inner.index.read().len == 0
    }

    /// Waits for a compaction under way, if any.
    #[cfg(test)]
    fn wait_for_compaction(&self) {
        let thread = self.inner.compaction.lock().take();
        if let Some(thread) = thread {
            thread.join().expect("the compaction does not panic");
        }
    }
}

impl Drop for LogStore {
    fn drop(&mut self) {
        // The compactor holds the lock file through `inner`; waiting for it here means
        // that once the store is dropped, the directory is free for another opener.
        let thread = self.inner.compaction.lock().take();
        if let Some(thread) = thread {
            // A panic there is a bug, already reported by the panic hook; the log itself
            // is whole at every step of a compaction.
            let _ = thread.join();
        }
    }
}

impl LogStore {
    /// The records of the log in `dir` as they are now, read without taking its lock and
    /// without changing anything: for tools that look at a journal a host is using. A
    /// commit being written as it is read is left out, as a torn one would be. A segment
    /// that a compaction removes meanwhile, or a frame read half-written with the next
    /// already whole (the file is read page after page while the host appends), makes the
    /// read start again, three times at most: damage stays, and is reported as
    /// [`LogStore::open`] reports it.
    ///
    /// # Errors
    ///
    /// As [`LogStore::open`], but for the lock; `NotFound` if the directory holds no log.
    pub fn read_now(dir: impl AsRef<Path>) -> io::Result<MemoryStore> {
        let dir = dir.as_ref();
        if super::written_by_fjall(dir) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} holds a journal written by fjall, not a log", dir.display()),
            ));
        }
        let mut attempts = 0;
        loop {
            match read_records(dir) {
                Err(error)
                    if matches!(error.kind(), io::ErrorKind::NotFound | io::ErrorKind::InvalidData) && attempts < 3 =>
                {
                    attempts += 1;
                }
                Err(error) => return Err(error),
                Ok(index) => {
                    let puts = index.snapshot().into_iter().map(|(key, value)| (key, value.to_vec())).collect();
                    let store = MemoryStore::new();
                    store.commit(&Batch { puts, removals: Vec::new() }, false)?;
                    return Ok(store);
                }
            }
        }
    }
}

/// Every record of the log in `dir` as its segments hold them now (see
/// [`LogStore::read_now`]).
fn read_records(dir: &Path) -> io::Result<Index> {
    let listing = list(dir)?;
    if listing.segments.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} holds no journal", dir.display())));
    }
    Ok(replay_all(dir, &listing)?.index)
}

/// What reading a log's segments in order gives.
struct Replayed {
    index: Index,
    /// Where each segment's frames end, by number.
    sizes: BTreeMap<u64, u64>,
    /// The segment being written, if the last is a log: its number, where its frames end
    /// (and whether a torn commit follows them), and its length.
    last: Option<(u64, End, u64)>,
}

/// Reads `listing`'s segments in order into an index.
fn replay_all(dir: &Path, listing: &Listing) -> io::Result<Replayed> {
    let mut replayed = Replayed { index: Index::default(), sizes: BTreeMap::new(), last: None };
    for (i, (&number, &kind)) in listing.segments.iter().zip(&listing.kinds).enumerate() {
        let path = segment_path(dir, number);
        let data = std::fs::read(&path)?;
        // Only the segment being written (when the host stopped, or now, by a host
        // running it) may end in a torn commit: every other one was synced whole before
        // the next was started.
        let writable = i + 1 == listing.segments.len() && kind == Kind::Log;
        let end = replay(&path, &data, writable, &mut replayed.index)?;
        replayed.sizes.insert(number, end.frames as u64);
        if writable {
            replayed.last = Some((number, end, data.len() as u64));
        }
    }
    Ok(replayed)
}

/// The segments of a log to read, in order, and what a crash or a compaction left.
struct Listing {
    /// From the newest snapshot (if any) on.
    segments: Vec<u64>,
    /// Each of `segments`' kind.
    kinds: Vec<Kind>,
    /// The segments below the newest snapshot, which it supersedes.
    superseded: Vec<u64>,
    /// `.tmp` files: what a crash left of a new segment or a snapshot.
    leftovers: Vec<u64>,
}

/// Lists the log in `dir`, reading its segments' headers.
fn list(dir: &Path) -> io::Result<Listing> {
    let mut segments = Vec::new();
    let mut leftovers = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(number) = name.strip_suffix(".log").and_then(parse_number) {
            segments.push(number);
        } else if let Some(number) = name.strip_suffix(".tmp").and_then(parse_number) {
            leftovers.push(number);
        }
    }
    segments.sort_unstable();
    // The newest snapshot supersedes every segment below it: those are not read.
    let mut kinds = Vec::with_capacity(segments.len());
    for &number in segments.iter().rev() {
        let kind = read_header(&segment_path(dir, number), number)?;
        kinds.push(kind);
        if kind == Kind::Snapshot {
            break;
        }
    }
    kinds.reverse();
    let superseded: Vec<u64> = segments.drain(..segments.len() - kinds.len()).collect();
    Ok(Listing { segments, kinds, superseded, leftovers })
}

impl Store for LogStore {
    fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let mut writer = inner.writer.lock();
        if let Some(failure) = &writer.broken {
            return Err(io::Error::other(format!("an earlier write to the journal failed ({failure})")));
        }
        let mut frame = std::mem::take(&mut writer.frame);
        let encoded =
            encode(&mut frame, &batch.removals, batch.puts.iter().map(|(key, value)| (*key, value.as_slice())));
        let written = encoded.and_then(|()| writer.append(&inner.limits, &frame, sync));
        writer.frame = frame;
        if let Err(error) = written {
            if error.kind() != io::ErrorKind::InvalidInput {
                writer.broken = Some(error.to_string());
            }
            return Err(error);
        }
        let mut index = inner.index.write();
        // The index holds its records until they are removed, often for as long as their
        // processes sleep: apart from the committer's short-lived buffers.
        crate::heap::lasting(|| {
            index.apply(batch.removals.iter().copied(), batch.puts.iter().map(|(key, value)| (*key, value.as_slice())));
        });
        let total: u64 = writer.sizes.values().sum();
        if total >= writer.compact_at.max(inner.limits.compact_at) && index.live * 2 < total {
            let mut compaction = inner.compaction.lock();
            if compaction.as_ref().is_none_or(|thread| thread.is_finished()) {
                if let Some(done) = compaction.take() {
                    let _ = done.join();
                }
                // The snapshot is the state after this commit, which is the end of the
                // segment about to be sealed: no other commit runs while `writer` is held.
                let records = index.snapshot();
                drop(index);
                match writer.begin_compaction(records) {
                    Ok(job) => {
                        let owner = self.inner.clone();
                        let thread = std::thread::Builder::new()
                            .name("journal-compaction".to_owned())
                            .spawn(move || owner.compact(job));
                        match thread {
                            Ok(thread) => *compaction = Some(thread),
                            Err(error) => tracing::warn!(%error, "cannot start the journal's compaction"),
                        }
                    }
                    // This commit is whole and durable; the next one is refused.
                    Err(error) => {
                        tracing::error!(%error, "the journal cannot start a new segment");
                        writer.broken = Some(format!("starting a new segment: {error}"));
                    }
                }
            }
        }
        Ok(())
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        self.inner.index.read().visit(from, visit);
        Ok(())
    }
}

impl Index {
    /// Every record, the values shared.
    fn snapshot(&self) -> Vec<(Key, Arc<[u8]>)> {
        let mut all = Vec::with_capacity(self.len);
        for (&process, records) in &self.processes {
            all.extend(records.iter().map(|(seq, value)| (Key { process, seq: *seq }, value.clone())));
        }
        all
    }

    /// Visits every record from `from` on, in key order, until `visit` breaks.
    fn visit(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) {
        for (&process, records) in self.processes.range(from.process..) {
            let start = if process == from.process { records.partition_point(|(seq, _)| *seq < from.seq) } else { 0 };
            for (seq, value) in &records[start..] {
                if visit(Key { process, seq: *seq }, value).is_break() {
                    return;
                }
            }
        }
    }

    /// Removes every record of `process` below `count`.
    fn remove(&mut self, process: u64, count: u64) {
        let Some(records) = self.processes.get_mut(&process) else { return };
        let end = records.partition_point(|(seq, _)| *seq < count);
        for (_, value) in records.drain(..end) {
            self.live -= PUT_HEADER + value.len() as u64;
            self.len -= 1;
        }
        if records.is_empty() {
            self.processes.remove(&process);
        }
    }

    /// Puts `value` at `key`, in place of any record there.
    fn put(&mut self, key: Key, value: &[u8]) {
        let records = self.processes.entry(key.process).or_default();
        let value: Arc<[u8]> = Arc::from(value);
        self.live += PUT_HEADER + value.len() as u64;
        match records.last() {
            // The journal's case: the next record of the process.
            Some((last, _)) if *last < key.seq => records.push((key.seq, value)),
            None => records.push((key.seq, value)),
            Some(_) => match records.binary_search_by_key(&key.seq, |(seq, _)| *seq) {
                Ok(at) => {
                    let old = std::mem::replace(&mut records[at].1, value);
                    self.live -= PUT_HEADER + old.len() as u64;
                    return;
                }
                Err(at) => records.insert(at, (key.seq, value)),
            },
        }
        self.len += 1;
    }

    fn apply<'a>(
        &mut self,
        removals: impl IntoIterator<Item = (u64, u64)>,
        puts: impl IntoIterator<Item = (Key, &'a [u8])>,
    ) {
        for (process, count) in removals {
            self.remove(process, count);
        }
        for (key, value) in puts {
            self.put(key, value);
        }
    }
}

impl Writer {
    /// Appends `frame` to the log, in a new segment if the active one is full.
    fn append(&mut self, limits: &Limits, frame: &[u8], sync: bool) -> io::Result<()> {
        let len = frame.len() as u64;
        if self.active.end > SEGMENT_HEADER as u64 && self.active.end + len > limits.segment_size {
            self.roll()?;
        }
        let active = &mut self.active;
        let end = active.end + len;
        if end > active.allocated {
            let target = end.next_multiple_of(limits.preallocate.max(1));
            write_zeros(&active.file, active.allocated, target)?;
            active.allocated = target;
        }
        active.file.write_all_at(frame, active.end)?;
        if sync {
            active.file.sync_data()?;
        }
        active.end = end;
        self.sizes.insert(active.number, end);
        Ok(())
    }

    /// Seals the active segment and starts the next.
    fn roll(&mut self) -> io::Result<()> {
        let active = &self.active;
        // Synced whatever the commits' durability: a frame of the next segment must never
        // be on the disk without every frame before it.
        active.file.sync_data()?;
        active.file.set_len(active.end)?;
        active.file.sync_all()?;
        let number = self.next;
        self.active = create_segment(&self.dir, number)?;
        self.next += 1;
        self.sizes.insert(number, SEGMENT_HEADER as u64);
        Ok(())
    }

    /// Seals the active segment `A` and starts `A + 2`, keeping `A + 1` for the snapshot
    /// of `records`, the state at the end of `A`.
    fn begin_compaction(&mut self, records: Vec<(Key, Arc<[u8]>)>) -> io::Result<Job> {
        let number = self.next;
        self.next += 1;
        self.roll()?;
        let superseded = self.sizes.range(..number).map(|(n, _)| *n).collect();
        Ok(Job { number, records, superseded })
    }
}

/// A compaction's work: the snapshot to write, and the segments it supersedes.
struct Job {
    number: u64,
    records: Vec<(Key, Arc<[u8]>)>,
    superseded: Vec<u64>,
}

impl Inner {
    /// Runs `job`, on the compaction's thread.
    fn compact(&self, job: Job) {
        match write_snapshot(&self.dir, &job, Step::Done) {
            // Run to its end: `Step::Done`.
            Ok((_, bytes)) => {
                let mut writer = self.writer.lock();
                let before: u64 = writer.sizes.values().sum();
                for number in &job.superseded {
                    writer.sizes.remove(number);
                }
                writer.sizes.insert(job.number, bytes);
                let after: u64 = writer.sizes.values().sum();
                tracing::debug!(segments = job.superseded.len(), before, after, "compacted the journal");
            }
            Err(error) => {
                // Every step leaves the log whole (see the module's docs): a later
                // commit tries again, once the log has grown by the threshold.
                tracing::warn!(%error, "the journal's compaction failed");
                let _ = std::fs::remove_file(tmp_path(&self.dir, job.number));
                let mut writer = self.writer.lock();
                writer.compact_at = writer.sizes.values().sum::<u64>() + self.limits.compact_at;
            }
        }
    }
}

/// Steps 1 to 6 of a compaction (see the module's docs), up to `until`: the step reached
/// and the snapshot's size.
fn write_snapshot(dir: &Path, job: &Job, until: Step) -> io::Result<(Step, u64)> {
    let tmp = tmp_path(dir, job.number);
    let file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    let mut out = segment_header(job.number, Kind::Snapshot).to_vec();
    let mut frame = Vec::new();
    let mut written = 0;
    let mut rest = job.records.as_slice();
    while !rest.is_empty() {
        let mut bytes = 0;
        let count = rest
            .iter()
            .position(|(_, value)| {
                bytes += PUT_HEADER as usize + value.len();
                bytes > SNAPSHOT_FRAME
            })
            .unwrap_or(rest.len())
            .max(1);
        let (chunk, after) = rest.split_at(count);
        encode(&mut frame, &[], chunk.iter().map(|(key, value)| (*key, &value[..])))?;
        out.extend_from_slice(&frame);
        rest = after;
        if out.len() >= 4 * SNAPSHOT_FRAME || rest.is_empty() {
            if until == Step::HalfWritten {
                file.write_all_at(&out[..out.len() / 2], written)?;
                return Ok((Step::HalfWritten, 0));
            }
            file.write_all_at(&out, written)?;
            written += out.len() as u64;
            out.clear();
        }
    }
    if !out.is_empty() {
        // A snapshot of no record: its header alone.
        file.write_all_at(&out, written)?;
        written += out.len() as u64;
    }
    if until == Step::Written {
        return Ok((Step::Written, written));
    }
    file.sync_all()?;
    if until == Step::Synced {
        return Ok((Step::Synced, written));
    }
    std::fs::rename(&tmp, segment_path(dir, job.number))?;
    if until == Step::Renamed {
        return Ok((Step::Renamed, written));
    }
    sync_dir(dir)?;
    if until == Step::DirSynced {
        return Ok((Step::DirSynced, written));
    }
    for (i, number) in job.superseded.iter().enumerate() {
        remove(&segment_path(dir, *number))?;
        if i == 0 && until == Step::DeletedOne {
            return Ok((Step::DeletedOne, written));
        }
    }
    sync_dir(dir)?;
    Ok((Step::Done, written))
}

/// Encodes a frame of `removals` and `puts` into `frame` (see the module's docs).
///
/// # Errors
///
/// `InvalidInput`: the batch, or a value, does not fit a frame's 32-bit lengths.
fn encode<'a>(
    frame: &mut Vec<u8>,
    removals: &[(u64, u64)],
    puts: impl ExactSizeIterator<Item = (Key, &'a [u8])>,
) -> io::Result<()> {
    let too_large = |what: &str, n: usize| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{what} of {n} is too large for a journal frame"))
    };
    frame.clear();
    frame.resize(FRAME_HEADER, 0);
    let count = u32::try_from(removals.len()).map_err(|_| too_large("a removal count", removals.len()))?;
    frame.extend_from_slice(&count.to_le_bytes());
    for &(process, count) in removals {
        frame.extend_from_slice(&process.to_le_bytes());
        frame.extend_from_slice(&count.to_le_bytes());
    }
    let count = u32::try_from(puts.len()).map_err(|_| too_large("a record count", puts.len()))?;
    frame.extend_from_slice(&count.to_le_bytes());
    for (key, value) in puts {
        let len = u32::try_from(value.len()).map_err(|_| too_large("a record of bytes", value.len()))?;
        frame.extend_from_slice(&key.process.to_le_bytes());
        frame.extend_from_slice(&key.seq.to_le_bytes());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(value);
    }
    let body = frame.len() - FRAME_HEADER;
    let len = u32::try_from(body).map_err(|_| too_large("a commit of bytes", body))?;
    let body_crc = crc32fast::hash(&frame[FRAME_HEADER..]);
    frame[0..4].copy_from_slice(&FRAME_MAGIC);
    frame[4..8].copy_from_slice(&len.to_le_bytes());
    frame[8..12].copy_from_slice(&body_crc.to_le_bytes());
    let head_crc = crc32fast::hash(&frame[..12]);
    frame[12..16].copy_from_slice(&head_crc.to_le_bytes());
    Ok(())
}

/// The body's length of the frame header at `at`, if it is one: its magic and its
/// checksum right (the length not yet checked against anything).
fn header_at(data: &[u8], at: usize) -> Option<usize> {
    let header = data.get(at..at.checked_add(FRAME_HEADER)?)?;
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    (header[..4] == FRAME_MAGIC && crc32fast::hash(&header[..12]) == word(12)).then(|| word(4) as usize)
}

/// The body of the frame at `at` and where the next begins, or why there is no intact
/// frame there.
fn frame_at(data: &[u8], at: usize) -> Result<(&[u8], usize), &'static str> {
    if data.len().saturating_sub(at) < FRAME_HEADER {
        return Err("a frame header cut short");
    }
    let len = header_at(data, at).ok_or("a damaged frame header")?;
    let start = at + FRAME_HEADER;
    let body = data.get(start..start.saturating_add(len)).ok_or("a frame cut short")?;
    let crc = u32::from_le_bytes(data[at + 8..at + 12].try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err("a frame whose checksum does not match");
    }
    Ok((body, start + len))
}

/// The offset of an intact frame after the bad one at `at`, if there is one.
fn intact_after(data: &[u8], at: usize) -> Option<usize> {
    // A frame whose header is intact owns the bytes it declares: what looks like a frame
    // among them is a record's value, not a commit.
    let from = match header_at(data, at) {
        Some(len) => at.saturating_add(FRAME_HEADER).saturating_add(len),
        None => at + 1,
    };
    let last = data.len().checked_sub(FRAME_HEADER)?;
    (from..=last).find(|&p| data[p..p + 4] == FRAME_MAGIC && frame_at(data, p).is_ok())
}

/// Where a segment's frames end, and whether a torn commit follows them (and why it is).
#[derive(Debug)]
struct End {
    frames: usize,
    torn: Option<&'static str>,
}

/// Applies every frame of the segment `data` (read from `path`) to `index`. Only a
/// `writable` segment (the last, being written when the host stopped) may end in a torn
/// commit.
fn replay(path: &Path, data: &[u8], writable: bool, index: &mut Index) -> io::Result<End> {
    let mut at = SEGMENT_HEADER;
    loop {
        match frame_at(data, at) {
            Ok((body, next)) => {
                decode(body, index).map_err(|why| damaged(path, at, why))?;
                at = next;
            }
            Err(_) if data[at.min(data.len())..].iter().all(|&b| b == 0) => return Ok(End { frames: at, torn: None }),
            Err(bad) if !writable => {
                return Err(damaged(path, at, &format!("{bad}, in a segment that a later one follows")));
            }
            Err(bad) => {
                if let Some(next) = intact_after(data, at) {
                    return Err(damaged(path, at, &format!("{bad}, followed by an intact one at offset {next}")));
                }
                return Ok(End { frames: at, torn: Some(bad) });
            }
        }
    }
}

/// Applies the batch in `body` to `index`.
fn decode(body: &[u8], index: &mut Index) -> Result<(), &'static str> {
    let mut body = Cursor(body);
    const SHORT: &str = "an intact frame holding a batch cut short";
    for _ in 0..body.u32().ok_or(SHORT)? {
        let (process, count) = (body.u64().ok_or(SHORT)?, body.u64().ok_or(SHORT)?);
        index.remove(process, count);
    }
    for _ in 0..body.u32().ok_or(SHORT)? {
        let key = Key { process: body.u64().ok_or(SHORT)?, seq: body.u64().ok_or(SHORT)? };
        let len = body.u32().ok_or(SHORT)?;
        let value = body.take(len as usize).ok_or(SHORT)?;
        index.put(key, value);
    }
    if !body.0.is_empty() {
        return Err("an intact frame holding bytes past its batch");
    }
    Ok(())
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

fn segment_header(number: u64, kind: Kind) -> [u8; SEGMENT_HEADER] {
    let mut header = [0; SEGMENT_HEADER];
    header[..8].copy_from_slice(&SEGMENT_MAGIC);
    header[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(kind as u32).to_le_bytes());
    header[16..24].copy_from_slice(&number.to_le_bytes());
    let crc = crc32fast::hash(&header[..28]);
    header[28..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The kind of the segment at `path`, once its header is checked.
fn read_header(path: &Path, number: u64) -> io::Result<Kind> {
    use std::io::Read as _;
    let mut header = [0; SEGMENT_HEADER];
    let mut file = File::open(path)?;
    let mut read = 0;
    while read < SEGMENT_HEADER {
        match file.read(&mut header[read..])? {
            0 => return Err(damaged(path, read, "a segment header cut short")),
            n => read += n,
        }
    }
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    if header[..8] != SEGMENT_MAGIC {
        return Err(damaged(path, 0, "not a journal segment (no magic)"));
    }
    if word(8) != LOG_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "`{}` is in version {} of the journal's log format; this host reads version {LOG_VERSION} \
                 (a later wasmproc wrote it)",
                path.display(),
                word(8)
            ),
        ));
    }
    if crc32fast::hash(&header[..28]) != word(28) {
        return Err(damaged(path, 0, "a segment header whose checksum does not match"));
    }
    let kind = match word(12) {
        1 => Kind::Log,
        2 => Kind::Snapshot,
        _ => return Err(damaged(path, 12, "a segment of an unknown kind")),
    };
    let named = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
    if named != number {
        return Err(damaged(path, 16, &format!("the header of segment {named:016x}, not of this one")));
    }
    Ok(kind)
}

/// Creates segment `number` of the log in `dir`, durably: its header written and synced
/// under a temporary name, then named, and the name synced.
fn create_segment(dir: &Path, number: u64) -> io::Result<Active> {
    let tmp = tmp_path(dir, number);
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all_at(&segment_header(number, Kind::Log), 0)?;
    file.sync_all()?;
    std::fs::rename(&tmp, segment_path(dir, number))?;
    sync_dir(dir)?;
    Ok(Active { number, file, end: SEGMENT_HEADER as u64, allocated: SEGMENT_HEADER as u64 })
}

/// Writes zeros into `file` from `from` to `to`.
fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Takes the log's lock in `dir`, or fails if another process (or another store in this
/// one) holds it.
fn lock(dir: &Path) -> io::Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "another process has it open (one host at a time can use a journal)",
        )),
        Err(error) => Err(error.into()),
    }
}

/// A segment's number from its name (16 hex digits).
fn parse_number(name: &str) -> Option<u64> {
    (name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(name, 16).ok())
        .flatten()
}

fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:016x}.log"))
}

fn tmp_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:016x}.tmp"))
}

/// Removes `path`, if it is there.
fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Syncs `dir`: the names created, renamed and removed in it are durable on return.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn damaged(path: &Path, at: usize, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("damaged journal: `{}` at offset {at}: {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::MemoryStore;

    /// A fresh directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wasmproc-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn key(process: u64, seq: u64) -> Key {
        Key { process, seq }
    }

    fn puts(records: &[(u64, u64, &str)]) -> Batch {
        let puts = records.iter().map(|&(p, s, v)| (key(p, s), v.as_bytes().to_vec())).collect();
        Batch { puts, removals: Vec::new() }
    }

    /// Every record of `store`, in key order.
    fn contents(store: &dyn Store) -> Vec<(Key, Vec<u8>)> {
        let mut all = Vec::new();
        store
            .scan(key(0, 0), &mut |key, value| {
                all.push((key, value.to_vec()));
                ControlFlow::Continue(())
            })
            .unwrap();
        all
    }

    /// Where the next frame of `store` goes.
    fn end(store: &LogStore) -> usize {
        store.inner.writer.lock().active.end as usize
    }

    /// The names of the files in `dir`, sorted.
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    fn small() -> Limits {
        Limits { segment_size: 4 << 10, compact_at: 8 << 10, preallocate: 1 << 10 }
    }

    #[test]
    fn records_round_trip_in_key_order_from_any_key() {
        let dir = scratch("round-trip");
        let store = LogStore::open(&dir).unwrap();
        assert!(store.is_empty());
        store.commit(&puts(&[(2, 0, "b0"), (1, 0, "a0"), (1, 1, "a1")]), true).unwrap();
        store.commit(&puts(&[(2, 1, "b1"), (1, 1, "a1'")]), false).unwrap();
        store.commit(&Batch::default(), true).unwrap();
        let expected = vec![
            (key(1, 0), b"a0".to_vec()),
            (key(1, 1), b"a1'".to_vec()),
            (key(2, 0), b"b0".to_vec()),
            (key(2, 1), b"b1".to_vec()),
        ];
        assert_eq!(contents(&store), expected);
        let mut from = Vec::new();
        store
            .scan(key(1, 1), &mut |key, _| {
                from.push(key);
                if key.process == 2 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            })
            .unwrap();
        assert_eq!(from, vec![key(1, 1), key(2, 0)]);
        assert_eq!(store.len(), 4);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        drop(store);
        assert_eq!(contents(&LogStore::open(&dir).unwrap()), expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_removal_drops_a_process_records_below_its_count_and_survives_a_reopen() {
        let dir = scratch("removals");
        let store = LogStore::open(&dir).unwrap();
        store.commit(&puts(&[(1, 0, "a"), (1, 1, "b"), (1, 2, "c"), (2, 0, "x")]), true).unwrap();
        let batch = Batch { puts: vec![(key(3, 0), b"y".to_vec())], removals: vec![(1, 2), (9, 5)] };
        store.commit(&batch, true).unwrap();
        let expected = vec![(key(1, 2), b"c".to_vec()), (key(2, 0), b"x".to_vec()), (key(3, 0), b"y".to_vec())];
        assert_eq!(contents(&store), expected);
        // A removal and a put of the same process in one batch: the removal first.
        let batch = Batch { puts: vec![(key(2, 1), b"z".to_vec())], removals: vec![(2, 2)] };
        store.commit(&batch, true).unwrap();
        let expected = vec![(key(1, 2), b"c".to_vec()), (key(2, 1), b"z".to_vec()), (key(3, 0), b"y".to_vec())];
        assert_eq!(contents(&store), expected);
        drop(store);
        let store = LogStore::open(&dir).unwrap();
        assert_eq!(contents(&store), expected);
        // Appends after a reopen follow the last frame.
        store.commit(&puts(&[(4, 0, "w")]), true).unwrap();
        drop(store);
        assert_eq!(contents(&LogStore::open(&dir).unwrap()).len(), 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn records_put_out_of_order_or_again_keep_key_order_and_the_live_bytes() {
        let mut index = Index::default();
        for (seq, value) in [(3, "ccc"), (1, "a"), (2, "bb"), (1, "aaaa"), (0, "")] {
            index.put(key(7, seq), value.as_bytes());
        }
        let mut seen = Vec::new();
        index.visit(key(7, 1), &mut |key, value| {
            seen.push((key.seq, String::from_utf8(value.to_vec()).unwrap()));
            ControlFlow::Continue(())
        });
        assert_eq!(seen, [(1, "aaaa".to_owned()), (2, "bb".to_owned()), (3, "ccc".to_owned())]);
        assert_eq!((index.len, index.live), (4, 4 * PUT_HEADER + 9));
        index.remove(7, 2);
        assert_eq!((index.len, index.live), (2, 2 * PUT_HEADER + 5));
        index.remove(7, 10);
        assert!(index.processes.is_empty() && index.len == 0 && index.live == 0);
    }

    /// A log of three commits, `a`, `b` and `c` (the last left out unless asked for).
    struct ThreeCommits {
        /// The segment.
        path: PathBuf,
        bytes: Vec<u8>,
        /// Where `b`'s frame starts and ends.
        start: usize,
        stop: usize,
        /// The records after `a`.
        after_a: Vec<(Key, Vec<u8>)>,
    }

    fn three_commits(dir: &Path, third: bool) -> ThreeCommits {
        let store = LogStore::open(dir).unwrap();
        store.commit(&puts(&[(1, 0, "spawn"), (2, 0, "spawn")]), true).unwrap();
        let after_a = contents(&store);
        let start = end(&store);
        let b =
            Batch { puts: vec![(key(1, 1), b"step".to_vec()), (key(3, 0), b"more".to_vec())], removals: vec![(2, 1)] };
        store.commit(&b, true).unwrap();
        let stop = end(&store);
        if third {
            store.commit(&puts(&[(1, 2, "exit")]), true).unwrap();
        }
        let path = segment_path(dir, store.inner.writer.lock().active.number);
        drop(store);
        ThreeCommits { bytes: std::fs::read(&path).unwrap(), path, start, stop, after_a }
    }

    /// Every file of `dir` and its bytes.
    fn snapshot_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        files(dir).into_iter().map(|name| (name.clone(), std::fs::read(dir.join(&name)).unwrap())).collect()
    }

    #[test]
    fn a_log_in_use_is_read_as_it_is_now_without_its_lock_or_a_change() {
        let dir = scratch("read-now");
        assert_eq!(LogStore::read_now(&dir).unwrap_err().kind(), io::ErrorKind::NotFound, "no log yet");
        let store = LogStore::open_with(&dir, small()).unwrap();
        store.commit(&puts(&[(1, 0, "spawn"), (1, 1, "step")]), true).unwrap();
        // Enough commits to roll segments and compact, as a running host does.
        for seq in 2..400 {
            let batch = Batch { puts: vec![(key(2, seq), vec![b'x'; 64])], removals: vec![(2, seq - 1)] };
            store.commit(&batch, true).unwrap();
        }
        store.wait_for_compaction();
        let before = snapshot_files(&dir);
        let read = LogStore::read_now(&dir).unwrap();
        assert_eq!(contents(&read), contents(&store));
        assert_eq!(snapshot_files(&dir), before, "reading changed the log");

        // A commit half-written as it is read is left out, and left alone.
        let path = segment_path(&dir, store.inner.writer.lock().active.number);
        let end = end(&store);
        let mut frame = Vec::new();
        encode(&mut frame, &[], [(key(1, 2), b"half".as_slice())].into_iter()).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&frame[..frame.len() / 2], end as u64)
            .unwrap();
        let half = std::fs::read(&path).unwrap();
        assert_eq!(contents(&LogStore::read_now(&dir).unwrap()), contents(&store));
        assert_eq!(std::fs::read(&path).unwrap(), half);
        drop(store);
    }

    #[test]
    fn a_last_frame_torn_at_any_offset_leaves_the_commit_before() {
        let dir = scratch("torn");
        let ThreeCommits { path, bytes, start, stop, after_a } = three_commits(&dir, false);
        for cut in start..stop {
            // Cut short, as a crash before the file grew; and cut into zeros, as a crash
            // that wrote some of its pages into the space written ahead.
            for zeros in [false, true] {
                let mut torn = bytes[..cut].to_vec();
                if zeros {
                    torn.resize(bytes.len(), 0);
                }
                std::fs::write(&path, &torn).unwrap();
                let store = LogStore::open(&dir).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
                assert_eq!(contents(&store), after_a, "cut at {cut}");
            }
        }
        // The tail was cut: what is appended next follows an intact frame.
        let store = LogStore::open(&dir).unwrap();
        assert_eq!(end(&store), start);
        store.commit(&puts(&[(5, 0, "after")]), true).unwrap();
        drop(store);
        let store = LogStore::open(&dir).unwrap();
        let mut expected = after_a.clone();
        expected.push((key(5, 0), b"after".to_vec()));
        assert_eq!(contents(&store), expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_flipped_byte_in_the_last_frame_leaves_the_commit_before() {
        let dir = scratch("flipped-last");
        let ThreeCommits { path, bytes, start, stop, after_a } = three_commits(&dir, false);
        for at in start..stop {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            std::fs::write(&path, &damaged).unwrap();
            let store = LogStore::open(&dir).unwrap_or_else(|e| panic!("flipped at {at}: {e}"));
            assert_eq!(contents(&store), after_a, "flipped at {at}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_flipped_byte_in_an_earlier_frame_is_refused_naming_the_file_and_the_offset() {
        let dir = scratch("flipped-earlier");
        let ThreeCommits { path, bytes, start, stop, .. } = three_commits(&dir, true);
        for at in start..stop {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            std::fs::write(&path, &damaged).unwrap();
            let error = LogStore::open(&dir).err().unwrap_or_else(|| panic!("flipped at {at}: opened"));
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
            let message = error.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains(&format!("at offset {start}:")), "flipped at {at}: {message}");
            assert!(message.contains(&format!("intact one at offset {stop}")), "flipped at {at}: {message}");
        }
        // Left as it was: the file is not cut.
        assert_eq!(std::fs::read(&path).unwrap().len(), bytes.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unknown_version_or_a_damaged_header_is_refused() {
        let dir = scratch("header");
        let ThreeCommits { path, bytes, .. } = three_commits(&dir, false);
        let mut later = bytes.clone();
        later[8..12].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&path, &later).unwrap();
        let error = LogStore::open(&dir).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::Unsupported);
        assert!(error.to_string().contains("version 2 of the journal's log format"), "{error}");
        for at in [0, 13, 17, 30] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            std::fs::write(&path, &damaged).unwrap();
            let error = LogStore::open(&dir).err().unwrap();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        }
        std::fs::write(&path, &bytes[..20]).unwrap();
        let error = LogStore::open(&dir).err().unwrap();
        assert!(error.to_string().contains("segment header cut short"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_file_contents_make_opening_panic() {
        let dir = scratch("garbage");
        let ThreeCommits { path, bytes, .. } = three_commits(&dir, true);
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..120 {
            let mut damaged = bytes.clone();
            match case % 3 {
                // Random bytes after an intact header.
                0 => damaged[SEGMENT_HEADER..].iter_mut().for_each(|b| *b = next() as u8),
                // Frame headers whose checksums are right, with random lengths.
                1 => {
                    // Past the file's end, or within it.
                    let bound = if next() % 2 == 0 { 1 << 20 } else { bytes.len() as u64 };
                    let len = (next() % bound) as u32;
                    let mut header = [0; FRAME_HEADER];
                    header[..4].copy_from_slice(&FRAME_MAGIC);
                    header[4..8].copy_from_slice(&len.to_le_bytes());
                    let crc = crc32fast::hash(&header[..12]);
                    header[12..].copy_from_slice(&crc.to_le_bytes());
                    let at = SEGMENT_HEADER + (next() as usize % (bytes.len() - SEGMENT_HEADER - FRAME_HEADER));
                    damaged[at..at + FRAME_HEADER].copy_from_slice(&header);
                }
                // A few bytes anywhere, the header too.
                _ => (0..4).for_each(|_| {
                    let at = next() as usize % damaged.len();
                    damaged[at] = next() as u8;
                }),
            }
            std::fs::write(&path, &damaged).unwrap();
            // Opened or refused, either way without a panic.
            let _ = LogStore::open(&dir);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_open_is_refused_while_the_first_holds_the_log() {
        let dir = scratch("lock");
        let store = LogStore::open(&dir).unwrap();
        let error = LogStore::open(&dir).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::ResourceBusy);
        assert!(error.to_string().contains("another process has it open"), "{error}");
        drop(store);
        LogStore::open(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_or_fjall_wrote_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = scratch("refused");
        std::fs::create_dir_all(dir.join("keyspaces")).unwrap();
        std::fs::write(dir.join("version"), b"3").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let error = LogStore::open(&dir).err().unwrap();
        assert!(error.to_string().contains("written by fjall"), "{error}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = LogStore::open(&dir).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The journal's pattern on `store` and `model` alike: processes appending records,
    /// most removed whole once done.
    fn workload(store: &dyn Store, model: &MemoryStore, rounds: std::ops::Range<u64>) {
        for round in rounds {
            let mut batch = Batch::default();
            for process in 1 + round % 5..4 + round % 5 {
                let process = process + 10 * (round / 20);
                batch.puts.push((key(process, round), vec![round as u8; 40 + (round % 7) as usize]));
            }
            // Every 20 rounds, the processes of the 20 before end, most of them removed.
            if round % 20 == 19 {
                let base = 10 * (round / 20);
                batch.removals.extend((base + 1..base + 7).map(|process| (process, round + 1)));
            }
            store.commit(&batch, round % 2 == 0).unwrap();
            model.commit(&batch, true).unwrap();
        }
    }

    #[test]
    fn segments_roll_and_compact_without_losing_a_record() {
        let dir = scratch("compact");
        let model = MemoryStore::new();
        let store = LogStore::open_with(&dir, small()).unwrap();
        workload(&store, &model, 0..2_000);
        store.wait_for_compaction();
        assert_eq!(contents(&store), contents(&model));
        let segments = files(&dir).iter().filter(|f| f.ends_with(".log")).count();
        let total: u64 = store.inner.writer.lock().sizes.values().sum();
        // 2,000 commits of 3 records of about 60 bytes: about 430 KiB written, in 108
        // segments uncompacted.
        assert!(total < 128 << 10 && segments < 40, "{segments} segments of {total} bytes: {:?}", files(&dir));
        drop(store);
        let store = LogStore::open_with(&dir, small()).unwrap();
        assert_eq!(contents(&store), contents(&model));
        workload(&store, &model, 2_000..2_500);
        drop(store);
        assert_eq!(contents(&LogStore::open(&dir).unwrap()), contents(&model));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_compaction_stopped_after_any_step_loses_no_record() {
        let steps = [
            Step::HalfWritten,
            Step::Written,
            Step::Synced,
            Step::Renamed,
            Step::DirSynced,
            Step::DeletedOne,
            Step::Done,
        ];
        for step in steps {
            let dir = scratch(&format!("compact-{step:?}"));
            let model = MemoryStore::new();
            // Never compacted on its own: the test runs the compaction's steps.
            let limits = Limits { compact_at: u64::MAX, ..small() };
            let store = LogStore::open_with(&dir, limits).unwrap();
            workload(&store, &model, 0..300);
            let job = {
                let mut writer = store.inner.writer.lock();
                let records = store.inner.index.read().snapshot();
                writer.begin_compaction(records).unwrap()
            };
            assert!(job.superseded.len() >= 2, "{step:?}: {:?}", job.superseded);
            // Commits go on into the next segment while the snapshot is written.
            workload(&store, &model, 300..320);
            let (reached, _) = write_snapshot(&dir, &job, step).unwrap();
            assert_eq!(reached, step);
            // The host dies here: only the disk is left.
            drop(store);
            let store = LogStore::open_with(&dir, limits).unwrap();
            assert_eq!(contents(&store), contents(&model), "stopped after {step:?}");
            let left = files(&dir);
            assert!(left.iter().all(|f| !f.ends_with(".tmp")), "{step:?}: {left:?}");
            let snapshot = segment_path(&dir, job.number).file_name().unwrap().to_str().unwrap().to_owned();
            let renamed = !matches!(step, Step::HalfWritten | Step::Written | Step::Synced);
            assert_eq!(left.contains(&snapshot), renamed, "{step:?}: {left:?}");
            if renamed {
                for number in &job.superseded {
                    assert!(!segment_path(&dir, *number).exists(), "{step:?}: {number} left: {left:?}");
                }
            }
            workload(&store, &model, 320..340);
            drop(store);
            assert_eq!(contents(&LogStore::open(&dir).unwrap()), contents(&model), "stopped after {step:?}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn leftovers_of_a_new_segment_are_removed_and_its_number_not_reused() {
        let dir = scratch("leftovers");
        let store = LogStore::open(&dir).unwrap();
        store.commit(&puts(&[(1, 0, "a")]), true).unwrap();
        drop(store);
        std::fs::write(tmp_path(&dir, 7), b"half a header").unwrap();
        let store = LogStore::open(&dir).unwrap();
        assert_eq!(files(&dir), vec!["0000000000000001.log", "log.lock"]);
        assert_eq!(store.inner.writer.lock().next, 8);
        assert_eq!(contents(&store).len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
