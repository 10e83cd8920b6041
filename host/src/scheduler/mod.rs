//! The work-stealing process scheduler and the interface of the processes it runs.
//!
//! Build a [`Scheduler`] with [`Scheduler::builder`]; spawn and message processes through
//! its [`Handle`]; each process gets a [`Port`] at `init`. The [`Process`] trait and the
//! values of a step ([`Event`], [`StepOutput`], [`Command`]…) are re-exported at the crate
//! root.
//!
//! # Inside, one concern a file
//!
//! - `process.rs`: the [`Process`] trait; what flows into and out of a step
//!   ([`Event`], [`Command`], [`Status`]…) and the [`Capabilities`] a process yields under
//!   are defined below the scheduler (the crate's `step.rs` and `caps.rs`), so that the
//!   journal records them without naming the scheduler;
//! - `state.rs`: the per-process state word and the wakeup protocol (read it first);
//! - `cell.rs`: one process as the scheduler holds it, and the worker's turn (the loom
//!   models live here);
//! - `inbox.rs`: the per-process inbox (MPSC event queue, mailbox bound, watchers);
//! - `worker.rs`: the worker loop (local deque, global injector, stealing, hibernation);
//! - `idle.rs`: searching and parked workers;
//! - `shared.rs`: what every thread of a scheduler shares, and queueing a process;
//! - `port.rs`: a process's own way out, the path every message takes;
//! - `lifecycle.rs`: spawn, send, monitor, terminate, retire, drain;
//! - `dispatch.rs`: carrying out yields, and the embedder's
//!   [`Handler`](crate::handler::Handler)s and [`Factory`](crate::handler::Factory)s;
//! - `completer.rs`: answering a yield, now or later; `timer.rs`: the `sleep` command;
//! - `requests.rs`: commands a process serves ([`Handle::forward`], [`Port::respond`]);
//! - `limits.rs`: per-process limits and tree counts; `registry.rs`: pid → process;
//! - `remote.rs`: what names a process of another node goes to the cluster;
//! - `durable.rs`: a journal's write-ahead of steps; `recovery.rs`: resuming from it
//!   (the records, reading them back and the journal's public API are
//!   [`crate::journal`]'s: the scheduler imports the journal, never the other way);
//! - `builder.rs`, `handle.rs`, `stats.rs`: the public API around [`Scheduler`];
//! - this file: the [`Scheduler`] itself and its shutdown.
//!
//! # Shutdown
//!
//! [`Scheduler::stop`]:
//! 1. marks the scheduler stopping: every later spawn fails with
//!    [`SpawnError::Stopping`](crate::error::SpawnError::Stopping);
//! 2. sends [`Event::Cancel`] to every live process;
//! 3. waits until no process is left, or the grace period ends;
//! 4. then terminates whatever is left (repeating for processes whose spawn raced step 1)
//!    and waits for them: a process in the middle of a step ends when the step returns;
//! 5. shuts the workers and the timer down and joins their threads.
//!
//! So when `stop` returns no step is running, every process has been closed, and every
//! thread the scheduler started has exited. A durable scheduler suspends instead of 2–4.

mod builder;
pub(crate) use crate::caps;
mod cell;
pub(crate) mod completer;
pub(crate) mod dispatch;
mod durable;
mod handle;
mod hibernation;
mod idle;
mod inbox;
mod lifecycle;
mod limits;
mod port;
pub(crate) mod process;
mod recovery;
mod registry;
pub(crate) mod remote;
mod requests;
mod shared;
mod slot;
mod state;
mod stats;
mod timer;
mod worker;

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use self::builder::{
    Builder, DEFAULT_MAILBOX_BYTES, DEFAULT_MAILBOX_CAPACITY, DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DESCENDANTS,
    DEFAULT_MAX_PAYLOAD_SIZE, DEFAULT_MAX_PROCESSES, DEFAULT_MAX_YIELDS_PER_STEP, DEFAULT_OUTPUT_PER_PAYLOAD,
};
pub use self::caps::Capabilities;
use self::durable::SUSPENDED;
pub(crate) use self::durable::replaying_now;
pub use self::handle::{Handle, ProcessHandle, SpawnOptions, Spawnable};
#[cfg(feature = "wasm")]
pub(crate) use self::limits::{output_limit_exceeded, payload_limit_exceeded, yield_limit_exceeded};
pub use self::port::Port;
use self::process::Pid;
pub use self::process::{Command, Event, Events, Outcome, Process, SpawnRequest, Status, StepOutput, Yield};
pub use self::stats::{Stats, WorkerStats, YieldCounts};

