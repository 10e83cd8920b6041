//! The cluster's thread: one tokio task owns the links, the membership and the clients'
//! sessions, fed by the scheduler's workers and the embedder through a channel, by NATS
//! subscriptions, and by a heartbeat timer. No lock guards the links: only this task
//! touches them. Spawns for other nodes run on a thread of their own (`run_spawns`).
//!
//! # Layout
//!
//! This file holds the actor's state (every type its fields are made of), joining,
//! the run loop and the dispatch of commands and frames; its behaviour is split by
//! concern into `impl Actor` blocks, each in a file of its own that imports this one and
//! nothing else of the node's: `links.rs` (outgoing and incoming links, acknowledgements,
//! resending, and what a link's items may say), `membership.rs` (announcing, hearing,
//! probing, admitting and losing nodes), `sessions.rs` (clients' sessions) and `runs.rs`
//! (what the items do here: messages, monitors, spawns, and the runs they belong to).
//!
//! # Membership
//!
//! A node acts on another's data only while that node (id and incarnation) is a member,
//! and makes it one only on an announcement that answers a nonce it drew itself, so a
//! copy of an old announcement (a node that left, a node that restarted since) makes no
//! member, and a forged or copied one evicts none:
//!
//! 1. A joining node publishes a hello with a nonce; each member answers, on the hello's
//!    reply subject, with its announcement echoing the nonce. The joiner admits those.
//! 2. The joiner announces itself (its heartbeat). A node that hears an announcement from
//!    a node that is not a member sends it a probe with a nonce of its own (at most one a
//!    heartbeat per node id), and admits it when its answer echoes that nonce.
//! 3. A member's heartbeats count up (`Announce::seq`): one not newer than the last taken
//!    is a copy, refused; only a newer one keeps it a member or says it leaves.
//! 4. A member unheard for [`LOSS_AFTER`] is lost. If it was alive all along (cut off,
//!    stalled), it is probed again on its next heartbeat and admitted again.
//!
//! # Links never restart
//!
//! The sequence of a link from one incarnation to another never goes back: a node keeps
//! the next sequence of a link it dropped (its peer was lost), and a probe and its answer
//! each carry the first sequence the other has not acknowledged (`link_start`), from
//! which the other takes the link up again, never lower than it was. So an item applied
//! once is never applied again, whatever is published again later.
//!
//! # Clients
//!
//! A client (`run --cluster`, `cluster ls`) is not a node: it holds no node id, sends no
//! link items, and publishes only on `PREFIX.run.*`. It asks every node for a session
//! (`ClientHello`, answered with a `Welcome` carrying an unguessable session id) and then
//! sends numbered requests in that session: spawn a root of its run, terminate one of
//! those, keep the session alive, leave. A node answers on the client's own inbox. A
//! session unheard for [`LOSS_AFTER`] ends.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::{FutureExt as _, StreamExt as _};
use parking_lot::{Mutex, RwLock};
use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::mpsc;

use super::code;
use super::config::{
    ClusterConfig, ConnectionEvents, HEARTBEAT, Heard, JOIN_WAIT, LOSS_AFTER, RETRANSMIT_AFTER, connect,
};
use super::process::RemoteSlot;
use super::shared::{Cmd, Counters, Inner};
use super::wire::{self, Announce, Body, Item, Key, Peer};
use crate::handler::{Completer, Factory};
use crate::scheduler::Handle;
use crate::scheduler::remote::{Notify, RemoteSpawn};
use crate::{ExitReason, Payload, Pid};

mod links;
mod membership;
mod runs;
mod sessions;

