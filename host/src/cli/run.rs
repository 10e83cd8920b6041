//! `wasmproc run`: spawns the entry process and waits for it and everything it spawned.
//!
//! The main thread waits on one channel for whichever comes first: the entry process's
//! result (from a joining thread), a signal (SIGINT, SIGTERM or SIGHUP, from the signal
//! thread) or the timeout (as the channel's deadline). Ending early is always graceful
//! first: every process gets a cancel event and `--grace` to end; what is left is then
//! terminated, at its next epoch tick whatever it is doing. A result the entry process
//! gave before the end is printed whatever ended the run.
//!
//! Nothing the run writes can hold it up (see `output.rs`), and nothing a step does can
//! hold up its end: a step blocked outside Wasm (a WASI program writing to a pipe nobody
//! reads) is left behind when the host exits.

use std::io::{IsTerminal as _, Read as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc::wasm::{COMMAND_ENTRY, CommandOptions, LogRecord, Program, exit_code};
use wasmproc::{BUILTIN_COMMANDS, Capabilities, Format, Outcome, Payload, Scheduler, SpawnOptions, Stats};

use super::output::Output;
use super::units::count;
use super::{Exit, Failure, RunArgs, read_app, runtime};

pub(super) const AFTER_HELP: &str = "\
Examples:
  wasmproc run app.wasm --method main --input '{\"n\": 10}'
  wasmproc run app.wasm --input-file job.json --timeout 30s --stats
  wasmproc run tool.wasm --dir ./data::/data -- --verbose input.txt   (a WASI command)

The result is printed on stdout (JSON as the process gave it); logs and guest output go
to stderr, tagged with the process id. A WASI command's own stdin/stdout/stderr are
passed through and its exit code becomes wasmproc's.

Sandbox defaults: 64MiB of memory for each process, steps preempted every 10ms, no CPU or
fuel limit, no files, no environment, no network; the commands sleep, spawn, send and
monitor are granted, terminate is not (--allow terminate).";

/// How long a run that was stopped waits for its output to be written, past its
/// `--timeout`, before it exits all the same: a stream nobody reads cannot hold it.
const FLUSH_AFTER_STOP: Duration = Duration::from_millis(200);

/// How long, after the grace period and the terminations, a stopped run waits for its
/// workers' steps to return before exiting without them: a step blocked in a write to a
/// stream nobody reads (a WASI command's own stdout) never returns.
const STEPS_AFTER_STOP: Duration = Duration::from_millis(200);

/// How long a stopped run waits for the entry process's result to reach it once the
/// process has ended (or for good, if a step is stuck).
const JOIN_AFTER_STOP: Duration = Duration::from_millis(200);

/// How long after the entry process ends the run waits quietly for the processes it
/// spawned before saying that it is still waiting.
const NOTICE_AFTER: Duration = Duration::from_secs(2);

enum Signal {
    /// The entry process ended with this.
    Done(Outcome),
    /// SIGINT, SIGTERM or SIGHUP: the first one (a second ends the host at once).
    Stop(i32),
}

/// Why a run was stopped before everything in it ended.
#[derive(Clone, Copy)]
enum Stop {
    Timeout(Duration),
    Signal(i32),
}

impl Stop {
    fn exit(self) -> Exit {
        match self {
            Stop::Timeout(_) => Exit::Timeout,
            Stop::Signal(signal_hook::consts::SIGHUP) => Exit::HungUp,
            Stop::Signal(signal_hook::consts::SIGTERM) => Exit::Terminated,
            Stop::Signal(_) => Exit::Interrupted,
        }
    }

    /// The cancel reason processes get, and the error of an entry process that had no
    /// result.
    fn reason(self) -> String {
        match self {
            Stop::Timeout(timeout) => format!("timed out after {}", humantime::format_duration(timeout)),
            Stop::Signal(signal_hook::consts::SIGHUP) => "hung up (SIGHUP)".to_owned(),
            Stop::Signal(signal_hook::consts::SIGTERM) => "terminated (SIGTERM)".to_owned(),
            Stop::Signal(_) => "interrupted".to_owned(),
        }
    }

    /// What the `--json` object says in its `"stopped"` field.
    fn name(self) -> &'static str {
        match self {
            Stop::Timeout(_) => "timeout",
            Stop::Signal(signal_hook::consts::SIGHUP) => "SIGHUP",
            Stop::Signal(signal_hook::consts::SIGTERM) => "SIGTERM",
            Stop::Signal(_) => "SIGINT",
        }
    }
}

