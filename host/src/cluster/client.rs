//! A client of a cluster: what `run --cluster` and `cluster ls` are. A client is not a
//! node: it holds no node id and no link, and a NATS server can hold it to publishing on
//! `PREFIX.run.*` and reading its own inbox (see the server configuration in the README).
//!
//! 1. It connects and publishes a `ClientHello` with a nonce and its inbox on
//!    `PREFIX.run.hello`; every node answers on `INBOX.reply` with a `Welcome`: what it
//!    is, the nonce, and a session id drawn for this client. A node whose secret differs
//!    answers with session 0 under its own key: the client learns who refused it.
//! 2. It spawns in one node's session (`Run` frames on `PREFIX.run.ID`, numbered, so a
//!    copy published again is refused), and serves the node the program's bytes by
//!    hash on `INBOX.code`.
//! 3. It keeps each session it uses alive every [`HEARTBEAT`]; the node answers each
//!    keepalive, so a node unheard for [`LOSS_AFTER`](super::LOSS_AFTER) is lost to the client, and a
//!    client unheard for as long is lost to the node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use super::config::{ClusterConfig, HEARTBEAT, Heard, JOIN_WAIT, connect};
use super::process::{RemoteProcess, RemoteSlot, RemoteSpawnOptions};
use super::shared::{ClusterStats, LineSink, NodeInfo};
use super::store::CodeStore;
use super::wire::{self, Body, ClientRequest, Item, Key, Peer};
use crate::scheduler::remote::{RemoteSpawn, RunId, Verdict};
use crate::{Capabilities, ExitReason, Pid};

/// A client of a cluster: asks its nodes to run processes, and hears how they end.
/// Made by [`Client::connect`], gone on [`Client::leave`] or drop.
pub struct Client {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("nodes", &self.nodes()).finish_non_exhaustive()
    }
}

/// What the client's thread and its user share.
struct Shared {
    key: Key,
    prefix: String,
    me: Peer,
    /// The nodes that offered a session, as they were then.
    offered: Vec<Offered>,
    /// The names of nodes that refused this client's hello.
    refused: Vec<String>,
    /// Spawns placed on each node so far, for placement.
    placed: Mutex<FxHashMap<u16, u64>>,
    /// Components nodes may fetch from this client.
    code: CodeStore,
    /// Where the lines of this client's run go.
    lines: std::sync::OnceLock<LineSink>,
    /// Frames from nodes dropped: not authentic, or repeats.
    dropped: AtomicU64,
    repeated: AtomicU64,
    commands: mpsc::UnboundedSender<Cmd>,
    next_token: AtomicU64,
}

struct Offered {
    info: NodeInfo,
    session: u64,
}

enum Cmd {
    Spawn { node: u16, spawn: RemoteSpawn, slot: Arc<RemoteSlot> },
    Terminate { node: u16, target: Pid },
    StopRun { reason: String, grace: Duration },
    Leave(std::sync::mpsc::Sender<()>),
}

