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
const STEP: u8 = 2;
pub(super) const EXIT: u8 = 3;
const HOST_MESSAGE: u8 = 4;
const RECEIVED: u8 = 5;

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
                w.optional_str(spawn.kind.as_deref());
                w.optional_str(spawn.identity.as_deref());
                w.str(&spawn.method);
                w.payloads(&spawn.input);
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
                    w.payload(body);
                }
                w.u8(match step.status {
                    Status::Blocked => 0,
                    Status::Idle => 1,
                    Status::Continue => 2,
                    Status::Complete(_) => 3,
                });
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
        }
        w.into_bytes()
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
                Record::Spawn(SpawnRecord {
                    parent: Pid::from_u64(r.u64("parent")?),
                    origin: if r.bool("origin")? { Some((r.u64("origin")?, r.u64("origin")?)) } else { None },
                    kind: r.optional_str("kind")?.map(str::to_owned),
                    identity: r.optional_str("identity")?.map(str::to_owned),
                    method: r.str("method")?.to_owned(),
                    input: r.payloads("input")?,
                    caps: Capabilities::decode(&mut r)?,
                    mailbox_capacity: r.u64("mailbox_capacity")?,
                    at: r.u64("at")?,
                    seed: r.bytes("seed")?.try_into().map_err(|_| r.invalid("seed", "a seed is not 32 bytes"))?,
                })
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
                let status = match r.u8("status")? {
                    0 => Status::Blocked,
                    1 => Status::Idle,
                    2 => Status::Continue,
                    3 => Status::Complete(Ok(Payload::empty())),
                    other => return Err(r.invalid("status", format!("unknown step status {other}"))),
                };
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
