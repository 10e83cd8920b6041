//! The state every thread of one scheduler shares (its workers, the timer, handles and
//! completers), and how a `Ready` process gets into a run queue.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_deque::{Injector, Stealer};
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;
use wasmproc_types::Pid;

use super::caps::Capabilities;
use super::cell::ProcessCell;
use super::commands::Registered;
use super::durable::Durable;
use super::hibernation::Hibernating;
use super::idle::Idle;
use super::kinds::Kinds;
use super::registry::Registry;
use super::remote::Remote;
use super::requests::Requests;
use super::retry::Retry;
use super::slot::Slot;
use super::stats::{Counters, Stats, UNOBSERVED_ERROR_LEN, UNOBSERVED_KEPT, WorkerStats, YieldCounts, bump};
use super::suspension::Suspending;
use super::timer::Timer;
use super::worker;
use crate::handler::Completer;
use crate::limits::{Limits, RunId};
use crate::step::CommandKind;

/// State shared by the workers, the timer, handles and completers.
pub(super) struct Shared {
    /// Tells this scheduler's worker threads from another scheduler's in one OS process.
    pub(super) id: usize,
    pub(super) injector: Injector<Arc<ProcessCell>>,
    pub(super) stealers: Box<[Stealer<Arc<ProcessCell>>]>,
    /// Each worker's LIFO slot (see `worker.rs`, "The LIFO slot").
    pub(super) slots: Box<[CachePadded<Slot<ProcessCell>>]>,
    pub(super) idle: Idle,
    pub(super) registry: Registry<ProcessCell>,
    pub(super) counters: Box<[CachePadded<Counters>]>,
    pub(super) live: AtomicUsize,
    /// Processes that gave their place in `live` back but are still retiring (their
    /// watchers not yet told): "no process left" waits for them too.
    pub(super) retiring: AtomicUsize,
    /// Waiting processes that asked to hibernate (`Process::wants_hibernation`), for a
    /// worker that runs out of work once they are due (`hibernation.rs`). A
    /// process is listed at most once until it hibernates, so this holds at most one
    /// entry a live process, plus those of ended processes until they are pruned (see
    /// [`Shared::list_for_hibernation`]); the lock is taken once a listing, not once a
    /// step.
    pub(super) hibernating: Mutex<Hibernating>,
    /// Waiting durable processes to suspend once they have waited
    /// `Settings::suspend_after` (`suspension.rs`): at most one entry a live process.
    pub(super) to_suspend: Mutex<Suspending>,
    /// Processes suspended now (their cells' `suspended`).
    pub(super) suspended: AtomicUsize,
    pub(super) peak_live: AtomicUsize,
    pub(super) settings: Settings,
    /// Handlers registered under a command's own name: their places in `commands`.
    pub(super) handlers: FxHashMap<String, usize>,
    /// Handlers registered as `family.*`, by family: their places in `commands`.
    pub(super) families: FxHashMap<String, usize>,
    /// Every registered handler, fixed once built: a worker keeps places in it for the
    /// commands it has resolved (see `dispatch::Resolved`).
    pub(super) commands: Vec<Registered>,
    pub(super) kinds: Kinds,
    /// Commands handed to processes to answer ([`Handle::forward`](super::Handle::forward)).
    pub(super) requests: Requests,
    pub(super) timer: Timer<Completer>,
    /// The journal, if processes are durable.
    pub(super) durable: Option<Durable>,
    /// This scheduler's node in a cluster (0 outside one): the node of every pid it makes.
    pub(super) node: u16,
    /// Where work for processes of other nodes goes (see `remote.rs`); `None` outside a
    /// cluster.
    pub(super) remote: Option<Arc<dyn Remote>>,
    /// The live-process counts of the runs of other nodes that bound them (a remote
    /// spawn's `max_processes`), by run: held by the runs' processes, so an entry whose
    /// run has no process here left is dead, and pruned when a run is added.
    pub(super) run_processes: Mutex<FxHashMap<RunId, Weak<AtomicUsize>>>,
    /// How durable roots' traps are retried (`Builder::retry`).
    pub(super) retry: Option<Retry>,
    /// A durable scheduler is stopping: its processes are suspended, not ended (their
    /// exits are not recorded, so the next start with the journal resumes them).
    pub(super) suspending: AtomicBool,
    pub(super) stopping: AtomicBool,
    pub(super) shut_down: AtomicBool,
    pub(super) drained_lock: Mutex<()>,
    pub(super) drained: Condvar,
}

