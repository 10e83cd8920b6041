//! A cluster: wasmproc nodes joined through a NATS server, where a pid is a pid wherever
//! its process runs.
//!
//! ```no_run
//! use wasmproc::cluster::{Cluster, ClusterConfig, Placement};
//! use wasmproc::Scheduler;
//!
//! let cluster = Cluster::join(
//!     ClusterConfig::new("nats://127.0.0.1:4222").name("a").secret(b"shared").placement(Placement::LeastLoaded),
//! )?;
//! let scheduler = Scheduler::builder().cluster(&cluster).build()?;
//! cluster.serve(scheduler.handle().clone());
//! // … spawn, send and monitor as on one host; pids of other nodes route through NATS.
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! # How it works
//!
//! - **Pids.** A node's scheduler makes pids that carry its node id ([`Pid::node`]); the
//!   scheduler hands whatever names another node to the cluster (one compare on the
//!   local path, see `scheduler/remote.rs`).
//! - **Threads.** The NATS client runs on a tokio runtime on a thread of its own
//!   (`wasmproc-cluster`); a worker hands it work through a channel and never waits on
//!   the network. Spawns other nodes ask for run on one more thread
//!   (`wasmproc-cluster-spawn`), so a process's `init` never holds up the links.
//! - **Membership.** Every node announces itself (name, id, load = live processes, the
//!   components it holds) on `PREFIX.announce` every [`HEARTBEAT`]; a node unheard of
//!   for [`LOSS_AFTER`] is lost. A node disconnected from the server judges no one while
//!   it is, and gives everyone a fresh [`LOSS_AFTER`] once back. A joining node asks the
//!   others to announce, and draws a node id no one holds. A node becomes a member only
//!   by answering a nonce (see `node.rs`), so a copy of an old announcement brings no
//!   departed node back, and evicts no live one.
//! - **Links.** Everything between two nodes (messages, monitors, exits, terminations,
//!   spawns and their answers) travels on one ordered, reliable link per direction,
//!   subject `PREFIX.node.ID`: items carry a sequence number, the receiver acknowledges
//!   the highest it has applied in order (inside its next data frame to the sender, or
//!   alone if none goes within a few milliseconds: an answer carries the ack of its
//!   request) and ignores repeats and anything past a gap,
//!   and the sender keeps what is unacknowledged and sends it again after a reconnection
//!   or [`RETRANSMIT_AFTER`] without progress. So items arrive once and in order while
//!   both nodes live, across restarts of the server; messages still unacknowledged when
//!   their receiver's node is lost are counted in [`ClusterStats::messages_lost`].
//! - **Loss.** When a node is lost, every local monitor of one of its processes gets an
//!   exit with reason `noconnection`, spawns and terminations waiting on it fail with
//!   `noconnection`, and sends to its pids fail at once ([`SendError::NoNode`]).
//! - **Placement and code.** With [`Placement::LeastLoaded`], each `spawn` goes to the
//!   node with the fewest live processes (as last announced, plus what this node placed
//!   there since). The spawn carries the component's hash; a node that lacks it fetches
//!   the bytes once from the spawner (`PREFIX.code.ID`, in chunks, checked against the
//!   hash), loads it with the [`Loader`] and keeps it. Grants and the mailbox bound
//!   travel with the spawn, intersected with the receiving node's defaults: never wider.
//!   So do the sandbox limits the parent runs under, tightened by the kind's on the
//!   spawning node ([`KindLimits`]: a component's memory cap, time slice, fuel and CPU
//!   budgets): the child runs under the tighter of those and the receiving node's own
//!   ([`Factory::make_within`], no recompilation; a fuel budget on a node whose runtime
//!   meters no fuel fails the spawn), and its own spawns, local or remote, are bounded
//!   by what it runs under in turn. So no process of a tree runs under looser limits
//!   than its root, on whichever node.
//! - **Runs.** A process belongs to a run: of the node whose embedder started its tree, or
//!   of a client's session (its scope) on the node that runs its root: the owner
//!   (and scope), inherited down the tree and carried with every spawn to another node.
//!   When the run stops ([`Cluster::stop_run`], [`Client::stop_run`]), its node leaves or
//!   is lost, or its client leaves or goes silent, each node cancels the run's processes
//!   there (and those a process of a gone node spawned), and terminates what is left
//!   after a grace ([`ClusterConfig::grace`]): nothing runs on for a run nobody waits
//!   for. The lines a run's processes write go to its node ([`Cluster::forward_line`],
//!   bounded by [`MAX_LOG_BACKLOG`]) and from there to its client.
//!
//! [`SendError::NoNode`]: crate::error::SendError::NoNode

