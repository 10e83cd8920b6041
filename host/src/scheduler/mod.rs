//! The work-stealing process scheduler, one concern a file:
//!
//! - `state.rs`: the per-process state word and the wakeup protocol (read it first);
//! - `cell.rs`: one process as the scheduler holds it, and the worker's turn (the loom
//!   models live here);
//! - `inbox.rs`: the per-process inbox (MPSC event queue, mailbox bound, watchers);
//! - `worker.rs`: the worker loop (local deque, global injector, stealing, hibernation);
//! - `idle.rs`: searching and parked workers;
//! - `shared.rs`: what every thread of a scheduler shares, and queueing a process;
//! - `lifecycle.rs`: spawn, send, monitor, terminate, retire, drain;
//! - `dispatch.rs`: carrying out yields, and the embedder's [`Handler`]s and [`Factory`]s;
//! - `completer.rs`: answering a yield, now or later; `timer.rs`: the `sleep` command;
//! - `limits.rs`: per-process limits and the process-tree counts they bound;
//! - `registry.rs`: pid → process routing;
//! - `builder.rs`, `handle.rs`, `stats.rs`: the public API around [`Scheduler`];
//! - this file: the [`Scheduler`] itself and its shutdown.
//!
//! # Shutdown
//!
//! [`Scheduler::stop`]:
//! 1. marks the scheduler stopping: every later spawn fails with
//!    [`SpawnError::Stopping`](crate::SpawnError::Stopping);
//! 2. sends [`Event::Cancel`](crate::Event::Cancel) to every live process;
//! 3. waits until no process is left, or the grace period ends;
//! 4. then terminates whatever is left (repeating for processes whose spawn raced step 1)
//!    and waits for them: a process in the middle of a step ends when the step returns;
//! 5. shuts the workers and the timer down and joins their threads.
//!
//! So when `stop` returns no step is running, every process has been closed, and every
//! thread the scheduler started has exited.

mod builder;
mod cell;
mod completer;
mod dispatch;
mod handle;
mod idle;
mod inbox;
mod lifecycle;
mod limits;
mod port;
mod registry;
mod shared;
mod state;
mod stats;
mod timer;
mod worker;

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use self::builder::Builder;
pub use self::completer::Completer;
pub use self::dispatch::{Factory, Handler, Request};
pub use self::handle::{Handle, ProcessHandle, SpawnOptions};
pub use self::port::Port;
pub use self::stats::{Stats, WorkerStats, YieldCounts};

/// The scheduler: owns the worker threads. Dropping it stops it with no grace period
/// (see [`Scheduler::stop`]).
///
/// It dereferences to its [`Handle`], which has the API to spawn and message processes;
/// clone the handle to use it from elsewhere.
pub struct Scheduler {
    handle: Handle,
    threads: Mutex<Option<Threads>>,
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

    /// A handle to spawn and message processes from anywhere.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the scheduler: cancels every process, gives them `grace` to finish,
    /// terminates the rest, and joins every thread. See the module docs, "Shutdown".
    /// A second call returns at once with an empty report.
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

        let cancelled = self.handle.cancel_all("shutdown");
        let mut forced = 0;
        if !shared.wait_drained(Some(start + grace)) {
            // Spawns that passed the stopping check before it was set may still be
            // registering: sweep until nothing is left.
            loop {
                forced += self.handle.terminate_all("terminated: shutdown deadline exceeded");
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
        StopReport { cancelled, forced, elapsed: start.elapsed() }
    }
}

impl std::ops::Deref for Scheduler {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if !std::thread::panicking() || worker::current_index(self.handle.shared.id).is_none() {
            self.stop(Duration::ZERO);
        }
    }
}
