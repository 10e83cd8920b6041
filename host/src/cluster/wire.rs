//! What nodes and clients say to each other over NATS, and how each frame is
//! authenticated.
//!
//! A frame is `version:u8 | mac:[u8; 32] | body`, where `mac` is HMAC-SHA256, under the
//! cluster's shared secret (the empty key when none is set), of the version, the NATS
//! subject the frame was published on, its reply subject and the body. A frame whose MAC
//! does not verify is dropped before its body is read, so a node acts only on what a
//! holder of the secret wrote, and only on the subject it was written for: a frame
//! copied to another node's subject, or given another reply subject, fails. The body is
//! the crate's encoding (`codec.rs`: varints, length-prefixed bytes), which the journal
//! is written in too; every read is bounded by the frame, and a malformed body is a
//! [`WireError`] that names the frame's kind and the field, never a panic or an
//! allocation larger than the frame.
//!
//! The body starts with its sender (node id, 0 for a client, and incarnation: a random
//! number drawn at start, so a restarted node is a new peer) and a kind byte. What makes
//! a frame fresh, so that a copy published again is refused, is said by each kind: a
//! link's data carries sequence numbers that never restart within an incarnation, an
//! announcement a sequence of its own, and a node admits a peer as a member only on an
//! announcement that echoes a nonce it drew itself (see `node/`).

use std::time::Duration;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::codec::{Malformed, Reader, Writer};
use crate::handler::KindLimits;
use crate::scheduler::remote::{RemoteSignal, RemoteSpawn, RunId, RunLimits, Signal, Verdict};
use crate::{Capabilities, ExitReason, Payload, Pid};

type HmacSha256 = Hmac<Sha256>;

// Changes with the encoding: nodes that encode differently refuse each other's frames
// ([`WireError::Version`]) rather than misread them.
// 3: a spawn carries its kind's limits.
// 4: those limits carry a fuel and a CPU time budget.
// 5: a spawn carries its run's owner; items that stop a run and carry a guest's line;
//    an announcement names the files its components were loaded from.
// 6: the MAC covers the subjects; announcements carry a sequence and echo nonces;
//    clients speak a protocol of their own; a spawn carries its run's scope.
// 7: a spawn carries its run's scheduler limits.
// 8: exits carry typed reasons.
// 9: a spawn's run limits carry `max_links` and `max_processes`.
// 10: links and exit signals between processes of two nodes, and a spawn with `link`;
//     one answer (`Done`) for terminations, links and exit signals.
const VERSION: u8 = 10;
const MAC_LEN: usize = 32;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("frame of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("frame version {0} is not {VERSION}: a node of another wasmproc version")]
    Version(u8),
    #[error("frame failed authentication: wrong `--cluster-secret`, forged, or published on another subject")]
    Forged,
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A body that does not decode: the error names the frame's or the item's kind and
    /// the field.
    #[error(transparent)]
    Decode(#[from] Malformed),
}

/// The cluster's shared secret, as a MAC key.
#[derive(Clone)]
pub(crate) struct Key(Vec<u8>);

impl Key {
    pub(crate) fn new(secret: &[u8]) -> Self {
        Key(secret.to_vec())
    }

    /// The MAC over everything a frame is bound to but its body.
    fn mac(&self, subject: &str, reply: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(&[VERSION]);
        // Lengths first, so that no two (subject, reply) pairs hash alike.
        mac.update(&(subject.len() as u64).to_le_bytes());
        mac.update(subject.as_bytes());
        mac.update(&(reply.len() as u64).to_le_bytes());
        mac.update(reply.as_bytes());
        mac
    }

    /// Seals `body` into a frame for `subject`, answered on `reply` ("" for none).
    pub(crate) fn seal(&self, subject: &str, reply: &str, body: &[u8]) -> Vec<u8> {
        let mut mac = self.mac(subject, reply);
        mac.update(body);
        let mut frame = Vec::with_capacity(1 + MAC_LEN + body.len());
        frame.push(VERSION);
        frame.extend_from_slice(&mac.finalize().into_bytes());
        frame.extend_from_slice(body);
        frame
    }

    /// The body of an authentic frame that came on `subject` with `reply`.
    pub(crate) fn open<'a>(&self, subject: &str, reply: &str, frame: &'a [u8]) -> Result<&'a [u8], WireError> {
        let (tag, body) = split(frame)?;
        let mut mac = self.mac(subject, reply);
        mac.update(body);
        // Constant-time comparison.
        mac.verify_slice(tag).map_err(|_| WireError::Forged)?;
        Ok(body)
    }
}

/// A frame's MAC and body, unchecked.
fn split(frame: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    if frame.len() < 1 + MAC_LEN {
        return Err(WireError::Short(frame.len()));
    }
    if frame[0] != VERSION {
        return Err(WireError::Version(frame[0]));
    }
    Ok(frame[1..].split_at(MAC_LEN))
}

/// Who a frame says sent it, and its kind, read before its MAC is checked: what a
/// receiver drops without spending a MAC's work on it (a sender that is no member) is
/// decided on this. Never trusted for anything else.
pub(crate) fn claimed_sender(frame: &[u8]) -> Result<(Peer, u8), WireError> {
    let (_, body) = split(frame)?;
    let mut r = Reader::new(body, "cluster frame");
    let peer = Peer { node: node_id(r.u64("sender")?)?, incarnation: r.u64("incarnation")? };
    Ok((peer, r.u8("kind")?))
}

