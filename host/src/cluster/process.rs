//! A process [`Cluster::spawn`](super::Cluster::spawn) or
//! [`Client::spawn`](super::Client::spawn) starts, on this node or another: how to start
//! it ([`RemoteSpawnOptions`]) and what to wait on ([`RemoteProcess`]).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::handler::KindLimits;
use crate::scheduler::SpawnOptions;
use crate::scheduler::remote::RunLimits;
use crate::{ExitReason, Payload, Pid};

/// How [`Cluster::spawn`] starts its process: the [`SpawnOptions`] of a local spawn (its
/// method, input, capabilities and mailbox bound), and the sandbox and scheduler limits
/// it runs under at most.
#[derive(Debug, Clone)]
pub struct RemoteSpawnOptions {
    pub(super) options: SpawnOptions,
    pub(super) limits: Option<KindLimits>,
    pub(super) run_limits: Option<RunLimits>,
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
pub struct RemoteProcess(pub(super) Arc<RemoteSlot>);

impl RemoteProcess {
    /// Its pid, once the target node has answered (at once for a local one); `None`
    /// before, or if the spawn failed.
    pub fn pid(&self) -> Option<Pid> {
        *self.0.pid.lock()
    }

    /// Blocks until the process ends and returns its result: its payload, or why it
    /// ended ([`ExitReason`]); [`ExitReason::Error`] if its spawn failed,
    /// [`ExitReason::Noconnection`] if its node was lost.
    pub fn join(&self) -> Result<Payload, ExitReason> {
        let mut result = self.0.result.lock();
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            self.0.done.wait(&mut result);
        }
    }

    /// As [`RemoteProcess::join`], giving up after `timeout` (`None`).
    pub fn join_timeout(&self, timeout: Duration) -> Option<Result<Payload, ExitReason>> {
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
pub(super) struct RemoteSlot {
    pub(super) pid: Mutex<Option<Pid>>,
    pub(super) result: Mutex<Option<Result<Payload, ExitReason>>>,
    pub(super) done: Condvar,
}

impl RemoteSlot {
    pub(super) fn set(&self, result: Result<Payload, ExitReason>) {
        let mut slot = self.result.lock();
        if slot.is_none() {
            *slot = Some(result);
        }
        self.done.notify_all();
    }
}
