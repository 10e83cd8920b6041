//! Custom commands and process kinds: what an embedder registers with
//! [`Builder::handler`](crate::scheduler::Builder::handler) and
//! [`Builder::kind`](crate::scheduler::Builder::kind).
//!
//! A [`Handler`] carries out the custom command registered under its name; each yield
//! reaches it as a [`Request`] and is answered exactly once, at once or later through its
//! [`Completer`]. A [`Factory`] makes the processes of a kind for `spawn` commands and
//! [`Spawnable::kind`](crate::scheduler::Spawnable::kind).
//!
//! Nothing here names the scheduler: a request and a completer reach the process that
//! yielded through `Caller` and `Waiter`, which the scheduler's cell of the process
//! implements (as a [`Port`](crate::Port) reaches it through `PortTarget`). The one
//! method that hands out the scheduler itself, [`Request::scheduler`], is defined by the
//! scheduler (`scheduler/dispatch.rs`).

use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

use wasmproc_types::{Payload, Pid};

pub use crate::limits::KindLimits;
use crate::process::Process;
use crate::step::Outcome;

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

/// Kinds resolved when they are asked for rather than registered on the builder
/// ([`Builder::kind_source`](crate::scheduler::Builder::kind_source)): code that arrives
/// while the scheduler runs, or kinds that depend on who spawns them. The builder's
/// registered kinds are looked up first; a name they lack comes here.
pub trait KindSource: Send + Sync + 'static {
    /// The kind `name` names for a spawn by a process of kind `spawner` (`None` for the
    /// embedder's spawns and for a durable process remade on resume): its name as it is
    /// to be recorded, and its factory; `None` if there is no such kind for that spawner.
    ///
    /// The recorded name is what a resume asks for again (with `spawner` `None`), and
    /// what a process spawning more of its own kind asks for: a source answers its own
    /// recorded names whoever asks, and may answer other names by the spawner (say, by
    /// the tenant its kind belongs to).
    fn resolve(&self, name: &str, spawner: Option<&str>) -> Option<(Arc<str>, Arc<dyn Factory>)>;
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

    /// The quota a durable process of the kind resumed from its journal as a root counts
    /// against, as it did when it was spawned with
    /// [`SpawnOptions::quota`](crate::scheduler::SpawnOptions::quota). `None` (the
    /// default): none.
    fn quota(&self) -> Option<crate::limits::ProcessQuota> {
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

/// The process that yielded a command, as its [`Request`] borrows it for the handler
/// call: implemented by the scheduler for its cell of the process (the reference the
/// scheduler holds, so that a completer can be made from it without the request taking
/// one of its own).
pub(crate) trait Caller: Any + Send + Sync {
    /// The process's pid.
    fn pid(&self) -> Pid;
    /// Delivers the completion of yield `tag` to the process (see [`Completer::complete`]).
    fn complete(&self, tag: u64, result: Outcome);
    /// A completer of yield `tag`, to complete it later.
    fn completer(&self, tag: u64) -> Completer;
    /// The recorded seed of a durable process's random numbers (see
    /// [`Port::random_seed`](crate::Port::random_seed)).
    fn random_seed(&self) -> Option<[u8; 32]>;
    /// The kind the process was made from, as recorded.
    fn kind(&self) -> Option<&str>;
}

/// The process waiting for a completion, as its [`Completer`] holds it: implemented by
/// the scheduler's cell of the process.
pub(crate) trait Waiter: Send + Sync {
    /// The process's pid.
    fn pid(&self) -> Pid;
    /// Whether the process has ended.
    fn has_ended(&self) -> bool;
    /// See [`Completer::on_caller_exit`].
    fn on_exit(&self, release: Release) -> Result<(), Release>;
    /// Delivers the completion of yield `tag` to the process and wakes it; nothing if it
    /// has ended.
    fn complete(self: Arc<Self>, tag: u64, result: Outcome);
}

/// Called once a process has ended (see [`Completer::on_caller_exit`]).
pub(crate) type Release = Box<dyn FnOnce() + Send>;

/// What a yield completes with when its completer (or its handler's [`Request`]) is
/// dropped unanswered.
pub(crate) const DROPPED: &str = "command handler dropped the yield without completing it";

/// One custom command to carry out, borrowed for the duration of the handler call.
///
/// Complete it with [`Request::complete`], or take a [`Completer`] with
/// [`Request::into_parts`] to complete later. Dropping it unused completes the yield with
/// an error, so a process never waits on a handler that forgot it.
pub struct Request<'a> {
    caller: &'a dyn Caller,
    tag: u64,
    /// For a durable process, the place of the yield's step in its journal.
    record: Option<u64>,
    name: Cow<'static, str>,
    payload: Payload,
    answered: bool,
}