/// A frame's body, its MAC not checked: only for answering a frame that failed
/// authentication with why, never for acting on it.
pub(crate) fn unchecked_body(frame: &[u8]) -> Result<&[u8], WireError> {
    split(frame).map(|(_, body)| body)
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Who sent a frame: a node (`node` ≥ 1), or a client (`node` 0: `run --cluster`,
/// `cluster ls`).
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
    /// Counts the sender's announcements from 1 within its incarnation: a receiver
    /// takes only one newer than the last it took, so a copy published again is refused.
    pub(crate) seq: u64,
    /// The nonce of the hello or probe this answers (0: a heartbeat, which answers
    /// none). An answer to a nonce the receiver drew is fresh: only then does it admit
    /// the sender as a member.
    pub(crate) echo: u64,
    /// In an answer to a probe: the first sequence of the sender's link to the prober
    /// that the prober has not applied (the link's items before it are acknowledged,
    /// or were counted lost).
    pub(crate) link_start: u64,
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
        reason: ExitReason,
    },
    /// `token` 0: nobody waits for the end. `by`: the process that asked (or its
    /// node's host). `child_only`: carried out only if `target` is a child of `by`
    /// (see [`ChildOnly`](crate::scheduler::remote::ChildOnly)).
    Terminate {
        by: Pid,
        target: Pid,
        token: u64,
        child_only: bool,
    },
    /// The answer to a termination, a link or an exit signal that asked with `token`.
    Done {
        token: u64,
        verdict: Verdict,
    },
    /// `from` (the sender's) has linked to `to` (the receiver's): make `to`'s half of
    /// the link, and answer with `token`.
    Link {
        from: Pid,
        to: Pid,
        token: u64,
        child_only: bool,
    },
    /// `from` has removed its link to `to`: remove `to`'s half.
    Unlink {
        from: Pid,
        to: Pid,
    },
    /// An exit signal from `from` to `to`; `token` 0: nobody waits for an answer (a
    /// linked process's end).
    Signal {
        from: Pid,
        to: Pid,
        signal: RemoteSignal,
        token: u64,
        child_only: bool,
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
    /// terminate those left after `grace`. `scope` 0: the sender's whole run (what it
    /// owns); else only that client's run (`RunId::client`).
    StopRun {
        reason: String,
        grace: Duration,
        scope: u64,
    },
    /// A line a process of the receiver's run wrote (`source`: `stdout`, `stderr`, or
    /// the level of a `log` call); `scope`: the process's run, so that the receiver can
    /// hand a client's run's lines to that client.
    Log {
        pid: Pid,
        scope: u64,
        source: String,
        message: String,
    },
}

/// A frame's body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    Announce(Announce),
    /// Asks every node to answer with its announcement, echoing `nonce`, on the hello's
    /// reply subject (a joining node).
    Hello {
        nonce: u64,
    },
    /// Asks node the subject names for a fresh announcement, echoing `nonce` (sent to a
    /// node heard announcing that is not a member). `link_start`: the first sequence of
    /// the prober's link to it that it has not acknowledged.
    Probe {
        nonce: u64,
        link_start: u64,
    },
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
    /// A client asks every node to offer it a session, on the client's `inbox`
    /// (subjects `INBOX.reply` for answers, `INBOX.code` for its components).
    ClientHello {
        nonce: u64,
        inbox: String,
    },
    /// A node offers a client a session: `announce` says what the node is, `echo` the
    /// client's nonce, `session` the session's id, unguessable and good for one client.
    Welcome {
        announce: Announce,
        echo: u64,
        session: u64,
    },
    /// A client's request in session `session`, numbered by `seq` (strictly increasing
    /// within the session: a copy published again is refused).
    Run {
        session: u64,
        seq: u64,
        request: ClientRequest,
    },
    /// A node's answer in session `session`, numbered as [`Body::Run`]: an item for the
    /// client (a `SpawnDone`, an `Exit`), or `None`: the node is still there (the
    /// answer to a keepalive).
    Reply {
        session: u64,
        seq: u64,
        item: Option<Item>,
    },
}

/// What a client may ask of a node in its session: no more.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ClientRequest {
    /// The client is still there.
    Keepalive,
    /// Spawn a root process of the client's run, answered by a `SpawnDone` with `token`
    /// and, with `monitor`, an `Exit` when it ends. `name`: the file name of the
    /// component `spawn.identity` names, for `cluster ls`.
    Spawn { token: u64, spawn: Box<RemoteSpawn>, name: Option<String> },
    /// Stop the client's run: cancel its processes with `reason`, on every node, and
    /// terminate those left after `grace`.
    StopRun { reason: String, grace: Duration },
    /// Terminate `target`, a process of this session's run.
    Terminate { target: Pid },
    /// The client is leaving: the session ends.
    Leave,
}

