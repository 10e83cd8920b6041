//! Membership: announcing this node, hearing others' announcements, probing and
//! admitting a node on a fresh answer, and losing one (see the protocol in `mod.rs`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Actor, Asked, Counted, HEARTBEAT, InLink, MAX_ANNOUNCED, Member, Probing, random_u64};
use crate::ExitReason;
use crate::cluster::config::Heard;
use crate::cluster::shared::{NodeInfo, lost, noconnection};
use crate::cluster::wire::{Announce, Body, Peer};

impl Actor {
    /// This node as it announces itself: the `seq`-th announcement.
    pub(super) fn announcement(&mut self, leaving: bool, echo: u64, link_start: u64) -> Announce {
        self.announced += 1;
        let handle = self.inner.handle.get();
        Announce {
            name: self.inner.name.clone(),
            load: handle.map_or(0, |h| h.live() as u64),
            accepts: self.inner.accepts && handle.is_some(),
            components: self.components(),
            names: self.component_names(),
            leaving,
            seq: self.announced,
            echo,
            link_start,
        }
    }

    pub(super) async fn announce(&mut self, leaving: bool) {
        let announce = self.announcement(leaving, 0, 0);
        self.publish(format!("{}.announce", self.inner.prefix), &Body::Announce(announce)).await;
    }

    pub(super) fn components(&self) -> Vec<String> {
        let mut components = self.inner.code.hashes();
        if let Some(handle) = self.inner.handle.get() {
            components.extend(handle.kinds().into_iter().filter_map(|(_, identity)| identity));
        }
        components.sort();
        components.dedup();
        components.truncate(MAX_ANNOUNCED);
        components
    }

    /// The names of the components of [`Actor::components`] this node knows: a
    /// registered kind's name, or the file name it was offered or fetched with.
    pub(super) fn component_names(&self) -> Vec<(String, String)> {
        let mut names = self.inner.code.named();
        if let Some(handle) = self.inner.handle.get() {
            for (kind, identity) in handle.kinds() {
                if let Some(hash) = identity
                    && !names.iter().any(|(known, _)| *known == hash)
                {
                    names.push((hash, kind));
                }
            }
        }
        names.sort();
        names
    }

    /// A heartbeat (or a goodbye) on the announcements' subject.
    pub(super) async fn announced_by(&mut self, peer: Peer, announce: Announce) {
        match self.members.get_mut(&peer.node) {
            Some(member) if member.peer == peer => {
                if announce.seq <= member.last_seq {
                    return self.repeated();
                }
                member.last_seq = announce.seq;
                member.heard.again(Instant::now());
                if announce.leaving {
                    self.lose(peer.node, LEFT);
                } else {
                    member.announce = announce;
                    self.inner.placed[usize::from(peer.node)].store(0, Ordering::Relaxed);
                    self.publish_view();
                }
            }
            // A node this one does not know as it is: maybe a new one, maybe a copy of
            // an old announcement. Only a live node answers the probe.
            _ if !announce.leaving => self.probe(peer).await,
            _ => {}
        }
    }

    /// Sends `peer` a probe, unless one went to its node id within a heartbeat.
    pub(super) async fn probe(&mut self, peer: Peer) {
        let now = Instant::now();
        if self.probes.get(&peer.node).is_some_and(|p| now.duration_since(p.sent) < HEARTBEAT) {
            return;
        }
        let nonce = random_u64().max(1);
        self.probes.insert(peer.node, Probing { nonce, incarnation: peer.incarnation, sent: now });
        let link_start = self.link_start(peer);
        self.publish(self.subject(peer.node), &Body::Probe { nonce, link_start }).await;
    }

    /// `peer` asks for a fresh announcement: it does not count this node as a member.
    pub(super) async fn probed(&mut self, peer: Peer, nonce: u64, link_start: u64) {
        if self.answered.get(&peer.node) == Some(&nonce) {
            return self.repeated();
        }
        self.answered.insert(peer.node, nonce);
        if self.is_member(peer) {
            // It dropped its link to this node (it lost this one): it takes up from
            // `link_start`, never lower.
            if let Some(link) = self.inl.get_mut(&peer.node)
                && link.incarnation == peer.incarnation
            {
                link.expected = link.expected.max(link_start);
            }
            // What it dropped of this node's link, it takes again once it admits this one.
            if let Some(link) = self.out.get_mut(&peer.node)
                && link.incarnation == peer.incarnation
                && !link.unacked.is_empty()
            {
                link.resend(&self.inner, Instant::now());
                self.dirty.insert(peer.node);
            }
        }
        let start = self.link_start(peer);
        let answer = self.announcement(false, nonce, start);
        self.publish(self.subject(peer.node), &Body::Announce(answer)).await;
    }

    /// An answer to a probe, on this node's own subject.
    pub(super) fn answered_probe(&mut self, peer: Peer, announce: Announce) {
        match self.probes.get(&peer.node) {
            Some(p) if p.nonce == announce.echo && p.incarnation == peer.incarnation => {
                self.probes.remove(&peer.node);
                if !announce.leaving {
                    self.admit(peer, announce, Instant::now());
                    self.publish_view();
                }
            }
            _ => self.repeated(),
        }
    }

    /// A joining node's hello: the answer goes to its reply subject.
    pub(super) async fn hello(&mut self, reply: &str, nonce: u64) {
        if !self.is_inbox(reply) {
            return self.refuse(format_args!("a hello to be answered on `{reply}`"));
        }
        let answer = self.announcement(false, nonce, 1);
        self.publish(reply.to_owned(), &Body::Announce(answer)).await;
    }

