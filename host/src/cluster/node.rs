//! The cluster's thread: one tokio task owns the links and the membership, fed by the
//! scheduler's workers and the embedder through a channel, by NATS subscriptions, and
//! by a heartbeat timer. No lock guards the links: only this task touches them. Spawns
//! for other nodes run on a thread of their own (`run_spawns`).

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
use super::wire::{self, Announce, Body, Item, Key, Peer};
use super::{
    Cluster, ClusterConfig, Counters, HEARTBEAT, Inner, JOIN_WAIT, LOSS_AFTER, NodeInfo, RETRANSMIT_AFTER, RemoteSlot,
};
use crate::handler::{Completer, Factory};
use crate::scheduler::Handle;
use crate::scheduler::remote::{Notify, RemoteSpawn};
use crate::{Payload, Pid};

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

/// What the rest of the node asks the cluster's thread to do.
pub(super) enum Cmd {
    /// Queue `item` on the link to `node`.
    Item {
        node: u16,
        item: Item,
    },
    Monitor {
        watcher: Pid,
        target: Pid,
    },
    Terminate {
        target: Pid,
        done: Option<Completer>,
    },
    /// `done`: the spawning process's completer; `None` for the embedder's spawn
    /// (`Inner::embedded` under `token`).
    Spawn {
        node: u16,
        spawn: RemoteSpawn,
        token: u64,
        done: Option<Completer>,
    },
    /// A scheduler now serves, or a component was offered: announce it.
    Serve,
    Connection(bool),
    /// Stop this node's run on every other node (`Cluster::stop_run`).
    StopRun {
        reason: String,
        grace: Duration,
    },
    Leave(std::sync::mpsc::Sender<()>),
}

