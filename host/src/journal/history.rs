//! A journal's processes as a person reads them ([`Journal::history`], `wasmproc journal
//! show`): each record a line ([`History::records`]), its number, kind and time, then what
//! went in and what came out, payloads shown as their text where they have one.
//!
//! ```text
//!    0  spawn  2026-11-24 14:22:15.848228 UTC  worker(null) by 4328521728 (parent's record 1, yield 1), kind app
//!    2  step   +13.9 ms  message "n" 1 from 4328521728 (sender's record 7) → 1: sleep 5ms → blocked
//!    3  step   +5.2 ms   completion 1: ok (empty) → sends "answer" 1 to 4328521728 → idle
//!   13  exit   ok 5
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::ops::ControlFlow;

use wasmproc_types::{ExitReason, Format, Payload, Pid};

use super::Journal;
use super::read::Decode;
use super::record::{Record, SpawnRecord, StepRecord};
use super::store::Key;
use crate::step::{Command, Event, ExitSignal, Exited, Outcome, Status};

/// One process's history as a journal holds it: see [`Journal::history`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct History {
    /// The process.
    pub pid: Pid,
    /// Its spawner ([`Pid::HOST`] for the embedder); `None` if the spawn record is missing.
    pub parent: Option<Pid>,
    /// The registered kind it was made from.
    pub kind: Option<String>,
    /// Its entry method.
    pub method: String,
    /// Steps recorded.
    pub steps: u64,
    /// How it ended, once its exit is recorded; `None` while it is unfinished.
    pub result: Option<Exited>,
    /// Each record, one line of text apiece, in order: its number, its kind, its time
    /// (a step's after the record before), what went in and what came out.
    pub records: Vec<String>,
    /// How its last step ended; `None` before its first step and once it has ended.
    pub last_status: Option<Status>,
    /// What it waits for as its history leaves it: each command it yielded whose
    /// completion is not recorded, one line apiece (`1: sleep 5ms`). Empty once it has
    /// ended.
    pub waiting_for: Vec<String>,
}

impl Journal {
    /// Every process the journal holds, in pid order, with its records decoded.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn history(&self) -> std::io::Result<Vec<History>> {
        let mut all = Vec::new();
        self.histories(1, None, &mut all)?;
        Ok(all)
    }

    /// The histories of `root` and of every process spawned under it, in pid order, as
    /// [`Journal::history`] gives them: the rest of the journal is read only for its
    /// spawners, without decoding it.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn history_of(&self, root: Pid) -> std::io::Result<Vec<History>> {
        let mut all = Vec::new();
        for pid in self.tree_of(root)? {
            let process = pid.as_u64();
            self.histories(process, process.checked_add(1), &mut all)?;
        }
        Ok(all)
    }

    /// `root` and every process the journal holds spawned under it, found by reading
    /// only the spawner each spawn (or snapshot) record names.
    pub(crate) fn tree_of(&self, root: Pid) -> std::io::Result<BTreeSet<Pid>> {
        let mut parents: HashMap<Pid, Pid> = HashMap::new();
        self.store.scan(Key { process: 1, seq: 0 }, &mut |key, value| {
            if let Some(parent) = Record::parent_of(value) {
                parents.insert(Pid::from_u64(key.process), parent);
            }
            ControlFlow::Continue(())
        })?;
        let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
        for (&pid, &parent) in &parents {
            children.entry(parent).or_default().push(pid);
        }
        // The tree, from the root down; a process is in it once, whatever a damaged
        // journal's parents say.
        let mut members = BTreeSet::from([root]);
        let mut next = vec![root];
        while let Some(pid) = next.pop() {
            for &child in children.get(&pid).map_or(&[][..], Vec::as_slice) {
                if members.insert(child) {
                    next.push(child);
                }
            }
        }
        Ok(members)
    }

    /// Appends to `all` the histories of the processes from `from` to `to` (every one
    /// after `from` when `None`).
    fn histories(&self, from: u64, to: Option<u64>, all: &mut Vec<History>) -> std::io::Result<()> {
        // The process whose records are being read: the last of `all`, once there is one.
        let mut current: Option<Pid> = None;
        // The time of the last spawn or step read, which the next step's is shown after.
        let mut last_at = None;
        // The process's yields not completed yet, by tag: its `waiting_for` once its
        // records have all been read.
        let mut pending = BTreeMap::new();
        self.scan_records(from, to, Decode::All, &mut |key, record| {
            let Some(record) = record else { unreachable!("every record is decoded") };
            let pid = Pid::from_u64(key.process);
            if current != Some(pid) {
                last_at = None;
                if current.is_some()
                    && let Some(previous) = all.last_mut()
                {
                    fill_waiting_for(previous, &mut pending);
                }
                current = Some(pid);
                all.push(History {
                    pid,
                    parent: None,
                    kind: None,
                    method: String::new(),
                    steps: 0,
                    result: None,
                    records: Vec::new(),
                    last_status: None,
                    waiting_for: Vec::new(),
                });
            }
            let history = all.last_mut().expect("pushed above");
            match &record {
                Record::Spawn(spawn) => {
                    history.parent = Some(spawn.parent);
                    history.kind.clone_from(&spawn.kind);
                    history.method.clone_from(&spawn.method);
                }
                Record::Snapshot(snapshot) => {
                    history.parent = Some(snapshot.spawn.parent);
                    history.kind.clone_from(&snapshot.spawn.kind);
                    history.method.clone_from(&snapshot.spawn.method);
                    history.steps = snapshot.steps;
                    for (_, _, _, y) in &snapshot.carried.outstanding {
                        pending.insert(y.tag, format!("{}: {}", y.tag, command(&y.command)));
                    }
                }
                Record::Step(step) => {
                    history.steps += 1;
                    for event in &step.events {
                        if let Event::Completion { tag, .. } = event {
                            pending.remove(tag);
                        }
                    }
                    for y in &step.yields {
                        pending.insert(y.tag, format!("{}: {}", y.tag, command(&y.command)));
                    }
                    history.last_status = Some(step.status.clone());
                }
                Record::Exit(result) => {
                    history.result = Some(result.clone());
                    history.last_status = None;
                    pending.clear();
                }
                Record::HostMessage { .. } | Record::Received { .. } => {}
            }
            history.records.push(line(key.seq, &record, &mut last_at));
            ControlFlow::Continue(())
        })?;
        if current.is_some()
            && let Some(last) = all.last_mut()
        {
            fill_waiting_for(last, &mut pending);
        }
        Ok(())
    }
}

