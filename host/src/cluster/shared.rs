//! What a node's threads share: the scheduler's workers (through [`Remote`]), the
//! embedder (through [`Cluster`](super::Cluster)) and the cluster's thread (`node/`), and
//! the commands the first two send the third.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::config::{MAX_BACKLOG, Placement};
use super::process::RemoteSlot;
use super::store::CodeStore;
use super::wire::{Item, Key};
use crate::error::SendError;
use crate::handler::{Completer, Factory};
use crate::scheduler::Handle;
use crate::scheduler::remote::{ChildOnly, Remote, RemoteSignal, RemoteSpawn, RunId};
use crate::{ExitReason, Payload, Pid};

/// Takes a line a process of this node's run wrote on another node: its pid, its source
/// (`stdout`, `stderr`, or the level of a `log` call) and the line.
pub type LineSink = Arc<dyn Fn(Pid, &str, &str) + Send + Sync>;

/// Turns a component's bytes, fetched from another node, into a factory of processes.
pub type Loader = Arc<dyn Fn(&[u8]) -> anyhow::Result<Arc<dyn Factory>> + Send + Sync>;

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
pub(super) struct Counters {
    pub(super) messages_sent: AtomicU64,
    pub(super) messages_delivered: AtomicU64,
    pub(super) messages_refused: AtomicU64,
    pub(super) messages_lost: AtomicU64,
    pub(super) retransmitted: AtomicU64,
    pub(super) nodes_lost: AtomicU64,
    pub(super) frames_refused: AtomicU64,
    pub(super) log_lines_dropped: AtomicU64,
    pub(super) frames_repeated: AtomicU64,
}

/// What a node's threads share: the scheduler's workers (through [`Remote`]), the
/// embedder and the cluster thread.
pub(crate) struct Inner {
    pub(super) node: u16,
    pub(super) incarnation: u64,
    pub(super) name: String,
    pub(super) key: Key,
    pub(super) prefix: String,
    pub(super) placement: Placement,
    pub(super) accepts: bool,
    pub(super) share_components: bool,
    pub(super) commands: tokio::sync::mpsc::UnboundedSender<Cmd>,
    /// The incarnation of each node id in the cluster now (0: none); read by workers
    /// to refuse a send to an unknown node at once.
    pub(super) alive: Box<[AtomicU64]>,
    /// The members, for placement and [`Cluster::nodes`]; written by the cluster thread
    /// on each announcement.
    pub(super) view: RwLock<Vec<NodeInfo>>,
    /// Spawns this node placed on each node since its last announcement.
    pub(super) placed: Box<[AtomicU64]>,
    /// Messages queued or unacknowledged (bounded by [`MAX_BACKLOG`]).
    pub(super) backlog: AtomicUsize,
    /// Guest lines queued or unacknowledged (bounded by [`MAX_LOG_BACKLOG`]).
    pub(super) log_backlog: AtomicUsize,
    /// [`ClusterConfig::grace`].
    pub(super) grace: Duration,
    /// Where lines of this node's run that other nodes forward go.
    pub(super) lines: OnceLock<LineSink>,
    /// Monitors, terminations, spawns, links and exit signals of processes queued for
    /// the cluster's thread (bounded by `max_queued`).
    pub(super) queued: AtomicUsize,
    /// [`MAX_QUEUED`], but for tests (`ClusterConfig::max_queued`).
    pub(super) max_queued: usize,
    /// The largest frame the server takes, less room for the header.
    pub(super) max_item: usize,
    pub(super) counters: Counters,
    pub(super) handle: OnceLock<Handle>,
    pub(super) loader: OnceLock<Loader>,
    /// Components others may fetch from here.
    pub(super) code: CodeStore,
    /// Factories of components fetched from other nodes or clients, by hash.
    pub(super) fetched: RwLock<FxHashMap<String, Fetched>>,
    /// Fetches under way, by hash and run: concurrent spawns of one component in one run
    /// share one.
    pub(super) fetching: Mutex<FxHashMap<(String, u64), Arc<Fetch>>>,
    /// The embedder's spawns whose results are awaited, by token.
    pub(super) embedded: Mutex<FxHashMap<u64, Arc<RemoteSlot>>>,
    pub(super) next_token: AtomicU64,
}

/// One fetch of a component, shared by the spawns waiting for it.
pub(super) type Fetch = tokio::sync::OnceCell<anyhow::Result<Arc<dyn Factory>>>;

/// A component fetched by hash, and the runs that brought it (see `code.rs`).
pub(crate) struct Fetched {
    pub(super) factory: Arc<dyn Factory>,
    pub(super) runs: rustc_hash::FxHashSet<u64>,
}