/// How many items one data frame carries at most, and how many bytes.
const BATCH_ITEMS: usize = 512;
const BATCH_BYTES: usize = 256 << 10;
/// Commands taken from the channel before the links are flushed: batching under load,
/// one frame per item when idle. Picked out of thin air.
const DRAIN: usize = 1024;
/// How long an acknowledgement owed to a node waits for a data frame to that node to
/// ride in before it goes alone (a delayed ack, as TCP's): an answer that comes back
/// within it carries the ack, so a request and its answer are two NATS messages, not
/// four. Far below [`RETRANSMIT_AFTER`] (an ack this late resends nothing), far above a
/// round trip through a server on loopback (~0.1–0.3 ms); picked out of thin air.
const ACK_DELAY: Duration = Duration::from_millis(5);
/// Items applied since the last acknowledgement to a node past which the next one goes
/// at once: a one-way stream frees its sender's resend queue every so many items rather
/// than every [`ACK_DELAY`]. One full frame; picked out of thin air.
const ACK_EVERY: u64 = BATCH_ITEMS as u64;
/// Bytes of frames taken from one subscription before the task turns to the others (its
/// heartbeat, the announcements, the NATS client's own reading): a flood on one subject
/// delays the rest by this much at most. Four full data frames; picked out of thin air.
const DRAIN_BYTES: usize = 4 * BATCH_BYTES;
/// Clients' sessions open at once on a node, and sessions offered and not taken up yet;
/// past it a new one is refused (open) or the oldest offer is dropped (offered). Picked
/// out of thin air: far more clients than a node serves.
const MAX_SESSIONS: usize = 4096;
/// How long a session offered to a client waits to be taken up.
const OFFER_FOR: Duration = Duration::from_secs(10);
/// The most components an announcement lists (`cluster ls` shows them): with hashes of
/// 71 bytes, an announcement stays under [`MAX_SMALL_FRAME`].
const MAX_ANNOUNCED: usize = 512;
/// The largest announcement, hello, probe or client's hello a node reads: anything
/// larger on those subjects is junk, refused before its MAC is computed, so a flood of
/// large frames costs a node nothing it needs for its heartbeats.
const MAX_SMALL_FRAME: usize = 64 << 10;
/// Answers to clients whose hello failed authentication, a heartbeat at most: enough to
/// tell a client with a wrong secret why, too few to make the node a reflector.
const REFUSALS_ANSWERED: u32 = 4;

/// Where an answer or an exit goes: a node's link, or a client's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dest {
    Node(u16),
    Session(u64),
}

impl Dest {
    /// The command that sends `item` there.
    fn cmd(self, item: Item) -> Cmd {
        match self {
            Dest::Node(node) => Cmd::Item { node, item },
            Dest::Session(session) => Cmd::Reply { session, item },
        }
    }
}

/// A spawn for another node, resolved to a factory, for the spawning thread.
struct SpawnJob {
    handle: Handle,
    factory: Arc<dyn Factory>,
    kind: Arc<str>,
    spawn: RemoteSpawn,
    notify: Option<Notify>,
    /// Who asked, and its token for the answer.
    dest: Dest,
    token: u64,
}

/// The spawning thread: runs each spawn other nodes ask for (the process's `init`, which
/// for a component is an instantiation: work that must not hold up the links) and
/// queues the answer on the link before the child is scheduled, so the answer goes
/// before anything the child sends. One thread for all, taking spawns in the order they
/// came: a batch of spawns costs one wake-up, not one hand-off to a pool thread each.
/// Ends when the cluster's thread drops the sender.
fn run_spawns(jobs: std::sync::mpsc::Receiver<SpawnJob>, commands: mpsc::UnboundedSender<Cmd>) {
    for job in jobs {
        let SpawnJob { handle, factory, kind, mut spawn, notify, dest, token } = job;
        let answer = |result| {
            let _ = commands.send(dest.cmd(Item::SpawnDone { token, result }));
        };
        spawn.caps = spawn.caps.intersect(handle.default_capabilities());
        let mut answered = false;
        // A factory that panics fails its spawn, not the thread every later spawn needs
        // (`init` is caught by the scheduler already).
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handle.spawn_for_remote(&*factory, kind, spawn, notify, |pid| {
                answered = true;
                answer(Ok(pid));
            })
        }));
        match result {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => answer(Err(format!("spawn failed: {:#}", anyhow::Error::new(error)))),
            Err(_) if !answered => answer(Err("spawn failed: the process's factory panicked".to_owned())),
            Err(_) => {}
        }
    }
}