/// Gives `history` what its process waits for: the `pending` yields left once its
/// records have all been read.
fn fill_waiting_for(history: &mut History, pending: &mut BTreeMap<u64, String>) {
    history.waiting_for = std::mem::take(pending).into_values().collect();
}

/// The most characters of a payload's text a line shows; the rest is counted.
const SHOWN: usize = 60;

/// The line of record `seq`. `last_at` is the time of the record before that had one
/// (a spawn's or a step's), which a step's time is shown after; it becomes this one's.
fn line(seq: u64, record: &Record, last_at: &mut Option<u64>) -> String {
    let mut line = format!("{seq:>4}  ");
    match record {
        Record::Spawn(spawn) => {
            let _ = write!(line, "spawn  {}  ", utc(spawn.at));
            spawned(&mut line, spawn);
            *last_at = Some(spawn.at);
        }
        Record::Step(step) => {
            let _ = write!(line, "step   {:<9} ", after(*last_at, step.at));
            stepped(&mut line, step);
            *last_at = Some(step.at);
        }
        Record::Snapshot(snapshot) => {
            let _ = write!(
                line,
                "snap   {}  after {} steps, {} bytes of state, in place of the records before it; ",
                utc(snapshot.at),
                snapshot.steps,
                snapshot.state.len()
            );
            spawned(&mut line, &snapshot.spawn);
            *last_at = Some(snapshot.at);
        }
        Record::Exit(exited) => {
            line.push_str("exit   ");
            ended(&mut line, exited);
        }
        Record::HostMessage { topic, body } => {
            let _ = write!(line, "host   message {topic:?} {} from the host", payload(body));
        }
        Record::Received { from, topic, body, .. } => {
            let _ = write!(line, "recv   message {topic:?} {} from {from}", payload(body));
        }
    }
    line
}

fn spawned(line: &mut String, spawn: &SpawnRecord) {
    let _ = write!(line, "{} by {}", entry(&spawn.method, &spawn.input), who(spawn.parent));
    if let Some((seq, tag)) = spawn.origin {
        let _ = write!(line, " (parent's record {seq}, yield {tag})");
    }
    if let Some(kind) = &spawn.kind {
        let _ = write!(line, ", kind {kind}");
    }
    if let Some(identity) = &spawn.identity {
        let _ = write!(line, ", program {identity}");
    }
}

