//! Links and exit signals between processes of one node, as Erlang has them.
//!
//! A link is two-way: each side holds the other's pid in its inbox (`inbox.rs`). When a
//! process ends, `retire` sends an exit signal with its reason to every process linked to
//! it ([`Shared::signal_links`]), through the same inbox the messages it sent went
//! through, so a partner sees those messages before the exit. What a signal does is
//! decided under the receiver's inbox lock ([`Inbox::signal`](super::inbox::Inbox::signal)):
//!
//! | signal                          | receiver traps exits           | it does not                      |
//! |---------------------------------|--------------------------------|----------------------------------|
//! | a linked process ended normally | an `Exit` event (`linked`)     | nothing                          |
//! | … abnormally, with reason R     | an `Exit` event (`linked`)     | it ends with R                   |
//! | `exit(pid, R)`, R normal        | an `Exit` event (`linked`)     | nothing                          |
//! | `exit(pid, R)`, R abnormal      | an `Exit` event (`linked`)     | it ends with R                   |
//! | `kill`                          | it ends with `killed`          | it ends with `killed`            |
//! | `link` to a pid that is gone    | an `Exit` event with `noproc`  | it ends with `noproc`            |
//!
//! A process ended by a signal is ended through the terminate path, with the signal's
//! reason and its sender recorded ([`Exited::by_signal`]); its own partners then get that
//! reason in turn (so partners of a killed process get `killed`, which they may trap).
//!
//! # Why a link never outlives its `unlink`, nor misses an exit
//!
//! `link` adds the target to the linker's set first, then the linker to the target's:
//! a target that ends between the two has taken its set without the linker, so the
//! second add finds it closed, and the linker removes the target again and gets a
//! `noproc` signal; a target that ends after the second add finds the linker in its set
//! and the linker finds the target in its own, so the signal is delivered. `unlink`
//! removes the target from the linker's set first: a signal of the target's that arrives
//! later finds no link on the linker's side and is dropped (a [`Signal::Link`] signal
//! needs the link on the receiver's side, and removes it).
//!
//! # Across nodes
//!
//! A link to a process of another node is made the same way, each half by its own
//! node: the linker's half here first, then the target's by its node ([`Remote::link`]),
//! which answers; a refusal takes the linker's half back, and no such process gives the
//! linker a `noproc` signal from the target as it would here. An exit signal to a
//! process of another node travels on the one ordered link between the two nodes that
//! the messages take, so it arrives after the messages its sender sent before it; a
//! [`Signal::Link`] signal there still needs the link on the receiver's side, so a node
//! can end only processes that linked to one of its own. When a node is lost, every
//! process here linked to one of its processes gets a `noconnection` signal from that
//! process ([`Handle::signal_links_to_node`](super::Handle::signal_links_to_node)).

use std::sync::Arc;

use wasmproc_types::{ExitReason, Pid};

use super::cell::{ProcessCell, Watcher};
use super::inbox::{LinkRefused, Signal, Signalled};
use super::remote::{ChildOnly, Remote, RemoteSignal};
use super::shared::Shared;
use super::state::Wake;
use crate::handler::Completer;
use crate::step::{ExitSignal, Exited};

impl Shared {
    /// Links `cell`'s process and `target`, a process of this node (see the module's
    /// docs); `Err` past `max_links` on either side.
    pub(super) fn link(&self, cell: &Arc<ProcessCell>, target: Pid) -> Result<(), String> {
        if target == cell.pid() {
            return Ok(());
        }
        let limit = self.limits_of(cell).max_links;
        if let Err(LinkRefused::Full { limit }) = cell.inbox.add_link(target, limit) {
            return Err(link_limit(cell.pid(), limit));
        }
        let refused = match self.registry.get(target) {
            Some(partner) => match partner.inbox.add_link(cell.pid(), self.limits_of(&partner).max_links) {
                Ok(()) => return Ok(()),
                Err(LinkRefused::Full { limit }) => {
                    cell.inbox.remove_link(target);
                    return Err(link_limit(target, limit));
                }
                Err(LinkRefused::Closed) => true,
            },
            None => true,
        };
        if refused {
            cell.inbox.remove_link(target);
            self.signal_cell(cell, target, &ExitReason::Noproc, Signal::Exit);
        }
        Ok(())
    }