pub(super) fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let start = Instant::now();
    let out = Output::start();
    let (tx, rx) = mpsc::channel();
    let started = Arc::new(AtomicBool::new(false));
    listen_for_signals(tx.clone(), started.clone())?;
    let inputs = inputs(&args)?;
    let caps = capabilities(&args)?;
    let bytes = read_app(&args.app, args.engine.max_module_size as u64)?;
    let guest_out = out.clone();
    let mut config = args
        .engine
        .config()
        .time_slice(args.time_slice)
        .preemption(!args.no_preemption)
        .max_instances(args.max_processes)
        .log_sink(move |record: &LogRecord<'_>| guest_out.guest_line(&record.to_string()));
    if let Some(budget) = args.cpu_budget {
        config = config.cpu_budget(budget);
    }
    let runtime = runtime(config)?;
    let program = runtime
        .load_program_bytes(&bytes)
        .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", args.app.display())))?;
    drop(bytes);

    let mut builder = Scheduler::builder()
        .capabilities(caps)
        .max_processes(args.max_processes as usize)
        .max_children(args.max_children)
        .max_yields_per_step(args.max_yields as usize)
        .max_payload_size(args.max_payload)
        .mailbox_capacity(args.mailbox as usize);
    if let Some(workers) = args.workers {
        builder = builder.workers(workers as usize);
    }
    let interrupt = Arc::new(AtomicBool::new(false));
    let (root, is_command) = match program {
        Program::Process(component) => {
            refuse_command_flags(&args)?;
            let method = args.method.clone().unwrap_or_else(|| "main".to_owned());
            if !component.entries().contains(&method) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "`{}` has no entry method `{method}`: pass --method with one of: {}",
                        args.app.display(),
                        component.entries().join(", ")
                    ),
                ));
            }
            builder = builder.kind("app", component.clone());
            (Root::Process { method, inputs }, false)
        }
        Program::Command(command) => {
            if let Some(method) = args.method.as_ref().filter(|m| *m != COMMAND_ENTRY) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "`{}` is a WASI command: it has no entry method `{method}` (drop --method)",
                        args.app.display()
                    ),
                ));
            }
            if !inputs.is_empty() {
                return Err(Failure::new(
                    Exit::Usage,
                    "a WASI command takes no --input: pass its arguments after `--`".to_owned(),
                ));
            }
            let options = command_options(&args, interrupt.clone())?;
            (Root::Command(Box::new(command.process(options))), true)
        }
    };
    let scheduler =
        builder.build().map_err(|e| Failure::new(Exit::Host, format!("cannot start the scheduler: {e:#}")))?;
    started.store(true, Ordering::SeqCst);
    let process = match root {
        Root::Process { method, inputs } => scheduler.spawn_kind("app", &method, inputs),
        Root::Command(process) => scheduler.spawn_with(process, SpawnOptions::new(COMMAND_ENTRY)),
    };
    let process = match process {
        Ok(process) => process,
        Err(e) => {
            scheduler.stop(Duration::ZERO);
            let run = Run { args: &args, out: &out, is_command, summary: None };
            return Ok(run.finish(Some(Err(format!("the process could not start: {e}"))), None, None));
        }
    };

    // Stays blocked in `join` if the run ends early; the process's end (at shutdown at
    // the latest) releases it, and the send to a dropped channel is ignored.
    thread::spawn(move || {
        let _ = tx.send(Signal::Done(process.join()));
    });
    let progress = (args.progress && std::io::stderr().is_terminal()).then(|| Progress::start(&scheduler, &out, start));
    // A deadline past what `Instant` holds is no deadline.
    let deadline = args.timeout.and_then(|timeout| start.checked_add(timeout));

    let (mut root, stop) = match wait_for_root(&rx, deadline, args.timeout) {
        Ok(outcome) => (Some(outcome), wait_for_rest(&scheduler, &rx, deadline, args.timeout, &out).err()),
        Err(early) => (None, Some(early)),
    };
    if let Some(stop) = stop {
        let what = match stop {
            Stop::Timeout(_) => stop.reason(),
            Stop::Signal(_) => format!("{} (again to force)", stop.reason()),
        };
        out.line(format!("wasmproc: {what}: stopping {}", processes(scheduler.live())));
        interrupt.store(true, Ordering::Relaxed);
        stop_gracefully(&scheduler, &rx, &stop.reason(), args.grace, &out);
        // An entry process that ended when cancelled (or terminated) did so just now; its
        // joining thread sends its result soon after, unless a step is stuck for good.
        let until = Instant::now() + JOIN_AFTER_STOP;
        while root.is_none() {
            match recv(&rx, Some(until)) {
                Ok(Signal::Done(outcome)) => root = Some(outcome),
                Ok(Signal::Stop(_)) => {}
                Err(_) => break,
            }
        }
    }
    let stats = scheduler.stats();
    if stop.is_none() || scheduler.wait_idle(Some(STEPS_AFTER_STOP)) {
        scheduler.stop(Duration::ZERO);
    } else {
        // A step that never returns (blocked in a system call) would hold `stop` for
        // good; the host exits without joining its workers instead.
        out.line("wasmproc: exiting with steps still running (blocked outside Wasm)");
        std::mem::forget(scheduler);
    }
    if let Some(progress) = progress {
        progress.finish();
    }
    let summary = args.stats.then(|| Summary { stats, wall: start.elapsed(), dropped: out.dropped() });
    let run = Run { args: &args, out: &out, is_command, summary };
    let flush_by = stop.map(|_| Instant::now() + FLUSH_AFTER_STOP).or(deadline);
    Ok(run.finish(root, stop, flush_by))
}

