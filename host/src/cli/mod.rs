//! The command line: `wasmproc run`, `inspect`, `compile`, `journal`, `cache`, `node`,
//! `cluster`, `serve` and the service's client commands (`service.rs`).
//!
//! Each subcommand is a struct of its flags with `execute(self)` (`run.rs`, `inspect.rs`,
//! `compile.rs`): it parses nothing itself, builds a configuration and calls the library.
//! What the binary reads goes through `input.rs` (bounded reads) and what it writes
//! through `output.rs` (writes that never panic or block a worker); `stop.rs` is how a
//! run ends early (signals, timeout, grace) and `report.rs` what it prints at the end.
//!
//! Every failure is one line on stderr, `error: <what was wrong>: <what to do>`, and an
//! exit code from [`Exit`], so scripts can tell a failed process from a bad module or a
//! typo in a flag.

mod args;
mod cache;
mod compile;
mod input;
mod inspect;
mod journal;
mod node;
mod on_cluster;
mod output;
mod providers;
mod report;
mod resume;
mod run;
mod service;
mod stop;
mod supervise;
mod units;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use wasmproc::wasm::Config;

use self::args::{CACHE_MAX_SIZE_VAR, ClusterArgs, EngineArgs, GrantArgs, LimitArgs, cache_max_size};

/// Exit codes, as `--help` lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The process completed with a result.
    Success = 0,
    /// The process failed: an error result, a trap, or a limit it hit.
    ProcessFailed = 1,
    /// The command line was wrong: an unknown flag, a bad value, an unknown entry
    /// method, input that is not JSON or that the entry method refuses (its `init`
    /// answered an error), a file that cannot be read.
    Usage = 2,
    /// The file is not a program wasmproc can run: not Wasm, the wrong world, does not
    /// compile, or precompiled under other settings.
    BadModule = 3,
    /// `--timeout` passed before the processes finished.
    Timeout = 4,
    /// The host itself could not start (for example the instance pool could not be
    /// reserved).
    Host = 5,
    /// SIGHUP (the terminal went away): processes were cancelled, then stopped.
    HungUp = 129,
    /// Ctrl-C (SIGINT): processes were cancelled, then stopped.
    Interrupted = 130,
    /// stdout was closed before everything was written to it (the code a shell reports
    /// for a program that a broken pipe ended).
    StdoutClosed = 141,
    /// SIGTERM: processes were cancelled, then stopped.
    Terminated = 143,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// Why a subcommand stopped: the exit code and the one-line message for stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(exit: Exit, message: impl Into<String>) -> Self {
        Failure { exit, message: message.into() }
    }

    /// `error`'s whole chain on one line.
    pub(crate) fn from_error(exit: Exit, error: &anyhow::Error) -> Self {
        Failure::new(exit, format!("{error:#}"))
    }
}

const EXIT_CODES: &str = "\
Exit codes:
  0    success (for a WASI command: the program's own exit code)
  1    the process failed (error result, trap, or a limit it hit)
  2    bad usage (flag, value, entry method, input JSON or size, input the entry method
       refuses, unreadable file)
  3    bad module (not Wasm, wrong world, does not compile, too large, precompiled elsewhere)
  4    --timeout passed (a result the entry process gave before is printed all the same)
  5    the host could not start
  129  SIGHUP, 130 Ctrl-C (SIGINT), 143 SIGTERM: processes were cancelled, given --grace
       to end, then stopped (a result the entry process gave is printed); a second
       signal ends wasmproc at once
  141  stdout was closed before the output was written";

const SHORTHAND: &str = "\
`wasmproc APP.wasm [ARGS...]` is short for `wasmproc run APP.wasm -- ARGS...` (when APP.wasm is
not a subcommand's name), so wasmproc serves as a cargo runner for WASI programs:
  CARGO_TARGET_WASM32_WASIP2_RUNNER=wasmproc cargo run --target wasm32-wasip2 -- ARGS";

/// Runs WebAssembly processes on a work-stealing scheduler, sandboxed.
#[derive(Parser, Debug)]
#[command(
    name = "wasmproc",
    version,
    about,
    override_usage = "wasmproc [OPTIONS] <COMMAND>\n       wasmproc [OPTIONS] <APP.wasm> [ARGS]...",
    after_help = format!("{SHORTHAND}\n\n{EXIT_CODES}"),
    max_term_width = 100
)]
struct Cli {
    #[command(flatten)]
    logging: output::Logging,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a program: its entry process and everything it spawns, until all finish.
    #[command(after_help = format!("{}\n\n{EXIT_CODES}", run::after_help()))]
    Run(Box<run::Run>),
    /// Describe a program: what it is, whether it can run, entries, imports, exports, cache.
    Inspect(inspect::Inspect),
    /// Precompile a program, so that `run` loads it without compiling.
    Compile(compile::Compile),
    /// The journal of a durable run (`run --journal DIR`): `ls` its processes, `show` one's
    /// history, `verify` its replay offline, `cancel` its unfinished run, `forget` its runs.
    Journal(journal::JournalCommand),
    /// The compiled-code cache: `ls` its entries (size, age, last use, total), `clean`
    /// them (all, or the least recently used past --max-size).
    Cache(cache::CacheCommand),
    /// Join a cluster through its NATS server and run what it is given until stopped.
    Node(Box<node::Node>),
    /// Use a cluster: `ls` its nodes, their load and their components; `run` a program
    /// on it (as `run APP --cluster URL`).
    Cluster(Box<node::ClusterCommand>),
    /// Run the service: durable workflows of many tenants behind an HTTP API, resumed
    /// after any restart. `deploy`, `start`, `status`, `result`, `ps`… talk to it.
    Serve(service::Serve),
    #[command(flatten)]
    Client(service::ClientCommand),
}