mod client;
mod code;
mod node;
#[cfg(all(test, not(loom)))]
mod tests;
mod wire;

pub use self::client::{Client, list};
pub use crate::scheduler::remote::RunLimits;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::{Condvar, Mutex, RwLock};
use rustc_hash::FxHashMap;

use crate::error::SendError;
use crate::handler::{Completer, Factory, KindLimits};
use crate::scheduler::remote::{Notify, Remote, RemoteSpawn};
use crate::scheduler::{Handle, SpawnOptions};
use crate::{Capabilities, Outcome, Payload, Pid};

use self::node::Cmd;
use self::wire::{Item, Key};

/// How often a node announces itself (its heartbeat).
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// How long a node may go unheard before it is lost: four heartbeats. A monitor of a
/// process on a node that dies gets its `noconnection` exit within this plus one
/// heartbeat.
pub const LOSS_AFTER: Duration = Duration::from_secs(2);
/// How long unacknowledged items wait before they are sent again.
pub const RETRANSMIT_AFTER: Duration = Duration::from_secs(1);
/// The most messages queued or unacknowledged towards other nodes at once; a send past
/// it fails ([`SendError::Cluster`]) instead of
/// growing memory. Picked out of thin air: ~100 MiB of 1 KiB messages.
pub const MAX_BACKLOG: usize = 100_000;
/// The most monitors, terminations and spawns queued for the cluster's thread at once
/// (messages are bounded by [`MAX_BACKLOG`]); one past it fails at once instead of
/// growing memory while the thread is held up. Picked out of thin air, as that.
pub const MAX_QUEUED: usize = 100_000;
/// The most guest lines queued or unacknowledged towards other nodes at once; a line
/// past it is dropped and counted ([`ClusterStats::log_lines_dropped`]), so a process
/// that logs without end cannot grow a node's memory. Picked out of thin air: up to
/// 160 MiB of the longest lines, a few MiB of usual ones.
pub const MAX_LOG_BACKLOG: usize = 10_000;
/// How long the processes of a run whose node left or was lost have to end once
/// cancelled, before they are terminated ([`ClusterConfig::grace`]).
pub const GRACE: Duration = Duration::from_millis(500);
/// How long a joining node listens for the others before it picks its id.
const JOIN_WAIT: Duration = Duration::from_millis(300);

/// Where a `spawn` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// Every spawn stays on the spawning node (the default).
    #[default]
    Local,
    /// Every spawn goes to the node with the fewest live processes, this one included.
    LeastLoaded,
}

/// Takes a line a process of this node's run wrote on another node: its pid, its source
/// (`stdout`, `stderr`, or the level of a `log` call) and the line.
pub type LineSink = Arc<dyn Fn(Pid, &str, &str) + Send + Sync>;

/// Turns a component's bytes, fetched from another node, into a factory of processes.
pub type Loader = Arc<dyn Fn(&[u8]) -> anyhow::Result<Arc<dyn Factory>> + Send + Sync>;

/// How to join a cluster.
#[derive(Clone)]
pub struct ClusterConfig {
    url: String,
    name: Option<String>,
    secret: Vec<u8>,
    token: Option<String>,
    creds: Option<PathBuf>,
    nkey: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_client: Option<(PathBuf, PathBuf)>,
    inbox: String,
    prefix: String,
    placement: Placement,
    accepts: bool,
    grace: Duration,
    share_components: bool,
    insecure: bool,
    /// [`MAX_QUEUED`]; lower only in tests, which fill the queue.
    max_queued: usize,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("url", &self.redacted_url())
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("placement", &self.placement)
            .field("accepts", &self.accepts)
            .field("grace", &self.grace)
            .field("creds", &self.creds)
            .field("nkey", &self.nkey)
            .field("tls_ca", &self.tls_ca)
            .field("tls_client", &self.tls_client)
            .field("inbox", &self.inbox)
            .field("share_components", &self.share_components)
            .field("insecure", &self.insecure)
            .finish_non_exhaustive()
    }
}

impl ClusterConfig {
    /// The NATS server at `url` (`nats://HOST:PORT`; `nats://USER:PASSWORD@HOST:PORT` for
    /// a server with users; `tls://HOST:PORT` for TLS), with the defaults below.
    pub fn new(url: impl Into<String>) -> Self {
        ClusterConfig {
            url: url.into(),
            name: None,
            secret: Vec::new(),
            token: None,
            creds: None,
            nkey: None,
            tls_ca: None,
            tls_client: None,
            inbox: "_INBOX".to_owned(),
            prefix: "wasmproc".to_owned(),
            placement: Placement::Local,
            accepts: true,
            grace: GRACE,
            share_components: false,
            insecure: false,
            max_queued: MAX_QUEUED,
        }
    }

