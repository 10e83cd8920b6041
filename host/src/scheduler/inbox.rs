//! The per-process inbox: a multi-producer, single-consumer event queue.
//!
//! Producers are command handlers completing yields, senders, monitors and the
//! scheduler itself (cancel); the consumer is whichever worker owns the process. A
//! mutex over a `Vec` is the right tool here: pushes are a few nanoseconds uncontended,
//! the consumer takes every pending event with one swap, and the same lock makes
//! "closed", the mailbox bound and the list of watchers consistent with the events.
//!
//! Watchers (whom to tell when the process ends) are of a type the inbox only stores:
//! the scheduler's `cell::Watcher`.

use std::mem;

use wasmproc_types::Pid;

use crate::loom::Mutex;
use crate::step::{Event, Exited, message_size};

/// A durable message's identity: its sender, and a number unique among that sender's
/// messages (see `durable.rs`), so a recovery delivers each exactly once.
pub(super) type MessageId = (Pid, u64);

/// Why an inbox refused an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The process has finished or is finishing.
    Closed,
    /// The mailbox holds `capacity` undelivered messages already.
    Full { capacity: usize },
    /// The message would take the mailbox's undelivered messages past `limit` bytes.
    FullBytes { limit: usize },
}

/// What a mailbox holds at most: undelivered messages, and their bytes (topics and
/// bodies, as [`message_size`] counts them). An empty mailbox takes any one message, so
/// a message larger than the byte bound is delayed until its receiver has read the rest,
/// never refused for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MailboxBound {
    pub(super) messages: usize,
    pub(super) bytes: usize,
}

pub(super) struct Inbox<W> {
    inner: Mutex<InboxState<W>>,
}

struct InboxState<W> {
    events: Vec<Event>,
    /// The identities of the messages in `events`, in order, when they have any (in a
    /// durable scheduler, all do).
    ids: Vec<MessageId>,
    /// The identities of the messages the last drain took, for the consumer to record.
    drained_ids: Vec<MessageId>,
    /// Messages in `events`; bounded by the mailbox capacity.
    messages: usize,
    /// The bytes of the messages in `events`; bounded by the mailbox's byte bound.
    bytes: usize,
    closed: bool,
    watchers: Vec<W>,
    terminate_reason: Option<Exited>,
}

/// What is left in an inbox when it closes.
pub(super) struct Closed<W> {
    /// Events the process will never see.
    pub(super) undelivered: Vec<Event>,
    /// Everyone to tell about the exit.
    pub(super) watchers: Vec<W>,
    /// Set if the process was terminated rather than finishing by itself.
    pub(super) terminate_reason: Option<Exited>,
}

impl<W> Inbox<W> {
    pub(super) fn new() -> Self {
        Inbox {
            inner: Mutex::new(InboxState {
                events: Vec::new(),
                ids: Vec::new(),
                drained_ids: Vec::new(),
                messages: 0,
                bytes: 0,
                closed: false,
                watchers: Vec::new(),
                terminate_reason: None,
            }),
        }
    }

    /// Pushes `event`. Messages count against `bound`; other events (completions,
    /// exits, cancel) are bounded by what the process itself asked for and always fit.
    pub(super) fn push(&self, event: Event, bound: MailboxBound) -> Result<(), Refused> {
        self.push_identified(event, bound, None)
    }

