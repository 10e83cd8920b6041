//! `wasmproc journal`: what a durable run's journal holds, read without running anything.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use wasmproc::journal::{HeldRun, History, Journal, JournalSettings, LogStore};
use wasmproc::wasm::{Component, Program};
use wasmproc::{Capabilities, ExitReason, Exited, Pid, Scheduler, Status};

use super::input::read_app;
use super::output::{Say, print_now, say_now};
use super::{ClusterArgs, EngineArgs, Exit, Failure, runtime, units};

/// `wasmproc journal`'s subcommands.
#[derive(Args, Debug)]
pub(super) struct JournalCommand {
    #[command(subcommand)]
    command: Verb,
}

/// `ls` and `show` read a journal a host is running as it is now (a log, read without
/// its lock: `LogStore::read_now`); `verify`, `cancel` and `forget` need it to themselves.
#[derive(Subcommand, Debug)]
enum Verb {
    /// List the processes of a journal: pid, parent, entry method, steps, state. A
    /// finished process's state is its result; an unfinished one's is what its history
    /// leaves it waiting for (a message, or the commands whose completions are not
    /// recorded), which it goes on waiting for when the run resumes. A journal a host is
    /// running is read as it is now.
    #[command(after_help = "Examples:
  wasmproc journal ls ./flow.journal
  wasmproc journal ls --cluster nats://127.0.0.1:4222 --shard 3")]
    Ls {
        /// The journal's directory (what `run --journal` was given); or --cluster.
        #[arg(value_name = "DIR", required_unless_present = "url")]
        dir: Option<PathBuf>,
        #[command(flatten)]
        on: OnJetStream,
    },
    /// Replay every unfinished process of a journal against its records, offline, with
    /// the program that wrote it: what resuming would find, without resuming. Exits 1 if
    /// a replay differs from its records (non-determinism), naming the step. A shard's
    /// journal on a cluster (--cluster, --shard) is read without taking it from its node.
    #[command(after_help = "Examples:
  wasmproc journal verify ./flow.journal flow.wasm
  wasmproc journal verify durable.wasm --cluster nats://127.0.0.1:4222 --shard 3")]
    Verify {
        /// The journal's directory; or --cluster, and the program alone.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The program the journal's run was started with.
        #[arg(value_name = "APP.wasm")]
        app: Option<PathBuf>,
        #[command(flatten)]
        on: OnJetStream,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Show one process's history, a line a record: its spawn (when, by whom, with what
    /// input), every step (its time after the one before, the events it was given, what
    /// it sent and yielded, how it ended) and its exit. Payloads are shown as their text
    /// (JSON as written, text quoted), or as their size and first bytes.
    #[command(after_help = "Examples:
  wasmproc journal show ./flow.journal 1
  wasmproc journal show --cluster nats://127.0.0.1:4222 --shard 3 18441463290690650113")]
    Show {
        /// The journal's directory; or --cluster, and the pid alone.
        #[arg(value_name = "DIR", required_unless_present = "url")]
        dir: Option<PathBuf>,
        /// The process, as `journal ls` lists it.
        #[arg(value_name = "PID")]
        pid: Option<u64>,
        #[command(flatten)]
        on: OnJetStream,
        /// Only its last N records (numbered as in the whole history): what a long-running
        /// process has been doing lately.
        #[arg(long, value_name = "N")]
        last: Option<usize>,
    },
    /// End the unfinished run of a journal for good: cancel, --grace, terminate, recorded.
    ///
    /// Resumes the run's processes with the program that wrote it, sends each a cancel
    /// event (so each ends in its own code, as Ctrl-C of a run without a journal would),
    /// gives them --grace to end, then terminates the rest. Everything is recorded: the run
    /// is then finished, with the result its entry process gave (an SDK guest's:
    /// "cancelled: by `wasmproc journal cancel`"), which the next `run` with this journal
    /// reports instead of resuming it. The resumed processes get no provider (no --kv,
    /// --dir, --allow-host…), and `terminate` is not granted to them. Refused while a host
    /// is running the journal.
    #[command(after_help = "Example:
  wasmproc journal cancel ./flow.journal flow.wasm --grace 2s")]
    Cancel {
        /// The journal's directory.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The program the journal's run was started with: its processes handle their
        /// cancel in their own code.
        #[arg(value_name = "APP.wasm")]
        app: PathBuf,
        /// How long the cancelled processes have to end before the rest are terminated.
        #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = units::duration)]
        grace: Duration,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Drop every run a journal holds, finished or not: the next `run` starts afresh.
    ///
    /// Removes each run's records, unfinished or finished (kept by --keep-finished, or not
    /// reported yet), so that `run` with this journal starts a new run, whatever its
    /// input. Nothing is run: an unfinished run's processes get no cancel (`journal cancel`
    /// lets them end in their own code first). Refused while a host is running the
    /// journal.
    Forget {
        /// The journal's directory.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// Where a journal on a cluster's JetStream is: read only, so the node writing it goes on.
#[derive(Args, Debug)]
struct OnJetStream {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The shard whose journal to read (with --cluster).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "url")]
    shard: u32,
    /// The first part of the journals' JetStream streams' names (with --cluster): shard
    /// N's journal is the stream NAME_N.
    #[arg(long, value_name = "NAME", default_value = wasmproc::cluster::DEFAULT_STREAM, requires = "url")]
    stream: String,
}

impl OnJetStream {
    /// The journal it names, if --cluster is given, and how to name it in messages.
    fn open(&self) -> Result<Option<(Journal, String)>, Failure> {
        if self.cluster.url.is_none() {
            return Ok(None);
        }
        let config = self.cluster.config()?;
        let options = wasmproc::cluster::JetStreamOptions::new().stream(&self.stream).shard(self.shard);
        let store = wasmproc::cluster::JetStreamStore::read_only(&config, &options)
            .map_err(|e| Failure::new(Exit::Host, format!("cannot read the journal of shard {}: {e:#}", self.shard)))?;
        Ok(Some((Journal::with_store(store), format!("shard {} (stream `{}`)", self.shard, options.stream_name()))))
    }
}

/// The reason a run's processes are given by `journal cancel`: an SDK guest's entry ends
/// with `cancelled: {CANCEL_REASON}`.
const CANCEL_REASON: &str = "by `wasmproc journal cancel`";
/// How long the terminated processes have to be gone, and the entry's result to arrive,
/// once they are terminated: a step is ended at its next epoch tick, so this is slack.
const AFTER_TERMINATE: Duration = Duration::from_secs(5);

impl JournalCommand {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let (dir, pid, last, on) = match &self.command {
            Verb::Ls { dir, on } => (dir.as_deref(), None, None, on),
            Verb::Show { dir, pid, last, on } => {
                // With --cluster there is no directory: a lone number is the pid.
                let (dir, pid) = match (dir, pid, on.cluster.url.is_some()) {
                    (Some(dir), None, true) => match dir.to_str().and_then(|d| d.parse::<u64>().ok()) {
                        Some(pid) => (None, Some(pid)),
                        None => (Some(dir.as_path()), None),
                    },
                    (dir, pid, _) => (dir.as_deref(), *pid),
                };
                let pid = pid.ok_or_else(|| Failure::new(Exit::Usage, "`journal show` needs the PID to show"))?;
                (dir, Some(Pid::from_u64(pid)), *last, on)
            }
            Verb::Verify { dir, app, on, engine } => {
                return match (app, on.open()?) {
                    // With --cluster there is no directory: the lone path is the program.
                    (None, Some((journal, name))) => verify_shard(journal, &name, dir, engine),
                    (Some(_), Some(_)) => Err(Failure::new(
                        Exit::Usage,
                        format!("`{}` and --cluster both name a journal: give one", dir.display()),
                    )),
                    (Some(app), None) => verify(dir, app, engine),
                    (None, None) => {
                        Err(Failure::new(Exit::Usage, "`journal verify` needs the journal's DIR and the APP.wasm"))
                    }
                };
            }
            Verb::Cancel { dir, app, grace, engine } => return cancel(dir, app, *grace, engine),
            Verb::Forget { dir } => return forget(dir),
        };
        let (history, name) = match (on.open()?, dir) {
            (Some(_), Some(dir)) => {
                return Err(Failure::new(
                    Exit::Usage,
                    format!("`{}` and --cluster both name a journal: give one", dir.display()),
                ));
            }
            (Some((journal, name)), None) => (journal.history(), name),
            (None, Some(dir)) => (local_history(dir)?, format!("`{}`", dir.display())),
            (None, None) => return Err(Failure::new(Exit::Usage, "name the journal: its DIR, or --cluster URL")),
        };
        let history =
            history.map_err(|e| Failure::new(Exit::Host, format!("cannot read the journal in {name}: {e}")))?;
        let text = match pid {
            None => list(&history),
            Some(pid) => {
                let Some(process) = history.iter().find(|h| h.pid == pid) else {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!("the journal in {name} holds no process {pid}: `journal ls` lists them"),
                    ));
                };
                let skip = last.map_or(0, |last| process.records.len().saturating_sub(last));
                process.records[skip..].iter().map(|record| format!("{record}\n")).collect()
            }
        };
        print_now(&text).map_err(|_| Failure::new(Exit::StdoutClosed, "stdout was closed"))?;
        Ok(Exit::Success.into())
    }
}

