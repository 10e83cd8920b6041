//! Messages between the shards of durable processes: [`Mail`], a node's, and
//! [`ShardRemote`], what each shard's scheduler hands a message to a process of another
//! shard.
//!
//! Each shard has an *inbox*: the subject `PREFIX.inbox.SHARD` of the JetStream stream
//! `WASMPROC_INBOX` (work-queue retention: a message stays until it is acknowledged),
//! read by the shard's owner through the durable consumer `inbox-SHARD`. So a message to
//! a shard that moves, or has no owner for a while, waits in the stream, replicated, for
//! whoever owns the shard next.
//!
//! # Exactly once, in order
//!
//! 1. **Write-ahead on the sender's side.** A durable process's message leaves once its
//!    step's record is committed, as within a shard (`scheduler/durable.rs`); it carries
//!    its identity there (sender, number: the numbers of one sender grow in the order its
//!    messages leave) and *prev*, the number of the message the same sender queued
//!    before to the same receiver (0: none since this node took the sender's shard).
//! 2. **Published in order.** One task publishes a node's outgoing messages in the order
//!    they were queued, each with the message id `SENDER.NUMBER` (`Nats-Msg-Id`, which
//!    the stream's duplicate window recognises), and awaits the stream's acknowledgements;
//!    a message the stream did not acknowledge is published again, and those after it.
//! 3. **Recorded once on the receiver's side.** The owner of the receiver's shard hands
//!    each message to its scheduler ([`Handle::receive_recorded`]): a message whose number
//!    is not past the last its receiver recorded from its sender is a duplicate
//!    (acknowledged, dropped); one whose *prev* is past that last is early (an earlier one
//!    has not come: not acknowledged, delivered again later), and so is one whose receiver's
//!    mailbox is full; any other is recorded in the
//!    receiver's journal (its sender and number with it), delivered once that is
//!    committed, and only then acknowledged. So a message is recorded once, and one
//!    sender's messages reach one receiver in the order they were sent.
//! 4. **Sent again after a crash.** A shard's recovery sends again every message its
//!    journal holds to a process of another shard (it cannot know which arrived), each
//!    with its number, in its order: the receivers drop the ones they recorded. A shard
//!    that moved while its messages waited in its old node's memory loses none of them.
//!
//! # Bounds
//!
//! A node holds at most [`MAX_OUTBOX`] messages not yet acknowledged by the stream, over
//! all its shards; a send past it is refused ([`SendError::Cluster`]), as a full mailbox
//! refuses one. A shard's inbox holds at most [`MAX_HELD`] messages; past it the stream
//! refuses more, which the sending nodes publish again until there is room (so their
//! outboxes fill, and then refuse).
//!
//! Links, monitors, exit signals and terminations do not cross shards: a monitor of a
//! process of another shard gets its exit at once, with an error that says so, and the
//! commands complete with that error.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;
use wasmproc_types::{ExitReason, Payload, Pid};

use super::blocking::Io;
use super::config::{ClusterConfig, connect};
use super::shards::FIRST_SHARD_NODE;
use crate::codec::{Reader, Writer};
use crate::error::SendError;
use crate::handler::{Completer, Factory};
use crate::scheduler::Handle;
use crate::scheduler::Receipt;
use crate::scheduler::remote::{ChildOnly, Remote, RemoteSignal, RemoteSpawn, RunId};

/// The stream of the shards' inboxes.
pub const DEFAULT_INBOX_STREAM: &str = "WASMPROC_INBOX";
/// The most messages one shard's inbox holds (those not yet recorded by its owner).
pub const MAX_HELD: i64 = 100_000;
/// The most messages a node holds that the stream has not acknowledged yet.
pub const MAX_OUTBOX: usize = 65_536;
/// How long the stream waits for a message's acknowledgement before it gives it again:
/// an owner records a message within milliseconds, so this is how long a message that a
/// lost owner took waits for the next.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// The most messages an owner has taken and not acknowledged yet.
const MAX_ACK_PENDING: i64 = 1024;
/// How long an early message waits before it comes again.
const EARLY_AGAIN: Duration = Duration::from_millis(50);
/// How long a publish that failed waits before it is tried again.
const PUBLISH_AGAIN: Duration = Duration::from_millis(200);
/// The most messages published before their acknowledgements are awaited.
const PUBLISH_WINDOW: usize = 256;
/// The longest one request to the server may take.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long opening the inboxes' stream is tried again (less than [`PATIENCE`]).
const CREATING: Duration = Duration::from_secs(20);
/// Room left in a message for its headers and its envelope.
const HEADROOM: usize = 4 << 10;