/// Connects, joins and starts the thread: the node's shared state, and the thread that
/// runs its links until it leaves.
pub(super) fn start(config: ClusterConfig) -> anyhow::Result<(Arc<Inner>, std::thread::JoinHandle<()>)> {
    config.check_authenticated()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("wasmproc-cluster")
        .build()
        .context("failed to start the cluster's runtime")?;
    let (commands, receiver) = mpsc::unbounded_channel();
    let events = commands.clone();
    let answers = commands.clone();
    let incarnation = random_u64().max(1);
    let (client, members) = runtime.block_on(async {
        let connection: ConnectionEvents = Arc::new(move |connected| drop(events.send(Cmd::Connection(connected))));
        let client = connect(&config, Some(connection)).await?;
        let members = discover(&client, &config, incarnation).await?;
        Ok::<_, anyhow::Error>((client, members))
    })?;
    let name = config.name.clone().unwrap_or_else(default_name);
    if let Some(same) = members.values().find(|(_, a)| a.name == name) {
        bail!("a node named `{name}` is already in the cluster (node {}): give this one another `--name`", same.0.node);
    }
    let node = draw_node(&members).context("every node id of the cluster is taken")?;
    let max_payload = client.server_info().max_payload;
    let inner = Arc::new(Inner {
        node,
        incarnation,
        name,
        key: Key::new(&config.secret),
        prefix: config.prefix.clone(),
        placement: config.placement,
        accepts: config.accepts,
        share_components: config.share_components,
        commands,
        alive: (0..=usize::from(Pid::MAX_NODE)).map(|_| AtomicU64::new(0)).collect(),
        view: RwLock::new(Vec::new()),
        placed: (0..=usize::from(Pid::MAX_NODE)).map(|_| AtomicU64::new(0)).collect(),
        backlog: AtomicUsize::new(0),
        log_backlog: AtomicUsize::new(0),
        grace: config.grace,
        lines: Default::default(),
        queued: AtomicUsize::new(0),
        max_queued: config.max_queued,
        // Room for the frame's header and one item's own fields.
        max_item: max_payload.saturating_sub(1024),
        counters: Counters::default(),
        handle: Default::default(),
        loader: Default::default(),
        code: Default::default(),
        fetched: Default::default(),
        fetching: Mutex::default(),
        embedded: Mutex::default(),
        next_token: AtomicU64::new(1),
    });
    let (jobs, jobs_rx) = std::sync::mpsc::channel();
    let spawner = std::thread::Builder::new()
        .name("wasmproc-cluster-spawn".to_owned())
        .spawn(move || run_spawns(jobs_rx, answers))
        .context("failed to start the cluster's spawning thread")?;
    let mut actor = Actor::new(inner.clone(), client, jobs);
    let now = Instant::now();
    for (peer, announce) in members.into_values() {
        actor.admit(peer, announce, now);
    }
    actor.inner.alive[usize::from(node)].store(incarnation, Ordering::Release);
    actor.publish_view();
    let thread = std::thread::Builder::new()
        .name("wasmproc-cluster".to_owned())
        .spawn(move || {
            runtime.block_on(actor.run(receiver));
            // Tasks still fetching code hold senders of spawn jobs: dropping the runtime
            // drops them, and the spawning thread ends once no sender is left.
            drop(runtime);
            let _ = spawner.join();
        })
        .context("failed to start the cluster's thread")?;
    Ok((inner, thread))
}

type Members = FxHashMap<u16, (Peer, Announce)>;

/// Asks every node to announce itself, echoing a nonce, and gathers the answers for
/// [`JOIN_WAIT`]: only live nodes answer a fresh nonce, so no copy of an old announcement
/// counts.
async fn discover(client: &async_nats::Client, config: &ClusterConfig, incarnation: u64) -> anyhow::Result<Members> {
    let key = Key::new(&config.secret);
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.context("failed to subscribe to the cluster's answers")?;
    let nonce = random_u64().max(1);
    // Said as no node (0): a hello makes no one a member.
    let me = Peer { node: 0, incarnation };
    let subject = format!("{}.hello", config.prefix);
    let frame = key.seal(&subject, &inbox, &wire::encode(me, &Body::Hello { nonce }));
    client.publish_with_reply(subject, inbox.clone(), frame.into()).await.context("failed to greet the cluster")?;
    let mut members = Members::default();
    let deadline = tokio::time::Instant::now() + JOIN_WAIT;
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, answers.next()).await {
        if let Ok((peer, Body::Announce(a))) = key.open(&inbox, "", &message.payload).and_then(wire::decode)
            && peer.node != 0
            && a.echo == nonce
            && !a.leaving
        {
            members.insert(peer.node, (peer, a));
        }
    }
    Ok(members)
}

/// A node id no member holds, drawn at random so that two nodes joining at once are
/// unlikely to pick the same (a clash is reported when their announcements meet). Below
/// the ids that name shards ([`super::shards::FIRST_SHARD_NODE`]), so never
/// [`Pid::MAX_NODE`] either: a greeting says it is that node, and a node of that id would
/// take greetings for its own frames and answer none.
fn draw_node(members: &Members) -> Option<u16> {
    let ids = 1..super::shards::FIRST_SHARD_NODE;
    let free = ids.clone().filter(|n| !members.contains_key(n)).count();
    if free == 0 {
        return None;
    }
    let pick = (random_u64() % free as u64) as usize;
    ids.filter(|n| !members.contains_key(n)).nth(pick)
}

