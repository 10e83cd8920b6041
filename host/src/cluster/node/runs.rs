//! The work other nodes and clients send: what each link item does here (messages,
//! monitors, exits, terminations, spawns and their answers, lines), spawning for another
//! node, serving components, and ending the processes of a run that is over.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Actor, Asked, Dest, SpawnJob};
use crate::cluster::code;
use crate::cluster::shared::Cmd;
use crate::cluster::wire::{self, Body, Item, Peer};
use crate::scheduler::remote::{RemoteSignal, RemoteSpawn, Signal, Verdict};
use crate::{ExitReason, Payload, Pid};

impl Actor {
    /// Carries out one item another node sent. False if it cannot be taken yet: a
    /// message for a full mailbox waits on the link, as a local sender would retry.
    pub(super) fn apply(&mut self, peer: Peer, item: Item) -> bool {
        let handle = self.inner.handle.get().cloned();
        match item {
            Item::Message { from, to, topic, body } => {
                let counter = match handle.map(|h| h.deliver_remote(from, to, topic, body)) {
                    Some(Ok(())) => &self.inner.counters.messages_delivered,
                    Some(Err(crate::error::SendError::MailboxFull { .. })) => return false,
                    Some(Err(error)) => {
                        tracing::debug!(%error, %from, "a message from another node was refused");
                        &self.inner.counters.messages_refused
                    }
                    None => &self.inner.counters.messages_refused,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Item::Monitor { watcher, target } => {
                let notify =
                    self.notifier(Dest::Node(peer.node), move |pid, reason| Item::Exit { watcher, pid, reason });
                let refused = match &handle {
                    Some(handle) => handle.watch(target, notify).is_err(),
                    None => true,
                };
                if refused {
                    self.queue(peer.node, Item::Exit { watcher, pid: target, reason: ExitReason::Noproc });
                }
            }
            Item::Exit { watcher, pid, reason } => {
                if let Some(watched) = self.monitors.get_mut(&peer.node)
                    && let Some(count) = watched.get_mut(&(watcher, pid))
                {
                    *count -= 1;
                    if *count == 0 {
                        watched.remove(&(watcher, pid));
                    }
                }
                self.exit_to(watcher, pid, reason);
            }
            Item::Terminate { by, target, token, child_only } => {
                let Some(handle) = handle else {
                    let error = format!("no process {target}: node `{}` runs no scheduler", self.inner.name);
                    self.answer(peer.node, token, Verdict::Failed(error));
                    return true;
                };
                if child_only && !handle.is_child_of(target, by) {
                    self.answer(peer.node, token, Verdict::NotChild);
                    return true;
                }
                let notify =
                    self.notifier(Dest::Node(peer.node), move |_, _| Item::Done { token, verdict: Verdict::Done });
                if let Err((error, _)) = handle.terminate_watched(target, notify) {
                    self.answer(peer.node, token, Verdict::Failed(error.to_string()));
                }
            }
            Item::Link { from, to, token, child_only } => {
                let verdict = handle.map_or(Verdict::Noproc, |handle| handle.link_from_remote(from, to, child_only));
                self.answer(peer.node, token, verdict);
            }
            Item::Unlink { from, to } => {
                if let Some(handle) = handle {
                    handle.unlink_local(to, from);
                }
            }
            Item::Signal { from, to, signal, token, child_only } => {
                let verdict =
                    handle.map_or(Verdict::Noproc, |handle| handle.signal_from_remote(from, to, signal, child_only));
                self.answer(peer.node, token, verdict);
            }
            Item::Done { token, verdict } => {
                let Some(pending) = self.pending.remove(&token) else { return true };
                match pending.asked {
                    Asked::Terminate { done, denied } => done.complete(answered(verdict, denied, "terminate")),
                    Asked::Exit { done, denied } => done.complete(answered(verdict, denied, "exit")),
                    Asked::Link { from, to, fresh, done, denied } => {
                        match &verdict {
                            Verdict::Done => {}
                            Verdict::Noproc => self.lost_link(from, to, ExitReason::Noproc),
                            Verdict::NotChild | Verdict::Failed(_) => {
                                if let Some(handle) = handle.as_ref().filter(|_| fresh) {
                                    handle.unlink_local(from, to);
                                }
                            }
                        }
                        done.complete(answered(verdict, denied, "link"));
                    }
                    // `check` lets through only the answer a request asked for.
                    Asked::Spawn { .. } => unreachable!("a spawn is answered by `SpawnDone`"),
                }
            }
            Item::Spawn { token, spawn } => self.spawn_here(Dest::Node(peer.node), token, spawn),
            Item::StopRun { reason, grace, scope: 0 } => self.end_run_of(peer.node, &reason, grace),
            Item::StopRun { reason, grace, scope } => self.end_client_run_here(scope, &reason, grace),
            Item::Log { pid, scope, source, message } => {
                // Queued behind whatever this peer sent before it (the process's exit
                // comes after its lines), so the client sees them in that order.
                if let Some((session, item)) = self.line(pid, scope, source, message) {
                    let _ = self.inner.commands.send(Cmd::Reply { session, item });
                }
            }
            Item::SpawnDone { token, result } => {
                let Some(pending) = self.pending.remove(&token) else { return true };
                let Asked::Spawn { done, monitor, link, embedded } = pending.asked else {
                    unreachable!("`check` lets through only the answer a request asked for")
                };
                // Both before the spawn completes, and before the child's exit, which
                // comes after this answer on the same link.
                if let (Ok(child), Some(parent)) = (&result, link)
                    && !handle.as_ref().is_some_and(|handle| handle.link_child(parent, *child))
                {
                    // The parent ended before it heard of its child: the child hears
                    // `noproc` from it, as a link to a process that is gone gives.
                    let signal = RemoteSignal { reason: ExitReason::Noproc, how: Signal::Link };
                    self.queue(
                        pending.node,
                        Item::Signal { from: parent, to: *child, signal, token: 0, child_only: false },
                    );
                }
                if let (Ok(child), Some(watcher)) = (&result, monitor) {
                    *self.monitors.entry(pending.node).or_default().entry((watcher, *child)).or_default() += 1;
                    if let Some(handle) = &handle {
                        handle.count_monitor(watcher, *child);
                    }
                }
                if let Some(slot) = embedded {
                    match &result {
                        Ok(child) => {
                            *slot.pid.lock() = Some(*child);
                            self.embedded.insert(*child, slot);
                        }
                        Err(error) => slot.set(Err(ExitReason::Error(error.clone()))),
                    }
                }
                if let Some(done) = done {
                    done.complete(result.map(|child| Payload::u64(child.as_u64())));
                }
            }
        }
        true
    }

    /// Answers the request node `node` asked with `token` (0: nobody waits).
    fn answer(&mut self, node: u16, token: u64, verdict: Verdict) {
        if token != 0 {
            self.queue(node, Item::Done { token, verdict });
        }
    }

    /// Ends local `from`'s link to `to` (of another node) with an exit signal from `to`
    /// with `reason`: there is no such process (`noproc`), or its node is gone.
    pub(super) fn lost_link(&self, from: Pid, to: Pid, reason: ExitReason) {
        if let Some(handle) = self.inner.handle.get() {
            handle.signal_from_remote(to, from, RemoteSignal { reason, how: Signal::Link }, false);
        }
    }

    /// A notifier that sends the item `make` builds to `dest`, from any thread.
    pub(super) fn notifier(
        &self,
        dest: Dest,
        make: impl FnOnce(Pid, ExitReason) -> Item + Send + 'static,
    ) -> crate::scheduler::remote::Notify {
        let commands = self.inner.commands.clone();
        Box::new(move |pid, reason| {
            let _ = commands.send(dest.cmd(make(pid, reason.clone())));
        })
    }

    /// Delivers an exit to a local watcher: a process, or the embedder's spawn.
    pub(super) fn exit_to(&mut self, watcher: Pid, pid: Pid, reason: ExitReason) {
        if watcher.is_host() {
            if let Some(slot) = self.embedded.remove(&pid) {
                slot.set(reason.into_result());
            }
        } else if let Some(handle) = self.inner.handle.get() {
            handle.exit_to(watcher, pid, reason);
        }
    }

    /// Spawns what `dest` (a node, or a client's session) asked for on the spawning
    /// thread (`run_spawns`): a registered kind at once, a component once fetched (off
    /// this task) from whoever asked, or answers why not. A component by hash is
    /// fetched from the asker unless this node holds it for the spawn's run already:
    /// a run spawns by hash only what its own tree brought.
    pub(super) fn spawn_here(&mut self, dest: Dest, token: u64, spawn: RemoteSpawn) {
        let answer_now = |actor: &mut Self, error: String| {
            let item = Item::SpawnDone { token, result: Err(error) };
            match dest {
                Dest::Node(node) => actor.queue(node, item),
                Dest::Session(_) => drop(actor.inner.commands.send(dest.cmd(item))),
            }
        };
        let Some(handle) = self.inner.handle.get().cloned() else {
            let error = format!("spawn failed: node `{}` runs no scheduler", self.inner.name);
            return answer_now(self, error);
        };
        let notify = spawn.monitor.then(|| {
            let parent = spawn.parent;
            self.notifier(dest, move |pid, reason| Item::Exit { watcher: parent, pid, reason })
        });
        let registered = spawn.kind.as_deref().and_then(|k| handle.registered_kind(k));
        let (kind, factory) = match (registered, spawn.identity.clone()) {
            (Some((name, factory)), identity) if identity.is_none() || factory.identity() == identity => {
                (name, factory)
            }
            (_, Some(hash)) => {
                if let Some(factory) = self.inner.factory_in(&hash, spawn.run) {
                    (hash.into(), factory)
                } else {
                    let (source, from) = match dest {
                        Dest::Node(node) => (code::subject(&self.inner.prefix, node), Some(node)),
                        Dest::Session(session) => match self.sessions.get(&session) {
                            Some(session) => (format!("{}.code", session.inbox), None),
                            None => return,
                        },
                    };
                    let (inner, client, me, jobs) =
                        (self.inner.clone(), self.client.clone(), self.me, self.spawner.clone());
                    tokio::spawn(async move {
                        let error = match code::factory(&inner, &client, me, (&source, from), &hash, spawn.run).await {
                            Ok(factory) => {
                                let job = SpawnJob { handle, factory, kind: hash.into(), spawn, notify, dest, token };
                                if jobs.send(job).is_ok() {
                                    return;
                                }
                                "the node's spawning thread has ended".to_owned()
                            }
                            Err(error) => format!("{error:#}"),
                        };
                        let item = Item::SpawnDone { token, result: Err(format!("spawn failed: {error}")) };
                        let _ = inner.commands.send(dest.cmd(item));
                    });
                    return;
                }
            }
            (_, None) => {
                let error = format!(
                    "spawn failed: node `{}` has no process kind `{}`",
                    self.inner.name,
                    spawn.kind.as_deref().unwrap_or("(none)")
                );
                return answer_now(self, error);
            }
        };
        let job = SpawnJob { handle, factory, kind, spawn, notify, dest, token };
        if self.spawner.send(job).is_err() {
            answer_now(self, "spawn failed: the node's spawning thread has ended".to_owned());
        }
    }

    pub(super) async fn serve_code(&mut self, message: async_nats::Message) {
        let Some(reply) = message.reply.clone() else { return };
        let opened = wire::claimed_sender(&message.payload).and_then(|(peer, _)| {
            if !self.is_member(peer) {
                return Err(wire::WireError::Malformed(format!("a code request from node {}, no member", peer.node)));
            }
            self.inner.key.open(&message.subject, &reply, &message.payload).and_then(wire::decode)
        });
        let Ok((_, Body::CodeRequest { hash, offset })) = opened else {
            return self.refuse(format_args!("a code request on `{}` that is not one", message.subject));
        };
        let body = self.inner.code.answer(&hash, offset, &format!("node `{}`", self.inner.name));
        let frame = self.inner.key.seal(&reply, "", &wire::encode(self.me, &body));
        if let Err(error) = self.client.publish(reply, frame.into()).await {
            tracing::debug!(%error, "failed to answer a code request");
        }
    }

    /// Ends the processes here that belong to node `node`'s run (or that a process of
    /// it spawned): a cancel with `reason` now, and termination of those left after
    /// `grace`.
    pub(super) fn end_run_of(&self, node: u16, reason: &str, grace: Duration) {
        let Some(handle) = self.inner.handle.get().cloned() else { return };
        let cancelled = handle.cancel_owned_by(node, reason);
        if cancelled == 0 {
            return;
        }
        tracing::info!(node, processes = cancelled, reason, ?grace, "ending the processes of a run");
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            // Killed: they did not end when cancelled, within the grace.
            handle.terminate_owned_by(node, ExitReason::Killed);
        });
    }

