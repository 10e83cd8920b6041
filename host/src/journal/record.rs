//! The records of a durable process: how a spawn, a step, a message from the embedder and
//! an exit are written, and read back.
//!
//! A value is [`FORMAT_VERSION`], a record tag, then the record's fields in the order
//! below, in the crate's encoding (`codec.rs`). Every decode checks what it reads, so a
//! damaged record is a [`Malformed`] error that names the record's kind and the field.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmproc_types::{Payload, Pid};

use super::FORMAT_VERSION;
use crate::caps::Capabilities;
use crate::codec::{Malformed, Reader, Writer};
use crate::step::{Command, Event, ExitSignal, Exited, SpawnRequest, Status, Yield};

pub(super) const SPAWN: u8 = 1;
/// A spawn with the embedder's note (see [`SpawnRecord::note`]): the spawn's fields,
/// then the note's bytes. A spawn without a note keeps tag [`SPAWN`], so that a journal
/// of spawns without notes stays readable by a host that knows only it.
pub(super) const SPAWN_NOTED: u8 = 7;
const STEP: u8 = 2;
pub(super) const EXIT: u8 = 3;
const HOST_MESSAGE: u8 = 4;
const RECEIVED: u8 = 5;
pub(super) const SNAPSHOT: u8 = 6;

/// The format of a snapshot's own fields, inside a record of [`FORMAT_VERSION`]: a
/// snapshot of another version is refused (its process is not resumed from it) rather
/// than misread.
pub(crate) const SNAPSHOT_VERSION: u8 = 2;

/// The snapshot format without a note on its spawn: still read, and still written for a
/// spawn without one.
const SNAPSHOT_VERSION_UNNOTED: u8 = 1;

/// One record of a process's history.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record {
    Spawn(SpawnRecord),
    Step(StepRecord),
    Exit(Exited),
    /// A message from the embedder, recorded in its receiver's history before it is
    /// delivered; its identity is ([`Pid::HOST`], the record's sequence number).
    HostMessage {
        topic: String,
        body: Payload,
    },
    /// A message from a process of another journal (a shard's, on a cluster), recorded in
    /// its receiver's history before it is delivered; its identity is (`from`, `id`), the
    /// one it had in its sender's journal, so a second copy is known for one.
    Received {
        from: Pid,
        id: u64,
        topic: String,
        body: Payload,
    },
    /// The process as it was after its records before this one, which the snapshot
    /// replaces: a history may begin with one instead of its spawn.
    Snapshot(Box<SnapshotRecord>),
}

/// A durable process at one point of its history: what its records up to there made
/// of it. Written in one batch with the removal of the records before it, so recovery
/// starts from it and replays only the records after it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SnapshotRecord {
    /// The spawn it began with (its `identity`: what the process was made from, which a
    /// resume checks its kind's factory against before the snapshot is restored).
    pub(crate) spawn: SpawnRecord,
    /// The time of the last step it holds (microseconds since the Unix epoch).
    pub(crate) at: u64,
    /// Steps the process had taken, and the status the last ended with (`Blocked`,
    /// `Idle` or `Continue`): how a recovery sets it going when no step follows.
    pub(crate) steps: u64,
    pub(crate) status: Status,
    /// The process's own state, as its [`Process::snapshot`](crate::Process::snapshot)
    /// wrote it.
    pub(crate) state: Vec<u8>,
    /// What the replaced records told a recovery besides the process's state.
    pub(crate) carried: Carried,
}

/// What a recovery reads from a process's history besides replaying it: what was under
/// way, whom it watched, and which messages it took. A snapshot carries it for the
/// records it replaces; [`Carried::fold`] adds a step's.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Carried {
    /// Yields with no consumed completion, in order: (step record, index among its
    /// yields, the step's time, the yield).
    pub(crate) outstanding: Vec<(u64, u32, u64, Yield)>,
    /// Messages it sent (through its port, or yielded `send`s that completed) that
    /// their receivers may not have taken: (to, identity, topic, body).
    pub(crate) sent: Vec<(Pid, u64, String, Payload)>,
    /// The embedder's messages to it: (record, topic, body), and messages of processes
    /// of other journals: (sender, identity, topic, body); those it has not taken.
    pub(crate) host_messages: Vec<(u64, String, Payload)>,
    pub(crate) received: Vec<(Pid, u64, String, Payload)>,
    /// The messages it took: the highest identity of each sender (a sender's messages
    /// reach a mailbox, and leave it, in the order they were sent).
    pub(crate) consumed: Vec<(Pid, u64)>,
    /// Processes it monitors and is linked to, and whether it traps exits.
    pub(crate) monitored: Vec<Pid>,
    pub(crate) linked: Vec<Pid>,
    pub(crate) trap_exits: bool,
    /// Processes whose exit it took as an event: as a monitor's (`false`) or a link's.
    pub(crate) exits_taken: Vec<(Pid, bool)>,
}

