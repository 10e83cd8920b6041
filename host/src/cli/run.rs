//! `wasmproc run`: spawns the entry process and waits for it and everything it spawned.
//!
//! The main thread waits on one channel for whichever comes first: the entry process's
//! result (from a joining thread), Ctrl-C (from the signal handler) or the timeout (as
//! the channel's deadline). Ending early is always graceful first: every process gets a
//! cancel event and a moment to end; what is left is then terminated.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc::wasm::{COMMAND_ENTRY, CommandOptions, Program, exit_code};
use wasmproc::{BUILTIN_COMMANDS, Capabilities, Format, Outcome, Payload, Scheduler, SpawnOptions, Stats};

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

/// How long a cancelled run waits for its processes to end before terminating them.
const GRACE: Duration = Duration::from_secs(1);

/// How long after the entry process ends the run waits quietly for the processes it
/// spawned before saying that it is still waiting.
const NOTICE_AFTER: Duration = Duration::from_secs(2);

enum Signal {
    /// The entry process ended with this.
    Done(Outcome),
    /// Ctrl-C.
    Interrupt,
}

pub(super) fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let start = Instant::now();
    let inputs = inputs(&args)?;
    let caps = capabilities(&args)?;
    let bytes = read_app(&args.app)?;
    let mut config = args
        .engine
        .config()
        .time_slice(args.time_slice)
        .preemption(!args.no_preemption)
        .max_instances(args.max_processes);
    if let Some(budget) = args.cpu_budget {
        config = config.cpu_budget(budget);
    }
    let runtime = runtime(config)?;
    let program = runtime
        .load_program_bytes(&bytes)
        .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", args.app.display())))?;

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
    let process = match root {
        Root::Process { method, inputs } => scheduler.spawn_kind("app", &method, inputs),
        Root::Command(process) => scheduler.spawn_with(process, SpawnOptions::new(COMMAND_ENTRY)),
    };
    let process = match process {
        Ok(process) => process,
        Err(e) => {
            scheduler.stop(Duration::ZERO);
            return finish(&args, Err(format!("the process could not start: {e}")), None, is_command, None);
        }
    };

    let (tx, rx) = mpsc::channel();
    {
        let tx = tx.clone();
        // Stays blocked in `join` if the run ends early; the process's end (at shutdown
        // at the latest) releases it, and the send to a dropped channel is ignored.
        thread::spawn(move || {
            let _ = tx.send(Signal::Done(process.join()));
        });
    }
    // `set_handler` fails only if a handler is set already, which nothing else does.
    let _ = ctrlc::set_handler(move || {
        let _ = tx.send(Signal::Interrupt);
    });
    let progress = (args.progress && std::io::stderr().is_terminal()).then(|| Progress::start(&scheduler, start));
    let deadline = args.timeout.map(|timeout| start + timeout);

    let ended = wait_for_root(&rx, deadline);
    let ended = match ended {
        Ended::Root(outcome) => match wait_for_rest(&scheduler, &rx, deadline) {
            Ended::Root(_) => Ended::Root(outcome),
            early => early,
        },
        early => early,
    };
    let (outcome, early) = match ended {
        Ended::Root(outcome) => (outcome, None),
        Ended::Timeout => {
            let timeout = args.timeout.unwrap_or_default();
            eprintln!(
                "wasmproc: timed out after {}: stopping {}",
                humantime::format_duration(timeout),
                processes(scheduler.live())
            );
            interrupt.store(true, Ordering::Relaxed);
            stop_gracefully(&scheduler, &rx, "timeout");
            (Err(format!("timed out after {}", humantime::format_duration(timeout))), Some(Exit::Timeout))
        }
        Ended::Interrupted => {
            eprintln!("wasmproc: interrupted: stopping {} (Ctrl-C again to force)", processes(scheduler.live()));
            interrupt.store(true, Ordering::Relaxed);
            stop_gracefully(&scheduler, &rx, "interrupted");
            (Err("interrupted".to_owned()), Some(Exit::Interrupted))
        }
    };
    let stats = scheduler.stats();
    scheduler.stop(Duration::ZERO);
    if let Some(progress) = progress {
        progress.finish();
    }
    let summary = args.stats.then(|| Summary { stats, wall: start.elapsed() });
    finish(&args, outcome, summary, is_command, early)
}