enum Root {
    Process { method: String, inputs: Vec<Payload> },
    Command(Box<wasmproc::wasm::CommandProcess>),
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the run's channel from a thread of its own.
/// The first one stops the run gracefully; a second, or one that comes before any
/// process has started (while compiling, say), ends the host at once with its exit code.
fn listen_for_signals(tx: mpsc::Sender<Signal>, started: Arc<AtomicBool>) -> Result<(), Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| Failure::new(Exit::Host, format!("cannot handle signals: {e}")))?;
    thread::Builder::new()
        .name("wasmproc-signals".to_owned())
        .spawn(move || {
            let mut first = true;
            for signal in signals.forever() {
                if !first || !started.load(Ordering::SeqCst) {
                    std::process::exit(128 + signal);
                }
                first = false;
                let _ = tx.send(Signal::Stop(signal));
            }
        })
        .map_err(|e| Failure::new(Exit::Host, format!("cannot start the signal thread: {e}")))?;
    Ok(())
}

fn recv(rx: &mpsc::Receiver<Signal>, until: Option<Instant>) -> Result<Signal, RecvTimeoutError> {
    match until {
        Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
    }
}

/// Waits for the entry process's end, or for what stops the run first.
fn wait_for_root(
    rx: &mpsc::Receiver<Signal>,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
) -> Result<Outcome, Stop> {
    match recv(rx, deadline) {
        Ok(Signal::Done(outcome)) => Ok(outcome),
        Ok(Signal::Stop(signal)) => Err(Stop::Signal(signal)),
        Err(RecvTimeoutError::Timeout) => Err(Stop::Timeout(timeout.unwrap_or_default())),
        // The joining thread always sends before it ends.
        Err(RecvTimeoutError::Disconnected) => Ok(Err("the entry process vanished".to_owned())),
    }
}

/// Waits for the processes the entry process left behind; `Ok` when all have ended.
fn wait_for_rest(
    scheduler: &Scheduler,
    rx: &mpsc::Receiver<Signal>,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    out: &Output,
) -> Result<(), Stop> {
    let since = Instant::now();
    let mut noticed = false;
    loop {
        if scheduler.wait_idle(Some(Duration::from_millis(50))) {
            return Ok(());
        }
        if let Ok(Signal::Stop(signal)) = rx.try_recv() {
            return Err(Stop::Signal(signal));
        }
        if deadline.is_some_and(|at| Instant::now() >= at) {
            return Err(Stop::Timeout(timeout.unwrap_or_default()));
        }
        if !noticed && since.elapsed() >= NOTICE_AFTER {
            noticed = true;
            out.line(format!(
                "wasmproc: the entry process has ended; waiting for {} it spawned (Ctrl-C or --timeout to stop them)",
                processes(scheduler.live())
            ));
        }
    }
}

