//! The cluster's thread: one tokio task owns the links, the membership and the clients'
//! sessions, fed by the scheduler's workers and the embedder through a channel, by NATS
//! subscriptions, and by a heartbeat timer. No lock guards the links: only this task
//! touches them. Spawns for other nodes run on a thread of their own (`run_spawns`).
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
use super::wire::{self, Announce, Body, ClientRequest, Item, Key, Peer};
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

/// What the rest of the node asks the cluster's thread to do.
pub(super) enum Cmd {
    /// Queue `item` on the link to `node`.
    Item {
        node: u16,
        item: Item,
    },
    /// Send `item` to the client of session `session`.
    Reply {
        session: u64,
        item: Item,
    },
    /// A line (an `Item::Log`) of a client's run whose session is on this node.
    Line(Item),
    Monitor {
        watcher: Pid,
        target: Pid,
    },
    Terminate {
        by: Pid,
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

/// Connects, joins and starts the thread.
pub(super) fn start(config: ClusterConfig) -> anyhow::Result<Cluster> {
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
        let client = connect(&config, Some(events)).await?;
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
    Ok(Cluster { inner, thread: Arc::new(Mutex::new(Some(thread))) })
}

/// Connects to the server of `config` with its credentials and TLS settings; `events`
/// hears of disconnections and reconnections.
pub(super) async fn connect(
    config: &ClusterConfig,
    events: Option<mpsc::UnboundedSender<Cmd>>,
) -> anyhow::Result<async_nats::Client> {
    let mut options = async_nats::ConnectOptions::new()
        .name("wasmproc")
        .connection_timeout(Duration::from_secs(5))
        // Reconnect for ever, quickly: the links resend what a reconnection lost.
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| Duration::from_millis((50 * attempts as u64).min(1000)))
        // Frames a subscription holds before the client drops the next ones (a slow
        // consumer): with frames of at most the server's 1 MiB, what one subject's flood
        // can make a node hold. A node takes frames off far faster than links fill it.
        .subscription_capacity(SUBSCRIPTION_CAPACITY)
        .custom_inbox_prefix(config.inbox.clone());
    let (url, credentials) = config.url_credentials();
    match credentials {
        Some((user, Some(password))) => options = options.user_and_password(user, password),
        Some((token, None)) => options = options.token(token),
        None => {}
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(path) = &config.creds {
        options = options
            .credentials_file(path)
            .await
            .with_context(|| format!("failed to read the NATS credentials file `{}`", path.display()))?;
    }
    if let Some(path) = &config.nkey {
        let seed = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read the NKey seed file `{}`", path.display()))?;
        let seed = seed.lines().map(str::trim).find(|l| l.starts_with("SU")).with_context(|| {
            format!("the NKey seed file `{}` holds no user seed (a line starting with `SU`)", path.display())
        })?;
        options = options.nkey(seed.to_owned());
    }
    if let Some(ca) = &config.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &config.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
    }
    if let Some(events) = events {
        options = options.event_callback(move |event| {
            let events = events.clone();
            async move {
                match event {
                    async_nats::Event::Connected => drop(events.send(Cmd::Connection(true))),
                    async_nats::Event::Disconnected => drop(events.send(Cmd::Connection(false))),
                    async_nats::Event::ServerError(error) => {
                        tracing::warn!(%error, "the NATS server refused something this node did")
                    }
                    other => tracing::debug!(event = %other, "NATS client event"),
                }
            }
        });
    }
    let shown = config.redacted_url();
    let client = tokio::time::timeout(Duration::from_secs(5), options.connect(url.as_str()))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from the NATS server at `{shown}` within 5 s"))?;
    client.map_err(|error| {
        use async_nats::ConnectErrorKind as Kind;
        match error.kind() {
            Kind::AuthorizationViolation | Kind::Authentication => anyhow::anyhow!(
                "authentication failed: the NATS server at `{shown}` refused this connection's credentials ({error})"
            ),
            Kind::Tls => {
                anyhow::anyhow!("authentication failed: TLS with the NATS server at `{shown}` failed ({error})")
            }
            _ => anyhow::Error::new(error).context(format!("failed to connect to the NATS server at `{shown}`")),
        }
    })
}

/// Frames a subscription holds: see [`connect`].
const SUBSCRIPTION_CAPACITY: usize = 8192;

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
    last_heard: Instant,
    /// The run's scope: the processes it spawns, and theirs, share it.
    scope: u64,
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

/// A spawn or termination waiting for another node's answer.
struct Pending {
    node: u16,
    done: Option<Completer>,
    /// The watcher the answer's pid is monitored by (a spawn with `monitor`).
    monitor: Option<Pid>,
    embedded: Option<Arc<RemoteSlot>>,
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
        if let Cmd::Monitor { .. } | Cmd::Terminate { .. } | Cmd::Spawn { done: Some(_), .. } = command {
            self.inner.queued.fetch_sub(1, Ordering::AcqRel);
        }
        match command {
            Cmd::Item { node, item } => self.queue(node, item),
            Cmd::Reply { session, item } => self.reply(session, Some(item)).await,
            Cmd::Line(Item::Log { pid, scope, source, message }) => {
                self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
                self.line(pid, scope, source, message);
            }
            Cmd::Line(_) => {}
            Cmd::Monitor { watcher, target } => {
                let node = target.node();
                if self.members.contains_key(&node) {
                    *self.monitors.entry(node).or_default().entry((watcher, target)).or_default() += 1;
                    self.queue(node, Item::Monitor { watcher, target });
                } else {
                    self.exit_to(watcher, target, Err(self.noconnection(node)));
                }
            }
            Cmd::Terminate { by, target, done } => {
                let node = target.node();
                if !self.members.contains_key(&node) {
                    if let Some(done) = done {
                        done.complete(Err(self.noconnection(node)));
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
                self.queue(node, Item::Terminate { by, target, token });
            }
            Cmd::Spawn { node, spawn, token, done } => {
                let embedded = if done.is_none() { self.inner.embedded.lock().remove(&token) } else { None };
                if !self.members.contains_key(&node) {
                    let error = format!("spawn failed: {}", self.noconnection(node));
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
                    for session in self.sessions.values_mut() {
                        session.last_heard = now;
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

    /// Appends `item` to the link to `node`.
    fn queue(&mut self, node: u16, item: Item) {
        let Some(member) = self.members.get(&node) else {
            return self.undeliverable(node, item);
        };
        let incarnation = member.peer.incarnation;
        let dropped = &mut self.dropped;
        let link = self.out.entry(node).or_insert_with(|| OutLink {
            incarnation,
            next_seq: match dropped.remove(&node) {
                Some((dropped_for, next)) if dropped_for == incarnation => next,
                _ => 1,
            },
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
            Item::Monitor { watcher, target } => self.exit_to(watcher, target, Err(self.noconnection(node))),
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
        let frame = self.inner.key.seal(&subject, "", &wire::encode(self.me, body));
        // Fails only once the client is closed; what it drops, the links resend.
        if let Err(error) = self.client.publish(subject, frame.into()).await {
            tracing::debug!(%error, "failed to publish to the cluster");
        }
    }

    /// This node as it announces itself: the `seq`-th announcement.
    fn announcement(&mut self, leaving: bool, echo: u64, link_start: u64) -> Announce {
        self.announced += 1;
        let handle = self.inner.handle.get();
        Announce {
            name: self.inner.name.clone(),
            load: handle.map_or(0, |h| h.live() as u64),
            accepts: self.inner.accepts && handle.is_some(),
            components: self.components(),
            names: self.component_names(),
            leaving,
            seq: self.announced,
            echo,
            link_start,
        }
    }

    async fn announce(&mut self, leaving: bool) {
        let announce = self.announcement(leaving, 0, 0);
        self.publish(format!("{}.announce", self.inner.prefix), &Body::Announce(announce)).await;
    }

    fn components(&self) -> Vec<String> {
        let mut components: Vec<String> = self.inner.code.read().keys().cloned().collect();
        if let Some(handle) = self.inner.handle.get() {
            components.extend(handle.kinds().into_iter().filter_map(|(_, identity)| identity));
        }
        components.sort();
        components.dedup();
        components.truncate(MAX_ANNOUNCED);
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

    /// A heartbeat (or a goodbye) on the announcements' subject.
    async fn announced_by(&mut self, peer: Peer, announce: Announce) {
        match self.members.get_mut(&peer.node) {
            Some(member) if member.peer == peer => {
                if announce.seq <= member.last_seq {
                    return self.repeated();
                }
                member.last_seq = announce.seq;
                member.last_seen = Instant::now();
                if announce.leaving {
                    self.lose(peer.node, LEFT);
                } else {
                    member.announce = announce;
                    self.inner.placed[usize::from(peer.node)].store(0, Ordering::Relaxed);
                    self.publish_view();
                }
            }
            // A node this one does not know as it is: maybe a new one, maybe a copy of
            // an old announcement. Only a live node answers the probe.
            _ if !announce.leaving => self.probe(peer).await,
            _ => {}
        }
    }

    /// Sends `peer` a probe, unless one went to its node id within a heartbeat.
    async fn probe(&mut self, peer: Peer) {
        let now = Instant::now();
        if self.probes.get(&peer.node).is_some_and(|p| now.duration_since(p.sent) < HEARTBEAT) {
            return;
        }
        let nonce = random_u64().max(1);
        self.probes.insert(peer.node, Probing { nonce, incarnation: peer.incarnation, sent: now });
        let link_start = self.link_start(peer);
        self.publish(self.subject(peer.node), &Body::Probe { nonce, link_start }).await;
    }

    /// The first sequence of this node's link to `peer` that `peer` has not
    /// acknowledged.
    fn link_start(&self, peer: Peer) -> u64 {
        match (self.out.get(&peer.node), self.dropped.get(&peer.node)) {
            (Some(link), _) if link.incarnation == peer.incarnation => link.start(),
            (_, Some(&(incarnation, next))) if incarnation == peer.incarnation => next,
            _ => 1,
        }
    }

    /// `peer` asks for a fresh announcement: it does not count this node as a member.
    async fn probed(&mut self, peer: Peer, nonce: u64, link_start: u64) {
        if self.answered.get(&peer.node) == Some(&nonce) {
            return self.repeated();
        }
        self.answered.insert(peer.node, nonce);
        if self.is_member(peer) {
            // It dropped its link to this node (it lost this one): it takes up from
            // `link_start`, never lower.
            if let Some(link) = self.inl.get_mut(&peer.node)
                && link.incarnation == peer.incarnation
            {
                link.expected = link.expected.max(link_start);
            }
            // What it dropped of this node's link, it takes again once it admits this one.
            if let Some(link) = self.out.get_mut(&peer.node)
                && link.incarnation == peer.incarnation
                && !link.unacked.is_empty()
            {
                resend(&self.inner, link, Instant::now());
                self.dirty.insert(peer.node);
            }
        }
        let start = self.link_start(peer);
        let answer = self.announcement(false, nonce, start);
        self.publish(self.subject(peer.node), &Body::Announce(answer)).await;
    }

    /// An answer to a probe, on this node's own subject.
    fn answered_probe(&mut self, peer: Peer, announce: Announce) {
        match self.probes.get(&peer.node) {
            Some(p) if p.nonce == announce.echo && p.incarnation == peer.incarnation => {
                self.probes.remove(&peer.node);
                if !announce.leaving {
                    self.admit(peer, announce, Instant::now());
                    self.publish_view();
                }
            }
            _ => self.repeated(),
        }
    }

    /// A joining node's hello: the answer goes to its reply subject.
    async fn hello(&mut self, reply: &str, nonce: u64) {
        if !self.is_inbox(reply) {
            return self.refuse(format_args!("a hello to be answered on `{reply}`"));
        }
        let answer = self.announcement(false, nonce, 1);
        self.publish(reply.to_owned(), &Body::Announce(answer)).await;
    }

    /// Whether this node may publish answers to `subject`: a subject that names no
    /// wildcard, and none of the cluster's own (an answer there would be a frame a node
    /// or client did not ask for).
    fn is_inbox(&self, subject: &str) -> bool {
        !subject.is_empty()
            && subject.len() <= 256
            && !subject.starts_with(&format!("{}.", self.inner.prefix))
            && subject.split('.').all(|token| !token.is_empty() && token != "*" && token != ">")
            && !subject.contains(|c: char| c.is_whitespace())
    }

    /// Makes `peer` a member on a fresh announcement (it answered this node's nonce).
    fn admit(&mut self, peer: Peer, announce: Announce, now: Instant) {
        if let Some(member) = self.members.get(&peer.node)
            && member.peer.incarnation != peer.incarnation
        {
            // The node restarted under the same id: its old processes are gone.
            self.lose(peer.node, "restarted");
        }
        let start = announce.link_start.max(1);
        match self.inl.get_mut(&peer.node) {
            Some(link) if link.incarnation == peer.incarnation => link.expected = link.expected.max(start),
            _ => drop(self.inl.insert(peer.node, InLink { incarnation: peer.incarnation, expected: start })),
        }
        self.inner.placed[usize::from(peer.node)].store(0, Ordering::Relaxed);
        self.inner.alive[usize::from(peer.node)].store(peer.incarnation, Ordering::Release);
        let last_seq = announce.seq;
        self.members.insert(peer.node, Member { peer, announce, last_seen: now, last_seq });
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

    /// Applies the items of a data frame from a member that come next in order.
    fn data(&mut self, peer: Peer, first: u64, items: Vec<Vec<u8>>) {
        let Some(link) = self.inl.get(&peer.node).filter(|link| link.incarnation == peer.incarnation) else {
            return self.refuse(format_args!("link data from node {} before its link was taken up", peer.node));
        };
        let mut expected = link.expected;
        let before = expected;
        if first < expected {
            self.repeated();
        }
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
                Ok(item) => match self.check(peer, &item) {
                    Ok(()) => self.apply(peer, item),
                    Err(why) => {
                        self.refuse(format_args!("from node {}: {why}", peer.node));
                        true
                    }
                },
                Err(error) => {
                    self.refuse(format_args!("an item from node {}: {error}", peer.node));
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
        let owed = self.acks.entry(peer.node).or_insert_with(|| PendingAck { since: Instant::now(), items: 0 });
        owed.items += expected - before;
    }

    fn ack(&mut self, peer: Peer, to_incarnation: u64, upto: u64) {
        let Some(link) = self.out.get_mut(&peer.node) else { return };
        if to_incarnation != self.me.incarnation || link.incarnation != peer.incarnation {
            return;
        }
        // An acknowledgement of what was never sent says nothing true.
        let upto = upto.min(link.next_seq - 1);
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

    /// Whether node `peer` may have sent `item` ([`check`]).
    fn check(&self, peer: Peer, item: &Item) -> Result<(), String> {
        check(
            peer.node,
            self.me.node,
            item,
            |token| self.pending.get(&token).is_some_and(|pending| pending.node == peer.node),
            |watcher, pid| {
                self.monitors.get(&peer.node).is_some_and(|m| m.contains_key(&(watcher, pid)))
                    || (watcher.is_host() && self.embedded.contains_key(&pid))
            },
        )
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
                let notify =
                    self.notifier(Dest::Node(peer.node), move |pid, result| Item::Exit { watcher, pid, result });
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
            Item::Terminate { target, token, .. } => {
                let notify =
                    self.notifier(Dest::Node(peer.node), move |_, _| Item::TerminateDone { token, result: Ok(()) });
                let result = match &handle {
                    Some(handle) => handle.terminate_watched(target, notify).map_err(|(error, _)| error.to_string()),
                    None => Err(format!("no process {target}: node `{}` runs no scheduler", self.inner.name)),
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
            Item::Spawn { token, spawn } => self.spawn_here(Dest::Node(peer.node), token, spawn),
            Item::StopRun { reason, grace, scope: 0 } => self.end_run_of(peer.node, &reason, grace),
            Item::StopRun { reason, grace, scope } => self.end_scope_here(scope, &reason, grace),
            Item::Log { pid, scope, source, message } => self.line(pid, scope, source, message),
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

    /// A notifier that sends the item `make` builds to `dest`, from any thread.
    fn notifier(
        &self,
        dest: Dest,
        make: impl FnOnce(Pid, Result<Payload, String>) -> Item + Send + 'static,
    ) -> crate::scheduler::remote::Notify {
        let commands = self.inner.commands.clone();
        Box::new(move |pid, result| {
            let _ = commands.send(dest.cmd(make(pid, result.clone())));
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

    /// Spawns what `dest` (a node, or a client's session) asked for on the spawning
    /// thread (`run_spawns`): a registered kind at once, a component once fetched (off
    /// this task) from whoever asked, or answers why not. A component by hash is
    /// fetched from the asker unless this node holds it for the spawn's scope already:
    /// a run spawns by hash only what its own tree brought.
    fn spawn_here(&mut self, dest: Dest, token: u64, spawn: RemoteSpawn) {
        let answer_now = |actor: &mut Self, error: String| {
            let item = Item::SpawnDone { token, result: Err(error) };
            match dest {
                Dest::Node(node) => actor.queue(node, item),
                Dest::Session(_) => drop(actor.inner.commands.send(dest.cmd(item))),
            }
        };
        let Some(handle) = self.inner.handle.get().cloned() else {
            let error = format!("spawn failed: node `{}` runs no scheduler", self.inner.name);
            return answer_now(self, error);
        };
        let notify = spawn.monitor.then(|| {
            let parent = spawn.parent;
            self.notifier(dest, move |pid, result| Item::Exit { watcher: parent, pid, result })
        });
        let registered = spawn.kind.as_deref().and_then(|k| handle.registered_kind(k));
        let (kind, factory) = match (registered, spawn.identity.clone()) {
            (Some((name, factory)), identity) if identity.is_none() || factory.identity() == identity => {
                (name, factory)
            }
            (_, Some(hash)) => {
                if let Some(factory) = self.inner.factory_in(&hash, spawn.scope) {
                    (hash.into(), factory)
                } else {
                    let (source, from) = match dest {
                        Dest::Node(node) => (code::subject(&self.inner.prefix, node), Some(node)),
                        Dest::Session(session) => match self.sessions.get(&session) {
                            Some(session) => (format!("{}.code", session.inbox), None),
                            None => return,
                        },
                    };
                    let (inner, client, me, jobs) =
                        (self.inner.clone(), self.client.clone(), self.me, self.spawner.clone());
                    tokio::spawn(async move {
                        let error = match code::factory(&inner, &client, me, (&source, from), &hash, spawn.scope).await
                        {
                            Ok(factory) => {
                                let job = SpawnJob { handle, factory, kind: hash.into(), spawn, notify, dest, token };
                                if jobs.send(job).is_ok() {
                                    return;
                                }
                                "the node's spawning thread has ended".to_owned()
                            }
                            Err(error) => format!("{error:#}"),
                        };
                        let item = Item::SpawnDone { token, result: Err(format!("spawn failed: {error}")) };
                        let _ = inner.commands.send(dest.cmd(item));
                    });
                    return;
                }
            }
            (_, None) => {
                let error = format!(
                    "spawn failed: node `{}` has no process kind `{}`",
                    self.inner.name,
                    spawn.kind.as_deref().unwrap_or("(none)")
                );
                return answer_now(self, error);
            }
        };
        let job = SpawnJob { handle, factory, kind, spawn, notify, dest, token };
        if self.spawner.send(job).is_err() {
            answer_now(self, "spawn failed: the node's spawning thread has ended".to_owned());
        }
    }

    async fn serve_code(&mut self, message: async_nats::Message) {
        let Some(reply) = message.reply.clone() else { return };
        let opened = wire::claimed_sender(&message.payload).and_then(|(peer, _)| {
            if !self.is_member(peer) {
                return Err(wire::WireError::Malformed(format!("a code request from node {}, no member", peer.node)));
            }
            self.inner.key.open(&message.subject, &reply, &message.payload).and_then(wire::decode)
        });
        let Ok((_, Body::CodeRequest { hash, offset })) = opened else {
            return self.refuse(format_args!("a code request on `{}` that is not one", message.subject));
        };
        let body = code::answer(&self.inner, &hash, offset);
        let frame = self.inner.key.seal(&reply, "", &wire::encode(self.me, &body));
        if let Err(error) = self.client.publish(reply, frame.into()).await {
            tracing::debug!(%error, "failed to answer a code request");
        }
    }

    /// The heartbeat: announce, judge the silent, resend what waits too long, and say
    /// what was refused since the last.
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
            let gone: Vec<u64> = self
                .sessions
                .iter()
                .filter(|(_, s)| now.duration_since(s.last_heard) > LOSS_AFTER)
                .map(|(&id, _)| id)
                .collect();
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
                resend(&self.inner, link, now);
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
        let name = member.announce.name;
        if why == LEFT {
            tracing::info!(node, name, "a node left the cluster");
        } else {
            tracing::warn!(node, name, why, "a node of the cluster is lost");
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
            self.dropped.insert(node, (link.incarnation, link.next_seq));
        }
        let reason = noconnection(node, Some(&name));
        for ((watcher, target), count) in self.monitors.remove(&node).unwrap_or_default() {
            for _ in 0..count {
                self.exit_to(watcher, target, Err(reason.clone()));
            }
        }
        let tokens: Vec<u64> = self.pending.iter().filter(|(_, p)| p.node == node).map(|(&t, _)| t).collect();
        for token in tokens {
            let Some(pending) = self.pending.remove(&token) else { continue };
            if let Some(done) = pending.done {
                done.complete(Err(reason.clone()));
            }
            if let Some(slot) = pending.embedded {
                slot.set(Err(reason.clone()));
            }
        }
        let reason = format!("the run's node `{name}` {why}");
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

    /// A line a process of a run wrote: to the client whose session the run is, if it
    /// is here; else this node's to show.
    fn line(&mut self, pid: Pid, scope: u64, source: String, message: String) {
        if scope != 0
            && let Some((&session, _)) = self.sessions.iter().find(|(_, s)| s.scope == scope)
        {
            let item = Item::Log { pid, scope, source, message };
            let _ = self.inner.commands.send(Cmd::Reply { session, item });
            return;
        }
        match self.inner.lines.get() {
            Some(sink) => sink(pid, &source, &message),
            None => tracing::info!(target: "wasmproc::guest", %pid, source = %source, message = %message),
        }
    }

    /// Ends the processes of the client's run `scope` on this node: a cancel with
    /// `reason` now, and termination of those left after `grace`.
    fn end_scope_here(&self, scope: u64, reason: &str, grace: Duration) {
        let Some(handle) = self.inner.handle.get().cloned() else { return };
        if handle.cancel_in_scope(scope, reason) == 0 {
            return;
        }
        tracing::info!(reason, ?grace, "ending the processes of a client's run");
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            handle.terminate_in_scope(scope, "terminated: the run it belongs to was stopped, or its client left");
        });
    }

    /// Ends the processes of the client's run `scope` here and on every other node.
    fn stop_scope(&mut self, scope: u64, reason: &str, grace: Duration) {
        self.end_scope_here(scope, reason, grace);
        let nodes: Vec<u16> = self.members.keys().copied().collect();
        for node in nodes {
            self.queue(node, Item::StopRun { reason: reason.to_owned(), grace, scope });
        }
    }

    /// Why node `node` cannot be reached, naming it if it is known.
    fn noconnection(&self, node: u16) -> String {
        noconnection(node, self.members.get(&node).map(|m| m.announce.name.as_str()))
    }
}

/// Clients' sessions.
impl Actor {
    /// A client asks for a session: offer one, on its inbox.
    async fn client_hello(&mut self, client: Peer, nonce: u64, inbox: String) {
        if !self.is_inbox(&inbox) {
            return self.refuse(format_args!("a client's hello with the inbox `{inbox}`"));
        }
        if self.offers.len() >= MAX_SESSIONS
            && let Some(oldest) = self.offered.pop_front()
        {
            self.offers.remove(&oldest);
        }
        let session = random_u64().max(1);
        self.offers.insert(session, Offer { client, inbox: inbox.clone(), made: Instant::now() });
        self.offered.push_back(session);
        let announce = self.announcement(false, 0, 0);
        let subject = format!("{inbox}.reply");
        self.publish(subject, &Body::Welcome { announce, echo: nonce, session }).await;
    }

    /// A client's hello failed authentication: tell it so (a few a heartbeat), under
    /// this node's key, which that client cannot check: it only learns that a node of
    /// this name refused it.
    async fn refuse_client(&mut self, frame: &[u8]) {
        if self.refusals.answered >= REFUSALS_ANSWERED {
            return;
        }
        let Ok((_, body)) = wire::unchecked_body(frame).and_then(wire::decode) else { return };
        let Body::ClientHello { nonce, inbox } = body else { return };
        if !self.is_inbox(&inbox) {
            return;
        }
        self.refusals.answered += 1;
        let announce = self.announcement(false, 0, 0);
        self.publish(format!("{inbox}.reply"), &Body::Welcome { announce, echo: nonce, session: 0 }).await;
    }

    /// A request in a client's session: the first takes up an offer.
    async fn run_request(&mut self, client: Peer, id: u64, seq: u64, request: ClientRequest) {
        let now = Instant::now();
        if !self.sessions.contains_key(&id) {
            match self.offers.get(&id) {
                Some(offer) if offer.client == client => {
                    if self.sessions.len() >= MAX_SESSIONS {
                        return self.refuse(format_args!("a session past the {MAX_SESSIONS} this node holds"));
                    }
                    let offer = self.offers.remove(&id).expect("just seen");
                    self.offered.retain(|&o| o != id);
                    let session = Session {
                        client,
                        inbox: offer.inbox,
                        last_seq: 0,
                        sent: 0,
                        last_heard: now,
                        scope: random_u64().max(1),
                        roots: FxHashSet::default(),
                    };
                    self.sessions.insert(id, session);
                }
                _ => return self.repeated(),
            }
        }
        let session = self.sessions.get_mut(&id).expect("just made");
        if session.client != client {
            return self.refuse(format_args!("a request in another client's session"));
        }
        if seq <= session.last_seq {
            return self.repeated();
        }
        session.last_seq = seq;
        session.last_heard = now;
        match request {
            ClientRequest::Keepalive => self.reply(id, None).await,
            ClientRequest::Spawn { token, mut spawn, name } => {
                // The run's root: its parent is this node's host (so this node owns the
                // run), its scope the session's, its grants no wider than this node's
                // (`run_spawns`).
                spawn.parent = Pid::node_host(self.me.node);
                spawn.owner = 0;
                spawn.scope = session.scope;
                if let (Some(hash), Some(name)) = (&spawn.identity, name) {
                    self.inner.names.write().entry(hash.clone()).or_insert(name);
                }
                self.spawn_here(Dest::Session(id), token, spawn);
            }
            ClientRequest::StopRun { reason, grace } => {
                let scope = session.scope;
                self.stop_scope(scope, &reason, grace);
            }
            ClientRequest::Terminate { target } => {
                if !session.roots.contains(&target) {
                    let item = Item::TerminateDone {
                        token: 0,
                        result: Err(format!("permission denied: {target} is not a process this run spawned")),
                    };
                    return self.reply(id, Some(item)).await;
                }
                if let Some(handle) = self.inner.handle.get() {
                    let _ = handle.terminate_watched(target, Box::new(|_, _| {}));
                }
            }
            ClientRequest::Leave => self.end_session(id, "its client left"),
        }
    }

    /// Sends `item` (or word that this node is there) to the client of session `id`.
    async fn reply(&mut self, id: u64, item: Option<Item>) {
        let Some(session) = self.sessions.get_mut(&id) else { return };
        if let Some(Item::SpawnDone { result: Ok(pid), .. }) = &item {
            session.roots.insert(*pid);
        }
        if let Some(Item::Exit { pid, .. }) = &item {
            session.roots.remove(pid);
        }
        session.sent += 1;
        let body = Body::Reply { session: id, seq: session.sent, item };
        let subject = format!("{}.reply", session.inbox);
        self.publish(subject, &body).await;
    }

    /// Ends session `id`: its client is gone, and so are its run's processes, here and
    /// on the other nodes (cancelled, then terminated after the grace).
    fn end_session(&mut self, id: u64, why: &str) {
        if let Some(session) = self.sessions.remove(&id) {
            tracing::debug!(session = id, why, roots = session.roots.len(), "a client's session ended");
            let reason = format!("the run's client {why}");
            self.stop_scope(session.scope, &reason, self.inner.grace);
        }
    }
}

fn resend(inner: &Inner, link: &mut OutLink, now: Instant) {
    let first = link.start();
    inner.counters.retransmitted.fetch_add(link.sent.saturating_sub(first - 1), Ordering::Relaxed);
    link.sent = first - 1;
    link.progress = now;
}

/// Whether node `sender` may have sent `item` to node `here`: the processes it speaks
/// for are its own, those it names here are this node's, an exit is one a local watcher
/// waits for (`watched(watcher, pid)`), and an answer answers what this node asked of
/// that node (`asked(token)`). A node's link carries what its processes did, never what
/// another node's did.
fn check(
    sender: u16,
    here: u16,
    item: &Item,
    asked: impl Fn(u64) -> bool,
    watched: impl Fn(Pid, Pid) -> bool,
) -> Result<(), String> {
    let own = |pid: Pid, what: &str| {
        if pid.node() == sender { Ok(()) } else { Err(format!("{what} {pid} is not a process of the sending node")) }
    };
    let local = |pid: Pid, what: &str| {
        if pid.node() == here { Ok(()) } else { Err(format!("{what} {pid} is not a process of this node")) }
    };
    let answers = |token: u64, what: &str| {
        if asked(token) { Ok(()) } else { Err(format!("{what} answers nothing this node asked the sender")) }
    };
    match item {
        Item::Message { from, to, .. } => own(*from, "the message's sender").and(local(*to, "its receiver")),
        Item::Monitor { watcher, target } => own(*watcher, "the watcher").and(local(*target, "the watched")),
        Item::Exit { watcher, pid, .. } => {
            own(*pid, "the exited process")?;
            if watched(*watcher, *pid) {
                Ok(())
            } else {
                Err(format!("an exit of {pid} that {watcher} does not wait for"))
            }
        }
        Item::Terminate { by, target, .. } => own(*by, "the terminating process").and(local(*target, "the target")),
        Item::TerminateDone { token, .. } => answers(*token, "a termination's end"),
        Item::Spawn { spawn, .. } => own(spawn.parent, "the spawn's parent"),
        Item::Log { pid, .. } => own(*pid, "the line's process"),
        // A node stops its own run (scope 0: what it owns), or one of its clients'.
        Item::StopRun { .. } => Ok(()),
        Item::SpawnDone { token, result } => {
            answers(*token, "a spawn's answer")?;
            match result {
                Ok(child) => own(*child, "the spawned process"),
                Err(_) => Ok(()),
            }
        }
    }
}

/// Why a node that said goodbye is gone.
const LEFT: &str = "left the cluster";

/// The reason of an exit or failure because node `node` (named `name`, if known) is
/// unreachable.
pub(super) fn noconnection(node: u16, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("noconnection: node `{name}` (id {node}) is not in the cluster (lost or left)"),
        None => format!("noconnection: node {node} is not in the cluster (lost or never joined)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Item 4: what one node's link says of another node's processes is refused: a
    /// message from another node's process, an exit of one, an exit nobody waits for,
    /// a termination on behalf of another node's process or of a process elsewhere, an
    /// answer to a question this node did not ask that node.
    #[test]
    fn a_node_speaks_only_for_its_own_processes() {
        let (sender, here, third) = (3, 5, 7);
        let on = |node: u16, n: u64| Pid::from_u64(n).with_node(node);
        let asked = |token: u64| token == 1;
        let watched = |watcher: Pid, pid: Pid| watcher == on(here, 10) && pid == on(sender, 20);
        let checked = |item: Item| check(sender, here, &item, asked, watched);
        let message = |from, to| Item::Message { from, to, topic: "t".into(), body: Payload::empty() };
        let exit = |watcher, pid| Item::Exit { watcher, pid, result: Err("killed".into()) };

        assert_eq!(checked(message(on(sender, 1), on(here, 2))), Ok(()));
        assert!(checked(message(on(third, 1), on(here, 2))).unwrap_err().contains("not a process of the sending node"));
        assert!(checked(message(on(sender, 1), on(third, 2))).is_err());

        assert_eq!(checked(exit(on(here, 10), on(sender, 20))), Ok(()));
        assert!(checked(exit(on(here, 10), on(third, 20))).is_err(), "an exit of another node's process");
        assert!(checked(exit(on(here, 11), on(sender, 20))).unwrap_err().contains("does not wait for"));

        let terminate = |by, target| Item::Terminate { by, target, token: 0 };
        assert_eq!(checked(terminate(on(sender, 1), on(here, 2))), Ok(()));
        assert!(checked(terminate(on(third, 1), on(here, 2))).is_err(), "on behalf of another node's process");
        assert!(checked(terminate(on(sender, 1), on(third, 2))).is_err(), "of a process elsewhere");

        assert_eq!(checked(Item::SpawnDone { token: 1, result: Ok(on(sender, 4)) }), Ok(()));
        assert!(checked(Item::SpawnDone { token: 2, result: Ok(on(sender, 4)) }).is_err(), "not asked");
        assert!(checked(Item::SpawnDone { token: 1, result: Ok(on(third, 4)) }).is_err(), "a pid of another node");
        assert!(checked(Item::TerminateDone { token: 9, result: Ok(()) }).is_err());
        assert!(checked(Item::Monitor { watcher: on(third, 1), target: on(here, 2) }).is_err());
    }
}
