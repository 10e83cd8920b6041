//! What `wasmproc run --journal DIR` checks before it resumes or reports the run a journal
//! holds: that it is the run asked for (the same program, entry method and input), and
//! which grants the command line takes away from it.
//!
//! One journal directory serves one run. A command line that asks for another run than the
//! one its journal holds is refused, naming both: resuming the held run in its place would
//! print that run's result as if it were the one asked for.

use std::path::Path;

use serde_json::Value;
use wasmproc::journal::HeldRun;
use wasmproc::{Capabilities, Payload};

use super::{Exit, Failure};

/// The run a command line asks for.
pub(super) struct Asked<'a> {
    /// The program's file, as given.
    pub(super) app: &'a Path,
    /// The program's hash (`sha256:…`), as a journal records it.
    pub(super) identity: &'a str,
    pub(super) method: &'a str,
    pub(super) input: &'a [Payload],
}

/// Refuses a run whose journal in `dir` holds another run: one made from another program,
/// or with another entry method or input.
///
/// # Errors
///
/// A usage error naming what the journal holds and what was asked, and how to start
/// afresh.
pub(super) fn check(dir: &Path, held: &[HeldRun], asked: &Asked<'_>) -> Result<(), Failure> {
    for run in held {
        let state = match run.result {
            None => "an unfinished run",
            Some(_) => "a finished run",
        };
        let program = run.identity.as_deref().filter(|held| *held != asked.identity);
        let entry = (run.method != asked.method || !same_input(&run.input, asked.input))
            .then(|| (entry(&run.method, &run.input), entry(asked.method, asked.input)));
        let differs = match (program, entry) {
            (None, None) => continue,
            (Some(held), None) => {
                format!("of the program {held}, and `{}` is {}", asked.app.display(), asked.identity)
            }
            (None, Some((held, wanted))) => format!("of {held}, and this command asks for {wanted}"),
            (Some(held), Some((held_entry, wanted))) => format!(
                "of {held_entry} with the program {held}, and this command asks for {wanted} with `{}`, which is {}",
                asked.app.display(),
                asked.identity
            ),
        };
        let dir = dir.display();
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "the journal in `{dir}` holds {state} (process {}) {differs}: one journal serves one run; run the \
                 command that started it to {}, or start afresh: `wasmproc journal forget {dir}` drops it (or give \
                 --journal another directory)",
                run.root,
                if run.result.is_none() { "resume it" } else { "see its result" },
            ),
        ));
    }
    Ok(())
}

/// The notice of a resume whose command line grants otherwise than the run was started
/// with (`recorded`): the run resumes with `recorded` narrowed by `now`, never widened,
/// and this line says what was withdrawn and what was not added.
pub(super) fn narrowing(recorded: &Capabilities, now: &Capabilities) -> Option<String> {
    let quoted = |names: Vec<String>| names.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
    let withdrawn = recorded.not_granted_by(now);
    let not_added = now.not_granted_by(recorded);
    let mut parts = Vec::new();
    if !withdrawn.is_empty() {
        parts.push(format!("{} withdrawn", quoted(withdrawn)));
    }
    if !not_added.is_empty() {
        parts.push(format!("{} not added (a resume never grants what the run was started without)", quoted(not_added)));
    }
    (!parts.is_empty()).then(|| {
        format!(
            "the run resumes with the grants it was started with, narrowed by this command line: {}",
            parts.join("; ")
        )
    })
}

/// How a resumed run's process may be granted `command` it was denied: with `--allow`,
/// unless the run was started without it (`recorded`), which no flag of a resume adds.
pub(super) fn denial_hint(recorded: &Capabilities, command: &str) -> String {
    if recorded.allows(command) {
        format!("grant it with --allow {command}")
    } else {
        "the run was started without it, and a resumed run cannot gain a grant: start the run afresh to grant it"
            .to_owned()
    }
}

/// Whether two inputs are the same: JSON payloads as values (so spacing and key order
/// do not count), others byte for byte.
fn same_input(held: &[Payload], asked: &[Payload]) -> bool {
    held.len() == asked.len() && held.iter().zip(asked).all(|(a, b)| same_payload(a, b))
}

fn same_payload(a: &Payload, b: &Payload) -> bool {
    if a.format != b.format {
        return false;
    }
    if a.format == wasmproc_types::Format::Json
        && let (Ok(a), Ok(b)) = (serde_json::from_slice::<Value>(&a.data), serde_json::from_slice::<Value>(&b.data))
    {
        return a == b;
    }
    a.data == b.data
}

/// Characters of an input shown in a refusal.
const SHOWN: usize = 80;

/// An entry method with its input, as `journal show` writes a spawn: `main({"n": 1})`.
pub(super) fn entry(method: &str, input: &[Payload]) -> String {
    let inputs: Vec<String> = input
        .iter()
        .map(|payload| match std::str::from_utf8(&payload.data) {
            Ok(text) if payload.format == wasmproc_types::Format::Json => {
                let mut chars = text.chars();
                let mut shown: String = chars.by_ref().take(SHOWN).filter(|c| !c.is_control()).collect();
                if chars.next().is_some() {
                    shown.push('…');
                }
                shown
            }
            _ => format!("({} bytes of {})", payload.data.len(), payload.format),
        })
        .collect();
    format!("`{method}({})`", inputs.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_compare_as_json_values() {
        let json = |text: &str| Payload::json(&serde_json::from_str::<Value>(text).unwrap()).unwrap();
        let raw = |text: &str| Payload { format: wasmproc_types::Format::Json, data: text.as_bytes().to_vec() };
        assert!(same_input(&[raw(r#"{"a": 1, "b": [2]}"#)], &[json(r#"{"b":[2],"a":1}"#)]));
        assert!(!same_input(&[json(r#"{"order": "A"}"#)], &[json(r#"{"order": "B"}"#)]));
        assert!(!same_input(&[], &[json("null")]));
        assert!(!same_input(&[Payload::text("1")], &[json("1")]));
    }

    #[test]
    fn an_entry_is_shown_as_journal_show_writes_it_and_cut() {
        let long = format!("\"{}\"", "x".repeat(200));
        let payload = Payload { format: wasmproc_types::Format::Json, data: long.into_bytes() };
        let shown = entry("main", &[payload]);
        assert!(shown.starts_with("`main(\"xxx") && shown.ends_with("…)`"), "{shown}");
        assert_eq!(entry("main", &[]), "`main()`");
    }

    #[test]
    fn the_narrowing_notice_names_what_was_withdrawn_and_what_was_not_added() {
        let recorded = Capabilities::default().deny("terminate").allow("kv.*");
        let now = Capabilities::default().deny("sleep").allow("kv.*");
        let notice = narrowing(&recorded, &now).unwrap();
        assert!(notice.ends_with(
            "narrowed by this command line: `sleep` withdrawn; `terminate` not added (a resume never grants what the \
             run was started without)"
        ));
        assert!(denial_hint(&recorded, "sleep").contains("--allow sleep"));
        assert!(denial_hint(&recorded, "terminate").contains("the run was started without it"));
        assert_eq!(narrowing(&recorded, &recorded), None);
    }
}
