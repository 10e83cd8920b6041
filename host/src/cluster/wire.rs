//! What nodes say to each other over NATS, and how each frame is authenticated.
//!
//! A frame is `version:u8 | mac:[u8; 32] | body`, where `mac` is HMAC-SHA256 of `body`
//! under the cluster's shared secret (the empty key when none is set). A frame whose
//! MAC does not verify is dropped before its body is read, so a node acts only on what
//! a holder of the secret wrote. The body is the journal's compact encoding (varints,
//! length-prefixed bytes); every read is bounded by the frame, and a malformed body is a
//! [`WireError`], never a panic or an allocation larger than the frame.
//!
//! The body starts with its sender (node id and incarnation: a random number a node
//! draws at start, so a restarted node is a new peer) and a kind byte.

use std::time::Duration;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::handler::KindLimits;
use crate::journal::{Malformed, Reader, Writer};
use crate::scheduler::remote::RemoteSpawn;
use crate::{Capabilities, Payload, Pid};
use wasmproc_types::Format;

type HmacSha256 = Hmac<Sha256>;

// Changes with the encoding: nodes that encode differently refuse each other's frames
// ([`WireError::Version`]) rather than misread them.
// 3: a spawn carries its kind's limits.
// 4: those limits carry a fuel and a CPU time budget.
// 5: a spawn carries its run's owner; items that stop a run and carry a guest's line;
//    an announcement names the files its components were loaded from.
const VERSION: u8 = 5;
const MAC_LEN: usize = 32;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("frame of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("frame version {0} is not {VERSION}: a node of another wasmproc version")]
    Version(u8),
    #[error("frame failed authentication: wrong `--cluster-secret`, or forged")]
    Forged,
    #[error("malformed frame: {0}")]
    Malformed(String),
}

impl From<Malformed> for WireError {
    fn from(error: Malformed) -> Self {
        WireError::Malformed(error.to_string())
    }
}

/// The cluster's shared secret, as a MAC key.
#[derive(Clone)]
pub(crate) struct Key(Vec<u8>);

impl Key {
    pub(crate) fn new(secret: &[u8]) -> Self {
        Key(secret.to_vec())
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length")
    }

    /// Seals `body` into a frame.
    pub(crate) fn seal(&self, body: &[u8]) -> Vec<u8> {
        let mut mac = self.mac();
        mac.update(body);
        let mut frame = Vec::with_capacity(1 + MAC_LEN + body.len());
        frame.push(VERSION);
        frame.extend_from_slice(&mac.finalize().into_bytes());
        frame.extend_from_slice(body);
        frame
    }

    /// The body of an authentic frame.
    pub(crate) fn open<'a>(&self, frame: &'a [u8]) -> Result<&'a [u8], WireError> {
        if frame.len() < 1 + MAC_LEN {
            return Err(WireError::Short(frame.len()));
        }
        if frame[0] != VERSION {
            return Err(WireError::Version(frame[0]));
        }
        let (tag, body) = frame[1..].split_at(MAC_LEN);
        let mut mac = self.mac();
        mac.update(body);
        // Constant-time comparison.
        mac.verify_slice(tag).map_err(|_| WireError::Forged)?;
        Ok(body)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Who sent a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Peer {
    pub(crate) node: u16,
    pub(crate) incarnation: u64,
}

/// A node's announcement of itself: its heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Announce {
    pub(crate) name: String,
    /// Live processes.
    pub(crate) load: u64,
    /// Whether placement may send it spawns (a `run --cluster` client takes none).
    pub(crate) accepts: bool,
    /// The components it holds, by hash.
    pub(crate) components: Vec<String>,
    /// The file names some of them were loaded from (by a client, or as a node learnt
    /// from the node it fetched one from), by hash.
    pub(crate) names: Vec<(String, String)>,
    /// It is leaving: forget it now rather than after missed heartbeats.
    pub(crate) leaving: bool,
}