/// A spawn for another node, resolved to a factory, for the spawning thread.
struct SpawnJob {
    handle: Handle,
    factory: Arc<dyn Factory>,
    kind: Arc<str>,
    spawn: RemoteSpawn,
    notify: Option<Notify>,
    /// The node that asked, and its token for the answer.
    node: u16,
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
        let SpawnJob { handle, factory, kind, mut spawn, notify, node, token } = job;
        let answer = |result| {
            let _ = commands.send(Cmd::Item { node, item: Item::SpawnDone { token, result } });
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

/// Connects, joins and starts the thread.
pub(super) fn start(config: ClusterConfig) -> anyhow::Result<Cluster> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("wasmproc-cluster")
        .build()
        .context("failed to start the cluster's runtime")?;
    let (commands, receiver) = mpsc::unbounded_channel();
    let events = commands.clone();
    let answers = commands.clone();
    let (client, members) = runtime.block_on(async {
        let client = connect(&config, Some(events)).await?;
        let members = discover(&client, &config).await?;
        Ok::<_, anyhow::Error>((client, members))
    })?;
    let name = config.name.clone().unwrap_or_else(default_name);
    if let Some(same) = members.values().find(|(_, a)| a.name == name) {
        bail!("a node named `{name}` is already in the cluster (node {}): give this one another `--name`", same.0.node);
    }
    let node = draw_node(&members).context("every node id of the cluster is taken")?;
    let incarnation = random_u64().max(1);
    let max_payload = client.server_info().max_payload;
    let inner = Arc::new(Inner {
        node,
        incarnation,
        name,
        key: Key::new(&config.secret),
        prefix: config.prefix.clone(),
        placement: config.placement,
        accepts: config.accepts,
        commands,
        alive: (0..=usize::from(Pid::MAX_NODE)).map(|_| AtomicU64::new(0)).collect(),
        view: RwLock::new(Vec::new()),
        placed: (0..=usize::from(Pid::MAX_NODE)).map(|_| AtomicU64::new(0)).collect(),
        backlog: AtomicUsize::new(0),
        log_backlog: AtomicUsize::new(0),
        grace: config.grace,
        lines: Default::default(),
        // Room for the frame's header and one item's own fields.
        max_item: max_payload.saturating_sub(1024),
        counters: Counters::default(),
        handle: Default::default(),
        loader: Default::default(),
        code: Default::default(),
        names: Default::default(),
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
        actor.heard(peer, announce, now);
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
    Ok(Cluster { inner, thread: Arc::new(Mutex::new(Some(thread))) })
}

/// Lists the nodes without joining.
pub(super) fn list(config: ClusterConfig) -> anyhow::Result<Vec<NodeInfo>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the cluster's runtime")?;
    runtime.block_on(async {
        let client = connect(&config, None).await?;
        // Past one heartbeat, so a node that missed the hello is heard all the same.
        let members = discover_for(&client, &config, HEARTBEAT + JOIN_WAIT).await?;
        let mut nodes: Vec<NodeInfo> = members
            .into_values()
            .map(|(peer, a)| NodeInfo {
                id: peer.node,
                name: a.name,
                load: a.load,
                accepts: a.accepts,
                components: a.components,
                component_names: a.names,
            })
            .collect();
        nodes.sort_by_key(|n| n.id);
        Ok(nodes)
    })
}

async fn connect(
    config: &ClusterConfig,
    events: Option<mpsc::UnboundedSender<Cmd>>,
) -> anyhow::Result<async_nats::Client> {
    let mut options = async_nats::ConnectOptions::new()
        .name("wasmproc")
        .connection_timeout(Duration::from_secs(5))
        // Reconnect for ever, quickly: the links resend what a reconnection lost.
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| Duration::from_millis((50 * attempts as u64).min(1000)))
        .subscription_capacity(65_536);
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(events) = events {
        options = options.event_callback(move |event| {
            let events = events.clone();
            async move {
                match event {
                    async_nats::Event::Connected => drop(events.send(Cmd::Connection(true))),
                    async_nats::Event::Disconnected => drop(events.send(Cmd::Connection(false))),
                    other => tracing::debug!(event = %other, "NATS client event"),
                }
            }
        });
    }
    tokio::time::timeout(Duration::from_secs(5), options.connect(config.url.as_str()))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from the NATS server at `{}` within 5 s", config.url))?
        .with_context(|| format!("failed to connect to the NATS server at `{}`", config.url))
}

type Members = FxHashMap<u16, (Peer, Announce)>;

async fn discover(client: &async_nats::Client, config: &ClusterConfig) -> anyhow::Result<Members> {
    discover_for(client, config, JOIN_WAIT).await
}

/// Asks every node to announce itself and gathers the announcements for `wait`.
async fn discover_for(client: &async_nats::Client, config: &ClusterConfig, wait: Duration) -> anyhow::Result<Members> {
    let key = Key::new(&config.secret);
    let mut announcements = client
        .subscribe(format!("{}.announce", config.prefix))
        .await
        .context("failed to subscribe to the cluster's announcements")?;
    // Said as node MAX_NODE with a fresh incarnation: a hello is answered by all, and
    // makes no one a member.
    let me = Peer { node: Pid::MAX_NODE, incarnation: random_u64() };
    client
        .publish(format!("{}.hello", config.prefix), key.seal(&wire::encode(me, &Body::Hello)).into())
        .await
        .context("failed to greet the cluster")?;
    let mut members = Members::default();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, announcements.next()).await {
        if let Ok((peer, Body::Announce(a))) = key.open(&message.payload).and_then(wire::decode)
            && !a.leaving
        {
            members.insert(peer.node, (peer, a));
        }
    }
    Ok(members)
}