/// The scheduler: owns the worker threads. Dropping it stops it with no grace period
/// (see [`Scheduler::stop`]).
///
/// Processes are spawned and messaged through its [`Handle`] ([`Scheduler::handle`]),
/// which can be cloned and used from any thread; the scheduler itself only starts and
/// stops.
pub struct Scheduler {
    handle: Handle,
    threads: Mutex<Option<Threads>>,
    /// The processes the embedder had spawned that were resumed from the journal.
    resumed: Mutex<Vec<ProcessHandle>>,
    /// What `Builder::verify_journal` found.
    verdicts: Mutex<Vec<(Pid, Result<usize, String>)>>,
}

struct Threads {
    workers: Vec<JoinHandle<()>>,
    timer: JoinHandle<()>,
}

/// What [`Scheduler::stop`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StopReport {
    /// Processes that were sent a cancel.
    pub cancelled: usize,
    /// Processes still alive at the deadline, terminated.
    pub forced: usize,
    /// How long the stop took.
    pub elapsed: Duration,
}

impl Scheduler {
    /// A builder with default settings.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// The processes the embedder had spawned that were resumed from the journal at
    /// build, with their children (taken: empty the second time).
    pub fn resumed(&self) -> Vec<ProcessHandle> {
        std::mem::take(&mut *self.resumed.lock())
    }

    /// A handle to spawn and message processes from anywhere.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the scheduler: cancels every process, gives them `grace` to finish,
    /// terminates the rest, and joins every thread. See the module docs, "Shutdown".
    /// A second call returns at once with an empty report.
    ///
    /// A durable scheduler (one with a journal) suspends its processes instead: each
    /// ends here, at its next turn, with the error "suspended: …" and no recorded exit,
    /// and resumes where its journal left it when a scheduler is built on the journal
    /// again. Nothing is cancelled and `grace` is not waited for. `forced` counts them.
    ///
    /// A native process whose step never returns keeps `stop` from returning: steps are
    /// not preemptible from outside (Wasm steps are: terminating a preempted one drops it).
    ///
    /// # Panics
    ///
    /// If called from one of this scheduler's own worker threads (it would wait for
    /// itself).
    pub fn stop(&self, grace: Duration) -> StopReport {
        let shared = &self.handle.shared;
        assert!(
            worker::current_index(shared.id).is_none(),
            "`Scheduler::stop` called from one of its own worker threads"
        );
        let mut threads = self.threads.lock();
        let Some(taken) = threads.take() else { return StopReport::default() };
        let start = Instant::now();
        shared.stopping.store(true, Ordering::SeqCst);

        // Durable processes are suspended at once, not cancelled: see `Scheduler::stop`.
        let durable = shared.durable.is_some();
        shared.suspending.store(durable, Ordering::SeqCst);
        let cancelled = if durable { 0 } else { self.handle.cancel_all("shutdown") };
        let mut forced = 0;
        if durable || !shared.wait_drained(Some(start + grace)) {
            // Spawns that passed the stopping check before it was set may still be
            // registering: sweep until nothing is left.
            let reason = if durable { SUSPENDED } else { "terminated: shutdown deadline exceeded" };
            loop {
                forced += self.handle.terminate_all(reason);
                if shared.wait_drained(Some(Instant::now() + Duration::from_millis(50))) {
                    break;
                }
            }
        }

        shared.shut_down.store(true, Ordering::SeqCst);
        shared.idle.shutdown();
        shared.timer.shutdown();
        for thread in taken.workers {
            // A worker only panics on a broken scheduler invariant; the panic message has
            // been printed by then and there is nothing left to clean up here.
            let _ = thread.join();
        }
        let _ = taken.timer.join();
        if let Some(durable) = &shared.durable {
            durable.shut_down();
        }
        StopReport { cancelled, forced, elapsed: start.elapsed() }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if !std::thread::panicking() || worker::current_index(self.handle.shared.id).is_none() {
            self.stop(Duration::ZERO);
        }
    }
}
