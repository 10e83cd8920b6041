//! [`ProcessHandle`]: the embedder's handle to one process it spawned, and the slot its
//! result lands in, which the process's cell holds among its watchers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use wasmproc_types::{ExitReason, Payload, Pid};

use crate::step::Exited;

/// A function to call with a process's end.
type OnExit = Box<dyn FnOnce(&Exited) + Send>;

/// Where a process's end lands for the embedder.
#[derive(Default)]
pub(super) struct ExitSlot {
    result: Mutex<Option<Exited>>,
    condvar: Condvar,
    /// Called once the result is in, then dropped: see [`ProcessHandle::on_exit`].
    on_exit: Mutex<Vec<OnExit>>,
}

impl ExitSlot {
    pub(super) fn set(&self, result: Exited) {
        // The result goes in before the callbacks are taken: `on_exit` checks it under
        // the callbacks' lock, so a callback added meanwhile runs there, never twice.
        *self.result.lock() = Some(result);
        let callbacks = std::mem::take(&mut *self.on_exit.lock());
        self.condvar.notify_all();
        if let Some(exited) = (!callbacks.is_empty()).then(|| self.result.lock().clone()).flatten() {
            for callback in callbacks {
                callback(&exited);
            }
        }
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

    /// Calls `callback` with the record of the process's end: at once, on this thread,
    /// if it has ended, and otherwise on the thread that ends it (a worker), which it
    /// must not hold up: hand anything slow to another thread. A process that never
    /// ends (a durable scheduler stopped under it suspends it) never calls it.
    pub fn on_exit(&self, callback: impl FnOnce(&Exited) + Send + 'static) {
        let mut callbacks = self.slot.on_exit.lock();
        let ended = self.slot.result.lock().clone();
        match ended {
            Some(exited) => {
                drop(callbacks);
                callback(&exited);
            }
            None => callbacks.push(Box::new(callback)),
        }
    }
}

impl std::fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle").field("pid", &self.pid).field("ended", &self.try_result().is_some()).finish()
    }
}