/// One unit of work on a link, in the order the sender queued it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    Message {
        from: Pid,
        to: Pid,
        topic: String,
        body: Payload,
    },
    Monitor {
        watcher: Pid,
        target: Pid,
    },
    Exit {
        watcher: Pid,
        pid: Pid,
        result: Result<Payload, String>,
    },
    /// `token` 0: nobody waits for the end.
    Terminate {
        target: Pid,
        token: u64,
    },
    TerminateDone {
        token: u64,
        result: Result<(), String>,
    },
    Spawn {
        token: u64,
        spawn: RemoteSpawn,
    },
    SpawnDone {
        token: u64,
        result: Result<Pid, String>,
    },
    /// The sender's run is stopping: cancel its processes here with `reason`, and
    /// terminate those left after `grace`.
    StopRun {
        reason: String,
        grace: Duration,
    },
    /// A line a process of the receiver's run wrote (`source`: `stdout`, `stderr`, or
    /// the level of a `log` call).
    Log {
        pid: Pid,
        source: String,
        message: String,
    },
}

/// A frame's body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    Announce(Announce),
    /// Asks every node to announce itself now (a joining node, `cluster ls`).
    Hello,
    /// Items `first`, `first + 1`, … of the sender's link to the node `to` (of
    /// incarnation `to_incarnation`), and an acknowledgement riding with them: the
    /// sender has every item of the receiver's link (that same incarnation's) up to
    /// `ack` (0: says nothing).
    Data {
        to_incarnation: u64,
        first: u64,
        ack: u64,
        items: Vec<Vec<u8>>,
    },
    /// The sender has every item of the receiver's link up to `upto`.
    Ack {
        to_incarnation: u64,
        upto: u64,
    },
    /// A chunk of a component's bytes, asked for by hash and offset.
    CodeRequest {
        hash: String,
        offset: u64,
    },
    /// `total`: the component's whole size; `Err`: the node does not have it.
    CodeChunk {
        result: Result<(u64, Vec<u8>), String>,
    },
}

const ANNOUNCE: u8 = 1;
const HELLO: u8 = 2;
const DATA: u8 = 3;
const ACK: u8 = 4;
const CODE_REQUEST: u8 = 5;
const CODE_CHUNK: u8 = 6;

/// Encodes a frame's body.
pub(crate) fn encode(from: Peer, body: &Body) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(u64::from(from.node));
    w.u64(from.incarnation);
    match body {
        Body::Announce(a) => {
            w.u8(ANNOUNCE);
            w.str(&a.name);
            w.u64(a.load);
            w.bool(a.accepts);
            w.bool(a.leaving);
            w.u64(a.components.len() as u64);
            for c in &a.components {
                w.str(c);
            }
            w.u64(a.names.len() as u64);
            for (hash, name) in &a.names {
                w.str(hash);
                w.str(name);
            }
        }
        Body::Hello => w.u8(HELLO),
        Body::Data { to_incarnation, first, ack, items } => {
            w.u8(DATA);
            w.u64(*to_incarnation);
            w.u64(*first);
            w.u64(*ack);
            w.u64(items.len() as u64);
            for item in items {
                w.bytes(item);
            }
        }
        Body::Ack { to_incarnation, upto } => {
            w.u8(ACK);
            w.u64(*to_incarnation);
            w.u64(*upto);
        }
        Body::CodeRequest { hash, offset } => {
            w.u8(CODE_REQUEST);
            w.str(hash);
            w.u64(*offset);
        }
        Body::CodeChunk { result } => {
            w.u8(CODE_CHUNK);
            match result {
                Ok((total, chunk)) => {
                    w.u8(0);
                    w.u64(*total);
                    w.bytes(chunk);
                }
                Err(e) => {
                    w.u8(1);
                    w.str(e);
                }
            }
        }
    }
    w.into_bytes()
}