fn stepped(line: &mut String, step: &StepRecord) {
    let mut ids = step.message_ids.iter();
    let events: Vec<String> = step
        .events
        .iter()
        .map(|event| {
            let mut shown = String::new();
            event_into(&mut shown, event);
            // A process's message is known by the record of the step that sent it (see
            // `durable::port_send_id`); the embedder's by the receiver's record of it.
            if let Event::Message { sender, .. } = event
                && let Some((_, id)) = ids.next()
                && *sender != Pid::HOST
            {
                let _ = write!(shown, " (sender's record {})", id >> 20);
            }
            shown
        })
        .collect();
    line.push_str(&if events.is_empty() { "no events".to_owned() } else { events.join("; ") });
    if !step.sends.is_empty() {
        let sends: Vec<String> =
            step.sends.iter().map(|(to, topic, body)| format!("{topic:?} {} to {}", payload(body), who(*to))).collect();
        let _ = write!(line, " → sends {}", sends.join("; "));
    }
    if !step.yields.is_empty() {
        let yields: Vec<String> = step.yields.iter().map(|y| format!("{}: {}", y.tag, command(&y.command))).collect();
        let _ = write!(line, " → {}", yields.join("; "));
    }
    line.push_str(match &step.status {
        Status::Blocked => " → blocked",
        Status::Idle => " → idle",
        Status::Continue => " → continue",
        Status::Complete(_) => " → complete",
    });
}

fn event_into(line: &mut String, event: &Event) {
    match event {
        Event::Completion { tag, result } => {
            let _ = write!(line, "completion {tag}: ");
            outcome(line, result);
        }
        Event::Message { sender, topic, body } => {
            let _ = write!(line, "message {topic:?} {} from {}", payload(body), who(*sender));
        }
        Event::Exit { pid, reason, linked } => {
            let _ = write!(line, "exit of {pid}{}: ", if *linked { " (linked)" } else { "" });
            exit_reason(line, reason);
        }
        Event::Cancel { reason } => {
            let _ = write!(line, "cancel: {}", excerpt(reason));
        }
    }
}

/// A command as a step's line shows what it yielded.
fn command(command: &Command) -> String {
    match command {
        Command::Sleep(duration) => format!("sleep {duration:?}"),
        Command::Spawn(spawn) => {
            let mut shown = format!("spawn {}", entry(&spawn.method, &spawn.input));
            if let Some(kind) = &spawn.kind {
                let _ = write!(shown, " of kind {kind}");
            }
            if spawn.monitor {
                shown.push_str(", monitored");
            }
            if spawn.link {
                shown.push_str(", linked");
            }
            shown
        }
        Command::Send { to, topic, body } => format!("send {topic:?} {} to {}", payload(body), who(*to)),
        Command::Monitor(pid) => format!("monitor {pid}"),
        Command::Terminate(pid) => format!("terminate {pid}"),
        Command::Link(pid) => format!("link {pid}"),
        Command::Unlink(pid) => format!("unlink {pid}"),
        Command::Demonitor(pid) => format!("demonitor {pid}"),
        Command::Exit(ExitSignal { to, reason, kill }) => {
            let mut shown = format!("exit {to}: ");
            exit_reason(&mut shown, reason);
            if *kill {
                shown.push_str(", kill");
            }
            shown
        }
        Command::TrapExits(on) => format!("trap-exits {on}"),
        Command::Custom { name, payload: input } => format!("{name} {}", payload(input)),
    }
}

/// An entry method called with its input: `main(1, "a")`.
fn entry(method: &str, input: &[Payload]) -> String {
    let inputs: Vec<String> = input.iter().map(payload).collect();
    format!("{method}({})", inputs.join(", "))
}

fn outcome(line: &mut String, result: &Outcome) {
    let _ = match result {
        Ok(value) => write!(line, "ok {}", payload(value)),
        Err(error) => write!(line, "error {}", excerpt(error)),
    };
}

