//! What a workflow's description adds to its record: how far its root process got and
//! what it waits for, read from the root's own records in the journal
//! ([`Journal::process_now`](crate::journal::Journal::process_now)) and, for its children,
//! from the scheduler.

use std::time::Duration;

use anyhow::Context as _;
use wasmproc_types::Pid;

use super::registry::{State, WorkflowRecord};
use super::wire::Waiting;
use super::{Refusal, Service};
use crate::step::{Command, Status};

/// A workflow's steps, and what it waits for while it runs.
pub(super) struct Progress {
    pub(super) steps: u64,
    /// `None` once it has ended.
    pub(super) waiting: Option<Vec<Waiting>>,
}

fn waiting(what: &str) -> Waiting {
    Waiting { what: what.to_owned(), until_ms: None, command: None, pid: None, children: None }
}

impl Service {
    /// `record`'s workflow's progress; `None` if the journal holds none of it (forgotten).
    ///
    /// # Errors
    ///
    /// The journal cannot be read.
    pub(super) fn progress(&self, record: &WorkflowRecord) -> Result<Option<Progress>, Refusal> {
        let root = Pid::from_u64(record.pid);
        let now = self.inner.journal.process_now(root).context("cannot read the workflow's journal")?;
        let Some(now) = now else { return Ok(None) };
        if record.state != State::Running || now.ended {
            return Ok(Some(Progress { steps: now.steps, waiting: None }));
        }
        let mut waits = Vec::new();
        for pending in &now.pending {
            let wait = match &pending.command {
                Command::Sleep(duration) => {
                    let since = Duration::from_micros(pending.since_micros);
                    let until = (since + *duration).as_millis();
                    Waiting { until_ms: Some(u64::try_from(until).unwrap_or(u64::MAX)), ..waiting("timer") }
                }
                Command::Spawn(_) => waiting("spawn"),
                Command::Terminate(pid) => Waiting { pid: Some(pid.as_u64()), ..waiting("exit") },
                other => Waiting { command: Some(other.name().to_owned()), ..waiting("command") },
            };
            waits.push(wait);
        }
        // Idle, or blocked with nothing outstanding (its next step not taken yet): it
        // waits for what comes to its mailbox, its children's ends among them.
        if now.pending.is_empty() || now.last_status == Some(Status::Idle) {
            let children = self.inner.handle.live_children(root).unwrap_or(0);
            if children > 0 {
                waits.push(Waiting { children: Some(children as u64), ..waiting("child") });
            }
            waits.push(waiting("message"));
        }
        Ok(Some(Progress { steps: now.steps, waiting: Some(waits) }))
    }
}