impl Client {
    /// Connects to the server of `config` and asks every node for a session (waiting
    /// [`JOIN_WAIT`] for the answers).
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses the credentials (`authentication
    /// failed: …`).
    pub fn connect(config: ClusterConfig) -> anyhow::Result<Client> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("wasmproc-cluster-client")
            .build()
            .context("failed to start the cluster's runtime")?;
        let key = Key::new(&config.secret);
        let me = Peer { node: 0, incarnation: random_u64().max(1) };
        let (client, replies, code, offered, refused) = runtime.block_on(async {
            let client = connect(&config, None).await?;
            let inbox = client.new_inbox();
            let mut replies = client
                .subscribe(format!("{inbox}.reply"))
                .await
                .context("failed to subscribe to this client's answers")?;
            let code = client
                .subscribe(format!("{inbox}.code"))
                .await
                .context("failed to subscribe to this client's code requests")?;
            let nonce = random_u64().max(1);
            let subject = format!("{}.run.hello", config.prefix);
            let hello = key.seal(&subject, "", &wire::encode(me, &Body::ClientHello { nonce, inbox: inbox.clone() }));
            client.publish(subject, hello.into()).await.context("failed to greet the cluster")?;
            client.flush().await.context("failed to greet the cluster")?;
            let (mut offered, mut refused) = (Vec::new(), Vec::new());
            let deadline = tokio::time::Instant::now() + JOIN_WAIT;
            let reply_subject = format!("{inbox}.reply");
            while let Ok(Some(message)) = tokio::time::timeout_at(deadline, replies.next()).await {
                let authentic = key.open(&reply_subject, "", &message.payload).and_then(wire::decode);
                let (peer, body, authentic) = match authentic {
                    Ok((peer, body)) => (peer, body, true),
                    Err(_) => match wire::unchecked_body(&message.payload).and_then(wire::decode) {
                        Ok((peer, body)) => (peer, body, false),
                        Err(_) => continue,
                    },
                };
                let Body::Welcome { announce, echo, session } = body else { continue };
                if echo != nonce || peer.node == 0 {
                    continue;
                }
                if authentic && session != 0 {
                    let info = NodeInfo {
                        id: peer.node,
                        name: announce.name,
                        load: announce.load,
                        accepts: announce.accepts,
                        components: announce.components,
                        component_names: announce.names,
                    };
                    offered.retain(|o: &Offered| o.info.id != peer.node);
                    offered.push(Offered { info, session });
                } else if !refused.contains(&announce.name) {
                    refused.push(announce.name);
                }
            }
            offered.sort_by_key(|o| o.info.id);
            Ok::<_, anyhow::Error>((client, replies, code, offered, refused))
        })?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            key,
            prefix: config.prefix.clone(),
            me,
            offered,
            refused,
            placed: Mutex::default(),
            code: CodeStore::default(),
            lines: std::sync::OnceLock::new(),
            dropped: AtomicU64::new(0),
            repeated: AtomicU64::new(0),
            commands,
            next_token: AtomicU64::new(1),
        });
        let task = Task { shared: shared.clone(), client, sessions: FxHashMap::default() };
        let thread = std::thread::Builder::new()
            .name("wasmproc-cluster-client".to_owned())
            .spawn(move || runtime.block_on(task.run(receiver, replies, code)))
            .context("failed to start the cluster client's thread")?;
        Ok(Client { shared, thread: Mutex::new(Some(thread)) })
    }

    /// The nodes that answered, by id.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.shared.offered.iter().map(|o| o.info.clone()).collect()
    }

    /// Lets the nodes this client spawns on fetch `bytes` by `hash` (`sha256:<hex>`).
    pub fn offer(&self, hash: impl Into<String>, bytes: impl Into<Arc<[u8]>>) {
        self.shared.code.offer(hash.into(), bytes.into());
    }

    /// As [`Client::offer`], saying the file name the bytes were loaded from: the
    /// nodes that fetch it list it beside the hash (`cluster ls`).
    pub fn offer_named(&self, hash: impl Into<String>, name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) {
        self.shared.code.offer_named(hash.into(), name.into(), bytes.into());
    }

    /// Where the lines this client's run's processes write go: its pid, its source
    /// (`stdout`, `stderr`, or the level of a `log` call) and the line. Without one they
    /// are `tracing` events with target `wasmproc::guest`. Only the first call counts.
    pub fn set_line_sink(&self, sink: LineSink) {
        let _ = self.shared.lines.set(sink);
    }

    /// Stops this client's run: every node cancels its processes with `reason`, and
    /// terminates those left after `grace`. Their ends are the spawns'
    /// [`RemoteProcess::join`]s'.
    pub fn stop_run(&self, reason: &str, grace: Duration) {
        let _ = self.shared.commands.send(Cmd::StopRun { reason: reason.to_owned(), grace });
    }

    /// What this client dropped of what nodes sent it (the rest of [`ClusterStats`] is
    /// the nodes').
    pub fn stats(&self) -> ClusterStats {
        ClusterStats {
            frames_refused: self.shared.dropped.load(Ordering::Relaxed),
            frames_repeated: self.shared.repeated.load(Ordering::Relaxed),
            ..ClusterStats::default()
        }
    }

    /// Spawns a process of `kind` (registered on the node) or of the component offered
    /// with hash `identity`, on the node named `node` or the least loaded that takes
    /// spawns, as a root of this client's run there. It gets the capabilities of
    /// `options` intersected with the node's, and runs under the tighter of its limits
    /// and the node's.
    ///
    /// # Errors
    ///
    /// No such node; no node takes spawns; the nodes refused this client
    /// (`authentication failed: …`).
    pub fn spawn(
        &self,
        node: Option<&str>,
        kind: Option<String>,
        identity: Option<String>,
        options: impl Into<RemoteSpawnOptions>,
    ) -> anyhow::Result<RemoteProcess> {
        let RemoteSpawnOptions { options, limits, run_limits } = options.into();
        let target = match node {
            Some(name) => self.shared.offered.iter().find(|o| o.info.name == name).map(|o| o.info.id),
            None => {
                let placed = self.shared.placed.lock();
                self.shared
                    .offered
                    .iter()
                    .filter(|o| o.info.accepts)
                    .min_by_key(|o| (o.info.load + placed.get(&o.info.id).copied().unwrap_or(0), o.info.id))
                    .map(|o| o.info.id)
            }
        };
        let Some(target) = target else {
            if !self.shared.refused.is_empty() {
                let names: Vec<String> = self.shared.refused.iter().map(|n| format!("`{n}`")).collect();
                anyhow::bail!(
                    "authentication failed: node {} refused this client's frames: its `--cluster-secret` differs \
                     from theirs (or one side has none)",
                    names.join(", ")
                );
            }
            match node {
                Some(name) => anyhow::bail!("no node named `{name}` in the cluster"),
                None => anyhow::bail!(
                    "no node in the cluster accepts spawns (none answered within {} ms)",
                    JOIN_WAIT.as_millis()
                ),
            }
        };
        *self.shared.placed.lock().entry(target).or_default() += 1;
        let spawn = RemoteSpawn {
            // The node makes the run's root its own host's child.
            parent: Pid::HOST,
            kind,
            identity,
            method: options.method,
            input: options.input,
            caps: options.capabilities.unwrap_or_else(Capabilities::default),
            // 0: the node's default.
            mailbox_capacity: options.mailbox_capacity.unwrap_or(0),
            limits,
            run_limits: run_limits.map(Box::new),
            monitor: true,
            link: false,
            // The node gives the run its id (itself, and the session's client run).
            run: RunId::default(),
        };
        let slot = Arc::new(RemoteSlot::default());
        self.shared
            .commands
            .send(Cmd::Spawn { node: target, spawn, slot: slot.clone() })
            .map_err(|_| anyhow::anyhow!("this client has left the cluster"))?;
        Ok(RemoteProcess(slot))
    }

    /// Sends `spawn` to node `node` as it is, whatever it asks: what a client that forges
    /// its requests could send (`tests.rs`).
    #[cfg(test)]
    pub(super) fn spawn_as_is(&self, node: u16, spawn: RemoteSpawn) -> RemoteProcess {
        let slot = Arc::new(RemoteSlot::default());
        let _ = self.shared.commands.send(Cmd::Spawn { node, spawn, slot: slot.clone() });
        RemoteProcess(slot)
    }

    /// Terminates `pid`, a process this client spawned; what becomes of it is its
    /// [`RemoteProcess::join`]'s.
    pub fn terminate(&self, pid: Pid) {
        let _ = self.shared.commands.send(Cmd::Terminate { node: pid.node(), target: pid });
    }

    /// Ends this client's sessions (telling their nodes) and its thread. Called on drop.
    pub fn leave(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.shared.commands.send(Cmd::Leave(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The nodes of the cluster at `config`'s server, as they answer a client's hello;
/// joins nothing, and needs only a client's rights on the server.
///
/// # Errors
///
/// The server cannot be reached or refuses the credentials; the nodes refuse this
/// client's frames (`authentication failed: …`).
pub fn list(config: ClusterConfig) -> anyhow::Result<Vec<NodeInfo>> {
    let client = Client::connect(config)?;
    if client.shared.offered.is_empty() && !client.shared.refused.is_empty() {
        let names: Vec<String> = client.shared.refused.iter().map(|n| format!("`{n}`")).collect();
        anyhow::bail!(
            "authentication failed: node {} refused this client's frames: its `--cluster-secret` differs from \
             theirs (or one side has none)",
            names.join(", ")
        );
    }
    Ok(client.nodes())
}

/// A session in use.
struct Open {
    session: u64,
    name: String,
    /// The last request's sequence.
    sent: u64,
    /// The last answer's sequence.
    heard: u64,
    alive: Heard,
    spawning: FxHashMap<u64, Arc<RemoteSlot>>,
    running: FxHashMap<Pid, Arc<RemoteSlot>>,
}

struct Task {
    shared: Arc<Shared>,
    client: async_nats::Client,
    sessions: FxHashMap<u16, Open>,
}

impl Task {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Cmd>,
        mut replies: async_nats::Subscriber,
        mut code: async_nats::Subscriber,
    ) {
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Cmd::Spawn { node, spawn, slot }) => self.spawn(node, spawn, slot).await,
                    Some(Cmd::Terminate { node, target }) => {
                        self.request(node, ClientRequest::Terminate { target }).await;
                    }
                    Some(Cmd::StopRun { reason, grace }) => {
                        let nodes: Vec<u16> = self.sessions.keys().copied().collect();
                        for node in nodes {
                            let request = ClientRequest::StopRun { reason: reason.clone(), grace };
                            self.request(node, request).await;
                        }
                    }
                    Some(Cmd::Leave(done)) => {
                        let nodes: Vec<u16> = self.sessions.keys().copied().collect();
                        for node in nodes {
                            self.request(node, ClientRequest::Leave).await;
                        }
                        let _ = self.client.flush().await;
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
                Some(message) = replies.next() => self.reply(&message),
                Some(message) = code.next() => self.serve_code(message).await,
                _ = heartbeat.tick() => self.tick().await,
            }
        }
    }

    async fn spawn(&mut self, node: u16, spawn: RemoteSpawn, slot: Arc<RemoteSlot>) {
        let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed);
        if !self.sessions.contains_key(&node) {
            let Some(offered) = self.shared.offered.iter().find(|o| o.info.id == node) else {
                return slot.set(Err(super::shared::lost(node, None)));
            };
            self.sessions.insert(
                node,
                Open {
                    session: offered.session,
                    name: offered.info.name.clone(),
                    sent: 0,
                    heard: 0,
                    alive: Heard::at(Instant::now()),
                    spawning: FxHashMap::default(),
                    running: FxHashMap::default(),
                },
            );
        }
        if let Some(open) = self.sessions.get_mut(&node) {
            open.spawning.insert(token, slot);
        }
        let name = spawn.identity.as_ref().and_then(|hash| self.shared.code.name(hash));
        self.request(node, ClientRequest::Spawn { token, spawn: Box::new(spawn), name }).await;
    }

    /// Sends `request` in the session with node `node`.
    async fn request(&mut self, node: u16, request: ClientRequest) {
        let Some(open) = self.sessions.get_mut(&node) else { return };
        open.sent += 1;
        let body = Body::Run { session: open.session, seq: open.sent, request };
        let subject = format!("{}.run.{node}", self.shared.prefix);
        let frame = self.shared.key.seal(&subject, "", &wire::encode(self.shared.me, &body));
        if let Err(error) = self.client.publish(subject, frame.into()).await {
            tracing::debug!(%error, "failed to publish to the cluster");
        }
    }

    fn reply(&mut self, message: &async_nats::Message) {
        let Ok((peer, Body::Reply { session, seq, item })) =
            self.shared.key.open(&message.subject, "", &message.payload).and_then(wire::decode)
        else {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return tracing::debug!(subject = %message.subject, "a frame this client cannot take was dropped");
        };
        let Some(open) = self.sessions.get_mut(&peer.node).filter(|open| open.session == session) else {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if seq <= open.heard {
            self.shared.repeated.fetch_add(1, Ordering::Relaxed);
            return;
        }
        open.heard = seq;
        open.alive.again(Instant::now());
        match item {
            Some(Item::SpawnDone { token, result }) => {
                let Some(slot) = open.spawning.remove(&token) else { return };
                match result {
                    // A process of another node is not what the node said it spawned.
                    Ok(pid) if pid.node() == peer.node => {
                        *slot.pid.lock() = Some(pid);
                        open.running.insert(pid, slot);
                    }
                    Ok(pid) => slot.set(Err(ExitReason::Error(format!(
                        "node `{}` answered with {pid}, a pid not its own",
                        open.name
                    )))),
                    Err(error) => slot.set(Err(ExitReason::Error(error))),
                }
            }
            Some(Item::Exit { pid, reason, .. }) => {
                if let Some(slot) = open.running.remove(&pid) {
                    slot.set(reason.into_result());
                }
            }
            Some(Item::Log { pid, source, message, .. }) => match self.shared.lines.get() {
                Some(sink) => sink(pid, &source, &message),
                None => tracing::info!(target: "wasmproc::guest", %pid, source = %source, message = %message),
            },
            Some(Item::Done { verdict: Verdict::Failed(error), .. }) => {
                tracing::warn!(node = %open.name, %error, "a termination was refused");
            }
            _ => {}
        }
    }

    async fn serve_code(&mut self, message: async_nats::Message) {
        let Some(reply) = message.reply.clone() else { return };
        let Ok((peer, Body::CodeRequest { hash, offset })) =
            self.shared.key.open(&message.subject, &reply, &message.payload).and_then(wire::decode)
        else {
            return;
        };
        // Only a node this client asked to spawn gets its code.
        if !self.sessions.contains_key(&peer.node) {
            return;
        }
        let body = self.shared.code.answer(&hash, offset, "this client");
        let frame = self.shared.key.seal(&reply, "", &wire::encode(self.shared.me, &body));
        if let Err(error) = self.client.publish(reply, frame.into()).await {
            tracing::debug!(%error, "failed to answer a code request");
        }
    }

    /// Keeps the sessions in use alive, and gives up on nodes unheard too long.
    async fn tick(&mut self) {
        let now = Instant::now();
        let lost: Vec<u16> =
            self.sessions.iter().filter(|(_, open)| open.alive.is_lost(now)).map(|(&node, _)| node).collect();
        for node in lost {
            let Some(open) = self.sessions.remove(&node) else { continue };
            let reason = super::shared::lost(node, Some(&open.name));
            for slot in open.spawning.into_values().chain(open.running.into_values()) {
                slot.set(Err(reason.clone()));
            }
        }
        let nodes: Vec<u16> = self.sessions.keys().copied().collect();
        for node in nodes {
            self.request(node, ClientRequest::Keepalive).await;
        }
    }
}

fn random_u64() -> u64 {
    let mut bytes = [0; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    u64::from_le_bytes(bytes)
}