/// A reason as a record's line shows it: `normal 5`, `error "boom"`, `trap panic "…"`,
/// `killed`.
fn exit_reason(line: &mut String, reason: &ExitReason) {
    line.push_str(reason.name());
    let _ = match reason {
        ExitReason::Normal(value) => write!(line, " {}", payload(value)),
        ExitReason::Error(text) | ExitReason::Noconnection(text) => write!(line, " {}", excerpt(text)),
        ExitReason::Trap(trap) => write!(line, " {} {}", trap.kind, excerpt(&trap.message)),
        _ => Ok(()),
    };
}

/// A process's end as its exit record shows it: its reason, and whose exit signal
/// ended it.
fn ended(line: &mut String, exited: &Exited) {
    exit_reason(line, &exited.reason);
    if let Some(from) = exited.signal_from {
        let _ = write!(line, " (exit signal from {from})");
    }
}

fn who(pid: Pid) -> String {
    if pid == Pid::HOST { "the host".to_owned() } else { pid.to_string() }
}

/// A payload as its text (JSON as written, text quoted), or its size and first bytes.
fn payload(payload: &Payload) -> String {
    let data = &payload.data;
    match (&payload.format, std::str::from_utf8(data)) {
        (Format::Json, Ok(text)) => excerpt_raw(text),
        (Format::Text, Ok(text)) => excerpt(text),
        _ if data.is_empty() => "(empty)".to_owned(),
        (format, _) => {
            let mut shown = format!("({} bytes", data.len());
            if *format != Format::Bytes {
                let _ = write!(shown, " of {format}");
            }
            shown.push(':');
            for byte in data.iter().take(8) {
                let _ = write!(shown, " {byte:02x}");
            }
            if data.len() > 8 {
                shown.push_str(" …");
            } else if let Some(number) = payload.to_u64() {
                // How a pid, a count or a time travels (`Payload::u64`).
                let _ = write!(shown, ", u64 {number}");
            }
            shown.push(')');
            shown
        }
    }
}

/// `text` quoted and escaped, cut at [`SHOWN`] characters.
fn excerpt(text: &str) -> String {
    let (shown, rest) = cut(text);
    let mut quoted = format!("{shown:?}");
    if rest > 0 {
        let _ = write!(quoted, "…(+{rest} bytes)");
    }
    quoted
}

/// `text` as it is but for control characters, cut at [`SHOWN`] characters.
fn excerpt_raw(text: &str) -> String {
    let (shown, rest) = cut(text);
    let mut raw = String::with_capacity(shown.len());
    for c in shown.chars() {
        if c.is_control() {
            raw.extend(c.escape_default());
        } else {
            raw.push(c);
        }
    }
    if rest > 0 {
        let _ = write!(raw, "…(+{rest} bytes)");
    }
    raw
}

/// `text`'s first [`SHOWN`] characters, and how many bytes are left.
fn cut(text: &str) -> (&str, usize) {
    let end = text.char_indices().nth(SHOWN).map_or(text.len(), |(at, _)| at);
    (&text[..end], text.len() - end)
}

/// The time `micros` after `last` (the record before), or its absolute time if none.
fn after(last: Option<u64>, micros: u64) -> String {
    let Some(last) = last else { return utc(micros) };
    let delta = micros.saturating_sub(last);
    match delta {
        0..1_000 => format!("+{delta} µs"),
        1_000..1_000_000 => format!("+{:.1} ms", delta as f64 / 1e3),
        _ => format!("+{:.2} s", delta as f64 / 1e6),
    }
}

