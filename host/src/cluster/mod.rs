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
//!   by answering a nonce (see `node/mod.rs`), so a copy of an old announcement brings no
//!   departed node back, and evicts no live one.
//! - **Links.** Everything between two nodes (messages, monitors, exits, terminations,
//!   process links and exit signals, spawns and their answers) travels on one ordered,
//!   reliable link per direction,
//!   subject `PREFIX.node.ID`: items carry a sequence number, the receiver acknowledges
//!   the highest it has applied in order (inside its next data frame to the sender, or
//!   alone if none goes within a few milliseconds: an answer carries the ack of its
//!   request) and ignores repeats and anything past a gap,
//!   and the sender keeps what is unacknowledged and sends it again after a reconnection
//!   or [`RETRANSMIT_AFTER`] without progress. So items arrive once and in order while
//!   both nodes live, across restarts of the server; messages still unacknowledged when
//!   their receiver's node is lost are counted in [`ClusterStats::messages_lost`].
//! - **Loss.** When a node is lost, every local monitor of one of its processes gets an
//!   exit with reason `noconnection`, every local process linked to one of them an exit
//!   signal `noconnection` from it, spawns and terminations waiting on it fail with
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
//!   of a client's session on the node that runs its root. One id names it (the node,
//!   and the client's run there if it is a client's: `RunId`), inherited down the tree
//!   and carried with every spawn to another node.
//!   When the run stops ([`Cluster::stop_run`], [`Client::stop_run`]), its node leaves or
//!   is lost, or its client leaves or goes silent, each node cancels the run's processes
//!   there (and those a process of a gone node spawned), and terminates what is left
//!   after a grace ([`ClusterConfig::grace`]): nothing runs on for a run nobody waits
//!   for. The lines a run's processes write go to its node ([`Cluster::forward_line`],
//!   bounded by [`MAX_LOG_BACKLOG`]) and from there to its client.
//!
//! # Layout
//!
//! This file is the embedder's handle, [`Cluster`]; below it, `node/` is the cluster's
//! thread (see there), `client.rs` a client, `code.rs` fetching components and
//! `store.rs` offering them, `shared.rs` what the threads of a node share and send the
//! cluster's thread, `config.rs` how to join and connect, `process.rs` what a spawn
//! returns, and `wire.rs` the frames. No file imports one above it.
//!
//! [`SendError::NoNode`]: crate::error::SendError::NoNode

mod blocking;
mod client;
mod code;
mod config;
mod inbox;
mod journal;
mod kv;
mod lease;
mod node;
mod process;
mod shards;
mod shared;
mod store;
#[cfg(all(test, not(loom)))]
mod tests;
mod wire;
mod workflows;

pub use self::client::{Client, list};
pub use self::config::{
    ClusterConfig, GRACE, HEARTBEAT, LOSS_AFTER, MAX_BACKLOG, MAX_LOG_BACKLOG, MAX_QUEUED, Placement, RETRANSMIT_AFTER,
};
pub use self::inbox::{DEFAULT_INBOX_STREAM, InboxOptions, MAX_HELD, MAX_OUTBOX};
pub use self::journal::{DEFAULT_PIPELINE, DEFAULT_STREAM, JetStreamOptions, JetStreamStore, MAX_PIPELINE};
pub use self::kv::{DEFAULT_KV_BUCKET, DUPLICATE_WINDOW, SharedKv, SharedKvOptions};
pub use self::lease::{DEFAULT_BUCKET, Lease, LeaseOptions, Leases, Renewal, Shares};
pub use self::process::{RemoteProcess, RemoteSpawnOptions};
pub use self::shards::{BuildShard, FIRST_SHARD_NODE, MAX_SHARDS, ShardHost, ShardOptions, shard_node};
pub use self::shared::{ClusterStats, LineSink, Loader, NodeInfo};
pub use self::workflows::{
    DEFAULT_CODE_BUCKET, DEFAULT_WORKFLOWS_BUCKET, ShardWorkflow, WorkflowKinds, WorkflowOptions, WorkflowState,
    Workflows, check_id, hash_of,
};
pub use crate::scheduler::remote::RunLimits;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;

use crate::scheduler::Handle;
use crate::scheduler::remote::{Notify, Remote, RemoteSpawn, RunId};
use crate::{Capabilities, Pid};

use self::process::RemoteSlot;
use self::shared::{Cmd, Inner};
use self::wire::Item;

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
        let (inner, thread) = node::start(config)?;
        Ok(Cluster { inner, thread: Arc::new(Mutex::new(Some(thread))) })
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
        self.inner.code.offer(hash.into(), bytes.into());
    }

    /// As [`Cluster::offer`], saying the file name the bytes were loaded from: the
    /// cluster lists it beside the hash (`cluster ls`), here and on the nodes that fetch
    /// the component.
    pub fn offer_named(&self, hash: impl Into<String>, name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) {
        self.inner.code.offer_named(hash.into(), name.into(), bytes.into());
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
            link: false,
            // The spawning node's run: this node owns the process.
            run: RunId::default(),
        };
        if here {
            let handle = handle.context("this node serves no scheduler: call `Cluster::serve`")?;
            let name = spawn.kind.as_deref().context("a spawn on this node needs a registered kind")?;
            let (kind, factory) =
                handle.registered_kind(name).with_context(|| format!("no process kind `{name}` on this node"))?;
            let done = slot.clone();
            let notify: Notify = Box::new(move |_, reason| done.set(reason.clone().into_result()));
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
        let Some(run) = self.inner.handle.get().and_then(|handle| handle.run_of(pid)) else {
            return false;
        };
        if run.node == self.inner.node && run.client == 0 {
            return false;
        }
        if self.inner.log_backlog.fetch_add(1, Ordering::AcqRel) >= MAX_LOG_BACKLOG {
            self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
            self.inner.counters.log_lines_dropped.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let item = Item::Log { pid, scope: run.client, source: source.to_owned(), message: message.to_owned() };
        // A line of a client's run whose session is here goes to the client from here;
        // any other, to the node whose run it is.
        let cmd = if run.node == self.inner.node { Cmd::Line(item) } else { Cmd::Item { node: run.node, item } };
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