/// Where the inboxes live.
#[derive(Debug, Clone)]
pub struct InboxOptions {
    stream: String,
    replicas: usize,
}

impl Default for InboxOptions {
    fn default() -> Self {
        InboxOptions { stream: DEFAULT_INBOX_STREAM.to_owned(), replicas: 1 }
    }
}

impl InboxOptions {
    /// [`DEFAULT_INBOX_STREAM`], with one replica.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stream's name (letters, digits, `-` and `_`): one stream per subject prefix
    /// ([`ClusterConfig::prefix`]).
    pub fn stream(mut self, name: impl Into<String>) -> Self {
        self.stream = name.into();
        self
    }

    /// The stream's replicas when this node creates it (1 to 5); an existing stream keeps
    /// its own.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }
}

/// A message on its way to another shard.
struct Outgoing {
    subject: String,
    id: String,
    payload: Bytes,
}

/// A node's mail between shards: see the module's docs.
pub(super) struct Mail {
    io: Io,
    context: jetstream::Context,
    stream: String,
    prefix: String,
    shards: u32,
    largest: usize,
    outbox: tokio::sync::mpsc::UnboundedSender<Outgoing>,
    /// Messages queued and not yet acknowledged by the stream.
    queued: Arc<AtomicUsize>,
    chains: Mutex<HashMap<u32, Chains>>,
}

/// Of a shard's processes: the number of the last message each (sender, receiver) queued.
type Chains = HashMap<(Pid, Pid), u64>;

fn shard_of(pid: Pid) -> Option<u32> {
    let node = pid.node();
    (FIRST_SHARD_NODE..Pid::MAX_NODE).contains(&node).then(|| u32::from(Pid::MAX_NODE - 1 - node))
}

impl Mail {
    /// Connects, creates the inboxes' stream if it is missing, and starts publishing.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses (no JetStream, no rights on the stream).
    pub(super) fn open(config: &ClusterConfig, shards: u32, options: &InboxOptions) -> anyhow::Result<Arc<Mail>> {
        super::config::check_stored("stream", &options.stream, options.replicas)?;
        let io = Io::new("wasmproc-inbox", PATIENCE)?;
        let subjects = format!("{}.inbox.*", config.prefix);
        let stream_config = stream::Config {
            name: options.stream.clone(),
            subjects: vec![subjects.clone()],
            storage: stream::StorageType::File,
            num_replicas: options.replicas,
            retention: stream::RetentionPolicy::WorkQueue,
            max_messages_per_subject: MAX_HELD,
            discard: stream::DiscardPolicy::New,
            discard_new_per_subject: true,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        let connecting = config.clone();
        let (client, context) = io.run(async move {
            let client = connect(&connecting, None).await?;
            let context = jetstream::new(client.clone());
            let name = stream_config.name.clone();
            // Nodes starting together create it together, and a replicated stream just
            // created may not be found for a moment: tried again for a while.
            let deadline = tokio::time::Instant::now() + CREATING;
            let stream = loop {
                match context.get_or_create_stream(stream_config.clone()).await {
                    Ok(stream) => break stream,
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(PUBLISH_AGAIN).await;
                    }
                    Err(error) => {
                        anyhow::bail!("cannot create or find the shards' inbox stream `{name}`: {error}")
                    }
                }
            };
            // What the creation or the look-up answered: asked again at once, a stream
            // another node has just created may not be known yet to the server asked.
            let info = stream.cached_info();
            anyhow::ensure!(
                info.config.subjects.contains(&subjects),
                "the stream `{name}` exists without the subjects `{subjects}` (it has {:?})",
                info.config.subjects
            );
            Ok::<_, anyhow::Error>((client, context))
        })??;
        let largest = client.server_info().max_payload.saturating_sub(HEADROOM);
        let (outbox, outgoing) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        io.spawn(publish(context.clone(), outgoing, queued.clone()))?;
        Ok(Arc::new(Mail {
            io,
            context,
            stream: options.stream.clone(),
            prefix: config.prefix.clone(),
            shards,
            largest,
            outbox,
            queued,
            chains: Mutex::new(HashMap::new()),
        }))
    }

