//! What a run prints at its end (the result, the summary) and while it runs (the
//! compile notice, the progress line), and the exit code it ends with.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc::cluster::ClusterStats;
use wasmproc::journal::CommitStats;
use wasmproc::scheduler::Stats;
use wasmproc::wasm::{Escaped, HibernationStats, exit_code};
use wasmproc::{ExitReason, Exited, Format, Payload, Pid, Scheduler, TrapKind};

use super::Exit;
use super::output::{ERASE, Output, Say, style};
use super::stop::Stop;
use super::units::{bytes, count};

/// The `--stats` summary.
pub(super) struct Summary {
    of: Of,
    wall: Duration,
    /// Guest output lines dropped because stderr was not read fast enough.
    dropped: u64,
}

/// What a summary is of.
enum Of {
    /// A run on this host: its scheduler's counts, and what a durable run's journal
    /// wrote.
    Here { stats: Box<Stats>, journal: Option<CommitStats>, whole: HibernationStats },
    /// A run on a cluster: the node its entry ran on (name and id), and what this
    /// client's links did. The nodes' schedulers count for all their runs, not this one.
    Cluster { node: String, id: u16, links: ClusterStats },
}

impl Summary {
    pub(super) fn new(stats: Stats, wall: Duration, dropped: u64) -> Summary {
        Summary {
            of: Of::Here { stats: Box::new(stats), journal: None, whole: HibernationStats::default() },
            wall,
            dropped,
        }
    }

    /// The summary of a run whose entry ran on node `node` (`id`) of a cluster.
    pub(super) fn cluster(node: String, id: u16, links: ClusterStats, wall: Duration, dropped: u64) -> Summary {
        Summary { of: Of::Cluster { node, id, links }, wall, dropped }
    }

    /// The same, with what the run's journal wrote.
    pub(super) fn with_journal(mut self, written: Option<CommitStats>) -> Summary {
        if let Of::Here { journal, .. } = &mut self.of {
            *journal = written;
        }
        self
    }

    /// The same, with what its Wasm processes' whole-instance hibernation did.
    pub(super) fn with_hibernation(mut self, did: HibernationStats) -> Summary {
        if let Of::Here { whole, .. } = &mut self.of {
            *whole = did;
        }
        self
    }

    fn json(&self) -> Value {
        let (s, journal, whole) = match &self.of {
            Of::Here { stats, journal, whole } => (stats, journal, whole),
            Of::Cluster { node, id, links } => {
                return json!({
                    "node": node,
                    "node_id": id,
                    "messages_sent": links.messages_sent,
                    "messages_delivered": links.messages_delivered,
                    "messages_lost": links.messages_lost,
                    "retransmitted": links.retransmitted,
                    "frames_refused": links.frames_refused,
                    "log_lines_dropped": self.dropped,
                    "wall_ms": self.wall.as_secs_f64() * 1e3,
                });
            }
        };
        json!({
            "processes": s.spawned,
            "peak_live": s.peak_live,
            "steps": s.workers.iter().map(|w| w.executed).sum::<u64>(),
            "yields": s.yields,
            "yields_by_command": s.yields_by_command.by_name().iter().map(|(name, n)| (name.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "messages": s.messages,
            "undelivered": s.undelivered,
            "hibernated": s.hibernated,
            "hibernated_whole": whole.hibernations,
            "woken_whole": whole.wakes,
            "suspensions": s.suspensions,
            "brought_back": s.returns,
            "suspended_now": s.suspended,
            "steals": s.workers.iter().map(|w| w.steals).sum::<u64>(),
            "workers": s.workers.iter().map(|w| json!({"steps": w.executed, "steals": w.steals, "stolen": w.stolen})).collect::<Vec<_>>(),
            "log_lines_dropped": self.dropped,
            "unobserved_failures": s.unobserved_failures,
            "journal": journal.map(|j| json!({"commits": j.commits, "records": j.records, "bytes": j.bytes})),
            "wall_ms": self.wall.as_secs_f64() * 1e3,
        })
    }

    fn lines(&self) -> Vec<String> {
        let (s, journal, whole) = match &self.of {
            Of::Here { stats, journal, whole } => (stats, journal, whole),
            Of::Cluster { node, id, links } => {
                return vec![
                    "── wasmproc stats ──".to_owned(),
                    format!("node        `{node}` (node {id}) ran the entry process"),
                    format!(
                        "links       {} messages sent, {} delivered here, {} lost, {} items retransmitted",
                        count(links.messages_sent),
                        count(links.messages_delivered),
                        count(links.messages_lost),
                        count(links.retransmitted)
                    ),
                    format!("wall time   {:.1?}", self.wall),
                ];
            }
        };
        let steps: u64 = s.workers.iter().map(|w| w.executed).sum();
        let by: Vec<String> = s
            .yields_by_command
            .by_name()
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
            format!(
                "hibernated  {} times a waiting process gave memory back, {} of them its whole instance ({} woken)",
                count(s.hibernated),
                count(whole.hibernations),
                count(whole.wakes)
            ),
            format!(
                "suspended   {} (waiting durable processes that left memory), {} brought back, {} suspended now",
                count(s.suspensions),
                count(s.returns),
                count(s.suspended as u64)
            ),
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
        if let Some(j) = journal {
            lines.push(format!(
                "journal     {} records, {} in {} commits",
                count(j.records),
                bytes(j.bytes),
                count(j.commits)
            ));
        }
        lines.push(format!("wall time   {:.1?}", self.wall));
        lines
    }
}

/// How many failures nobody waited on the end-of-run line shows, of the few the
/// scheduler keeps: enough to start looking.
const UNOBSERVED_SHOWN: usize = 3;

/// What a run prints at its end.
pub(super) struct Report<'a> {
    json: bool,
    out: &'a Output,
    is_command: bool,
    summary: Option<Summary>,
    /// Processes that failed with nobody told, and some of their errors.
    unobserved: Option<(u64, Vec<(Pid, String)>)>,
}

impl<'a> Report<'a> {
    /// The report of a run that writes to `out` (one JSON object if `json`), of a WASI
    /// command if `is_command`.
    pub(super) fn new(json: bool, out: &'a Output, is_command: bool) -> Report<'a> {
        Report { json, out, is_command, summary: None, unobserved: None }
    }

    /// The same, with the `--stats` summary.
    pub(super) fn with_summary(self, summary: Option<Summary>) -> Report<'a> {
        Report { summary, ..self }
    }

