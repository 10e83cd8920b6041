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
//!
//! The same lock holds the process's side of its links and monitors and its
//! `trap-exits` flag, so that whether an exit signal ends the process, becomes an event
//! or is dropped (the link was removed, the monitor demonitored, the process has ended)
//! is decided in one step with the push, against the state a concurrent `unlink`,
//! `demonitor` or `close` left: an exit signal never arrives after the `unlink` or
//! `demonitor` that removed its reason has completed.

use std::mem;

use rustc_hash::{FxHashMap, FxHashSet};
use wasmproc_types::{ExitReason, Pid};

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
    /// The processes linked to this one; bounded by `max_links` when linked.
    links: FxHashSet<Pid>,
    /// How many monitors this process holds on each pid: an exit of a monitor arriving
    /// for a pid with none left (demonitored) is dropped.
    monitoring: FxHashMap<Pid, u32>,
    /// Exit signals arrive as events instead of ending the process (`trap-exits`).
    trap_exits: bool,
}

/// How an exit signal reaches a process ([`Inbox::signal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// A linked process ended: dropped unless the link still holds, which it then ends.
    Link,
    /// An exit signal without a link (an `exit` command, a `noproc` for a link to no
    /// process): trappable.
    Exit,
    /// The untrappable `kill`.
    Kill,
}

/// What an exit signal did ([`Inbox::signal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Signalled {
    /// It was pushed as an [`Event::Exit`]: the caller wakes the process.
    Event,
    /// It ends the process (its reason is set, unless an earlier one was): the caller
    /// requests the termination.
    Terminate,
    /// Nothing: a normal reason to a process that does not trap exits, a link that no
    /// longer holds, or a process that has ended.
    Dropped,
}

/// Why a link was refused ([`Inbox::add_link`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LinkRefused {
    /// The process has finished or is finishing.
    Closed,
    /// It has `limit` links already.
    Full { limit: usize },
}

/// What is left in an inbox when it closes.
pub(super) struct Closed<W> {
    /// Events the process will never see.
    pub(super) undelivered: Vec<Event>,
    /// Everyone to tell about the exit.
    pub(super) watchers: Vec<W>,
    /// Set if the process was terminated rather than finishing by itself.
    pub(super) terminate_reason: Option<Exited>,
    /// The processes linked to it, to send its exit signal.
    pub(super) links: FxHashSet<Pid>,
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
                links: FxHashSet::default(),
                monitoring: FxHashMap::default(),
                trap_exits: false,
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

    /// Whether a message of `size` bytes would be taken now under `bound`, as
    /// [`Inbox::push`] decides, without taking it.
    pub(super) fn check_room(&self, size: usize, bound: MailboxBound) -> Result<(), Refused> {
        let inner = self.inner.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        if inner.messages >= bound.messages {
            return Err(Refused::Full { capacity: bound.messages });
        }
        if inner.bytes + size > bound.bytes && inner.messages != 0 {
            return Err(Refused::FullBytes { limit: bound.bytes });
        }
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

    /// Gives back the room its queues keep beyond what they hold (a suspended process's
    /// inbox waits, nearly always empty, for as long as the process is suspended).
    pub(super) fn shrink_to_fit(&self) {
        let mut inner = self.inner.lock();
        inner.events.shrink_to_fit();
        inner.ids.shrink_to_fit();
        inner.drained_ids.shrink_to_fit();
        inner.watchers.shrink_to_fit();
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

    /// Removes the watchers `unwanted` picks; they are not told of the exit.
    pub(super) fn unwatch(&self, unwanted: impl Fn(&W) -> bool) {
        self.inner.lock().watchers.retain(|watcher| !unwanted(watcher));
    }

    /// Links the process to `pid`, unless it has `limit` links already; linking twice is
    /// linking once.
    pub(super) fn add_link(&self, pid: Pid, limit: usize) -> Result<(), LinkRefused> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(LinkRefused::Closed);
        }
        if inner.links.len() >= limit && !inner.links.contains(&pid) {
            return Err(LinkRefused::Full { limit });
        }
        inner.links.insert(pid);
        Ok(())
    }