    /// The bound of the commands queued for the cluster's thread, lowered from
    /// [`MAX_QUEUED`] so that a test can fill the queue.
    #[cfg(test)]
    pub(crate) fn max_queued(mut self, max: usize) -> Self {
        self.max_queued = max;
        self
    }

    /// The node's name, unique in the cluster. By default `HOSTNAME-PID`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The secret every node of the cluster shares: frames are authenticated with it.
    /// By default empty, which authenticates nothing (rely on NATS credentials then).
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.secret = secret.as_ref().to_vec();
        self
    }

    /// A NATS authentication token. By default none.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A NATS credentials file (a user JWT and its NKey seed, as `nsc` writes them). By
    /// default none.
    pub fn creds(mut self, path: impl Into<PathBuf>) -> Self {
        self.creds = Some(path.into());
        self
    }

    /// A file holding a NATS user's NKey seed (`SU…`). By default none.
    pub fn nkey(mut self, path: impl Into<PathBuf>) -> Self {
        self.nkey = Some(path.into());
        self
    }

    /// TLS to the server, trusting the CA certificates in the PEM file `ca`. By default
    /// the system's roots, and TLS only with a `tls://` URL or a server that asks for it.
    pub fn tls_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(ca.into());
        self
    }

    /// A TLS client certificate and its key (PEM files), for a server that verifies
    /// clients. By default none.
    pub fn tls_client(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_client = Some((cert.into(), key.into()));
        self
    }

    /// The prefix of the subjects this connection receives answers on (NATS's inbox
    /// prefix): a server whose users may read only their own answers gives each its
    /// own, e.g. `_INBOX_alice`. By default `_INBOX`.
    pub fn inbox(mut self, prefix: impl Into<String>) -> Self {
        self.inbox = prefix.into();
        self
    }

    /// Whether a component fetched by hash for one run may be spawned by hash in any
    /// other run on this node. By default no: only within the run (process tree) that
    /// brought it.
    pub fn share_components(mut self, shared: bool) -> Self {
        self.share_components = shared;
        self
    }

    /// Whether this node may join with no authentication at all: no secret, no NATS
    /// credentials (token, user and password, NKey, credentials file) and no TLS client
    /// certificate, so that anyone who reaches the server can run code on it. By
    /// default no: [`Cluster::join`] refuses.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// Whether anything authenticates this connection or its frames.
    pub fn authenticates(&self) -> bool {
        !self.secret.is_empty()
            || self.token.is_some()
            || self.creds.is_some()
            || self.nkey.is_some()
            || self.tls_client.is_some()
            || self.url_user().is_some()
    }

    /// The user of a `scheme://USER[:PASSWORD]@HOST` URL.
    fn url_user(&self) -> Option<&str> {
        let rest = self.url.split_once("://").map_or(self.url.as_str(), |(_, rest)| rest);
        let authority = rest.split(['/', ',']).next().unwrap_or(rest);
        authority.rsplit_once('@').map(|(user, _)| user).filter(|user| !user.is_empty())
    }

    /// The URL without its user and password, and those: NATS's convention is
    /// `USER:PASSWORD@` for a user, `TOKEN@` for a token (the client takes neither from
    /// the URL itself).
    pub(crate) fn url_credentials(&self) -> (String, Option<(String, Option<String>)>) {
        match (self.url_user(), self.url.split_once("://")) {
            (Some(user), Some((scheme, rest))) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                let credentials = match user.split_once(':') {
                    Some((name, password)) => (name.to_owned(), Some(password.to_owned())),
                    None => (user.to_owned(), None),
                };
                (format!("{scheme}://{host}"), Some(credentials))
            }
            _ => (self.url.clone(), None),
        }
    }

    /// The URL without its password, to name in messages.
    pub(crate) fn redacted_url(&self) -> String {
        match (self.url_user(), self.url.split_once("://")) {
            (Some(user), Some((scheme, rest))) => {
                let name = user.split_once(':').map_or(user, |(name, _)| name);
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!("{scheme}://{name}:***@{host}")
            }
            _ => self.url.clone(),
        }
    }

    /// Refuses a node that authenticates nothing, unless it is [`insecure`](Self::insecure).
    fn check_authenticated(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.insecure || self.authenticates(),
            "this node would join the cluster at `{}` with no authentication at all, so that anyone who \
             reaches the NATS server could run code on it: give NATS credentials (`--cluster-creds`, \
             `--cluster-nkey`, `--cluster-token`, or a user in the URL), a TLS client certificate \
             (`--cluster-cert` and `--cluster-key`), or a shared `--cluster-secret`; or `--insecure` to \
             run it open",
            self.redacted_url()
        );
        Ok(())
    }

    /// The first word of every subject the cluster uses, so several clusters can share
    /// one server. By default `wasmproc`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Where spawns go. By default [`Placement::Local`].
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Whether other nodes may place spawns here. By default yes; a client that only
    /// starts work elsewhere (`wasmproc run --cluster`) says no.
    pub fn accepts_spawns(mut self, accepts: bool) -> Self {
        self.accepts = accepts;
        self
    }

    /// How long the processes here of another node's run have to end, once cancelled
    /// because that node left or was lost, before they are terminated. By default
    /// [`GRACE`].
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
}