// A frame's kind, the byte after its sender.
pub(crate) const ANNOUNCE: u8 = 1;
pub(crate) const HELLO: u8 = 2;
pub(crate) const DATA: u8 = 3;
pub(crate) const ACK: u8 = 4;
const CODE_REQUEST: u8 = 5;
const CODE_CHUNK: u8 = 6;
pub(crate) const PROBE: u8 = 7;
pub(crate) const CLIENT_HELLO: u8 = 8;
const WELCOME: u8 = 9;
pub(crate) const RUN: u8 = 10;
const REPLY: u8 = 11;

const KEEPALIVE: u8 = 0;
const RUN_SPAWN: u8 = 1;
const RUN_TERMINATE: u8 = 2;
const LEAVE: u8 = 3;
const RUN_STOP: u8 = 4;

fn announce(w: &mut Writer, a: &Announce) {
    w.str(&a.name);
    w.u64(a.load);
    w.bool(a.accepts);
    w.bool(a.leaving);
    w.u64(a.seq);
    w.u64(a.echo);
    w.u64(a.link_start);
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

fn read_announce(r: &mut Reader<'_>) -> Result<Announce, WireError> {
    let name = r.str("name")?.to_owned();
    let load = r.u64("load")?;
    let accepts = r.bool("accepts")?;
    let leaving = r.bool("leaving")?;
    let seq = r.u64("seq")?;
    let echo = r.u64("echo")?;
    let link_start = r.u64("link_start")?;
    let count = r.count("components")?;
    let mut components = Vec::with_capacity(count);
    for _ in 0..count {
        components.push(r.str("components")?.to_owned());
    }
    let count = r.count("names")?;
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        names.push((r.str("names")?.to_owned(), r.str("names")?.to_owned()));
    }
    Ok(Announce { name, load, accepts, components, names, leaving, seq, echo, link_start })
}

/// Encodes a frame's body.
pub(crate) fn encode(from: Peer, body: &Body) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(u64::from(from.node));
    w.u64(from.incarnation);
    match body {
        Body::Announce(a) => {
            w.u8(ANNOUNCE);
            announce(&mut w, a);
        }
        Body::Hello { nonce } => {
            w.u8(HELLO);
            w.u64(*nonce);
        }
        Body::Probe { nonce, link_start } => {
            w.u8(PROBE);
            w.u64(*nonce);
            w.u64(*link_start);
        }
        Body::ClientHello { nonce, inbox } => {
            w.u8(CLIENT_HELLO);
            w.u64(*nonce);
            w.str(inbox);
        }
        Body::Welcome { announce: a, echo, session } => {
            w.u8(WELCOME);
            announce(&mut w, a);
            w.u64(*echo);
            w.u64(*session);
        }
        Body::Run { session, seq, request } => {
            w.u8(RUN);
            w.u64(*session);
            w.u64(*seq);
            match request {
                ClientRequest::Keepalive => w.u8(KEEPALIVE),
                ClientRequest::Spawn { token, spawn, name } => {
                    w.u8(RUN_SPAWN);
                    w.bytes(&encode_item(&Item::Spawn { token: *token, spawn: (**spawn).clone() }));
                    w.optional_str(name.as_deref());
                }
                ClientRequest::StopRun { reason, grace } => {
                    w.u8(RUN_STOP);
                    w.str(reason);
                    w.u64(u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX));
                }
                ClientRequest::Terminate { target } => {
                    w.u8(RUN_TERMINATE);
                    w.u64(target.as_u64());
                }
                ClientRequest::Leave => w.u8(LEAVE),
            }
        }
        Body::Reply { session, seq, item } => {
            w.u8(REPLY);
            w.u64(*session);
            w.u64(*seq);
            match item {
                None => w.u8(0),
                Some(item) => {
                    w.u8(1);
                    w.bytes(&encode_item(item));
                }
            }
        }
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
    let mut r = Reader::new(bytes, "cluster frame");
    let node = node_id(r.u64("sender")?)?;
    let peer = Peer { node, incarnation: r.u64("incarnation")? };
    let kind = r.u8("kind")?;
    r.kind(frame_kind(kind));
    let body = match kind {
        ANNOUNCE => Body::Announce(read_announce(&mut r)?),
        HELLO => Body::Hello { nonce: r.u64("nonce")? },
        PROBE => Body::Probe { nonce: r.u64("nonce")?, link_start: r.u64("link_start")? },
        CLIENT_HELLO => Body::ClientHello { nonce: r.u64("nonce")?, inbox: r.str("inbox")?.to_owned() },
        WELCOME => Body::Welcome { announce: read_announce(&mut r)?, echo: r.u64("echo")?, session: r.u64("session")? },
        RUN => {
            let (session, seq) = (r.u64("session")?, r.u64("seq")?);
            let request = match r.u8("request")? {
                KEEPALIVE => ClientRequest::Keepalive,
                RUN_SPAWN => match decode_item(r.bytes("request")?)? {
                    Item::Spawn { token, spawn } => ClientRequest::Spawn {
                        token,
                        spawn: Box::new(spawn),
                        name: r.optional_str("name")?.map(str::to_owned),
                    },
                    _ => return Err(r.invalid("request", "a client's spawn request holds another item").into()),
                },
                RUN_STOP => ClientRequest::StopRun {
                    reason: r.str("reason")?.to_owned(),
                    grace: Duration::from_nanos(r.u64("grace")?),
                },
                RUN_TERMINATE => ClientRequest::Terminate { target: Pid::from_u64(r.u64("target")?) },
                LEAVE => ClientRequest::Leave,
                other => return Err(r.invalid("request", format!("unknown client request {other}")).into()),
            };
            Body::Run { session, seq, request }
        }
        REPLY => Body::Reply {
            session: r.u64("session")?,
            seq: r.u64("seq")?,
            item: if r.bool("item")? { Some(decode_item(r.bytes("item")?)?) } else { None },
        },
        DATA => {
            let to_incarnation = r.u64("to_incarnation")?;
            let first = r.u64("first")?;
            let ack = r.u64("ack")?;
            let count = r.count("items")?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(r.bytes("items")?.to_vec());
            }
            Body::Data { to_incarnation, first, ack, items }
        }
        ACK => Body::Ack { to_incarnation: r.u64("to_incarnation")?, upto: r.u64("upto")? },
        CODE_REQUEST => Body::CodeRequest { hash: r.str("hash")?.to_owned(), offset: r.u64("offset")? },
        CODE_CHUNK => Body::CodeChunk {
            result: if r.bool("result")? {
                Err(r.str("result")?.to_owned())
            } else {
                Ok((r.u64("total")?, r.bytes("chunk")?.to_vec()))
            },
        },
        other => return Err(r.invalid("kind", format!("unknown frame kind {other}")).into()),
    };
    r.finish()?;
    Ok((peer, body))
}