/// Decodes a frame's body.
pub(crate) fn decode(bytes: &[u8]) -> Result<(Peer, Body), WireError> {
    let mut r = Reader::new(bytes);
    let node = node_id(r.u64()?)?;
    let peer = Peer { node, incarnation: r.u64()? };
    let body = match r.u8()? {
        ANNOUNCE => {
            let name = r.str()?.to_owned();
            let load = r.u64()?;
            let accepts = r.bool()?;
            let leaving = r.bool()?;
            let count = r.count()?;
            let mut components = Vec::with_capacity(count);
            for _ in 0..count {
                components.push(r.str()?.to_owned());
            }
            let count = r.count()?;
            let mut names = Vec::with_capacity(count);
            for _ in 0..count {
                names.push((r.str()?.to_owned(), r.str()?.to_owned()));
            }
            Body::Announce(Announce { name, load, accepts, components, names, leaving })
        }
        HELLO => Body::Hello,
        DATA => {
            let to_incarnation = r.u64()?;
            let first = r.u64()?;
            let ack = r.u64()?;
            let count = r.count()?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(r.bytes()?.to_vec());
            }
            Body::Data { to_incarnation, first, ack, items }
        }
        ACK => Body::Ack { to_incarnation: r.u64()?, upto: r.u64()? },
        CODE_REQUEST => Body::CodeRequest { hash: r.str()?.to_owned(), offset: r.u64()? },
        CODE_CHUNK => Body::CodeChunk {
            result: match r.u8()? {
                0 => Ok((r.u64()?, r.bytes()?.to_vec())),
                1 => Err(r.str()?.to_owned()),
                other => return Err(WireError::Malformed(format!("code chunk tag {other}"))),
            },
        },
        other => return Err(WireError::Malformed(format!("unknown frame kind {other}"))),
    };
    r.finish()?;
    Ok((peer, body))
}

fn node_id(raw: u64) -> Result<u16, WireError> {
    u16::try_from(raw)
        .ok()
        .filter(|&n| n != 0 && n <= Pid::MAX_NODE)
        .ok_or_else(|| WireError::Malformed(format!("node id {raw} outside 1..={}", Pid::MAX_NODE)))
}

const MESSAGE: u8 = 1;
const MONITOR: u8 = 2;
const EXIT: u8 = 3;
const TERMINATE: u8 = 4;
const TERMINATE_DONE: u8 = 5;
const SPAWN: u8 = 6;
const SPAWN_DONE: u8 = 7;
const STOP_RUN: u8 = 8;
const LOG: u8 = 9;

/// Encodes one link item.
pub(crate) fn encode_item(item: &Item) -> Vec<u8> {
    let mut w = Writer::new();
    match item {
        Item::Message { from, to, topic, body } => {
            w.u8(MESSAGE);
            w.u64(from.as_u64());
            w.u64(to.as_u64());
            w.str(topic);
            payload(&mut w, body);
        }
        Item::Monitor { watcher, target } => {
            w.u8(MONITOR);
            w.u64(watcher.as_u64());
            w.u64(target.as_u64());
        }
        Item::Exit { watcher, pid, result } => {
            w.u8(EXIT);
            w.u64(watcher.as_u64());
            w.u64(pid.as_u64());
            match result {
                Ok(p) => {
                    w.u8(0);
                    payload(&mut w, p);
                }
                Err(e) => {
                    w.u8(1);
                    w.str(e);
                }
            }
        }
        Item::Terminate { target, token } => {
            w.u8(TERMINATE);
            w.u64(target.as_u64());
            w.u64(*token);
        }
        Item::TerminateDone { token, result } => {
            w.u8(TERMINATE_DONE);
            w.u64(*token);
            unit_result(&mut w, result);
        }
        Item::Spawn { token, spawn } => {
            w.u8(SPAWN);
            w.u64(*token);
            w.u64(spawn.parent.as_u64());
            optional_str(&mut w, spawn.kind.as_deref());
            optional_str(&mut w, spawn.identity.as_deref());
            w.str(&spawn.method);
            w.u64(spawn.input.len() as u64);
            for p in &spawn.input {
                payload(&mut w, p);
            }
            spawn.caps.encode(&mut w);
            w.u64(spawn.mailbox_capacity as u64);
            w.u64(u64::from(spawn.owner));
            optional_limits(&mut w, spawn.limits);
            w.bool(spawn.monitor);
        }
        Item::SpawnDone { token, result } => {
            w.u8(SPAWN_DONE);
            w.u64(*token);
            match result {
                Ok(pid) => {
                    w.u8(0);
                    w.u64(pid.as_u64());
                }
                Err(e) => {
                    w.u8(1);
                    w.str(e);
                }
            }
        }
        Item::StopRun { reason, grace } => {
            w.u8(STOP_RUN);
            w.str(reason);
            w.u64(u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX));
        }
        Item::Log { pid, source, message } => {
            w.u8(LOG);
            w.u64(pid.as_u64());
            w.str(source);
            w.str(message);
        }
    }
    w.into_bytes()
}

