//! The journal of durable processes: every process's history, written ahead of its
//! effects, so the processes outlive their host.
//!
//! A scheduler built with a [`Journal`] ([`Builder::journal`](crate::scheduler::Builder::journal))
//! makes every process durable. Its records, one sequence a process:
//!
//! 1. the spawn: the kind, entry method, input, parent and grants;
//! 2. each step: the events it was given, the commands it yielded (with their tags) and
//!    the messages it sent through its port, and the status it ended with;
//! 3. its exit, with its result.
//!
//! # Guarantees
//!
//! **Write-ahead.** Nothing leaves a step before its record is committed: its commands are
//! dispatched, its messages delivered and its result reported only once the group its
//! record belongs to has been written (with [`Durability::Sync`], synced). So whatever
//! another process, a handler or the embedder has seen of a process is in the journal.
//!
//! **Reads go on.** A step that sent nothing and yielded only commands that read
//! (`sleep`, and custom commands whose handler says [`Handler::reads_only`]: `time.now`,
//! `random.bytes`, `env.*`, `fs.read`, `kv.get`, …) has them carried out at once, without
//! waiting for its commit: their answers reach no one but the process, in its next steps,
//! whose records follow this one's; a crash that loses this record loses those steps too,
//! and the read runs again. A process that reads the time or sleeps between steps so
//! does not wait for the disk at each step. Its records still commit in order, and what
//! it then does that leaves it waits for them all. This holds while the committer has
//! fewer than a few thousand submissions in hand; past that, reads wait for their commit
//! like any command, so processes cannot outrun the store.
//!
//! [`Handler::reads_only`]: crate::handler::Handler::reads_only
//!
//! **Group commit.** Steps on every worker submit their records to one committer thread,
//! which writes all that is pending in one batch and one sync. A step does not hold its
//! worker while it waits: the worker runs other processes, and the step's effects happen
//! when its group is durable. [`JournalSettings::group_window`] makes the committer wait
//! a little for more to join a group. A group that nothing waits for (steps whose reads
//! went on, spawns, steps with no effect, removals) waits up to a millisecond for company
//! anyway: until something waited for joins it, or it holds a thousand submissions. That
//! makes fewer, larger syncs for processes that read; a crash meanwhile loses only steps
//! whose effects had not happened, which run again.
//!
//! **Recovery.** A scheduler built on a journal that holds unfinished processes resumes
//! them: each is made again by its kind under its recorded pid, replayed step by step
//! against its records (a step that differs fails it, naming the step), and what was in
//! flight is taken up again. See the README, "Durable processes", for what that means
//! for each command.
//!
//! **Failure.** A commit that fails stops the journal: the processes whose records it held
//! end with an error naming the failure (none of their effects happened), and every later
//! step of a durable process fails the same way. The failure is logged once, as an error.
//!
//! # On disk
//!
//! A [`Store`]: by default [`LogStore`], an append-only log in a directory of its own (one
//! frame, checksummed, a group commit; a torn last commit dropped on opening; compacted
//! on a thread of its own). [`Journal::open`] still opens a directory that
//! [`FjallStore`] wrote with fjall, the default before the log (see `docs/perf/journal-store.md`
//! for the measurements that chose each). Record keys are (process,
//! sequence); values start with [`FORMAT_VERSION`]. Process 0 holds the journal's own
//! metadata: the newest pid whose records were removed. Records are only appended and read back in order; a
//! snapshot of a process ([`Builder::snapshot_every`](crate::scheduler::Builder::snapshot_every))
//! is a record that replaces those before it, removed in the batch that writes it, so a
//! process's history begins with its spawn or with its last snapshot.
//!
//! # What the journal holds
//!
//! [`Journal::runs`] lists the runs it holds, finished or not ([`HeldRun`]), and
//! [`Journal::finished_runs`] those whose every process has ended ([`FinishedRun`]);
//! [`Journal::forget`] and [`Journal::forget_run`] remove one. [`Journal::history`] shows
//! every process's records as lines a person reads ([`History`]).
//!
//! # Inside, one concern a file
//!
//! - `record.rs`: a process's records and their encoding (spawn, step, message from the
//!   embedder, exit, snapshot), and what a snapshot carries for a recovery;
//! - `read.rs`: the one reader of the records, which every read below and a resume (the
//!   scheduler's `recovery.rs`) go through;
//! - `runs.rs`: the runs a journal holds, and removing them; `floor.rs`: the newest pid
//!   removed, which no later process is given; `history.rs`: the records as lines;
//! - `committer.rs`: the group commit; `store.rs`: the [`Store`] trait, [`MemoryStore`]
//!   and [`FjallStore`]; `log.rs`: [`LogStore`];
//! - this file: [`Journal`], its settings, and its directory.
//!
//! The journal names nothing of the scheduler's: the values it records are defined below
//! both (the crate's `step.rs`, `caps.rs` and `codec.rs`), and the scheduler's durable
//! processes (its `durable.rs` and `recovery.rs`) use the journal, never the other way.

