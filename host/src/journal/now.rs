//! One process as its journal leaves it, read from its own records only
//! ([`Journal::process_now`]): how far it got and what it waits for, without reading the
//! rest of the journal (a service describing one workflow among many).

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use wasmproc_types::Pid;

use super::Journal;
use super::read::Decode;
use super::record::Record;
use crate::step::{Command, Event, Status};

/// One process as its journal leaves it: see [`Journal::process_now`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ProcessNow {
    /// Steps recorded.
    pub steps: u64,
    /// How its last recorded step ended; `None` before its first step and once it has
    /// ended.
    pub last_status: Option<Status>,
    /// Whether its exit is recorded.
    pub ended: bool,
    /// The commands it yielded whose completion no recorded step has consumed, in the
    /// order of their tags; empty once it has ended.
    pub pending: Vec<PendingCommand>,
    /// The topics of the messages the embedder sent it, in the order they were recorded
    /// (each is recorded before it is delivered).
    pub host_messages: Vec<String>,
}

/// A command a process waits on: see [`ProcessNow::pending`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PendingCommand {
    /// The yield's tag.
    pub tag: u64,
    /// The command.
    pub command: Command,
    /// When the step that yielded it began, in microseconds since the Unix epoch: a
    /// `sleep` ends at this time plus its duration.
    pub since_micros: u64,
}

impl Journal {
    /// Process `pid` as its records leave it; `None` if the journal holds none of it.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn process_now(&self, pid: Pid) -> std::io::Result<Option<ProcessNow>> {
        let mut now: Option<ProcessNow> = None;
        let mut pending = BTreeMap::new();
        let from = pid.as_u64();
        self.scan_records(from, from.checked_add(1), Decode::All, &mut |_, record| {
            let Some(record) = record else { unreachable!("every record is decoded") };
            let now = now.get_or_insert_with(ProcessNow::default);
            match record {
                Record::Spawn(_) => {}
                // What it replaced: its steps, what it was still waiting for, and the
                // embedder's messages it had not taken.
                Record::Snapshot(snapshot) => {
                    now.steps = snapshot.steps;
                    for (_, _, at, y) in snapshot.carried.outstanding {
                        pending.insert(y.tag, PendingCommand { tag: y.tag, command: y.command, since_micros: at });
                    }
                    now.host_messages.extend(snapshot.carried.host_messages.into_iter().map(|(_, topic, _)| topic));
                }
                Record::Step(step) => {
                    now.steps += 1;
                    for event in &step.events {
                        if let Event::Completion { tag, .. } = event {
                            pending.remove(tag);
                        }
                    }
                    for y in step.yields {
                        pending.insert(y.tag, PendingCommand { tag: y.tag, command: y.command, since_micros: step.at });
                    }
                    now.last_status = Some(step.status);
                }
                Record::Exit(_) => {
                    now.ended = true;
                    now.last_status = None;
                    pending.clear();
                }
                Record::HostMessage { topic, .. } => now.host_messages.push(topic),
                Record::Received { .. } => {}
            }
            ControlFlow::Continue(())
        })?;
        if let Some(now) = &mut now {
            now.pending = pending.into_values().collect();
        }
        Ok(now)
    }
}
