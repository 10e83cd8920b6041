//! [`Port`]: a process's own way out, handed to it at `init`.
//!
//! What a process does to others outside its yields goes through its port: a message it
//! sends as itself in the middle of a step ([`Port::send`]), and the questions a long
//! step asks about the world around it ([`Port::should_yield`], [`Port::is_terminating`]).
//! Every message, through a port or as a yielded `send` command, is checked in one place,
//! [`Shared::send_as`]: the payload limit, then the `send` capability, then delivery. That
//! is where a journal will record what leaves a process, and where a cluster will route a
//! message to another node.
//!
//! A port holds its process weakly: the process owns its port (a Wasm process keeps it in
//! its store), and a strong reference would keep the cell, and with it the process, alive
//! for ever. Once the process has ended, every call answers as for an ended process.

use std::sync::{Arc, Weak};

use super::cell::ProcessCell;
use super::process::{CommandKind, Payload, Pid, message_size};
use super::shared::Shared;
use super::state::Lifecycle;
use super::worker;
use crate::error::PortError;

/// A process's handle on the scheduler that runs it, knowing the process's pid: see the
/// module docs. Cheap to clone (a pid and a weak reference).
#[derive(Clone)]
pub struct Port {
    pid: Pid,
    cell: Weak<ProcessCell>,
}

impl Port {
    pub(super) fn new(cell: &Arc<ProcessCell>) -> Port {
        Port { pid: cell.pid(), cell: Arc::downgrade(cell) }
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
    /// here, and a receiver that cannot is counted in [`Stats`](super::Stats)' undelivered
    /// messages rather than reported (as a message to an ended process in Erlang).
    ///
    /// # Errors
    ///
    /// [`PortError::NotInStep`] outside a step of this process (in `init`, say);
    /// [`PortError::TooLarge`] past the payload limit (a Wasm process is ended for it, as
    /// for a yield); [`PortError::PermissionDenied`] without the `send` capability;
    /// [`PortError::Send`] if the receiver cannot take it; [`PortError::Ended`] once
    /// this process has ended.
    pub fn send(&self, to: Pid, topic: impl Into<String>, body: Payload) -> Result<(), PortError> {
        let cell = self.cell.upgrade().ok_or(PortError::Ended(self.pid))?;
        if cell.state.load().lifecycle() != Lifecycle::Running {
            return Err(PortError::NotInStep);
        }
        scheduler(&cell).send_as(&cell, to, topic.into(), body, None)
    }

    /// The process that spawned this one: [`Pid::HOST`] if the embedder did (or the
    /// process has ended).
    pub fn parent(&self) -> Pid {
        self.cell.upgrade().map_or(Pid::HOST, |cell| cell.spec.parent)
    }

    /// The most commands one step of this process may yield: more ends it
    /// ([`Builder::max_yields_per_step`](super::Builder::max_yields_per_step)). 0 once the
    /// process has ended.
    pub fn max_yields_per_step(&self) -> usize {
        self.cell.upgrade().map_or(0, |cell| scheduler(&cell).limits_of(&cell).max_yields_per_step)
    }

    /// The largest payload this process may hand the host: larger ends it
    /// ([`Builder::max_payload_size`](super::Builder::max_payload_size)). 0 once the process
    /// has ended.
    pub fn max_payload_size(&self) -> usize {
        self.cell.upgrade().map_or(0, |cell| scheduler(&cell).limits_of(&cell).max_payload_size)
    }

    /// The most bytes one step of this process may hand the host in its commands and
    /// result together: more ends it
    /// ([`Builder::max_output_per_step`](super::Builder::max_output_per_step)). 0 once the
    /// process has ended.
    pub fn max_output_per_step(&self) -> usize {
        self.cell.upgrade().map_or(0, |cell| scheduler(&cell).limits_of(&cell).max_output_per_step)
    }

    /// Whether a long step should give its worker back now: other processes are queued
    /// on this scheduler, or this process has been asked to terminate. A snapshot of racy
    /// checks: a wrong answer only moves a yield by one look (an epoch tick for Wasm).
    pub fn should_yield(&self) -> bool {
        self.cell
            .upgrade()
            .is_some_and(|cell| cell.state.load().is_terminate_requested() || scheduler(&cell).has_waiting_work())
    }

    /// For a durable process, the time of the step it is in (of its `init` before its
    /// first step), as its journal has it: the same when the step is replayed after a
    /// crash. Read the time through this in a durable process, so a replay reads what
    /// the step read. `None` if the process is not durable (or has ended).
    pub fn step_time(&self) -> Option<std::time::SystemTime> {
        let cell = self.cell.upgrade()?;
        let micros = cell.durable_step.lock().as_ref()?.step_at;
        Some(std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros))
    }

    /// For a durable process, a seed drawn at its spawn and recorded in its journal: the
    /// same on every replay, so random numbers drawn from it replay too. `None` if the
    /// process is not durable.
    pub fn random_seed(&self) -> Option<[u8; 32]> {
        let cell = self.cell.upgrade()?;
        cell.durable_step.lock().as_ref().map(|step| step.seed)
    }

    /// The scheduler of this port's process, while it lives.
    pub(super) fn shared(&self) -> Option<Arc<Shared>> {
        self.cell.upgrade().map(|cell| scheduler(&cell).clone())
    }

    /// Whether this process has been asked to terminate (or has ended): a step that
    /// notices should stop at once, since its result will not be used.
    pub fn is_terminating(&self) -> bool {
        self.cell.upgrade().is_none_or(|cell| cell.state.load().is_terminate_requested())
    }
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port").field("pid", &self.pid).finish_non_exhaustive()
    }
}

/// The scheduler of a live process.
fn scheduler(cell: &ProcessCell) -> &Arc<Shared> {
    cell.spec.scheduler.as_ref().expect("only the loom models make cells without a scheduler, and they make no ports")
}

impl Shared {
    /// Sends `body` from `cell`'s process to `to`: the one path of every message a
    /// process sends, through its port or as a yielded command. Checks, in order, the
    /// payload limit and the `send` capability, then delivers.
    /// `id`: the message's identity, for a yielded `send` of a durable process (its port
    /// sends are kept for the step's record here, and delivered with theirs later).
    pub(super) fn send_as(
        &self,
        cell: &ProcessCell,
        to: Pid,
        topic: String,
        body: Payload,
        id: Option<u64>,
    ) -> Result<(), PortError> {
        let send = CommandKind::Send;
        self.settings.limits.check_payload(message_size(&topic, &body), send.name()).map_err(PortError::TooLarge)?;
        if !cell.spec.caps.allows_builtin(send) {
            return Err(PortError::PermissionDenied);
        }
        if self.durable.is_some() && id.is_none() {
            // Delivered once the step's record is committed: whether the receiver takes
            // it is not known before, so it is not reported (see `durable.rs`).
            return worker::keep_port_send(cell, (to, topic, body)).map_err(|_| PortError::NotInStep);
        }
        Ok(self.send(cell.pid(), to, topic, body, id)?)
    }
}
