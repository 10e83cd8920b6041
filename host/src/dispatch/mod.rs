//! Command dispatch: how the yields a step writes reach the code that carries them out.
//!
//! Built-in commands (`sleep`, `spawn`, `send`, `monitor`, `terminate`) are handled by
//! the scheduler itself; custom commands go to the [`Handler`] the embedder registered
//! under their name. Every yield is answered by exactly one completion: the handler's
//! [`Completer`] may complete it at once (inside dispatch, on the worker that ran the
//! step) or later from any thread, and a completer dropped without completing answers
//! with an error rather than leaving the process waiting forever.
//!
//! Checks, in order: an unknown custom command completes with ``unknown command `name` ``;
//! a command the process was not granted completes with `permission denied: name`.

pub(crate) mod timer;

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::process::{Command, Event, Outcome, Payload, Pid, Process, SpawnRequest, Yield};
use crate::scheduler::cell::{ProcessCell, Watcher};
use crate::scheduler::state::Wake;
use crate::scheduler::worker::{self, panic_message};
use crate::scheduler::{Handle, Shared, SpawnArgs};

/// Code that carries out a custom command.
///
/// Called on the worker thread that ran the yielding step, so it must not block: a
/// handler with slow work moves the [`Request`] (or its [`Completer`]) to a thread of its
/// own and completes from there. A panic in a handler completes the yield with an error.
pub trait Handler: Send + Sync + 'static {
    /// Carries out `request`, completing it now or later.
    fn handle(&self, request: Request);
}

impl<F: Fn(Request) + Send + Sync + 'static> Handler for F {
    fn handle(&self, request: Request) {
        self(request)
    }
}

/// Makes processes of one registered kind, for `spawn`.
pub trait Factory: Send + Sync + 'static {
    /// A new, uninitialised process.
    ///
    /// # Errors
    ///
    /// The spawn fails with this error.
    fn make(&self) -> anyhow::Result<Box<dyn Process>>;
}

impl<F: Fn() -> anyhow::Result<Box<dyn Process>> + Send + Sync + 'static> Factory for F {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        self()
    }
}

/// One custom command to carry out.
pub struct Request {
    caller: Pid,
    name: Cow<'static, str>,
    payload: Payload,
    completer: Completer,
}

impl Request {
    /// The process that yielded the command.
    pub fn caller(&self) -> Pid {
        self.caller
    }

    /// The command's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command's input.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// The scheduler, to spawn, send or terminate on the caller's behalf.
    pub fn scheduler(&self) -> Handle {
        let cell = self.completer.target.as_ref().expect("an uncompleted request has a target");
        Handle { shared: cell.scheduler().clone() }
    }

    /// Completes the command now.
    pub fn complete(self, result: Outcome) {
        self.completer.complete(result);
    }

    /// The input and the completer, to finish the work elsewhere.
    pub fn into_parts(self) -> (Payload, Completer) {
        (self.payload, self.completer)
    }
}

/// Completes one yield. Consumed by [`Completer::complete`]; dropping it unused
/// completes the yield with an error, so a process never waits on a lost handler.
///
/// Completing a yield of a process that has ended in the meantime does nothing.
pub struct Completer {
    target: Option<Arc<ProcessCell>>,
    tag: u64,
}

impl Completer {
    pub(crate) fn new(target: Arc<ProcessCell>, tag: u64) -> Self {
        Completer { target: Some(target), tag }
    }

    /// The tag of the yield this completes.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The process waiting for the completion.
    pub fn pid(&self) -> Pid {
        self.target.as_ref().map_or(Pid::HOST, |cell| cell.pid())
    }

    /// Delivers `result` to the process and wakes it.
    pub fn complete(mut self, result: Outcome) {
        self.deliver(result);
    }