impl Carried {
    /// Adds step record `seq`.
    pub(crate) fn fold(&mut self, seq: u64, step: &StepRecord) {
        for &(sender, id) in &step.message_ids {
            match self.consumed.iter_mut().find(|(s, _)| *s == sender) {
                Some((_, last)) => *last = (*last).max(id),
                None => self.consumed.push((sender, id)),
            }
        }
        for event in &step.events {
            if let Event::Exit { pid, linked, .. } = event
                && !self.exits_taken.contains(&(*pid, *linked))
            {
                self.exits_taken.push((*pid, *linked));
            }
            let Event::Completion { tag, result } = event else { continue };
            // The oldest yield of that tag still open is the one completed.
            let Some(at) = self.outstanding.iter().position(|(_, _, _, y)| y.tag == *tag) else { continue };
            let (origin, index, _, y) = self.outstanding.remove(at);
            match (y.command, result) {
                (Command::Send { to, topic, body }, Ok(_)) => {
                    let id = (origin << 20) | YIELD_SEND_BIT | u64::from(index);
                    self.sent.push((to, id, topic, body));
                }
                (Command::Monitor(target), Ok(_)) => self.monitored.push(target),
                (Command::Demonitor(target), _) => self.monitored.retain(|pid| *pid != target),
                (Command::Link(target), Ok(_)) if !self.linked.contains(&target) => self.linked.push(target),
                (Command::Unlink(target), _) => self.linked.retain(|pid| *pid != target),
                (Command::TrapExits(trap), _) => self.trap_exits = trap,
                (Command::Spawn(request), Ok(pid)) => {
                    if let Some(child) = pid.to_u64().map(Pid::from_u64) {
                        if request.monitor {
                            self.monitored.push(child);
                        }
                        if request.link && !self.linked.contains(&child) {
                            self.linked.push(child);
                        }
                    }
                }
                _ => {}
            }
        }
        for (index, (to, topic, body)) in step.sends.iter().enumerate() {
            self.sent.push((*to, (seq << 20) | index as u64, topic.clone(), body.clone()));
        }
        for (index, y) in step.yields.iter().enumerate() {
            self.outstanding.push((seq, index as u32, step.at, y.clone()));
        }
    }

    /// Drops what a recovery no longer needs: the messages to it that it took, the
    /// messages it sent to processes `gone` says have ended, and the processes it
    /// monitored whose exit it took (a recovery would not watch them again).
    pub(crate) fn prune(&mut self, gone: impl Fn(Pid) -> bool) {
        let exits = std::mem::take(&mut self.exits_taken);
        self.monitored.retain(|pid| !exits.contains(&(*pid, false)));
        self.exits_taken = exits.into_iter().filter(|(_, linked)| *linked).collect();
        let consumed = std::mem::take(&mut self.consumed);
        self.host_messages.retain(|(seq, _, _)| !took(&consumed, Pid::HOST, *seq));
        self.received.retain(|(from, id, _, _)| !took(&consumed, *from, *id));
        self.sent.retain(|(to, _, _, _)| !gone(*to));
        self.consumed = consumed;
    }
}

fn took(consumed: &[(Pid, u64)], from: Pid, id: u64) -> bool {
    consumed.iter().any(|&(sender, last)| sender == from && id <= last)
}

/// The bit that tells a yielded `send`'s message identity from a port send's (the
/// scheduler's `durable.rs` makes them; a snapshot makes those of the sends it carries
/// the same way).
pub(crate) const YIELD_SEND_BIT: u64 = 1 << 19;

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
    /// The embedder's own bytes about the spawn (`SpawnOptions::note`), kept with it and
    /// given back with its run (`HeldRun::note`); never seen by the process.
    pub(crate) note: Option<Vec<u8>>,
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

