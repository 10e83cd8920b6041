//! The command line: `wasmproc run`, `inspect`, `compile` and `journal`.
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

mod compile;
mod input;
mod inspect;
mod journal;
mod output;
mod providers;
mod report;
mod run;
mod stop;
mod units;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use wasmproc::wasm::Config;

/// Exit codes, as `--help` lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The process completed with a result.
    Success = 0,
    /// The process failed: an error result, a trap, or a limit it hit.
    ProcessFailed = 1,
    /// The command line was wrong: an unknown flag, a bad value, an unknown entry
    /// method, input that is not JSON, a file that cannot be read.
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
  2    bad usage (flag, value, entry method, input JSON or size, unreadable file)
  3    bad module (not Wasm, wrong world, does not compile, too large, precompiled elsewhere)
  4    --timeout passed (a result the entry process gave before is printed all the same)
  5    the host could not start
  129  SIGHUP, 130 Ctrl-C (SIGINT), 143 SIGTERM: processes were cancelled, given --grace
       to end, then stopped (a result the entry process gave is printed); a second
       signal ends wasmproc at once
  141  stdout was closed before the output was written";

/// Runs WebAssembly processes on a work-stealing scheduler, sandboxed.
#[derive(Parser, Debug)]
#[command(name = "wasmproc", version, about, after_help = EXIT_CODES, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a program: its entry process and everything it spawns, until all finish.
    #[command(after_help = format!("{}\n\n{EXIT_CODES}", run::AFTER_HELP))]
    Run(Box<run::Run>),
    /// Describe a program: what it is, whether it can run, entries, imports, exports, cache.
    Inspect(inspect::Inspect),
    /// Precompile a program, so that `run` loads it without compiling.
    Compile(compile::Compile),
    /// Read the journal of a durable run (`run --journal DIR`): `ls` its processes,
    /// `show` one's history, `verify` its replay offline.
    Journal(journal::JournalCommand),
}

/// Engine settings that compiled code depends on: `compile` and `run` must agree.
#[derive(Args, Debug, Clone)]
pub(super) struct EngineArgs {
    /// Linear memory cap of each process, e.g. 64MiB or 1GiB. Also each process's share
    /// of address space: processes × memory must fit in 128 TiB.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = units::memory)]
    pub(super) memory: usize,
    /// Total fuel of each process over its life (about one unit per Wasm instruction),
    /// at least 1; a process that uses it up fails. Turns on fuel metering, which slows
    /// guests somewhat. [default: unlimited, no metering]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) fuel: Option<u64>,
    /// Keep compiled code out of the disk cache ($XDG_CACHE_HOME/wasmproc or
    /// ~/.cache/wasmproc): compile afresh and write nothing.
    #[arg(long)]
    pub(super) no_cache: bool,
    /// The largest program file accepted, e.g. 128MiB: a larger file is refused before
    /// it is read or compiled.
    #[arg(long, value_name = "SIZE", default_value = "128MiB", value_parser = units::size)]
    pub(super) max_module_size: usize,
    /// The most functions compiled for one program (its core modules' functions plus a
    /// component's lifts and lowers); a program with more is refused before compiling.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub(super) max_functions: u32,
    /// The largest function body compiled, e.g. 1MiB; a program with a larger one is
    /// refused before compiling.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = units::size)]
    pub(super) max_function_size: usize,
    /// Load files made by `wasmproc compile` with another user's key (or on another
    /// machine): they are native code, so only files from a source you trust as you
    /// trust a binary.
    #[arg(long)]
    pub(super) trust_precompiled: bool,
}

impl EngineArgs {
    pub(super) fn config(&self) -> Config {
        let mut config = Config::default()
            .max_memory(self.memory)
            .max_module_size(self.max_module_size)
            .max_functions(self.max_functions)
            .max_function_size(self.max_function_size);
        if self.trust_precompiled {
            // SAFETY: `trust_precompiled` asks that every precompiled file the runtime
            // loads come from a trusted source: the user vouches for that by passing
            // --trust-precompiled, whose help says the files are native code to trust as
            // a binary.
            config = unsafe { config.trust_precompiled(true) };
        }
        if let Some(fuel) = self.fuel {
            config = config.fuel(fuel);
        }
        if self.no_cache {
            config = config.no_disk_cache();
        }
        config
    }
}

/// Parses the command line, runs the subcommand, and turns its outcome into an exit code.
pub(crate) fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // `--help` and `--version` go to stdout; `print` reports a closed one.
            return match (error.print(), error.use_stderr()) {
                (_, true) => Exit::Usage.into(),
                (Ok(()), false) => Exit::Success.into(),
                (Err(_), false) => Exit::StdoutClosed.into(),
            };
        }
    };
    output::install_tracing();
    let outcome = match cli.command {
        Command::Run(run) => run.execute(),
        Command::Inspect(inspect) => inspect.execute(),
        Command::Compile(compile) => compile.execute(),
        Command::Journal(journal) => journal.execute(),
    };
    match outcome {
        Ok(code) => code,
        Err(failure) => {
            output::eprint_now(&format!("error: {}", failure.message));
            failure.exit.into()
        }
    }
}

/// The runtime for `engine`; failing to create it is the host's failure.
pub(super) fn runtime(config: Config) -> Result<wasmproc::wasm::Runtime, Failure> {
    wasmproc::wasm::Runtime::new(config)
        .map_err(|e| Failure::new(Exit::Host, format!("cannot start the Wasm runtime: {e:#}")))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    /// clap's own checks of the whole tree (conflicting names, defaults that do not
    /// parse, …), which it otherwise makes only when a flag is used.
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