    /// Removes the link to `pid`, if there is one (true): its exit signal is dropped from
    /// now on.
    pub(super) fn remove_link(&self, pid: Pid) -> bool {
        self.inner.lock().links.remove(&pid)
    }

    /// Whether the process is linked to `pid`.
    pub(super) fn has_link(&self, pid: Pid) -> bool {
        self.inner.lock().links.contains(&pid)
    }

    /// How many processes are linked to this one.
    pub(super) fn link_count(&self) -> usize {
        self.inner.lock().links.len()
    }

    /// The processes of node `node` linked to this one.
    pub(super) fn links_on(&self, node: u16) -> Vec<Pid> {
        self.inner.lock().links.iter().copied().filter(|pid| pid.node() == node).collect()
    }

    /// Sets whether exit signals arrive as events (see [`Inbox::signal`]).
    pub(super) fn set_trap_exits(&self, trap: bool) {
        self.inner.lock().trap_exits = trap;
    }

    /// Counts one more monitor of `pid`, whose exit [`Inbox::push_monitor_exit`] then
    /// takes.
    pub(super) fn add_monitor(&self, pid: Pid) {
        let mut inner = self.inner.lock();
        if !inner.closed {
            *inner.monitoring.entry(pid).or_insert(0) += 1;
        }
    }

