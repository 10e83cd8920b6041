//! The embedder's handle to the scheduler, [`Handle`]: spawn, send, terminate, inspect.
//! What a spawn returns, a [`ProcessHandle`] to the process, is `process_handle.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmproc_types::{ExitReason, Payload, Pid};

use super::caps::Capabilities;
use super::cell::Watcher;
use super::lifecycle::{Admit, SpawnArgs};
use super::process_handle::{ExitSlot, ProcessHandle};
use super::recorded::{self, Recorded, Recorder};
use super::shared::Shared;
use super::state::Wake;
use super::stats::Stats;
use crate::error::{SendError, SpawnError};
use crate::handler::Request;
use crate::limits::{Lineage, ProcessQuota};
use crate::process::Process;
use crate::step::{Event, Exited};

/// A process to spawn, the name its kind is recorded under, and the kind's identity for
/// a durable spawn's record.
type Made = (Box<dyn Process>, Option<Arc<str>>, Option<String>);

/// Spawns, messages and inspects processes. Cheap to clone; usable from any thread,
/// including from command handlers.
#[derive(Clone)]
pub struct Handle {
    pub(super) shared: Arc<Shared>,
}

impl Handle {
    /// Spawns a process: `what` is a process value or a registered kind
    /// ([`Spawnable::kind`]); `options` is at least the entry method (a `&str` will do) and
    /// optionally its input, capabilities and mailbox bound. `init` runs here, on the
    /// caller's thread; the process is queued once it succeeds.
    ///
    /// ```
    /// # use wasmproc::{Scheduler, Payload};
    /// # use wasmproc::scheduler::{Spawnable, SpawnOptions};
    /// # struct Echo;
    /// # impl wasmproc::Process for Echo {
    /// #     fn init(&mut self, _: wasmproc::Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> { Ok(()) }
    /// #     fn step(&mut self, _: wasmproc::Events<'_>, out: &mut wasmproc::StepOutput) -> anyhow::Result<()> {
    /// #         out.complete(Ok(Payload::empty())); Ok(())
    /// #     }
    /// # }
    /// let echo = || -> anyhow::Result<Box<dyn wasmproc::Process>> { Ok(Box::new(Echo)) };
    /// let scheduler = Scheduler::builder().workers(1).kind("echo", echo).build()?;
    /// let handle = scheduler.handle();
    /// let a = handle.spawn(Echo, "main")?;
    /// let b = handle.spawn(Spawnable::kind("echo"), SpawnOptions::new("main").input(vec![Payload::u64(1)]))?;
    /// assert!(a.join().is_ok() && b.join().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// See [`SpawnError`]: init failures (unknown method…), the process limit, stopping;
    /// for a kind, [`SpawnError::UnknownKind`] and [`SpawnError::Factory`].
    pub fn spawn(
        &self,
        what: impl Into<Spawnable>,
        options: impl Into<SpawnOptions>,
    ) -> Result<ProcessHandle, SpawnError> {
        let made = self.make(what.into())?;
        self.spawn_with(made, options.into(), None, None)
    }

    /// As [`Handle::spawn`], handing the new process's pid to `admit` first: after its
    /// `init` has succeeded, before its spawn is journaled and before it can run. An
    /// embedder that keeps its own record of what it spawned writes it here, so that a
    /// crash at any point leaves either both that record and the process, or the record
    /// alone (a process the journal never held), never a process nobody knows of.
    ///
    /// # Errors
    ///
    /// As [`Handle::spawn`]; [`SpawnError::Refused`] with `admit`'s error, when the process
    /// is dropped without running and without a record in the journal.
    pub fn spawn_admitted(
        &self,
        what: impl Into<Spawnable>,
        options: impl Into<SpawnOptions>,
        mut admit: impl FnMut(Pid) -> Result<(), String>,
    ) -> Result<ProcessHandle, SpawnError> {
        let made = self.make(what.into())?;
        self.spawn_with(made, options.into(), Some(&mut admit), None)
    }