/// `micros` since the Unix epoch as a UTC date and time, to the microsecond.
fn utc(micros: u64) -> String {
    let seconds = micros / 1_000_000;
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil(days as i64);
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}.{:06} UTC", micros % 1_000_000)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::caps::Capabilities;
    use crate::step::{SpawnRequest, Yield};

    const AT: u64 = 1_795_605_135_848_228;

    fn json(text: &str) -> Payload {
        Payload { format: Format::Json, data: text.as_bytes().to_vec() }
    }

    fn step(at: u64, events: Vec<Event>, ids: Vec<(Pid, u64)>, yields: Vec<Yield>, status: Status) -> Record {
        Record::Step(StepRecord { at, events, message_ids: ids, yields, sends: Vec::new(), status })
    }

    fn lines(records: &[Record]) -> Vec<String> {
        let mut last_at = None;
        records.iter().zip(0..).map(|(record, seq)| line(seq, record, &mut last_at)).collect()
    }

    #[test]
    fn a_history_reads_as_one_line_a_record_each_step_timed_after_the_one_before() {
        let parent = Pid::from_u64(4_328_521_728);
        let spawn = Record::Spawn(SpawnRecord {
            parent,
            origin: Some((1, 1)),
            kind: Some("app".to_owned()),
            identity: Some("sha256:37d3".to_owned()),
            method: "worker".to_owned(),
            input: vec![json("null")],
            caps: Capabilities::default(),
            mailbox_capacity: 1024,
            at: AT,
            seed: [7; 32],
            note: None,
        });
        let message = Event::Message { sender: parent, topic: "n".to_owned(), body: json("1") };
        let sleep = Yield { tag: 1, command: Command::Sleep(Duration::from_millis(5)) };
        let mut answered = StepRecord {
            at: AT + 19_767,
            events: vec![Event::Completion { tag: 1, result: Ok(Payload::empty()) }],
            message_ids: Vec::new(),
            yields: Vec::new(),
            sends: vec![(parent, "answer".to_owned(), json("1"))],
            status: Status::Idle,
        };
        let records = [
            spawn,
            step(AT + 667, Vec::new(), Vec::new(), Vec::new(), Status::Idle),
            step(AT + 14_567, vec![message], vec![(parent, 7 << 20)], vec![sleep], Status::Blocked),
            Record::Step(answered.clone()),
            Record::HostMessage { topic: "stop".to_owned(), body: Payload::text("now") },
            Record::Exit(Exited::new(ExitReason::Normal(json("5")))),
        ];
        assert_eq!(
            lines(&records),
            [
                "   0  spawn  2026-11-25 11:12:15.848228 UTC  worker(null) by 4328521728 (parent's record 1, yield 1), \
                 kind app, program sha256:37d3",
                "   1  step   +667 µs   no events → idle",
                "   2  step   +13.9 ms  message \"n\" 1 from 4328521728 (sender's record 7) → 1: sleep 5ms → blocked",
                "   3  step   +5.2 ms   completion 1: ok (empty) → sends \"answer\" 1 to 4328521728 → idle",
                "   4  host   message \"stop\" \"now\" from the host",
                "   5  exit   normal 5",
            ]
        );
        // A history read from its middle shows its first step's time in full.
        answered.at = AT + 2_000_000;
        let mut last_at = None;
        assert_eq!(
            line(9, &Record::Step(answered.clone()), &mut last_at),
            "   9  step   2026-11-25 11:12:17.848228 UTC completion 1: ok (empty) → sends \"answer\" 1 to 4328521728 → idle"
        );
        answered.at += 2_500_000;
        assert!(line(10, &Record::Step(answered), &mut last_at).starts_with("  10  step   +2.50 s   completion"));
    }

    #[test]
    fn commands_events_and_payloads_read_as_what_they_are() {
        let pid = Pid::from_u64(42);
        let spawn = SpawnRequest {
            kind: Some("worker".to_owned()),
            method: "main".to_owned(),
            input: vec![Payload::u64(3), json("[1, 2]")],
            monitor: true,
            link: false,
        };
        let commands = [
            (
                Command::Spawn(spawn),
                "spawn main((8 bytes: 03 00 00 00 00 00 00 00, u64 3), [1, 2]) of kind worker, monitored",
            ),
            (
                Command::Send { to: pid, topic: "t".to_owned(), body: Payload::text("a\nb") },
                "send \"t\" \"a\\nb\" to 42",
            ),
            (Command::Monitor(pid), "monitor 42"),
            (Command::Terminate(Pid::HOST), "terminate 0"),
            (Command::Custom { name: "kv.get".into(), payload: json("{\n\"k\": 1}") }, "kv.get {\\n\"k\": 1}"),
            (Command::Link(pid), "link 42"),
            (
                Command::Exit(ExitSignal { to: pid, reason: ExitReason::Error("bye".into()), kill: true }),
                "exit 42: error \"bye\", kill",
            ),
            (Command::TrapExits(true), "trap-exits true"),
        ];
        for (command, shown) in commands {
            assert_eq!(super::command(&command), shown);
        }
        let events = [
            (
                Event::Completion { tag: 3, result: Err("no such key".to_owned()) },
                "completion 3: error \"no such key\"",
            ),
            (
                Event::Exit { pid, reason: ExitReason::Normal(Payload::bytes(vec![0xff; 20])), linked: false },
                "exit of 42: normal (20 bytes: ff ff ff ff ff ff ff ff …)",
            ),
            (
                Event::Exit { pid, reason: ExitReason::trap(wasmproc_types::TrapKind::Panic, "boom"), linked: true },
                "exit of 42 (linked): trap panic \"boom\"",
            ),
            (Event::Cancel { reason: "shutdown".to_owned() }, "cancel: \"shutdown\""),
        ];
        for (event, shown) in events {
            let mut line = String::new();
            event_into(&mut line, &event);
            assert_eq!(line, shown);
        }
        let other = Payload { format: Format::Other("cbor".into()), data: vec![0xa1, 0x01] };
        assert_eq!(payload(&other), "(2 bytes of cbor: a1 01)");
        let long = "é".repeat(100);
        assert_eq!(excerpt(&long), format!("{:?}…(+80 bytes)", "é".repeat(60)));
        assert_eq!(payload(&Payload { format: Format::Text, data: vec![0xff] }), "(1 bytes of text: ff)");
    }

    /// One workflow's histories are those of its root and its tree, as the whole
    /// journal's history shows them, and no other's.
    #[test]
    fn a_roots_history_is_its_trees_and_no_others() {
        use super::super::store::{Batch, MemoryStore, Store as _};
        let spawned = |parent: u64| {
            Record::Spawn(SpawnRecord {
                parent: Pid::from_u64(parent),
                origin: None,
                kind: Some("app".to_owned()),
                identity: None,
                method: "main".to_owned(),
                input: Vec::new(),
                caps: Capabilities::default(),
                mailbox_capacity: 16,
                at: AT,
                seed: [1; 32],
                note: (parent == 0).then(|| b"noted".to_vec()),
            })
        };
        let store = MemoryStore::new();
        // Roots 10 and 20; 10's child 30 and grandchild 5 (a pid below its root's); 20's
        // child 40; each with a step after its spawn, 30 with its exit too.
        let mut puts = Vec::new();
        for (pid, parent) in [(10, 0), (20, 0), (30, 10), (5, 30), (40, 20)] {
            puts.push((Key { process: pid, seq: 0 }, spawned(parent).encode()));
            let stepped = step(AT + pid, Vec::new(), Vec::new(), Vec::new(), Status::Idle);
            puts.push((Key { process: pid, seq: 1 }, stepped.encode()));
        }
        puts.push((Key { process: 30, seq: 2 }, Record::Exit(Exited::new(ExitReason::Normal(json("1")))).encode()));
        store.commit(&Batch { puts, removals: Vec::new() }, true).unwrap();
        let journal = Journal::with_store(store);
        let all = journal.history().unwrap();
        for (root, tree) in [(10, vec![5, 10, 30]), (20, vec![20, 40])] {
            let expected: Vec<History> = all.iter().filter(|h| tree.contains(&h.pid.as_u64())).cloned().collect();
            assert_eq!(expected.len(), tree.len());
            assert_eq!(journal.history_of(Pid::from_u64(root)).unwrap(), expected, "root {root}");
        }
        assert_eq!(journal.history_of(Pid::from_u64(99)).unwrap(), Vec::new(), "no such root");
        // A run found by its root alone is the one the list of every run holds.
        let runs = journal.runs().unwrap();
        for root in [10, 20] {
            let listed = runs.iter().find(|run| run.root.as_u64() == root).unwrap();
            let found = journal.run_of(Pid::from_u64(root)).unwrap().expect("a run");
            assert_eq!(format!("{found:?}"), format!("{listed:?}"), "root {root}");
        }
        assert!(journal.run_of(Pid::from_u64(30)).unwrap().is_none(), "a child is no run's root");
        assert!(journal.run_of(Pid::from_u64(99)).unwrap().is_none());
        assert_eq!(Record::parent_of(&spawned(30).encode()), Some(Pid::from_u64(30)));
        assert_eq!(Record::parent_of(&Record::Exit(Exited::new(ExitReason::Killed)).encode()), None);
    }

    #[test]
    fn times_are_utc_dates_to_the_microsecond() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000000 UTC");
        assert_eq!(utc(951_782_400_000_001), "2000-02-29 00:00:00.000001 UTC");
        assert_eq!(utc(4_107_542_399_999_999), "2100-02-28 23:59:59.999999 UTC");
        assert_eq!(utc(AT), "2026-11-25 11:12:15.848228 UTC");
    }
}