fn random_u64() -> u64 {
    let mut bytes = [0; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    u64::from_le_bytes(bytes)
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    let host = if host.is_empty() { "node".to_owned() } else { host };
    format!("{host}-{}", std::process::id())
}

/// A member as the actor tracks it.
struct Member {
    peer: Peer,
    announce: Announce,
    heard: Heard,
    /// The sequence of the last announcement taken from it.
    last_seq: u64,
}

/// A probe sent to a node heard announcing that is not a member.
struct Probing {
    nonce: u64,
    incarnation: u64,
    sent: Instant,
}

/// A client's session on this node.
struct Session {
    client: Peer,
    /// Where answers go: `INBOX.reply`; and components come from: `INBOX.code`.
    inbox: String,
    /// The last request's sequence.
    last_seq: u64,
    /// The last answer's sequence.
    sent: u64,
    heard: Heard,
    /// Its run's [`RunId::client`](crate::scheduler::remote::RunId): the processes it
    /// spawns, and theirs, share it.
    run: u64,
    /// The roots of its run here, which it may terminate.
    roots: FxHashSet<Pid>,
}

/// A session offered to a client, not taken up yet.
struct Offer {
    client: Peer,
    inbox: String,
    made: Instant,
}

/// Frames refused since the last heartbeat: logged once a heartbeat with a sample,
/// never once a frame.
#[derive(Default)]
struct Refusals {
    count: u64,
    sample: Option<String>,
    /// Answers to clients whose hello failed authentication, this heartbeat.
    answered: u32,
}

/// The sending half of a link to one node.
struct OutLink {
    /// The incarnation of the receiver it was opened to.
    incarnation: u64,
    next_seq: u64,
    /// Unacknowledged items from the oldest: (sequence, encoded item, what it counts in).
    unacked: VecDeque<(u64, Vec<u8>, Counted)>,
    /// The highest sequence sent (or resent) so far.
    sent: u64,
    /// When an acknowledgement last made progress, or items were last resent.
    progress: Instant,
}

/// Which bound of [`Inner`] an unacknowledged item counts in, until acknowledged.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Counted {
    /// `Inner::backlog`.
    Message,
    /// `Inner::log_backlog`.
    Log,
    Nothing,
}

impl Counted {
    fn of(item: &Item) -> Counted {
        match item {
            Item::Message { .. } => Counted::Message,
            Item::Log { .. } => Counted::Log,
            _ => Counted::Nothing,
        }
    }
}

impl OutLink {
    /// The first sequence the receiver has not acknowledged.
    fn start(&self) -> u64 {
        self.unacked.front().map_or(self.next_seq, |(seq, _, _)| *seq)
    }
}

/// The receiving half of a link from one node.
struct InLink {
    incarnation: u64,
    /// The next sequence to apply.
    expected: u64,
}

/// An acknowledgement owed to a node: since when, and for how many items applied.
struct PendingAck {
    since: Instant,
    items: u64,
}

/// Which owed acknowledgements [`Actor::flush`] sends alone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Acks {
    /// Those past [`ACK_DELAY`] or [`ACK_EVERY`].
    Due,
    /// All of them (the node is leaving).
    All,
}

/// A request waiting for another node's answer.
struct Pending {
    node: u16,
    asked: Asked,
}

/// What a [`Pending`] request asked, and who waits for the answer.
enum Asked {
    /// A spawn, answered by a `SpawnDone`.
    Spawn {
        /// The spawning process's completion; `None` for the embedder's spawn.
        done: Option<Completer>,
        /// The watcher the answer's pid is monitored by (a spawn with `monitor`).
        monitor: Option<Pid>,
        /// The parent the answer's pid is linked to (a spawn with `link`).
        link: Option<Pid>,
        embedded: Option<Arc<RemoteSlot>>,
    },
    /// A termination, answered by a `Done`; `denied`: the denial of a
    /// [`ChildOnly`](crate::scheduler::remote::ChildOnly) request.
    Terminate { done: Completer, denied: Option<String> },
    /// A link of `from` (local) to `to`, answered by a `Done`; `fresh`: `from`'s half was
    /// made by it, and is taken back if it is refused.
    Link { from: Pid, to: Pid, fresh: bool, done: Completer, denied: Option<String> },
    /// An `exit` command's signal, answered by a `Done`.
    Exit { done: Completer, denied: Option<String> },
}

