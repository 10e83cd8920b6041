//! The links between nodes: one ordered, reliable stream of items per direction
//! (sequence numbers, acknowledgements riding data frames or sent alone once due,
//! retransmission after a reconnection or a stall), and what a link's items may say
//! ([`check`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{ACK_DELAY, ACK_EVERY, Acks, Actor, Asked, BATCH_BYTES, BATCH_ITEMS, Counted, OutLink, PendingAck};
use crate::Pid;
use crate::cluster::shared::Inner;
use crate::cluster::wire::{self, Body, Item, Peer};

impl Actor {
    /// Appends `item` to the link to `node`.
    pub(super) fn queue(&mut self, node: u16, item: Item) {
        let Some(member) = self.members.get(&node) else {
            return self.undeliverable(node, item);
        };
        let incarnation = member.peer.incarnation;
        let dropped = &mut self.dropped;
        let link = self.out.entry(node).or_insert_with(|| OutLink {
            incarnation,
            next_seq: match dropped.remove(&node) {
                Some((dropped_for, next)) if dropped_for == incarnation => next,
                _ => 1,
            },
            unacked: VecDeque::new(),
            sent: 0,
            progress: Instant::now(),
        });
        let seq = link.next_seq;
        link.next_seq += 1;
        let counted = Counted::of(&item);
        if link.unacked.is_empty() {
            link.progress = Instant::now();
        }
        link.unacked.push_back((seq, wire::encode_item(&item), counted));
        self.dirty.insert(node);
    }