/// The history of the journal in `dir`, as it is now even if a host is running it.
fn local_history(dir: &Path) -> Result<std::io::Result<Vec<History>>, Failure> {
    if !dir.is_dir() {
        return Err(Failure::new(Exit::Usage, format!("no journal in `{}`: not a directory", dir.display())));
    }
    Ok(match Journal::open(dir) {
        Ok(journal) => journal.history(),
        // A host is running it: a log is read as it is now, without its lock (a journal
        // in fjall cannot be, and the refusal stands).
        Err(busy) if busy.kind() == std::io::ErrorKind::ResourceBusy => match LogStore::read_now(dir) {
            Ok(store) => {
                say_now(Say::Notice, "a host is running this journal: what follows is as of now");
                Journal::with_store(store).history()
            }
            Err(_) => Err(busy),
        },
        Err(error) => Err(error),
    })
}

/// Loads `app` as `run` would, to replay a journal's run with it: a WASI command has no
/// journal.
fn load_process(app: &Path, engine: &EngineArgs) -> Result<Component, Failure> {
    let bytes = read_app(app, engine.max_module_size as u64)?;
    let program = runtime(engine.config()?)?
        .load_program_bytes(&bytes)
        .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", app.display())))?;
    match program {
        Program::Process(component) => Ok(component),
        Program::Wasi(_) => {
            Err(Failure::new(Exit::Usage, format!("`{}` is a WASI command: it has no journal", app.display())))
        }
    }
}

