//! Command dispatch: how the yields a step writes reach the code that carries them out,
//! and what the embedder registers for it.
//!
//! Built-in commands (`sleep`, `spawn`, `send`, `monitor`, `terminate`, and the links'
//! `link`, `unlink`, `demonitor`, `exit`, `trap-exits`) are handled by
//! the scheduler itself; custom commands go to the [`Handler`] the embedder registered
//! under their name (`commands.rs` finds it); `spawn` makes its process with the
//! [`Factory`] of the kind it names. Every yield is answered by exactly one completion
//! (see `completer.rs`): the handler's [`Completer`] may complete it at once or later
//! from any thread.
//!
//! A handler registered as `family.*` carries out every command `family.<anything>` that
//! has no handler of its own: that is how a [`Provider`](crate::provider::Provider)
//! serves a whole family of commands.
//!
//! Checks, in order: an unknown custom command completes with ``unknown command `name` ``;
//! a command the process was not granted completes with `permission denied: name`.
//!
//! [`Handler`]: crate::handler::Handler
//! [`Factory`]: crate::handler::Factory
//! [`Completer`]: crate::handler::Completer

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use wasmproc_types::Payload;

use super::caps::{Capabilities, family};
use super::cell::{ProcessCell, Watcher};
use super::commands::Resolution;
use super::completer::{complete, completer};
use super::durable::Origin;
use super::handle::Handle;
use super::inbox::Signal;
use super::lifecycle::SpawnArgs;
use super::remote::RemoteSignal;
use super::shared::Shared;
use super::worker::{self, panic_message};
use crate::handler::{KindLimits, Request, make_under};
use crate::limits::Lineage;
use crate::step::{Command, CommandKind, SpawnRequest, Yield};

/// What the target of a command over another process is to the process
/// ([`Shared::target_of`]).
enum Target {
    OwnChild,
    /// A process of another node.
    Remote,
    Other,
}

