//! Durable processes: a scheduler with a journal records every process's spawn, steps
//! and exit (`record.rs`), and lets nothing of a step take effect before its record is
//! committed (see [`crate::journal`], "Guarantees").
//!
//! The write-ahead rule is kept by moving a step's effects behind the commit: the worker
//! records the step and submits it with what the step asked for ([`AfterCommit`]); the
//! committer thread carries that out once the record's group is durable. The process
//! itself goes on as it would without a journal (it parks, or is queued again): its
//! yields complete later than they would, which a process cannot tell from a slow
//! command.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::cell::ProcessCell;
use super::process::{Event, Outcome, Payload, Pid, Status, Yield};
use super::record::{Record, SpawnRecord, StepRecord, now_micros};
use super::shared::Shared;
use crate::journal::{CommitError, CommitStats, Committer, Journal, Key, OnCommit};

/// A message sent through a port during a step: (to, topic, body).
pub(super) type PortSend = (Pid, String, Payload);

/// A scheduler's journal, as its threads use it.
pub(super) struct Durable {
    committer: Committer<AfterCommit>,
    max_records: u64,
}

/// What a committed record lets happen.
pub(super) enum AfterCommit {
    /// A spawn, or a step with no effect.
    Nothing,
    /// A step's yields and port sends, in order.
    Effects { cell: Arc<ProcessCell>, yields: Vec<Yield>, sends: Vec<PortSend> },
    /// A process's end: `None` is a termination.
    Exit { cell: Arc<ProcessCell>, result: Option<Outcome> },
}

impl Durable {
    pub(super) fn start(name: &str, journal: &Journal) -> std::io::Result<Durable> {
        let sync = journal.settings.durability == crate::journal::Durability::Sync;
        let on_commit: OnCommit<AfterCommit> = Box::new(|items, result| match result {
            Ok(()) => items.into_iter().for_each(AfterCommit::carry_out),
            Err(error) => items.into_iter().for_each(|item| item.fail(&error)),
        });
        let committer = Committer::start(name, journal.store.clone(), sync, journal.settings.group_window, on_commit)?;
        Ok(Durable { committer, max_records: journal.settings.max_records_per_process.max(2) })
    }

    pub(super) fn stats(&self) -> CommitStats {
        self.committer.stats()
    }

    pub(super) fn shut_down(&self) {
        self.committer.shut_down();
    }

    /// Submits `record` as the next of `cell`'s history.
    fn submit(&self, cell: &ProcessCell, record: &Record, then: AfterCommit) -> Result<(), String> {
        let seq = cell.journal_seq.fetch_add(1, Ordering::Relaxed);
        // The exit is always allowed: a process at its limit must still be able to end.
        if seq >= self.max_records && !matches!(record, Record::Exit(_)) {
            return Err(format!(
                "journal limit reached: process {} has {seq} records (raise `max_records_per_process`)",
                cell.pid()
            ));
        }
        let key = Key { process: cell.pid().as_u64(), seq };
        self.committer.submit([(key, record.encode())], then).map_err(|error| journal_failed(&error))
    }

    /// Records the spawn of `cell`; its steps' records follow it in the same order.
    pub(super) fn record_spawn(&self, cell: &ProcessCell, spawn: SpawnRecord) -> Result<(), String> {
        self.submit(cell, &Record::Spawn(spawn), AfterCommit::Nothing)
    }

    /// Records a step and hands its effects to the committer. On error nothing of the
    /// step has happened, and the process must end with the error.
    pub(super) fn record_step(
        &self,
        cell: &Arc<ProcessCell>,
        at: u64,
        events: Vec<Event>,
        yields: Vec<Yield>,
        sends: Vec<PortSend>,
        status: Status,
    ) -> Result<(), String> {
        let then = if yields.is_empty() && sends.is_empty() {
            AfterCommit::Nothing
        } else {
            AfterCommit::Effects { cell: cell.clone(), yields: yields.clone(), sends: sends.clone() }
        };
        self.submit(cell, &Record::Step(StepRecord { at, events, yields, sends, status }), then)
    }

    /// Records the end of `cell`'s process; the committer finalises it once that is
    /// durable. Hands `result` back if the journal has failed, for the caller to finalise
    /// the process with the failure.
    pub(super) fn record_exit(&self, cell: &Arc<ProcessCell>, result: Option<Outcome>) -> Result<(), String> {
        let recorded = match &result {
            Some(result) => result.clone(),
            None => Err("terminated".to_owned()),
        };
        self.submit(cell, &Record::Exit(recorded), AfterCommit::Exit { cell: cell.clone(), result })
    }
}

impl AfterCommit {
    fn carry_out(self) {
        match self {
            AfterCommit::Nothing => {}
            AfterCommit::Effects { cell, yields, sends } => {
                let shared = cell.scheduler().clone();
                for (to, topic, body) in sends {
                    if let Err(error) = shared.send(cell.pid(), to, topic, body) {
                        shared.count(|c| &c.undelivered, 1);
                        tracing::debug!(from = %cell.pid(), %to, %error, "a message sent through a port was not delivered");
                    }
                }
                for y in yields {
                    shared.dispatch(&cell, y);
                }
            }
            AfterCommit::Exit { cell, result } => cell.scheduler().clone().finalize(&cell, result),
        }
    }

    fn fail(self, error: &CommitError) {
        let reason = journal_failed(error);
        match self {
            AfterCommit::Nothing => {}
            AfterCommit::Effects { cell, .. } => {
                let _ = cell.scheduler().clone().terminate_cell_because(&cell, Cow::Owned(reason));
            }
            AfterCommit::Exit { cell, .. } => {
                cell.scheduler().clone().finalize(&cell, Some(Err(format!("{reason}; the result was not recorded"))));
            }
        }
    }
}

fn journal_failed(error: &CommitError) -> String {
    format!("journal failed: {error}")
}

impl Shared {
    /// Records the spawn of a new process, if this scheduler is durable.
    pub(super) fn record_spawn(&self, cell: &ProcessCell, spawn: impl FnOnce() -> SpawnRecord) -> Result<(), String> {
        match &self.durable {
            Some(durable) => durable.record_spawn(cell, spawn()),
            None => Ok(()),
        }
    }
}

pub(super) fn spawn_record(
    parent: Pid,
    kind: Option<&str>,
    method: &str,
    input: Vec<Payload>,
    caps: &super::caps::Capabilities,
    mailbox_capacity: usize,
) -> SpawnRecord {
    SpawnRecord {
        parent,
        kind: kind.map(str::to_owned),
        method: method.to_owned(),
        input,
        caps: caps.clone(),
        mailbox_capacity: mailbox_capacity as u64,
        at: now_micros(),
    }
}
