//! The command line: `wasmproc run`, `inspect` and `compile`.
//!
//! Every failure is one line on stderr, `error: <what was wrong>: <what to do>`, and an
//! exit code from [`Exit`], so scripts can tell a failed process from a bad module or a
//! typo in a flag.

mod compile;
mod inspect;
mod output;
mod run;
mod units;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

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
    Run(Box<RunArgs>),
    /// Describe a program: what it is, whether it can run, entries, imports, exports, cache.
    Inspect(InspectArgs),
    /// Precompile a program, so that `run` loads it without compiling.
    Compile(CompileArgs),
}

/// Engine settings that compiled code depends on: `compile` and `run` must agree.
#[derive(Args, Debug, Clone)]
struct EngineArgs {
    /// Linear memory cap of each process, e.g. 64MiB or 1GiB. Also each process's share
    /// of address space: processes × memory must fit in 128 TiB.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = units::memory)]
    memory: usize,
    /// Total fuel of each process over its life (about one unit per Wasm instruction),
    /// at least 1; a process that uses it up fails. Turns on fuel metering, which slows
    /// guests somewhat. [default: unlimited, no metering]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    fuel: Option<u64>,
    /// Keep compiled code out of the disk cache ($XDG_CACHE_HOME/wasmproc or
    /// ~/.cache/wasmproc): compile afresh and write nothing.
    #[arg(long)]
    no_cache: bool,
    /// The largest program file accepted, e.g. 128MiB: a larger file is refused before
    /// it is read or compiled.
    #[arg(long, value_name = "SIZE", default_value = "128MiB", value_parser = units::size)]
    max_module_size: usize,
    /// The most functions compiled for one program (its core modules' functions plus a
    /// component's lifts and lowers); a program with more is refused before compiling.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    max_functions: u32,
    /// The largest function body compiled, e.g. 1MiB; a program with a larger one is
    /// refused before compiling.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = units::size)]
    max_function_size: usize,
    /// Load files made by `wasmproc compile` with another user's key (or on another
    /// machine): they are native code, so only files from a source you trust as you
    /// trust a binary.
    #[arg(long)]
    trust_precompiled: bool,
}

impl EngineArgs {
    fn config(&self) -> Config {
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

#[derive(Args, Debug)]
struct RunArgs {
    /// The program: a component of the wasmproc:process world, a WASI command
    /// (a wasi:cli/run component or a preview 1 module with _start), or a file made by
    /// `wasmproc compile`.
    #[arg(value_name = "APP.wasm")]
    app: PathBuf,
    /// The entry method the first process starts in. [default: main; run for a WASI
    /// command]
    #[arg(long, short, value_name = "NAME")]
    method: Option<String>,
    /// An input payload, as JSON. Repeat for several; SDK entries take the first.
    #[arg(long = "input", short, value_name = "JSON")]
    inputs: Vec<String>,
    /// Read an input payload (JSON) from FILE, or from stdin with `-`. Comes after the
    /// --input payloads.
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
    /// Worker threads. [default: one per core]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: Option<u32>,
    #[command(flatten)]
    engine: EngineArgs,
    /// How long a step runs before it is preempted: suspended and queued behind the
    /// processes waiting, so a busy or looping process never holds a worker (a bare
    /// number is milliseconds). While others wait, a step yields sooner, at the next
    /// 1 ms tick. A WASI command's run is preempted the same way.
    #[arg(long, value_name = "DURATION", default_value = "10ms", value_parser = units::millis)]
    time_slice: Duration,
    /// A step past its time slice fails its process instead of being preempted. Steps
    /// are cheaper without preemption (see BENCHMARKS.md): for trusted guests only.
    #[arg(long)]
    no_preemption: bool,
    /// Total CPU time each process may use over its life (e.g. 2s); a process past it
    /// fails. Bounds a looping process, which preemption alone lets live.
    /// [default: unlimited]
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    cpu_budget: Option<Duration>,
    /// Stop everything after DURATION (e.g. 30s, 5m): cancel every process, give them
    /// --grace to end, then terminate the rest. Exit code 4; a result the entry process
    /// gave before is printed all the same. [default: no limit]
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    timeout: Option<Duration>,
    /// How long a stopped run (--timeout, Ctrl-C, SIGTERM, SIGHUP) gives its processes to
    /// end once cancelled, before it terminates them.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = units::duration)]
    grace: Duration,
    /// The most processes alive at once; spawns past it fail (in the spawning process).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_processes: u32,
    /// The most live children one process may have; a spawn past it ends that process.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    max_children: usize,
    /// The most commands one step may yield; a step past it ends its process.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_yields: u32,
    /// The largest payload a process may send, spawn with, pass to a command or return,
    /// e.g. 16MiB; past it the process ends.
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = units::size)]
    max_payload: usize,
    /// Messages a process's mailbox holds; a send to a full mailbox fails for the sender.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    mailbox: u32,
    /// Grant a command to every process (repeatable). Granted by default: sleep, spawn,
    /// send, monitor. Not granted unless allowed: terminate.
    #[arg(long = "allow", value_name = "COMMAND")]
    allow: Vec<String>,
    /// Withdraw a granted command (repeatable), e.g. --deny spawn.
    #[arg(long = "deny", value_name = "COMMAND")]
    deny: Vec<String>,
    /// WASI commands only: give the program the host directory HOST, read-only, as
    /// GUEST (default: the same path). Repeatable.
    #[arg(long, value_name = "HOST[::GUEST]")]
    dir: Vec<String>,
    /// WASI commands only: as --dir, writable. The program may create symbolic links
    /// in it that point anywhere: it cannot follow them out of the directory, but a host
    /// tool that later walks the directory following links would (see SECURITY.md).
    #[arg(long, value_name = "HOST[::GUEST]")]
    dir_rw: Vec<String>,
    /// WASI commands only: set NAME=VALUE in the program's environment, or pass NAME
    /// through from the host's. Repeatable.
    #[arg(long, value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// Print a summary at exit (stderr, or in the --json object): processes, steps,
    /// yields by command, messages, steals, per-worker steps, peak live, wall time.
    #[arg(long)]
    stats: bool,
    /// Show a live status line on stderr while running (only when stderr is a terminal).
    #[arg(long)]
    progress: bool,
    /// Print one JSON object on stdout: {"ok": RESULT} or {"error": MESSAGE} (a WASI
    /// command: {"exit_code": N}), with "stats" when --stats is given.
    #[arg(long)]
    json: bool,
    /// WASI commands only: the program's arguments (after `--`); its argv[0] is the
    /// file name.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The program to describe (Wasm, or a file made by `wasmproc compile`).
    #[arg(value_name = "APP.wasm")]
    app: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Args, Debug)]
