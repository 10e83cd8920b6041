//! The journal records of a durable process (see [`crate::journal`]): how a spawn, a step
//! and an exit are written, and read back.
//!
//! A value is [`FORMAT_VERSION`], a record tag, then the record's fields in the order
//! below. Every decode checks what it reads, so a damaged record is a [`Malformed`]
//! error.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmproc_types::Format;

use super::caps::Capabilities;
use super::process::{Command, Event, Outcome, Payload, Pid, SpawnRequest, Status, Yield};
use std::ops::ControlFlow;

use crate::journal::{Batch, FORMAT_VERSION, Journal, Key, Malformed, Reader, Writer};

const SPAWN: u8 = 1;
const STEP: u8 = 2;
const EXIT: u8 = 3;
const HOST_MESSAGE: u8 = 4;

/// One record of a process's history.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record {
    Spawn(SpawnRecord),
    Step(StepRecord),
    Exit(Outcome),
    /// A message from the embedder, recorded in its receiver's history before it is
    /// delivered; its identity is ([`Pid::HOST`], the record's sequence number).
    HostMessage {
        topic: String,
        body: Payload,
    },
}

/// How a process was started.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SpawnRecord {
    /// The spawner: [`Pid::HOST`] for the embedder.
    pub(crate) parent: Pid,
    /// For a child: its parent's step record that yielded the spawn, and the yield's tag.
    pub(crate) origin: Option<(u64, u64)>,
    pub(crate) kind: Option<String>,
    /// What its kind's factory made it from (see `Factory::identity`).
    pub(crate) identity: Option<String>,
    pub(crate) method: String,
    pub(crate) input: Vec<Payload>,
    pub(crate) caps: Capabilities,
    pub(crate) mailbox_capacity: u64,
    /// Microseconds since the Unix epoch: also the time its `init` reads.
    pub(crate) at: u64,
    /// The seed of the random numbers it reads (see `Port::random_seed`).
    pub(crate) seed: [u8; 32],
}

/// One step: what went in and what came out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepRecord {
    /// When it began, in microseconds since the Unix epoch: a `sleep` it yielded ends at
    /// this time plus its duration, which a recovery re-arms the timer for.
    pub(crate) at: u64,
    pub(crate) events: Vec<Event>,
    /// The identities of the messages among `events`, in order.
    pub(crate) message_ids: Vec<(Pid, u64)>,
    pub(crate) yields: Vec<Yield>,
    /// Messages sent through the port during the step, in order: (to, topic, body).
    pub(crate) sends: Vec<(Pid, String, Payload)>,
    /// `Complete` is recorded as the exit record instead.
    pub(crate) status: Status,
}

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
    /// Its result, once its exit is recorded; `None` while it is unfinished.
    pub result: Option<Outcome>,
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

/// A run the journal holds whose every process has ended: a process the embedder spawned
/// (its root) and everything spawned under it.
#[derive(Debug, Clone)]
pub struct FinishedRun {
    /// The process the embedder spawned.
    pub root: Pid,
    /// Its recorded result.
    pub result: Outcome,
    /// Every process of the run, with how many records it has.
    members: Vec<(Pid, u64)>,
}

/// A run the journal holds, finished or not: a process the embedder spawned (its root),
/// how it was spawned, and everything spawned under it. See [`Journal::runs`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HeldRun {
    /// The process the embedder spawned.
    pub root: Pid,
    /// The registered kind the root was made from.
    pub kind: Option<String>,
    /// What the root's kind made it from (a Wasm component's `sha256:` hash).
    pub identity: Option<String>,
    /// The root's entry method.
    pub method: String,
    /// The root's input.
    pub input: Vec<Payload>,
    /// The root's grants, as it was spawned with them.
    pub caps: Capabilities,
    /// The root's result once every process of the run has ended; `None` while one is
    /// unfinished (it resumes when a scheduler is built on the journal).
    pub result: Option<Outcome>,
    /// Every process of the run, with how many records it has.
    members: Vec<(Pid, u64)>,
}

