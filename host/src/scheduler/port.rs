//! The scheduler's side of a [`Port`]: what a process's port reaches (its cell, as a
//! [`PortTarget`]). The port itself is the crate's `process.rs`, which names nothing of
//! the scheduler's.

use std::sync::{Arc, Weak};

use wasmproc_types::{Payload, Pid};

use super::cell::ProcessCell;
use super::state::Lifecycle;

use crate::error::PortError;
use crate::limits::Limits;
use crate::process::{Port, PortTarget};
use crate::step::Outcome;

/// The port of `cell`'s process, handed to it at `init`.
pub(super) fn port(cell: &Arc<ProcessCell>) -> Port {
    let target: Weak<dyn PortTarget> = Arc::downgrade(cell) as Weak<ProcessCell>;
    Port::new(cell.pid(), target)
}

impl PortTarget for ProcessCell {
    fn send(&self, to: Pid, topic: String, body: Payload) -> Result<(), PortError> {
        if self.state.load().lifecycle() != Lifecycle::Running {
            return Err(PortError::NotInStep);
        }
        self.scheduler().send_as(self, to, topic, body, None)
    }

    fn respond(&self, id: u64, result: Outcome) -> Result<(), PortError> {
        let scheduler = self.scheduler();
        scheduler.respond(self.pid(), scheduler.limits_of(self).max_payload_size, id, result)
    }

    fn parent(&self) -> Pid {
        self.spec.parent
    }

    fn limits(&self) -> &Limits {
        self.scheduler().limits_of(self)
    }

    fn is_terminate_requested(&self) -> bool {
        self.state.load().is_terminate_requested()
    }

    fn has_waiting_work(&self) -> bool {
        self.scheduler().has_waiting_work()
    }

    fn step_time_micros(&self) -> Option<u64> {
        self.durable_step.lock().as_ref().map(|step| step.step_at)
    }

    fn random_seed(&self) -> Option<[u8; 32]> {
        self.durable_step.lock().as_ref().map(|step| step.seed)
    }
}
