//! Where the journal's records live: the [`Store`] trait, [`MemoryStore`], and
//! [`FjallStore`] (an embedded log-structured store), the default before
//! [`LogStore`](super::LogStore) (see `docs/perf/journal-store.md` for
//! the measurements that chose each).

use std::io;
use std::ops::ControlFlow;
use std::path::Path;

/// A record's key: the process it belongs to and its place in that process's history.
/// Keys order by process, then sequence, so one process's records are contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The process (its pid as a number); 0 holds the journal's own metadata.
    pub process: u64,
    /// The record's place in its process's history, from 0.
    pub seq: u64,
}

impl Key {
    fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.process.to_be_bytes());
        bytes[8..].copy_from_slice(&self.seq.to_be_bytes());
        bytes
    }

    fn from_bytes(bytes: &[u8]) -> io::Result<Key> {
        let bytes: [u8; 16] = bytes.try_into().map_err(|_| damaged("a key is not 16 bytes"))?;
        let (process, seq) = bytes.split_at(8);
        Ok(Key {
            process: u64::from_be_bytes(process.try_into().expect("8 bytes")),
            seq: u64::from_be_bytes(seq.try_into().expect("8 bytes")),
        })
    }
}

/// What one group commit writes: every put and every removal, applied all or nothing.
#[derive(Debug, Default)]
pub struct Batch {
    /// Records to write (a key written again is replaced).
    pub puts: Vec<(Key, Vec<u8>)>,
    /// Records to remove: every record of a process below a sequence number, as
    /// (process, number of records). The journal knows how many records a process has,
    /// so a store deletes them without reading them first.
    pub removals: Vec<(u64, u64)>,
}

impl Batch {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.removals.is_empty()
    }

    /// Bytes of record values in the batch.
    pub fn bytes(&self) -> usize {
        self.puts.iter().map(|(_, value)| value.len()).sum()
    }
}

/// A journal's storage: an ordered map from [`Key`] to bytes with atomic batches.
///
/// The contract the journal relies on:
/// - [`Store::commit`] applies a whole batch or none of it, also across a crash;
/// - with `sync`, the batch survives a machine crash once `commit` returns (`fsync` or
///   its equivalent); without, it survives a crash of the process only;
/// - a commit that fails leaves earlier commits intact; the journal stops using the
///   store after one (it cannot know what the failed one left).
pub trait Store: Send + Sync + 'static {
    /// Writes `batch` atomically; durable on return when `sync`.
    ///
    /// # Errors
    ///
    /// The store's I/O error; nothing of the batch may be assumed written.
    fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()>;

    /// Visits every record in key order, from `from` on, until `visit` breaks.
    ///
    /// # Errors
    ///
    /// The store's I/O error, or damage found while reading.
    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()>;

    /// How many commits may be in flight at once through [`Store::begin`]: begun, their
    /// outcome not yet taken by [`Store::finish`]. Read before every `begin`, so a store
    /// may lower it for a while (to 1: wait for every commit in flight before the next).
    fn depth(&self) -> usize {
        1
    }

    /// Begins writing `batch`, after every batch begun before it, and calls `done` (on
    /// any thread, exactly once) when its outcome is known; [`Store::finish`] then takes
    /// that outcome without waiting. The caller finishes what it began in the order it
    /// began it. A store of depth 1 commits before it returns.
    ///
    /// A batch begun after one that fails is never written without it: the store refuses
    /// it, or writes it after the earlier one once that one is written after all.
    fn begin(&self, batch: &Batch, sync: bool, done: Done) -> Began {
        let outcome = self.commit(batch, sync);
        done.call();
        Began(Box::new(outcome))
    }

    /// The outcome of a commit [`Store::begin`] began, once its `done` was called.
    ///
    /// # Errors
    ///
    /// As [`Store::commit`]: nothing of the batch may be assumed written.
    fn finish(&self, began: Began) -> io::Result<()> {
        match began.0.downcast::<io::Result<()>>() {
            Ok(outcome) => *outcome,
            Err(_) => Err(io::Error::other("a commit was finished by a store that did not begin it")),
        }
    }
}

/// A commit [`Store::begin`] began: what its store needs to finish it.
pub struct Began(pub Box<dyn std::any::Any + Send>);

/// What a store calls once a begun commit's outcome is known: see [`Store::begin`].
pub struct Done(Box<dyn FnOnce() + Send>);

impl Done {
    /// `tell`, to be called once.
    pub fn new(tell: impl FnOnce() + Send + 'static) -> Done {
        Done(Box::new(tell))
    }