impl HeldRun {
    /// How many processes of the run the journal holds.
    pub fn processes(&self) -> usize {
        self.members.len()
    }

    /// How many records the run has in the journal.
    pub fn records(&self) -> u64 {
        self.members.iter().map(|(_, records)| records).sum()
    }
}

/// One process as [`Journal::runs`] reads it: its spawn and exit records only.
struct Glimpse {
    spawn: SpawnRecord,
    exit: Option<Outcome>,
    records: u64,
}

impl Journal {
    /// Every run the journal holds, finished or not, by root pid: each process the
    /// embedder spawned, with its tree. A tree whose chain of parents leaves the journal
    /// (its root's records are gone) is no run. Reads every key but decodes only the
    /// spawn and exit records.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn runs(&self) -> std::io::Result<Vec<HeldRun>> {
        let damaged = |message: String| std::io::Error::new(std::io::ErrorKind::InvalidData, message);
        let mut seen: std::collections::BTreeMap<Pid, Glimpse> = std::collections::BTreeMap::new();
        let mut failure = None;
        self.store.scan(Key { process: 1, seq: 0 }, &mut |key, value| {
            let pid = Pid::from_u64(key.process);
            let decoded = match value.get(1) {
                Some(&SPAWN | &EXIT) => match Record::decode(value) {
                    Ok(record) => Some(record),
                    Err(error) => {
                        failure = Some(damaged(format!("record {} of process {pid}: {error}", key.seq)));
                        return ControlFlow::Break(());
                    }
                },
                _ => None,
            };
            match (seen.get_mut(&pid), decoded) {
                (None, Some(Record::Spawn(spawn))) => {
                    seen.insert(pid, Glimpse { spawn, exit: None, records: key.seq + 1 });
                }
                (None, _) => {
                    failure = Some(damaged(format!("process {pid} has records but no spawn record")));
                    return ControlFlow::Break(());
                }
                (Some(_), Some(Record::Spawn(_))) => {
                    failure = Some(damaged(format!("process {pid} has a second spawn record at {}", key.seq)));
                    return ControlFlow::Break(());
                }
                (Some(glimpse), record) => {
                    glimpse.records = key.seq + 1;
                    if let Some(Record::Exit(result)) = record {
                        glimpse.exit = Some(result);
                    }
                }
            }
            ControlFlow::Continue(())
        })?;
        if let Some(error) = failure {
            return Err(error);
        }
        // The root of each process: up its chain of parents to one the embedder spawned.
        // Only a journal written by something else makes parents a cycle: a chain stops
        // once it is longer than the journal's processes.
        let root_of = |mut pid: Pid| {
            for _ in 0..seen.len() {
                match seen.get(&pid).map(|g| g.spawn.parent) {
                    Some(parent) if parent != Pid::HOST && seen.contains_key(&parent) => pid = parent,
                    _ => break,
                }
            }
            pid
        };
        let mut trees: std::collections::BTreeMap<Pid, (bool, Vec<(Pid, u64)>)> = std::collections::BTreeMap::new();
        for (pid, glimpse) in &seen {
            let root = root_of(*pid);
            if seen[&root].spawn.parent == Pid::HOST {
                let tree = trees.entry(root).or_insert((true, Vec::new()));
                tree.0 &= glimpse.exit.is_some();
                tree.1.push((*pid, glimpse.records));
            }
        }
        Ok(trees
            .into_iter()
            .map(|(root, (ended, members))| {
                let Glimpse { spawn, exit, .. } = &seen[&root];
                HeldRun {
                    root,
                    kind: spawn.kind.clone(),
                    identity: spawn.identity.clone(),
                    method: spawn.method.clone(),
                    input: spawn.input.clone(),
                    caps: spawn.caps.clone(),
                    result: if ended { exit.clone() } else { None },
                    members,
                }
            })
            .collect())
    }

    /// The runs whose every process has ended and whose records are still held (a host
    /// with [`JournalSettings::keep_finished`](crate::journal::JournalSettings), or one
    /// that stopped before it removed them). A host that reports results reads a run
    /// here that finished before it could report it, rather than running it again.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn finished_runs(&self) -> std::io::Result<Vec<FinishedRun>> {
        Ok(self
            .runs()?
            .into_iter()
            .filter_map(|run| Some(FinishedRun { root: run.root, result: run.result?, members: run.members }))
            .collect())
    }

    /// Removes the records of `run`, synced: once this returns, a start with this
    /// journal no longer finds it.
    ///
    /// # Errors
    ///
    /// The store's write error; the run's records are then still there.
    pub fn forget(&self, run: &FinishedRun) -> std::io::Result<()> {
        self.remove(&run.members)
    }

    /// Removes the records of `run`, finished or not, synced: once this returns, a start
    /// with this journal neither resumes nor reports it. Only while no scheduler runs on
    /// the journal: one would go on writing the run's records.
    ///
    /// # Errors
    ///
    /// The store's write error; the run's records are then still there.
    pub fn forget_run(&self, run: &HeldRun) -> std::io::Result<()> {
        self.remove(&run.members)
    }

    fn remove(&self, members: &[(Pid, u64)]) -> std::io::Result<()> {
        let removals = members.iter().map(|(pid, records)| (pid.as_u64(), *records)).collect();
        self.store.commit(&Batch { puts: Vec::new(), removals }, true)
    }

    /// Every process the journal holds, in pid order, with its records decoded.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn history(&self) -> std::io::Result<Vec<History>> {
        let mut all: Vec<History> = Vec::new();
        let mut failure = None;
        // The time of the last spawn or step read, which the next step's is shown after.
        let mut last_at = None;
        // The process's yields not completed yet, by tag: its `waiting_for` once its
        // records have all been read.
        let mut pending = std::collections::BTreeMap::new();
        self.store.scan(Key { process: 1, seq: 0 }, &mut |key, value| {
            let record = match Record::decode(value) {
                Ok(record) => record,
                Err(error) => {
                    failure = Some(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("record {} of process {}: {error}", key.seq, key.process),
                    ));
                    return ControlFlow::Break(());
                }
            };
            let pid = Pid::from_u64(key.process);
            if all.last().is_none_or(|h| h.pid != pid) {
                last_at = None;
                if let Some(previous) = all.last_mut() {
                    settle(previous, &mut pending);
                }
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
                Record::Step(step) => {
                    history.steps += 1;
                    for event in &step.events {
                        if let Event::Completion { tag, .. } = event {
                            pending.remove(tag);
                        }
                    }
                    for y in &step.yields {
                        pending.insert(y.tag, format!("{}: {}", y.tag, super::history::command(&y.command)));
                    }
                    history.last_status = Some(step.status.clone());
                }
                Record::Exit(result) => {
                    history.result = Some(result.clone());
                    history.last_status = None;
                    pending.clear();
                }
                Record::HostMessage { .. } => {}
            }
            history.records.push(super::history::line(key.seq, &record, &mut last_at));
            ControlFlow::Continue(())
        })?;
        if let Some(last) = all.last_mut() {
            settle(last, &mut pending);
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(all),
        }
    }
}