    fn deliver(&mut self, result: Outcome) {
        let Some(cell) = self.target.take() else { return };
        let Err(event) = worker::deliver_during_dispatch(&cell, Event::Completion { tag: self.tag, result }) else {
            return;
        };
        // A refused completion is for a process that has ended (DESIGN 8): nothing to do.
        if let Ok(Wake::Schedule) = cell.deliver(event) {
            cell.scheduler().schedule(cell.clone());
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if self.target.is_some() {
            self.deliver(Err("command handler dropped the yield without completing it".to_owned()));
        }
    }
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer").field("pid", &self.pid()).field("tag", &self.tag).finish()
    }
}

impl Shared {
    /// Carries out one yield of `cell`'s last step.
    pub(crate) fn dispatch(self: &Arc<Self>, cell: &Arc<ProcessCell>, y: Yield) {
        let done = Completer::new(cell.clone(), y.tag);
        let handler = match &y.command {
            Command::Custom { name, .. } => match self.handlers.get(name.as_ref()) {
                Some(handler) => Some(handler),
                None => return done.complete(Err(format!("unknown command `{name}`"))),
            },
            _ => None,
        };
        if !cell.spec.caps.allows_command(&y.command) {
            return done.complete(Err(format!("permission denied: {}", y.command.name())));
        }
        self.count_yield();
        match y.command {
            Command::Sleep(duration) => self.timer.sleep(duration, done),
            Command::Spawn(request) => self.spawn_child(cell, request, done),
            Command::Send { to, topic, body } => {
                let sent = self.send(cell.pid(), to, topic, body);
                done.complete(sent.map(|()| Payload::empty()).map_err(|e| e.to_string()));
            }
            Command::Monitor(target) => {
                self.monitor(cell, target);
                done.complete(Ok(Payload::empty()));
            }
            Command::Terminate(target) => {
                // Completes once the target has ended: its exit notifies `done`.
                if let Err((error, watcher)) = self.terminate(target, Some(Watcher::Yield(done))) {
                    if let Some(Watcher::Yield(done)) = watcher {
                        done.complete(Err(error.to_string()));
                    }
                }
            }
            Command::Custom { name, payload } => {
                let handler = handler.expect("looked up above");
                let request = Request { caller: cell.pid(), name, payload, completer: done };
                // A panicking handler drops the request while unwinding, and the
                // completer's drop answers the yield with an error.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| handler.handle(request))) {
                    eprintln!("wasmproc: command handler panicked: {}", panic_message(&*panic));
                }
            }
        }
    }

    fn spawn_child(self: &Arc<Self>, parent: &Arc<ProcessCell>, request: SpawnRequest, done: Completer) {
        let kind = match &request.kind {
            Some(name) => self.kinds.get_key_value(name.as_str()).map(|(k, f)| (k.clone(), f.clone())),
            None => parent
                .spec
                .kind
                .as_ref()
                .and_then(|k| self.kinds.get_key_value(k.as_ref()))
                .map(|(k, f)| (k.clone(), f.clone())),
        };
        let Some((kind, factory)) = kind else {
            let error = match &request.kind {
                Some(name) => format!("spawn failed: unknown process kind `{name}`"),
                None => {
                    "spawn failed: the spawning process has no registered kind to spawn more of; name one".to_owned()
                }
            };
            return done.complete(Err(error));
        };
        let process = match factory.make() {
            Ok(p) => p,
            Err(e) => return done.complete(Err(format!("spawn failed: {e:#}"))),
        };
        let args = SpawnArgs {
            kind: Some(kind),
            method: request.method,
            input: request.input,
            caps: parent.spec.caps.clone(),
            mailbox_capacity: self.config.mailbox_capacity,
            watcher: request.monitor.then(|| Watcher::Process(parent.clone())),
        };
        match self.spawn_unqueued(process, args) {
            Ok(child) => {
                // The spawn completes before the child is queued, so the parent always
                // sees the child's pid before any exit event of the child.
                done.complete(Ok(Payload::u64(child.pid().as_u64())));
                self.schedule(child);
            }
            Err(e) => done.complete(Err(e.to_string())),
        }
    }
}