    /// As [`Handle::spawn_admitted`], with what tells when the spawn's record is in the
    /// journal ([`Recorded::wait`]): an embedder that answers for the spawn (a service
    /// telling its client that a workflow started) waits for that, and, with its own
    /// record of the spawn in the spawn's [note](SpawnOptions::note), needs no synced
    /// write of its own. Without a journal the spawn is recorded at once.
    ///
    /// # Errors
    ///
    /// As [`Handle::spawn_admitted`].
    pub fn spawn_recorded(
        &self,
        what: impl Into<Spawnable>,
        options: impl Into<SpawnOptions>,
        mut admit: impl FnMut(Pid) -> Result<(), String>,
    ) -> Result<(ProcessHandle, Recorded), SpawnError> {
        let made = self.make(what.into())?;
        let (recorded, recorder) = recorded::pair();
        let handle = self.spawn_with(made, options.into(), Some(&mut admit), Some(recorder))?;
        Ok((handle, recorded))
    }

    /// The process `what` is, and its kind's recorded name.
    fn make(&self, what: Spawnable) -> Result<Made, SpawnError> {
        match what.0 {
            Source::Process(process) => Ok((process, None, None)),
            Source::Kind(kind) => {
                let (name, factory) =
                    self.shared.kinds.find(&kind, None).ok_or_else(|| SpawnError::UnknownKind(kind.clone()))?;
                // An instance's memory lasts no longer than its process's next suspension.
                let process =
                    crate::heap::transient(|| factory.make()).map_err(|source| SpawnError::Factory { kind, source })?;
                let identity = self.shared.identity_of(&*factory);
                Ok((process, Some(name), identity))
            }
        }
    }

    fn spawn_with(
        &self,
        (process, kind, identity): Made,
        options: SpawnOptions,
        admit: Option<Admit<'_>>,
        recorder: Option<Recorder>,
    ) -> Result<ProcessHandle, SpawnError> {
        let shared = &self.shared;
        let slot = Arc::new(ExitSlot::default());
        let sandbox = process.limits();
        let bound = match &options.quota {
            Some(quota) if quota.live() >= quota.max() => {
                return Err(SpawnError::QuotaExceeded {
                    owner: quota.owner().to_owned(),
                    live: quota.live(),
                    limit: quota.max(),
                });
            }
            Some(quota) => Some(Arc::new(shared.quota_bound(quota))),
            None => None,
        };
        let args = SpawnArgs {
            parent: Pid::HOST,
            origin: None,
            kind,
            method: options.method,
            input: options.input,
            caps: options.capabilities.map_or_else(|| shared.settings.capabilities.clone(), Arc::new),
            mailbox_capacity: options.mailbox_capacity.unwrap_or(shared.settings.mailbox_capacity).max(1),
            watcher: Some(Watcher::Handle(slot.clone())),
            linked_to: None,
            lineage: Lineage::default().within(sandbox).bounded(bound),
            note: options.note,
            identity,
            recorder,
        };
        let cell = shared.spawn_admitted(process, args, admit)?;
        let handle = ProcessHandle::new(cell.pid(), slot);
        shared.schedule(cell);
        Ok(handle)
    }

    /// Tells schedulers in one OS process apart: a provider shared by several keys its
    /// callers by scheduler and pid.
    #[cfg_attr(not(feature = "http"), expect(dead_code, reason = "only the `http` provider keys its callers so"))]
    pub(crate) fn id(&self) -> usize {
        self.shared.id
    }

    /// Puts a message from the embedder (sender [`Pid::HOST`]) in `to`'s mailbox.
    ///
    /// # Errors
    ///
    /// See [`SendError`]: unknown or finished process, exiting process, full mailbox.
    pub fn send(&self, to: Pid, topic: impl Into<String>, body: Payload) -> Result<(), SendError> {
        match &self.shared.durable {
            // Recorded in the receiver's history first, and delivered once that is
            // committed; a full mailbox then drops it (counted as undelivered).
            Some(durable) => {
                let cell = self.shared.registry.get(to).ok_or(SendError::NotFound(to))?;
                durable.record_host_message(&cell, topic.into(), body).map_err(SendError::Journal)
            }
            None => self.shared.send(Pid::HOST, to, topic.into(), body, None),
        }
    }

    /// Hands the custom command `request` to the process `server` to carry out: a
    /// message from the caller with topic `COMMAND#ID` (`COMMAND#ID#KEY` when the request
    /// has an [idempotency key](Request::idempotency_key)) and the input as body, which
    /// `server` answers through [`Port::respond`](crate::Port::respond) with the `ID`. The
    /// command completes with the answer, or, if `server` ends first, with an error that
    /// says so.
    ///
    /// # Errors
    ///
    /// As for [`Handle::send`]; a durable scheduler does not serve requests (its history
    /// would have to record them) and refuses with [`SendError::Journal`]. The command is
    /// completed with the error in every case.
    pub fn forward(&self, server: Pid, request: Request<'_>) -> Result<(), SendError> {
        let shared = &self.shared;
        shared.requests.forward(shared.durable.is_some(), server, request, |caller, server, topic, payload| {
            shared.send(caller, server, topic, payload, None)
        })
    }

