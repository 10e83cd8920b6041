//! Command dispatch: how the yields a step writes reach the code that carries them out,
//! and what the embedder registers for it.
//!
//! Built-in commands (`sleep`, `spawn`, `send`, `monitor`, `terminate`) are handled by
//! the scheduler itself; custom commands go to the [`Handler`] the embedder registered
//! under their name; `spawn` makes its process with the [`Factory`] of the kind it names.
//! Every yield is answered by exactly one completion (see `completer.rs`): the handler's
//! [`Completer`] may complete it at once or later from any thread.
//!
//! A handler registered as `family.*` carries out every command `family.<anything>` that
//! has no handler of its own: that is how a [`Provider`](crate::provider::Provider)
//! serves a whole family of commands.
//!
//! Checks, in order: an unknown custom command completes with ``unknown command `name` ``;
//! a command the process was not granted completes with `permission denied: name`.

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use wasmproc_types::{Payload, Pid};

use super::caps::{Capabilities, family};
use super::cell::{ProcessCell, Watcher};
use super::completer::{Completer, DROPPED, complete};
use super::handle::Handle;
use super::lifecycle::SpawnArgs;
use super::shared::Shared;
use super::worker::{self, panic_message};
use crate::limits::{KindLimits, Lineage};
use crate::process::Process;
use crate::step::{Command, CommandKind, Outcome, SpawnRequest, Yield};

/// Code that carries out a custom command.
///
/// Called on the worker thread that ran the yielding step, so it must not block: a
/// handler with slow work takes the [`Completer`] out of the [`Request`]
/// ([`Request::into_parts`]) and completes from a thread of its own. A panic in a handler
/// completes the yield with an error.
pub trait Handler: Send + Sync + 'static {
    /// Carries out `request`, completing it now or later.
    fn handle(&self, request: Request<'_>);

    /// Whether the command `name` only reads: it changes nothing outside the process
    /// that yields it, so that carrying it out again, or for a step that is then lost,
    /// is harmless (a clock, random numbers). A durable process's step whose yields all
    /// only read, or sleep, has them carried out at once instead of after its record's
    /// commit (see [`crate::journal`], "Reads go on"). `false` unless a handler says so;
    /// [`ReadOnly`] says so for a closure.
    fn reads_only(&self, name: &str) -> bool {
        let _ = name;
        false
    }
}

/// A handler whose commands only read (see [`Handler::reads_only`]):
/// `.handler("clock", ReadOnly(|request: Request<'_>| …))`. Wrapping a handler whose
/// command has an effect outside the process breaks a durable process's write-ahead
/// guarantee for it.
pub struct ReadOnly<H>(pub H);

impl<H: Handler> Handler for ReadOnly<H> {
    fn handle(&self, request: Request<'_>) {
        self.0.handle(request);
    }

    fn reads_only(&self, _: &str) -> bool {
        true
    }
}

impl<F: Fn(Request<'_>) + Send + Sync + 'static> Handler for F {
    fn handle(&self, request: Request<'_>) {
        self(request)
    }
}

/// Serves one family of commands.
///
/// `handle` runs on the worker thread that ran the yielding step, so it must not block:
/// a provider with I/O to do takes the [`Completer`] out of
/// the request ([`Request::into_parts`]) and completes from a thread of its own.
pub trait Provider: Send + Sync + 'static {
    /// The family: the provider serves the commands `family.<command>`.
    fn family(&self) -> &str;

    /// Carries out one command of the family; [`Request::name`] is the whole name.
    fn handle(&self, request: Request<'_>);

    /// Whether the command `name` of the family only reads; see
    /// [`Handler::reads_only`]. `false` unless a provider says so.
    fn reads_only(&self, name: &str) -> bool {
        let _ = name;
        false
    }
}

/// Makes processes of one registered kind, for `spawn`.
pub trait Factory: Send + Sync + 'static {
    /// A new, uninitialised process.
    ///
    /// # Errors
    ///
    /// The spawn fails with this error.
    fn make(&self) -> anyhow::Result<Box<dyn Process>>;

    /// What the processes are made from, for a durable scheduler to check on resuming: a
    /// journal written by processes of one identity is not resumed with another (a Wasm
    /// component's is its hash). `None` (the default) checks nothing.
    fn identity(&self) -> Option<String> {
        None
    }

    /// The limits each process of the kind runs under when nothing tighter bounds it
    /// (see [`Factory::make_within`]). `None` (the default): the kind's processes have
    /// no such limits (a native process runs on the host's own terms).
    fn limits(&self) -> Option<KindLimits> {
        None
    }

    /// A new, uninitialised process under limits no looser than `bound` (nor than its
    /// own, [`Factory::limits`]): how a process is made for a spawner that ran under
    /// `bound`, on this node or another.
    ///
    /// A factory that reports limits must override this: the default refuses rather
    /// than make a process whose limits it cannot tighten.
    ///
    /// # Errors
    ///
    /// The spawn fails with this error.
    fn make_within(&self, bound: KindLimits) -> anyhow::Result<Box<dyn Process>> {
        anyhow::ensure!(
            self.limits().is_none(),
            "the kind reports limits but cannot make a process under its spawner's `{bound:?}`"
        );
        self.make()
    }
}

