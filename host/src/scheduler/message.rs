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
use super::durable::{self, Receipt};
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
            if let Some(remote) = self.remote_for(to) {
                remote.check(to)?;
            }
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
            return remote.send(from, to, topic, body, id);
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

    /// Records message `id` of `from`, a durable process of another journal (another
    /// shard's), in the history of `to`, a local one, and delivers it once that is
    /// committed, then calls `done`; `prev` is the identity of the message `from` sent
    /// `to` before this one (0: none). See [`Receipt`] for what else may become of it.
    pub(crate) fn receive_recorded(
        &self,
        from: Pid,
        to: Pid,
        ids: (u64, u64),
        topic: String,
        body: Payload,
        done: Box<dyn FnOnce() + Send>,
    ) -> Receipt {
        let Some(durable) = &self.shared.durable else {
            return Receipt::Refused("this scheduler has no journal".to_owned());
        };
        let Some(cell) = self.shared.registry.get(to) else { return Receipt::NoProcess };
        durable.record_received(&cell, from, ids, topic, body, done)
    }
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc::{Receiver, channel};
    use std::time::Duration;

    use wasmproc_types::{Payload, Pid};

    use super::Receipt;
    use crate::journal::{Journal, MemoryStore};
    use crate::{Event, Events, Port, Process, Scheduler, Status, StepOutput};

    /// Tells the test the number of each message it takes, in order.
    struct Collector(std::sync::mpsc::Sender<u64>);

    impl Process for Collector {
        fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            for event in events {
                // A replayed step took its messages before.
                if let Event::Message { body, .. } = event
                    && !crate::scheduler::replaying_now()
                {
                    let _ = self.0.send(body.to_u64().unwrap_or_default());
                }
            }
            out.set_status(Status::Idle);
            Ok(())
        }
    }

    fn scheduler(store: &Arc<MemoryStore>) -> (Scheduler, Receiver<u64>) {
        let (taken, seen) = channel();
        let taken = std::sync::Mutex::new(taken);
        let scheduler = Scheduler::builder()
            .workers(1)
            .journal(Journal::with_store(store.clone()))
            .kind("collector", move || -> anyhow::Result<Box<dyn Process>> {
                Ok(Box::new(Collector(taken.lock().expect("not poisoned").clone())))
            })
            .build()
            .expect("builds");
        (scheduler, seen)
    }

    /// Receives message `id` (after `prev`) of `from` for `to`, carrying `id` as its body;
    /// what became of it, and whether it was delivered once recorded.
    fn receive(scheduler: &Scheduler, from: Pid, to: Pid, (id, prev): (u64, u64)) -> (Receipt, Receiver<()>) {
        let (done, delivered) = channel();
        let done = Box::new(move || {
            let _ = done.send(());
        });
        (scheduler.handle().receive_recorded(from, to, (id, prev), "n".into(), Payload::u64(id), done), delivered)
    }

    /// How many messages `pid`'s committed steps took.
    fn consumed(store: &Arc<MemoryStore>, pid: Pid) -> usize {
        let journal = Journal::with_store(store.clone());
        let processes = journal.read_processes().expect("reads");
        processes.get(&pid).map_or(0, |saved| saved.steps.iter().map(|(_, step)| step.message_ids.len()).sum())
    }

    fn recorded(scheduler: &Scheduler, from: Pid, to: Pid, ids: (u64, u64)) {
        let (receipt, delivered) = receive(scheduler, from, to, ids);
        assert_eq!(receipt, Receipt::Recording, "{ids:?}");
        delivered.recv_timeout(Duration::from_secs(10)).expect("delivered once committed");
    }

    /// A message from a process of another journal is recorded once, after the one its
    /// sender sent before it, and a recovery keeps what its receiver recorded.
    #[test]
    fn a_message_from_another_journal_is_recorded_once_and_in_its_senders_order() {
        let store = Arc::new(MemoryStore::new());
        let (first, seen) = scheduler(&store);
        let to = first.handle().spawn(crate::scheduler::Spawnable::kind("collector"), "main").expect("spawns").pid();
        let from = Pid::from_u64(7).with_node(9);
        recorded(&first, from, to, (10, 0));
        assert_eq!(receive(&first, from, to, (10, 0)).0, Receipt::Duplicate);
        // Its predecessor, 20, has not come.
        assert_eq!(receive(&first, from, to, (30, 20)).0, Receipt::Early);
        recorded(&first, from, to, (20, 10));
        recorded(&first, from, to, (30, 20));
        // A sender's first message since its shard moved names no predecessor.
        assert_eq!(receive(&first, from, to, (20, 0)).0, Receipt::Duplicate);
        let nobody = Pid::from_u64(to.as_u64() + 1000);
        assert_eq!(receive(&first, from, nobody, (40, 30)).0, Receipt::NoProcess);
        let taken: Vec<u64> = (0..3).map(|_| seen.recv_timeout(Duration::from_secs(10)).expect("taken")).collect();
        assert_eq!(taken, [10, 20, 30]);
        // Stopped once the steps that took them are committed, so none comes again.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while consumed(&store, to) < 3 {
            assert!(std::time::Instant::now() < deadline, "the steps that took the messages were not committed");
            std::thread::sleep(Duration::from_millis(10));
        }
        first.stop(Duration::ZERO);
        drop(first);

        let (second, seen) = scheduler(&store);
        assert_eq!(receive(&second, from, to, (30, 20)).0, Receipt::Duplicate, "kept through the recovery");
        recorded(&second, from, to, (40, 30));
        assert_eq!(seen.recv_timeout(Duration::from_secs(10)).expect("taken"), 40, "nothing taken twice");
        second.stop(Duration::ZERO);
    }
}