/// Decodes one link item.
pub(crate) fn decode_item(bytes: &[u8]) -> Result<Item, WireError> {
    let mut r = Reader::new(bytes);
    let pid = |r: &mut Reader<'_>| r.u64().map(Pid::from_u64);
    let item = match r.u8()? {
        MESSAGE => Item::Message {
            from: pid(&mut r)?,
            to: pid(&mut r)?,
            topic: r.str()?.to_owned(),
            body: read_payload(&mut r)?,
        },
        MONITOR => Item::Monitor { watcher: pid(&mut r)?, target: pid(&mut r)? },
        EXIT => {
            let (watcher, exited) = (pid(&mut r)?, pid(&mut r)?);
            let result = match r.u8()? {
                0 => Ok(read_payload(&mut r)?),
                1 => Err(r.str()?.to_owned()),
                other => return Err(WireError::Malformed(format!("exit result tag {other}"))),
            };
            Item::Exit { watcher, pid: exited, result }
        }
        TERMINATE => Item::Terminate { target: pid(&mut r)?, token: r.u64()? },
        TERMINATE_DONE => Item::TerminateDone { token: r.u64()?, result: read_unit_result(&mut r)? },
        SPAWN => {
            let token = r.u64()?;
            let parent = pid(&mut r)?;
            let kind = read_optional_str(&mut r)?;
            let identity = read_optional_str(&mut r)?;
            let method = r.str()?.to_owned();
            let count = r.count()?;
            let mut input = Vec::with_capacity(count);
            for _ in 0..count {
                input.push(read_payload(&mut r)?);
            }
            let caps = Capabilities::decode(&mut r)?;
            let mailbox_capacity = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
            let owner = match r.u64()? {
                0 => 0,
                owner => node_id(owner)?,
            };
            let limits = read_optional_limits(&mut r)?;
            let monitor = r.bool()?;
            Item::Spawn {
                token,
                spawn: RemoteSpawn {
                    parent,
                    kind,
                    identity,
                    method,
                    input,
                    caps,
                    mailbox_capacity,
                    limits,
                    monitor,
                    owner,
                },
            }
        }
        STOP_RUN => Item::StopRun { reason: r.str()?.to_owned(), grace: Duration::from_nanos(r.u64()?) },
        LOG => Item::Log { pid: pid(&mut r)?, source: r.str()?.to_owned(), message: r.str()?.to_owned() },
        SPAWN_DONE => {
            let token = r.u64()?;
            let result = match r.u8()? {
                0 => Ok(pid(&mut r)?),
                1 => Err(r.str()?.to_owned()),
                other => return Err(WireError::Malformed(format!("spawn result tag {other}"))),
            };
            Item::SpawnDone { token, result }
        }
        other => return Err(WireError::Malformed(format!("unknown item kind {other}"))),
    };
    r.finish()?;
    Ok(item)
}

fn payload(w: &mut Writer, p: &Payload) {
    w.str(p.format.as_str());
    w.bytes(&p.data);
}

fn read_payload(r: &mut Reader<'_>) -> Result<Payload, Malformed> {
    Ok(Payload { format: Format::from_name(r.str()?), data: r.bytes()?.to_vec() })
}

fn optional_str(w: &mut Writer, s: Option<&str>) {
    match s {
        Some(s) => {
            w.u8(1);
            w.str(s);
        }
        None => w.u8(0),
    }
}

