//! `wasmproc inspect`: what a program is and whether it can run, without running it.
//! Exits 0 when it can run, 3 when it cannot (the output says why).

use std::process::ExitCode;

use serde_json::json;

use super::units::count;
use super::{Exit, Failure, InspectArgs, read_app, runtime};

pub(super) fn inspect(args: InspectArgs) -> Result<ExitCode, Failure> {
    let bytes = read_app(&args.app)?;
    let runtime = runtime(args.engine.config())?;
    let found = runtime.inspect(&bytes).map_err(|e| Failure::from_error(Exit::BadModule, &e))?;
    let compiled = if found.precompiled {
        "precompiled (loads without compiling)".to_owned()
    } else {
        match (&found.cache_entry, found.cached) {
            (Some(entry), true) => format!("in the disk cache ({})", entry.display()),
            (Some(entry), false) => format!("was not cached; compiled now and cached ({})", entry.display()),
            (None, _) => "not cached (--no-cache)".to_owned(),
        }
    };
    if args.json {
        let object = json!({
            "file": args.app.display().to_string(),
            "size": found.size,
            "sha256": found.sha256,
            "kind": found.kind.describe(),
            "runnable": found.problem.is_none(),
            "problem": found.problem,
            "entries": found.entries,
            "imports": found.imports,
            "exports": found.exports,
            "precompiled": found.precompiled,
            "cached": found.cached,
            "cache_entry": found.cache_entry.as_ref().map(|p| p.display().to_string()),
        });
        println!("{object:#}");
    } else {
        let list = |items: &[String]| if items.is_empty() { "(none)".to_owned() } else { items.join("\n           ") };
        println!("file:      {} ({} bytes, sha256 {})", args.app.display(), count(found.size), found.sha256);
        println!("kind:      {}", found.kind.describe());
        match &found.problem {
            None => println!("runnable:  yes"),
            Some(problem) => println!("runnable:  no: {problem}"),
        }
        println!(
            "entries:   {}",
            if found.entries.is_empty() { "(none)".to_owned() } else { found.entries.join(", ") }
        );
        println!("imports:   {}", list(&found.imports));
        println!("exports:   {}", list(&found.exports));
        println!("compiled:  {compiled}");
    }
    Ok(if found.problem.is_none() { Exit::Success } else { Exit::BadModule }.into())
}