/// `journal verify`: replays with the program as `run` would load it.
fn verify(dir: &Path, app: &Path, engine: &EngineArgs) -> Result<ExitCode, Failure> {
    if !dir.is_dir() {
        return Err(Failure::new(Exit::Usage, format!("no journal in `{}`: not a directory", dir.display())));
    }
    let component = load_process(app, engine)?;
    let journal = Journal::open(dir).map_err(|e| Failure::new(Exit::Host, format!("{e}")))?;
    report_verdicts(Scheduler::builder().kind("app", component), journal)
}

/// `journal verify --cluster`: a shard's journal names its processes' kind by the hash of
/// the component they run (`cluster start` keeps it so), which `app` must have.
fn verify_shard(journal: Journal, name: &str, app: &Path, engine: &EngineArgs) -> Result<ExitCode, Failure> {
    let bytes = read_app(app, engine.max_module_size as u64)?;
    let component = load_process(app, engine)?;
    tracing::debug!("verifying the journal in {name}");
    report_verdicts(Scheduler::builder().kind(wasmproc::cluster::hash_of(&bytes), component), journal)
}

/// Replays `journal`'s unfinished processes with the kinds of `builder`, and prints what
/// each replay found.
fn report_verdicts(builder: wasmproc::scheduler::Builder, journal: Journal) -> Result<ExitCode, Failure> {
    let verdicts = builder
        .workers(1)
        .journal(journal)
        .verify_journal()
        .map_err(|e| Failure::new(Exit::Host, format!("cannot verify the journal: {e:#}")))?;
    let mut text = String::new();
    let mut differs = false;
    for (pid, verdict) in &verdicts {
        match verdict {
            Ok(steps) => text.push_str(&format!("{pid}: ok, {steps} steps replay as recorded\n")),
            Err(error) => {
                differs = true;
                text.push_str(&format!("{pid}: {error}\n"));
            }
        }
    }
    text.push_str(&format!(
        "{} unfinished processes, {} replay as recorded\n",
        verdicts.len(),
        verdicts.iter().filter(|(_, v)| v.is_ok()).count()
    ));
    print_now(&text).map_err(|_| Failure::new(Exit::StdoutClosed, "stdout was closed"))?;
    Ok(if differs { Exit::ProcessFailed } else { Exit::Success }.into())
}

