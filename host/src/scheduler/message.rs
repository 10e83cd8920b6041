//! A message's trip, whoever sends it: from a process (through its port, or as a yielded
//! `send` command: [`Shared::send_as`], the checks), or from the embedder or another node,
//! to the receiver's mailbox on this node ([`Shared::deliver_message`]) or to the cluster
//! when its pid names another node ([`Shared::remote_for`]).
//!
//! Checks, in order: the payload limit and the `send` capability (a process's messages
//! only), then the receiver: unknown or ended ([`SendError::NotFound`]), ending
//! ([`SendError::Closed`]), or its mailbox full in messages or bytes
//! ([`SendError::MailboxFull`]). A durable process's messages through its port are kept
//! for its step's record here, and delivered once that is committed (see `durable.rs`).

use std::sync::Arc;

use wasmproc_types::{Payload, Pid};

use super::cell::ProcessCell;
use super::durable;
use super::handle::Handle;
use super::inbox::Refused;
use super::remote::Remote;
use super::shared::Shared;
use super::state::Wake;
use crate::error::{MailboxLimit, PortError, SendError};
use crate::step::{CommandKind, Event, message_size};

impl Shared {
    /// Sends `body` from `cell`'s process to `to`: the one path of every message a
    /// process sends, through its port or as a yielded command. Checks, in order, the
    /// payload limit and the `send` capability, then delivers.
    /// `id`: the message's identity, for a yielded `send` of a durable process (its port
    /// sends are kept for the step's record here, and delivered with theirs later).
    pub(super) fn send_as(
        &self,
        cell: &ProcessCell,
        to: Pid,
        topic: String,
        body: Payload,
        id: Option<u64>,
    ) -> Result<(), PortError> {
        let send = CommandKind::Send;
        self.settings.limits.check_payload(message_size(&topic, &body), send.name()).map_err(PortError::TooLarge)?;
        if !cell.spec.caps.allows_builtin(send) {
            return Err(PortError::PermissionDenied);
        }
        if self.durable.is_some() && id.is_none() {
            // Delivered once the step's record is committed: whether the receiver takes
            // it is not known before, so it is not reported (see `durable.rs`).
            return durable::keep_port_send(cell, (to, topic, body)).map_err(|_| PortError::NotInStep);
        }
        Ok(self.send(cell.pid(), to, topic, body, id)?)
    }

    /// Delivers a message; `id` is its identity in a durable scheduler (`None` otherwise).
    pub(super) fn send(
        &self,
        from: Pid,
        to: Pid,
        topic: String,
        body: Payload,
        id: Option<u64>,
    ) -> Result<(), SendError> {
        if let Some(remote) = self.remote_for(to) {
            // A host's own messages leave as its node's.
            let from = if from == Pid::HOST { Pid::node_host(self.node) } else { from };
            return remote.send(from, to, topic, body);
        }
        let cell = self.registry.get(to).ok_or(SendError::NotFound(to))?;
        self.deliver_message(&cell, from, topic, body, id)
    }

    /// Puts a message in `cell`'s mailbox and wakes it.
    pub(super) fn deliver_message(
        &self,
        cell: &Arc<ProcessCell>,
        from: Pid,
        topic: String,
        body: Payload,
        id: Option<u64>,
    ) -> Result<(), SendError> {
        let to = cell.pid();
        match cell.deliver_identified(Event::Message { sender: from, topic, body }, id.map(|n| (from, n))) {
            Ok(wake) => {
                self.count(|c| &c.messages, 1);
                if wake == Wake::Schedule {
                    self.schedule(cell.clone());
                }
                Ok(())
            }
            Err(Refused::Closed) => Err(SendError::Closed(to)),
            Err(Refused::Full { capacity }) => {
                Err(SendError::MailboxFull { pid: to, limit: MailboxLimit::Messages(capacity) })
            }
            Err(Refused::FullBytes { limit }) => {
                Err(SendError::MailboxFull { pid: to, limit: MailboxLimit::Bytes(limit) })
            }
        }
    }

    /// The remote that takes `pid`, if it names another node: the one compare on the
    /// local path.
    #[inline]
    pub(super) fn remote_for(&self, pid: Pid) -> Option<&Arc<dyn Remote>> {
        if pid.node() == self.node { None } else { self.remote.as_ref() }
    }
}

#[cfg_attr(
    not(feature = "cluster"),
    expect(dead_code, reason = "only a cluster (feature `cluster`) reaches processes of other nodes")
)]
impl Handle {
    /// Delivers a message from a process of another node to a local one.
    pub(crate) fn deliver_remote(&self, from: Pid, to: Pid, topic: String, body: Payload) -> Result<(), SendError> {
        let cell = self.shared.registry.get(to).ok_or(SendError::NotFound(to))?;
        self.shared.deliver_message(&cell, from, topic, body, None)
    }
}