    /// Whether this node may publish answers to `subject`: a subject that names no
    /// wildcard, and none of the cluster's own (an answer there would be a frame a node
    /// or client did not ask for).
    pub(super) fn is_inbox(&self, subject: &str) -> bool {
        !subject.is_empty()
            && subject.len() <= 256
            && !subject.starts_with(&format!("{}.", self.inner.prefix))
            && subject.split('.').all(|token| !token.is_empty() && token != "*" && token != ">")
            && !subject.contains(|c: char| c.is_whitespace())
    }

    /// Makes `peer` a member on a fresh announcement (it answered this node's nonce).
    pub(super) fn admit(&mut self, peer: Peer, announce: Announce, now: Instant) {
        if let Some(member) = self.members.get(&peer.node)
            && member.peer.incarnation != peer.incarnation
        {
            // The node restarted under the same id: its old processes are gone.
            self.lose(peer.node, "restarted");
        }
        let start = announce.link_start.max(1);
        match self.inl.get_mut(&peer.node) {
            Some(link) if link.incarnation == peer.incarnation => link.expected = link.expected.max(start),
            _ => drop(self.inl.insert(peer.node, InLink { incarnation: peer.incarnation, expected: start })),
        }
        self.inner.placed[usize::from(peer.node)].store(0, Ordering::Relaxed);
        self.inner.alive[usize::from(peer.node)].store(peer.incarnation, Ordering::Release);
        let last_seq = announce.seq;
        self.members.insert(peer.node, Member { peer, announce, heard: Heard::at(now), last_seq });
    }

    pub(super) fn publish_view(&self) {
        let handle = self.inner.handle.get();
        let mut view: Vec<NodeInfo> = self
            .members
            .values()
            .map(|m| NodeInfo {
                id: m.peer.node,
                name: m.announce.name.clone(),
                load: m.announce.load,
                accepts: m.announce.accepts,
                components: m.announce.components.clone(),
                component_names: m.announce.names.clone(),
            })
            .collect();
        view.push(NodeInfo {
            id: self.me.node,
            name: self.inner.name.clone(),
            load: handle.map_or(0, |h| h.live() as u64),
            accepts: self.inner.accepts && handle.is_some(),
            components: self.components(),
            component_names: self.component_names(),
        });
        *self.inner.view.write() = view;
    }

    /// Forgets node `node`: its monitors and the processes linked to its processes get
    /// `noconnection`, what waits on it fails, and its unacknowledged messages are
    /// counted lost.
    pub(super) fn lose(&mut self, node: u16, why: &str) {
        let Some(member) = self.members.remove(&node) else { return };
        let name = member.announce.name;
        if why == LEFT {
            tracing::info!(node, name, "a node left the cluster");
        } else {
            tracing::warn!(node, name, why, "a node of the cluster is lost");
        }
        self.inner.counters.nodes_lost.fetch_add(1, Ordering::Relaxed);
        self.inner.alive[usize::from(node)].store(0, Ordering::Release);
        self.dirty.remove(&node);
        self.acks.remove(&node);
        self.inl.remove(&node);
        if let Some(link) = self.out.remove(&node) {
            let messages = link.unacked.iter().filter(|(_, _, counted)| *counted == Counted::Message).count();
            let lines = link.unacked.iter().filter(|(_, _, counted)| *counted == Counted::Log).count();
            self.inner.backlog.fetch_sub(messages, Ordering::AcqRel);
            self.inner.log_backlog.fetch_sub(lines, Ordering::AcqRel);
            self.inner.counters.messages_lost.fetch_add(messages as u64, Ordering::Relaxed);
            self.dropped.insert(node, (link.incarnation, link.next_seq));
        }
        let reason = noconnection(node, Some(&name));
        let exit = lost(node, Some(&name));
        for ((watcher, target), count) in self.monitors.remove(&node).unwrap_or_default() {
            for _ in 0..count {
                self.exit_to(watcher, target, exit.clone());
            }
        }
        // Before the links waiting on it complete: their `noconnection` comes first.
        if let Some(handle) = self.inner.handle.get() {
            let ended = handle.signal_links_to_node(node, &exit);
            if ended > 0 {
                tracing::info!(node, name, links = ended, "links to the lost node's processes ended");
            }
        }
        let tokens: Vec<u64> = self.pending.iter().filter(|(_, p)| p.node == node).map(|(&t, _)| t).collect();
        for token in tokens {
            let Some(pending) = self.pending.remove(&token) else { continue };
            match pending.asked {
                Asked::Spawn { done, embedded, .. } => {
                    if let Some(done) = done {
                        done.complete(Err(reason.clone()));
                    }
                    if let Some(slot) = embedded {
                        slot.set(Err(exit.clone()));
                    }
                }
                Asked::Terminate { done, .. } | Asked::Exit { done, .. } => done.complete(Err(reason.clone())),
                // As a link to a process that is gone: the signal above said why.
                Asked::Link { done, .. } => done.complete(Ok(crate::Payload::empty())),
            }
        }
        let reason = format!("the run's node `{name}` {why}");
        self.end_run_of(node, &reason, self.inner.grace);
        self.publish_view();
    }

    /// Why node `node` cannot be reached, naming it if it is known.
    pub(super) fn noconnection(&self, node: u16) -> String {
        noconnection(node, self.members.get(&node).map(|m| m.announce.name.as_str()))
    }

    /// The exit reason of a process of node `node`, which cannot be reached.
    pub(super) fn lost(&self, node: u16) -> ExitReason {
        lost(node, self.members.get(&node).map(|m| m.announce.name.as_str()))
    }
}

/// Why a node that said goodbye is gone.
const LEFT: &str = "left the cluster";
