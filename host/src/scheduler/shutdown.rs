//! The [`Scheduler`] itself: it owns the worker threads and the timer's, and stops them.
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

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmproc_types::{ExitReason, Pid};

use super::handle::Handle;
use super::lifecycle::suspended;
use super::process_handle::ProcessHandle;
use super::worker;
use crate::step::Exited;

/// The scheduler: owns the worker threads. Dropping it stops it with no grace period
/// (see [`Scheduler::stop`]).
///
/// Processes are spawned and messaged through its [`Handle`] ([`Scheduler::handle`]),
/// which can be cloned and used from any thread; the scheduler itself only starts and
/// stops.
pub struct Scheduler {
    pub(super) handle: Handle,
    pub(super) threads: Mutex<Option<Threads>>,
    /// The processes the embedder had spawned that were resumed from the journal.
    pub(super) resumed: Mutex<Vec<ProcessHandle>>,
    /// What `Builder::verify_journal` found.
    pub(super) verdicts: Mutex<Vec<(Pid, Result<usize, String>)>>,
}

pub(super) struct Threads {
    pub(super) workers: Vec<JoinHandle<()>>,
    pub(super) timer: JoinHandle<()>,
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
            // Suspended, or killed: the process ignored the cancel until the deadline.
            let reason = if durable { suspended() } else { Exited::new(ExitReason::Killed) };
            loop {
                forced += self.handle.end_all(&reason);
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
