//! [`ProcessHandle`]: the embedder's handle to one process it spawned, and the slot its
//! result lands in, which the process's cell holds among its watchers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use wasmproc_types::{ExitReason, Payload, Pid};

use crate::step::Exited;

/// Where a process's end lands for the embedder.
#[derive(Default)]
pub(super) struct ExitSlot {
    result: Mutex<Option<Exited>>,
    condvar: Condvar,
}

impl ExitSlot {
    pub(super) fn set(&self, result: Exited) {
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

    /// Blocks until the process ends and returns its result: its payload for a normal
    /// exit, otherwise why it ended ([`ExitReason`]).
    pub fn join(&self) -> Result<Payload, ExitReason> {
        self.wait().into_result()
    }

    /// Like [`ProcessHandle::join`], giving up after `timeout`: `None` if the process is
    /// still running then.
    pub fn join_timeout(&self, timeout: Duration) -> Option<Result<Payload, ExitReason>> {
        self.wait_timeout(timeout).map(Exited::into_result)
    }

    /// The result if the process has ended.
    pub fn try_result(&self) -> Option<Result<Payload, ExitReason>> {
        self.try_exit().map(Exited::into_result)
    }

    /// Blocks until the process ends and returns the whole record of its end: the
    /// reason, and the process whose exit signal ended it, if one did.
    pub fn wait(&self) -> Exited {
        let mut result = self.slot.result.lock();
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            self.slot.condvar.wait(&mut result);
        }
    }

    /// Like [`ProcessHandle::wait`], giving up after `timeout`: `None` if the process is
    /// still running then.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Exited> {
        let deadline = Instant::now() + timeout;
        let mut result = self.slot.result.lock();
        while result.is_none() {
            if self.slot.condvar.wait_until(&mut result, deadline).timed_out() {
                break;
            }
        }
        result.clone()
    }

    /// The record of the process's end, if it has ended.
    pub fn try_exit(&self) -> Option<Exited> {
        self.slot.result.lock().clone()
    }
}

impl std::fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle").field("pid", &self.pid).field("ended", &self.try_result().is_some()).finish()
    }
}
