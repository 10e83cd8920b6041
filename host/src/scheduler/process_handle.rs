//! [`ProcessHandle`]: the embedder's handle to one process it spawned, and the slot its
//! result lands in, which the process's cell holds among its watchers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use wasmproc_types::Pid;

use crate::step::Outcome;

/// Where a process's result lands for the embedder.
#[derive(Default)]
pub(super) struct ExitSlot {
    result: Mutex<Option<Outcome>>,
    condvar: Condvar,
}

impl ExitSlot {
    pub(super) fn set(&self, result: Outcome) {
        *self.result.lock() = Some(result);
        self.condvar.notify_all();
    }
}

/// A process spawned by the embedder: its pid and, once it ends, its result.
///
/// Dropping the handle does not affect the process.
#[derive(Clone)]
pub struct ProcessHandle {
    pid: Pid,
    slot: Arc<ExitSlot>,
}

impl ProcessHandle {
    pub(super) fn new(pid: Pid, slot: Arc<ExitSlot>) -> Self {
        ProcessHandle { pid, slot }
    }

    /// The process's id.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Blocks until the process ends and returns its result.
    pub fn join(&self) -> Outcome {
        let mut result = self.slot.result.lock();
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            self.slot.condvar.wait(&mut result);
        }
    }

    /// Like [`ProcessHandle::join`], giving up after `timeout`: `None` if the process is
    /// still running then.
    pub fn join_timeout(&self, timeout: Duration) -> Option<Outcome> {
        let deadline = Instant::now() + timeout;
        let mut result = self.slot.result.lock();
        while result.is_none() {
            if self.slot.condvar.wait_until(&mut result, deadline).timed_out() {
                break;
            }
        }
        result.clone()
    }

    /// The result if the process has ended.
    pub fn try_result(&self) -> Option<Outcome> {
        self.slot.result.lock().clone()
    }
}

impl std::fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle").field("pid", &self.pid).field("ended", &self.try_result().is_some()).finish()
    }
}