enum Root {
    Process { method: String, inputs: Vec<Payload> },
    Command(Box<wasmproc::wasm::CommandProcess>),
}

enum Ended {
    Root(Outcome),
    Timeout,
    Interrupted,
}

fn recv(rx: &mpsc::Receiver<Signal>, until: Option<Instant>) -> Result<Signal, RecvTimeoutError> {
    match until {
        Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
    }
}

fn wait_for_root(rx: &mpsc::Receiver<Signal>, deadline: Option<Instant>) -> Ended {
    match recv(rx, deadline) {
        Ok(Signal::Done(outcome)) => Ended::Root(outcome),
        Ok(Signal::Interrupt) => Ended::Interrupted,
        Err(RecvTimeoutError::Timeout) => Ended::Timeout,
        // The joining thread always sends before it ends.
        Err(RecvTimeoutError::Disconnected) => Ended::Root(Err("the entry process vanished".to_owned())),
    }
}

/// Waits for the processes the entry process left behind; `Ended::Root` when all ended.
fn wait_for_rest(scheduler: &Scheduler, rx: &mpsc::Receiver<Signal>, deadline: Option<Instant>) -> Ended {
    let since = Instant::now();
    let mut noticed = false;
    loop {
        if scheduler.wait_idle(Some(Duration::from_millis(50))) {
            return Ended::Root(Ok(Payload::empty()));
        }
        match rx.try_recv() {
            Ok(Signal::Interrupt) => return Ended::Interrupted,
            Ok(Signal::Done(_)) | Err(_) => {}
        }
        if deadline.is_some_and(|at| Instant::now() >= at) {
            return Ended::Timeout;
        }
        if !noticed && since.elapsed() >= NOTICE_AFTER {
            noticed = true;
            eprintln!(
                "wasmproc: the entry process has ended; waiting for {} it spawned (Ctrl-C or --timeout to stop them)",
                processes(scheduler.live())
            );
        }
    }
}

/// Cancels every process, waits up to [`GRACE`] (or a second Ctrl-C) for them to end,
/// then terminates the rest.
fn stop_gracefully(scheduler: &Scheduler, rx: &mpsc::Receiver<Signal>, reason: &str) {
    scheduler.cancel_all(reason);
    let until = Instant::now() + GRACE;
    while Instant::now() < until {
        if scheduler.wait_idle(Some(Duration::from_millis(20))) {
            return;
        }
        if let Ok(Signal::Interrupt) = rx.try_recv() {
            break;
        }
    }
    let forced = scheduler.terminate_all("terminated: the run was stopped");
    if forced > 0 {
        eprintln!("wasmproc: terminated {} that did not end when cancelled", processes(forced));
    }
}

/// "1 process", "3 processes".
fn processes(n: usize) -> String {
    if n == 1 { "1 process".to_owned() } else { format!("{} processes", count(n as u64)) }
}

/// The input payloads: each --input, then --input-file, each checked to be JSON.
fn inputs(args: &RunArgs) -> Result<Vec<Payload>, Failure> {
    let mut payloads = Vec::new();
    for (i, text) in args.inputs.iter().enumerate() {
        payloads.push(json_payload(text).map_err(|e| {
            Failure::new(
                Exit::Usage,
                format!("--input #{} is not valid JSON ({e}): quote strings, e.g. '\"text\"'", i + 1),
            )
        })?);
    }
    if let Some(path) = &args.input_file {
        let text = read_input_file(path)?;
        payloads.push(json_payload(&text).map_err(|e| {
            Failure::new(Exit::Usage, format!("--input-file `{}` is not valid JSON: {e}", path.display()))
        })?);
    }
    Ok(payloads)
}

fn json_payload(text: &str) -> Result<Payload, serde_json::Error> {
    let value: Value = serde_json::from_str(text)?;
    Payload::json(&value)
}