/// A node id no member holds, drawn at random so that two nodes joining at once are
/// unlikely to pick the same (a clash is reported when their announcements meet). Never
/// [`Pid::MAX_NODE`]: a greeting says it is that node, and a node of that id would take
/// greetings for its own frames and answer none.
fn draw_node(members: &Members) -> Option<u16> {
    let free = (1..Pid::MAX_NODE).filter(|n| !members.contains_key(n)).count();
    if free == 0 {
        return None;
    }
    let pick = (random_u64() % free as u64) as usize;
    (1..Pid::MAX_NODE).filter(|n| !members.contains_key(n)).nth(pick)
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
    last_seen: Instant,
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

/// The receiving half of a link from one node.
struct InLink {
    incarnation: u64,
    /// The next sequence to apply.
    expected: u64,
}

/// An acknowledgement owed to a node: since when, and for how many items applied.
struct Owed {
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

/// A spawn or termination waiting for another node's answer.
struct Pending {
    node: u16,
    done: Option<Completer>,
    /// The watcher the answer's pid is monitored by (a spawn with `monitor`).
    monitor: Option<Pid>,
    embedded: Option<Arc<RemoteSlot>>,
}

struct Actor {
    inner: Arc<Inner>,
    client: async_nats::Client,
    me: Peer,
    members: FxHashMap<u16, Member>,
    out: FxHashMap<u16, OutLink>,
    inl: FxHashMap<u16, InLink>,
    /// Local watchers of remote processes, by the processes' node: (watcher, target) →
    /// how many times.
    monitors: FxHashMap<u16, FxHashMap<(Pid, Pid), u32>>,
    pending: FxHashMap<u64, Pending>,
    /// The embedder's remote processes, by pid.
    embedded: FxHashMap<Pid, Arc<RemoteSlot>>,
    /// Links with items to send.
    dirty: FxHashSet<u16>,
    /// Acknowledgements not sent yet, by node: the next data frame to the node carries
    /// one, or it goes alone once due.
    acks: FxHashMap<u16, Owed>,
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
            monitors: FxHashMap::default(),
            pending: FxHashMap::default(),
            embedded: FxHashMap::default(),
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
        let (Ok(mut inbox), Ok(mut announcements), Ok(mut hellos), Ok(mut code)) = (
            subscribe(self.subject(self.me.node)).await,
            subscribe(format!("{prefix}.announce")).await,
            subscribe(format!("{prefix}.hello")).await,
            subscribe(code::subject(&prefix, self.me.node)).await,
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
                    self.frame(&message.payload);
                    for _ in 0..DRAIN {
                        match inbox.next().now_or_never() {
                            Some(Some(message)) => self.frame(&message.payload),
                            _ => break,
                        }
                    }
                }
                Some(message) = announcements.next() => self.frame(&message.payload),
                Some(message) = hellos.next() => {
                    if self.inner.key.open(&message.payload).is_ok() {
                        self.announce(false).await;
                    }
                }
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
        match command {
            Cmd::Item { node, item } => self.queue(node, item),
            Cmd::Monitor { watcher, target } => {
                let node = target.node();
                if self.members.contains_key(&node) {
                    *self.monitors.entry(node).or_default().entry((watcher, target)).or_default() += 1;
                    self.queue(node, Item::Monitor { watcher, target });
                } else {
                    self.exit_to(watcher, target, Err(noconnection(node)));
                }
            }
            Cmd::Terminate { target, done } => {
                let node = target.node();
                if !self.members.contains_key(&node) {
                    if let Some(done) = done {
                        done.complete(Err(noconnection(node)));
                    }
                    return None;
                }
                let token = match done {
                    Some(done) => {
                        let token = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
                        self.pending.insert(token, Pending { node, done: Some(done), monitor: None, embedded: None });
                        token
                    }
                    None => 0,
                };
                self.queue(node, Item::Terminate { target, token });
            }
            Cmd::Spawn { node, spawn, token, done } => {
                let embedded = if done.is_none() { self.inner.embedded.lock().remove(&token) } else { None };
                if !self.members.contains_key(&node) {
                    let error = format!("spawn failed: {}", noconnection(node));
                    if let Some(done) = done {
                        done.complete(Err(error.clone()));
                    }
                    if let Some(slot) = embedded {
                        slot.set(Err(error));
                    }
                    return None;
                }
                let monitor = spawn.monitor.then_some(spawn.parent);
                self.pending.insert(token, Pending { node, done, monitor, embedded });
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
                        member.last_seen = now;
                    }
                    self.resend_all(now);
                    self.announce(false).await;
                }
            }
            Cmd::StopRun { reason, grace } => {
                let nodes: Vec<u16> = self.members.keys().copied().collect();
                for node in nodes {
                    self.queue(node, Item::StopRun { reason: reason.clone(), grace });
                }
            }
            Cmd::Leave(done) => return Some(done),
        }
        None
    }

    /// Appends `item` to the link to `node`.
    fn queue(&mut self, node: u16, item: Item) {
        let Some(member) = self.members.get(&node) else {
            return self.undeliverable(node, item);
        };
        let incarnation = member.peer.incarnation;
        let link = self.out.entry(node).or_insert_with(|| OutLink {
            incarnation,
            next_seq: 1,
            unacked: VecDeque::new(),
            sent: 0,
            progress: Instant::now(),
        });
        let seq = link.next_seq;
        link.next_seq += 1;
        let counted = Counted::of(&item);
        if link.unacked.is_empty() {
            link.progress = Instant::now();
        }
        link.unacked.push_back((seq, wire::encode_item(&item), counted));
        self.dirty.insert(node);
    }

    /// What becomes of an item for a node that is not (or no longer) a member.
    fn undeliverable(&mut self, node: u16, item: Item) {
        match item {
            Item::Message { .. } => {
                self.inner.backlog.fetch_sub(1, Ordering::AcqRel);
                self.inner.counters.messages_lost.fetch_add(1, Ordering::Relaxed);
            }
            Item::Monitor { watcher, target } => self.exit_to(watcher, target, Err(noconnection(node))),
            // The other side is gone: nobody waits for these.
            Item::Exit { .. } | Item::TerminateDone { .. } | Item::SpawnDone { .. } => {}
            Item::Terminate { .. } | Item::Spawn { .. } | Item::StopRun { .. } => {}
            Item::Log { .. } => {
                self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Sends what each dirty link has not sent yet, with the acknowledgement owed to its
    /// node riding in every frame, and alone the owed acknowledgements `acks` says.
    async fn flush(&mut self, acks: Acks) {
        for node in std::mem::take(&mut self.dirty) {
            let Some(link) = self.out.get_mut(&node) else { continue };
            // What this node has applied of the receiver's link to it, if that link is
            // from the incarnation this one goes to (the receiver checks the frame's
            // `to_incarnation`, so an ack from another incarnation must go alone).
            let ack = match self.inl.get(&node) {
                Some(inl) if inl.incarnation == link.incarnation => inl.expected - 1,
                _ => 0,
            };
            let mut frames = Vec::new();
            let start = link.unacked.partition_point(|(seq, _, _)| *seq <= link.sent);
            let mut batch: Vec<Vec<u8>> = Vec::new();
            let mut first = 0;
            let mut bytes = 0;
            for (seq, item, _) in link.unacked.iter().skip(start) {
                if batch.is_empty() {
                    first = *seq;
                }
                bytes += item.len();
                batch.push(item.clone());
                if batch.len() >= BATCH_ITEMS || bytes >= BATCH_BYTES {
                    frames.push(Body::Data {
                        to_incarnation: link.incarnation,
                        first,
                        ack,
                        items: std::mem::take(&mut batch),
                    });
                    bytes = 0;
                }
            }
            if !batch.is_empty() {
                frames.push(Body::Data { to_incarnation: link.incarnation, first, ack, items: batch });
            }
            link.sent = link.next_seq - 1;
            if ack != 0 && !frames.is_empty() {
                self.acks.remove(&node);
            }
            let subject = self.subject(node);
            for body in frames {
                self.publish(subject.clone(), &body).await;
            }
        }
        if self.acks.is_empty() {
            return;
        }
        let now = Instant::now();
        let due: Vec<u16> = self
            .acks
            .iter()
            .filter(|(_, owed)| {
                acks == Acks::All || owed.items >= ACK_EVERY || now.duration_since(owed.since) >= ACK_DELAY
            })
            .map(|(&node, _)| node)
            .collect();
        for node in due {
            self.acks.remove(&node);
            let Some(link) = self.inl.get(&node) else { continue };
            let body = Body::Ack { to_incarnation: link.incarnation, upto: link.expected - 1 };
            self.publish(self.subject(node), &body).await;
        }
    }

    async fn publish(&self, subject: String, body: &Body) {
        let frame = self.inner.key.seal(&wire::encode(self.me, body));
        // Fails only once the client is closed; what it drops, the links resend.
        if let Err(error) = self.client.publish(subject, frame.into()).await {
            tracing::debug!(%error, "failed to publish to the cluster");
        }
    }

    async fn announce(&self, leaving: bool) {
        let handle = self.inner.handle.get();
        let announce = Announce {
            name: self.inner.name.clone(),
            load: handle.map_or(0, |h| h.live() as u64),
            accepts: self.inner.accepts && handle.is_some(),
            components: self.components(),
            names: self.component_names(),
            leaving,
        };
        self.publish(format!("{}.announce", self.inner.prefix), &Body::Announce(announce)).await;
    }

    fn components(&self) -> Vec<String> {
        let mut components: Vec<String> = self.inner.code.read().keys().cloned().collect();
        if let Some(handle) = self.inner.handle.get() {
            components.extend(handle.kinds().into_iter().filter_map(|(_, identity)| identity));
        }
        components.sort();
        components.dedup();
        components
    }

    /// The names of the components of [`Actor::components`] this node knows: a
    /// registered kind's name, or the file name it was offered or fetched with.
    fn component_names(&self) -> Vec<(String, String)> {
        let code = self.inner.code.read();
        let mut names: Vec<(String, String)> = self
            .inner
            .names
            .read()
            .iter()
            .filter(|(hash, _)| code.contains_key(*hash))
            .map(|(hash, name)| (hash.clone(), name.clone()))
            .collect();
        drop(code);
        if let Some(handle) = self.inner.handle.get() {
            for (kind, identity) in handle.kinds() {
                if let Some(hash) = identity
                    && !names.iter().any(|(known, _)| *known == hash)
                {
                    names.push((hash, kind));
                }
            }
        }
        names.sort();
        names
    }

    /// Handles one frame from NATS.
    fn frame(&mut self, payload: &[u8]) {
        let decoded = self.inner.key.open(payload).and_then(wire::decode);
        let (peer, body) = match decoded {
            Ok(frame) => frame,
            Err(error) => {
                self.inner.counters.frames_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "a cluster frame was refused");
                return;
            }
        };
        if peer.node == self.me.node {
            if peer.incarnation != self.me.incarnation && matches!(body, Body::Announce(_)) {
                tracing::error!(
                    node = peer.node,
                    "another node announces this node's id: pids of the two are confused"
                );
            }
            return;
        }
        match body {
            Body::Announce(announce) => {
                if announce.leaving {
                    if self.members.get(&peer.node).is_some_and(|m| m.peer == peer) {
                        self.lose(peer.node, LEFT);
                    }
                } else {
                    self.heard(peer, announce, Instant::now());
                    self.publish_view();
                }
            }
            Body::Data { to_incarnation, first, ack, items } => {
                if to_incarnation == self.me.incarnation {
                    if ack != 0 {
                        self.ack(peer, to_incarnation, ack);
                    }
                    self.data(peer, first, items);
                }
            }
            Body::Ack { to_incarnation, upto } => self.ack(peer, to_incarnation, upto),
            Body::Hello | Body::CodeRequest { .. } | Body::CodeChunk { .. } => {}
        }
    }

    /// Takes in a member's announcement.
    fn heard(&mut self, peer: Peer, announce: Announce, now: Instant) {
        if let Some(member) = self.members.get(&peer.node)
            && member.peer.incarnation != peer.incarnation
        {
            // The node restarted under the same id: its old processes are gone.
            self.lose(peer.node, "restarted");
        }
        self.inner.placed[usize::from(peer.node)].store(0, Ordering::Relaxed);
        self.inner.alive[usize::from(peer.node)].store(peer.incarnation, Ordering::Release);
        self.members.insert(peer.node, Member { peer, announce, last_seen: now });
    }

    fn publish_view(&self) {
        let handle = self.inner.handle.get();
        let mut view: Vec<NodeInfo> = self
            .members
            .values()
            .map(|m| NodeInfo {
                id: m.peer.node,
                name: m.announce.name.clone(),
                load: m.announce.load,
                accepts: m.announce.accepts,
                components: m.announce.components.clone(),
                component_names: m.announce.names.clone(),
            })
            .collect();
        view.push(NodeInfo {
            id: self.me.node,
            name: self.inner.name.clone(),
            load: handle.map_or(0, |h| h.live() as u64),
            accepts: self.inner.accepts && handle.is_some(),
            components: self.components(),
            component_names: self.component_names(),
        });
        *self.inner.view.write() = view;
    }

    /// Applies the items of a data frame that come next in order.
    fn data(&mut self, peer: Peer, first: u64, items: Vec<Vec<u8>>) {
        let link = self.inl.entry(peer.node).or_insert(InLink { incarnation: peer.incarnation, expected: 1 });
        if link.incarnation != peer.incarnation {
            *link = InLink { incarnation: peer.incarnation, expected: 1 };
        }
        let mut expected = link.expected;
        let before = expected;
        for (i, bytes) in items.into_iter().enumerate() {
            let seq = first.saturating_add(i as u64);
            if seq < expected {
                continue;
            }
            if seq > expected {
                // A gap: what is missing comes again, and this with it.
                break;
            }
            let applied = match wire::decode_item(&bytes) {
                Ok(item) => self.apply(peer, item),
                Err(error) => {
                    self.inner.counters.frames_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%error, node = peer.node, "a cluster item was refused");
                    true
                }
            };
            if !applied {
                // Not taken now (a full mailbox): the sender sends it again, and what
                // follows it, so the order holds.
                break;
            }
            expected += 1;
        }
        if let Some(link) = self.inl.get_mut(&peer.node) {
            link.expected = expected;
        }
        // Owed even when nothing was applied (a repeat, a gap): the sender learns where
        // this side stands.
        let owed = self.acks.entry(peer.node).or_insert_with(|| Owed { since: Instant::now(), items: 0 });
        owed.items += expected - before;
    }

    fn ack(&mut self, peer: Peer, to_incarnation: u64, upto: u64) {
        let Some(link) = self.out.get_mut(&peer.node) else { return };
        if to_incarnation != self.me.incarnation || link.incarnation != peer.incarnation {
            return;
        }
        let (mut messages, mut lines) = (0, 0);
        let mut acked = false;
        while link.unacked.front().is_some_and(|(seq, _, _)| *seq <= upto) {
            acked = true;
            match link.unacked.pop_front() {
                Some((_, _, Counted::Message)) => messages += 1,
                Some((_, _, Counted::Log)) => lines += 1,
                _ => {}
            }
        }
        self.inner.log_backlog.fetch_sub(lines, Ordering::AcqRel);
        link.sent = link.sent.max(upto);
        // Only progress delays a resend: a receiver that keeps acknowledging the same
        // item is waiting for something it lost.
        if acked {
            link.progress = Instant::now();
        }
        self.inner.backlog.fetch_sub(messages, Ordering::AcqRel);
    }

    /// Carries out one item another node sent. False if it cannot be taken yet: a
    /// message for a full mailbox waits on the link, as a local sender would retry.
    fn apply(&mut self, peer: Peer, item: Item) -> bool {
        let handle = self.inner.handle.get().cloned();
        match item {
            Item::Message { from, to, topic, body } => {
                let counter = match handle.map(|h| h.deliver_remote(from, to, topic, body)) {
                    Some(Ok(())) => &self.inner.counters.messages_delivered,
                    Some(Err(crate::error::SendError::MailboxFull { .. })) => return false,
                    Some(Err(error)) => {
                        tracing::debug!(%error, %from, "a message from another node was refused");
                        &self.inner.counters.messages_refused
                    }
                    None => &self.inner.counters.messages_refused,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Item::Monitor { watcher, target } => {
                let notify = self.notifier(peer.node, move |pid, result| Item::Exit { watcher, pid, result });
                let refused = match &handle {
                    Some(handle) => handle.watch(target, notify).is_err(),
                    None => true,
                };
                if refused {
                    self.queue(peer.node, Item::Exit { watcher, pid: target, result: Err("noproc".to_owned()) });
                }
            }
            Item::Exit { watcher, pid, result } => {
                if let Some(watched) = self.monitors.get_mut(&peer.node)
                    && let Some(count) = watched.get_mut(&(watcher, pid))
                {
                    *count -= 1;
                    if *count == 0 {
                        watched.remove(&(watcher, pid));
                    }
                }
                self.exit_to(watcher, pid, result);
            }
            Item::Terminate { target, token } => {
                let notify = self.notifier(peer.node, move |_, _| Item::TerminateDone { token, result: Ok(()) });
                let result = match &handle {
                    Some(handle) => handle.terminate_watched(target, notify).map_err(|(error, _)| error.to_string()),
                    None => Err(format!("no process {target}: node {} runs no scheduler", self.me.node)),
                };
                if let Err(error) = result
                    && token != 0
                {
                    self.queue(peer.node, Item::TerminateDone { token, result: Err(error) });
                }
            }
            Item::TerminateDone { token, result } => {
                if let Some(pending) = self.pending.remove(&token)
                    && let Some(done) = pending.done
                {
                    done.complete(result.map(|()| Payload::empty()));
                }
            }
            Item::Spawn { token, spawn } => self.spawn_here(peer, token, spawn),
            Item::StopRun { reason, grace } => self.end_run_of(peer.node, &reason, grace),
            // A node speaks only for its own processes.
            Item::Log { pid, .. } if pid.node() != peer.node => {
                self.inner.counters.frames_refused.fetch_add(1, Ordering::Relaxed);
            }
            Item::Log { pid, source, message } => match self.inner.lines.get() {
                Some(sink) => sink(pid, &source, &message),
                None => tracing::info!(target: "wasmproc::guest", %pid, source = %source, message = %message),
            },
            Item::SpawnDone { token, result } => {
                let Some(pending) = self.pending.remove(&token) else { return true };
                if let (Ok(child), Some(watcher)) = (&result, pending.monitor) {
                    *self.monitors.entry(pending.node).or_default().entry((watcher, *child)).or_default() += 1;
                }
                if let Some(slot) = pending.embedded {
                    match &result {
                        Ok(child) => {
                            *slot.pid.lock() = Some(*child);
                            self.embedded.insert(*child, slot);
                        }
                        Err(error) => slot.set(Err(error.clone())),
                    }
                }
                if let Some(done) = pending.done {
                    done.complete(result.map(|child| Payload::u64(child.as_u64())));
                }
            }
        }
        true
    }

    /// A notifier that queues the item `make` builds for node `node`, from any thread.
    fn notifier(
        &self,
        node: u16,
        make: impl FnOnce(Pid, Result<Payload, String>) -> Item + Send + 'static,
    ) -> crate::scheduler::remote::Notify {
        let commands = self.inner.commands.clone();
        Box::new(move |pid, result| {
            let _ = commands.send(Cmd::Item { node, item: make(pid, result.clone()) });
        })
    }

    /// Delivers an exit to a local watcher: a process, or the embedder's spawn.
    fn exit_to(&mut self, watcher: Pid, pid: Pid, result: Result<Payload, String>) {
        if watcher.is_host() {
            if let Some(slot) = self.embedded.remove(&pid) {
                slot.set(result);
            }
        } else if let Some(handle) = self.inner.handle.get() {
            handle.exit_to(watcher, pid, result);
        }
    }

    /// Spawns what `peer` asked for on the spawning thread (`run_spawns`): a registered
    /// kind at once, a component once fetched (off this task), or answers why not.
    fn spawn_here(&mut self, peer: Peer, token: u64, spawn: RemoteSpawn) {
        let Some(handle) = self.inner.handle.get().cloned() else {
            let error = format!("spawn failed: node {} runs no scheduler", self.me.node);
            return self.queue(peer.node, Item::SpawnDone { token, result: Err(error) });
        };
        let notify = spawn.monitor.then(|| {
            let parent = spawn.parent;
            self.notifier(peer.node, move |pid, result| Item::Exit { watcher: parent, pid, result })
        });
        let registered = spawn.kind.as_deref().and_then(|k| handle.registered_kind(k));
        let (kind, factory) = match (registered, spawn.identity.clone()) {
            (Some((name, factory)), identity) if identity.is_none() || factory.identity() == identity => {
                (name, factory)
            }
            (_, Some(hash)) => {
                let (inner, client, me, jobs) =
                    (self.inner.clone(), self.client.clone(), self.me, self.spawner.clone());
                tokio::spawn(async move {
                    let error = match code::factory(&inner, &client, me, peer.node, &hash).await {
                        Ok(factory) => {
                            let job =
                                SpawnJob { handle, factory, kind: hash.into(), spawn, notify, node: peer.node, token };
                            if jobs.send(job).is_ok() {
                                return;
                            }
                            "the node's spawning thread has ended".to_owned()
                        }
                        Err(error) => format!("{error:#}"),
                    };
                    let item = Item::SpawnDone { token, result: Err(format!("spawn failed: {error}")) };
                    let _ = inner.commands.send(Cmd::Item { node: peer.node, item });
                });
                return;
            }
            (_, None) => {
                let error = format!(
                    "spawn failed: node {} has no process kind `{}`",
                    self.me.node,
                    spawn.kind.as_deref().unwrap_or("(none)")
                );
                return self.queue(peer.node, Item::SpawnDone { token, result: Err(error) });
            }
        };
        let job = SpawnJob { handle, factory, kind, spawn, notify, node: peer.node, token };
        if self.spawner.send(job).is_err() {
            let error = "spawn failed: the node's spawning thread has ended".to_owned();
            self.queue(peer.node, Item::SpawnDone { token, result: Err(error) });
        }
    }

    async fn serve_code(&self, message: async_nats::Message) {
        let Some(reply) = message.reply else { return };
        let Ok((_, Body::CodeRequest { hash, offset })) = self.inner.key.open(&message.payload).and_then(wire::decode)
        else {
            self.inner.counters.frames_refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let body = code::answer(&self.inner, &hash, offset);
        let frame = self.inner.key.seal(&wire::encode(self.me, &body));
        if let Err(error) = self.client.publish(reply, frame.into()).await {
            tracing::debug!(%error, "failed to answer a code request");
        }
    }

    /// The heartbeat: announce, judge the silent, resend what waits too long.
    async fn tick(&mut self) {
        self.announce(false).await;
        let now = Instant::now();
        if self.connected {
            let silent: Vec<u16> = self
                .members
                .iter()
                .filter(|(_, m)| now.duration_since(m.last_seen) > LOSS_AFTER)
                .map(|(&node, _)| node)
                .collect();
            for node in silent {
                self.lose(node, "missed its heartbeats");
            }
        }
        for (&node, link) in &mut self.out {
            if !link.unacked.is_empty() && now.duration_since(link.progress) > RETRANSMIT_AFTER {
                resend(&self.inner, link, now);
                self.dirty.insert(node);
            }
        }
        self.publish_view();
    }

    fn resend_all(&mut self, now: Instant) {
        for (&node, link) in &mut self.out {
            if !link.unacked.is_empty() {
                resend(&self.inner, link, now);
                self.dirty.insert(node);
            }
        }
    }

    /// Forgets node `node`: its monitors get `noconnection`, what waits on it fails,
    /// and its unacknowledged messages are counted lost.
    fn lose(&mut self, node: u16, why: &str) {
        let Some(member) = self.members.remove(&node) else { return };
        if why == LEFT {
            tracing::info!(node, "a node left the cluster");
        } else {
            tracing::warn!(node, why, "a node of the cluster is lost");
        }
        self.inner.counters.nodes_lost.fetch_add(1, Ordering::Relaxed);
        self.inner.alive[usize::from(node)].store(0, Ordering::Release);
        self.dirty.remove(&node);
        self.acks.remove(&node);
        self.inl.remove(&node);
        if let Some(link) = self.out.remove(&node) {
            let messages = link.unacked.iter().filter(|(_, _, counted)| *counted == Counted::Message).count();
            let lines = link.unacked.iter().filter(|(_, _, counted)| *counted == Counted::Log).count();
            self.inner.backlog.fetch_sub(messages, Ordering::AcqRel);
            self.inner.log_backlog.fetch_sub(lines, Ordering::AcqRel);
            self.inner.counters.messages_lost.fetch_add(messages as u64, Ordering::Relaxed);
        }
        for ((watcher, target), count) in self.monitors.remove(&node).unwrap_or_default() {
            for _ in 0..count {
                self.exit_to(watcher, target, Err(noconnection(node)));
            }
        }
        let tokens: Vec<u64> = self.pending.iter().filter(|(_, p)| p.node == node).map(|(&t, _)| t).collect();
        for token in tokens {
            let Some(pending) = self.pending.remove(&token) else { continue };
            if let Some(done) = pending.done {
                done.complete(Err(noconnection(node)));
            }
            if let Some(slot) = pending.embedded {
                slot.set(Err(noconnection(node)));
            }
        }
        let reason = format!("the run's node `{}` {why}", member.announce.name);
        self.end_run_of(node, &reason, self.inner.grace);
        self.publish_view();
    }

    /// Ends the processes here that belong to node `node`'s run (or that a process of
    /// it spawned): a cancel with `reason` now, and termination of those left after
    /// `grace`.
    fn end_run_of(&self, node: u16, reason: &str, grace: Duration) {
        let Some(handle) = self.inner.handle.get().cloned() else { return };
        let cancelled = handle.cancel_owned_by(node, reason);
        if cancelled == 0 {
            return;
        }
        tracing::info!(node, processes = cancelled, reason, ?grace, "ending the processes of a run");
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            handle.terminate_owned_by(node, "terminated: the run it belongs to was stopped, or its node left");
        });
    }
}

fn resend(inner: &Inner, link: &mut OutLink, now: Instant) {
    let first = link.unacked.front().map_or(link.next_seq, |(seq, _, _)| *seq);
    inner.counters.retransmitted.fetch_add(link.sent.saturating_sub(first - 1), Ordering::Relaxed);
    link.sent = first - 1;
    link.progress = now;
}

/// Why a node that said goodbye is gone.
const LEFT: &str = "left the cluster";

/// The reason of an exit or failure because node `node` is unreachable.
fn noconnection(node: u16) -> String {
    format!("noconnection: node {node} is not in the cluster (lost or never joined)")
}
