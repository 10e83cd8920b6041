//! `wasmproc journal`: what a durable run's journal holds, read without running anything.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use wasmproc::journal::{Journal, LogStore};
use wasmproc::scheduler::History;
use wasmproc::wasm::Program;
use wasmproc::{Pid, Scheduler, Status};

use super::input::read_app;
use super::output::{Say, print_now, say_now};
use super::{EngineArgs, Exit, Failure, runtime};

/// `wasmproc journal`'s subcommands.
#[derive(Args, Debug)]
pub(super) struct JournalCommand {
    #[command(subcommand)]
    command: Verb,
}

/// `ls` and `show` read a journal a host is running as it is now (a log, read without
/// its lock: `LogStore::read_now`); `verify` needs it to itself.
#[derive(Subcommand, Debug)]
enum Verb {
    /// List the processes of a journal: pid, parent, entry method, steps, state. A
    /// finished process's state is its result; an unfinished one's is what its history
    /// leaves it waiting for (a message, or the commands whose completions are not
    /// recorded), which it goes on waiting for when the run resumes. A journal a host is
    /// running is read as it is now.
    Ls {
        /// The journal's directory (what `run --journal` was given).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Replay every unfinished process of a journal against its records, offline, with
    /// the program that wrote it: what resuming would find, without resuming. Exits 1 if
    /// a replay differs from its records (non-determinism), naming the step.
    Verify {
        /// The journal's directory.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The program the journal's run was started with.
        #[arg(value_name = "APP.wasm")]
        app: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Show one process's history, a line a record: its spawn (when, by whom, with what
    /// input), every step (its time after the one before, the events it was given, what
    /// it sent and yielded, how it ended) and its exit. Payloads are shown as their text
    /// (JSON as written, text quoted), or as their size and first bytes.
    Show {
        /// The journal's directory.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The process, as `journal ls` lists it.
        #[arg(value_name = "PID")]
        pid: u64,
        /// Only its last N records (numbered as in the whole history): what a long-running
        /// process has been doing lately.
        #[arg(long, value_name = "N")]
        last: Option<usize>,
    },
}

impl JournalCommand {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let (dir, pid, last) = match &self.command {
            Verb::Ls { dir } => (dir, None, None),
            Verb::Show { dir, pid, last } => (dir, Some(Pid::from_u64(*pid)), *last),
            Verb::Verify { dir, app, engine } => return verify(dir, app, engine),
        };
        if !dir.is_dir() {
            return Err(Failure::new(Exit::Usage, format!("no journal in `{}`: not a directory", dir.display())));
        }
        let history = match Journal::open(dir) {
            Ok(journal) => journal.history(),
            // A host is running it: a log is read as it is now, without its lock (a
            // journal in fjall cannot be, and the refusal stands).
            Err(busy) if busy.kind() == std::io::ErrorKind::ResourceBusy => match LogStore::read_now(dir) {
                Ok(store) => {
                    say_now(Say::Notice, "a host is running this journal: what follows is as of now");
                    Journal::with_store(store).history()
                }
                Err(_) => Err(busy),
            },
            Err(error) => Err(error),
        };
        let history = history
            .map_err(|e| Failure::new(Exit::Host, format!("cannot read the journal in `{}`: {e}", dir.display())))?;
        let text = match pid {
            None => list(&history),
            Some(pid) => {
                let Some(process) = history.iter().find(|h| h.pid == pid) else {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!("the journal in `{}` holds no process {pid}: `journal ls` lists them", dir.display()),
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

/// `journal verify`: replays with the program as `run` would load it.
fn verify(dir: &Path, app: &Path, engine: &EngineArgs) -> Result<ExitCode, Failure> {
    if !dir.is_dir() {
        return Err(Failure::new(Exit::Usage, format!("no journal in `{}`: not a directory", dir.display())));
    }
    let bytes = read_app(app, engine.max_module_size as u64)?;
    let program = runtime(engine.config()?)?
        .load_program_bytes(&bytes)
        .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{}`: {e:#}", app.display())))?;
    let Program::Process(component) = program else {
        return Err(Failure::new(Exit::Usage, format!("`{}` is a WASI command: it has no journal", app.display())));
    };
    let journal = Journal::open(dir).map_err(|e| Failure::new(Exit::Host, format!("{e}")))?;
    let verdicts = Scheduler::builder()
        .workers(1)
        .kind("app", component)
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

fn list(history: &[History]) -> String {
    let mut text = format!("{:<20} {:<20} {:<12} {:>6}  {}\n", "PID", "PARENT", "METHOD", "STEPS", "STATE");
    for process in history {
        let parent = match process.parent {
            Some(Pid::HOST) => "host".to_owned(),
            Some(parent) => parent.to_string(),
            None => "?".to_owned(),
        };
        let state = match &process.result {
            None => format!("unfinished: {}", waiting(process)),
            Some(Ok(_)) => "finished: ok".to_owned(),
            Some(Err(error)) => format!("failed: {error}"),
        };
        text.push_str(&format!(
            "{:<20} {:<20} {:<12} {:>6}  {state}\n",
            process.pid, parent, process.method, process.steps
        ));
    }
    if history.iter().any(|process| process.result.is_none()) {
        text.push_str("\nThe unfinished processes resume on the next run with this journal.\n");
    }
    text
}

/// What an unfinished process waits for, as its history leaves it.
fn waiting(process: &History) -> String {
    let commands = match process.waiting_for.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        [first, rest @ ..] => Some(format!("{first} and {} more", rest.len())),
    };
    match (&process.last_status, commands) {
        (None, _) => "not stepped yet".to_owned(),
        (Some(Status::Continue), _) => "runnable".to_owned(),
        (Some(Status::Idle), None) => "idle, waits for a message".to_owned(),
        (Some(Status::Idle), Some(commands)) => format!("idle, waits for a message or for {commands}"),
        (Some(_), Some(commands)) => format!("waits for {commands}"),
        (Some(_), None) => "blocked".to_owned(),
    }
}