/// A new process of `factory` under `bound` (the limits its spawner ran under, if any),
/// with the limits it runs under: the tighter of `bound` and the kind's own. A kind
/// without limits of its own (a native process) runs on the host's terms but carries
/// `bound` on to what it spawns, so no process down the tree runs looser.
pub(crate) fn make_under(
    factory: &dyn Factory,
    bound: Option<KindLimits>,
) -> anyhow::Result<(Box<dyn Process>, Option<KindLimits>)> {
    let process = match bound {
        Some(bound) => factory.make_within(bound)?,
        None => factory.make()?,
    };
    Ok((process, KindLimits::tighter(factory.limits(), bound)))
}

impl<F: Fn() -> anyhow::Result<Box<dyn Process>> + Send + Sync + 'static> Factory for F {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        self()
    }
}

/// One custom command to carry out, borrowed for the duration of the handler call.
///
/// Complete it with [`Request::complete`], or take a [`Completer`] with
/// [`Request::into_parts`] to complete later. Dropping it unused completes the yield with
/// an error, so a process never waits on a handler that forgot it.
pub struct Request<'a> {
    caller: &'a Arc<ProcessCell>,
    tag: u64,
    /// Where the yield is in its process's journal, for a durable process.
    origin: Option<Origin>,
    name: Cow<'static, str>,
    payload: Payload,
    answered: bool,
}

impl Request<'_> {
    /// The process that yielded the command.
    pub fn caller(&self) -> Pid {
        self.caller.pid()
    }

    /// The command's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command's input.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// For a durable process, a key that names this yield and no other, the same each
    /// time the yield is carried out: after a crash, a command whose completion was not
    /// recorded is carried out again with the key it had, so a handler with an effect
    /// outside the host can make the retry do nothing twice. `None` for a process that
    /// is not durable.
    ///
    /// The key is the process's pid, the step's place in its history and the yield's
    /// tag, with the process's recorded random seed: pids start again in every new
    /// journal, and the seed tells a process of one journal from its namesake in another,
    /// so a store of answers shared across runs never mistakes one for the other.
    pub fn idempotency_key(&self) -> Option<String> {
        let origin = self.origin?;
        let seed = self.caller.durable_step.lock().as_ref().map_or([0; 32], |step| step.seed);
        let run: String = seed[..8].iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("{}-{}-{}-{run}", self.caller.pid(), origin.seq, self.tag))
    }

    /// The scheduler, to spawn, send or terminate on the caller's behalf.
    pub fn scheduler(&self) -> Handle {
        Handle { shared: self.caller.scheduler().clone() }
    }

    /// Completes the command now.
    pub fn complete(mut self, result: Outcome) {
        self.answered = true;
        complete(self.caller, self.tag, result);
    }

    /// The input and a completer, to finish the work elsewhere.
    pub fn into_parts(mut self) -> (Payload, Completer) {
        self.answered = true;
        let payload = std::mem::take(&mut self.payload);
        (payload, Completer::new(self.caller.clone(), self.tag))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if !self.answered {
            complete(self.caller, self.tag, Err(DROPPED.to_owned()));
        }
    }
}

/// A registered handler and the name it was registered under (`kv.*` for a family's).
pub(super) struct Registered {
    pub(super) name: String,
    pub(super) handler: Arc<dyn Handler>,
}

/// What dispatch needs to know of a custom command before carrying it out: its handler
/// and whether the yielding process may use it. Both depend only on the command's name
/// and the process's capabilities, which are fixed once a scheduler is built and a
/// process spawned, so a resolution never goes stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Resolution {
    /// The handler's place in `Shared::commands`; `None`: no handler, an unknown command.
    pub(super) handler: Option<usize>,
    pub(super) allowed: bool,
}

/// The custom commands one worker resolved last, so that a process yielding the same
/// command step after step (every process that polls a provider or a clock) pays a
/// comparison of its name instead of a hash look-up of the handler and a search of its
/// capabilities for it. Processes spawned alike share one capabilities value, so an entry
/// serves all of them.
pub(super) struct Resolved {
    entries: Vec<Entry>,
    /// The entry the next miss replaces once all [`RESOLVED`] are taken.
    next: usize,
}

/// How many commands a worker keeps resolved: enough for a workflow's handful of
/// commands, few enough that a miss (a hostile guest yielding a new name every step)
/// costs a short scan.
const RESOLVED: usize = 8;