/// Gives `history` what its process waits for: the `pending` yields left once its
/// records have all been read.
fn settle(history: &mut History, pending: &mut std::collections::BTreeMap<u64, String>) {
    history.waiting_for = std::mem::take(pending).into_values().collect();
}

/// Microseconds since the Unix epoch, now.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FORMAT_VERSION);
        match self {
            Record::Spawn(spawn) => {
                w.u8(SPAWN);
                w.u64(spawn.parent.as_u64());
                match spawn.origin {
                    Some((seq, tag)) => {
                        w.bool(true);
                        w.u64(seq);
                        w.u64(tag);
                    }
                    None => w.bool(false),
                }
                match &spawn.kind {
                    Some(kind) => {
                        w.bool(true);
                        w.str(kind);
                    }
                    None => w.bool(false),
                }
                match &spawn.identity {
                    Some(identity) => {
                        w.bool(true);
                        w.str(identity);
                    }
                    None => w.bool(false),
                }
                w.str(&spawn.method);
                payloads(&mut w, &spawn.input);
                spawn.caps.encode(&mut w);
                w.u64(spawn.mailbox_capacity);
                w.u64(spawn.at);
                w.bytes(&spawn.seed);
            }
            Record::Step(step) => {
                w.u8(STEP);
                w.u64(step.at);
                events(&mut w, &step.events);
                w.u64(step.message_ids.len() as u64);
                for (sender, id) in &step.message_ids {
                    w.u64(sender.as_u64());
                    w.u64(*id);
                }
                w.u64(step.yields.len() as u64);
                for y in &step.yields {
                    w.u64(y.tag);
                    command(&mut w, &y.command);
                }
                w.u64(step.sends.len() as u64);
                for (to, topic, body) in &step.sends {
                    w.u64(to.as_u64());
                    w.str(topic);
                    payload(&mut w, body);
                }
                w.u8(match step.status {
                    Status::Blocked => 0,
                    Status::Idle => 1,
                    Status::Continue => 2,
                    Status::Complete(_) => 3,
                });
            }
            Record::Exit(result) => {
                w.u8(EXIT);
                outcome(&mut w, result);
            }
            Record::HostMessage { topic, body } => {
                w.u8(HOST_MESSAGE);
                w.str(topic);
                payload(&mut w, body);
            }
        }
        w.into_bytes()
    }

    /// Reads a record back.
    ///
    /// # Errors
    ///
    /// A value of another format version, or damaged.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, Malformed> {
        let mut r = Reader::new(bytes);
        let version = r.u8()?;
        if version != FORMAT_VERSION {
            return Err(Malformed("written by another format version of the journal"));
        }
        let record = match r.u8()? {
            SPAWN => Record::Spawn(SpawnRecord {
                parent: Pid::from_u64(r.u64()?),
                origin: if r.bool()? { Some((r.u64()?, r.u64()?)) } else { None },
                kind: if r.bool()? { Some(r.str()?.to_owned()) } else { None },
                identity: if r.bool()? { Some(r.str()?.to_owned()) } else { None },
                method: r.str()?.to_owned(),
                input: read_payloads(&mut r)?,
                caps: Capabilities::decode(&mut r)?,
                mailbox_capacity: r.u64()?,
                at: r.u64()?,
                seed: r.bytes()?.try_into().map_err(|_| Malformed("a seed is not 32 bytes"))?,
            }),
            STEP => {
                let at = r.u64()?;
                let events = read_events(&mut r)?;
                let count = r.count()?;
                let mut message_ids = Vec::with_capacity(count);
                for _ in 0..count {
                    message_ids.push((Pid::from_u64(r.u64()?), r.u64()?));
                }
                let count = r.count()?;
                let mut yields = Vec::with_capacity(count);
                for _ in 0..count {
                    yields.push(Yield { tag: r.u64()?, command: read_command(&mut r)? });
                }
                let count = r.count()?;
                let mut sends = Vec::with_capacity(count);
                for _ in 0..count {
                    sends.push((Pid::from_u64(r.u64()?), r.str()?.to_owned(), read_payload(&mut r)?));
                }
                let status = match r.u8()? {
                    0 => Status::Blocked,
                    1 => Status::Idle,
                    2 => Status::Continue,
                    3 => Status::Complete(Ok(Payload::empty())),
                    _ => return Err(Malformed("bad step status")),
                };
                Record::Step(StepRecord { at, events, message_ids, yields, sends, status })
            }
            EXIT => Record::Exit(read_outcome(&mut r)?),
            HOST_MESSAGE => Record::HostMessage { topic: r.str()?.to_owned(), body: read_payload(&mut r)? },
            _ => return Err(Malformed("unknown record kind")),
        };
        r.finish()?;
        Ok(record)
    }
}