    /// Says the outcome is known.
    pub fn call(self) {
        (self.0)();
    }
}

/// A store in memory: for tests, and for tools that read a journal's copy. Nothing
/// survives the process, whatever `sync` says.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: parking_lot::Mutex<std::collections::BTreeMap<Key, Vec<u8>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Records held now.
    pub fn len(&self) -> usize {
        self.records.lock().len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.lock().is_empty()
    }

    /// A copy of what it holds now.
    pub fn snapshot(&self) -> MemoryStore {
        MemoryStore { records: parking_lot::Mutex::new(self.records.lock().clone()) }
    }
}

impl Store for MemoryStore {
    fn commit(&self, batch: &Batch, _sync: bool) -> io::Result<()> {
        let mut records = self.records.lock();
        for &(process, count) in &batch.removals {
            let doomed: Vec<Key> =
                records.range(Key { process, seq: 0 }..Key { process, seq: count }).map(|(k, _)| *k).collect();
            for key in doomed {
                records.remove(&key);
            }
        }
        records.extend(batch.puts.iter().cloned());
        Ok(())
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        for (key, value) in self.records.lock().range(from..) {
            if visit(*key, value).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// A shared store: the journal and its owner (a test, a tool) can both hold it.
impl<S: Store> Store for std::sync::Arc<S> {
    fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()> {
        (**self).commit(batch, sync)
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        (**self).scan(from, visit)
    }

    fn depth(&self) -> usize {
        (**self).depth()
    }

    fn begin(&self, batch: &Batch, sync: bool, done: Done) -> Began {
        (**self).begin(batch, sync, done)
    }

    fn finish(&self, began: Began) -> io::Result<()> {
        (**self).finish(began)
    }
}

/// A [`Store`] in a [fjall](https://docs.rs/fjall) database in a directory of its own. Its
/// write-ahead log checksums every batch and, on opening, drops a torn tail back to the
/// last whole batch. [`Journal::open`](super::Journal::open) opens a directory it wrote
/// with it; a new one gets a [`LogStore`](super::LogStore), which commits faster
/// (`docs/perf/durable.md`).
pub struct FjallStore {
    db: fjall::Database,
    records: fjall::Keyspace,
}

impl FjallStore {
    /// Opens the database in `dir`, creating it if it does not exist. The directory must
    /// be private as [`Journal::open`](super::Journal::open) says, and what is in it is
    /// made so.
    ///
    /// # Errors
    ///
    /// The directory cannot be created or read, is not private to this user, or holds a
    /// damaged database.
    pub fn open(dir: &Path) -> io::Result<FjallStore> {
        super::private_dir(dir, "the journal", "a journal decides what its processes resume with")?;
        let db = fjall::Database::builder(dir).open().map_err(from_fjall)?;
        // Small memtables are flushed to tables often, so that opening after a crash
        // replays little of fjall's own log: at fjall's default of 64 MiB, a journal of
        // 10,000 processes of 100 steps took 2 s to open, at 8 MiB a tenth of that.
        let options = || fjall::KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_SIZE);
        let records = db.keyspace("records", options).map_err(from_fjall)?;
        super::private_contents(dir)?;
        Ok(FjallStore { db, records })
    }
}

impl Store for FjallStore {
    fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()> {
        // `SyncAll`: `fdatasync` alone may not persist a journal file's new length.
        let mut write = self.db.batch().durability(Some(if sync {
            fjall::PersistMode::SyncAll
        } else {
            fjall::PersistMode::Buffer
        }));
        for &(process, count) in &batch.removals {
            for seq in 0..count {
                write.remove(&self.records, Key { process, seq }.to_bytes());
            }
        }
        for (key, value) in &batch.puts {
            write.insert(&self.records, key.to_bytes(), value.as_slice());
        }
        write.commit().map_err(from_fjall)
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        for record in self.records.range(from.to_bytes()..) {
            let (key, value) = record.into_inner().map_err(from_fjall)?;
            if visit(Key::from_bytes(&key)?, &value).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// The size at which fjall flushes a memtable to a table (see [`FjallStore::open`]).
const MEMTABLE_SIZE: u64 = 8 << 20;

fn from_fjall(error: fjall::Error) -> io::Error {
    match error {
        fjall::Error::Io(error) => error,
        fjall::Error::Locked => io::Error::new(
            io::ErrorKind::ResourceBusy,
            "another process has it open (one host at a time can use a journal)",
        ),
        other => io::Error::other(other.to_string()),
    }
}

fn damaged(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("damaged journal: {what}"))
}