fn read_optional_str(r: &mut Reader<'_>) -> Result<Option<String>, WireError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.str()?.to_owned())),
        other => Err(WireError::Malformed(format!("optional tag {other}"))),
    }
}

fn optional_limits(w: &mut Writer, limits: Option<KindLimits>) {
    match limits {
        Some(limits) => {
            w.u8(1);
            w.u64(u64::try_from(limits.max_memory).unwrap_or(u64::MAX));
            w.u64(u64::try_from(limits.time_slice.as_nanos()).unwrap_or(u64::MAX));
            optional_u64(w, limits.fuel);
            optional_u64(w, limits.cpu_budget.map(|budget| u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX)));
        }
        None => w.u8(0),
    }
}

fn optional_u64(w: &mut Writer, n: Option<u64>) {
    match n {
        Some(n) => {
            w.u8(1);
            w.u64(n);
        }
        None => w.u8(0),
    }
}

fn read_optional_u64(r: &mut Reader<'_>) -> Result<Option<u64>, WireError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.u64()?)),
        other => Err(WireError::Malformed(format!("optional tag {other}"))),
    }
}

/// Values too large for this host saturate: the receiver takes the tighter of these and
/// its own, so a limit beyond its own range is simply not the tighter one.
fn read_optional_limits(r: &mut Reader<'_>) -> Result<Option<KindLimits>, WireError> {
    match r.u8()? {
        0 => Ok(None),
        1 => {
            let max_memory = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
            let limits = KindLimits::new(max_memory, Duration::from_nanos(r.u64()?));
            let fuel = read_optional_u64(r)?;
            let cpu_budget = read_optional_u64(r)?.map(Duration::from_nanos);
            Ok(Some(KindLimits { fuel, cpu_budget, ..limits }))
        }
        other => Err(WireError::Malformed(format!("limits tag {other}"))),
    }
}

fn unit_result(w: &mut Writer, result: &Result<(), String>) {
    match result {
        Ok(()) => w.u8(0),
        Err(e) => {
            w.u8(1);
            w.str(e);
        }
    }
}