/// Writes the events a step is about to get: the first part of its record, taken before
/// the step consumes them.
pub(super) fn events(w: &mut Writer, events: &[Event]) {
    w.u64(events.len() as u64);
    for event in events {
        match event {
            Event::Completion { tag, result } => {
                w.u8(0);
                w.u64(*tag);
                outcome(w, result);
            }
            Event::Message { sender, topic, body } => {
                w.u8(1);
                w.u64(sender.as_u64());
                w.str(topic);
                payload(w, body);
            }
            Event::Exit { pid, result } => {
                w.u8(2);
                w.u64(pid.as_u64());
                outcome(w, result);
            }
            Event::Cancel { reason } => {
                w.u8(3);
                w.str(reason);
            }
        }
    }
}

fn read_events(r: &mut Reader<'_>) -> Result<Vec<Event>, Malformed> {
    let count = r.count()?;
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        events.push(match r.u8()? {
            0 => Event::Completion { tag: r.u64()?, result: read_outcome(r)? },
            1 => Event::Message { sender: Pid::from_u64(r.u64()?), topic: r.str()?.to_owned(), body: read_payload(r)? },
            2 => Event::Exit { pid: Pid::from_u64(r.u64()?), result: read_outcome(r)? },
            3 => Event::Cancel { reason: r.str()?.to_owned() },
            _ => return Err(Malformed("unknown event kind")),
        });
    }
    Ok(events)
}