/// A frame kind's name, for errors; empty for a kind that is none.
fn frame_kind(kind: u8) -> &'static str {
    match kind {
        ANNOUNCE => "announce",
        HELLO => "hello",
        DATA => "data",
        ACK => "ack",
        CODE_REQUEST => "code request",
        CODE_CHUNK => "code chunk",
        PROBE => "probe",
        CLIENT_HELLO => "client hello",
        WELCOME => "welcome",
        RUN => "run",
        REPLY => "reply",
        _ => "",
    }
}

/// A sender's node id: 1..=[`Pid::MAX_NODE`] for a node, 0 for a client.
fn node_id(raw: u64) -> Result<u16, WireError> {
    u16::try_from(raw)
        .ok()
        .filter(|&n| n <= Pid::MAX_NODE)
        .ok_or_else(|| WireError::Malformed(format!("node id {raw} outside 0..={}", Pid::MAX_NODE)))
}

const MESSAGE: u8 = 1;
const MONITOR: u8 = 2;
const EXIT: u8 = 3;
const TERMINATE: u8 = 4;
const DONE: u8 = 5;
const SPAWN: u8 = 6;
const SPAWN_DONE: u8 = 7;
const STOP_RUN: u8 = 8;
const LOG: u8 = 9;
const LINK: u8 = 10;
const UNLINK: u8 = 11;
const SIGNAL: u8 = 12;

/// Encodes one link item.
pub(crate) fn encode_item(item: &Item) -> Vec<u8> {
    let mut w = Writer::new();
    match item {
        Item::Message { from, to, topic, body } => {
            w.u8(MESSAGE);
            w.u64(from.as_u64());
            w.u64(to.as_u64());
            w.str(topic);
            w.payload(body);
        }
        Item::Monitor { watcher, target } => {
            w.u8(MONITOR);
            w.u64(watcher.as_u64());
            w.u64(target.as_u64());
        }
        Item::Exit { watcher, pid, reason } => {
            w.u8(EXIT);
            w.u64(watcher.as_u64());
            w.u64(pid.as_u64());
            w.exit_reason(reason);
        }
        Item::Terminate { by, target, token, child_only } => {
            w.u8(TERMINATE);
            w.u64(by.as_u64());
            w.u64(target.as_u64());
            w.u64(*token);
            w.bool(*child_only);
        }
        Item::Done { token, verdict } => {
            w.u8(DONE);
            w.u64(*token);
            match verdict {
                Verdict::Done => w.u8(0),
                Verdict::Noproc => w.u8(1),
                Verdict::NotChild => w.u8(2),
                Verdict::Failed(error) => {
                    w.u8(3);
                    w.str(error);
                }
            }
        }
        Item::Link { from, to, token, child_only } => {
            w.u8(LINK);
            w.u64(from.as_u64());
            w.u64(to.as_u64());
            w.u64(*token);
            w.bool(*child_only);
        }
        Item::Unlink { from, to } => {
            w.u8(UNLINK);
            w.u64(from.as_u64());
            w.u64(to.as_u64());
        }
        Item::Signal { from, to, signal, token, child_only } => {
            w.u8(SIGNAL);
            w.u64(from.as_u64());
            w.u64(to.as_u64());
            w.exit_reason(&signal.reason);
            w.u8(match signal.how {
                Signal::Link => 0,
                Signal::Exit => 1,
                Signal::Kill => 2,
            });
            w.u64(*token);
            w.bool(*child_only);
        }
        Item::Spawn { token, spawn } => {
            w.u8(SPAWN);
            w.u64(*token);
            w.u64(spawn.parent.as_u64());
            w.optional_str(spawn.kind.as_deref());
            w.optional_str(spawn.identity.as_deref());
            w.str(&spawn.method);
            w.payloads(&spawn.input);
            spawn.caps.encode(&mut w);
            w.u64(spawn.mailbox_capacity as u64);
            w.u64(u64::from(spawn.run.node));
            optional_run_limits(&mut w, spawn.run_limits.as_deref());
            optional_limits(&mut w, spawn.limits);
            w.bool(spawn.monitor);
            w.u64(spawn.run.client);
            w.bool(spawn.link);
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
        Item::StopRun { reason, grace, scope } => {
            w.u8(STOP_RUN);
            w.str(reason);
            w.u64(u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX));
            w.u64(*scope);
        }
        Item::Log { pid, scope, source, message } => {
            w.u8(LOG);
            w.u64(pid.as_u64());
            w.u64(*scope);
            w.str(source);
            w.str(message);
        }
    }
    w.into_bytes()
}