    /// A line a process of a run wrote: to the client whose session the run is, if it
    /// is here (the session and the reply, for the caller to send); else this node's to
    /// show.
    pub(super) fn line(&mut self, pid: Pid, scope: u64, source: String, message: String) -> Option<(u64, Item)> {
        if scope != 0
            && let Some((&session, _)) = self.sessions.iter().find(|(_, s)| s.run == scope)
        {
            return Some((session, Item::Log { pid, scope, source, message }));
        }
        match self.inner.lines.get() {
            Some(sink) => sink(pid, &source, &message),
            None => tracing::info!(target: "wasmproc::guest", %pid, source = %source, message = %message),
        }
        None
    }

    /// Ends the processes of the client's run `client` on this node: a cancel with
    /// `reason` now, and termination of those left after `grace`.
    pub(super) fn end_client_run_here(&self, client: u64, reason: &str, grace: Duration) {
        let Some(handle) = self.inner.handle.get().cloned() else { return };
        if handle.cancel_client_run(client, reason) == 0 {
            return;
        }
        tracing::info!(reason, ?grace, "ending the processes of a client's run");
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            handle.terminate_client_run(client, ExitReason::Killed);
        });
    }

    /// Ends the processes of the client's run `client` here and on every other node.
    pub(super) fn stop_client_run(&mut self, client: u64, reason: &str, grace: Duration) {
        self.end_client_run_here(client, reason, grace);
        let nodes: Vec<u16> = self.members.keys().copied().collect();
        for node in nodes {
            self.queue(node, Item::StopRun { reason: reason.to_owned(), grace, scope: client });
        }
    }
}

/// What a process's termination, link or exit signal completes with, given its node's
/// verdict: `denied` (its own node's words) for a [`Verdict::NotChild`].
fn answered(verdict: Verdict, denied: Option<String>, command: &str) -> Result<Payload, String> {
    match verdict {
        // A signal to a process that does not exist is dropped, as on one node; a link
        // to one is answered by its `noproc` signal.
        Verdict::Done | Verdict::Noproc => Ok(Payload::empty()),
        Verdict::NotChild => Err(denied.unwrap_or_else(|| format!("permission denied: {command}"))),
        Verdict::Failed(error) => Err(error),
    }
}