/// Which subscription a frame came on: what it may be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum On {
    /// `PREFIX.node.ME`: link data and acknowledgements, probes and their answers.
    Inbox,
    /// `PREFIX.announce`: heartbeats.
    Announcements,
    /// `PREFIX.hello`: joining nodes.
    Hellos,
    /// `PREFIX.run.hello`: clients asking for a session.
    ClientHellos,
    /// `PREFIX.run.ME`: clients' requests.
    Runs,
}

struct Actor {
    inner: Arc<Inner>,
    client: async_nats::Client,
    me: Peer,
    members: FxHashMap<u16, Member>,
    out: FxHashMap<u16, OutLink>,
    inl: FxHashMap<u16, InLink>,
    /// The next sequence of links dropped when their receiver was lost, by node: a link
    /// to the same incarnation takes up from there, never from 1.
    dropped: FxHashMap<u16, (u64, u64)>,
    /// Probes under way, by node id: one at a time.
    probes: FxHashMap<u16, Probing>,
    /// The last probe answered, by node id: a copy of it is not answered again.
    answered: FxHashMap<u16, u64>,
    /// This node's announcements so far.
    announced: u64,
    /// Local watchers of remote processes, by the processes' node: (watcher, target) →
    /// how many times.
    monitors: FxHashMap<u16, FxHashMap<(Pid, Pid), u32>>,
    pending: FxHashMap<u64, Pending>,
    /// The embedder's remote processes, by pid.
    embedded: FxHashMap<Pid, Arc<RemoteSlot>>,
    /// Clients' sessions, by id.
    sessions: FxHashMap<u64, Session>,
    /// Sessions offered, by id, and their ids oldest first.
    offers: FxHashMap<u64, Offer>,
    offered: VecDeque<u64>,
    refusals: Refusals,
    /// Links with items to send.
    dirty: FxHashSet<u16>,
    /// Acknowledgements not sent yet, by node: the next data frame to the node carries
    /// one, or it goes alone once due.
    acks: FxHashMap<u16, PendingAck>,
    /// Where spawns resolved for other nodes go (`run_spawns`).
    spawner: std::sync::mpsc::Sender<SpawnJob>,
    connected: bool,
}

impl Actor {
    fn new(inner: Arc<Inner>, client: async_nats::Client, spawner: std::sync::mpsc::Sender<SpawnJob>) -> Self {
        let me = Peer { node: inner.node, incarnation: inner.incarnation };
        Actor {
            inner,
            client,
            me,
            members: FxHashMap::default(),
            out: FxHashMap::default(),
            inl: FxHashMap::default(),
            dropped: FxHashMap::default(),
            probes: FxHashMap::default(),
            answered: FxHashMap::default(),
            announced: 0,
            monitors: FxHashMap::default(),
            pending: FxHashMap::default(),
            embedded: FxHashMap::default(),
            sessions: FxHashMap::default(),
            offers: FxHashMap::default(),
            offered: VecDeque::new(),
            refusals: Refusals::default(),
            dirty: FxHashSet::default(),
            acks: FxHashMap::default(),
            spawner,
            connected: true,
        }
    }