/// A node as the cluster last heard of it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeInfo {
    /// Its id: the node bits of its pids.
    pub id: u16,
    /// Its name.
    pub name: String,
    /// Its live processes.
    pub load: u64,
    /// Whether placement sends it spawns.
    pub accepts: bool,
    /// The components it holds, by hash.
    pub components: Vec<String>,
    /// The file names some of its components were loaded from, by hash: given by the
    /// client that offered one ([`Cluster::offer_named`]), or learnt from the node it
    /// was fetched from; a registered kind's name for its component.
    pub component_names: Vec<(String, String)>,
}

impl NodeInfo {
    /// The file name component `hash` was loaded from, if this node knows it.
    pub fn component_name(&self, hash: &str) -> Option<&str> {
        self.component_names.iter().find(|(h, _)| h == hash).map(|(_, name)| name.as_str())
    }
}

/// What a node's links have done since it joined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterStats {
    /// Messages queued for other nodes.
    pub messages_sent: u64,
    /// Messages from other nodes put in a local mailbox.
    pub messages_delivered: u64,
    /// Messages from other nodes whose receiver could not take them (ended, or a full
    /// mailbox): refused as a local send would have been.
    pub messages_refused: u64,
    /// Messages for a node that was lost before it acknowledged them: maybe delivered,
    /// maybe not, and reported here rather than lost silently.
    pub messages_lost: u64,
    /// Items sent again after a reconnection or a timeout.
    pub retransmitted: u64,
    /// Nodes declared lost (missed heartbeats) or that left.
    pub nodes_lost: u64,
    /// Frames (or items of them) dropped: failed authentication, malformed, from a
    /// node that is no member, published where their sender could not have, or naming
    /// what their sender may not speak for.
    pub frames_refused: u64,
    /// Lines of processes of other nodes' runs not forwarded to those nodes: more than
    /// [`MAX_LOG_BACKLOG`] were already on their way.
    pub log_lines_dropped: u64,
    /// Frames (or items) dropped as repeats of ones already taken: a sequence seen
    /// before, an incarnation or a client's session that is over. A link's
    /// retransmissions count here too; a copy published again by someone else always.
    pub frames_repeated: u64,
}

#[derive(Default)]
struct Counters {
    messages_sent: AtomicU64,
    messages_delivered: AtomicU64,
    messages_refused: AtomicU64,
    messages_lost: AtomicU64,
    retransmitted: AtomicU64,
    nodes_lost: AtomicU64,
    frames_refused: AtomicU64,
    log_lines_dropped: AtomicU64,
    frames_repeated: AtomicU64,
}

/// What a node's threads share: the scheduler's workers (through [`Remote`]), the
/// embedder and the cluster thread.
pub(crate) struct Inner {
    node: u16,
    incarnation: u64,
    name: String,
    key: Key,
    prefix: String,
    placement: Placement,
    accepts: bool,
    share_components: bool,
    commands: tokio::sync::mpsc::UnboundedSender<Cmd>,
    /// The incarnation of each node id in the cluster now (0: none); read by workers
    /// to refuse a send to an unknown node at once.
    alive: Box<[AtomicU64]>,
    /// The members, for placement and [`Cluster::nodes`]; written by the cluster thread
    /// on each announcement.
    view: RwLock<Vec<NodeInfo>>,
    /// Spawns this node placed on each node since its last announcement.
    placed: Box<[AtomicU64]>,
    /// Messages queued or unacknowledged (bounded by [`MAX_BACKLOG`]).
    backlog: AtomicUsize,
    /// Guest lines queued or unacknowledged (bounded by [`MAX_LOG_BACKLOG`]).
    log_backlog: AtomicUsize,
    /// [`ClusterConfig::grace`].
    grace: Duration,
    /// Where lines of this node's run that other nodes forward go.
    lines: OnceLock<LineSink>,
    /// Monitors, terminations and spawns queued for the cluster's thread (bounded by
    /// `max_queued`).
    queued: AtomicUsize,
    /// [`MAX_QUEUED`], but for tests (`ClusterConfig::max_queued`).
    max_queued: usize,
    /// The largest frame the server takes, less room for the header.
    max_item: usize,
    counters: Counters,
    handle: OnceLock<Handle>,
    loader: OnceLock<Loader>,
    /// Components others may fetch from here, by hash.
    code: RwLock<FxHashMap<String, Arc<[u8]>>>,
    /// The file names components were loaded from, by hash, for `cluster ls`.
    names: RwLock<FxHashMap<String, String>>,
    /// Factories of components fetched from other nodes or clients, by hash.
    fetched: RwLock<FxHashMap<String, Fetched>>,
    /// Fetches under way, by hash and run: concurrent spawns of one component in one run
    /// share one.
    fetching: Mutex<FxHashMap<(String, u64), Arc<Fetch>>>,
    /// The embedder's spawns whose results are awaited, by token.
    embedded: Mutex<FxHashMap<u64, Arc<RemoteSlot>>>,
    next_token: AtomicU64,
}

