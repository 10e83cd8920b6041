//! Counters: one slot per worker (and one for every other thread), summed into [`Stats`]
//! on demand.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use wasmproc_types::Pid;

use crate::step::CommandKind;

/// Scheduler counters; see [`Handle::stats`](super::Handle::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Per worker, in worker order.
    pub workers: Vec<WorkerStats>,
    /// Processes in the global queue now.
    pub global_queue: usize,
    /// Processes alive now.
    pub live: usize,
    /// The most processes alive at once so far.
    pub peak_live: usize,
    /// Processes spawned (init succeeded).
    pub spawned: u64,
    /// Processes that ended, by themselves or terminated.
    pub completed: u64,
    /// Yields dispatched (granted and known).
    pub yields: u64,
    /// The same, by command.
    pub yields_by_command: YieldCounts,
    /// Messages delivered to mailboxes.
    pub messages: u64,
    /// Messages that were in a mailbox when its process ended, never read.
    pub undelivered: u64,
    /// Times a process about to wait gave memory back because its worker had nothing
    /// else to run (see `Process::hibernate`; for a Wasm process, its fiber stack's
    /// resident pages).
    pub hibernated: u64,
    /// Durable processes suspended now: counted in [`Stats::live`], they hold no
    /// process in memory until their next event brings them back from their journal
    /// (see `Builder::suspend_after`).
    pub suspended: usize,
    /// Times a durable process was suspended.
    pub suspensions: u64,
    /// Times a suspended process was brought back (successfully or not).
    pub returns: u64,
    /// Processes that failed (an error result, a trap, a limit, a termination) when no
    /// one was told: no monitor, no waiting parent, no handle of the embedder's. A
    /// process whose `init` failed is not counted (its spawner was told), nor one
    /// suspended by a durable scheduler's stop.
    pub unobserved_failures: u64,
    /// Some of those failures with their errors (each cut at 1 KiB), at most 8, sorted by
    /// pid: the first ones each worker counted, so the first of all when one worker ran
    /// them.
    pub first_unobserved: Vec<(Pid, String)>,
}

/// How many [`Stats::first_unobserved`] failures are kept: a few to show, bounded so that
/// a run where every process fails holds no more. Picked for a summary line; not a
/// tuning knob.
pub(super) const UNOBSERVED_KEPT: usize = 8;

/// How much of an unobserved failure's error is kept: an error is a guest's payload, up
/// to the payload limit. Picked for a summary line.
pub(super) const UNOBSERVED_ERROR_LEN: usize = 1024;

/// Yields dispatched, by command; see [`Stats::yields_by_command`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct YieldCounts {
    /// `sleep` commands.
    pub sleep: u64,
    /// `spawn` commands.
    pub spawn: u64,
    /// `send` commands (not sends made through a port, which are no yields).
    pub send: u64,
    /// `monitor` commands.
    pub monitor: u64,
    /// `terminate` commands.
    pub terminate: u64,
    /// `link` commands.
    pub link: u64,
    /// `unlink` commands.
    pub unlink: u64,
    /// `demonitor` commands.
    pub demonitor: u64,
    /// `exit` commands (exit signals).
    pub exit: u64,
    /// `trap-exits` commands.
    pub trap_exits: u64,
    /// Custom commands, whatever their names.
    pub custom: u64,
}

impl YieldCounts {
    /// The counts by command name, the built-ins in the order `--help` lists them, then
    /// `custom`: for printing them all.
    pub fn by_name(&self) -> [(&'static str, u64); CommandKind::ALL.len()] {
        CommandKind::ALL.map(|kind| (kind.name(), self.get(kind)))
    }

    fn get(&self, kind: CommandKind) -> u64 {
        match kind {
            CommandKind::Sleep => self.sleep,
            CommandKind::Spawn => self.spawn,
            CommandKind::Send => self.send,
            CommandKind::Monitor => self.monitor,
            CommandKind::Terminate => self.terminate,
            CommandKind::Link => self.link,
            CommandKind::Unlink => self.unlink,
            CommandKind::Demonitor => self.demonitor,
            CommandKind::Exit => self.exit,
            CommandKind::TrapExits => self.trap_exits,
            CommandKind::Custom => self.custom,
        }
    }
}

/// One worker's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Steps run.
    pub executed: u64,
    /// Successful steals from other workers.
    pub steals: u64,
    /// Processes taken by those steals.
    pub stolen: u64,
}

/// Counters of one worker (or, in the last slot, of every other thread). Relaxed: they
/// order nothing and are only summed for [`Stats`]. A worker's own slot has one writer,
/// so it is bumped with a plain load and store instead of a locked read-modify-write;
/// the shared last slot uses `fetch_add`.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) steps: AtomicU64,
    pub(super) steals: AtomicU64,
    pub(super) stolen: AtomicU64,
    pub(super) spawned: AtomicU64,
    pub(super) completed: AtomicU64,
    /// Indexed by [`CommandKind::slot`].
    pub(super) yields: [AtomicU64; CommandKind::ALL.len()],
    pub(super) messages: AtomicU64,
    pub(super) undelivered: AtomicU64,
    pub(super) hibernated: AtomicU64,
    pub(super) suspensions: AtomicU64,
    pub(super) returns: AtomicU64,
    pub(super) unobserved: AtomicU64,
    /// The first [`UNOBSERVED_KEPT`] failures this slot counted in `unobserved`. A lock:
    /// taken only when a process fails unobserved (rare), or to read [`Stats`].
    pub(super) first_unobserved: Mutex<Vec<(Pid, String)>>,
}

impl Counters {
    /// Called by the worker that owns this slot.
    pub(super) fn record_hibernation(&self) {
        bump(&self.hibernated, 1, true);
    }

    /// Called by the worker that owns this slot.
    pub(super) fn record_suspension(&self) {
        bump(&self.suspensions, 1, true);
    }

    /// Called by the worker that owns this slot.
    pub(super) fn record_return(&self) {
        bump(&self.returns, 1, true);
    }

    /// Called by the worker that owns this slot.
    pub(super) fn record_step(&self) {
        bump(&self.steps, 1, true);
    }

    /// Called by the worker that owns this slot.
    pub(super) fn record_steal(&self, stolen: u64) {
        bump(&self.steals, 1, true);
        bump(&self.stolen, stolen, true);
    }
}

pub(super) fn bump(counter: &AtomicU64, n: u64, single_writer: bool) {
    if single_writer {
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    } else {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