/// Microseconds since the Unix epoch, now.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FORMAT_VERSION);
        match self {
            Record::Spawn(spawn) => match &spawn.note {
                None => {
                    w.u8(SPAWN);
                    write_spawn(&mut w, spawn);
                }
                Some(note) => {
                    w.u8(SPAWN_NOTED);
                    write_spawn(&mut w, spawn);
                    w.bytes(note);
                }
            },
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
                    w.payload(body);
                }
                w.u8(status_byte(&step.status));
            }
            Record::Exit(exited) => {
                w.u8(EXIT);
                w.exited(exited);
            }
            Record::HostMessage { topic, body } => {
                w.u8(HOST_MESSAGE);
                w.str(topic);
                w.payload(body);
            }
            Record::Received { from, id, topic, body } => {
                w.u8(RECEIVED);
                w.u64(from.as_u64());
                w.u64(*id);
                w.str(topic);
                w.payload(body);
            }
            Record::Snapshot(snapshot) => {
                w.u8(SNAPSHOT);
                let noted = snapshot.spawn.note.as_deref();
                w.u8(if noted.is_some() { SNAPSHOT_VERSION } else { SNAPSHOT_VERSION_UNNOTED });
                write_spawn(&mut w, &snapshot.spawn);
                w.u64(snapshot.at);
                w.u64(snapshot.steps);
                w.u8(status_byte(&snapshot.status));
                w.bytes(&snapshot.state);
                write_carried(&mut w, &snapshot.carried);
                if let Some(note) = noted {
                    w.bytes(note);
                }
            }
        }
        w.into_bytes()
    }

    /// The spawner a spawn or snapshot record names, read without decoding the rest of
    /// it; `None` for a record of another kind (or too short to say).
    pub(crate) fn parent_of(bytes: &[u8]) -> Option<Pid> {
        let mut r = Reader::new(bytes, "journal record");
        if r.u8("version").ok()? != FORMAT_VERSION {
            return None;
        }
        match r.u8("kind").ok()? {
            SPAWN | SPAWN_NOTED => {}
            SNAPSHOT => {
                r.u8("snapshot version").ok()?;
            }
            _ => return None,
        }
        r.u64("parent").ok().map(Pid::from_u64)
    }

    /// Reads a record back.
    ///
    /// # Errors
    ///
    /// A value of another format version, or damaged: the error names the record's kind
    /// and the field.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, Malformed> {
        let mut r = Reader::new(bytes, "journal record");
        let version = r.u8("version")?;
        if version < FORMAT_VERSION {
            return Err(r.invalid(
                "version",
                format!(
                    "written by an older format version of the journal ({version}; this host reads \
                     {FORMAT_VERSION}): finish or cancel its processes with the wasmproc that wrote it"
                ),
            ));
        }
        if version != FORMAT_VERSION {
            return Err(r.invalid(
                "version",
                format!(
                    "written by another format version of the journal ({version}; this host reads {FORMAT_VERSION})"
                ),
            ));
        }
        let record = match r.u8("kind")? {
            SPAWN => {
                r.kind("spawn");
                Record::Spawn(read_spawn(&mut r)?)
            }
            SPAWN_NOTED => {
                r.kind("spawn");
                let mut spawn = read_spawn(&mut r)?;
                spawn.note = Some(r.bytes("note")?.to_vec());
                Record::Spawn(spawn)
            }
            SNAPSHOT => {
                r.kind("snapshot");
                let version = r.u8("snapshot version")?;
                if version != SNAPSHOT_VERSION && version != SNAPSHOT_VERSION_UNNOTED {
                    return Err(r.invalid(
                        "snapshot version",
                        format!("a snapshot of version {version}; this host reads version {SNAPSHOT_VERSION}"),
                    ));
                }
                let mut snapshot = SnapshotRecord {
                    spawn: read_spawn(&mut r)?,
                    at: r.u64("at")?,
                    steps: r.u64("steps")?,
                    status: read_status(&mut r)?,
                    state: r.bytes("state")?.to_vec(),
                    carried: read_carried(&mut r)?,
                };
                if version == SNAPSHOT_VERSION {
                    snapshot.spawn.note = Some(r.bytes("note")?.to_vec());
                }
                Record::Snapshot(Box::new(snapshot))
            }
            STEP => {
                r.kind("step");
                let at = r.u64("at")?;
                let events = read_events(&mut r)?;
                let count = r.count("message_ids")?;
                let mut message_ids = Vec::with_capacity(count);
                for _ in 0..count {
                    message_ids.push((Pid::from_u64(r.u64("message_ids")?), r.u64("message_ids")?));
                }
                let count = r.count("yields")?;
                let mut yields = Vec::with_capacity(count);
                for _ in 0..count {
                    yields.push(Yield { tag: r.u64("yields")?, command: read_command(&mut r)? });
                }
                let count = r.count("sends")?;
                let mut sends = Vec::with_capacity(count);
                for _ in 0..count {
                    sends.push((Pid::from_u64(r.u64("sends")?), r.str("sends")?.to_owned(), r.payload("sends")?));
                }
                let status = read_status(&mut r)?;
                Record::Step(StepRecord { at, events, message_ids, yields, sends, status })
            }
            EXIT => {
                r.kind("exit");
                Record::Exit(r.exited("reason")?)
            }
            HOST_MESSAGE => {
                r.kind("host message");
                Record::HostMessage { topic: r.str("topic")?.to_owned(), body: r.payload("body")? }
            }
            RECEIVED => {
                r.kind("received message");
                Record::Received {
                    from: Pid::from_u64(r.u64("from")?),
                    id: r.u64("id")?,
                    topic: r.str("topic")?.to_owned(),
                    body: r.payload("body")?,
                }
            }
            other => return Err(r.invalid("kind", format!("unknown record kind {other}"))),
        };
        r.finish()?;
        Ok(record)
    }
}