    /// Ends `pid` with the reason [`ExitReason::Terminated`]. Returns once termination is
    /// requested; the process ends when its current step (if any) returns, which its
    /// [`ProcessHandle`] and its monitors observe.
    ///
    /// # Errors
    ///
    /// [`SendError::NotFound`] or [`SendError::Closed`] if it has ended or is ending.
    pub fn terminate(&self, pid: Pid) -> Result<(), SendError> {
        if let Some(remote) = self.shared.remote_for(pid) {
            remote.terminate(Pid::node_host(self.shared.node), pid, None, None);
            return Ok(());
        }
        let cell = self.shared.registry.get(pid).ok_or(SendError::NotFound(pid))?;
        self.shared.terminate_cell(&cell, ExitReason::Terminated)
    }

    /// Delivers a cancel event with `reason` to `pid`, a process of this node: what it
    /// does with it is its own affair (the guest SDK ends the process unless it handles
    /// cancellation).
    ///
    /// # Errors
    ///
    /// [`SendError::NotFound`] or [`SendError::Closed`] if it has ended or is ending.
    pub fn cancel(&self, pid: Pid, reason: &str) -> Result<(), SendError> {
        let cell = self.shared.registry.get(pid).ok_or(SendError::NotFound(pid))?;
        match cell.deliver(Event::Cancel { reason: reason.to_owned() }) {
            Ok(Wake::Schedule) => {
                self.shared.schedule(cell);
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(_) => Err(SendError::Closed(pid)),
        }
    }

    /// Delivers a cancel event with `reason` to every live process (what [`Scheduler::stop`]
    /// does first), and returns how many it reached. Processes decide what to do: the
    /// guest SDK ends the process unless it handles cancellation.
    ///
    /// [`Scheduler::stop`]: super::Scheduler::stop
    pub fn cancel_all(&self, reason: &str) -> usize {
        let mut reached = 0;
        for cell in self.shared.registry.snapshot() {
            if let Ok(wake) = cell.deliver(Event::Cancel { reason: reason.to_owned() }) {
                reached += 1;
                if let Wake::Schedule = wake {
                    self.shared.schedule(cell);
                }
            }
        }
        reached
    }

    /// Ends every live process at once with `reason` (as [`Handle::terminate`] does one
    /// with [`ExitReason::Terminated`]), and returns how many it ended: a stop that forces
    /// what is left after a grace period gives [`ExitReason::Killed`]. A process in the
    /// middle of a step ends when the step returns.
    pub fn terminate_all(&self, reason: ExitReason) -> usize {
        let cells = self.shared.registry.snapshot();
        cells.iter().filter(|cell| self.shared.terminate_cell(cell, reason.clone()).is_ok()).count()
    }

    /// Ends every live process at once with `exited`; returns how many it ended.
    pub(super) fn end_all(&self, exited: &Exited) -> usize {
        let cells = self.shared.registry.snapshot();
        cells.iter().filter(|cell| self.shared.terminate_cell_because(cell, exited.clone()).is_ok()).count()
    }

    /// The process that spawned `pid` ([`Pid::HOST`] for one the embedder spawned);
    /// `None` if no such process is alive.
    pub fn parent_of(&self, pid: Pid) -> Option<Pid> {
        self.shared.registry.get(pid).map(|cell| cell.spec.parent)
    }

    /// How many of `pid`'s children are alive; `None` if no such process is alive.
    pub fn live_children(&self, pid: Pid) -> Option<usize> {
        self.shared.registry.get(pid).map(|cell| cell.lineage.children())
    }

    /// Whether `pid`'s mailbox has room now for a message of `topic` and `body`: the
    /// check a send makes, without sending. A durable scheduler records the embedder's
    /// messages before it delivers them, and cannot report a full mailbox then; an
    /// embedder that must know asks first (another sender may fill the room between the
    /// question and the send).
    ///
    /// # Errors
    ///
    /// [`SendError::NotFound`], [`SendError::Closed`] or [`SendError::MailboxFull`], as
    /// a send would fail now.
    pub fn check_room(&self, pid: Pid, topic: &str, body: &Payload) -> Result<(), SendError> {
        let cell = self.shared.registry.get(pid).ok_or(SendError::NotFound(pid))?;
        cell.check_room(topic, body)
    }

    /// Processes alive now.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Processes in the registry now (equal to [`Handle::live`] whenever no spawn or
    /// exit is in flight).
    pub fn registered(&self) -> usize {
        self.shared.registry.len()
    }

    /// Blocks until no process is alive, or `timeout` passes: true if none is.
    pub fn wait_idle(&self, timeout: Option<Duration>) -> bool {
        self.shared.wait_drained(timeout.map(|t| Instant::now() + t))
    }

    /// Whether [`Scheduler::stop`] has begun.
    ///
    /// [`Scheduler::stop`]: super::Scheduler::stop
    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// Whether the scheduler has a journal: its processes are durable.
    pub fn is_durable(&self) -> bool {
        self.shared.durable.is_some()
    }

    /// What the journal has committed, if processes are durable.
    pub fn journal_stats(&self) -> Option<crate::journal::CommitStats> {
        self.shared.durable.as_ref().map(|durable| durable.stats())
    }

    /// Counters, read without stopping anything (so slightly inconsistent with each other
    /// while processes run).
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}

/// What [`Handle::spawn`] starts: a process value (any [`Process`], or a boxed one) or a
/// kind registered with [`Builder::kind`](super::Builder::kind), made by its factory.
pub struct Spawnable(Source);

enum Source {
    Process(Box<dyn Process>),
    Kind(String),
}

impl Spawnable {
    /// A process of the registered `kind`.
    pub fn kind(kind: impl Into<String>) -> Self {
        Spawnable(Source::Kind(kind.into()))
    }
}

impl<P: Process> From<P> for Spawnable {
    fn from(process: P) -> Self {
        Spawnable(Source::Process(Box::new(process)))
    }
}

impl From<Box<dyn Process>> for Spawnable {
    fn from(process: Box<dyn Process>) -> Self {
        Spawnable(Source::Process(process))
    }
}

impl std::fmt::Debug for Spawnable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::Process(_) => f.write_str("Spawnable::Process(..)"),
            Source::Kind(kind) => write!(f, "Spawnable::Kind({kind:?})"),
        }
    }
}

