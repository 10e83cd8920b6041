//! A workflow's record kept in the journal, in its root's spawn note
//! ([`SpawnOptions::note`](crate::scheduler::SpawnOptions::note)).
//!
//! A start is answered once the journal has committed its root's spawn, and the note
//! makes that commit hold the workflow's record too; the registry's copy is written
//! without a sync of its own. A machine's crash can lose that copy and keep the journal's
//! spawn: the next server, before it resumes anything, puts back every record the
//! registry lacks from the notes of the journal's runs. (`forget` removes a run from
//! the journal before its record from the registry, so a run the journal holds without
//! a record is always a lost record, never a forgotten workflow.)
//!
//! The note leaves out the input, which the spawn itself holds as its first payload.

use serde::{Deserialize, Serialize};
use wasmproc_types::Format;

use super::registry::{Registry, State, WorkflowRecord};
use crate::journal::HeldRun;

#[derive(Serialize, Deserialize)]
struct Note {
    tenant: String,
    workflow: WorkflowRecord,
}

/// `record`'s note, for its root's spawn.
pub(super) fn note(tenant: &str, record: &WorkflowRecord) -> Vec<u8> {
    let workflow = WorkflowRecord { input: None, ..record.clone() };
    serde_json::to_vec(&Note { tenant: tenant.to_owned(), workflow }).expect("a workflow record is JSON")
}

/// Puts back, as running, the records of the workflows `runs` hold that the registry
/// lacks; how many. A run whose end the journal holds is settled as ended by
/// `Service::reattach`, as any running record whose run ended.
///
/// # Errors
///
/// The registry's.
pub(super) fn restore(registry: &Registry, runs: &[HeldRun]) -> anyhow::Result<usize> {
    let mut lost = Vec::new();
    for run in runs {
        let Some(note) = &run.note else { continue };
        let Note { tenant, mut workflow } = match serde_json::from_slice(note) {
            Ok(note) => note,
            Err(error) => {
                tracing::warn!(root = %run.root, %error, "a workflow's note in the journal does not read; left out");
                continue;
            }
        };
        if registry.workflow(&tenant, &workflow.id)?.is_some() {
            continue;
        }
        workflow.pid = run.root.as_u64();
        workflow.state = State::Running;
        workflow.input = run
            .input
            .first()
            .filter(|input| input.format == Format::Json)
            .and_then(|input| serde_json::from_slice(&input.data).ok())
            .filter(|input: &serde_json::Value| !input.is_null());
        lost.push((tenant, workflow));
    }
    if !lost.is_empty() {
        let records: Vec<(&str, WorkflowRecord)> = lost.iter().map(|(t, w)| (t.as_str(), w.clone())).collect();
        registry.put_journaled(&records)?;
        tracing::warn!(count = lost.len(), "workflow records lost with the machine were made again from the journal");
    }
    Ok(lost.len())
}
