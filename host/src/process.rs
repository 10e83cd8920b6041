//! What the scheduler runs: the [`Process`] trait, and the [`Port`] each process gets at
//! `init`.
//!
//! A process is a state machine. The scheduler calls [`Process::init`] once, before the
//! process is ever queued, then [`Process::step`] each time it has something to do: the
//! step consumes [`Event`](crate::Event)s (completions of earlier yields, messages,
//! cancellation) and writes a [`StepOutput`]: a [`Status`](crate::Status) and any number
//! of [`Yield`](crate::Yield)s, commands for the host to dispatch. [`Process::close`]
//! runs exactly once at the end, whatever the end was.
//!
//! Nothing here names the scheduler: the trait is written against the step's values
//! (`step.rs`) and the limits (`limits.rs`), and a port reaches its process's scheduler
//! through [`PortTarget`], which the scheduler implements.

use std::sync::Weak;

use wasmproc_types::{Payload, Pid};

use crate::error::PortError;
use crate::limits::{KindLimits, Limits};
use crate::step::{Events, Outcome, StepOutput};

/// A process: something the scheduler can initialise, step and close.
///
/// The scheduler never calls two methods of one process at once, and calls `close`
/// exactly once, after the last `step` (or after a failed `init`). Implementations need
/// not be `Sync`; a process moves between worker threads between steps.
pub trait Process: Send + 'static {
    /// Selects the entry `method` and hands the process its `input`, and its
    /// [`Port`]: its pid, and how it sends as itself during a step and asks
    /// whether a long step should yield. Keep the port to use it later.
    ///
    /// Runs before the process is queued.
    ///
    /// # Errors
    ///
    /// An error (for example an unknown method) is returned to whoever spawned the
    /// process; the process never runs and no exit is reported for it.
    fn init(&mut self, port: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()>;

    /// Advances the process: consumes `events` and writes the status and yields to `out`.
    ///
    /// `out` arrives cleared with status [`Status::Blocked`].
    ///
    /// # Errors
    ///
    /// An error ends the process; nothing else is affected. Its reason is the
    /// [`ExitReason`](crate::ExitReason) the error is (found by downcasting, under any
    /// context): so a process reports a trap with
    /// `Err(ExitReason::trap(TrapKind::Panic, "…").into())`, as a Wasm process does for
    /// its guest's traps. Any other error ends it with [`ExitReason::Error`] and the
    /// error's whole chain (`{:#}`); a panic in `step` ends it with a
    /// [`TrapKind::Panic`](crate::TrapKind::Panic) trap.
    ///
    /// [`ExitReason::Error`]: crate::ExitReason::Error
    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()>;

    /// Whether the process, about to wait, holds memory it could give back while it
    /// waits, and has not said so since its last [`Process::hibernate`]. Called after a
    /// step that ends in a wait; keep it cheap. A `true` is a promise that `hibernate`
    /// will be called once the process's worker, or another, has nothing else to run.
    fn wants_hibernation(&mut self) -> bool {
        false
    }

    /// Gives back memory the process does not need while it waits. Called between steps
    /// (never during one), after [`Process::wants_hibernation`] said yes, by a worker
    /// with nothing else to run, so the cost delays no one; under load, waiting
    /// processes stay as they are. The next step may have to fault the memory back in.
    /// Returns whether anything was given back, counted in
    /// [`Stats::hibernated`](crate::scheduler::Stats::hibernated).
    fn hibernate(&mut self) -> bool {
        false
    }

    /// The process's state between two steps, as bytes a later [`Process::restore`] of a
    /// process of the same kind makes it again from: the snapshot a durable scheduler
    /// writes to the journal in place of the records before it (see
    /// [`Builder::snapshot_every`](crate::scheduler::Builder::snapshot_every)). Called
    /// between steps, as the owner of the process. `None` (the default): it cannot be
    /// captured now, or ever; its journal then keeps every record.
    fn snapshot(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// Makes the process what `state` (from [`Process::snapshot`]) says, in place of
    /// [`Process::init`]: `port` is its port, as `init` would have been given.
    ///
    /// # Errors
    ///
    /// `state` does not describe a process of this kind (of another version, damaged, or
    /// made by another program): the process is then not resumed, never run from it.
    /// The default refuses every state.
    fn restore(&mut self, port: Port, state: &[u8]) -> anyhow::Result<()> {
        let _ = (port, state);
        anyhow::bail!("this kind of process cannot be restored from a snapshot")
    }

    /// The sandbox limits the process runs under, which bound every process it spawns
    /// (see [`KindLimits`]); asked once, when the embedder
    /// spawns it. `None` (the default): none, as for a native process.
    fn limits(&self) -> Option<KindLimits> {
        None
    }

    /// Releases the process's resources. Called exactly once.
    fn close(&mut self) {}
}

/// A process's own way out, handed to it at [`Process::init`], knowing the process's pid.
///
/// What a process does to others outside its yields goes through its port: a message it
/// sends as itself in the middle of a step ([`Port::send`]), an answer to a request it
/// was forwarded ([`Port::respond`]), and the questions a long step asks about the world
/// around it ([`Port::should_yield`], [`Port::is_terminating`]). Every message, through a
/// port or as a yielded `send` command, takes one checked path in the scheduler: the
/// payload limit, then the `send` capability, then delivery (to this node's process, or
/// through the cluster to another node's).
///
/// A port holds its process weakly: the process owns its port (a Wasm process keeps it in
/// its store), and a strong reference would keep the process alive for ever. Once the
/// process has ended, every call answers as for an ended process. Cheap to clone (a pid
/// and a weak reference).
#[derive(Clone)]
pub struct Port {
    pid: Pid,
    process: Weak<dyn PortTarget>,
}

/// The scheduler's side of a process, as its [`Port`] reaches it: implemented by the
/// scheduler's cell of the process, so that this file names nothing of the scheduler's.
pub(crate) trait PortTarget: Send + Sync {
    /// See [`Port::send`]; called with the process alive.
    fn send(&self, to: Pid, topic: String, body: Payload) -> Result<(), PortError>;
    /// See [`Port::respond`].
    fn respond(&self, id: u64, result: Outcome) -> Result<(), PortError>;
    /// See [`Port::parent`].
    fn parent(&self) -> Pid;
    /// The scheduler's per-process limits.
    fn limits(&self) -> &Limits;
    /// Whether termination was requested.
    fn is_terminate_requested(&self) -> bool;
    /// Whether any other process waits to run.
    fn has_waiting_work(&self) -> bool;
    /// See [`Port::step_time`], in microseconds since the Unix epoch.
    fn step_time_micros(&self) -> Option<u64>;
    /// See [`Port::random_seed`].
    fn random_seed(&self) -> Option<[u8; 32]>;
}

impl Port {
    /// A port on `process`, whose pid is `pid`.
    pub(crate) fn new(pid: Pid, process: Weak<dyn PortTarget>) -> Port {
        Port { pid, process }
    }

    /// The pid of the process this port belongs to.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Sends `body` to `to` as this process, at once, during one of its steps: what a
    /// yielded `send` command does, without waiting for the step to end.
    ///
    /// In a durable scheduler the message goes into the step's record instead, and is
    /// delivered once that is committed: so whether the receiver takes it is not known
    /// here, and a receiver that cannot is counted in
    /// [`Stats`](crate::scheduler::Stats)' undelivered messages rather than reported (as
    /// a message to an ended process in Erlang).
    ///
    /// # Errors
    ///
    /// [`PortError::NotInStep`] outside a step of this process (in `init`, say);
    /// [`PortError::TooLarge`] past the payload limit (a Wasm process is ended for it, as
    /// for a yield); [`PortError::PermissionDenied`] without the `send` capability;
    /// [`PortError::Send`] if the receiver cannot take it; [`PortError::Ended`] once
    /// this process has ended.
    pub fn send(&self, to: Pid, topic: impl Into<String>, body: Payload) -> Result<(), PortError> {
        let process = self.process.upgrade().ok_or(PortError::Ended(self.pid))?;
        process.send(to, topic.into(), body)
    }

    /// Answers the request `id` this process was sent (see
    /// [`Handle::forward`](crate::Handle::forward)).
    ///
    /// # Errors
    ///
    /// [`PortError::NoRequest`] if no request `id` is waiting for this process: it was
    /// answered already, or sent to another process. [`PortError::TooLarge`] for an
    /// answer past the payload limit; the request still waits for an answer.
    /// [`PortError::Ended`] once this process has ended.
    pub fn respond(&self, id: u64, result: Outcome) -> Result<(), PortError> {
        let process = self.process.upgrade().ok_or(PortError::Ended(self.pid))?;
        process.respond(id, result)
    }

    /// The process that spawned this one: [`Pid::HOST`] if the embedder did (or the
    /// process has ended).
    pub fn parent(&self) -> Pid {
        self.process.upgrade().map_or(Pid::HOST, |process| process.parent())
    }

    /// The most commands one step of this process may yield: more ends it
    /// ([`Builder::max_yields_per_step`](crate::scheduler::Builder::max_yields_per_step)).
    /// 0 once the process has ended.
    pub fn max_yields_per_step(&self) -> usize {
        self.process.upgrade().map_or(0, |process| process.limits().max_yields_per_step)
    }

    /// The largest payload this process may hand the host: larger ends it
    /// ([`Builder::max_payload_size`](crate::scheduler::Builder::max_payload_size)). 0
    /// once the process has ended.
    pub fn max_payload_size(&self) -> usize {
        self.process.upgrade().map_or(0, |process| process.limits().max_payload_size)
    }

    /// The most bytes one step of this process may hand the host in its commands and
    /// result together: more ends it
    /// ([`Builder::max_output_per_step`](crate::scheduler::Builder::max_output_per_step)).
    /// 0 once the process has ended.
    pub fn max_output_per_step(&self) -> usize {
        self.process.upgrade().map_or(0, |process| process.limits().max_output_per_step)
    }

    /// Whether a long step should give its worker back now: other processes are queued
    /// on this scheduler, or this process has been asked to terminate. A snapshot of racy
    /// checks: a wrong answer only moves a yield by one look (an epoch tick for Wasm).
    pub fn should_yield(&self) -> bool {
        self.process.upgrade().is_some_and(|process| process.is_terminate_requested() || process.has_waiting_work())
    }

    /// For a durable process, the time of the step it is in (of its `init` before its
    /// first step), as its journal has it: the same when the step is replayed after a
    /// crash. Read the time through this in a durable process, so a replay reads what
    /// the step read. `None` if the process is not durable (or has ended).
    pub fn step_time(&self) -> Option<std::time::SystemTime> {
        let micros = self.process.upgrade()?.step_time_micros()?;
        Some(std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros))
    }

    /// For a durable process, a seed drawn at its spawn and recorded in its journal: the
    /// same on every replay, so random numbers drawn from it replay too. `None` if the
    /// process is not durable.
    pub fn random_seed(&self) -> Option<[u8; 32]> {
        self.process.upgrade()?.random_seed()
    }

    /// Whether this process has been asked to terminate (or has ended): a step that
    /// notices should stop at once, since its result will not be used.
    pub fn is_terminating(&self) -> bool {
        self.process.upgrade().is_none_or(|process| process.is_terminate_requested())
    }
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port").field("pid", &self.pid).finish_non_exhaustive()
    }
}
