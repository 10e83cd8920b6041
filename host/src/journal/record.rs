//! The records of a durable process: how a spawn, a step, a message from the embedder and
//! an exit are written, and read back.
//!
//! A value is [`FORMAT_VERSION`], a record tag, then the record's fields in the order
//! below. Every decode checks what it reads, so a damaged record is a [`Malformed`]
//! error.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmproc_types::{Format, Payload, Pid};

use super::FORMAT_VERSION;
use crate::caps::Capabilities;
use crate::codec::{Malformed, Reader, Writer};
use crate::step::{Command, Event, Outcome, SpawnRequest, Status, Yield};

pub(super) const SPAWN: u8 = 1;
const STEP: u8 = 2;
pub(super) const EXIT: u8 = 3;
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

fn events(w: &mut Writer, events: &[Event]) {
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