fn read_unit_result(r: &mut Reader<'_>) -> Result<Result<(), String>, WireError> {
    match r.u8()? {
        0 => Ok(Ok(())),
        1 => Ok(Err(r.str()?.to_owned())),
        other => Err(WireError::Malformed(format!("result tag {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: Peer = Peer { node: 3, incarnation: 77 };

    fn items() -> Vec<Item> {
        let a = Pid::from_u64(5).with_node(3);
        let b = Pid::from_u64(9).with_node(4);
        vec![
            Item::Message { from: a, to: b, topic: "t".into(), body: Payload::text("hi") },
            Item::Monitor { watcher: a, target: b },
            Item::Exit { watcher: a, pid: b, result: Err("noconnection".into()) },
            Item::Exit { watcher: a, pid: b, result: Ok(Payload::u64(4)) },
            Item::Terminate { target: b, token: 2 },
            Item::TerminateDone { token: 2, result: Ok(()) },
            Item::Spawn {
                token: 8,
                spawn: RemoteSpawn {
                    parent: a,
                    kind: Some("app".into()),
                    identity: Some("sha256:00".into()),
                    method: "square".into(),
                    input: vec![Payload::u64(3)],
                    caps: Capabilities::default().deny("terminate"),
                    mailbox_capacity: 16,
                    limits: Some(KindLimits::new(4 << 20, Duration::from_micros(250))),
                    monitor: true,
                    owner: 0,
                },
            },
            Item::Spawn {
                token: 11,
                spawn: RemoteSpawn {
                    parent: a,
                    kind: Some("app".into()),
                    identity: None,
                    method: "spin".into(),
                    input: vec![],
                    caps: Capabilities::default(),
                    mailbox_capacity: 2,
                    limits: Some(
                        KindLimits::new(usize::MAX, Duration::from_millis(3))
                            .fuel(u64::MAX)
                            .cpu_budget(Duration::from_secs(7)),
                    ),
                    monitor: true,
                    owner: 7,
                },
            },
            Item::Spawn {
                token: 10,
                spawn: RemoteSpawn {
                    parent: a,
                    kind: None,
                    identity: None,
                    method: "main".into(),
                    input: vec![],
                    caps: Capabilities::default(),
                    mailbox_capacity: 1,
                    limits: None,
                    monitor: false,
                    owner: Pid::MAX_NODE,
                },
            },
            Item::SpawnDone { token: 8, result: Ok(b) },
            Item::SpawnDone { token: 9, result: Err("no".into()) },
            Item::StopRun { reason: "interrupted".into(), grace: Duration::from_millis(500) },
            Item::Log { pid: a, source: "stdout".into(), message: "hello".into() },
        ]
    }

    #[test]
    fn items_and_bodies_read_back_as_written() {
        for item in items() {
            assert_eq!(decode_item(&encode_item(&item)).unwrap(), item);
        }
        let bodies = [
            Body::Announce(Announce {
                name: "a".into(),
                load: 3,
                accepts: true,
                components: vec!["sha256:1".into()],
                names: vec![("sha256:1".into(), "app.wasm".into())],
                leaving: false,
            }),
            Body::Hello,
            Body::Data { to_incarnation: 1, first: 7, ack: 3, items: items().iter().map(encode_item).collect() },
            Body::Ack { to_incarnation: 1, upto: 6 },
            Body::CodeRequest { hash: "sha256:1".into(), offset: 10 },
            Body::CodeChunk { result: Ok((100, vec![1, 2, 3])) },
            Body::CodeChunk { result: Err("none".into()) },
        ];
        let key = Key::new(b"secret");
        for body in bodies {
            let frame = key.seal(&encode(PEER, &body));
            assert_eq!(decode(key.open(&frame).unwrap()).unwrap(), (PEER, body));
        }
    }

    #[test]
    fn a_frame_under_another_secret_or_altered_is_refused() {
        let frame = Key::new(b"secret").seal(&encode(PEER, &Body::Hello));
        assert_eq!(Key::new(b"other").open(&frame), Err(WireError::Forged));
        let mut altered = frame.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(Key::new(b"secret").open(&altered), Err(WireError::Forged));
        assert_eq!(Key::new(b"secret").open(&frame[..10]), Err(WireError::Short(10)));
        let mut versioned = frame;
        versioned[0] = 9;
        assert_eq!(Key::new(b"secret").open(&versioned), Err(WireError::Version(9)));
    }

    #[test]
    fn damaged_bodies_are_errors_not_panics() {
        let body = encode(
            PEER,
            &Body::Data { to_incarnation: 1, first: 1, ack: 0, items: items().iter().map(encode_item).collect() },
        );
        for cut in 0..body.len() {
            assert!(decode(&body[..cut]).is_err(), "cut at {cut}");
        }
        for item in items() {
            let bytes = encode_item(&item);
            for cut in 0..bytes.len() {
                assert!(decode_item(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        // A spawn's limits are there or not: any other tag is refused.
        let spawn =
            items().into_iter().find(|item| matches!(item, Item::Spawn { spawn, .. } if spawn.limits.is_none()));
        let mut bytes = encode_item(&spawn.unwrap());
        // The limits tag is the byte before the last (the monitor flag).
        let at = bytes.len() - 2;
        assert_eq!(bytes[at], 0);
        bytes[at] = 2;
        assert_eq!(decode_item(&bytes), Err(WireError::Malformed("limits tag 2".into())));
        // A node id of 0 (a standalone host's) never names a peer.
        let mut w = Writer::new();
        w.u64(0);
        w.u64(1);
        w.u8(HELLO);
        assert!(matches!(decode(&w.into_bytes()), Err(WireError::Malformed(_))));
        // A count larger than the frame allocates nothing.
        let mut w = Writer::new();
        w.u64(1);
        w.u64(1);
        w.u8(DATA);
        w.u64(1);
        w.u64(1);
        w.u64(0);
        w.u64(u64::MAX);
        assert!(decode(&w.into_bytes()).is_err());
    }
}