/// Decodes one link item.
pub(crate) fn decode_item(bytes: &[u8]) -> Result<Item, WireError> {
    let mut r = Reader::new(bytes, "cluster link item");
    let pid = |r: &mut Reader<'_>, field| r.u64(field).map(Pid::from_u64);
    let kind = r.u8("kind")?;
    r.kind(item_kind(kind));
    let item = match kind {
        MESSAGE => Item::Message {
            from: pid(&mut r, "from")?,
            to: pid(&mut r, "to")?,
            topic: r.str("topic")?.to_owned(),
            body: r.payload("body")?,
        },
        MONITOR => Item::Monitor { watcher: pid(&mut r, "watcher")?, target: pid(&mut r, "target")? },
        EXIT => {
            Item::Exit { watcher: pid(&mut r, "watcher")?, pid: pid(&mut r, "pid")?, reason: r.exit_reason("reason")? }
        }
        TERMINATE => Item::Terminate {
            by: pid(&mut r, "by")?,
            target: pid(&mut r, "target")?,
            token: r.u64("token")?,
            child_only: r.bool("child_only")?,
        },
        DONE => Item::Done {
            token: r.u64("token")?,
            verdict: match r.u8("verdict")? {
                0 => Verdict::Done,
                1 => Verdict::Noproc,
                2 => Verdict::NotChild,
                3 => Verdict::Failed(r.str("verdict")?.to_owned()),
                other => return Err(r.invalid("verdict", format!("unknown verdict {other}")).into()),
            },
        },
        LINK => Item::Link {
            from: pid(&mut r, "from")?,
            to: pid(&mut r, "to")?,
            token: r.u64("token")?,
            child_only: r.bool("child_only")?,
        },
        UNLINK => Item::Unlink { from: pid(&mut r, "from")?, to: pid(&mut r, "to")? },
        SIGNAL => {
            let (from, to) = (pid(&mut r, "from")?, pid(&mut r, "to")?);
            let reason = r.exit_reason("reason")?;
            let how = match r.u8("how")? {
                0 => Signal::Link,
                1 => Signal::Exit,
                2 => Signal::Kill,
                other => return Err(r.invalid("how", format!("unknown exit signal {other}")).into()),
            };
            Item::Signal {
                from,
                to,
                signal: RemoteSignal { reason, how },
                token: r.u64("token")?,
                child_only: r.bool("child_only")?,
            }
        }
        SPAWN => {
            let token = r.u64("token")?;
            let parent = pid(&mut r, "parent")?;
            let kind = r.optional_str("kind")?.map(str::to_owned);
            let identity = r.optional_str("identity")?.map(str::to_owned);
            let method = r.str("method")?.to_owned();
            let input = r.payloads("input")?;
            let caps = Capabilities::decode(&mut r)?;
            let mailbox_capacity = usize::try_from(r.u64("mailbox_capacity")?).unwrap_or(usize::MAX);
            let owner = match r.u64("owner")? {
                0 => 0,
                owner => node_id(owner)?,
            };
            let run_limits = read_optional_run_limits(&mut r)?;
            let limits = read_optional_limits(&mut r)?;
            let monitor = r.bool("monitor")?;
            let scope = r.u64("scope")?;
            let link = r.bool("link")?;
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
                    run_limits,
                    monitor,
                    link,
                    run: RunId { node: owner, client: scope },
                },
            }
        }
        STOP_RUN => Item::StopRun {
            reason: r.str("reason")?.to_owned(),
            grace: Duration::from_nanos(r.u64("grace")?),
            scope: r.u64("scope")?,
        },
        LOG => Item::Log {
            pid: pid(&mut r, "pid")?,
            scope: r.u64("scope")?,
            source: r.str("source")?.to_owned(),
            message: r.str("message")?.to_owned(),
        },
        SPAWN_DONE => Item::SpawnDone {
            token: r.u64("token")?,
            result: if r.bool("result")? { Err(r.str("result")?.to_owned()) } else { Ok(pid(&mut r, "result")?) },
        },
        other => return Err(r.invalid("kind", format!("unknown item kind {other}")).into()),
    };
    r.finish()?;
    Ok(item)
}