/// How to spawn a process from the embedder.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    pub(crate) method: String,
    pub(crate) input: Vec<Payload>,
    pub(crate) capabilities: Option<Capabilities>,
    pub(crate) mailbox_capacity: Option<usize>,
    pub(crate) quota: Option<ProcessQuota>,
    pub(crate) note: Option<Vec<u8>>,
}

impl SpawnOptions {
    /// Runs entry `method`, with no input, the scheduler's default capabilities and
    /// mailbox capacity.
    pub fn new(method: impl Into<String>) -> Self {
        SpawnOptions { method: method.into(), ..Self::default() }
    }

    /// The entry method's input.
    pub fn input(mut self, input: Vec<Payload>) -> Self {
        self.input = input;
        self
    }

    /// What the process (and, at most, its children) may yield.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = Some(capabilities);
        self
    }

    /// The embedder's own bytes about this spawn, kept in a durable scheduler's journal
    /// with the spawn's record (and its snapshots) and given back with its run
    /// ([`HeldRun::note`](crate::journal::HeldRun::note)); the process never sees them.
    /// What the embedder keeps elsewhere about the spawn can be made again from its
    /// note after a crash that lost it. A scheduler without a journal drops it.
    pub fn note(mut self, note: Vec<u8>) -> Self {
        self.note = Some(note);
        self
    }

    /// This process's mailbox bound.
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = Some(capacity);
        self
    }

    /// Counts the process and every process it spawns, to any depth, against `quota`:
    /// the spawn fails ([`SpawnError::QuotaExceeded`]) when the quota has as many alive
    /// as it allows, and so does a spawn of any of them past it. A durable process
    /// resumed from its journal counts against the quota its kind's factory gives
    /// ([`Factory::quota`](crate::handler::Factory::quota)).
    pub fn quota(mut self, quota: ProcessQuota) -> Self {
        self.quota = Some(quota);
        self
    }
}

impl From<&str> for SpawnOptions {
    fn from(method: &str) -> Self {
        SpawnOptions::new(method)
    }
}

impl From<String> for SpawnOptions {
    fn from(method: String) -> Self {
        SpawnOptions::new(method)
    }
}
