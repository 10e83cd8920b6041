//! Keeps notes in a file of a granted directory, titled from a granted environment
//! variable: the `fs` and `env` providers from a process component.
//!
//! ```text
//! wasmproc run notes.wasm --dir-rw ./notes::/notes --env NOTES_TITLE=Groceries \
//!     --method add --input '"apples"'
//! wasmproc run notes.wasm --dir-rw ./notes::/notes --env NOTES_TITLE=Groceries --method list
//! ```

use wasmproc_guest::prelude::*;
use wasmproc_guest::ErrorCode;

/// Where the notes are, as the process sees the granted directory.
const FILE: &str = "/notes/notes.txt";

/// Appends `text` as a line; answers how many notes there are now.
#[entry]
async fn add(ctx: Ctx, text: String) -> Result<usize> {
    ensure!(!text.contains('\n'), "a note is one line");
    let mut notes = read(&ctx).await?;
    notes.push(text);
    ctx.fs().write(FILE, &(notes.join("\n") + "\n")).await.context("saving the notes")?;
    Ok(notes.len())
}

/// The notes, under their title (`NOTES_TITLE`, or `Notes` when it is not granted).
#[entry]
async fn list(ctx: Ctx, _input: ()) -> Result<String> {
    let title = ctx.env("NOTES_TITLE").await?.unwrap_or_else(|| "Notes".to_owned());
    let notes = read(&ctx).await?;
    let lines: Vec<String> = notes.iter().enumerate().map(|(i, n)| format!("{}. {n}", i + 1)).collect();
    Ok(format!("{title}\n{}", lines.join("\n")))
}

/// The notes so far; none when the file does not exist yet.
async fn read(ctx: &Ctx) -> Result<Vec<String>> {
    match ctx.fs().read_to_string(FILE).await {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(Error::Command { code: ErrorCode::NotFound, .. }) => Ok(Vec::new()),
        Err(error) => Err(error).context("reading the notes"),
    }
}

wasmproc_guest::export!(add, list);
wasmproc_guest::uses!(add: "fs.read", "fs.write");
wasmproc_guest::uses!(list: "fs.read", "env.get");
