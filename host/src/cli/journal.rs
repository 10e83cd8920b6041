//! `wasmproc journal`: what a durable run's journal holds, read without running anything.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use wasmproc::Pid;
use wasmproc::journal::Journal;
use wasmproc::scheduler::History;

use super::output::print_now;
use super::{Exit, Failure};

/// `wasmproc journal`'s subcommands.
#[derive(Args, Debug)]
pub(super) struct JournalCommand {
    #[command(subcommand)]
    command: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// List the processes of a journal: pid, parent, entry method, steps, state.
    Ls {
        /// The journal's directory (what `run --journal` was given).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Show one process's history: its spawn, every step, its exit.
    Show {
        /// The journal's directory.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The process, as `journal ls` lists it.
        #[arg(value_name = "PID")]
        pid: u64,
    },
}

impl JournalCommand {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let (dir, pid) = match &self.command {
            Verb::Ls { dir } => (dir, None),
            Verb::Show { dir, pid } => (dir, Some(Pid::from_u64(*pid))),
        };
        if !dir.is_dir() {
            return Err(Failure::new(Exit::Usage, format!("no journal in `{}`: not a directory", dir.display())));
        }
        let history = Journal::open(dir)
            .and_then(|journal| journal.history())
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
                process.records.iter().map(|record| format!("{record}\n")).collect()
            }
        };
        print_now(&text).map_err(|_| Failure::new(Exit::StdoutClosed, "stdout was closed"))?;
        Ok(Exit::Success.into())
    }
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
            None => "unfinished (resumes on the next run with this journal)".to_owned(),
            Some(Ok(_)) => "finished: ok".to_owned(),
            Some(Err(error)) => format!("failed: {error}"),
        };
        text.push_str(&format!(
            "{:<20} {:<20} {:<12} {:>6}  {state}\n",
            process.pid, parent, process.method, process.steps
        ));
    }
    text
}