/// An item kind's name, for errors; empty for a kind that is none.
fn item_kind(kind: u8) -> &'static str {
    match kind {
        MESSAGE => "message",
        MONITOR => "monitor",
        EXIT => "exit",
        TERMINATE => "terminate",
        DONE => "done",
        LINK => "link",
        UNLINK => "unlink",
        SIGNAL => "exit signal",
        SPAWN => "spawn",
        SPAWN_DONE => "spawn done",
        STOP_RUN => "stop run",
        LOG => "log",
        _ => "",
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

fn optional_run_limits(w: &mut Writer, limits: Option<&RunLimits>) {
    match limits {
        Some(limits) => {
            w.u8(1);
            for bound in [
                limits.max_children,
                limits.max_yields_per_step,
                limits.max_payload_size,
                limits.max_output_per_step,
                limits.mailbox_capacity,
                limits.mailbox_bytes,
                limits.max_links,
                limits.max_processes,
            ] {
                optional_u64(w, bound.map(|n| u64::try_from(n).unwrap_or(u64::MAX)));
            }
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

fn read_optional_u64(r: &mut Reader<'_>, field: &'static str) -> Result<Option<u64>, Malformed> {
    if r.bool(field)? { r.u64(field).map(Some) } else { Ok(None) }
}

/// As [`read_optional_limits`], values too large for this host saturate.
fn read_optional_run_limits(r: &mut Reader<'_>) -> Result<Option<Box<RunLimits>>, WireError> {
    match r.u8("run_limits")? {
        0 => Ok(None),
        1 => {
            let mut bound = || -> Result<Option<usize>, WireError> {
                Ok(read_optional_u64(r, "run_limits")?.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
            };
            Ok(Some(Box::new(RunLimits {
                max_children: bound()?,
                max_yields_per_step: bound()?,
                max_payload_size: bound()?,
                max_output_per_step: bound()?,
                mailbox_capacity: bound()?,
                mailbox_bytes: bound()?,
                max_links: bound()?,
                max_processes: bound()?,
            })))
        }
        other => Err(WireError::Malformed(format!("run limits tag {other}"))),
    }
}

/// Values too large for this host saturate: the receiver takes the tighter of these and
/// its own, so a limit beyond its own range is simply not the tighter one.
fn read_optional_limits(r: &mut Reader<'_>) -> Result<Option<KindLimits>, WireError> {
    match r.u8("limits")? {
        0 => Ok(None),
        1 => {
            let max_memory = usize::try_from(r.u64("limits")?).unwrap_or(usize::MAX);
            let limits = KindLimits::new(max_memory, Duration::from_nanos(r.u64("limits")?));
            let fuel = read_optional_u64(r, "limits")?;
            let cpu_budget = read_optional_u64(r, "limits")?.map(Duration::from_nanos);
            Ok(Some(KindLimits { fuel, cpu_budget, ..limits }))
        }
        other => Err(WireError::Malformed(format!("limits tag {other}"))),
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
            Item::Exit { watcher: a, pid: b, reason: ExitReason::Noconnection("b".into()) },
            Item::Exit { watcher: a, pid: b, reason: ExitReason::Normal(Payload::u64(4)) },
            Item::Terminate { by: a, target: b, token: 2, child_only: false },
            Item::Done { token: 2, verdict: Verdict::Done },
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
                    run_limits: Some(Box::new(RunLimits::new().max_children(2).mailbox_bytes(usize::MAX))),
                    monitor: true,
                    link: false,
                    run: RunId { node: 0, client: 42 },
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
                    run_limits: Some(Box::new(
                        RunLimits::new()
                            .max_children(0)
                            .max_yields_per_step(1)
                            .max_payload_size(3)
                            .max_output_per_step(4)
                            .mailbox_capacity(5)
                            .mailbox_bytes(6)
                            .max_links(7)
                            .max_processes(8),
                    )),
                    monitor: true,
                    link: true,
                    run: RunId { node: 7, client: 0 },
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
                    run_limits: None,
                    monitor: false,
                    link: false,
                    run: RunId { node: Pid::MAX_NODE, client: u64::MAX },
                },
            },
            Item::SpawnDone { token: 8, result: Ok(b) },
            Item::SpawnDone { token: 9, result: Err("no".into()) },
            Item::StopRun { reason: "interrupted".into(), grace: Duration::from_millis(500), scope: 0 },
            Item::StopRun { reason: "gone".into(), grace: Duration::ZERO, scope: 99 },
            Item::Log { pid: a, scope: 3, source: "stdout".into(), message: "hello".into() },
            Item::Terminate { by: a, target: b, token: 3, child_only: true },
            Item::Done { token: 4, verdict: Verdict::Noproc },
            Item::Done { token: 5, verdict: Verdict::NotChild },
            Item::Done { token: 6, verdict: Verdict::Failed("link limit exceeded".into()) },
            Item::Link { from: a, to: b, token: 7, child_only: false },
            Item::Link { from: a, to: b, token: 8, child_only: true },
            Item::Unlink { from: a, to: b },
            Item::Signal {
                from: a,
                to: b,
                signal: RemoteSignal { reason: ExitReason::Error("boom".into()), how: Signal::Link },
                token: 0,
                child_only: false,
            },
            Item::Signal {
                from: a,
                to: b,
                signal: RemoteSignal { reason: ExitReason::Shutdown, how: Signal::Exit },
                token: 9,
                child_only: true,
            },
            Item::Signal {
                from: a,
                to: b,
                signal: RemoteSignal { reason: ExitReason::Killed, how: Signal::Kill },
                token: 10,
                child_only: false,
            },
        ]
        .into_iter()
        .chain(crate::codec::tests::every_exit_reason().into_iter().map(|reason| Item::Exit {
            watcher: a,
            pid: b,
            reason,
        }))
        .collect()
    }

    /// One body of every kind, the announcement's fields and a spawn among them.
    fn bodies() -> Vec<Body> {
        let announce = Announce {
            name: "a".into(),
            load: 3,
            accepts: true,
            components: vec!["sha256:1".into()],
            names: vec![("sha256:1".into(), "app.wasm".into())],
            leaving: false,
            seq: 9,
            echo: 77,
            link_start: 4,
        };
        let spawn = match &items()[6] {
            Item::Spawn { spawn, .. } => spawn.clone(),
            _ => unreachable!("the seventh item is a spawn"),
        };
        vec![
            Body::Announce(announce.clone()),
            Body::Hello { nonce: 5 },
            Body::Probe { nonce: 6, link_start: 2 },
            Body::Data { to_incarnation: 1, first: 7, ack: 3, items: items().iter().map(encode_item).collect() },
            Body::Ack { to_incarnation: 1, upto: 6 },
            Body::CodeRequest { hash: "sha256:1".into(), offset: 10 },
            Body::CodeChunk { result: Ok((100, vec![1, 2, 3])) },
            Body::CodeChunk { result: Err("none".into()) },
            Body::ClientHello { nonce: 8, inbox: "_INBOX_c.x".into() },
            Body::Welcome { announce, echo: 8, session: 99 },
            Body::Run { session: 99, seq: 1, request: ClientRequest::Keepalive },
            Body::Run {
                session: 99,
                seq: 2,
                request: ClientRequest::Spawn { token: 3, spawn: Box::new(spawn), name: Some("a.wasm".into()) },
            },
            Body::Run {
                session: 99,
                seq: 5,
                request: ClientRequest::StopRun { reason: "interrupted".into(), grace: Duration::from_millis(9) },
            },
            Body::Run { session: 99, seq: 3, request: ClientRequest::Terminate { target: Pid::from_u64(4) } },
            Body::Run { session: 99, seq: 4, request: ClientRequest::Leave },
            Body::Reply { session: 99, seq: 1, item: None },
            Body::Reply { session: 99, seq: 2, item: Some(items()[9].clone()) },
        ]
    }

    #[test]
    fn items_and_bodies_read_back_as_written() {
        for item in items() {
            assert_eq!(decode_item(&encode_item(&item)).unwrap(), item);
        }
        let key = Key::new(b"secret");
        for body in bodies() {
            let frame = key.seal("wasmproc.node.3", "_INBOX.r", &encode(PEER, &body));
            assert_eq!(decode(key.open("wasmproc.node.3", "_INBOX.r", &frame).unwrap()).unwrap(), (PEER, body));
        }
    }

    /// A frame is bound to its subject and reply subject: the same bytes published on
    /// another node's subject, or with another reply, fail authentication.
    #[test]
    fn a_frame_on_another_subject_or_reply_is_refused() {
        let key = Key::new(b"secret");
        let frame = key.seal("wasmproc.node.3", "", &encode(PEER, &Body::Hello { nonce: 1 }));
        assert!(key.open("wasmproc.node.3", "", &frame).is_ok());
        assert_eq!(key.open("wasmproc.node.4", "", &frame), Err(WireError::Forged));
        assert_eq!(key.open("wasmproc.node.3", "_INBOX.x", &frame), Err(WireError::Forged));
        // Lengths are hashed: moving a byte from the subject to the reply changes the MAC.
        let frame = key.seal("a.b", "c", &encode(PEER, &Body::Hello { nonce: 1 }));
        assert_eq!(key.open("a.", "bc", &frame), Err(WireError::Forged));
        // The sender and kind can be read unchecked, for a cheap first sort.
        assert_eq!(claimed_sender(&frame), Ok((PEER, HELLO)));
    }

    #[test]
    fn a_frame_under_another_secret_or_altered_is_refused() {
        let open = |key: &[u8], frame: &[u8]| Key::new(key).open("s", "", frame).map(<[u8]>::to_vec);
        let frame = Key::new(b"secret").seal("s", "", &encode(PEER, &Body::Hello { nonce: 1 }));
        assert_eq!(open(b"other", &frame), Err(WireError::Forged));
        let mut altered = frame.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(open(b"secret", &altered), Err(WireError::Forged));
        assert_eq!(open(b"secret", &frame[..10]), Err(WireError::Short(10)));
        let mut versioned = frame;
        versioned[0] = VERSION + 1;
        assert_eq!(open(b"secret", &versioned), Err(WireError::Version(VERSION + 1)));
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
        // The limits tag comes before the monitor flag, the scope (u64::MAX: ten bytes)
        // and the link flag.
        let at = bytes.len() - 13;
        assert_eq!(bytes[at], 0);
        bytes[at] = 2;
        assert_eq!(decode_item(&bytes), Err(WireError::Malformed("limits tag 2".into())));
        // A node id past the largest never names a peer.
        let mut w = Writer::new();
        w.u64(u64::from(Pid::MAX_NODE) + 1);
        w.u64(1);
        w.u8(HELLO);
        w.u64(1);
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

    /// The wire's format, pinned: every sample body's bytes (the data body carries every
    /// sample item), so that a change to the codec cannot change what nodes of this
    /// version read from each other.
    #[test]
    fn the_wire_format_is_fixed() {
        let bodies = bodies();
        let golden: &[&[&str]] = &[
            &["034d010161030100094d0401087368613235363a3101087368613235363a31086170702e7761736d"],
            &["034d0205"],
            &["034d070602"],
            &[
                "034d03010703261b01858080808080801889808080808080200174047465787402686911028580808080808018898080",
                "808080802014038580808080808018898080808080802007016221038580808080808018898080808080802000056279",
                "746573080400000000000000130485808080808080188980808080808020020003050200580608858080808080801801",
                "0361707001097368613235363a30300673717561726501056279746573080300000000000000ef070100100001010200",
                "00000001ffffffffffffffffff010000018080800290a10f0000012a0050060b85808080808080180103617070000473",
                "70696e00ff0701000207010100010101030104010501060107010801ffffffffffffffffff01c08db70101ffffffffff",
                "ffffffff0101808cee891a01000127060a85808080808080180000046d61696e00ff07010001ff1f000000ffffffffff",
                "ffffffff01000b070800898080808080802006070901026e6f13080b696e74657272757074656480cab5ee0100080804",
                "676f6e6500631709858080808080801803067374646f75740568656c6c6f130485808080808080188980808080808020",
                "0301030504010305050217050603136c696e6b206c696d6974206578636565646564130a858080808080801889808080",
                "808080200700130a858080808080801889808080808080200801110b858080808080801889808080808080201a0c8580",
                "80808080801889808080808080200104626f6f6d000000150c8580808080808018898080808080802004010901150c85",
                "80808080808018898080808080802003020a001c038580808080808018898080808080802000047465787404646f6e65",
                "1703858080808080801889808080808080200104626f6f6d120385808080808080188980808080808020031203858080",
                "808080801889808080808080200412038580808080808018898080808080802005120385808080808080188980808080",
                "8080200614038580808080808018898080808080802007016220038580808080808018898080808080802002000c6120",
                "70616e696320747261702603858080808080801889808080808080200201126120756e726561636861626c6520747261",
                "7026038580808080808018898080808080802002021261206f75742d6f662d6675656c20747261702503858080808080",
                "8018898080808080802002031161206370752d6275646765742074726170270385808080808080188980808080808020",
                "02041361206d656d6f72792d6c696d697420747261702903858080808080801889808080808080200205156120737461",
                "636b2d6f766572666c6f77207472617020038580808080808018898080808080802002060c61206f7468657220747261",
                "70",
            ],
            &["034d040106"],
            &["034d05087368613235363a310a"],
            &["034d06006403010203"],
            &["034d0601046e6f6e65"],
            &["034d08080a5f494e424f585f632e78"],
            &["034d090161030100094d0401087368613235363a3101087368613235363a31086170702e7761736d0863"],
            &["034d0a630100"],
            &[
                "034d0a6302015806038580808080808018010361707001097368613235363a3030067371756172650105627974657308",
                "0300000000000000ef07010010000101020000000001ffffffffffffffffff010000018080800290a10f0000012a0001",
                "06612e7761736d",
            ],
            &["034d0a6305040b696e746572727570746564c0a8a504"],
            &["034d0a63030204"],
            &["034d0a630403"],
            &["034d0b630100"],
            &["034d0b6302010b0708008980808080808020"],
        ];
        assert_eq!(bodies.len(), golden.len());
        assert_eq!(bodies.len(), golden.len(), "a golden value for every sample");
        for (body, golden) in bodies.iter().zip(golden) {
            let hex: String = encode(PEER, body).iter().map(|byte| format!("{byte:02x}")).collect();
            assert_eq!(hex, golden.concat(), "{body:?}");
        }
    }

    /// A damaged frame's error names the frame, its kind and the field that did not read
    /// (it once called any damage "a malformed journal record").
    #[test]
    fn damaged_frames_name_their_kind_and_field() {
        let body = encode(PEER, &Body::Probe { nonce: 6, link_start: 300 });
        assert_eq!(
            decode(&body[..body.len() - 1]).unwrap_err().to_string(),
            "malformed cluster frame of kind `probe`: `link_start` at byte 4: the value ends inside it"
        );
        let mut item = encode_item(&items()[0]);
        item.pop();
        assert_eq!(
            decode_item(&item).unwrap_err().to_string(),
            "malformed cluster link item of kind `message`: `body` at byte 24: a length of 2 bytes, with 1 left"
        );
        let frame = encode(PEER, &Body::Data { to_incarnation: 1, first: 1, ack: 0, items: vec![vec![0; 3]] });
        let error = decode(&frame[..frame.len() - 2]).unwrap_err().to_string();
        assert!(error.starts_with("malformed cluster frame of kind `data`: `items`"), "{error}");
        assert_eq!(
            decode(&[3, 1, 99]).unwrap_err().to_string(),
            "malformed cluster frame: `kind` at byte 2: unknown frame kind 99"
        );
    }
}