    fn subject(&self, node: u16) -> String {
        format!("{}.node.{node}", self.inner.prefix)
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Cmd>) {
        let prefix = self.inner.prefix.clone();
        let subscribe = |subject: String| {
            let client = self.client.clone();
            async move { client.subscribe(subject).await }
        };
        let (Ok(mut inbox), Ok(mut announcements), Ok(mut hellos), Ok(mut code), Ok(mut client_hellos), Ok(mut runs)) = (
            subscribe(self.subject(self.me.node)).await,
            subscribe(format!("{prefix}.announce")).await,
            subscribe(format!("{prefix}.hello")).await,
            subscribe(code::subject(&prefix, self.me.node)).await,
            subscribe(format!("{prefix}.run.hello")).await,
            subscribe(format!("{prefix}.run.{}", self.me.node)).await,
        ) else {
            tracing::error!("the cluster could not subscribe to its subjects; this node takes no work");
            return;
        };
        self.announce(false).await;
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Wakes the loop when the oldest owed acknowledgement falls due. Armed only while
        // disarmed, never moved later: it may fire early (the ack it was armed for rode a
        // data frame) and is armed again then, so a stream of requests and answers
        // registers a timer every `ACK_DELAY` rather than one a frame (a registration
        // earlier than the runtime's next wake-up costs a write to its eventfd).
        let ack_timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(ack_timer);
        let mut ack_armed = false;
        loop {
            if !ack_armed && let Some(since) = self.acks.values().map(|owed| owed.since).min() {
                ack_timer.as_mut().reset((since + ACK_DELAY).into());
                ack_armed = true;
            }
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    if let Some(done) = self.command(command).await {
                        self.announce(true).await;
                        self.flush(Acks::All).await;
                        let _ = self.client.flush().await;
                        let _ = done.send(());
                        break;
                    }
                    // Take what else is queued before flushing: one frame for many items.
                    for _ in 0..DRAIN {
                        let Ok(command) = commands.try_recv() else { break };
                        if let Some(done) = self.command(command).await {
                            self.announce(true).await;
                            self.flush(Acks::All).await;
                            let _ = self.client.flush().await;
                            let _ = done.send(());
                            return;
                        }
                    }
                }
                Some(message) = inbox.next() => {
                    let mut bytes = message.payload.len();
                    self.frame(On::Inbox, &message).await;
                    for _ in 0..DRAIN {
                        if bytes >= DRAIN_BYTES {
                            break;
                        }
                        match inbox.next().now_or_never() {
                            Some(Some(message)) => {
                                bytes += message.payload.len();
                                self.frame(On::Inbox, &message).await;
                            }
                            _ => break,
                        }
                    }
                }
                Some(message) = announcements.next() => self.frame(On::Announcements, &message).await,
                Some(message) = hellos.next() => self.frame(On::Hellos, &message).await,
                Some(message) = client_hellos.next() => self.frame(On::ClientHellos, &message).await,
                Some(message) = runs.next() => self.frame(On::Runs, &message).await,
                Some(message) = code.next() => self.serve_code(message).await,
                _ = heartbeat.tick() => self.tick().await,
                // Owed acknowledgements no data frame took along go alone once due.
                () = &mut ack_timer, if ack_armed => ack_armed = false,
            }
            self.flush(Acks::Due).await;
        }
    }

    /// Carries out one command; `Some` to leave.
    async fn command(&mut self, command: Cmd) -> Option<std::sync::mpsc::Sender<()>> {
        if let Cmd::Monitor { .. }
        | Cmd::Terminate { .. }
        | Cmd::Link { .. }
        | Cmd::Signal { done: Some(_), .. }
        | Cmd::Spawn { done: Some(_), .. } = command
        {
            self.inner.queued.fetch_sub(1, Ordering::AcqRel);
        }
        match command {
            Cmd::Item { node, item } => self.queue(node, item),
            Cmd::Reply { session, item } => self.reply(session, Some(item)).await,
            Cmd::Line(Item::Log { pid, scope, source, message }) => {
                self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
                // Replied to here, not queued again: the process's exit, queued after
                // this line, must reach the client after it.
                if let Some((session, item)) = self.line(pid, scope, source, message) {
                    self.reply(session, Some(item)).await;
                }
            }
            Cmd::Line(_) => {}
            Cmd::Monitor { watcher, target } => {
                let node = target.node();
                if self.members.contains_key(&node) {
                    *self.monitors.entry(node).or_default().entry((watcher, target)).or_default() += 1;
                    self.queue(node, Item::Monitor { watcher, target });
                } else {
                    self.exit_to(watcher, target, self.lost(node));
                }
            }
            Cmd::Terminate { by, target, child_only, done } => {
                let node = target.node();
                if !self.members.contains_key(&node) {
                    if let Some(done) = done {
                        done.complete(Err(self.noconnection(node)));
                    }
                    return None;
                }
                let child_only_asked = child_only.is_some();
                let token = match done {
                    Some(done) => self.ask(node, Asked::Terminate { done, denied: child_only }),
                    None => 0,
                };
                self.queue(node, Item::Terminate { by, target, token, child_only: child_only_asked });
            }
            Cmd::Link { from, target, fresh, child_only, done } => {
                let node = target.node();
                if !self.members.contains_key(&node) {
                    // As a link to a process that is gone: its signal says why.
                    self.lost_link(from, target, self.lost(node));
                    done.complete(Ok(Payload::empty()));
                    return None;
                }
                let child_only_asked = child_only.is_some();
                let token = self.ask(node, Asked::Link { from, to: target, fresh, done, denied: child_only });
                self.queue(node, Item::Link { from, to: target, token, child_only: child_only_asked });
            }
            Cmd::Signal { from, target, signal, done } => {
                let node = target.node();
                if !self.members.contains_key(&node) {
                    // A linked process's end, to a node that is gone: its processes
                    // heard `noconnection` from this node's when it went.
                    if let Some((done, _)) = done {
                        done.complete(Err(self.noconnection(node)));
                    }
                    return None;
                }
                let (token, child_only) = match done {
                    Some((done, denied)) => {
                        let child_only = denied.is_some();
                        (self.ask(node, Asked::Exit { done, denied }), child_only)
                    }
                    None => (0, false),
                };
                self.queue(node, Item::Signal { from, to: target, signal, token, child_only });
            }
            Cmd::Spawn { node, spawn, token, done } => {
                let embedded = if done.is_none() { self.inner.embedded.lock().remove(&token) } else { None };
                if !self.members.contains_key(&node) {
                    let error = format!("spawn failed: {}", self.noconnection(node));
                    if let Some(done) = done {
                        done.complete(Err(error.clone()));
                    }
                    if let Some(slot) = embedded {
                        slot.set(Err(ExitReason::Error(error)));
                    }
                    return None;
                }
                let monitor = spawn.monitor.then_some(spawn.parent);
                let link = spawn.link.then_some(spawn.parent);
                self.pending.insert(token, Pending { node, asked: Asked::Spawn { done, monitor, link, embedded } });
                self.queue(node, Item::Spawn { token, spawn });
            }
            Cmd::Serve => self.announce(false).await,
            Cmd::Connection(connected) => {
                self.connected = connected;
                if connected {
                    // Everyone gets a fresh allowance: while this node was cut off it
                    // heard no one, which says nothing about them.
                    let now = Instant::now();
                    for member in self.members.values_mut() {
                        member.heard.again(now);
                    }
                    for session in self.sessions.values_mut() {
                        session.heard.again(now);
                    }
                    self.resend_all(now);
                    self.announce(false).await;
                }
            }
            Cmd::StopRun { reason, grace } => {
                let nodes: Vec<u16> = self.members.keys().copied().collect();
                for node in nodes {
                    self.queue(node, Item::StopRun { reason: reason.clone(), grace, scope: 0 });
                }
            }
            Cmd::Leave(done) => return Some(done),
        }
        None
    }

    /// Records a request to `node` that waits for its answer; the token to ask with.
    fn ask(&mut self, node: u16, asked: Asked) -> u64 {
        let token = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        self.pending.insert(token, Pending { node, asked });
        token
    }

    async fn publish(&self, subject: String, body: &Body) {
        let frame = self.inner.key.seal(&subject, "", &wire::encode(self.me, body));
        // Fails only once the client is closed; what it drops, the links resend.
        if let Err(error) = self.client.publish(subject, frame.into()).await {
            tracing::debug!(%error, "failed to publish to the cluster");
        }
    }

    /// Counts a refused frame, and keeps a sample of why for the next heartbeat's line.
    fn refuse(&mut self, why: impl std::fmt::Display) {
        self.inner.counters.frames_refused.fetch_add(1, Ordering::Relaxed);
        self.refusals.count += 1;
        if self.refusals.sample.is_none() {
            self.refusals.sample = Some(why.to_string());
        }
    }

    /// Counts a frame or item refused as a repeat of one already taken: a
    /// retransmission, or a copy published again.
    fn repeated(&self) {
        self.inner.counters.frames_repeated.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `peer` is the member of its node id.
    fn is_member(&self, peer: Peer) -> bool {
        self.members.get(&peer.node).is_some_and(|m| m.peer == peer)
    }

    /// Handles one frame from NATS that came `on` a subscription. What a frame's sender
    /// could not have sent there is refused before its MAC is checked, so junk costs a
    /// varint or two, not a MAC over a megabyte.
    async fn frame(&mut self, on: On, message: &async_nats::Message) {
        let subject = message.subject.as_str();
        let reply = message.reply.as_ref().map_or("", |r| r.as_str());
        let payload = &message.payload[..];
        let (peer, kind) = match wire::claimed_sender(payload) {
            Ok(claimed) => claimed,
            Err(error) => return self.refuse(format_args!("on `{subject}`: {error}")),
        };
        let small = matches!(kind, wire::ANNOUNCE | wire::HELLO | wire::PROBE | wire::CLIENT_HELLO);
        if small && payload.len() > MAX_SMALL_FRAME {
            return self.refuse(format_args!("on `{subject}`: a frame of kind {kind} of {} bytes", payload.len()));
        }
        let plausible = match on {
            On::Inbox => {
                peer.node != 0
                    && (kind == wire::PROBE
                        || (kind == wire::ANNOUNCE
                            && self.probes.get(&peer.node).is_some_and(|p| p.incarnation == peer.incarnation))
                        || ((kind == wire::DATA || kind == wire::ACK) && self.is_member(peer)))
            }
            On::Announcements => peer.node != 0 && kind == wire::ANNOUNCE,
            On::Hellos => peer.node == 0 && kind == wire::HELLO,
            On::ClientHellos => peer.node == 0 && kind == wire::CLIENT_HELLO,
            On::Runs => peer.node == 0 && kind == wire::RUN,
        };
        if peer == self.me {
            // This node's own, as the server delivers what it publishes to its own
            // subscriptions too.
            return;
        }
        if !plausible {
            if on == On::Inbox && (kind == wire::DATA || kind == wire::ACK) {
                return self.refuse(format_args!(
                    "on `{subject}`: link data from node {} (incarnation {:x}), which is not a member",
                    peer.node, peer.incarnation
                ));
            }
            return self.refuse(format_args!("on `{subject}`: a frame of kind {kind} from node {}", peer.node));
        }
        let body = match self.inner.key.open(subject, reply, payload).and_then(wire::decode) {
            Ok((_, body)) => body,
            Err(error) => {
                if on == On::ClientHellos {
                    self.refuse_client(payload).await;
                }
                return self.refuse(format_args!("on `{subject}` from node {}: {error}", peer.node));
            }
        };
        if peer.node == self.me.node {
            if on == On::Announcements {
                tracing::error!(
                    node = peer.node,
                    "another node announces this node's id: pids of the two are confused"
                );
            }
            return self.refuse(format_args!("on `{subject}`: a frame from this node's id, another incarnation"));
        }
        match body {
            Body::Announce(announce) if on == On::Inbox => self.answered_probe(peer, announce),
            Body::Announce(announce) => self.announced_by(peer, announce).await,
            Body::Probe { nonce, link_start } => self.probed(peer, nonce, link_start).await,
            Body::Hello { nonce } => self.hello(reply, nonce).await,
            Body::Data { to_incarnation, first, ack, items } => {
                if to_incarnation != self.me.incarnation {
                    return self.repeated();
                }
                if ack != 0 {
                    self.ack(peer, to_incarnation, ack);
                }
                self.data(peer, first, items);
            }
            Body::Ack { to_incarnation, upto } => self.ack(peer, to_incarnation, upto),
            Body::ClientHello { nonce, inbox } => self.client_hello(peer, nonce, inbox).await,
            Body::Run { session, seq, request } => self.run_request(peer, session, seq, request).await,
            Body::CodeRequest { .. } | Body::CodeChunk { .. } | Body::Welcome { .. } | Body::Reply { .. } => {
                self.refuse(format_args!("on `{subject}`: a frame of another subject"))
            }
        }
    }

    /// The heartbeat: announce, judge the silent, resend what waits too long, and say
    /// what was refused since the last.
    async fn tick(&mut self) {
        self.announce(false).await;
        let now = Instant::now();
        if self.connected {
            let silent: Vec<u16> =
                self.members.iter().filter(|(_, m)| m.heard.is_lost(now)).map(|(&node, _)| node).collect();
            for node in silent {
                self.lose(node, "missed its heartbeats");
            }
            let gone: Vec<u64> =
                self.sessions.iter().filter(|(_, s)| s.heard.is_lost(now)).map(|(&id, _)| id).collect();
            for id in gone {
                self.end_session(id, "its client is lost");
            }
        }
        self.probes.retain(|_, p| now.duration_since(p.sent) < LOSS_AFTER);
        while let Some(id) = self.offered.front().copied() {
            match self.offers.get(&id) {
                Some(offer) if now.duration_since(offer.made) < OFFER_FOR => break,
                _ => {
                    self.offers.remove(&id);
                    self.offered.pop_front();
                }
            }
        }
        for (&node, link) in &mut self.out {
            if !link.unacked.is_empty() && now.duration_since(link.progress) > RETRANSMIT_AFTER {
                link.resend(&self.inner, now);
                self.dirty.insert(node);
            }
        }
        let refusals = std::mem::take(&mut self.refusals);
        if refusals.count > 0 {
            tracing::warn!(
                count = refusals.count,
                sample = refusals.sample.as_deref().unwrap_or(""),
                "cluster frames refused since the last heartbeat ({} in all)",
                self.inner.counters.frames_refused.load(Ordering::Relaxed)
            );
        }
        self.publish_view();
    }
}