    /// Forgets what shard `shard`'s processes queued: its next owner's recovery sends
    /// every message again, each as the first of its chain.
    pub(super) fn restart_chains(&self, shard: u32) {
        self.chains.lock().remove(&shard);
    }

    /// The shard of `to`, if the cluster has it.
    fn target(&self, to: Pid) -> Result<u32, SendError> {
        let refuse = |reason: String| SendError::Cluster { pid: to, reason };
        let target = shard_of(to).ok_or_else(|| {
            refuse(format!(
                "process {to} is of no shard: a shard's processes send only to the processes of the cluster's shards"
            ))
        })?;
        if target >= self.shards {
            return Err(refuse(format!(
                "there is no shard {target}: the cluster has {} shards (0 to {})",
                self.shards,
                self.shards - 1
            )));
        }
        Ok(target)
    }

    /// Queues message `id` of `from` (of shard `shard`) to `to`.
    fn queue(
        &self,
        shard: u32,
        from: Pid,
        to: Pid,
        (topic, body): (String, Payload),
        id: u64,
    ) -> Result<(), SendError> {
        let refuse = |reason: String| SendError::Cluster { pid: to, reason };
        let target = self.target(to)?;
        let size = topic.len() + body.data.len() + body.format.as_str().len();
        if size > self.largest {
            return Err(refuse(format!(
                "a message of {size} bytes is larger than the {} bytes a shard's inbox carries",
                self.largest
            )));
        }
        if self.queued.fetch_add(1, Ordering::AcqRel) >= MAX_OUTBOX {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(refuse(format!("{MAX_OUTBOX} messages already wait for other shards; retry later")));
        }
        // The chain and the queue in one order: held across the queueing.
        let mut chains = self.chains.lock();
        let last = chains.entry(shard).or_default().entry((from, to)).or_default();
        let incoming = Incoming { from, to, id, prev: *last, topic, body };
        let outgoing = Outgoing {
            subject: format!("{}.inbox.{target}", self.prefix),
            id: format!("{}.{id}", from.as_u64()),
            payload: Bytes::from(incoming.encode()),
        };
        if self.outbox.send(outgoing).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(refuse("this node's mail to other shards has stopped".to_owned()));
        }
        *last = id;
        Ok(())
    }

    /// Starts taking shard `shard`'s inbox to its scheduler, `handle`, until the returned
    /// [`Reading`] is dropped.
    ///
    /// # Errors
    ///
    /// The runtime has stopped.
    pub(super) fn read(&self, shard: u32, handle: Handle) -> anyhow::Result<Reading> {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let subject = format!("{}.inbox.{shard}", self.prefix);
        let reader = read(self.context.clone(), self.stream.clone(), shard, subject, handle, stopped);
        self.io.spawn(reader)?;
        Ok(Reading { _stop: stop })
    }

    /// Whether every message queued was acknowledged by the stream.
    pub(super) fn flushed(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }
}