    /// Links `cell`'s process and `target`, a process of another node: this half now
    /// (counted against `max_links` here), the other by `target`'s node, which answers
    /// `done` (see [`Remote::link`]).
    pub(super) fn link_remote(
        &self,
        cell: &Arc<ProcessCell>,
        target: Pid,
        remote: &Arc<dyn Remote>,
        child_only: ChildOnly,
        done: Completer,
    ) {
        let limit = self.limits_of(cell).max_links;
        // A link that was there before (made by the target) is not taken back if this
        // one is refused.
        let fresh = !cell.inbox.has_link(target);
        if let Err(LinkRefused::Full { limit }) = cell.inbox.add_link(target, limit) {
            return done.complete(Err(link_limit(cell.pid(), limit)));
        }
        remote.link(cell.pid(), target, fresh, child_only, done);
    }

    /// Removes the link between `cell`'s process and `target`, both ways.
    pub(super) fn unlink(&self, cell: &ProcessCell, target: Pid) {
        let linked = cell.inbox.remove_link(target);
        if let Some(remote) = self.remote_for(target) {
            // Only a link made (and bounded) before goes to the other node.
            if linked {
                remote.unlink(cell.pid(), target);
            }
            return;
        }
        if let Some(partner) = self.registry.get(target) {
            partner.inbox.remove_link(cell.pid());
        }
    }

    /// Removes `cell`'s monitors of `target`: on its side (no exit of theirs is taken in
    /// from now on, nor one already waiting), and on the target's (its exit tells no one).
    pub(super) fn demonitor(&self, cell: &ProcessCell, target: Pid) {
        cell.inbox.demonitor(target);
        if let Some(watched) = self.registry.get(target) {
            let pid = cell.pid();
            watched.inbox.unwatch(|watcher| matches!(watcher, Watcher::Process(w) if w.pid() == pid));
        }
    }

    /// Sends `signal` from `from` to a process of this node; one to a process that does
    /// not exist is dropped.
    pub(super) fn exit_signal(&self, from: Pid, signal: ExitSignal) {
        if let Some(target) = self.registry.get(signal.to) {
            let how = if signal.kill { Signal::Kill } else { Signal::Exit };
            self.signal_cell(&target, from, &signal.reason, how);
        }
    }

    /// Sends the exit signal of a process that ended with `exited` to each of its
    /// partners `links`; whether any took it (was ended by it, or got its event), or it
    /// went to another node.
    pub(super) fn signal_links(&self, from: Pid, exited: &Exited, links: impl IntoIterator<Item = Pid>) -> bool {
        let mut taken = false;
        for partner in links {
            if let Some(remote) = self.remote_for(partner) {
                let signal = RemoteSignal { reason: exited.reason.clone(), how: Signal::Link };
                remote.signal(from, partner, signal, None);
                taken = true;
            } else if let Some(cell) = self.registry.get(partner) {
                taken |= self.signal_cell(&cell, from, &exited.reason, Signal::Link) != Signalled::Dropped;
            }
        }
        taken
    }

    /// Delivers an exit signal to `cell` and acts on what it did: wakes it for an event,
    /// requests its end for a termination.
    pub(super) fn signal_cell(
        &self,
        cell: &Arc<ProcessCell>,
        from: Pid,
        reason: &ExitReason,
        how: Signal,
    ) -> Signalled {
        let signalled = cell.inbox.signal(from, reason, how);
        let wake = match signalled {
            Signalled::Event => cell.state.wake(),
            Signalled::Terminate => cell.state.request_terminate(),
            Signalled::Dropped => Wake::Nothing,
        };
        if wake == Wake::Schedule {
            self.schedule(cell.clone());
        }
        signalled
    }
}

/// The error of a `link` past `max_links`.
pub(super) fn link_limit(pid: Pid, limit: usize) -> String {
    format!("link limit exceeded: process {pid} has {limit} links already, as many as `max_links` ({limit}) allows")
}