/// One fetch of a component, shared by the spawns waiting for it.
type Fetch = tokio::sync::OnceCell<anyhow::Result<Arc<dyn Factory>>>;

/// A component fetched by hash, and the runs that brought it (see `code.rs`).
pub(crate) struct Fetched {
    factory: Arc<dyn Factory>,
    scopes: rustc_hash::FxHashSet<u64>,
}

/// A node of a cluster: joined by [`Cluster::join`], left on drop. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
    thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("node", &self.inner.node).field("name", &self.inner.name).finish()
    }
}

impl Cluster {
    /// Connects to the server, learns who is there, draws a node id no one holds and
    /// starts announcing this node. Build the scheduler with
    /// [`Builder::cluster`](crate::scheduler::Builder::cluster) and call
    /// [`Cluster::serve`] to take work.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses the credentials (within 5 s); a node of
    /// the same name is already in the cluster; every node id is taken.
    pub fn join(config: ClusterConfig) -> anyhow::Result<Cluster> {
        node::start(config)
    }

    /// This node's id.
    pub fn node(&self) -> u16 {
        self.inner.node
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub(crate) fn remote(&self) -> Arc<dyn Remote> {
        self.inner.clone()
    }

    /// How this node loads components fetched from others (for Wasm:
    /// `Runtime::load_bytes`). Without one, a spawn of a component this node lacks fails.
    /// Only the first call counts.
    pub fn set_loader(&self, loader: Loader) {
        let _ = self.inner.loader.set(loader);
    }

    /// Lets other nodes fetch `bytes` by `hash` (`sha256:<hex>` of the bytes, as
    /// [`Factory::identity`] gives it), to run processes of it there.
    pub fn offer(&self, hash: impl Into<String>, bytes: impl Into<Arc<[u8]>>) {
        self.inner.code.write().insert(hash.into(), bytes.into());
    }

    /// As [`Cluster::offer`], saying the file name the bytes were loaded from: the
    /// cluster lists it beside the hash (`cluster ls`), here and on the nodes that fetch
    /// the component.
    pub fn offer_named(&self, hash: impl Into<String>, name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) {
        let hash = hash.into();
        self.inner.names.write().insert(hash.clone(), name.into());
        self.offer(hash, bytes);
        // Announced now, not at the next heartbeat: a node fetching it soon after
        // learns its name from this announcement.
        let _ = self.inner.commands.send(Cmd::Serve);
    }

    /// Starts taking work from other nodes for the scheduler of `handle`: messages,
    /// monitors, terminations and spawns. Only the first call counts.
    pub fn serve(&self, handle: Handle) {
        let _ = self.inner.handle.set(handle);
        let _ = self.inner.commands.send(Cmd::Serve);
    }

    /// The nodes of the cluster, this one included, by id.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let mut nodes = self.inner.view.read().clone();
        nodes.sort_by_key(|n| n.id);
        nodes
    }

    /// What the links have done.
    pub fn stats(&self) -> ClusterStats {
        let c = &self.inner.counters;
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClusterStats {
            messages_sent: read(&c.messages_sent),
            messages_delivered: read(&c.messages_delivered),
            messages_refused: read(&c.messages_refused),
            messages_lost: read(&c.messages_lost),
            retransmitted: read(&c.retransmitted),
            nodes_lost: read(&c.nodes_lost),
            frames_refused: read(&c.frames_refused),
            log_lines_dropped: read(&c.log_lines_dropped),
            frames_repeated: read(&c.frames_repeated),
        }
    }