fn read_input_file(path: &Path) -> Result<String, Failure> {
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|e| Failure::new(Exit::Usage, format!("cannot read --input-file `{}`: {e}", path.display())))?;
    Ok(text)
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
            "wall_ms": self.wall.as_secs_f64() * 1e3,
        })
    }

    fn print(&self) {
        let s = &self.stats;
        let steps: u64 = s.workers.iter().map(|w| w.executed).sum();
        let by: Vec<String> = s
            .yields_by_command
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {}", count(*n)))
            .collect();
        eprintln!("── wasmproc stats ──");
        eprintln!("processes   {} (peak {} alive at once)", count(s.spawned), count(s.peak_live as u64));
        eprintln!("steps       {}", count(steps));
        eprintln!(
            "yields      {}{}",
            count(s.yields),
            if by.is_empty() { String::new() } else { format!(": {}", by.join(", ")) }
        );
        eprintln!("messages    {} delivered, {} never read", count(s.messages), count(s.undelivered));
        eprintln!("hibernated  {} (waiting processes that gave memory back)", count(s.hibernated));
        eprintln!("steals      {}", count(s.workers.iter().map(|w| w.steals).sum()));
        for (i, w) in s.workers.iter().enumerate() {
            eprintln!(
                "worker {i:<4} {} steps, {} steals taking {} processes",
                count(w.executed),
                count(w.steals),
                count(w.stolen)
            );
        }
        eprintln!("wall time   {:.1?}", self.wall);
    }
}

/// Prints the result and the summary, and picks the exit code.
fn finish(
    args: &RunArgs,
    outcome: Outcome,
    summary: Option<Summary>,
    is_command: bool,
    early: Option<Exit>,
) -> Result<ExitCode, Failure> {
    let exit_of_command = |payload: &Payload| exit_code(payload).unwrap_or(1);
    if args.json {
        let mut object = match (&outcome, is_command) {
            (Ok(payload), true) => json!({ "exit_code": exit_of_command(payload) }),
            (Ok(payload), false) => json!({ "ok": payload_json(payload) }),
            (Err(error), _) => json!({ "error": error }),
        };
        if let Some(summary) = &summary {
            object["stats"] = summary.json();
        }
        println!("{object}");
    } else {
        if let Some(summary) = &summary {
            summary.print();
        }
        match &outcome {
            Ok(payload) if !is_command => print_payload(payload),
            Ok(_) => {}
            Err(error) if early.is_none() => eprintln!("error: the process failed: {error}"),
            Err(_) => {}
        }
    }
    let _ = std::io::stdout().flush();
    Ok(match (outcome, early) {
        (_, Some(exit)) => exit.into(),
        (Ok(payload), _) if is_command => ExitCode::from((exit_of_command(&payload) & 0xff) as u8),
        (Ok(_), _) => Exit::Success.into(),
        (Err(_), _) => Exit::ProcessFailed.into(),
    })
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

/// A result on stdout: JSON and text as lines, bytes raw.
fn print_payload(payload: &Payload) {
    let mut stdout = std::io::stdout().lock();
    let _ = match payload.format {
        Format::Json | Format::Text if payload.data.is_empty() => Ok(()),
        Format::Json | Format::Text => stdout.write_all(&payload.data).and_then(|()| stdout.write_all(b"\n")),
        _ => stdout.write_all(&payload.data),
    };
}

/// The `--progress` line: redrawn every 200 ms by a thread of its own.
struct Progress {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl Progress {
    fn start(scheduler: &Scheduler, start: Instant) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = (**scheduler).clone();
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let s = handle.stats();
                eprint!(
                    "\r\x1b[K{} alive · {} spawned · {} steps · {} messages · {:.1}s",
                    count(s.live as u64),
                    count(s.spawned),
                    count(s.workers.iter().map(|w| w.executed).sum()),
                    count(s.messages),
                    start.elapsed().as_secs_f64()
                );
                thread::sleep(Duration::from_millis(200));
            }
            eprint!("\r\x1b[K");
        });
        Progress { stop, thread }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}