    /// Pushes the exit of `pid` that one of the process's monitors reports; `Ok(false)`
    /// (and nothing pushed) if none is left, as after [`Inbox::demonitor`].
    pub(super) fn push_monitor_exit(&self, pid: Pid, reason: ExitReason) -> Result<bool, Refused> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        match inner.monitoring.get_mut(&pid) {
            Some(1) => {
                inner.monitoring.remove(&pid);
            }
            Some(count) => *count -= 1,
            None => return Ok(false),
        }
        inner.events.push(Event::Exit { pid, reason, linked: false });
        Ok(true)
    }

    /// Removes every monitor the process holds on `pid`, with the exits of theirs that
    /// wait undelivered: none reaches a step from now on.
    pub(super) fn demonitor(&self, pid: Pid) {
        let mut inner = self.inner.lock();
        if inner.monitoring.remove(&pid).is_some() {
            inner.events.retain(|event| !matches!(event, Event::Exit { pid: p, linked: false, .. } if *p == pid));
        }
    }

    /// An exit signal from `from` with `reason`, as [`Signal`] says it came, decided
    /// under the lock: a process that traps exits gets an [`Event::Exit`] (`linked`),
    /// except for `kill`; one that does not is ended by an abnormal reason (`kill`'s is
    /// [`ExitReason::Killed`]) and ignores a normal one. A [`Signal::Link`] signal also
    /// removes the link, and is dropped if there was none.
    pub(super) fn signal(&self, from: Pid, reason: &ExitReason, how: Signal) -> Signalled {
        let mut inner = self.inner.lock();
        if inner.closed || (how == Signal::Link && !inner.links.remove(&from)) {
            return Signalled::Dropped;
        }
        let ending = match how {
            Signal::Kill => ExitReason::Killed,
            _ if inner.trap_exits => {
                inner.events.push(Event::Exit { pid: from, reason: reason.clone(), linked: true });
                return Signalled::Event;
            }
            _ if reason.is_normal() => return Signalled::Dropped,
            _ => reason.clone(),
        };
        inner.terminate_reason.get_or_insert(Exited::by_signal(ending, from));
        Signalled::Terminate
    }

    /// Refuses every later push and hands back what is left.
    pub(super) fn close(&self) -> Closed<W> {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.messages = 0;
        inner.bytes = 0;
        inner.monitoring = FxHashMap::default();
        Closed {
            undelivered: mem::take(&mut inner.events),
            watchers: mem::take(&mut inner.watchers),
            terminate_reason: inner.terminate_reason.take(),
            links: mem::take(&mut inner.links),
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
    fn demonitor_drops_the_exits_of_its_monitors_waiting_or_to_come() {
        let inbox = Inbox::<()>::new();
        let (a, b) = (Pid::from_u64(1), Pid::from_u64(2));
        inbox.add_monitor(a);
        inbox.add_monitor(a);
        inbox.add_monitor(b);
        assert_eq!(inbox.push_monitor_exit(a, ExitReason::Killed), Ok(true));
        inbox.push(message(1), messages(8)).unwrap();
        inbox.demonitor(a);
        assert_eq!(inbox.push_monitor_exit(a, ExitReason::Killed), Ok(false), "the second monitor is gone too");
        assert_eq!(inbox.push_monitor_exit(b, ExitReason::Killed), Ok(true));
        assert_eq!(inbox.push_monitor_exit(b, ExitReason::Killed), Ok(false), "one exit a monitor");
        let mut buf = Vec::new();
        inbox.drain_into(&mut buf);
        assert_eq!(buf, [message(1), Event::Exit { pid: b, reason: ExitReason::Killed, linked: false }]);
    }

    #[test]
    fn exit_signals_trap_end_or_drop_as_erlang_has_them() {
        let (from, other) = (Pid::from_u64(7), Pid::from_u64(8));
        let normal = ExitReason::Normal(Payload::empty());
        let boom = ExitReason::Error("boom".into());

        let inbox = Inbox::<()>::new();
        assert_eq!(inbox.signal(from, &boom, Signal::Link), Signalled::Dropped, "no link, no signal");
        assert_eq!(inbox.signal(from, &normal, Signal::Exit), Signalled::Dropped);
        inbox.add_link(from, 8).unwrap();
        assert_eq!(inbox.signal(from, &normal, Signal::Link), Signalled::Dropped, "normal ends nothing");
        assert_eq!(inbox.link_count(), 0, "the link is gone with its signal");
        inbox.add_link(from, 8).unwrap();
        assert_eq!(inbox.signal(from, &boom, Signal::Link), Signalled::Terminate);
        assert_eq!(inbox.terminate_reason(), Some(Exited::by_signal(boom.clone(), from)));
        assert_eq!(inbox.signal(other, &ExitReason::Shutdown, Signal::Kill), Signalled::Terminate);
        assert_eq!(inbox.terminate_reason(), Some(Exited::by_signal(boom.clone(), from)), "the first reason wins");

        let trapping = Inbox::<()>::new();
        trapping.set_trap_exits(true);
        trapping.add_link(from, 8).unwrap();
        assert_eq!(trapping.signal(from, &normal, Signal::Link), Signalled::Event);
        assert_eq!(trapping.signal(other, &boom, Signal::Exit), Signalled::Event);
        assert_eq!(trapping.signal(other, &boom, Signal::Kill), Signalled::Terminate);
        assert_eq!(trapping.terminate_reason(), Some(Exited::by_signal(ExitReason::Killed, other)));
        let mut buf = Vec::new();
        trapping.drain_into(&mut buf);
        assert_eq!(
            buf,
            [
                Event::Exit { pid: from, reason: normal, linked: true },
                Event::Exit { pid: other, reason: boom.clone(), linked: true }
            ]
        );
        trapping.close();
        assert_eq!(trapping.signal(other, &boom, Signal::Kill), Signalled::Dropped, "an ended process takes none");
    }

    #[test]
    fn links_are_bounded_and_linking_twice_is_linking_once() {
        let inbox = Inbox::<()>::new();
        inbox.add_link(Pid::from_u64(1), 2).unwrap();
        inbox.add_link(Pid::from_u64(1), 2).unwrap();
        inbox.add_link(Pid::from_u64(2), 2).unwrap();
        assert_eq!(inbox.add_link(Pid::from_u64(2), 2), Ok(()), "already linked");
        assert_eq!(inbox.add_link(Pid::from_u64(3), 2), Err(LinkRefused::Full { limit: 2 }));
        inbox.remove_link(Pid::from_u64(1));
        assert_eq!(inbox.add_link(Pid::from_u64(3), 2), Ok(()));
        let closed = inbox.close();
        assert_eq!(closed.links.len(), 2);
        assert_eq!(inbox.add_link(Pid::from_u64(4), 2), Err(LinkRefused::Closed));
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