fn command(w: &mut Writer, command: &Command) {
    match command {
        Command::Sleep(duration) => {
            w.u8(0);
            w.u64(duration.as_micros().min(u128::from(u64::MAX)) as u64);
        }
        Command::Spawn(request) => {
            w.u8(1);
            match &request.kind {
                Some(kind) => {
                    w.bool(true);
                    w.str(kind);
                }
                None => w.bool(false),
            }
            w.str(&request.method);
            payloads(w, &request.input);
            w.bool(request.monitor);
        }
        Command::Send { to, topic, body } => {
            w.u8(2);
            w.u64(to.as_u64());
            w.str(topic);
            payload(w, body);
        }
        Command::Monitor(pid) => {
            w.u8(3);
            w.u64(pid.as_u64());
        }
        Command::Terminate(pid) => {
            w.u8(4);
            w.u64(pid.as_u64());
        }
        Command::Custom { name, payload: input } => {
            w.u8(5);
            w.str(name);
            payload(w, input);
        }
    }
}

fn read_command(r: &mut Reader<'_>) -> Result<Command, Malformed> {
    Ok(match r.u8()? {
        0 => Command::Sleep(Duration::from_micros(r.u64()?)),
        1 => Command::Spawn(SpawnRequest {
            kind: if r.bool()? { Some(r.str()?.to_owned()) } else { None },
            method: r.str()?.to_owned(),
            input: read_payloads(r)?,
            monitor: r.bool()?,
        }),
        2 => Command::Send { to: Pid::from_u64(r.u64()?), topic: r.str()?.to_owned(), body: read_payload(r)? },
        3 => Command::Monitor(Pid::from_u64(r.u64()?)),
        4 => Command::Terminate(Pid::from_u64(r.u64()?)),
        5 => Command::Custom { name: Cow::Owned(r.str()?.to_owned()), payload: read_payload(r)? },
        _ => return Err(Malformed("unknown command kind")),
    })
}

fn payload(w: &mut Writer, payload: &Payload) {
    w.str(payload.format.as_str());
    w.bytes(&payload.data);
}

fn read_payload(r: &mut Reader<'_>) -> Result<Payload, Malformed> {
    Ok(Payload { format: Format::from_name(r.str()?), data: r.bytes()?.to_vec() })
}

fn payloads(w: &mut Writer, payloads: &[Payload]) {
    w.u64(payloads.len() as u64);
    for p in payloads {
        payload(w, p);
    }
}