impl Request<'_> {
    /// The scheduler, to spawn, send or terminate on the caller's behalf.
    pub fn scheduler(&self) -> Handle {
        let caller: &dyn Any = self.yielder();
        let cell: &Arc<ProcessCell> = caller.downcast_ref().expect("dispatch makes every request, for a cell");
        Handle { shared: cell.scheduler().clone() }
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
            let request = Request::new(cell, tag, origin.map(|o| o.seq), name, payload);
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
        let mut child_only = None;
        if !cell.spec.caps.allows_builtin(kind) {
            match self.target_of(cell, &y.command) {
                Target::OwnChild => {}
                // Its node knows whether it is a child of this process.
                Target::Remote => child_only = Some(self.denied(kind.name())),
                Target::Other => return complete(cell, tag, Err(self.denied(kind.name()))),
            }
        }
        self.count_yield(kind);
        match y.command {
            Command::Sleep(duration) if duration.is_zero() => complete(cell, tag, Ok(Payload::empty())),
            Command::Sleep(duration) => self.timer.sleep(duration, completer(cell, tag)),
            Command::Spawn(request) => {
                if request.link {
                    let limit = self.limits_of(cell).max_links;
                    if cell.inbox.link_count() >= limit {
                        let error = format!("spawn failed: {}", super::links::link_limit(cell.pid(), limit));
                        return complete(cell, tag, Err(error));
                    }
                }
                let request = match self.spawn_elsewhere(cell, request, || completer(cell, tag)) {
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
                    return remote.terminate(cell.pid(), target, child_only, Some(completer(cell, tag)));
                }
                // Completes once the target has ended: its exit notifies the completer.
                let watcher = Watcher::Yield(completer(cell, tag));
                if let Err((error, watcher)) = self.terminate(target, Some(watcher))
                    && let Some(Watcher::Yield(done)) = watcher
                {
                    done.complete(Err(error.to_string()));
                }
            }
            Command::Link(target) => match self.remote_for(target) {
                Some(remote) => self.link_remote(cell, target, remote, child_only, completer(cell, tag)),
                None => complete(cell, tag, self.link(cell, target).map(|()| Payload::empty())),
            },
            Command::Unlink(target) => {
                self.unlink(cell, target);
                complete(cell, tag, Ok(Payload::empty()));
            }
            Command::Demonitor(target) => {
                self.demonitor(cell, target);
                complete(cell, tag, Ok(Payload::empty()));
            }
            Command::Exit(signal) => match self.remote_for(signal.to) {
                Some(remote) => {
                    let how = if signal.kill { Signal::Kill } else { Signal::Exit };
                    let remote_signal = RemoteSignal { reason: signal.reason, how };
                    remote.signal(cell.pid(), signal.to, remote_signal, Some((completer(cell, tag), child_only)));
                }
                None => {
                    self.exit_signal(cell.pid(), signal);
                    complete(cell, tag, Ok(Payload::empty()));
                }
            },
            Command::TrapExits(trap) => {
                cell.inbox.set_trap_exits(trap);
                complete(cell, tag, Ok(Payload::empty()));
            }
            Command::Custom { .. } => unreachable!("handled above"),
        }
    }

    /// Whether `command` terminates, signals or links a child of `cell`: granted whether
    /// or not `terminate`, `exit` or `link` is, since a process may end what it started
    /// (a supervisor stops its children so), and a child's pid is its parent's to know.
    /// Over any other process these commands are as strong as `terminate` (a process
    /// that links to one and then fails ends it), so each needs its grant. For a process
    /// of another node, that node decides ([`ChildOnly`](super::remote::ChildOnly)).
    fn target_of(&self, cell: &ProcessCell, command: &Command) -> Target {
        let target = match command {
            Command::Terminate(target) | Command::Link(target) => *target,
            Command::Exit(signal) => signal.to,
            _ => return Target::Other,
        };
        if self.remote_for(target).is_some() {
            Target::Remote
        } else if self.registry.get(target).is_some_and(|child| child.spec.parent == cell.pid()) {
            Target::OwnChild
        } else {
            Target::Other
        }
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
        let spawner = parent.spec.kind.as_deref();
        let name = request.kind.as_deref().or(spawner);
        let kind = name.and_then(|name| self.kinds.find(name, spawner));
        // A kind this node lacks may be one the cluster fetched (named by its hash).
        let kind = match (kind, &self.remote) {
            (None, Some(remote)) => {
                name.and_then(|name| Some((Arc::<str>::from(name), remote.factory(name, parent.lineage.run())?)))
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
            make_under(&*factory, self.sandbox_of(parent)).map_err(|e| format!("spawn failed: {e:#}"))?;
        let identity = self.identity_of(&*factory);
        let args = SpawnArgs {
            parent: parent.pid(),
            origin,
            kind: Some(kind),
            method: request.method,
            input: request.input,
            caps: parent.spec.caps.clone(),
            mailbox_capacity: parent
                .lineage
                .run_bound()
                .map_or(self.settings.mailbox_capacity, |bound| bound.mailbox_capacity),
            watcher: request.monitor.then(|| Watcher::Process(parent.clone())),
            linked_to: request.link.then(|| parent.clone()),
            lineage: Lineage::child_of(&parent.lineage).within(sandbox),
            note: None,
            identity,
            recorder: None,
        };
        self.spawn_unqueued(process, args).map_err(|e| e.to_string())
    }

    /// The sandbox limits `cell` runs under, which bound whatever it spawns: those it was
    /// spawned (or restored from a journal) under, or, for a process that records none,
    /// its kind's own.
    pub(super) fn sandbox_of(&self, cell: &ProcessCell) -> Option<KindLimits> {
        cell.lineage.sandbox().or_else(|| {
            let kind = cell.spec.kind.as_deref()?;
            match self.kinds.factory(kind) {
                Some(factory) => factory.limits(),
                None => self.remote.as_ref()?.factory(kind, cell.lineage.run())?.limits(),
            }
        })
    }
}