/// Cancels every process, waits up to `grace` for them to end, then terminates the rest.
/// A second signal never reaches here: it ends the host at once (`listen_for_signals`).
fn stop_gracefully(scheduler: &Scheduler, rx: &mpsc::Receiver<Signal>, reason: &str, grace: Duration, out: &Output) {
    scheduler.cancel_all(reason);
    let until = Instant::now().checked_add(grace);
    while until.is_none_or(|until| Instant::now() < until) {
        if scheduler.wait_idle(Some(Duration::from_millis(20))) {
            return;
        }
        // The entry process's end is picked up by the caller.
        if let Ok(Signal::Stop(_)) = rx.try_recv() {
            break;
        }
    }
    let forced = scheduler.terminate_all("terminated: the run was stopped");
    if forced > 0 {
        out.line(format!("wasmproc: terminated {} that did not end when cancelled", processes(forced)));
    }
}

/// "1 process", "3 processes".
fn processes(n: usize) -> String {
    if n == 1 { "1 process".to_owned() } else { format!("{} processes", count(n as u64)) }
}

/// The input payloads: each --input, then --input-file, each checked to be JSON and no
/// larger than --max-payload (which the entry process's input is held to, as any
/// payload), before anything is loaded.
fn inputs(args: &RunArgs) -> Result<Vec<Payload>, Failure> {
    let too_large = |what: String, len: Option<usize>| {
        let size = len.map_or_else(String::new, |len| format!(" ({len} bytes)"));
        Failure::new(
            Exit::Usage,
            format!("{what}{size} is larger than --max-payload ({} bytes): raise --max-payload", args.max_payload),
        )
    };
    let mut payloads = Vec::new();
    for (i, text) in args.inputs.iter().enumerate() {
        if text.len() > args.max_payload {
            return Err(too_large(format!("--input #{}", i + 1), Some(text.len())));
        }
        payloads.push(json_payload(text).map_err(|e| {
            Failure::new(
                Exit::Usage,
                format!("--input #{} is not valid JSON ({e}): quote strings, e.g. '\"text\"'", i + 1),
            )
        })?);
    }
    if let Some(path) = &args.input_file {
        let shown = path.display();
        let text = read_input_file(path, args.max_payload).map_err(|e| match e {
            InputError::TooLarge(len) => too_large(format!("--input-file `{shown}`"), len),
            InputError::Io(e) => Failure::new(Exit::Usage, format!("cannot read --input-file `{shown}`: {e}")),
        })?;
        payloads.push(
            json_payload(&text)
                .map_err(|e| Failure::new(Exit::Usage, format!("--input-file `{shown}` is not valid JSON: {e}")))?,
        );
    }
    Ok(payloads)
}

fn json_payload(text: &str) -> Result<Payload, serde_json::Error> {
    let value: Value = serde_json::from_str(text)?;
    Payload::json(&value)
}

enum InputError {
    /// More than the bound: this many bytes if the size is known (a regular file's).
    TooLarge(Option<usize>),
    Io(std::io::Error),
}

/// Reads an input file, or stdin for `-`, reading at most one byte past `max` whatever
/// the file is (`/dev/urandom`, a pipe), so an endless input costs a bounded read.
fn read_input_file(path: &Path, max: usize) -> Result<String, InputError> {
    let bound = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin().lock().take(bound).read_to_end(&mut bytes).map_err(InputError::Io)?;
    } else {
        let file = std::fs::File::open(path).map_err(InputError::Io)?;
        if let Ok(metadata) = file.metadata()
            && metadata.is_file()
            && metadata.len() > max as u64
        {
            return Err(InputError::TooLarge(usize::try_from(metadata.len()).ok()));
        }
        file.take(bound).read_to_end(&mut bytes).map_err(InputError::Io)?;
    }
    if bytes.len() > max {
        return Err(InputError::TooLarge(None));
    }
    String::from_utf8(bytes).map_err(|e| InputError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// The grant set: the CLI's defaults, then --allow, then --deny.
fn capabilities(args: &RunArgs) -> Result<Capabilities, Failure> {
    let mut caps = Capabilities::default().deny("terminate");
    for (flag, names) in [("--allow", &args.allow), ("--deny", &args.deny)] {
        for name in names {
            if !BUILTIN_COMMANDS.contains(&name.as_str()) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "{flag} `{name}`: no such command; the commands are {} (custom commands need an embedder \
                         that handles them)",
                        BUILTIN_COMMANDS.join(", ")
                    ),
                ));
            }
            caps = if flag == "--allow" { caps.allow(name) } else { caps.deny(name) };
        }
    }
    Ok(caps)
}