fn read_payloads(r: &mut Reader<'_>) -> Result<Vec<Payload>, Malformed> {
    let count = r.count()?;
    let mut payloads = Vec::with_capacity(count);
    for _ in 0..count {
        payloads.push(read_payload(r)?);
    }
    Ok(payloads)
}

fn outcome(w: &mut Writer, result: &Outcome) {
    match result {
        Ok(p) => {
            w.u8(0);
            payload(w, p);
        }
        Err(error) => {
            w.u8(1);
            w.str(error);
        }
    }
}

fn read_outcome(r: &mut Reader<'_>) -> Result<Outcome, Malformed> {
    match r.u8()? {
        0 => Ok(Ok(read_payload(r)?)),
        1 => Ok(Err(r.str()?.to_owned())),
        _ => Err(Malformed("bad outcome")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        let input = vec![Payload::u64(7), Payload { format: Format::Other("x-raw".into()), data: vec![0, 255] }];
        vec![
            Record::Spawn(SpawnRecord {
                parent: Pid::HOST,
                origin: Some((3, 9)),
                kind: Some("app".into()),
                identity: Some("sha256:00".into()),
                method: "main".into(),
                input: input.clone(),
                caps: Capabilities::default().allow("kv.get"),
                mailbox_capacity: 1024,
                at: now_micros(),
                seed: [7; 32],
            }),
            Record::Step(StepRecord {
                at: 1,
                events: vec![
                    Event::Completion { tag: 3, result: Ok(Payload::empty()) },
                    Event::Message { sender: Pid::from_u64(9), topic: "t".into(), body: Payload::text("hi") },
                    Event::Exit { pid: Pid::from_u64(5), result: Err("noproc".into()) },
                    Event::Cancel { reason: "shutdown".into() },
                ],
                message_ids: vec![(Pid::from_u64(9), 1 << 20)],
                yields: vec![
                    Yield { tag: 1, command: Command::Sleep(Duration::from_millis(20)) },
                    Yield {
                        tag: 2,
                        command: Command::Spawn(SpawnRequest {
                            kind: None,
                            method: "child".into(),
                            input,
                            monitor: true,
                        }),
                    },
                    Yield {
                        tag: 3,
                        command: Command::Send { to: Pid::from_u64(4), topic: "x".into(), body: Payload::empty() },
                    },
                    Yield { tag: 4, command: Command::Monitor(Pid::from_u64(4)) },
                    Yield { tag: 5, command: Command::Terminate(Pid::from_u64(4)) },
                    Yield { tag: 6, command: Command::Custom { name: "kv.get".into(), payload: Payload::text("k") } },
                ],
                sends: vec![(Pid::from_u64(8), "direct".into(), Payload::u64(1))],
                status: Status::Idle,
            }),
            Record::Exit(Ok(Payload::u64(42))),
            Record::HostMessage { topic: "t".into(), body: Payload::text("x") },
            Record::Exit(Err("boom".into())),
        ]
    }

    #[test]
    fn every_record_reads_back_as_written() {
        for record in samples() {
            assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        }
    }

    #[test]
    fn every_truncation_is_an_error_and_no_flipped_bit_panics() {
        for record in samples() {
            let bytes = record.encode();
            for len in 0..bytes.len() {
                assert!(Record::decode(&bytes[..len]).is_err(), "{record:?} cut at {len}");
            }
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut damaged = bytes.clone();
                    damaged[i] ^= 1 << bit;
                    // Never a panic (a flip may still leave a valid record: a store's
                    // checksums are what catch those).
                    let _ = Record::decode(&damaged);
                }
            }
        }
    }

    #[test]
    fn another_format_version_is_refused() {
        let mut bytes = Record::Exit(Ok(Payload::empty())).encode();
        bytes[0] = FORMAT_VERSION + 1;
        assert_eq!(Record::decode(&bytes), Err(Malformed("written by another format version of the journal")));
    }
}