    /// Spawns a process of `kind` (a kind registered on the target node, or a component
    /// offered here with its hash as `identity`) on the node named `node`, or by
    /// least load among the nodes that accept spawns, and returns a handle to wait for
    /// its result. The process gets the capabilities of `options`, intersected with the
    /// target's defaults when the target is another node, and runs under the tighter of
    /// its limits ([`RemoteSpawnOptions::limits`]) and the kind's on the target.
    ///
    /// # Errors
    ///
    /// No such node, or no node accepts spawns; for this node, no such kind, or the
    /// spawn itself failing (see [`SpawnError`](crate::error::SpawnError)). The spawn
    /// failing on another node (an unknown method, say) is the result of
    /// [`RemoteProcess::join`].
    pub fn spawn(
        &self,
        node: Option<&str>,
        kind: Option<String>,
        identity: Option<String>,
        options: impl Into<RemoteSpawnOptions>,
    ) -> anyhow::Result<RemoteProcess> {
        let RemoteSpawnOptions { options, limits, run_limits } = options.into();
        let target = match node {
            Some(name) => self
                .inner
                .view
                .read()
                .iter()
                .find(|n| n.name == name)
                .map(|n| n.id)
                .with_context(|| format!("no node named `{name}` in the cluster"))?,
            None => self.inner.least_loaded().context("no node in the cluster accepts spawns")?,
        };
        let slot = Arc::new(RemoteSlot::default());
        let here = target == self.inner.node;
        let handle = self.inner.handle.get();
        let caps = match (options.capabilities, handle) {
            (Some(caps), _) => caps,
            // A spawn here gets what the embedder's own spawns get; another node
            // intersects with its defaults anyway.
            (None, Some(handle)) if here => handle.default_capabilities().clone(),
            (None, _) => Capabilities::default(),
        };
        let spawn = RemoteSpawn {
            parent: Pid::node_host(self.inner.node),
            kind,
            identity,
            method: options.method,
            input: options.input,
            caps,
            // 0: the target's default.
            mailbox_capacity: options.mailbox_capacity.unwrap_or(0),
            limits,
            run_limits: run_limits.map(Box::new),
            monitor: true,
            // The spawning node's run: this node owns the process.
            owner: 0,
            scope: 0,
        };
        if here {
            let handle = handle.context("this node serves no scheduler: call `Cluster::serve`")?;
            let name = spawn.kind.as_deref().context("a spawn on this node needs a registered kind")?;
            let (kind, factory) =
                handle.registered_kind(name).with_context(|| format!("no process kind `{name}` on this node"))?;
            let done = slot.clone();
            let notify: Notify = Box::new(move |_, result| done.set(result.clone()));
            handle.spawn_for_remote(&*factory, kind, spawn, Some(notify), |pid| *slot.pid.lock() = Some(pid))?;
            return Ok(RemoteProcess(slot));
        }
        let token = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        self.inner.embedded.lock().insert(token, slot.clone());
        self.inner.placed[usize::from(target)].fetch_add(1, Ordering::Relaxed);
        self.inner
            .commands
            .send(Cmd::Spawn { node: target, spawn, token, done: None })
            .map_err(|_| anyhow::anyhow!("this node has left the cluster"))?;
        Ok(RemoteProcess(slot))
    }

    /// Stops this node's run on the other nodes: each cancels the processes there that
    /// belong to it (those this node spawned, and everything they spawned) with
    /// `reason`, and terminates those left after `grace`. The same happens by itself
    /// when this node leaves or is lost, with the other nodes' own grace.
    pub fn stop_run(&self, reason: &str, grace: Duration) {
        let _ = self.inner.commands.send(Cmd::StopRun { reason: reason.to_owned(), grace });
    }

    /// Where the lines that processes of this node's run write on other nodes go (the
    /// client of `run --cluster` prints them). Without one they are `tracing` events
    /// with target `wasmproc::guest`. Only the first call counts.
    pub fn set_line_sink(&self, sink: LineSink) {
        let _ = self.inner.lines.set(sink);
    }