fn status_byte(status: &Status) -> u8 {
    match status {
        Status::Blocked => 0,
        Status::Idle => 1,
        Status::Continue => 2,
        Status::Complete(_) => 3,
    }
}

fn read_status(r: &mut Reader<'_>) -> Result<Status, Malformed> {
    Ok(match r.u8("status")? {
        0 => Status::Blocked,
        1 => Status::Idle,
        2 => Status::Continue,
        3 => Status::Complete(Ok(Payload::empty())),
        other => return Err(r.invalid("status", format!("unknown step status {other}"))),
    })
}

fn write_spawn(w: &mut Writer, spawn: &SpawnRecord) {
    w.u64(spawn.parent.as_u64());
    match spawn.origin {
        Some((seq, tag)) => {
            w.bool(true);
            w.u64(seq);
            w.u64(tag);
        }
        None => w.bool(false),
    }
    w.optional_str(spawn.kind.as_deref());
    w.optional_str(spawn.identity.as_deref());
    w.str(&spawn.method);
    w.payloads(&spawn.input);
    spawn.caps.encode(w);
    w.u64(spawn.mailbox_capacity);
    w.u64(spawn.at);
    w.bytes(&spawn.seed);
}

fn read_spawn(r: &mut Reader<'_>) -> Result<SpawnRecord, Malformed> {
    Ok(SpawnRecord {
        parent: Pid::from_u64(r.u64("parent")?),
        origin: if r.bool("origin")? { Some((r.u64("origin")?, r.u64("origin")?)) } else { None },
        kind: r.optional_str("kind")?.map(str::to_owned),
        identity: r.optional_str("identity")?.map(str::to_owned),
        method: r.str("method")?.to_owned(),
        input: r.payloads("input")?,
        caps: Capabilities::decode(r)?,
        mailbox_capacity: r.u64("mailbox_capacity")?,
        at: r.u64("at")?,
        seed: r.bytes("seed")?.try_into().map_err(|_| r.invalid("seed", "a seed is not 32 bytes"))?,
        note: None,
    })
}

fn write_messages(w: &mut Writer, messages: &[(Pid, u64, String, Payload)]) {
    w.u64(messages.len() as u64);
    for (pid, id, topic, body) in messages {
        w.u64(pid.as_u64());
        w.u64(*id);
        w.str(topic);
        w.payload(body);
    }
}

fn read_messages(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<(Pid, u64, String, Payload)>, Malformed> {
    let count = r.count(field)?;
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        messages.push((Pid::from_u64(r.u64(field)?), r.u64(field)?, r.str(field)?.to_owned(), r.payload(field)?));
    }
    Ok(messages)
}

fn write_pids(w: &mut Writer, pids: &[Pid]) {
    w.u64(pids.len() as u64);
    for pid in pids {
        w.u64(pid.as_u64());
    }
}