/// Opens the journal in `dir` for `verb` (`cancel`, `forget`), which changes it: refused
/// while a host is running it.
fn open_alone(dir: &Path, verb: &str) -> Result<Journal, Failure> {
    if !dir.is_dir() {
        return Err(Failure::new(Exit::Usage, format!("no journal in `{}`: not a directory", dir.display())));
    }
    Journal::open(dir).map_err(|error| {
        if error.kind() == std::io::ErrorKind::ResourceBusy {
            Failure::new(
                Exit::Usage,
                format!(
                    "a host is running the journal in `{}`: stop it first (Ctrl-C or SIGTERM suspends its run), then \
                     `journal {verb}` it",
                    dir.display()
                ),
            )
        } else {
            Failure::new(Exit::Host, format!("{error}"))
        }
    })
}

/// The runs a journal holds.
fn runs(journal: &Journal, dir: &Path) -> Result<Vec<HeldRun>, Failure> {
    journal.runs().map_err(|e| Failure::new(Exit::Host, format!("cannot read the journal in `{}`: {e}", dir.display())))
}

/// `journal cancel`: resumes the unfinished run, cancels its processes, waits --grace,
/// terminates the rest; every exit recorded.
fn cancel(dir: &Path, app: &Path, grace: Duration, engine: &EngineArgs) -> Result<ExitCode, Failure> {
    let journal = open_alone(dir, "cancel")?;
    let held = runs(&journal, dir)?;
    let unfinished: Vec<&HeldRun> = held.iter().filter(|run| run.result.is_none()).collect();
    let Some(first) = unfinished.first() else {
        let finished = if held.is_empty() {
            String::new()
        } else {
            " (its finished run is reported by the next `run`, or dropped by `journal forget`)".to_owned()
        };
        return Err(Failure::new(
            Exit::Usage,
            format!("the journal in `{}` holds no unfinished run: nothing to cancel{finished}", dir.display()),
        ));
    };
    let component = load_process(app, engine)?;
    if let Some(ran) = first.identity.as_deref().filter(|ran| *ran != component.hash()) {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "the journal's run (process {}) ran the program {ran}, and `{}` is {}: give the program it was \
                 started with (or drop the run with `wasmproc journal forget {}`)",
                first.root,
                app.display(),
                component.hash(),
                dir.display()
            ),
        ));
    }
    // Kept once ended: the next `run` reports the cancelled run's result, then drops it.
    let mut settings = JournalSettings::default();
    settings.keep_finished = true;
    let grants = Capabilities::over_self();
    let scheduler = Scheduler::builder()
        .kind("app", component)
        .journal(journal.settings(settings))
        .capabilities(grants.clone())
        .resume_within(grants)
        .build()
        .map_err(|e| Failure::new(Exit::Host, format!("cannot resume the journal's run to cancel it: {e:#}")))?;
    let roots = scheduler.resumed();
    let handle = scheduler.handle();
    let cancelled = handle.cancel_all(CANCEL_REASON);
    let ended = handle.wait_idle(Some(grace));
    // Killed: they did not end within the grace of their cancel.
    let terminated = if ended { 0 } else { handle.terminate_all(ExitReason::Killed) };
    let gone = ended || handle.wait_idle(Some(AFTER_TERMINATE));
    let mut text = format!("cancelled {}; {terminated} terminated after --grace {grace:?}\n", processes(cancelled));
    for root in &roots {
        match root.join_timeout(AFTER_TERMINATE) {
            Some(result) => {
                let shown = match &result {
                    Ok(payload) => format!("ok {}", String::from_utf8_lossy(&payload.data)),
                    Err(ExitReason::Error(error)) => format!("error {error}"),
                    Err(reason) => reason.to_string(),
                };
                text.push_str(&format!("process {}: {shown}\n", root.pid()));
            }
            None => text.push_str(&format!("process {}: still running\n", root.pid())),
        }
    }
    // A durable scheduler's stop suspends what is left: none, unless a step would not end.
    let left = handle.live();
    scheduler.stop(Duration::ZERO);
    if !gone && left > 0 {
        return Err(Failure::new(
            Exit::Host,
            format!(
                "{} did not end even when terminated (a step blocked outside Wasm): they stay unfinished in the \
                 journal in `{}`",
                processes(left),
                dir.display()
            ),
        ));
    }
    text.push_str(&format!(
        "The run is recorded as ended: the next `run` with this journal reports its result; `wasmproc journal \
         forget {}` drops it.\n",
        dir.display()
    ));
    print_now(&text).map_err(|_| Failure::new(Exit::StdoutClosed, "stdout was closed"))?;
    Ok(Exit::Success.into())
}