struct CompileArgs {
    /// The program to compile.
    #[arg(value_name = "APP.wasm")]
    app: PathBuf,
    /// Where to write the precompiled file. [default: APP.cwasm beside the input]
    #[arg(long, short, value_name = "OUT")]
    output: Option<PathBuf>,
    /// Compile for runs with these settings: `run` must agree on fuel metering (--fuel
    /// given or not), or it refuses the file and says so.
    #[command(flatten)]
    engine: EngineArgs,
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
        Command::Run(args) => run::run(*args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Compile(args) => compile::compile(args),
    };
    match outcome {
        Ok(code) => code,
        Err(failure) => {
            output::eprint_now(&format!("error: {}", failure.message));
            failure.exit.into()
        }
    }
}

/// Reads the program file, refusing before reading it whole what cannot be a program: a
/// path that is not a regular file (a FIFO, a device such as `/dev/zero`, a directory),
/// a file larger than `max_size`, or one whose first bytes are neither Wasm's header nor
/// a precompiled file's. Opened without blocking, so a FIFO is refused, not waited on.
/// A path that cannot be read is a usage error (the path is wrong); a file that cannot
/// be a program is a bad module.
fn read_app(path: &Path, max_size: u64) -> Result<Vec<u8>, Failure> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};

    let shown = path.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound { ": check the path" } else { "" };
            Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}{hint}"))
        })?;
    let metadata = file.metadata().map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}")))?;
    let file_type = metadata.file_type();
    if !file_type.is_file() {
        let what = match () {
            () if file_type.is_dir() => "a directory",
            () if file_type.is_fifo() => "a FIFO",
            () if file_type.is_char_device() => "a character device",
            () if file_type.is_block_device() => "a block device",
            () if file_type.is_socket() => "a socket",
            () => "not a regular file",
        };
        return Err(Failure::new(
            Exit::Usage,
            format!("`{shown}` is {what}: give the path of a .wasm file (or of a file made by `wasmproc compile`)"),
        ));
    }
    if metadata.len() > max_size {
        return Err(Failure::new(
            Exit::BadModule,
            format!(
                "`{shown}` is {} bytes, larger than --max-module-size ({max_size} bytes): raise it if the file is a \
                 program you trust",
                metadata.len()
            ),
        ));
    }
    let mut header = [0u8; 8];
    let mut reader = file.take(max_size);
    let got = read_up_to(&mut reader, &mut header)
        .map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}")))?;
    let header = &header[..got];
    // Wasm (`\0asm`) and wasmproc's precompiled files (`\0wasmproc…`) both begin with a
    // NUL; ELF files are let through so that the loader can say what they are.
    if !(header.starts_with(b"\0") || header.starts_with(b"\x7fELF")) {
        return Err(Failure::new(
            Exit::BadModule,
            format!(
                "cannot load `{shown}`: not a WebAssembly file: it does not start with the `\\0asm` header (nor is it a \
                 file made by `wasmproc compile`)"
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    bytes.extend_from_slice(header);
    reader.read_to_end(&mut bytes).map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}")))?;
    Ok(bytes)
}

/// Reads until `buffer` is full or the end of the input: how many bytes it holds.
fn read_up_to(reader: &mut impl std::io::Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The runtime for `engine`; failing to create it is the host's failure.
fn runtime(config: Config) -> Result<wasmproc::wasm::Runtime, Failure> {
    let runtime = wasmproc::wasm::Runtime::new(config)
        .map_err(|e| Failure::new(Exit::Host, format!("cannot start the Wasm runtime: {e:#}")))?;
    for warning in runtime.warnings() {
        output::eprint_now(&format!("warning: {warning}"));
    }
    Ok(runtime)
}