mod committer;
mod floor;
mod history;
mod log;
mod now;
mod read;
mod record;
mod runs;
mod store;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::committer::{BUSY_WAIT, Committer, OnCommit};
pub use self::committer::{CommitError, CommitStats};
pub use self::history::History;
pub use self::log::{LOG_VERSION, LogStore};
pub use self::now::{PendingCommand, ProcessNow};
pub(crate) use self::read::{Decode, Recorded};
pub(crate) use self::record::{Carried, Record, SnapshotRecord, SpawnRecord, StepRecord, now_micros};
pub use self::runs::{FinishedRun, HeldRun};
pub use self::store::{Batch, Began, Done, FjallStore, Key, MemoryStore, Store};
pub use crate::codec::Malformed;

/// The first byte of every record value: a journal written by a later format is refused
/// rather than misread.
pub const FORMAT_VERSION: u8 = 2;

/// When a committed group is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Synced (`fsync`) before anything of the group takes effect: survives a crash of
    /// the machine.
    #[default]
    Sync,
    /// Handed to the operating system before anything of the group takes effect:
    /// survives a crash of the host process (a kill, a panic), not of the machine.
    Buffered,
}

/// How the journal commits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JournalSettings {
    /// When a commit is on disk. Default: [`Durability::Sync`].
    pub durability: Durability,
    /// How long the committer waits, after the first record of a group, for more to join
    /// it. Zero (the default) commits at once; what is submitted during a commit forms
    /// the next group either way, so groups grow with the load without any wait.
    pub group_window: Duration,
    /// The most records one process may have in the journal; a step past it ends the
    /// process with an error naming this limit. Default: 100,000.
    pub max_records_per_process: u64,
    /// Keep the records of finished processes. By default a process tree's records (a
    /// process the embedder spawned and everything it spawned) are removed once every
    /// process of the tree has ended and its root's result has been handed over, unless
    /// the tree sent messages outside itself: those trees are removed at the next start,
    /// once no message of theirs is waiting to be delivered again.
    pub keep_finished: bool,
    /// The host's cores are shared with other busy threads (a server's HTTP workers), so
    /// under load the scheduler leaves them more of the cores: after a group of 16
    /// records or more the next waits up to 1 ms to be as large (fewer syncs), and a
    /// worker out of work parks rather than stays on its core for a commit while more
    /// than 8 submissions are in flight. A journal that is not busy is unaffected. Where
    /// the scheduler has the cores to itself this only slows a busy journal. Default:
    /// false; `wasmproc serve` sets it.
    pub shared_cores: bool,
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            durability: Durability::Sync,
            group_window: Duration::ZERO,
            max_records_per_process: 100_000,
            keep_finished: false,
            shared_cores: false,
        }
    }
}

/// A journal: a store and how to commit to it. Give it to a scheduler's builder to make
/// its processes durable.
#[derive(Clone)]
pub struct Journal {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) settings: JournalSettings,
    /// The newest pid removed, as loaded (`floor.rs`).
    pub(crate) floor: Arc<parking_lot::Mutex<floor::Floor>>,
}