/// What [`Builder::build`](super::Builder::build) checked, as the running scheduler reads it.
pub(super) struct Settings {
    pub(super) workers: usize,
    pub(super) max_processes: usize,
    pub(super) mailbox_capacity: usize,
    pub(super) mailbox_bytes: usize,
    pub(super) turn_budget: u32,
    /// How long a durable process waits before it is suspended; `None`: never, and
    /// always without a journal (`Builder::suspend_after`).
    pub(super) suspend_after: Option<std::time::Duration>,
    pub(super) capabilities: Arc<Capabilities>,
    pub(super) limits: Limits,
    pub(super) denial_hint: Option<DenialHint>,
}

/// How to grant a command, for the error of a process that was denied it.
pub(super) type DenialHint = Box<dyn Fn(&str) -> String + Send + Sync>;

impl Shared {
    /// The bound of a tree spawned under `quota`, with this scheduler's own limits.
    pub(super) fn quota_bound(&self, quota: &crate::limits::ProcessQuota) -> crate::limits::RunBound {
        let settings = &self.settings;
        crate::limits::RunBound::quota(quota, &settings.limits, settings.mailbox_capacity, settings.mailbox_bytes)
    }

    /// The limits `cell` runs under: its run's, if its run set them (see `remote.rs`),
    /// else this scheduler's.
    #[inline]
    pub(super) fn limits_of<'a>(&'a self, cell: &'a ProcessCell) -> &'a Limits {
        cell.lineage.run_bound().map_or(&self.settings.limits, |bound| &bound.limits)
    }

    /// Queues a `Ready` process: in this worker's LIFO slot when called from one of our
    /// workers (the process it just woke or spawned is likely to share its cache; the
    /// slot's previous occupant moves to the local deque), otherwise on the global queue.
    ///
    /// A process put in an empty slot wakes no other worker: this worker takes it as soon
    /// as its current turn ends, and waking a sleeper to steal it would cost a futex call
    /// and move the process (and, in a request-reply pair, both processes) to another
    /// core. Only a process moved to the deque is new work for others, worth a wake.
    pub(super) fn schedule(&self, cell: Arc<ProcessCell>) {
        match worker::push_local(self, cell) {
            Ok(worker::Pushed::Alone) => {}
            Ok(worker::Pushed::Behind) => self.idle.notify_one(),
            Err(cell) => {
                self.injector.push(cell);
                self.idle.notify_one();
            }
        }
    }

    /// Queues a `Ready` process behind everything already waiting.
    pub(super) fn schedule_global(&self, cell: Arc<ProcessCell>) {
        self.injector.push(cell);
        self.idle.notify_one();
    }

    pub(super) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Whether any process waits in the global queue or a worker's deque: work a worker
    /// about to park could take. The LIFO slots are not looked at: their owners take them
    /// after the step they are in (see `worker.rs`).
    pub(super) fn has_queued_work(&self) -> bool {
        !self.injector.is_empty() || self.stealers.iter().any(|s| !s.is_empty())
    }

    /// Whether any process waits to run at all, in a queue or a LIFO slot: a long step
    /// should give its worker back ([`Port::should_yield`](super::Port::should_yield)).
    pub(super) fn has_waiting_work(&self) -> bool {
        self.has_queued_work() || self.slots.iter().any(|slot| !slot.is_empty())
    }
}

