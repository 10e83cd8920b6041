//! `wasmproc inspect`: what a program is and whether it can run, without running it.
//! Exits 0 when it can run, 3 when it cannot (the output says why).

pub(super) mod declared;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use serde_json::{Value, json};

use self::declared::{Declared, grant};
use super::input::read_app;
use super::output::print_now;
use super::units::count;
use super::{EngineArgs, Exit, Failure, runtime};

/// `wasmproc inspect`'s flags.
#[derive(Args, Debug)]
pub(super) struct Inspect {
    /// The program to describe (Wasm or its text format, or a file made by `wasmproc
    /// compile`).
    #[arg(value_name = "APP.wasm")]
    app: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

impl Inspect {
    /// Describes the program; see the module docs for the exit code.
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let bytes = read_app(&self.app, self.engine.max_module_size as u64)?;
        // Inspecting instantiates a process component once (to ask for its `entries`): one
        // arena slot, not `max_instances`' address space (which `ulimit -v` would refuse).
        let runtime = runtime(self.engine.config()?.max_instances(1))?;
        runtime.name_source(&bytes, &self.app);
        let found = runtime.inspect(&bytes).map_err(|e| Failure::from_error(Exit::BadModule, &e))?;
        let compiled = if found.precompiled {
            "precompiled (loads without compiling)".to_owned()
        } else {
            match (&found.cache_entry, found.cached) {
                (Some(entry), true) => format!("in the disk cache ({})", entry.display()),
                (Some(entry), false) => format!("was not cached; compiled now and cached ({})", entry.display()),
                (None, _) if self.engine.no_cache => "not cached (--no-cache)".to_owned(),
                (None, _) => "compiled now, not cached (the disk cache is not in use: see the warning)".to_owned(),
            }
        };
        // A provider component imports what answers requests (the `handler` world); the
        // SDK leaves the import out of a component that never answers one.
        let provider = found.imports.iter().any(|import| import.starts_with("wasmproc:process/provider"));
        let kind = if provider {
            "provider component (wasmproc:process handler world: run it with --provider NAME=FILE)"
        } else {
            found.kind.describe()
        };
        // A precompiled file is the engine's code, without the component's custom sections.
        let declared = (!found.precompiled).then(|| Declared::read(&bytes));
        let text = if self.json {
            let object = json!({
                "file": self.app.display().to_string(),
                "size": found.size,
                "sha256": found.sha256,
                "compiled_from_sha256": found.source_sha256,
                "kind": kind,
                "provider": provider,
                "runnable": found.problem.is_none(),
                "problem": found.problem,
                "entries": found.entries,
                "imports": found.imports,
                "exports": found.exports,
                "commands": commands_json(declared.as_ref()),
                "precompiled": found.precompiled,
                "cached": found.cached,
                "cache_entry": found.cache_entry.as_ref().map(|p| p.display().to_string()),
            });
            format!("{object:#}\n")
        } else {
            let list =
                |items: &[String]| if items.is_empty() { "(none)".to_owned() } else { items.join("\n           ") };
            let runnable = match &found.problem {
                None => "yes".to_owned(),
                Some(problem) => format!("no: {problem}"),
            };
            let entries = if found.entries.is_empty() { "(none)".to_owned() } else { found.entries.join(", ") };
            // A precompiled file's own hash is the file's; the hash of its source is what its
            // header says, shown apart so that neither passes for the other.
            let source = found.source_sha256.as_ref().map(|source| format!("source:    compiled from sha256 {source}"));
            [
                Some(format!(
                    "file:      {} ({} bytes, sha256 {})",
                    self.app.display(),
                    count(found.size),
                    found.sha256
                )),
                source,
                Some(format!("kind:      {kind}")),
                Some(format!("runnable:  {runnable}")),
                Some(format!("entries:   {entries}")),
                Some(format!("imports:   {}", list(&found.imports))),
                Some(format!("exports:   {}", list(&found.exports))),
                Some(format!("commands:  {}", commands_text(declared.as_ref()))),
                Some(format!("compiled:  {compiled}\n")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n")
        };
        if print_now(&text).is_err() {
            return Ok(Exit::StdoutClosed.into());
        }
        Ok(if found.problem.is_none() { Exit::Success } else { Exit::BadModule }.into())
    }
}

/// The `commands` line's value: what the component declares it yields (`None`: a
/// precompiled file, which does not keep the declaration), one command a line with the
/// grant it needs from `wasmproc run`.
fn commands_text(declared: Option<&Declared>) -> String {
    match declared {
        None => "unknown: a precompiled file keeps no declaration (inspect the .wasm it was compiled from)".to_owned(),
        Some(Declared::Undeclared) => {
            "not declared (the component has no `wasmproc:commands` section: see `wasmproc_guest::uses!`)".to_owned()
        }
        Some(Declared::Unreadable(why)) => format!("unreadable: {why}"),
        Some(Declared::Commands { commands, scoped, skipped }) => {
            let width = commands.iter().map(String::len).max().unwrap_or(0);
            let mut lines: Vec<String> = commands
                .iter()
                .map(|command| match entries_of(scoped, command) {
                    Some(entries) => format!("{command:width$}  {} (by {})", grant(command), entries.join(", ")),
                    None => format!("{command:width$}  {}", grant(command)),
                })
                .collect();
            if lines.is_empty() {
                lines.push("none (the component declares that it yields no commands)".to_owned());
            }
            if *skipped > 0 {
                lines.push(format!("(and {skipped} declaration(s) in a newer format this wasmproc does not read)"));
            }
            lines.join("\n           ")
        }
    }
}

/// The entry methods `command` is declared for, if not for every one (`uses!(list:
/// …)`).
fn entries_of<'a>(scoped: &'a [(String, Vec<String>)], command: &str) -> Option<&'a [String]> {
    scoped.iter().find(|(c, _)| c == command).map(|(_, entries)| entries.as_slice())
}

/// The `commands` object of `--json`: `declared` says whether the component declares
/// them, `commands` lists them with their grants and the entry methods each is declared
/// for (`entries`, `null` for every one) (`null` when not declared: not the same as none),
/// `note` says why they are not known.
fn commands_json(declared: Option<&Declared>) -> Value {
    match declared {
        None => json!({
            "declared": false,
            "commands": null,
            "note": "a precompiled file keeps no declaration",
        }),
        Some(Declared::Undeclared) => json!({
            "declared": false,
            "commands": null,
            "note": "the component has no `wasmproc:commands` section",
        }),
        Some(Declared::Unreadable(why)) => json!({
            "declared": true,
            "commands": null,
            "note": format!("unreadable: {why}"),
        }),
        Some(Declared::Commands { commands, scoped, skipped }) => json!({
            "declared": true,
            "commands": commands
                .iter()
                .map(|c| json!({ "name": c, "grant": grant(c), "entries": entries_of(scoped, c) }))
                .collect::<Vec<_>>(),
            "note": (*skipped > 0).then(|| format!("{skipped} declaration(s) in a newer format were skipped")),
        }),
    }
}