/// Refuses the flags that only WASI commands take.
fn refuse_command_flags(args: &RunArgs) -> Result<(), Failure> {
    let given = [
        ("--dir", !args.dir.is_empty()),
        ("--dir-rw", !args.dir_rw.is_empty()),
        ("--env", !args.env.is_empty()),
        ("arguments after `--`", !args.args.is_empty()),
    ];
    match given.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(Failure::new(
            Exit::Usage,
            format!(
                "{flag} applies to WASI commands only; `{}` is a process component: give it input with --input",
                args.app.display()
            ),
        )),
        None => Ok(()),
    }
}

fn command_options(args: &RunArgs, interrupt: Arc<AtomicBool>) -> Result<CommandOptions, Failure> {
    let name = args.app.file_name().map_or_else(|| "app".to_owned(), |n| n.to_string_lossy().into_owned());
    let mut options = CommandOptions::new()
        .args(std::iter::once(name).chain(args.args.iter().cloned()))
        .inherit_stdio()
        .interrupt(interrupt);
    if let Some(timeout) = args.timeout {
        options = options.time_limit(timeout);
    }
    for (specs, writable) in [(&args.dir, false), (&args.dir_rw, true)] {
        for spec in specs {
            let (host, guest) = spec.split_once("::").unwrap_or((spec, spec));
            if !Path::new(host).is_dir() {
                let flag = if writable { "--dir-rw" } else { "--dir" };
                return Err(Failure::new(Exit::Usage, format!("{flag} `{host}`: no such directory")));
            }
            options = options.dir(PathBuf::from(host), guest, writable);
        }
    }
    for spec in &args.env {
        match spec.split_once('=') {
            Some((key, value)) if !key.is_empty() => options = options.env(key, value),
            Some(_) => return Err(Failure::new(Exit::Usage, format!("--env `{spec}`: the name is empty"))),
            None => match std::env::var(spec) {
                Ok(value) => options = options.env(spec.as_str(), value),
                Err(_) => {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!("--env `{spec}`: the host has no such variable (write NAME=VALUE to set one)"),
                    ));
                }
            },
        }
    }
    Ok(options)
}

struct Summary {
    stats: Stats,
    wall: Duration,
    /// Guest output lines dropped because stderr was not read fast enough.
    dropped: u64,
}