/// The counters (see `stats.rs`): the thread's own slot, and their sum.
impl Shared {
    /// Adds `n` to one of this thread's counters: its worker's, or the shared slot for
    /// other threads.
    pub(super) fn count(&self, counter: fn(&Counters) -> &AtomicU64, n: u64) {
        match worker::current_index(self.id) {
            Some(index) => bump(counter(&self.counters[index]), n, true),
            None => bump(counter(&self.counters[self.settings.workers]), n, false),
        }
    }

    /// Counts one dispatched yield of `kind`.
    pub(super) fn count_yield(&self, kind: CommandKind) {
        let slot = kind.slot();
        match worker::current_index(self.id) {
            Some(index) => bump(&self.counters[index].yields[slot], 1, true),
            None => bump(&self.counters[self.settings.workers].yields[slot], 1, false),
        }
    }

    /// Counts a process that failed with no one told (see `retire`), keeping its error if
    /// this thread's slot has kept fewer than [`UNOBSERVED_KEPT`]. Called only on such a
    /// failure: a process that succeeds, or whose failure is heard, pays nothing here.
    pub(super) fn count_unobserved(&self, pid: Pid, error: &str) {
        self.count(|c| &c.unobserved, 1);
        let slot = worker::current_index(self.id).unwrap_or(self.settings.workers);
        let mut first = self.counters[slot].first_unobserved.lock();
        if first.len() < UNOBSERVED_KEPT {
            let mut end = error.len().min(UNOBSERVED_ERROR_LEN);
            while !error.is_char_boundary(end) {
                end -= 1;
            }
            first.push((pid, error[..end].to_owned()));
        }
    }

    /// Sums the counters; see [`Handle::stats`](super::Handle::stats).
    pub(super) fn stats(&self) -> Stats {
        let workers = self.counters[..self.settings.workers]
            .iter()
            .map(|c| WorkerStats {
                executed: c.steps.load(Ordering::Relaxed),
                steals: c.steals.load(Ordering::Relaxed),
                stolen: c.stolen.load(Ordering::Relaxed),
            })
            .collect();
        let sum = |f: fn(&Counters) -> &AtomicU64| -> u64 {
            self.counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
        };
        let counted = |kind: CommandKind| -> u64 {
            self.counters.iter().map(|c| c.yields[kind.slot()].load(Ordering::Relaxed)).sum()
        };
        Stats {
            workers,
            global_queue: self.injector.len(),
            live: self.live.load(Ordering::Acquire),
            peak_live: self.peak_live.load(Ordering::Relaxed),
            spawned: sum(|c| &c.spawned),
            completed: sum(|c| &c.completed),
            yields: CommandKind::ALL.into_iter().map(counted).sum(),
            yields_by_command: YieldCounts {
                sleep: counted(CommandKind::Sleep),
                spawn: counted(CommandKind::Spawn),
                send: counted(CommandKind::Send),
                monitor: counted(CommandKind::Monitor),
                terminate: counted(CommandKind::Terminate),
                link: counted(CommandKind::Link),
                unlink: counted(CommandKind::Unlink),
                demonitor: counted(CommandKind::Demonitor),
                exit: counted(CommandKind::Exit),
                trap_exits: counted(CommandKind::TrapExits),
                custom: counted(CommandKind::Custom),
            },
            messages: sum(|c| &c.messages),
            undelivered: sum(|c| &c.undelivered),
            hibernated: sum(|c| &c.hibernated),
            suspended: self.suspended.load(Ordering::Relaxed),
            suspensions: sum(|c| &c.suspensions),
            returns: sum(|c| &c.returns),
            unobserved_failures: sum(|c| &c.unobserved),
            first_unobserved: self.first_unobserved(),
        }
    }

    /// The slots' kept failures: [`UNOBSERVED_KEPT`] of them, sorted by pid for a stable
    /// order.
    fn first_unobserved(&self) -> Vec<(Pid, String)> {
        let mut all: Vec<(Pid, String)> =
            self.counters.iter().flat_map(|c| c.first_unobserved.lock().clone()).collect();
        all.sort_by_key(|(pid, _)| *pid);
        all.truncate(UNOBSERVED_KEPT);
        all
    }
}
