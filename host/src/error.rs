//! Errors callers match on.

use wasmproc_types::Pid;

pub use wasmproc_types::DecodeError;

/// Why a spawn failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The process's `init` failed (for example: unknown entry method). The process
    /// never ran and no exit is reported for it.
    #[error("init of `{method}` failed: {source:#}")]
    Init {
        /// The entry method that was asked for.
        method: String,
        /// Why init failed.
        source: anyhow::Error,
    },
    /// The host already runs as many processes as it is allowed to.
    #[error("process limit reached: {limit} processes are running (raise `max_processes`)")]
    LimitExceeded {
        /// The limit.
        limit: usize,
    },
    /// A spawn for another node's run, which already runs as many processes here as the
    /// run allows ([`RunLimits::max_processes`](crate::cluster::RunLimits::max_processes),
    /// clamped to this scheduler's own).
    #[error(
        "process limit reached: {limit} processes of this run are alive on this node, as many as the run's `max_processes` ({limit}) allows"
    )]
    RunLimitExceeded {
        /// The run's limit on this node.
        limit: usize,
    },
    /// A root spawned under a [`ProcessQuota`](crate::limits::ProcessQuota) that has as
    /// many processes alive as it allows.
    #[error("process quota reached: {owner} has {live} processes alive, and its quota allows {limit}")]
    QuotaExceeded {
        /// Whose quota it is.
        owner: String,
        /// The processes alive under it.
        live: usize,
        /// Its bound.
        limit: usize,
    },
    /// The scheduler is shutting down and takes no new processes.
    #[error("scheduler is stopping: no new processes are accepted")]
    Stopping,
    /// No process kind is registered under this name.
    #[error("unknown process kind `{0}`")]
    UnknownKind(String),
    /// The journal could not record the spawn (it has failed, or the process is past its
    /// record limit): the process never ran.
    #[error("spawn not recorded: {0}")]
    Journal(String),
    /// The embedder's admission of the new pid failed
    /// ([`Handle::spawn_admitted`](crate::scheduler::Handle::spawn_admitted)): the process
    /// never ran, and nothing of it was recorded.
    #[error("spawn refused: {0}")]
    Refused(String),
    /// The kind's factory failed to make a process.
    #[error("could not create a process of kind `{kind}`: {source:#}")]
    Factory {
        /// The kind.
        kind: String,
        /// Why.
        source: anyhow::Error,
    },
}

/// Why a message, monitor or termination could not reach a process.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No such process: it never existed or has ended.
    #[error("no process {0}: it never existed or has ended")]
    NotFound(Pid),
    /// The process is finishing and accepts nothing more.
    #[error("process {0} is exiting and accepts no more messages")]
    Closed(Pid),
    /// The process's mailbox is full, by the count or the bytes of its undelivered
    /// messages; the message was not delivered.
    #[error("mailbox of process {pid} is full ({limit}); retry later or raise `{}`", limit.setting())]
    MailboxFull {
        /// The receiver.
        pid: Pid,
        /// The bound the message would have passed.
        limit: MailboxLimit,
    },
    /// A durable scheduler could not record the message (its journal has failed, or the
    /// scheduler is suspending its processes): it was not sent.
    #[error("message not recorded: {0}")]
    Journal(String),
    /// The receiver's node is not in the cluster: it never joined, or it was lost (see
    /// `wasmproc::cluster`). The message was not sent.
    #[error("no node {node} in the cluster for process {pid}: it never joined or has been lost")]
    NoNode {
        /// The receiver.
        pid: Pid,
        /// Its node.
        node: u16,
    },
    /// The cluster could not take the message now (its queue to the receiver's node is
    /// full, or this node is leaving); it was not sent.
    #[error("cluster refused the message for process {pid}: {reason}")]
    Cluster {
        /// The receiver.
        pid: Pid,
        /// Why.
        reason: String,
    },
}

/// Which bound of a mailbox a message would have passed
/// ([`Builder::mailbox_capacity`](crate::scheduler::Builder::mailbox_capacity),
/// [`Builder::mailbox_bytes`](crate::scheduler::Builder::mailbox_bytes)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MailboxLimit {
    /// The mailbox holds this many undelivered messages already.
    Messages(usize),
    /// The message would take the mailbox's undelivered messages past this many bytes.
    Bytes(usize),
}

impl MailboxLimit {
    /// The setting that raises the bound.
    pub fn setting(&self) -> &'static str {
        match self {
            MailboxLimit::Messages(_) => "mailbox_capacity",
            MailboxLimit::Bytes(_) => "mailbox_bytes",
        }
    }
}

impl std::fmt::Display for MailboxLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MailboxLimit::Messages(n) => write!(f, "{n} undelivered messages"),
            MailboxLimit::Bytes(n) => write!(f, "its undelivered messages would pass {n} bytes"),
        }
    }
}

/// Why a [`Port`](crate::Port) refused to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// The port's process is not in a step (it is in `init`, or waiting).
    #[error("`send` is only available during a step (not during `init`)")]
    NotInStep,
    /// The message is larger than the payload limit; the message names the limit. A Wasm
    /// process is ended for it, as for a yield past the limit.
    #[error("{0}")]
    TooLarge(String),
    /// The process was not granted the `send` command.
    #[error("permission denied: send")]
    PermissionDenied,
    /// The receiver could not take the message.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The port's process has ended.
    #[error("process {0} has ended: its port sends nothing more")]
    Ended(Pid),
    /// [`Port::respond`](crate::Port::respond) named no request waiting for this process.
    #[error("no request {0} is waiting for this process: it was answered already, or sent to another")]
    NoRequest(u64),
}