impl Summary {
    fn json(&self) -> Value {
        let s = &self.stats;
        json!({
            "processes": s.spawned,
            "peak_live": s.peak_live,
            "steps": s.workers.iter().map(|w| w.executed).sum::<u64>(),
            "yields": s.yields,
            "yields_by_command": s.yields_by_command.iter().map(|(name, n)| (name.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "messages": s.messages,
            "undelivered": s.undelivered,
            "hibernated": s.hibernated,
            "steals": s.workers.iter().map(|w| w.steals).sum::<u64>(),
            "workers": s.workers.iter().map(|w| json!({"steps": w.executed, "steals": w.steals, "stolen": w.stolen})).collect::<Vec<_>>(),
            "log_lines_dropped": self.dropped,
            "wall_ms": self.wall.as_secs_f64() * 1e3,
        })
    }

    fn lines(&self) -> Vec<String> {
        let s = &self.stats;
        let steps: u64 = s.workers.iter().map(|w| w.executed).sum();
        let by: Vec<String> = s
            .yields_by_command
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {}", count(*n)))
            .collect();
        let mut lines = vec![
            "── wasmproc stats ──".to_owned(),
            format!("processes   {} (peak {} alive at once)", count(s.spawned), count(s.peak_live as u64)),
            format!("steps       {}", count(steps)),
            format!(
                "yields      {}{}",
                count(s.yields),
                if by.is_empty() { String::new() } else { format!(": {}", by.join(", ")) }
            ),
            format!("messages    {} delivered, {} never read", count(s.messages), count(s.undelivered)),
            format!("hibernated  {} (waiting processes that gave memory back)", count(s.hibernated)),
            format!("steals      {}", count(s.workers.iter().map(|w| w.steals).sum())),
        ];
        for (i, w) in s.workers.iter().enumerate() {
            lines.push(format!(
                "worker {i:<4} {} steps, {} steals taking {} processes",
                count(w.executed),
                count(w.steals),
                count(w.stolen)
            ));
        }
        lines.push(format!("wall time   {:.1?}", self.wall));
        lines
    }
}

/// What a run prints at its end.
struct Run<'a> {
    args: &'a RunArgs,
    out: &'a Output,
    is_command: bool,
    summary: Option<Summary>,
}

impl Run<'_> {
    /// Prints the entry process's result (whenever it has one, even if the run was
    /// stopped after it ended) and the summary, waits for the output to be written (until
    /// `flush_by` at the latest), and picks the exit code.
    fn finish(self, root: Option<Outcome>, stop: Option<Stop>, flush_by: Option<Instant>) -> ExitCode {
        let Run { args, out, is_command, summary } = self;
        let exit_of_command = |payload: &Payload| exit_code(payload).unwrap_or(1);
        let outcome = root.clone().unwrap_or_else(|| Err(stop.map_or_else(String::new, Stop::reason)));
        if args.json {
            let mut object = match (&outcome, is_command) {
                (Ok(payload), true) => json!({ "exit_code": exit_of_command(payload) }),
                (Ok(payload), false) => json!({ "ok": payload_json(payload) }),
                (Err(error), _) => json!({ "error": error }),
            };
            if let Some(stop) = stop {
                object["stopped"] = json!(stop.name());
            }
            if let Some(summary) = &summary {
                object["stats"] = summary.json();
            }
            out.stdout(format!("{object}\n").into_bytes());
        } else {
            if let Some(summary) = &summary {
                for line in summary.lines() {
                    out.line(line);
                }
            }
            match &root {
                Some(Ok(payload)) if !is_command => out.stdout(payload_bytes(payload)),
                Some(Err(error)) => out.line(format!("error: the process failed: {error}")),
                Some(Ok(_)) | None => {}
            }
        }
        let dropped = out.dropped();
        if dropped > 0 {
            out.line(format!(
                "wasmproc: {} of guest output dropped: stderr was not read fast enough",
                if dropped == 1 { "1 line".to_owned() } else { format!("{} lines", count(dropped)) }
            ));
        }
        let flushed = out.flush(flush_by);
        match (&outcome, stop) {
            _ if flushed && out.stdout_closed() => Exit::StdoutClosed.into(),
            (_, Some(stop)) => stop.exit().into(),
            (Ok(payload), None) if is_command => ExitCode::from((exit_of_command(payload) & 0xff) as u8),
            (Ok(_), None) => Exit::Success.into(),
            (Err(_), None) => Exit::ProcessFailed.into(),
        }
    }
}

/// A result as JSON: JSON as itself, text as a string, bytes as `{"bytes": "<hex>"}`.
fn payload_json(payload: &Payload) -> Value {
    match payload.format {
        Format::Json => {
            serde_json::from_slice(&payload.data).unwrap_or_else(|_| json!({"invalid_json": payload.as_str()}))
        }
        Format::Text => json!(payload.as_str()),
        _ => json!({ "bytes": &payload.data.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
    }
}

/// A result as stdout gets it: JSON and text as lines, bytes raw.
fn payload_bytes(payload: &Payload) -> Vec<u8> {
    match payload.format {
        Format::Json | Format::Text if payload.data.is_empty() => Vec::new(),
        Format::Json | Format::Text => {
            let mut bytes = Vec::with_capacity(payload.data.len() + 1);
            bytes.extend_from_slice(&payload.data);
            bytes.push(b'\n');
            bytes
        }
        _ => payload.data.clone(),
    }
}

/// The `--progress` line: redrawn every 200 ms by a thread of its own.
struct Progress {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl Progress {
    fn start(scheduler: &Scheduler, out: &Output, start: Instant) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = (**scheduler).clone();
        let flag = stop.clone();
        let out = out.clone();
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let s = handle.stats();
                let line = format!(
                    "\r\x1b[K{} alive · {} spawned · {} steps · {} messages · {:.1}s",
                    count(s.live as u64),
                    count(s.spawned),
                    count(s.workers.iter().map(|w| w.executed).sum()),
                    count(s.messages),
                    start.elapsed().as_secs_f64()
                );
                out.stderr_raw(line.into_bytes());
                thread::sleep(Duration::from_millis(200));
            }
            out.stderr_raw(b"\r\x1b[K".to_vec());
        });
        Progress { stop, thread }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}