    /// The same, saying which processes failed with nobody told of it (from `stats`): a
    /// failure that would otherwise pass unseen, as a child's whose parent had ended.
    pub(super) fn with_unobserved(self, stats: &Stats) -> Report<'a> {
        let unobserved =
            (stats.unobserved_failures > 0).then(|| (stats.unobserved_failures, stats.first_unobserved.clone()));
        Report { unobserved, ..self }
    }

    /// Prints the entry process's result (whenever it has one, even if the run was
    /// stopped after it ended) and the summary, waits for the output to be written (until
    /// `flush_by` at the latest), and picks the exit code.
    pub(super) fn finish(self, root: Option<Ended>, stop: Option<Stop>, flush_by: Option<Instant>) -> ExitCode {
        let Report { json, out, is_command, summary, unobserved } = self;
        let exit_of_command = |payload: &Payload| exit_code(payload).unwrap_or(1);
        let root = root.map(|ended| match &ended.exited.reason {
            ExitReason::Normal(payload) => Ok(payload.clone()),
            _ => Err((flags_named(&ended.sentence()), ended)),
        });
        let outcome = match &root {
            Some(Ok(payload)) => Ok(payload),
            Some(Err((error, _))) => Err(error.clone()),
            None => Err(stop.map_or_else(String::new, Stop::reason)),
        };
        // `run` refuses --json for a WASI command, whose stdout is the program's.
        if json && !is_command {
            let mut object = match (&outcome, &root) {
                (Ok(payload), _) => json!({ "ok": Payload::to_json_value(payload) }),
                (Err(error), Some(Err((_, ended)))) => json!({ "error": error, "exit": ended.json() }),
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
                if style().json {
                    let mut fields = serde_json::Map::new();
                    fields.insert("stats".to_owned(), summary.json());
                    out.say_with(Say::Report, "stats", fields);
                } else {
                    for line in summary.lines() {
                        out.text_line(line);
                    }
                }
            }
            match &root {
                Some(Ok(payload)) if !is_command => out.stdout(payload_bytes(payload)),
                Some(Err((error, _))) => out.say(Say::Error, for_stderr(error)),
                Some(Ok(_)) | None => {}
            }
        }
        if let Some((failed, first)) = unobserved {
            say_unobserved(out, failed, &first);
        }
        let dropped = out.dropped();
        if dropped > 0 {
            out.say(
                Say::Warning,
                format!(
                    "{} of guest output dropped: stderr was not read fast enough",
                    if dropped == 1 { "1 line".to_owned() } else { format!("{} lines", count(dropped)) }
                ),
            );
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

/// The entry process's end, as a run reports it: its pid (`None` when it never started)
/// and how it ended.
#[derive(Debug, Clone)]
pub(super) struct Ended {
    pub(super) pid: Option<Pid>,
    pub(super) exited: Exited,
}

impl Ended {
    /// The end of process `pid`.
    pub(super) fn of(pid: Pid, exited: Exited) -> Ended {
        Ended { pid: Some(pid), exited }
    }

    /// A process that could not start, with why.
    pub(super) fn not_started(error: String) -> Ended {
        Ended { pid: None, exited: Exited::new(ExitReason::Error(error)) }
    }

    /// The end of process `pid` from its result (a cluster's process).
    pub(super) fn from_result(pid: Option<Pid>, result: Result<Payload, ExitReason>) -> Ended {
        let reason = match result {
            Ok(payload) => ExitReason::Normal(payload),
            Err(reason) => reason,
        };
        Ended { pid, exited: Exited::new(reason) }
    }

    /// The line an abnormal end is reported with: `process 3 trapped: panic: index out of
    /// bounds`, `process 3 exited because linked process 7 trapped: …`; `the process
    /// failed: …` for one that never started.
    fn sentence(&self) -> String {
        match (self.pid, &self.exited.reason) {
            (Some(pid), _) => format!("process {pid} {}", self.exited),
            (None, ExitReason::Error(error)) => format!("the process failed: {error}"),
            (None, _) => format!("the process {}", self.exited),
        }
    }

    /// The end as `--json` carries it (see docs/cli.md, "Results"): the pid, the
    /// reason's name, what the reason carries under its own name, and the process whose
    /// exit signal ended it.
    fn json(&self) -> Value {
        let mut object = serde_json::Map::new();
        if let Some(pid) = self.pid {
            object.insert("pid".to_owned(), json!(pid.as_u64()));
        }
        let reason = &self.exited.reason;
        object.insert("reason".to_owned(), json!(reason.name()));
        match reason {
            ExitReason::Error(error) => {
                object.insert("error".to_owned(), json!(flags_named(error)));
            }
            ExitReason::Trap(trap) => {
                let kind: TrapKind = trap.kind;
                object.insert("trap".to_owned(), json!({"kind": kind.as_str(), "message": flags_named(&trap.message)}));
            }
            ExitReason::Noconnection(node) => {
                object.insert("node".to_owned(), json!(node));
            }
            _ => {}
        }
        if let Some(from) = self.exited.signal_from {
            object.insert("linked_process".to_owned(), json!(from.as_u64()));
        }
        Value::Object(object)
    }
}

/// The end-of-run warning about failures nobody was told of: how many, then the first
/// few, one a line (one object with `--log-format json`).
fn say_unobserved(out: &Output, failed: u64, first: &[(Pid, String)]) {
    let shown = &first[..first.len().min(UNOBSERVED_SHOWN)];
    let what = if failed == 1 { "1 process".to_owned() } else { format!("{} processes", count(failed)) };
    let headline = format!("{what} failed with nobody waiting (no monitor, no waiting parent)");
    if style().json {
        let mut fields = serde_json::Map::new();
        fields.insert("failed".to_owned(), json!(failed));
        let first: Vec<Value> =
            shown.iter().map(|(pid, error)| json!({"pid": pid.as_u64(), "error": flags_named(error)})).collect();
        fields.insert("first".to_owned(), json!(first));
        out.say_with(Say::Warning, &headline, fields);
        return;
    }
    let mut text = format!("{headline}:");
    for (pid, error) in shown {
        text.push_str(&format!("\n  process {pid}: {}", for_stderr(&flags_named(error))));
    }
    if failed > shown.len() as u64 {
        text.push_str(&format!(
            "\n  and {} more (a parent that waits or monitors sees each)",
            count(failed - shown.len() as u64)
        ));
    }
    out.say(Say::Warning, text);
}

/// The library's settings that `run` sets with a flag of another name, each with the flag:
/// a limit's error names the setting, and a user of the command line knows the flag.
const SETTING_FLAGS: &[(&str, &str)] = &[
    ("max_children", "--max-children"),
    ("max_links", "--max-links"),
    ("max_memory", "--memory"),
    ("max_memories", "--max-memories"),
    ("max_yields_per_step", "--max-yields"),
    ("max_payload_size", "--max-payload"),
    ("max_processes", "--max-processes"),
    ("max_instances", "--max-processes"),
    ("mailbox_capacity", "--mailbox"),
    ("mailbox_bytes", "--mailbox-bytes"),
    ("max_output_per_step", "--max-step-output"),
    ("time_slice", "--time-slice"),
    ("cpu_budget", "--cpu-budget"),
    ("init_time_limit", "--init-time-limit"),
    ("fuel", "--fuel"),
    ("max_core_instances", "--max-core-instances"),
    ("max_tables", "--max-tables"),
    ("max_table_elements", "--max-table-elements"),
    ("max_records_per_process", "--journal-limit"),
];

/// `error` with each library setting it names (`` `max_children` ``) named by its flag
/// instead (`` `--max-children` ``), unless it names the flag already (as "raise it with
/// `--max-tables`" does).
pub(super) fn flags_named(error: &str) -> String {
    let mut text = error.to_owned();
    for (setting, flag) in SETTING_FLAGS {
        let (setting, flag) = (format!("`{setting}`"), format!("`{flag}`"));
        if text.contains(&setting) && !text.contains(&flag) {
            text = text.replace(&setting, &flag);
        }
    }
    text
}

/// A process's error as stderr shows it: in a line of text, what the guest put in it
/// [`Escaped`], so that it stays on its line (a JSON line escapes it as JSON).
pub(super) fn for_stderr(error: &str) -> String {
    if style().json { error.to_owned() } else { Escaped(error).to_string() }
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
pub(super) struct Progress {
    stop: Arc<AtomicBool>,
    /// `None` when the thread could not be started: the line is a courtesy, not a duty.
    thread: Option<thread::JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(scheduler: &Scheduler, out: &Output, start: Instant) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = scheduler.handle().clone();
        let flag = stop.clone();
        let out = out.clone();
        let thread = thread::Builder::new().name("wasmproc-progress".to_owned()).spawn(move || {
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
                out.live_line(line.into_bytes());
                thread::sleep(Duration::from_millis(200));
            }
            out.live_line(ERASE.to_vec());
        });
        Progress { stop, thread: thread.ok() }
    }

    pub(super) fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread {
            let _ = thread.join();
        }
    }
}

/// How long loading a program may take before the run says that it is compiling.
pub(super) const COMPILE_NOTICE_AFTER: Duration = Duration::from_secs(1);

/// Tells that a long compile is under way, from a thread of its own so that it appears
/// while compiling. Started before a load that compiles, it either says so once if the
/// load has not ended [`COMPILE_NOTICE_AFTER`] later (and nothing if it has), or, with
/// `--progress` on a terminal, redraws a line with the time spent so far from the start
/// and erases it when the load ends.
pub(super) struct CompileNotice {
    /// Dropped when the load ends: the thread then wakes and ends.
    loaded: mpsc::Sender<()>,
    thread: Option<thread::JoinHandle<()>>,
}

/// How often the `--progress` line of a compile is redrawn.
const COMPILE_PROGRESS_EVERY: Duration = Duration::from_millis(200);

impl CompileNotice {
    /// Starts the timer of a load of `app` that compiles (`cached`: a later run loads it
    /// from the cache; `live`: redraw a progress line, for `--progress` on a terminal).
    pub(super) fn start(app: &std::path::Path, cached: bool, live: bool, out: &Output) -> CompileNotice {
        let (loaded, wait) = mpsc::channel::<()>();
        let name = app.file_name().map_or_else(|| app.display().to_string(), |n| n.to_string_lossy().into_owned());
        let later = if cached { "first run; later runs use the cache" } else { "--no-cache: every run compiles" };
        let text = format!("compiling {name} ({later})");
        let out = out.clone();
        let started = Instant::now();
        let thread = thread::Builder::new()
            .name("wasmproc-compile-notice".to_owned())
            .spawn(move || {
                if !live {
                    if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(COMPILE_NOTICE_AFTER) {
                        out.say(Say::Notice, format!("{text}…"));
                    }
                    return;
                }
                loop {
                    let line = format!("\r\x1b[Kwasmproc: {text}: {:.1}s", started.elapsed().as_secs_f64());
                    out.live_line(line.into_bytes());
                    if let Err(mpsc::RecvTimeoutError::Disconnected) = wait.recv_timeout(COMPILE_PROGRESS_EVERY) {
                        break;
                    }
                }
                out.live_line(ERASE.to_vec());
                if started.elapsed() >= COMPILE_NOTICE_AFTER {
                    out.say(Say::Notice, format!("compiled {name} in {:.1}s", started.elapsed().as_secs_f64()));
                }
            })
            // Without its thread the notice is not given: it is a courtesy, not a duty.
            .ok();
        CompileNotice { loaded, thread }
    }

    /// The load has ended: no notice from now on.
    pub(super) fn finish(self) {
        let CompileNotice { loaded, thread } = self;
        drop(loaded);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit's error names the flag, not the library's setting.
    #[test]
    fn limit_errors_name_the_flags_that_set_them() {
        assert_eq!(
            flags_named("child limit exceeded: 3 more spawns with 0 children alive would pass `max_children` (2)"),
            "child limit exceeded: 3 more spawns with 0 children alive would pass `--max-children` (2)"
        );
        assert_eq!(
            flags_named("past its `max_memory` of 65536 bytes; the mailbox's `mailbox_bytes`"),
            "past its `--memory` of 65536 bytes; the mailbox's `--mailbox-bytes`"
        );
        // A message that names the flag already is left as it is.
        let named = "past its `max_table_elements` of 10; raise it with `--max-table-elements`";
        assert_eq!(flags_named(named), named);
        assert_eq!(flags_named("max_children, unquoted"), "max_children, unquoted");
    }
}