/// Parses the command line, runs the subcommand, and turns its outcome into an exit code.
pub(crate) fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches_from(expand_shorthand(std::env::args_os().collect()))
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            // `--help` and `--version` go to stdout; `print` reports a closed one.
            return match (error.print(), error.use_stderr()) {
                (_, true) => Exit::Usage.into(),
                (Ok(()), false) => Exit::Success.into(),
                (Err(_), false) => Exit::StdoutClosed.into(),
            };
        }
    };
    cli.logging.install();
    let outcome = match cli.command {
        Command::Run(run) => run.execute(Given::of(&matches, &["run"])),
        Command::Inspect(inspect) => inspect.execute(),
        Command::Compile(compile) => compile.execute(),
        Command::Journal(journal) => journal.execute(),
        Command::Cache(cache) => cache.execute(),
        Command::Node(node) => node.execute(),
        Command::Cluster(cluster) => cluster.execute(Given::of(&matches, &["cluster", "run"])),
        Command::Serve(serve) => serve.execute(),
        Command::Client(client) => client.execute(),
    };
    match outcome {
        Ok(code) => code,
        Err(failure) => {
            output::say_now(output::Say::Error, &failure.message);
            failure.exit.into()
        }
    }
}

/// The command line with the shorthand `wasmproc [GLOBAL FLAGS] APP.wasm [ARGS...]`
/// written out as `wasmproc [GLOBAL FLAGS] run --shorthand APP.wasm -- ARGS...`; any
/// other command line as it is. `--shorthand` (hidden) lets `run` tell a user who typed
/// no `--` what the shorthand did with their words.
///
/// The shorthand applies when the first word past the global flags is no subcommand and
/// no flag, and looks like a file: it exists, or its name has a `.` or a `/`. So a
/// mistyped subcommand (`wasmproc lanch`) is still clap's error, which points at
/// `--help`, not a missing file.
fn expand_shorthand(mut args: Vec<OsString>) -> Vec<OsString> {
    let mut at = 1;
    while let Some(word) = args.get(at).and_then(|a| a.to_str()) {
        at += match word {
            "-q" | "--quiet" | "--verbose" => 1,
            "--log-format" => 2,
            _ if word.starts_with("--log-format=") => 1,
            _ if word.len() > 1 && word.starts_with('-') && word[1..].bytes().all(|b| b == b'v') => 1,
            _ => break,
        };
    }
    let Some(first) = args.get(at) else { return args };
    let command = Cli::command();
    let named = |name: &str| {
        name == "help"
            || command.get_subcommands().any(|c| c.get_name() == name || c.get_all_aliases().any(|a| a == name))
    };
    let looks_like_a_file = {
        let text = first.to_string_lossy();
        !text.starts_with('-') && !named(&text) && (text.contains(['.', '/']) || Path::new(first).exists())
    };
    if looks_like_a_file {
        args.insert(at + 1, "--".into());
        args.insert(at, run::SHORTHAND_FLAG.into());
        args.insert(at, "run".into());
    }
    args
}

/// Which flags of a subcommand the user gave (on the command line or through an
/// environment variable), as opposed to those left at their defaults: what `run
/// --cluster` refuses by name must be told from a default it never applies.
#[derive(Clone, Copy)]
pub(super) struct Given<'a>(Option<&'a ArgMatches>);

impl<'a> Given<'a> {
    /// The flags of the subcommand at `path` (e.g. `["cluster", "run"]`), if it ran.
    fn of(matches: &'a ArgMatches, path: &[&str]) -> Given<'a> {
        let found = path.iter().try_fold(matches, |matches, name| matches.subcommand_matches(name));
        Given(found)
    }

    /// Whether the flag whose clap id is `id` (its field's name) was given.
    pub(super) fn has(self, id: &str) -> bool {
        let Some(matches) = self.0 else { return false };
        matches.try_get_raw(id).is_ok_and(|raw| raw.is_some())
            && matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    }
}

/// The runtime for `engine`; failing to create it is the host's failure.
pub(super) fn runtime(config: Config) -> Result<wasmproc::wasm::Runtime, Failure> {
    wasmproc::wasm::Runtime::new(config)
        .map_err(|e| Failure::new(Exit::Host, format!("cannot start the Wasm runtime: {e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(args: &[&str]) -> Vec<String> {
        let args = std::iter::once("wasmproc").chain(args.iter().copied()).map(OsString::from).collect();
        expand_shorthand(args).into_iter().skip(1).map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_shorthand_is_run_with_the_rest_as_program_arguments() {
        assert_eq!(expanded(&["app.wasm", "-x", "--y"]), ["run", "--shorthand", "app.wasm", "--", "-x", "--y"]);
        assert_eq!(
            expanded(&["-v", "--log-format", "json", "./app"]),
            ["-v", "--log-format", "json", "run", "--shorthand", "./app", "--"]
        );
        assert_eq!(expanded(&["-qq", "a.wat"]), ["-qq", "a.wat"], "-qq is no global flag");
        for unchanged in [&["run", "app.wasm"][..], &["inspect", "a.wasm"], &["help"], &["lanch"], &["--help"], &[]] {
            assert_eq!(expanded(unchanged), unchanged, "{unchanged:?}");
        }
    }

    /// clap's own checks of the whole tree (conflicting names, defaults that do not
    /// parse, …), which it otherwise makes only when a flag is used.
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
