//! `wasmproc cache`: what the compiled-code cache holds (`ls`), and removing it (`clean`).

use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Args, Subcommand};
use serde_json::json;
use wasmproc::wasm::{CacheEntry, CompiledCache, Config, DEFAULT_MAX_CACHE_SIZE, Escaped};

use super::output::print_now;
use super::units::{ago, bytes, count};
use super::{CACHE_MAX_SIZE_VAR, Exit, Failure, cache_max_size, units};

/// `wasmproc cache`'s subcommands.
#[derive(Args, Debug)]
pub(super) struct CacheCommand {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// List the entries, least recently used first (the first to go when the cache is
    /// past its cap): size, when written, when last used, the file each was compiled
    /// from (as the command that compiled it was given it), the entry's file (named by
    /// the module's hash); then the total and the cap.
    Ls {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove every entry; with --max-size, only the least recently used until the rest
    /// fit. Files in the directory that are not entries are left alone.
    Clean {
        /// Keep the most recently used entries that fit in SIZE (e.g. 100MiB).
        #[arg(long, value_name = "SIZE", value_parser = units::size)]
        max_size: Option<usize>,
    },
}

impl CacheCommand {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let cache = CompiledCache::of(&Config::default()).ok_or_else(|| {
            Failure::new(Exit::Usage, "there is no compiled-code cache: neither $XDG_CACHE_HOME nor $HOME is set")
        })?;
        let text = match self.verb {
            Verb::Ls { json } => list(&cache, json)?,
            Verb::Clean { max_size } => {
                let cleaned = cache
                    .clean(max_size.map_or(0, |bytes| bytes as u64))
                    .map_err(|e| Failure::from_error(Exit::Host, &e))?;
                format!(
                    "removed {} ({}); {} left ({}) in {}\n",
                    entries(cleaned.removed),
                    bytes(cleaned.freed),
                    entries(cleaned.kept),
                    bytes(cleaned.kept_bytes),
                    cache.dir().display()
                )
            }
        };
        if print_now(&text).is_err() {
            return Ok(Exit::StdoutClosed.into());
        }
        Ok(Exit::Success.into())
    }
}

/// `ls`'s output.
fn list(cache: &CompiledCache, json: bool) -> Result<String, Failure> {
    let found = cache.entries().map_err(|e| Failure::from_error(Exit::Host, &e))?;
    let cap = cache_max_size(None)?.unwrap_or(DEFAULT_MAX_CACHE_SIZE);
    let total: u64 = found.iter().map(|e| e.size).sum();
    let now = SystemTime::now();
    let since = |at: SystemTime| now.duration_since(at).unwrap_or_default();
    let name =
        |entry: &CacheEntry| entry.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    if json {
        let unix = |at: SystemTime| at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let listed: Vec<_> = found
            .iter()
            .map(|e| {
                json!({
                    "file": name(e),
                    "source": e.source,
                    "size": e.size,
                    "written": unix(e.written),
                    "used": unix(e.used),
                })
            })
            .collect();
        let object =
            json!({"dir": cache.dir().display().to_string(), "entries": listed, "total": total, "max_size": cap});
        return Ok(format!("{object:#}\n"));
    }
    // The source as the compiling run was given it, escaped: a path may hold anything.
    let sources: Vec<String> =
        found.iter().map(|e| e.source.as_deref().map_or_else(|| "-".to_owned(), |s| Escaped(s).to_string())).collect();
    let width = sources.iter().map(|s| s.chars().count()).max().unwrap_or(0).max("SOURCE".len());
    let mut text = String::new();
    if !found.is_empty() {
        text.push_str(&format!("{:>10}  {:>7}  {:>8}  {:<width$}  FILE\n", "SIZE", "WRITTEN", "USED", "SOURCE"));
    }
    for (entry, source) in found.iter().zip(&sources) {
        text.push_str(&format!(
            "{:>10}  {:>7}  {:>8}  {source:<width$}  {}\n",
            bytes(entry.size),
            format!("{} ago", ago(since(entry.written))),
            format!("{} ago", ago(since(entry.used))),
            name(entry)
        ));
    }
    text.push_str(&format!(
        "{}, {} of at most {} (--cache-max-size, ${CACHE_MAX_SIZE_VAR}) in {}\n",
        entries(found.len()),
        bytes(total),
        bytes(cap),
        cache.dir().display()
    ));
    Ok(text)
}

/// "1 entry", "3 entries".
fn entries(n: usize) -> String {
    if n == 1 { "1 entry".to_owned() } else { format!("{} entries", count(n as u64)) }
}