impl<'a> Request<'a> {
    /// The command `name` with input `payload`, yielded with `tag` by `caller`, whose
    /// step is record `record` of its journal if it is durable.
    pub(crate) fn new(
        caller: &'a dyn Caller,
        tag: u64,
        record: Option<u64>,
        name: Cow<'static, str>,
        payload: Payload,
    ) -> Self {
        Request { caller, tag, record, name, payload, answered: false }
    }

    /// The process that yielded the command, as the scheduler implements it.
    pub(crate) fn yielder(&self) -> &'a dyn Caller {
        self.caller
    }
}

impl Request<'_> {
    /// The process that yielded the command.
    pub fn caller(&self) -> Pid {
        self.caller.pid()
    }

    /// The kind the yielding process was made from, as it is recorded (the name a
    /// [`KindSource`] resolved it to); `None` for a process spawned as a value. A
    /// provider serving several owners tells them apart by it.
    pub fn kind(&self) -> Option<&str> {
        self.caller.kind()
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
        let record = self.record?;
        let seed = self.caller.random_seed().unwrap_or([0; 32]);
        let run = crate::codec::hex(&seed[..8]);
        Some(format!("{}-{record}-{}-{run}", self.caller.pid(), self.tag))
    }

    /// Completes the command now.
    pub fn complete(mut self, result: Outcome) {
        self.answered = true;
        self.caller.complete(self.tag, result);
    }

    /// The input and a completer, to finish the work elsewhere.
    pub fn into_parts(mut self) -> (Payload, Completer) {
        self.answered = true;
        let payload = std::mem::take(&mut self.payload);
        (payload, self.caller.completer(self.tag))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.caller.complete(self.tag, Err(DROPPED.to_owned()));
        }
    }
}

/// Completes one yield from anywhere, at any time. Consumed by [`Completer::complete`];
/// dropping it unused completes the yield with an error, so a process never waits on a
/// lost handler.
///
/// Completing a yield of a process that has ended in the meantime does nothing.
pub struct Completer {
    target: Option<Arc<dyn Waiter>>,
    tag: u64,
}

impl Completer {
    /// A completer of yield `tag` of `target`'s process.
    pub(crate) fn new(target: Arc<dyn Waiter>, tag: u64) -> Self {
        Completer { target: Some(target), tag }
    }

    /// The tag of the yield this completes.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The process waiting for the completion.
    pub fn pid(&self) -> Pid {
        self.target.as_ref().map_or(Pid::HOST, |target| target.pid())
    }

    /// Whether the process waiting for the completion has ended: nobody will read it.
    pub(crate) fn caller_has_ended(&self) -> bool {
        self.target.as_ref().is_none_or(|target| target.has_ended())
    }

    /// Calls `release` once the process waiting for the completion has ended, on the
    /// thread that retires it (so `release` must not block); hands it back if the process
    /// is ending already.
    pub(crate) fn on_caller_exit(&self, release: Release) -> Result<(), Release> {
        match &self.target {
            Some(target) => target.on_exit(release),
            None => Err(release),
        }
    }

    /// Delivers `result` to the process and wakes it.
    pub fn complete(mut self, result: Outcome) {
        if let Some(target) = self.target.take() {
            target.complete(self.tag, result);
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(target) = self.target.take() {
            target.complete(self.tag, Err(DROPPED.to_owned()));
        }
    }
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer").field("pid", &self.pid()).field("tag", &self.tag).finish()
    }
}