struct Entry {
    /// Held so that the value cannot be freed and another take its address, which is what
    /// `caps` is matched by.
    caps: Arc<Capabilities>,
    /// A command named by a `&'static str` (a native process's) is kept borrowed, so that
    /// its next yield matches by address without comparing bytes.
    name: Cow<'static, str>,
    resolution: Resolution,
}

impl Resolved {
    pub(super) fn new() -> Self {
        Resolved { entries: Vec::with_capacity(RESOLVED), next: 0 }
    }

    /// `name`, yielded by a process granted `caps`, resolved by `shared`: from the cache,
    /// or looked up and kept.
    #[expect(clippy::ptr_arg, reason = "the `Cow` is kept: a borrowed name stays borrowed")]
    pub(super) fn get(&mut self, shared: &Shared, caps: &Arc<Capabilities>, name: &Cow<'static, str>) -> Resolution {
        let same = |kept: &str| (kept.as_ptr() == name.as_ptr() && kept.len() == name.len()) || kept == &**name;
        if let Some(entry) = self.entries.iter().find(|e| Arc::ptr_eq(&e.caps, caps) && same(&e.name)) {
            return entry.resolution;
        }
        let resolution = shared.resolve(caps, name);
        let entry = Entry { caps: caps.clone(), name: name.clone(), resolution };
        if self.entries.len() < RESOLVED {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % RESOLVED;
        }
        resolution
    }
}

/// Where a yield of a durable process is in its journal: the record of its step, and its
/// place among that step's yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Origin {
    pub(super) seq: u64,
    pub(super) index: u32,
}

impl Origin {
    /// The identity of the message a yielded `send` at this origin carries.
    pub(super) fn message_id(self) -> u64 {
        (self.seq << 20) | super::durable::YIELD_SEND_BIT | u64::from(self.index)
    }
}