impl Journal {
    /// Opens (or creates) the journal in `dir`: a [`LogStore`], or, in a directory that
    /// [`FjallStore`] wrote (told by its files), that store.
    ///
    /// A journal decides what its processes are resumed with (their input, their grants,
    /// every event), so its directory must be this user's alone: it is created private
    /// (mode 0700), one that another user owns or can write to is refused, and one that
    /// others can only read is made private, with a warning. Its files are made 0600.
    ///
    /// # Errors
    ///
    /// The directory cannot be created or read, is not private to this user, is in use by
    /// another process, was written by an unknown version of the store's format, or holds
    /// a damaged store.
    pub fn open(dir: impl AsRef<Path>) -> std::io::Result<Journal> {
        let dir = dir.as_ref();
        private_dir(dir, "the journal", "a journal decides what its processes resume with")?;
        let store: std::io::Result<Arc<dyn Store>> = if written_by_fjall(dir) {
            FjallStore::open(dir).map(|store| Arc::new(store) as Arc<dyn Store>)
        } else {
            LogStore::open(dir).map(|store| Arc::new(store) as Arc<dyn Store>)
        };
        let store = store.and_then(|store| private_contents(dir).map(|()| store));
        let store = store.map_err(|error| {
            let hint = match error.kind() {
                std::io::ErrorKind::NotFound
                | std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::ResourceBusy
                | std::io::ErrorKind::Unsupported => "",
                // A torn tail is repaired on opening; what is left is damage that would
                // make a resumed run wrong.
                _ => " (it is damaged: move the directory aside to start afresh)",
            };
            std::io::Error::new(error.kind(), format!("cannot open the journal in {}{hint}: {error}", dir.display()))
        })?;
        Ok(Journal { store, settings: JournalSettings::default(), floor: Arc::default() })
    }

    /// A journal on `store`.
    pub fn with_store(store: impl Store) -> Journal {
        Journal { store: Arc::new(store), settings: JournalSettings::default(), floor: Arc::default() }
    }

    /// These settings instead of the defaults.
    pub fn settings(mut self, settings: JournalSettings) -> Journal {
        self.settings = settings;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

/// Creates `dir` private to this user (mode 0700), or checks that it is: owned by this
/// user, and writable by no one else (as ssh checks its files). A directory that others
/// can only read or enter is made private, and a warning says so: what it holds (every
/// input and message of a run, or a store's values) is as private as what writes it.
/// `what` names the directory's use in the refusal ("the journal"), and `why` says why
/// it must be private.
///
/// # Errors
///
/// The directory cannot be created or read, or it is not private (`PermissionDenied`).
pub(crate) fn private_dir(dir: &Path, what: &str, why: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    let refuse = |reason: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("refusing {what} in {}: {reason}", dir.display()),
        )
    };
    let meta = match std::fs::metadata(dir) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            // The mode given to `mkdir` is masked by the umask; set it exactly.
            return std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        other => other?,
    };
    if !meta.is_dir() {
        return Err(refuse("it is not a directory".to_owned()));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refuse(format!("it belongs to uid {}, not to this user (uid {me})", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "other users can write to it (mode {:o}): `chmod go-w` it, since {why}",
            meta.mode() & 0o777
        )));
    }
    if meta.mode() & 0o077 != 0 {
        let mode = meta.mode() & 0o777;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
        tracing::warn!(
            "other users could read {what} in {} (mode {mode:o}): made it private to this user (mode {:o})",
            dir.display(),
            mode & 0o700
        );
    }
    Ok(())
}

/// Makes what is in `dir` (a private directory, see [`private_dir`]) this user's alone:
/// regular files mode 0600 and directories 0700, at any depth; symbolic links are left
/// as they are and not followed. For a store whose files are made by a library with the
/// process's umask (fjall), once it has opened: the files it makes later are protected by
/// the directory's own mode.
///
/// # Errors
///
/// An entry cannot be read or changed.
pub(crate) fn private_contents(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let private = if meta.is_dir() {
            private_contents(&entry.path())?;
            0o700
        } else if meta.is_file() {
            0o600
        } else {
            continue;
        };
        if meta.mode() & 0o777 != private {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(private))?;
        }
    }
    Ok(())
}

/// Whether `dir` holds a journal that [`FjallStore`] wrote: fjall's `version` file and
/// `keyspaces` directory, which a [`LogStore`] never makes.
pub(crate) fn written_by_fjall(dir: &Path) -> bool {
    dir.join("version").is_file() && dir.join("keyspaces").is_dir()
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("settings", &self.settings).finish_non_exhaustive()
    }
}