/// `journal forget`: drops every run the journal holds.
fn forget(dir: &Path) -> Result<ExitCode, Failure> {
    let journal = open_alone(dir, "forget")?;
    let held = runs(&journal, dir)?;
    let mut text = String::new();
    for run in &held {
        journal.forget_run(run).map_err(|e| {
            Failure::new(Exit::Host, format!("cannot drop process {}'s run from `{}`: {e}", run.root, dir.display()))
        })?;
        let state = match &run.result {
            None => "unfinished".to_owned(),
            Some(exited) => ended(exited),
        };
        text.push_str(&format!(
            "forgot the run of process {} ({}), {state}: {}, {} records\n",
            run.root,
            super::resume::entry(&run.method, &run.input),
            processes(run.processes()),
            run.records()
        ));
    }
    if held.is_empty() {
        text.push_str(&format!("the journal in `{}` holds no run: nothing to forget\n", dir.display()));
    }
    print_now(&text).map_err(|_| Failure::new(Exit::StdoutClosed, "stdout was closed"))?;
    Ok(Exit::Success.into())
}

/// A finished process's state: `finished: ok`, `failed: ` and its error, or `failed: `
/// and how else it ended (`failed: trapped: panic: …`, `failed: was killed`).
fn ended(exited: &Exited) -> String {
    match &exited.reason {
        ExitReason::Normal(_) => "finished: ok".to_owned(),
        ExitReason::Error(error) if exited.signal_from.is_none() => format!("failed: {error}"),
        _ => format!("failed: {exited}"),
    }
}

/// "1 process", "3 processes".
fn processes(n: usize) -> String {
    if n == 1 { "1 process".to_owned() } else { format!("{n} processes") }
}

fn list(history: &[History]) -> String {
    let mut text = format!("{:<20} {:<20} {:<12} {:>6}  {}\n", "PID", "PARENT", "METHOD", "STEPS", "STATE");
    for process in history {
        let parent = match process.parent {
            Some(Pid::HOST) => "host".to_owned(),
            Some(parent) => parent.to_string(),
            None => "?".to_owned(),
        };
        let state = match &process.result {
            None => format!("unfinished: {}", waiting(process, history)),
            Some(exited) => ended(exited),
        };
        text.push_str(&format!(
            "{:<20} {:<20} {:<12} {:>6}  {state}\n",
            process.pid, parent, process.method, process.steps
        ));
    }
    if history.iter().any(|process| process.result.is_none()) {
        text.push_str(
            "\nThe unfinished processes resume on the next run with this journal (`journal cancel` ends them, \
             `journal forget` drops them).\n",
        );
    }
    text
}

/// What an unfinished process waits for, as its history leaves it: the commands whose
/// completions are not recorded, and the exits of its children that have not ended (an
/// exit reaches a waiting parent as an event, so it waits for them even with no command
/// pending).
fn waiting(process: &History, all: &[History]) -> String {
    let commands = match process.waiting_for.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        [first, rest @ ..] => Some(format!("{first} and {} more", rest.len())),
    };
    let children: Vec<String> = all
        .iter()
        .filter(|child| child.parent == Some(process.pid) && child.result.is_none())
        .map(|child| child.pid.to_string())
        .collect();
    let exits = match children.as_slice() {
        [] => None,
        [one] => Some(format!("the exit of its child {one}")),
        [a, b] => Some(format!("the exits of its children {a} and {b}")),
        [a, b, rest @ ..] => Some(format!("the exits of its children {a}, {b} and {} more", rest.len())),
    };
    match (&process.last_status, commands, exits) {
        (None, _, _) => "not stepped yet".to_owned(),
        (Some(Status::Continue), _, _) => "runnable".to_owned(),
        (Some(Status::Idle), None, None) => "idle, waits for a message".to_owned(),
        (Some(Status::Idle), None, Some(exits)) => format!("idle, waits for {exits} or a message"),
        (Some(Status::Idle), Some(commands), None) => format!("idle, waits for a message or for {commands}"),
        (Some(Status::Idle), Some(commands), Some(exits)) => {
            format!("idle, waits for {exits}, for {commands} or a message")
        }
        (Some(_), Some(commands), None) => format!("waits for {commands}"),
        (Some(_), Some(commands), Some(exits)) => format!("waits for {commands} or {exits}"),
        (Some(_), None, Some(exits)) => format!("blocked, waits for {exits}"),
        (Some(_), None, None) => "blocked".to_owned(),
    }
}