impl Shared {
    /// Carries out one yield; `origin` is where it is in a durable process's journal.
    pub(super) fn dispatch_from(self: &Arc<Self>, cell: &Arc<ProcessCell>, y: Yield, origin: Option<Origin>) {
        let tag = y.tag;
        if let Command::Custom { name, payload } = y.command {
            let resolution =
                worker::resolve(self, &cell.spec.caps, &name).unwrap_or_else(|| self.resolve(&cell.spec.caps, &name));
            let Some(index) = resolution.handler else {
                return complete(cell, tag, Err(format!("unknown command `{name}`")));
            };
            if !resolution.allowed {
                return complete(cell, tag, Err(self.denied(&name)));
            }
            let registered = &self.commands[index];
            self.count_yield(CommandKind::Custom);
            let request = Request { caller: cell, tag, origin, name, payload, answered: false };
            // A panicking handler drops the request while unwinding, and its drop
            // answers the yield with an error.
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| registered.handler.handle(request))) {
                tracing::error!(
                    command = registered.name.as_str(),
                    panic = panic_message(&*panic),
                    "a command handler panicked"
                );
            }
            return;
        }
        let kind = y.command.kind();
        if !cell.spec.caps.allows_builtin(kind) && !self.ends_own_child(cell, &y.command) {
            return complete(cell, tag, Err(self.denied(kind.name())));
        }
        self.count_yield(kind);
        match y.command {
            Command::Sleep(duration) if duration.is_zero() => complete(cell, tag, Ok(Payload::empty())),
            Command::Sleep(duration) => self.timer.sleep(duration, Completer::new(cell.clone(), tag)),
            Command::Spawn(request) => {
                let request = match self.spawn_elsewhere(cell, request, || Completer::new(cell.clone(), tag)) {
                    Ok(()) => return,
                    Err(request) => request,
                };
                let result = self.spawn_child(cell, request, origin.map(|o| (o.seq, tag)));
                complete(
                    cell,
                    tag,
                    result.as_ref().map(|child| Payload::u64(child.pid().as_u64())).map_err(Clone::clone),
                );
                // The spawn completes before the child is queued, so the parent always
                // sees the child's pid before any exit event of the child.
                if let Ok(child) = result {
                    self.schedule(child);
                }
            }
            Command::Send { to, topic, body } => {
                let sent = self.send_as(cell, to, topic, body, origin.map(Origin::message_id));
                complete(cell, tag, sent.map(|()| Payload::empty()).map_err(|e| e.to_string()));
            }
            Command::Monitor(target) => {
                self.monitor(cell, target);
                complete(cell, tag, Ok(Payload::empty()));
            }
            Command::Terminate(target) => {
                if let Some(remote) = self.remote_for(target) {
                    return remote.terminate(cell.pid(), target, Some(Completer::new(cell.clone(), tag)));
                }
                // Completes once the target has ended: its exit notifies the completer.
                let watcher = Watcher::Yield(Completer::new(cell.clone(), tag));
                if let Err((error, watcher)) = self.terminate(target, Some(watcher))
                    && let Some(Watcher::Yield(done)) = watcher
                {
                    done.complete(Err(error.to_string()));
                }
            }
            Command::Custom { .. } => unreachable!("handled above"),
        }
    }

    /// Whether `command` terminates a child of `cell` on this node: granted whether or
    /// not `terminate` is, since a process may end what it started (a supervisor stops
    /// its children so), and a child's pid is its parent's to know.
    fn ends_own_child(&self, cell: &ProcessCell, command: &Command) -> bool {
        let Command::Terminate(target) = command else { return false };
        self.remote_for(*target).is_none()
            && self.registry.get(*target).is_some_and(|child| child.spec.parent == cell.pid())
    }

    /// The answer to a command the process was not granted: `permission denied: NAME`,
    /// and how to grant it when the embedder said ([`Builder::denial_hint`](super::Builder::denial_hint)).
    fn denied(&self, name: &str) -> String {
        match &self.settings.denial_hint {
            Some(hint) => format!("permission denied: {name} ({})", hint(name)),
            None => format!("permission denied: {name}"),
        }
    }

    /// Whether `command` may be carried out before the record of the durable step that
    /// yielded it is committed: a sleep, or a custom command whose handler only reads.
    pub(super) fn reads_only(&self, command: &Command) -> bool {
        match command {
            Command::Sleep(_) => true,
            Command::Custom { name, .. } => {
                self.handler_for(name).is_some_and(|index| self.commands[index].handler.reads_only(name))
            }
            _ => false,
        }
    }

    /// The place in `commands` of the handler registered for the command `name`, under
    /// its own name or as its family's (`kv.*` for `kv.get`).
    fn handler_for(&self, name: &str) -> Option<usize> {
        self.handlers.get(name).or_else(|| self.families.get(family(name)?)).copied()
    }

    /// The custom command `name`, yielded by a process granted `caps`, looked up.
    pub(super) fn resolve(&self, caps: &Capabilities, name: &str) -> Resolution {
        Resolution { handler: self.handler_for(name), allowed: caps.allows_custom(name) }
    }

    /// Starts the child `request` asks for, not yet queued.
    fn spawn_child(
        self: &Arc<Self>,
        parent: &Arc<ProcessCell>,
        request: SpawnRequest,
        origin: Option<(u64, u64)>,
    ) -> Result<Arc<ProcessCell>, String> {
        let kind = match &request.kind {
            Some(name) => self.kinds.get_key_value(name.as_str()),
            None => parent.spec.kind.as_ref().and_then(|k| self.kinds.get_key_value(k.as_ref())),
        };
        // A kind this node lacks may be one the cluster fetched (named by its hash).
        let fetched;
        let kind = match (kind, &self.remote) {
            (None, Some(remote)) => {
                let name = request.kind.as_deref().or(parent.spec.kind.as_deref());
                fetched =
                    name.and_then(|name| Some((Arc::<str>::from(name), remote.factory(name, parent.lineage.run())?)));
                fetched.as_ref().map(|(name, factory)| (name, factory))
            }
            (kind, _) => kind,
        };
        let Some((kind, factory)) = kind else {
            return Err(match &request.kind {
                Some(name) => format!("spawn failed: unknown process kind `{name}`"),
                None => {
                    "spawn failed: the spawning process has no registered kind to spawn more of; name one".to_owned()
                }
            });
        };
        let (process, sandbox) =
            make_under(&**factory, self.sandbox_of(parent)).map_err(|e| format!("spawn failed: {e:#}"))?;
        let args = SpawnArgs {
            parent: parent.pid(),
            origin,
            kind: Some(kind.clone()),
            method: request.method,
            input: request.input,
            caps: parent.spec.caps.clone(),
            mailbox_capacity: parent
                .lineage
                .run_bound()
                .map_or(self.settings.mailbox_capacity, |bound| bound.mailbox_capacity),
            watcher: request.monitor.then(|| Watcher::Process(parent.clone())),
            lineage: Lineage::child_of(&parent.lineage).within(sandbox),
        };
        self.spawn_unqueued(process, args).map_err(|e| e.to_string())
    }

    /// The sandbox limits `cell` runs under, which bound whatever it spawns: those it was
    /// spawned (or restored from a journal) under, or, for a process that records none,
    /// its kind's own.
    pub(super) fn sandbox_of(&self, cell: &ProcessCell) -> Option<KindLimits> {
        cell.lineage.sandbox().or_else(|| {
            let kind = cell.spec.kind.as_deref()?;
            match self.kinds.get(kind) {
                Some(factory) => factory.limits(),
                None => self.remote.as_ref()?.factory(kind, cell.lineage.run())?.limits(),
            }
        })
    }
}