    /// As [`Inbox::push`], with the identity of a message.
    pub(super) fn push_identified(
        &self,
        event: Event,
        bound: MailboxBound,
        id: Option<MessageId>,
    ) -> Result<(), Refused> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        if let Event::Message { topic, body, .. } = &event {
            if inner.messages >= bound.messages {
                return Err(Refused::Full { capacity: bound.messages });
            }
            // No overflow: both terms are sizes of live allocations, or the bound.
            let bytes = inner.bytes + message_size(topic, body);
            if bytes > bound.bytes && inner.messages != 0 {
                return Err(Refused::FullBytes { limit: bound.bytes });
            }
            inner.messages += 1;
            inner.bytes = bytes;
        }
        inner.events.push(event);
        inner.ids.extend(id);
        Ok(())
    }

    /// Moves every pending event into `buf` (which must be empty) by swapping buffers,
    /// so neither side reallocates in the steady state.
    pub(super) fn drain_into(&self, buf: &mut Vec<Event>) {
        debug_assert!(buf.is_empty());
        let mut inner = self.inner.lock();
        mem::swap(&mut inner.events, buf);
        inner.messages = 0;
        inner.bytes = 0;
        // Swapping two empty vectors when messages carry no identity: no allocation.
        let inner = &mut *inner;
        inner.drained_ids.clear();
        mem::swap(&mut inner.ids, &mut inner.drained_ids);
    }

    /// Whether no event waits to be drained.
    pub(super) fn is_empty(&self) -> bool {
        self.inner.lock().events.is_empty()
    }

    /// The identities of the messages the last [`Inbox::drain_into`] took. Only the
    /// consumer calls it, between its drain and the next.
    pub(super) fn take_drained_ids(&self) -> Vec<MessageId> {
        mem::take(&mut self.inner.lock().drained_ids)
    }

    /// Registers someone to tell when the process ends; gives it back if it already has.
    pub(super) fn watch(&self, watcher: W) -> Result<(), W> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(watcher);
        }
        inner.watchers.push(watcher);
        Ok(())
    }

    /// Records why the process is being terminated; the first reason wins. Returns
    /// false if the process has already finished.
    pub(super) fn set_terminate_reason(&self, reason: Exited) -> bool {
        let mut inner = self.inner.lock();
        if inner.closed {
            return false;
        }
        inner.terminate_reason.get_or_insert(reason);
        true
    }

    /// Why the process is being terminated, if it is.
    pub(super) fn terminate_reason(&self) -> Option<Exited> {
        self.inner.lock().terminate_reason.clone()
    }

    /// Refuses every later push and hands back what is left.
    pub(super) fn close(&self) -> Closed<W> {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.messages = 0;
        inner.bytes = 0;
        Closed {
            undelivered: mem::take(&mut inner.events),
            watchers: mem::take(&mut inner.watchers),
            terminate_reason: inner.terminate_reason.take(),
        }
    }

    #[cfg(all(test, loom))]
    pub(super) fn len(&self) -> usize {
        self.inner.lock().events.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use wasmproc_types::{ExitReason, Payload, Pid};

    fn message(n: u64) -> Event {
        Event::Message { sender: Pid::HOST, topic: "t".into(), body: Payload::u64(n) }
    }

    /// A message of `len` bytes as the mailbox counts them (a one-byte topic).
    fn message_of(len: usize) -> Event {
        Event::Message { sender: Pid::HOST, topic: "t".into(), body: Payload::bytes(vec![0; len - 1]) }
    }

    fn messages(n: usize) -> MailboxBound {
        MailboxBound { messages: n, bytes: usize::MAX }
    }

    #[test]
    fn mailbox_bound_counts_messages_only() {
        let inbox = Inbox::<()>::new();
        assert_eq!(inbox.push(message(1), messages(1)), Ok(()));
        assert_eq!(inbox.push(message(2), messages(1)), Err(Refused::Full { capacity: 1 }));
        let completion = Event::Completion { tag: 7, result: Ok(Payload::empty()) };
        assert_eq!(inbox.push(completion, messages(1)), Ok(()));
        let mut buf = Vec::new();
        inbox.drain_into(&mut buf);
        assert_eq!(buf.len(), 2);
        assert_eq!(inbox.push(message(3), messages(1)), Ok(()), "draining frees the mailbox");
    }

    #[test]
    fn mailbox_bound_counts_bytes() {
        let inbox = Inbox::<()>::new();
        let bound = MailboxBound { messages: 100, bytes: 1000 };
        assert_eq!(inbox.push(message_of(600), bound), Ok(()));
        assert_eq!(inbox.push(message_of(400), bound), Ok(()), "up to the bound exactly");
        assert_eq!(inbox.push(message_of(1), bound), Err(Refused::FullBytes { limit: 1000 }));
        let completion = Event::Completion { tag: 7, result: Ok(Payload::bytes(vec![0; 5000])) };
        assert_eq!(inbox.push(completion, bound), Ok(()), "only messages count");
        let mut buf = Vec::new();
        inbox.drain_into(&mut buf);
        assert_eq!(inbox.push(message_of(1000), bound), Ok(()), "draining frees the bytes");
        buf.clear();
        inbox.drain_into(&mut buf);
        assert_eq!(inbox.push(message_of(5000), bound), Ok(()), "an empty mailbox takes any one message");
        assert_eq!(inbox.push(message_of(1), bound), Err(Refused::FullBytes { limit: 1000 }));
        inbox.close();
        assert_eq!(inbox.push(message_of(1), bound), Err(Refused::Closed));
    }

    #[test]
    fn closed_inbox_refuses_and_returns_leftovers() {
        let inbox = Inbox::<()>::new();
        inbox.push(message(1), messages(8)).unwrap();
        assert!(inbox.set_terminate_reason(ExitReason::Terminated.into()));
        assert!(inbox.set_terminate_reason(ExitReason::Killed.into()));
        let closed = inbox.close();
        assert_eq!(closed.undelivered.len(), 1);
        assert_eq!(closed.terminate_reason, Some(ExitReason::Terminated.into()));
        assert_eq!(inbox.push(message(2), messages(8)), Err(Refused::Closed));
        assert!(!inbox.set_terminate_reason(ExitReason::Shutdown.into()));
    }
}