/// A shard's inbox being read: dropped, the reading stops (what it took and did not
/// acknowledge comes again to the shard's next owner).
pub(super) struct Reading {
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Publishes the queued messages in order, a window at a time: see the module's docs.
async fn publish(
    context: jetstream::Context,
    mut outgoing: tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
    queued: Arc<AtomicUsize>,
) {
    let mut pending: VecDeque<Outgoing> = VecDeque::new();
    loop {
        if pending.is_empty() {
            match outgoing.recv().await {
                Some(message) => pending.push_back(message),
                None => return,
            }
        }
        while pending.len() < PUBLISH_WINDOW {
            match outgoing.try_recv() {
                Ok(message) => pending.push_back(message),
                Err(_) => break,
            }
        }
        let mut acks = Vec::with_capacity(pending.len());
        for message in &pending {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", message.id.as_str());
            match context.publish_with_headers(message.subject.clone(), headers, message.payload.clone()).await {
                Ok(ack) => acks.push(ack),
                Err(error) => {
                    tracing::debug!(subject = %message.subject, "a message to another shard is published again: {error}");
                    break;
                }
            }
        }
        let mut acknowledged = 0;
        for ack in acks {
            match ack.await {
                Ok(_) => acknowledged += 1,
                Err(error) => {
                    tracing::debug!("a message to another shard is published again: {error}");
                    break;
                }
            }
        }
        pending.drain(..acknowledged);
        queued.fetch_sub(acknowledged, Ordering::AcqRel);
        if !pending.is_empty() {
            tokio::time::sleep(PUBLISH_AGAIN).await;
        }
    }
}

/// A message of an inbox: in the crate's encoding (`codec.rs`), its sender, receiver,
/// number and predecessor's number, topic and body.
#[derive(Debug, Clone, PartialEq)]
struct Incoming {
    from: Pid,
    to: Pid,
    id: u64,
    prev: u64,
    topic: String,
    body: Payload,
}

impl Incoming {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.from.as_u64());
        w.u64(self.to.as_u64());
        w.u64(self.id);
        w.u64(self.prev);
        w.str(&self.topic);
        w.payload(&self.body);
        w.into_bytes()
    }
}

fn decode(bytes: &[u8]) -> Result<Incoming, crate::codec::Malformed> {
    let mut r = Reader::new(bytes, "message to a shard");
    let incoming = Incoming {
        from: Pid::from_u64(r.u64("from")?),
        to: Pid::from_u64(r.u64("to")?),
        id: r.u64("id")?,
        prev: r.u64("prev")?,
        topic: r.str("topic")?.to_owned(),
        body: r.payload("body")?,
    };
    r.finish()?;
    Ok(incoming)
}

/// Reads shard `shard`'s inbox into `handle`'s scheduler until `stopped`.
async fn read(
    context: jetstream::Context,
    stream: String,
    shard: u32,
    subject: String,
    handle: Handle,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let name = format!("inbox-{shard}");
    let config = consumer::pull::Config {
        durable_name: Some(name.clone()),
        filter_subject: subject,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_ack_pending: MAX_ACK_PENDING,
        ..Default::default()
    };
    let runtime = tokio::runtime::Handle::current();
    loop {
        let taking = async {
            let stream = context.get_stream(&stream).await.map_err(|e| e.to_string())?;
            let consumer: consumer::PullConsumer =
                stream.get_or_create_consumer(&name, config.clone()).await.map_err(|e| e.to_string())?;
            consumer.messages().await.map_err(|e| e.to_string())
        };
        let mut messages = tokio::select! {
            _ = &mut stopped => return,
            taken = taking => match taken {
                Ok(messages) => messages,
                Err(error) => {
                    tracing::warn!(shard, "cannot read shard {shard}'s inbox: {error}");
                    tokio::time::sleep(PUBLISH_AGAIN).await;
                    continue;
                }
            },
        };
        loop {
            let next = tokio::select! {
                _ = &mut stopped => return,
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(error)) => {
                    tracing::debug!(shard, "shard {shard}'s inbox is read again: {error}");
                    break;
                }
                None => break,
            };
            let incoming = match decode(&message.payload) {
                Ok(incoming) => incoming,
                Err(error) => {
                    tracing::warn!(shard, "a message in shard {shard}'s inbox is dropped: {error}");
                    let _ = message.ack_with(AckKind::Term).await;
                    continue;
                }
            };
            let (from, to) = (incoming.from, incoming.to);
            let message = Arc::new(message);
            let acking = message.clone();
            let at = runtime.clone();
            let done = Box::new(move || {
                at.spawn(async move {
                    if let Err(error) = acking.ack().await {
                        // It comes again, and is found recorded.
                        tracing::debug!("a recorded message from another shard was not acknowledged: {error}");
                    }
                });
            });
            let ids = (incoming.id, incoming.prev);
            let receipt = handle.receive_recorded(from, to, ids, incoming.topic, incoming.body, done);
            tracing::debug!(shard, %from, %to, id = ids.0, prev = ids.1, ?receipt, "a message of shard {shard}'s inbox");
            let answer = match receipt {
                Receipt::Recording => None,
                Receipt::Duplicate => Some(AckKind::Ack),
                Receipt::NoProcess => {
                    tracing::debug!(%from, %to, "a message from another shard is dropped: no process {to}");
                    Some(AckKind::Ack)
                }
                Receipt::Early => Some(AckKind::Nak(Some(EARLY_AGAIN))),
                Receipt::Full => Some(AckKind::Nak(Some(PUBLISH_AGAIN))),
                Receipt::Refused(why) => {
                    tracing::debug!(%from, %to, "a message from another shard waits: {why}");
                    Some(AckKind::Nak(Some(PUBLISH_AGAIN)))
                }
            };
            if let Some(answer) = answer
                && let Err(error) = message.ack_with(answer).await
            {
                tracing::debug!(shard, "a message of shard {shard}'s inbox was not answered: {error}");
            }
        }
    }
}