    /// Sends a line that process `pid` of this node wrote to the node whose run the
    /// process belongs to, if that is another node (true); false if it belongs to
    /// none, and the line is this node's to show. A line past [`MAX_LOG_BACKLOG`] is
    /// dropped and counted. For a node's log sink (`wasm::Config::log_sink`).
    pub fn forward_line(&self, pid: Pid, source: &str, message: &str) -> bool {
        let Some((owner, scope)) = self.inner.handle.get().and_then(|handle| handle.run_of(pid)) else {
            return false;
        };
        if owner == self.inner.node && scope == 0 {
            return false;
        }
        if self.inner.log_backlog.fetch_add(1, Ordering::AcqRel) >= MAX_LOG_BACKLOG {
            self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
            self.inner.counters.log_lines_dropped.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let item = Item::Log { pid, scope, source: source.to_owned(), message: message.to_owned() };
        // A line of a client's run whose session is here goes to the client from here;
        // any other, to the node whose run it is.
        let cmd = if owner == self.inner.node { Cmd::Line(item) } else { Cmd::Item { node: owner, item } };
        if self.inner.queue(cmd).is_err() {
            self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// Leaves the cluster: tells the others (so they need not wait for missed
    /// heartbeats), flushes what is queued (waiting at most a second) and stops the
    /// cluster's thread. Called on drop of the last clone.
    pub fn leave(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.inner.commands.send(Cmd::Leave(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl crate::scheduler::Builder {
    /// Makes this scheduler a node of `cluster`: its pids name the cluster's node id, and
    /// what names a process of another node goes through the cluster. Call
    /// [`Cluster::serve`] with the built scheduler's handle to take work from the other
    /// nodes. Not with a journal.
    pub fn cluster(self, cluster: &Cluster) -> Self {
        self.remote(cluster.node(), cluster.remote())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if Arc::strong_count(&self.thread) == 1 {
            self.leave();
        }
    }
}

/// How [`Cluster::spawn`] starts its process: the [`SpawnOptions`] of a local spawn (its
/// method, input, capabilities and mailbox bound), and the sandbox and scheduler limits
/// it runs under at most.
#[derive(Debug, Clone)]
pub struct RemoteSpawnOptions {
    options: SpawnOptions,
    limits: Option<KindLimits>,
    run_limits: Option<RunLimits>,
}

impl RemoteSpawnOptions {
    /// `options`, under the target node's own limits for the kind.
    pub fn new(options: impl Into<SpawnOptions>) -> Self {
        RemoteSpawnOptions { options: options.into(), limits: None, run_limits: None }
    }

    /// Scheduler limits (live children, commands a step, payload and step output sizes,
    /// mailbox bounds): the process, and everything it spawns on any node, runs under the
    /// tighter of each of these and the node's own. By default none: each node's own.
    pub fn run_limits(mut self, limits: RunLimits) -> Self {
        self.run_limits = Some(limits);
        self
    }

    /// Per-process limits: the process runs under the tighter of these and the target
    /// node's own for the kind ([`Factory::make_within`]), and so does everything it
    /// spawns, on any node. By default none: the target's own.
    pub fn limits(mut self, limits: KindLimits) -> Self {
        self.limits = Some(limits);
        self
    }
}

impl From<SpawnOptions> for RemoteSpawnOptions {
    fn from(options: SpawnOptions) -> Self {
        RemoteSpawnOptions::new(options)
    }
}

impl From<&str> for RemoteSpawnOptions {
    fn from(method: &str) -> Self {
        RemoteSpawnOptions::new(method)
    }
}

impl From<String> for RemoteSpawnOptions {
    fn from(method: String) -> Self {
        RemoteSpawnOptions::new(method)
    }
}

/// A process [`Cluster::spawn`] started, on this node or another.
#[derive(Debug, Clone)]
pub struct RemoteProcess(Arc<RemoteSlot>);

impl RemoteProcess {
    /// Its pid, once the target node has answered (at once for a local one); `None`
    /// before, or if the spawn failed.
    pub fn pid(&self) -> Option<Pid> {
        *self.0.pid.lock()
    }

    /// Blocks until the process ends (or its spawn fails, or its node is lost:
    /// `Err("noconnection…")`) and returns its result.
    pub fn join(&self) -> Outcome {
        let mut result = self.0.result.lock();
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            self.0.done.wait(&mut result);
        }
    }

    /// As [`RemoteProcess::join`], giving up after `timeout` (`None`).
    pub fn join_timeout(&self, timeout: Duration) -> Option<Outcome> {
        let deadline = std::time::Instant::now() + timeout;
        let mut result = self.0.result.lock();
        while result.is_none() {
            if self.0.done.wait_until(&mut result, deadline).timed_out() {
                break;
            }
        }
        result.clone()
    }
}

#[derive(Debug, Default)]
struct RemoteSlot {
    pid: Mutex<Option<Pid>>,
    result: Mutex<Option<Outcome>>,
    done: Condvar,
}

impl RemoteSlot {
    fn set(&self, result: Outcome) {
        let mut slot = self.result.lock();
        if slot.is_none() {
            *slot = Some(result);
        }
        self.done.notify_all();
    }
}

impl Inner {
    /// The accepting node with the fewest live processes, counting what this node
    /// placed there since it last announced; ties go to the lowest id.
    fn least_loaded(&self) -> Option<u16> {
        let local_load = self.handle.get().map(|h| h.live() as u64);
        self.view
            .read()
            .iter()
            .filter(|n| n.accepts)
            .map(|n| {
                let load = if n.id == self.node { local_load.unwrap_or(n.load) } else { n.load };
                (load + self.placed[usize::from(n.id)].load(Ordering::Relaxed), n.id)
            })
            .min()
            .map(|(_, id)| id)
    }

    fn queue(&self, cmd: Cmd) -> Result<(), String> {
        self.commands.send(cmd).map_err(|_| "this node has left the cluster".to_owned())
    }

    /// Queues a monitor, termination or spawn for the cluster's thread, unless
    /// [`MAX_QUEUED`] already wait (the thread is stalled: the server is gone, say):
    /// hands it to `refused` with why.
    fn queue_bounded(&self, cmd: Cmd, refused: impl FnOnce(Cmd, String)) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.max_queued {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            let max = self.max_queued;
            return refused(cmd, format!("{max} commands already wait for the cluster's thread; retry later"));
        }
        if let Err(e) = self.commands.send(cmd) {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            refused(e.0, "this node has left the cluster".to_owned());
        }
    }

    fn is_member(&self, node: u16) -> bool {
        self.alive.get(usize::from(node)).is_some_and(|a| a.load(Ordering::Acquire) != 0)
    }

    /// The factory of component `hash` fetched before, if processes of run `scope` may
    /// spawn it: the run brought it, components are shared, or the process is the
    /// node's own (scope 0: the embedder's, trusted with all it holds).
    fn factory_in(&self, hash: &str, scope: u64) -> Option<Arc<dyn Factory>> {
        let fetched = self.fetched.read();
        let fetched = fetched.get(hash)?;
        (self.share_components || scope == 0 || fetched.scopes.contains(&scope)).then(|| fetched.factory.clone())
    }
}

impl Remote for Inner {
    fn send(&self, from: Pid, to: Pid, topic: String, body: Payload) -> Result<(), SendError> {
        let node = to.node();
        if !self.is_member(node) {
            return Err(SendError::NoNode { pid: to, node });
        }
        let size = topic.len() + body.data.len() + body.format.as_str().len();
        if size > self.max_item {
            return Err(SendError::Cluster {
                pid: to,
                reason: format!(
                    "a message of {size} bytes is larger than the {} bytes the NATS server carries in one frame",
                    self.max_item
                ),
            });
        }
        if self.backlog.fetch_add(1, Ordering::AcqRel) >= MAX_BACKLOG {
            self.backlog.fetch_sub(1, Ordering::AcqRel);
            return Err(SendError::Cluster {
                pid: to,
                reason: format!("{MAX_BACKLOG} messages already wait for other nodes; retry later"),
            });
        }
        let item = Item::Message { from, to, topic, body };
        self.queue(Cmd::Item { node, item }).map_err(|reason| {
            self.backlog.fetch_sub(1, Ordering::AcqRel);
            SendError::Cluster { pid: to, reason }
        })?;
        self.counters.messages_sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn monitor(&self, watcher: Pid, target: Pid) {
        self.queue_bounded(Cmd::Monitor { watcher, target }, |_, why| {
            if let Some(handle) = self.handle.get() {
                handle.exit_to(watcher, target, Err(format!("noconnection: {why}")));
            }
        });
    }

    fn terminate(&self, by: Pid, target: Pid, done: Option<Completer>) {
        self.queue_bounded(Cmd::Terminate { by, target, done }, |cmd, why| {
            if let Cmd::Terminate { done: Some(done), .. } = cmd {
                done.complete(Err(format!("noconnection: {why}")));
            }
        });
    }

    fn place(&self) -> Option<u16> {
        if self.placement == Placement::Local {
            return None;
        }
        let node = self.least_loaded().filter(|&node| node != self.node)?;
        self.placed[usize::from(node)].fetch_add(1, Ordering::Relaxed);
        Some(node)
    }

    fn spawn(&self, node: u16, spawn: RemoteSpawn, done: Completer) {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        self.queue_bounded(Cmd::Spawn { node, spawn, token, done: Some(done) }, |cmd, why| {
            if let Cmd::Spawn { done: Some(done), .. } = cmd {
                done.complete(Err(format!("spawn failed: {why}")));
            }
        });
    }

    fn factory(&self, kind: &str, scope: u64) -> Option<Arc<dyn Factory>> {
        self.factory_in(kind, scope)
    }
}