    /// What becomes of an item for a node that is not (or no longer) a member.
    pub(super) fn undeliverable(&mut self, node: u16, item: Item) {
        match item {
            Item::Message { .. } => {
                self.inner.backlog.fetch_sub(1, Ordering::AcqRel);
                self.inner.counters.messages_lost.fetch_add(1, Ordering::Relaxed);
            }
            Item::Monitor { watcher, target } => self.exit_to(watcher, target, self.lost(node)),
            // The other side is gone: nobody waits for these, and its processes heard
            // `noconnection` from this node's linked to them.
            Item::Exit { .. } | Item::Done { .. } | Item::SpawnDone { .. } => {}
            Item::Unlink { .. } | Item::Signal { token: 0, .. } => {}
            // Asked only of a member, in the same turn: its loss answers them.
            Item::Terminate { .. } | Item::Spawn { .. } | Item::Link { .. } | Item::Signal { .. } => {}
            Item::StopRun { .. } => {}
            Item::Log { .. } => {
                self.inner.log_backlog.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Sends what each dirty link has not sent yet, with the acknowledgement owed to its
    /// node riding in every frame, and alone the owed acknowledgements `acks` says.
    pub(super) async fn flush(&mut self, acks: Acks) {
        for node in std::mem::take(&mut self.dirty) {
            let Some(link) = self.out.get_mut(&node) else { continue };
            // What this node has applied of the receiver's link to it, if that link is
            // from the incarnation this one goes to (the receiver checks the frame's
            // `to_incarnation`, so an ack from another incarnation must go alone).
            let ack = match self.inl.get(&node) {
                Some(inl) if inl.incarnation == link.incarnation => inl.expected - 1,
                _ => 0,
            };
            let mut frames = Vec::new();
            let start = link.unacked.partition_point(|(seq, _, _)| *seq <= link.sent);
            let mut batch: Vec<Vec<u8>> = Vec::new();
            let mut first = 0;
            let mut bytes = 0;
            for (seq, item, _) in link.unacked.iter().skip(start) {
                if batch.is_empty() {
                    first = *seq;
                }
                bytes += item.len();
                batch.push(item.clone());
                if batch.len() >= BATCH_ITEMS || bytes >= BATCH_BYTES {
                    frames.push(Body::Data {
                        to_incarnation: link.incarnation,
                        first,
                        ack,
                        items: std::mem::take(&mut batch),
                    });
                    bytes = 0;
                }
            }
            if !batch.is_empty() {
                frames.push(Body::Data { to_incarnation: link.incarnation, first, ack, items: batch });
            }
            link.sent = link.next_seq - 1;
            if ack != 0 && !frames.is_empty() {
                self.acks.remove(&node);
            }
            let subject = self.subject(node);
            for body in frames {
                self.publish(subject.clone(), &body).await;
            }
        }
        if self.acks.is_empty() {
            return;
        }
        let now = Instant::now();
        let due: Vec<u16> = self
            .acks
            .iter()
            .filter(|(_, owed)| {
                acks == Acks::All || owed.items >= ACK_EVERY || now.duration_since(owed.since) >= ACK_DELAY
            })
            .map(|(&node, _)| node)
            .collect();
        for node in due {
            self.acks.remove(&node);
            let Some(link) = self.inl.get(&node) else { continue };
            let body = Body::Ack { to_incarnation: link.incarnation, upto: link.expected - 1 };
            self.publish(self.subject(node), &body).await;
        }
    }

    /// The first sequence of this node's link to `peer` that `peer` has not
    /// acknowledged.
    pub(super) fn link_start(&self, peer: Peer) -> u64 {
        match (self.out.get(&peer.node), self.dropped.get(&peer.node)) {
            (Some(link), _) if link.incarnation == peer.incarnation => link.start(),
            (_, Some(&(incarnation, next))) if incarnation == peer.incarnation => next,
            _ => 1,
        }
    }

    /// Applies the items of a data frame from a member that come next in order.
    pub(super) fn data(&mut self, peer: Peer, first: u64, items: Vec<Vec<u8>>) {
        let Some(link) = self.inl.get(&peer.node).filter(|link| link.incarnation == peer.incarnation) else {
            return self.refuse(format_args!("link data from node {} before its link was taken up", peer.node));
        };
        let mut expected = link.expected;
        let before = expected;
        if first < expected {
            self.repeated();
        }
        for (i, bytes) in items.into_iter().enumerate() {
            let seq = first.saturating_add(i as u64);
            if seq < expected {
                continue;
            }
            if seq > expected {
                // A gap: what is missing comes again, and this with it.
                break;
            }
            let applied = match wire::decode_item(&bytes) {
                Ok(item) => match self.check(peer, &item) {
                    Ok(()) => self.apply(peer, item),
                    Err(why) => {
                        self.refuse(format_args!("from node {}: {why}", peer.node));
                        true
                    }
                },
                Err(error) => {
                    self.refuse(format_args!("an item from node {}: {error}", peer.node));
                    true
                }
            };
            if !applied {
                // Not taken now (a full mailbox): the sender sends it again, and what
                // follows it, so the order holds.
                break;
            }
            expected += 1;
        }
        if let Some(link) = self.inl.get_mut(&peer.node) {
            link.expected = expected;
        }
        // Owed even when nothing was applied (a repeat, a gap): the sender learns where
        // this side stands.
        let owed = self.acks.entry(peer.node).or_insert_with(|| PendingAck { since: Instant::now(), items: 0 });
        owed.items += expected - before;
    }

    pub(super) fn ack(&mut self, peer: Peer, to_incarnation: u64, upto: u64) {
        let Some(link) = self.out.get_mut(&peer.node) else { return };
        if to_incarnation != self.me.incarnation || link.incarnation != peer.incarnation {
            return;
        }
        // An acknowledgement of what was never sent says nothing true.
        let upto = upto.min(link.next_seq - 1);
        let (mut messages, mut lines) = (0, 0);
        let mut acked = false;
        while link.unacked.front().is_some_and(|(seq, _, _)| *seq <= upto) {
            acked = true;
            match link.unacked.pop_front() {
                Some((_, _, Counted::Message)) => messages += 1,
                Some((_, _, Counted::Log)) => lines += 1,
                _ => {}
            }
        }
        self.inner.log_backlog.fetch_sub(lines, Ordering::AcqRel);
        link.sent = link.sent.max(upto);
        // Only progress delays a resend: a receiver that keeps acknowledging the same
        // item is waiting for something it lost.
        if acked {
            link.progress = Instant::now();
        }
        self.inner.backlog.fetch_sub(messages, Ordering::AcqRel);
    }

    /// Whether node `peer` may have sent `item` ([`check`]).
    pub(super) fn check(&self, peer: Peer, item: &Item) -> Result<(), String> {
        check(
            peer.node,
            self.me.node,
            item,
            |token, spawn| {
                self.pending.get(&token).is_some_and(|pending| {
                    pending.node == peer.node && matches!(pending.asked, Asked::Spawn { .. }) == spawn
                })
            },
            |watcher, pid| {
                self.monitors.get(&peer.node).is_some_and(|m| m.contains_key(&(watcher, pid)))
                    || (watcher.is_host() && self.embedded.contains_key(&pid))
            },
        )
    }

    pub(super) fn resend_all(&mut self, now: Instant) {
        for (&node, link) in &mut self.out {
            if !link.unacked.is_empty() {
                link.resend(&self.inner, now);
                self.dirty.insert(node);
            }
        }
    }
}

impl OutLink {
    /// Sends again, from the first item the receiver has not acknowledged.
    pub(super) fn resend(&mut self, inner: &Inner, now: Instant) {
        let first = self.start();
        inner.counters.retransmitted.fetch_add(self.sent.saturating_sub(first - 1), Ordering::Relaxed);
        self.sent = first - 1;
        self.progress = now;
    }
}

/// Whether node `sender` may have sent `item` to node `here`: the processes it speaks
/// for are its own, those it names here are this node's, an exit is one a local watcher
/// waits for (`watched(watcher, pid)`), and an answer answers what this node asked of
/// that node (`asked(token, spawn)`: a spawn, or `spawn` false, a termination, link or
/// exit signal). A node's link carries what its processes did, never what another
/// node's did. An exit signal of a link (`Signal::Link`) acts only on a process here
/// that holds a link to its sender, which its own node checks.
fn check(
    sender: u16,
    here: u16,
    item: &Item,
    asked: impl Fn(u64, bool) -> bool,
    watched: impl Fn(Pid, Pid) -> bool,
) -> Result<(), String> {
    let own = |pid: Pid, what: &str| {
        if pid.node() == sender { Ok(()) } else { Err(format!("{what} {pid} is not a process of the sending node")) }
    };
    let local = |pid: Pid, what: &str| {
        if pid.node() == here { Ok(()) } else { Err(format!("{what} {pid} is not a process of this node")) }
    };
    let answers = |token: u64, spawn: bool, what: &str| {
        if asked(token, spawn) { Ok(()) } else { Err(format!("{what} answers nothing this node asked the sender")) }
    };
    match item {
        Item::Message { from, to, .. } => own(*from, "the message's sender").and(local(*to, "its receiver")),
        Item::Monitor { watcher, target } => own(*watcher, "the watcher").and(local(*target, "the watched")),
        Item::Exit { watcher, pid, .. } => {
            own(*pid, "the exited process")?;
            if watched(*watcher, *pid) {
                Ok(())
            } else {
                Err(format!("an exit of {pid} that {watcher} does not wait for"))
            }
        }
        Item::Terminate { by, target, .. } => own(*by, "the terminating process").and(local(*target, "the target")),
        Item::Done { token, .. } => answers(*token, false, "an answer"),
        Item::Link { from, to, .. } | Item::Unlink { from, to } => {
            own(*from, "the linking process").and(local(*to, "the linked"))
        }
        Item::Signal { from, to, .. } => own(*from, "the exit signal's sender").and(local(*to, "its receiver")),
        Item::Spawn { spawn, .. } if spawn.link && spawn.parent.is_host() => {
            Err(format!("a spawn linked to {}, a node's host, which no link can name", spawn.parent))
        }
        Item::Spawn { spawn, .. } => own(spawn.parent, "the spawn's parent"),
        Item::Log { pid, .. } => own(*pid, "the line's process"),
        // A node stops its own run (`scope` 0: what it owns), or one of its clients'.
        Item::StopRun { .. } => Ok(()),
        Item::SpawnDone { token, result } => {
            answers(*token, true, "a spawn's answer")?;
            match result {
                Ok(child) => own(*child, "the spawned process"),
                Err(_) => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Payload;
    use crate::scheduler::remote::{RemoteSignal, Signal, Verdict};

    /// What one node's link says of another node's processes is refused: a
    /// message from another node's process, an exit of one, an exit nobody waits for,
    /// a termination on behalf of another node's process or of a process elsewhere, an
    /// answer to a question this node did not ask that node.
    #[test]
    fn a_node_speaks_only_for_its_own_processes() {
        let (sender, here, third) = (3, 5, 7);
        let on = |node: u16, n: u64| Pid::from_u64(n).with_node(node);
        let asked = |token: u64, spawn: bool| token == 1 && spawn || token == 2 && !spawn;
        let watched = |watcher: Pid, pid: Pid| watcher == on(here, 10) && pid == on(sender, 20);
        let checked = |item: Item| check(sender, here, &item, asked, watched);
        let message = |from, to| Item::Message { from, to, topic: "t".into(), body: Payload::empty() };
        let exit = |watcher, pid| Item::Exit { watcher, pid, reason: crate::ExitReason::Killed };

        assert_eq!(checked(message(on(sender, 1), on(here, 2))), Ok(()));
        assert!(checked(message(on(third, 1), on(here, 2))).unwrap_err().contains("not a process of the sending node"));
        assert!(checked(message(on(sender, 1), on(third, 2))).is_err());

        assert_eq!(checked(exit(on(here, 10), on(sender, 20))), Ok(()));
        assert!(checked(exit(on(here, 10), on(third, 20))).is_err(), "an exit of another node's process");
        assert!(checked(exit(on(here, 11), on(sender, 20))).unwrap_err().contains("does not wait for"));

        let terminate = |by, target| Item::Terminate { by, target, token: 0, child_only: false };
        assert_eq!(checked(terminate(on(sender, 1), on(here, 2))), Ok(()));
        assert!(checked(terminate(on(third, 1), on(here, 2))).is_err(), "on behalf of another node's process");
        assert!(checked(terminate(on(sender, 1), on(third, 2))).is_err(), "of a process elsewhere");

        assert_eq!(checked(Item::SpawnDone { token: 1, result: Ok(on(sender, 4)) }), Ok(()));
        assert!(checked(Item::SpawnDone { token: 3, result: Ok(on(sender, 4)) }).is_err(), "not asked");
        assert!(checked(Item::SpawnDone { token: 2, result: Ok(on(sender, 4)) }).is_err(), "asked, not a spawn");
        assert!(checked(Item::SpawnDone { token: 1, result: Ok(on(third, 4)) }).is_err(), "a pid of another node");
        assert_eq!(checked(Item::Done { token: 2, verdict: Verdict::Done }), Ok(()));
        assert!(checked(Item::Done { token: 9, verdict: Verdict::Done }).is_err());
        assert!(checked(Item::Done { token: 1, verdict: Verdict::Done }).is_err(), "a spawn's answer is no `Done`");

        // Links and exit signals: from the sender's own processes, to this node's.
        let link = |from, to| Item::Link { from, to, token: 0, child_only: false };
        assert_eq!(checked(link(on(sender, 1), on(here, 2))), Ok(()));
        assert!(checked(link(on(third, 1), on(here, 2))).is_err(), "on behalf of another node's process");
        assert!(checked(link(on(sender, 1), on(third, 2))).is_err(), "to a process elsewhere");
        assert!(checked(Item::Unlink { from: on(third, 1), to: on(here, 2) }).is_err());
        let signal = |from, to| Item::Signal {
            from,
            to,
            signal: RemoteSignal { reason: crate::ExitReason::Killed, how: Signal::Kill },
            token: 0,
            child_only: false,
        };
        assert_eq!(checked(signal(on(sender, 1), on(here, 2))), Ok(()));
        assert!(checked(signal(on(third, 1), on(here, 2))).unwrap_err().contains("not a process of the sending node"));
        assert!(checked(signal(on(sender, 1), on(third, 2))).is_err());
        assert!(checked(Item::Monitor { watcher: on(third, 1), target: on(here, 2) }).is_err());
    }
}