/// What a shard's scheduler hands what names a process of another shard: see the
/// module's docs.
pub(super) struct ShardRemote {
    mail: Arc<Mail>,
    shard: u32,
    handle: OnceLock<Handle>,
}

/// What a command over a process of another shard completes with.
fn not_across(target: Pid) -> String {
    format!(
        "links, monitors, exit signals and terminations do not cross shards: process {target} is of shard {}",
        shard_of(target).map_or_else(|| "none".to_owned(), |shard| shard.to_string())
    )
}

impl ShardRemote {
    pub(super) fn new(mail: Arc<Mail>, shard: u32) -> Arc<ShardRemote> {
        Arc::new(ShardRemote { mail, shard, handle: OnceLock::new() })
    }

    /// The shard's scheduler, once built.
    pub(super) fn serve(&self, handle: Handle) {
        let _ = self.handle.set(handle);
    }
}

impl Remote for ShardRemote {
    fn send(&self, from: Pid, to: Pid, topic: String, body: Payload, id: Option<u64>) -> Result<(), SendError> {
        let Some(id) = id else {
            return Err(SendError::Cluster {
                pid: to,
                reason: "only a durable process's messages go to another shard, once recorded".to_owned(),
            });
        };
        self.mail.queue(self.shard, from, to, (topic, body), id)
    }

    fn check(&self, to: Pid) -> Result<(), SendError> {
        self.mail.target(to).map(|_| ())
    }

    fn monitor(&self, watcher: Pid, target: Pid) {
        if let Some(handle) = self.handle.get() {
            handle.exit_to(watcher, target, ExitReason::Error(not_across(target)));
        }
    }

    fn terminate(&self, _by: Pid, target: Pid, _child_only: ChildOnly, done: Option<Completer>) {
        if let Some(done) = done {
            done.complete(Err(not_across(target)));
        }
    }

    fn link(&self, from: Pid, target: Pid, fresh: bool, _child_only: ChildOnly, done: Completer) {
        if let Some(handle) = self.handle.get().filter(|_| fresh) {
            handle.unlink_local(from, target);
        }
        done.complete(Err(not_across(target)));
    }

    fn unlink(&self, _from: Pid, _target: Pid) {}

    fn signal(&self, _from: Pid, target: Pid, _signal: RemoteSignal, done: Option<(Completer, ChildOnly)>) {
        if let Some((done, _)) = done {
            done.complete(Err(not_across(target)));
        }
    }

    fn place(&self) -> Option<u16> {
        None
    }

    fn spawn(&self, _node: u16, _request: RemoteSpawn, done: Completer) {
        done.complete(Err("spawn failed: a shard's processes spawn within their shard".to_owned()));
    }

    fn factory(&self, _kind: &str, _run: RunId) -> Option<Arc<dyn Factory>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reads_back_as_written_and_a_truncated_one_is_an_error() {
        let message = Incoming {
            from: Pid::from_u64(7).with_node(shard_node_of(2)),
            to: Pid::from_u64(9).with_node(shard_node_of(5)),
            id: (3 << 20) | 1,
            prev: 1 << 20,
            topic: "n".to_owned(),
            body: Payload::u64(4),
        };
        let bytes = message.encode();
        assert_eq!(decode(&bytes).expect("reads back"), message);
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert_eq!(shard_of(message.to), Some(5));
        assert_eq!(shard_of(Pid::from_u64(9).with_node(3)), None, "a node's pid names no shard");
    }

    fn shard_node_of(shard: u32) -> u16 {
        crate::cluster::shard_node(shard)
    }
}
