//! Clients' sessions: a client (`run --cluster`, `cluster ls`) asks for one, spawns the
//! roots of its run in it, keeps it alive, and leaves (see `mod.rs`, "Clients").

use std::time::Instant;

use rustc_hash::FxHashSet;

use super::{Actor, Dest, MAX_SESSIONS, Offer, REFUSALS_ANSWERED, Session, random_u64};
use crate::Pid;
use crate::cluster::config::Heard;
use crate::cluster::wire::{self, Body, ClientRequest, Item, Peer};
use crate::scheduler::remote::{RunId, Verdict};

impl Actor {
    /// A client asks for a session: offer one, on its inbox.
    pub(super) async fn client_hello(&mut self, client: Peer, nonce: u64, inbox: String) {
        if !self.is_inbox(&inbox) {
            return self.refuse(format_args!("a client's hello with the inbox `{inbox}`"));
        }
        if self.offers.len() >= MAX_SESSIONS
            && let Some(oldest) = self.offered.pop_front()
        {
            self.offers.remove(&oldest);
        }
        let session = random_u64().max(1);
        self.offers.insert(session, Offer { client, inbox: inbox.clone(), made: Instant::now() });
        self.offered.push_back(session);
        let announce = self.announcement(false, 0, 0);
        let subject = format!("{inbox}.reply");
        self.publish(subject, &Body::Welcome { announce, echo: nonce, session }).await;
    }

    /// A client's hello failed authentication: tell it so (a few a heartbeat), under
    /// this node's key, which that client cannot check: it only learns that a node of
    /// this name refused it.
    pub(super) async fn refuse_client(&mut self, frame: &[u8]) {
        if self.refusals.answered >= REFUSALS_ANSWERED {
            return;
        }
        let Ok((_, body)) = wire::unchecked_body(frame).and_then(wire::decode) else { return };
        let Body::ClientHello { nonce, inbox } = body else { return };
        if !self.is_inbox(&inbox) {
            return;
        }
        self.refusals.answered += 1;
        let announce = self.announcement(false, 0, 0);
        self.publish(format!("{inbox}.reply"), &Body::Welcome { announce, echo: nonce, session: 0 }).await;
    }

    /// A request in a client's session: the first takes up an offer.
    pub(super) async fn run_request(&mut self, client: Peer, id: u64, seq: u64, request: ClientRequest) {
        let now = Instant::now();
        if !self.sessions.contains_key(&id) {
            match self.offers.get(&id) {
                Some(offer) if offer.client == client => {
                    if self.sessions.len() >= MAX_SESSIONS {
                        return self.refuse(format_args!("a session past the {MAX_SESSIONS} this node holds"));
                    }
                    let offer = self.offers.remove(&id).expect("just seen");
                    self.offered.retain(|&o| o != id);
                    let session = Session {
                        client,
                        inbox: offer.inbox,
                        last_seq: 0,
                        sent: 0,
                        heard: Heard::at(now),
                        run: random_u64().max(1),
                        roots: FxHashSet::default(),
                    };
                    self.sessions.insert(id, session);
                }
                _ => return self.repeated(),
            }
        }
        let session = self.sessions.get_mut(&id).expect("just made");
        if session.client != client {
            return self.refuse(format_args!("a request in another client's session"));
        }
        if seq <= session.last_seq {
            return self.repeated();
        }
        session.last_seq = seq;
        session.heard.again(now);
        match request {
            ClientRequest::Keepalive => self.reply(id, None).await,
            ClientRequest::Spawn { token, spawn, .. } if spawn.link => {
                // Only a process links, and a client is none.
                let item = Item::SpawnDone { token, result: Err("spawn failed: a client's spawn cannot link".into()) };
                self.reply(id, Some(item)).await;
            }
            ClientRequest::Spawn { token, mut spawn, name } => {
                // The run's root: its parent is this node's host (so the run is this
                // node's), its client's run the session's, its grants no wider than this
                // node's (`run_spawns`).
                spawn.parent = Pid::node_host(self.me.node);
                spawn.run = RunId { node: 0, client: session.run };
                if let (Some(hash), Some(name)) = (&spawn.identity, name) {
                    self.inner.code.name_if_unnamed(hash, name);
                }
                self.spawn_here(Dest::Session(id), token, *spawn);
            }
            ClientRequest::StopRun { reason, grace } => {
                let run = session.run;
                self.stop_client_run(run, &reason, grace);
            }
            ClientRequest::Terminate { target } => {
                if !session.roots.contains(&target) {
                    let item = Item::Done {
                        token: 0,
                        verdict: Verdict::Failed(format!(
                            "permission denied: {target} is not a process this run spawned"
                        )),
                    };
                    return self.reply(id, Some(item)).await;
                }
                if let Some(handle) = self.inner.handle.get() {
                    let _ = handle.terminate_watched(target, Box::new(|_, _| {}));
                }
            }
            ClientRequest::Leave => self.end_session(id, "its client left"),
        }
    }

    /// Sends `item` (or word that this node is there) to the client of session `id`.
    pub(super) async fn reply(&mut self, id: u64, item: Option<Item>) {
        let Some(session) = self.sessions.get_mut(&id) else { return };
        if let Some(Item::SpawnDone { result: Ok(pid), .. }) = &item {
            session.roots.insert(*pid);
        }
        if let Some(Item::Exit { pid, .. }) = &item {
            session.roots.remove(pid);
        }
        session.sent += 1;
        let body = Body::Reply { session: id, seq: session.sent, item };
        let subject = format!("{}.reply", session.inbox);
        self.publish(subject, &body).await;
    }

    /// Ends session `id`: its client is gone, and so are its run's processes, here and
    /// on the other nodes (cancelled, then terminated after the grace).
    pub(super) fn end_session(&mut self, id: u64, why: &str) {
        if let Some(session) = self.sessions.remove(&id) {
            tracing::debug!(session = id, why, roots = session.roots.len(), "a client's session ended");
            let reason = format!("the run's client {why}");
            self.stop_client_run(session.run, &reason, self.inner.grace);
        }
    }
}
