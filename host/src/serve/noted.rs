//! A workflow's record kept in the journal, with its root's spawn
//! ([`SpawnOptions::note`](crate::scheduler::SpawnOptions::note)).
//!
//! A start is answered once the journal has committed its root's spawn, and that commit
//! holds the workflow's record too, so the registry's copy is written without a sync of
//! its own. A machine's crash can lose that copy and keep the journal's spawn: the next
//! server, before it resumes anything, puts back every record the registry lacks from
//! the journal's runs. (`forget` removes a run from the journal before its record from
//! the registry, so a run the journal holds without a record is always a lost record,
//! never a forgotten workflow.)
//!
//! Most of the record is the spawn's already: the tenant, the component and the id are
//! its kind (`TENANT/sha256:HEX@ID`), the method is its entry, the input its first
//! payload. The note holds the rest, small since the log store keeps every live record
//! in memory: when it started, and its grants and limits.

use serde::{Deserialize, Serialize};
use wasmproc_types::Format;

use super::code;
use super::policy::{Grants, Limits};
use super::registry::{Registry, State, WorkflowRecord};
use crate::journal::HeldRun;

#[derive(Serialize, Deserialize)]
struct Note {
    started_ms: u64,
    #[serde(default, skip_serializing_if = "is_default")]
    grants: Grants,
    #[serde(default, skip_serializing_if = "is_default")]
    limits: Limits,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The kind of `tenant`'s workflow `record`'s processes, which names the workflow in its
/// root's spawn (read back by [`code::parts`]).
pub(super) fn kind(tenant: &str, record: &WorkflowRecord) -> String {
    format!("{tenant}/{}@{}", record.component, record.id)
}

/// `record`'s note, for its root's spawn.
pub(super) fn note(record: &WorkflowRecord) -> Vec<u8> {
    let note = Note { started_ms: record.started_ms, grants: record.grants.clone(), limits: record.limits.clone() };
    serde_json::to_vec(&note).expect("a note is JSON")
}

/// The tenant and the record of the workflow whose root `run` is, from its spawn and
/// note; `None` for a run no start of the service made.
fn workflow(run: &HeldRun) -> Option<(String, WorkflowRecord)> {
    let note: Note = match serde_json::from_slice(run.note.as_deref()?) {
        Ok(note) => note,
        Err(error) => {
            tracing::warn!(root = %run.root, %error, "a workflow's note in the journal does not read; left out");
            return None;
        }
    };
    let (tenant, component, id) = code::parts(run.kind.as_deref()?)?;
    let id = id?;
    let input = run
        .input
        .first()
        .filter(|input| input.format == Format::Json)
        .and_then(|input| serde_json::from_slice(&input.data).ok())
        .filter(|input: &serde_json::Value| !input.is_null());
    let record = WorkflowRecord {
        id: id.to_owned(),
        component: component.to_owned(),
        method: run.method.clone(),
        input,
        pid: run.root.as_u64(),
        state: State::Running,
        started_ms: note.started_ms,
        ended_ms: None,
        result: None,
        grants: note.grants,
        limits: note.limits,
    };
    Some((tenant.to_owned(), record))
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
    for (tenant, record) in runs.iter().filter_map(workflow) {
        if registry.workflow(&tenant, &record.id)?.is_none() {
            lost.push((tenant, record));
        }
    }
    if !lost.is_empty() {
        let records: Vec<(&str, WorkflowRecord)> = lost.iter().map(|(t, w)| (t.as_str(), w.clone())).collect();
        registry.put_journaled(&records)?;
        tracing::warn!(count = lost.len(), "workflow records lost with the machine were made again from the journal");
    }
    Ok(lost.len())
}