impl Inner {
    /// The accepting node with the fewest live processes, counting what this node
    /// placed there since it last announced; ties go to the lowest id.
    pub(super) fn least_loaded(&self) -> Option<u16> {
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

    pub(super) fn queue(&self, cmd: Cmd) -> Result<(), String> {
        self.commands.send(cmd).map_err(|_| "this node has left the cluster".to_owned())
    }

    /// Queues a monitor, termination or spawn for the cluster's thread, unless
    /// [`MAX_QUEUED`] already wait (the thread is stalled: the server is gone, say):
    /// hands it to `refused` with why.
    pub(super) fn queue_bounded(&self, cmd: Cmd, refused: impl FnOnce(Cmd, String)) {
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

    pub(super) fn is_member(&self, node: u16) -> bool {
        self.alive.get(usize::from(node)).is_some_and(|a| a.load(Ordering::Acquire) != 0)
    }

    /// The factory of component `hash` fetched before, if processes of run `run` may
    /// spawn it: the run brought it, components are shared, or the run is a node's own
    /// (no client's: the embedders', trusted with all they hold).
    pub(super) fn factory_in(&self, hash: &str, run: RunId) -> Option<Arc<dyn Factory>> {
        let fetched = self.fetched.read();
        let fetched = fetched.get(hash)?;
        (self.share_components || run.client == 0 || fetched.runs.contains(&run.client))
            .then(|| fetched.factory.clone())
    }
}

impl Remote for Inner {
    fn send(&self, from: Pid, to: Pid, topic: String, body: Payload, _id: Option<u64>) -> Result<(), SendError> {
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
                tracing::debug!(%watcher, %target, why, "a monitor of another node's process was not queued");
                handle.exit_to(watcher, target, lost(target.node(), None));
            }
        });
    }

    fn terminate(&self, by: Pid, target: Pid, child_only: ChildOnly, done: Option<Completer>) {
        self.queue_bounded(Cmd::Terminate { by, target, child_only, done }, |cmd, why| {
            if let Cmd::Terminate { done: Some(done), .. } = cmd {
                done.complete(Err(format!("noconnection: {why}")));
            }
        });
    }

    fn link(&self, from: Pid, target: Pid, fresh: bool, child_only: ChildOnly, done: Completer) {
        self.queue_bounded(Cmd::Link { from, target, fresh, child_only, done }, |cmd, why| {
            if let Cmd::Link { done, .. } = cmd {
                if let Some(handle) = self.handle.get().filter(|_| fresh) {
                    handle.unlink_local(from, target);
                }
                done.complete(Err(format!("noconnection: {why}")));
            }
        });
    }

    fn unlink(&self, from: Pid, target: Pid) {
        // Not bounded: the process's half is gone already, and the other must follow;
        // there is one unlink at most for each link made, and those are bounded.
        let _ = self.queue(Cmd::Item { node: target.node(), item: Item::Unlink { from, to: target } });
    }

    fn signal(&self, from: Pid, target: Pid, signal: RemoteSignal, done: Option<(Completer, ChildOnly)>) {
        match done {
            Some(done) => {
                self.queue_bounded(Cmd::Signal { from, target, signal, done: Some(done) }, |cmd, why| {
                    if let Cmd::Signal { done: Some((done, _)), .. } = cmd {
                        done.complete(Err(format!("noconnection: {why}")));
                    }
                });
            }
            // A linked process's end: never dropped while the link to its node lives,
            // and bounded by its links (`max_links`).
            None => drop(self.queue(Cmd::Signal { from, target, signal, done: None })),
        }
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

    fn factory(&self, kind: &str, run: RunId) -> Option<Arc<dyn Factory>> {
        self.factory_in(kind, run)
    }
}

/// What the rest of the node asks the cluster's thread to do.
pub(crate) enum Cmd {
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
        child_only: ChildOnly,
        done: Option<Completer>,
    },
    /// `from`'s half of the link is made (`fresh`: by this link): have `target`'s node
    /// make the other.
    Link {
        from: Pid,
        target: Pid,
        fresh: bool,
        child_only: ChildOnly,
        done: Completer,
    },
    /// `done`: an `exit` command's completer; `None` for a linked process's end.
    Signal {
        from: Pid,
        target: Pid,
        signal: RemoteSignal,
        done: Option<(Completer, ChildOnly)>,
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

/// The reason of an exit or failure because node `node` (named `name`, if known) is
/// unreachable.
pub(super) fn noconnection(node: u16, name: Option<&str>) -> String {
    noconnection_text(node, name)
}

/// The exit reason of a process of node `node` (named `name`, if known) once the node
/// is unreachable: [`ExitReason::Noconnection`] with the node's name, or its id.
pub(super) fn lost(node: u16, name: Option<&str>) -> ExitReason {
    ExitReason::Noconnection(name.map_or_else(|| node.to_string(), str::to_owned))
}

fn noconnection_text(node: u16, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("noconnection: node `{name}` (id {node}) is not in the cluster (lost or left)"),
        None => format!("noconnection: node {node} is not in the cluster (lost or never joined)"),
    }
}
