//! Processes on other nodes: the seam between the scheduler and a cluster.
//!
//! The scheduler knows nothing of networks. A scheduler built with a [`Remote`] (see
//! `Builder::cluster`) hands it whatever names a pid of another node: a message
//! (`Shared::send`), a monitor, a termination, and the spawns its placement sends
//! elsewhere, a link or an exit signal. Each is one compare on the pid's node first ([`Pid::node`] against the
//! scheduler's own), so the local path costs what it did. Without a remote every pid is
//! local, whatever its node bits say (a journal written before pids had nodes).
//!
//! The other half is `for_cluster.rs`: what a cluster does to this scheduler on behalf
//! of another node, through `pub(crate)` methods of [`Handle`](super::Handle).

use std::sync::Arc;

use wasmproc_types::{ExitReason, Payload, Pid};

use super::caps::Capabilities;
use crate::error::SendError;
use crate::handler::{Completer, Factory};
use crate::limits::KindLimits;
pub use crate::limits::{RunId, RunLimits};

/// Called once with the pid and result of a process that a remote node watches.
pub(crate) type Notify = Box<dyn FnOnce(Pid, &ExitReason) + Send>;

pub(crate) use super::inbox::Signal;

/// A command over a process of another node that needs a grant the process does not
/// hold (`terminate`, `exit`, `link`, see [`Capabilities::OVER_OTHERS`]), which a process
/// may still use on its own children: the target's node carries it out only if the
/// target is a child of the process, and otherwise it completes with this text, the
/// denial the process's own node words (`None`: the process holds the grant).
pub(crate) type ChildOnly = Option<String>;

/// What another node answers a link, an exit signal or a termination with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Carried out.
    Done,
    /// There is no such process (it has ended, or never was).
    Noproc,
    /// Asked for with [`ChildOnly`], and the target is no child of the asker.
    NotChild,
    /// Refused, with the error to complete with (a link past `max_links`, say).
    Failed(String),
}

/// What a scheduler hands to the cluster: work for processes of other nodes. Called on
/// worker threads in the middle of dispatch, so no method may block.
pub(crate) trait Remote: Send + Sync + 'static {
    /// Queues a message from `from` (a local process, or this node's host) to `to` on
    /// another node. `Ok` once queued: messages between one pair of processes arrive in
    /// the order they were queued. `id`: the message's identity, in a durable scheduler
    /// (see `durable.rs`), which a remote that delivers exactly once goes by.
    fn send(&self, from: Pid, to: Pid, topic: String, body: Payload, id: Option<u64>) -> Result<(), SendError>;

    /// Whether a message to `to` (of another node) can be sent at all: checked when a
    /// durable process sends it, before its step's record keeps it for later, so that a
    /// pid no message can reach is an error the process sees.
    fn check(&self, _to: Pid) -> Result<(), SendError> {
        Ok(())
    }

    /// `watcher` (local) gets an [`Event::Exit`](crate::Event::Exit) when `target`
    /// (remote) ends, through [`Handle::exit_to`](super::Handle::exit_to): with `noproc`
    /// if there is no such process, `noconnection` if its node is or becomes unreachable.
    fn monitor(&self, watcher: Pid, target: Pid);

    /// Terminates `target` (remote) for `by` (a local process, or this node's host);
    /// `done` completes once it has ended, or with the reason it could not be.
    fn terminate(&self, by: Pid, target: Pid, child_only: ChildOnly, done: Option<Completer>);

    /// Links `target` (remote) to `from` (local), whose own side of the link is made
    /// already (`fresh`: by this link; otherwise it was there before). `done` completes
    /// once `target`'s node has answered: `Ok` when linked, and also when there is no such
    /// process or node, which `from` then hears as an exit signal from `target` (`noproc`,
    /// `noconnection`); an error (past `target`'s `max_links`, or [`ChildOnly`]) once
    /// `from`'s side, if `fresh`, is taken back
    /// ([`Handle::unlink_local`](super::Handle::unlink_local)).
    fn link(&self, from: Pid, target: Pid, fresh: bool, child_only: ChildOnly, done: Completer);

    /// Removes `target`'s side of its link to `from` (whose side is removed already).
    fn unlink(&self, from: Pid, target: Pid);

    /// Sends `target` (remote) an exit signal from `from` (local): an `exit` command,
    /// whose `done` completes once `target`'s node has taken it (`Ok` also when there
    /// is no such process, as on one node), or, with `done` `None`, the end of `from`
    /// told to a linked `target` ([`Signal::Link`]). Signals and messages from one
    /// process to another arrive in the order they were queued.
    fn signal(&self, from: Pid, target: Pid, signal: RemoteSignal, done: Option<(Completer, ChildOnly)>);

    /// The node the next spawn goes to, if not this one (the placement policy's choice).
    fn place(&self) -> Option<u16>;

    /// Spawns `request` on `node`; `done` completes with the child's pid.
    fn spawn(&self, node: u16, request: RemoteSpawn, done: Completer);

    /// The factory of a kind this node has no registration for, but the cluster holds
    /// (components fetched from other nodes, named by their hash) for processes of
    /// the run `run` (see [`RunId`]).
    fn factory(&self, kind: &str, run: RunId) -> Option<Arc<dyn Factory>>;
}

/// An exit signal bound for another node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RemoteSignal {
    pub(crate) reason: ExitReason,
    pub(crate) how: Signal,
}

/// A spawn bound for another node, with everything that bounds the child there: its
/// grants, mailbox and sandbox limits travel with it, never widened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RemoteSpawn {
    /// The spawning process (or a node's host).
    pub(crate) parent: Pid,
    /// The kind's name on the spawning node.
    pub(crate) kind: Option<String>,
    /// What the kind is made from ([`Factory::identity`]: a component's hash), so the
    /// other node can fetch and check it.
    pub(crate) identity: Option<String>,
    pub(crate) method: String,
    pub(crate) input: Vec<Payload>,
    pub(crate) caps: Capabilities,
    /// The child's mailbox bound; 0: the receiving scheduler's default.
    pub(crate) mailbox_capacity: usize,
    /// The sandbox limits the child may run under at most: the tighter of those its
    /// parent runs under and its kind's on the spawning node ([`Factory::limits`]). It
    /// runs under the tighter of these and the receiving node's own for the kind, and
    /// what it spawns in turn is bounded by those.
    pub(crate) limits: Option<KindLimits>,
    /// The scheduler limits its run set ([`RunLimits`]), which the child's tree runs
    /// under, clamped to the receiving node's; `None`: the receiving node's own. Boxed:
    /// most spawns carry none.
    pub(crate) run_limits: Option<Box<RunLimits>>,
    /// Whether the parent monitors the child.
    pub(crate) monitor: bool,
    /// Whether the child is linked to the parent before it first runs.
    pub(crate) link: bool,
    /// The run the child belongs to, its parent's ([`RunId`]); a `node` of 0: the
    /// spawning node's own run.
    pub(crate) run: RunId,
}