fn read_pids(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<Pid>, Malformed> {
    let count = r.count(field)?;
    (0..count).map(|_| Ok(Pid::from_u64(r.u64(field)?))).collect()
}

fn write_carried(w: &mut Writer, carried: &Carried) {
    w.u64(carried.outstanding.len() as u64);
    for (seq, index, at, y) in &carried.outstanding {
        w.u64(*seq);
        w.u64(u64::from(*index));
        w.u64(*at);
        w.u64(y.tag);
        command(w, &y.command);
    }
    write_messages(w, &carried.sent);
    w.u64(carried.host_messages.len() as u64);
    for (seq, topic, body) in &carried.host_messages {
        w.u64(*seq);
        w.str(topic);
        w.payload(body);
    }
    write_messages(w, &carried.received);
    w.u64(carried.consumed.len() as u64);
    for (sender, last) in &carried.consumed {
        w.u64(sender.as_u64());
        w.u64(*last);
    }
    write_pids(w, &carried.monitored);
    write_pids(w, &carried.linked);
    w.bool(carried.trap_exits);
    w.u64(carried.exits_taken.len() as u64);
    for (pid, linked) in &carried.exits_taken {
        w.u64(pid.as_u64());
        w.bool(*linked);
    }
}

fn read_carried(r: &mut Reader<'_>) -> Result<Carried, Malformed> {
    let count = r.count("outstanding")?;
    let mut outstanding = Vec::with_capacity(count);
    for _ in 0..count {
        let seq = r.u64("outstanding")?;
        let index = u32::try_from(r.u64("outstanding")?).map_err(|_| r.invalid("outstanding", "an index past u32"))?;
        let at = r.u64("outstanding")?;
        let tag = r.u64("outstanding")?;
        outstanding.push((seq, index, at, Yield { tag, command: read_command(r)? }));
    }
    let sent = read_messages(r, "sent")?;
    let count = r.count("host messages")?;
    let mut host_messages = Vec::with_capacity(count);
    for _ in 0..count {
        host_messages.push((r.u64("host messages")?, r.str("host messages")?.to_owned(), r.payload("host messages")?));
    }
    let received = read_messages(r, "received")?;
    let count = r.count("consumed")?;
    let mut consumed = Vec::with_capacity(count);
    for _ in 0..count {
        consumed.push((Pid::from_u64(r.u64("consumed")?), r.u64("consumed")?));
    }
    let monitored = read_pids(r, "monitored")?;
    let linked = read_pids(r, "linked")?;
    let trap_exits = r.bool("trap exits")?;
    let count = r.count("exits taken")?;
    let mut exits_taken = Vec::with_capacity(count);
    for _ in 0..count {
        exits_taken.push((Pid::from_u64(r.u64("exits taken")?), r.bool("exits taken")?));
    }
    Ok(Carried { outstanding, sent, host_messages, received, consumed, monitored, linked, trap_exits, exits_taken })
}

fn events(w: &mut Writer, events: &[Event]) {
    w.u64(events.len() as u64);
    for event in events {
        match event {
            Event::Completion { tag, result } => {
                w.u8(0);
                w.u64(*tag);
                w.outcome(result);
            }
            Event::Message { sender, topic, body } => {
                w.u8(1);
                w.u64(sender.as_u64());
                w.str(topic);
                w.payload(body);
            }
            Event::Exit { pid, reason, linked } => {
                w.u8(2);
                w.u64(pid.as_u64());
                w.exit_reason(reason);
                w.bool(*linked);
            }
            Event::Cancel { reason } => {
                w.u8(3);
                w.str(reason);
            }
        }
    }
}

fn read_events(r: &mut Reader<'_>) -> Result<Vec<Event>, Malformed> {
    let count = r.count("events")?;
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        events.push(match r.u8("events")? {
            0 => Event::Completion { tag: r.u64("events")?, result: r.outcome("events")? },
            1 => Event::Message {
                sender: Pid::from_u64(r.u64("events")?),
                topic: r.str("events")?.to_owned(),
                body: r.payload("events")?,
            },
            2 => Event::Exit {
                pid: Pid::from_u64(r.u64("events")?),
                reason: r.exit_reason("events")?,
                linked: r.bool("events")?,
            },
            3 => Event::Cancel { reason: r.str("events")?.to_owned() },
            other => return Err(r.invalid("events", format!("unknown event kind {other}"))),
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
            w.optional_str(request.kind.as_deref());
            w.str(&request.method);
            w.payloads(&request.input);
            w.bool(request.monitor);
            w.bool(request.link);
        }
        Command::Send { to, topic, body } => {
            w.u8(2);
            w.u64(to.as_u64());
            w.str(topic);
            w.payload(body);
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
            w.payload(input);
        }
        Command::Link(pid) => {
            w.u8(6);
            w.u64(pid.as_u64());
        }
        Command::Unlink(pid) => {
            w.u8(7);
            w.u64(pid.as_u64());
        }
        Command::Demonitor(pid) => {
            w.u8(8);
            w.u64(pid.as_u64());
        }
        Command::Exit(ExitSignal { to, reason, kill }) => {
            w.u8(9);
            w.u64(to.as_u64());
            w.exit_reason(reason);
            w.bool(*kill);
        }
        Command::TrapExits(on) => {
            w.u8(10);
            w.bool(*on);
        }
    }
}

fn read_command(r: &mut Reader<'_>) -> Result<Command, Malformed> {
    Ok(match r.u8("yields")? {
        0 => Command::Sleep(Duration::from_micros(r.u64("yields")?)),
        1 => Command::Spawn(SpawnRequest {
            kind: r.optional_str("yields")?.map(str::to_owned),
            method: r.str("yields")?.to_owned(),
            input: r.payloads("yields")?,
            monitor: r.bool("yields")?,
            link: r.bool("yields")?,
        }),
        2 => Command::Send {
            to: Pid::from_u64(r.u64("yields")?),
            topic: r.str("yields")?.to_owned(),
            body: r.payload("yields")?,
        },
        3 => Command::Monitor(Pid::from_u64(r.u64("yields")?)),
        4 => Command::Terminate(Pid::from_u64(r.u64("yields")?)),
        5 => Command::Custom { name: Cow::Owned(r.str("yields")?.to_owned()), payload: r.payload("yields")? },
        6 => Command::Link(Pid::from_u64(r.u64("yields")?)),
        7 => Command::Unlink(Pid::from_u64(r.u64("yields")?)),
        8 => Command::Demonitor(Pid::from_u64(r.u64("yields")?)),
        9 => Command::Exit(ExitSignal {
            to: Pid::from_u64(r.u64("yields")?),
            reason: r.exit_reason("yields")?,
            kill: r.bool("yields")?,
        }),
        10 => Command::TrapExits(r.bool("yields")?),
        other => return Err(r.invalid("yields", format!("unknown command kind {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use wasmproc_types::{ExitReason, Format, TrapKind};

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
                note: None,
            }),
            Record::Step(StepRecord {
                at: 1,
                events: vec![
                    Event::Completion { tag: 3, result: Ok(Payload::empty()) },
                    Event::Message { sender: Pid::from_u64(9), topic: "t".into(), body: Payload::text("hi") },
                    Event::Exit { pid: Pid::from_u64(5), reason: ExitReason::Noproc, linked: false },
                    Event::Exit {
                        pid: Pid::from_u64(6),
                        reason: ExitReason::trap(TrapKind::Panic, "index out of bounds"),
                        linked: true,
                    },
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
                            link: true,
                        }),
                    },
                    Yield {
                        tag: 3,
                        command: Command::Send { to: Pid::from_u64(4), topic: "x".into(), body: Payload::empty() },
                    },
                    Yield { tag: 4, command: Command::Monitor(Pid::from_u64(4)) },
                    Yield { tag: 5, command: Command::Terminate(Pid::from_u64(4)) },
                    Yield { tag: 6, command: Command::Custom { name: "kv.get".into(), payload: Payload::text("k") } },
                    Yield { tag: 7, command: Command::Link(Pid::from_u64(4)) },
                    Yield { tag: 8, command: Command::Unlink(Pid::from_u64(4)) },
                    Yield { tag: 9, command: Command::Demonitor(Pid::from_u64(4)) },
                    Yield {
                        tag: 10,
                        command: Command::Exit(ExitSignal {
                            to: Pid::from_u64(4),
                            reason: ExitReason::Error("bye".into()),
                            kill: true,
                        }),
                    },
                    Yield { tag: 11, command: Command::TrapExits(true) },
                ],
                sends: vec![(Pid::from_u64(8), "direct".into(), Payload::u64(1))],
                status: Status::Idle,
            }),
            Record::Exit(Exited::new(ExitReason::Normal(Payload::u64(42)))),
            Record::HostMessage { topic: "t".into(), body: Payload::text("x") },
            Record::Received { from: Pid::from_u64(9), id: (3 << 20) | 1, topic: "n".into(), body: Payload::u64(4) },
            Record::Exit(Exited::by_signal(ExitReason::trap(TrapKind::OutOfFuel, "fuel"), Pid::from_u64(7))),
        ]
        .into_iter()
        .chain(crate::codec::tests::every_exit_reason().into_iter().map(|reason| Record::Exit(Exited::new(reason))))
        .collect()
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
        let mut bytes = Record::Exit(Exited::new(ExitReason::Normal(Payload::empty()))).encode();
        bytes[0] = FORMAT_VERSION + 1;
        let error = Record::decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("written by another format version of the journal"), "{error}");
        // A journal of the format before exit reasons were typed: refused, never misread.
        bytes[0] = FORMAT_VERSION - 1;
        let error = Record::decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("an older format version of the journal (1; this host reads 2)"), "{error}");
    }

    fn snapshot() -> Record {
        let Record::Spawn(spawn) = samples().remove(0) else { unreachable!("the first sample is a spawn") };
        let Record::Step(step) = samples().remove(1) else { unreachable!("the second sample is a step") };
        let mut carried = Carried::default();
        carried.fold(4, &step);
        carried.host_messages.push((5, "t".into(), Payload::text("x")));
        carried.received.push((Pid::from_u64(9), 3 << 20, "n".into(), Payload::u64(4)));
        let completed = StepRecord {
            at: 2,
            events: vec![
                Event::Completion { tag: 3, result: Ok(Payload::empty()) },
                Event::Completion { tag: 4, result: Ok(Payload::empty()) },
                Event::Completion { tag: 11, result: Ok(Payload::empty()) },
            ],
            message_ids: vec![(Pid::HOST, 5)],
            yields: Vec::new(),
            sends: Vec::new(),
            status: Status::Idle,
        };
        carried.fold(6, &completed);
        let gone = StepRecord {
            at: 3,
            events: vec![Event::Exit { pid: Pid::from_u64(5), reason: ExitReason::Noproc, linked: false }],
            message_ids: Vec::new(),
            yields: Vec::new(),
            sends: Vec::new(),
            status: Status::Idle,
        };
        carried.monitored.push(Pid::from_u64(5));
        carried.fold(7, &gone);
        carried.prune(|_| false);
        Record::Snapshot(Box::new(SnapshotRecord {
            spawn,
            at: 3,
            steps: 2,
            status: Status::Idle,
            state: vec![1, 2, 3],
            carried,
        }))
    }

    /// A snapshot carries what its records left under way: the step's yields less those
    /// completed after, the completed `send` and the port send as messages that may not
    /// have been taken, the monitor and `trap-exits` the completions set up, and the
    /// embedder's message it took no more; and reads back as written.
    #[test]
    fn a_snapshot_carries_what_its_records_left_and_reads_back() {
        let record = snapshot();
        let Record::Snapshot(snapshot) = &record else { unreachable!("made above") };
        let carried = &snapshot.carried;
        let tags: Vec<u64> = carried.outstanding.iter().map(|(_, _, _, y)| y.tag).collect();
        assert_eq!(tags, [1, 2, 5, 6, 7, 8, 9, 10]);
        assert!(carried.outstanding.iter().all(|(seq, _, at, _)| *seq == 4 && *at == 1));
        let sent: Vec<(Pid, u64)> = carried.sent.iter().map(|(to, id, _, _)| (*to, *id)).collect();
        assert_eq!(sent, [(Pid::from_u64(8), 4 << 20), (Pid::from_u64(4), (4 << 20) | YIELD_SEND_BIT | 2)]);
        assert_eq!(carried.monitored, [Pid::from_u64(4)], "5's exit was taken");
        assert_eq!(carried.exits_taken, [(Pid::from_u64(6), true)], "a link's exit stays");
        assert!(carried.trap_exits);
        assert!(carried.host_messages.is_empty(), "taken");
        assert_eq!(carried.received.len(), 1, "not taken");
        assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        let bytes = record.encode();
        for len in 0..bytes.len() {
            assert!(Record::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert_eq!(Record::parent_of(&bytes), Some(snapshot.spawn.parent), "read without decoding the rest");
    }

    #[test]
    fn a_snapshot_of_another_version_is_refused() {
        let mut bytes = snapshot().encode();
        assert_eq!((bytes[1], bytes[2]), (SNAPSHOT, SNAPSHOT_VERSION_UNNOTED), "a spawn without a note");
        bytes[2] = SNAPSHOT_VERSION + 1;
        let error = Record::decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("a snapshot of version 3; this host reads version 2"), "{error}");
    }

    /// A spawn's note, and a snapshot's of a noted spawn, read back as written; a spawn
    /// without one keeps the format a host without notes reads.
    #[test]
    fn a_note_reads_back_with_its_spawn_and_its_snapshot() {
        let Record::Spawn(mut spawn) = samples().remove(0) else { unreachable!("the first sample is a spawn") };
        let unnoted = Record::Spawn(spawn.clone()).encode();
        assert_eq!(unnoted[1], SPAWN);
        spawn.note = Some(b"{\"id\":\"w\"}".to_vec());
        let noted = Record::Spawn(spawn.clone());
        let bytes = noted.encode();
        assert_eq!(bytes[1], SPAWN_NOTED);
        assert_eq!(bytes[2..bytes.len() - 1 - 10], unnoted[2..], "the spawn's fields, then the note");
        assert_eq!(Record::decode(&bytes).unwrap(), noted);
        for len in 0..bytes.len() {
            assert!(Record::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        let Record::Snapshot(mut snapshot) = snapshot() else { unreachable!("a snapshot") };
        snapshot.spawn = spawn;
        let record = Record::Snapshot(snapshot);
        let bytes = record.encode();
        assert_eq!(bytes[2], SNAPSHOT_VERSION);
        assert_eq!(Record::decode(&bytes).unwrap(), record);
        for len in 0..bytes.len() {
            assert!(Record::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
    }

    /// A damaged record's error says it is a journal record, of which kind, and the field
    /// that did not read.
    #[test]
    fn errors_name_the_record_s_kind_and_field() {
        let step = samples().into_iter().find(|r| matches!(r, Record::Step(_))).unwrap().encode();
        let error = Record::decode(&step[..step.len() - 1]).unwrap_err().to_string();
        assert!(error.starts_with("malformed journal record of kind `step`: `status` at byte"), "{error}");
        let exit = Record::Exit(Exited::new(ExitReason::Error("boom".into()))).encode();
        let mut damaged = exit.clone();
        damaged[2] = 9;
        let error = Record::decode(&damaged).unwrap_err().to_string();
        assert_eq!(error, "malformed journal record of kind `exit`: `reason` at byte 2: unknown exit reason 9");
        let mut damaged = exit;
        damaged[1] = 9;
        let error = Record::decode(&damaged).unwrap_err().to_string();
        assert_eq!(error, "malformed journal record: `kind` at byte 1: unknown record kind 9");
    }

    /// The journal's format on disk, pinned: every sample record's bytes, of format
    /// version 2 (exit reasons typed).
    #[test]
    fn the_format_on_disk_is_fixed() {
        let golden: &[&[&str]] = &[
            &[
                "020100010309010361707001097368613235363a3030046d61696e0205627974657308070000000000000005782d7261",
                "770200ffff070101066b762e67657480088080f9c0c1c482032007070707070707070707070707070707070707070707",
                "07070707070707070707",
            ],
            &[
                "0202010500030005627974657300010901740474657874026869020506000206020013696e646578206f7574206f6620",
                "626f756e647301030873687574646f776e01098080400b0100a09c01020100056368696c640205627974657308070000",
                "000000000005782d7261770200ff01010302040178056279746573000403040504040605066b762e6765740474657874",
                "016b0706040807040908040a09040103627965010b0a0101080664697265637405627974657308010000000000000001",
            ],
            &["020300056279746573082a0000000000000000"],
            &["0204017404746578740178"],
            &["0205098180c001016e056279746573080400000000000000"],
            &["02030202046675656c0107"],
            &["020300047465787404646f6e6500"],
            &["02030104626f6f6d00"],
            &["02030300"],
            &["02030400"],
            &["02030500"],
            &["02030600"],
            &["020307016200"],
            &["020302000c612070616e6963207472617000"],
            &["02030201126120756e726561636861626c65207472617000"],
            &["020302021261206f75742d6f662d6675656c207472617000"],
            &["020302031161206370752d627564676574207472617000"],
            &["020302041361206d656d6f72792d6c696d6974207472617000"],
            &["02030205156120737461636b2d6f766572666c6f77207472617000"],
            &["020302060c61206f74686572207472617000"],
        ];
        assert_eq!(samples().len(), golden.len(), "a golden value for every sample");
        for (mut record, golden) in samples().into_iter().zip(golden) {
            if let Record::Spawn(spawn) = &mut record {
                spawn.at = 1_700_000_000_000_000;
            }
            let hex: String = record.encode().iter().map(|byte| format!("{byte:02x}")).collect();
            assert_eq!(hex, golden.concat(), "{record:?}");
        }
    }
}
