//! One process as the scheduler holds it: state word, inbox and the process itself.
//!
//! [`ProcessCell::run_turn`] is the worker's half of the wakeup protocol described in
//! `state.rs`; [`ProcessCell::deliver`] is the producers' half. Both live here so the
//! loom models at the bottom exercise exactly the code the scheduler runs. The cell is
//! also what a process's [`Port`] reaches ([`PortTarget`]): the port itself is the
//! crate's `process.rs`, which names nothing of the scheduler's.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use wasmproc_types::{ExitReason, Payload, Pid};

use super::caps::Capabilities;
use super::inbox::{Inbox, MailboxBound, MessageId, Refused};
use super::process_handle::ExitSlot;
use super::registry::Member;
use super::remote::Notify;
use super::shared::Shared;
use super::state::{Lifecycle, State, Waiting, Wake};
use crate::error::{MailboxLimit, PortError, SendError};
use crate::handler::{Completer, Release};
use crate::limits::{Limits, Lineage};
use crate::process::{Port, PortTarget, Process};
use crate::step::{Event, Outcome, message_size};

/// Someone to tell when a process ends.
pub(super) enum Watcher {
    /// A monitoring process: gets an [`Event::Exit`].
    Process(Arc<ProcessCell>),
    /// A `terminate` yield: completes once the target has ended and left the registry.
    Yield(Completer),
    /// The embedder's [`ProcessHandle`](super::ProcessHandle).
    Handle(Arc<ExitSlot>),
    /// A watcher on another node, through the cluster: called once with the result.
    Notify(Notify),
    /// Something that holds resources on the process's behalf (a provider's queue): called
    /// once it has ended, to let them go. Not someone told of its result.
    Release(Release),
}

/// Where a process belongs, what it was made from and what it may do: fixed at spawn.
pub(super) struct Spec {
    /// The scheduler the process belongs to, so completers can queue it. Held here, once
    /// per process, rather than in every completer: a reference count touched by every
    /// yield on every worker would bounce between cores. `None` only in the loom models.
    pub(super) scheduler: Option<Arc<Shared>>,
    /// The process that spawned it: [`Pid::HOST`] for the embedder.
    pub(super) parent: Pid,
    /// The registered kind it was made from, so it can spawn more of itself.
    pub(super) kind: Option<Arc<str>>,
    pub(super) caps: Arc<Capabilities>,
    pub(super) mailbox_capacity: usize,
    /// The bytes of undelivered messages its mailbox holds (see [`MailboxBound`]).
    pub(super) mailbox_bytes: usize,
}

pub(super) struct ProcessCell {
    pid: Pid,
    pub(super) state: State,
    pub(super) inbox: Inbox<Watcher>,
    /// The process itself; `None` once it has been closed. Guarded by the state word,
    /// not by a lock: see [`ProcessCell::with_process`].
    process: UnsafeCell<Option<Box<dyn Process>>>,
    /// The process's last step was preempted and waits to be resumed
    /// ([`Decision::Preempted`]). Guarded as `process` is: only its owner reads or writes it.
    step_suspended: UnsafeCell<bool>,
    pub(super) spec: Spec,
    /// Its parent and the live counts of its process tree.
    pub(super) lineage: Lineage,
    /// The sequence number of its next journal record (durable schedulers only).
    pub(super) journal_seq: AtomicU64,
    /// It is on its scheduler's list of processes to suspend (`suspension.rs`).
    pub(super) listed_for_suspension: AtomicBool,
    /// Its process has been dropped and comes back from its journal before its next
    /// step (`suspension.rs`). Written only by its owner; read by anyone, for counts.
    pub(super) suspended: AtomicBool,
    /// What a durable scheduler's journal keeps of the process between its turns (its
    /// step under way, and the seed and time it reads: see `durable.rs`), held here
    /// without being looked into: only the journal's hook (`Durable`) reads or writes
    /// it. Only the process's owner and its port during a step touch it, so the lock
    /// is uncontended.
    pub(super) journaled: parking_lot::Mutex<Option<Box<dyn Any + Send>>>,
}

/// What the step closure of [`ProcessCell::run_turn`] decided.
#[derive(Debug)]
pub(super) enum Decision {
    /// Wait as `Blocked` or `Idle`.
    Wait(Lifecycle),
    /// Run again after others had their turn.
    Continue,
    /// As `Continue`, for a step stopped part-way to be resumed
    /// ([`StepOutput::set_preempted`](super::StepOutput::set_preempted)): until it has
    /// finished, the turns that resume it give it no events (see [`ProcessCell::run_turn`]).
    Preempted,
    /// Run again now: events for the next step are waiting outside the inbox (the
    /// worker kept completions made during dispatch).
    Rerun,
    /// Finished.
    Complete(ExitReason),
}

/// How a turn ended.
#[derive(Debug)]
pub(super) enum TurnEnd {
    /// Waiting for events; a producer will schedule the process.
    Parked,
    /// Back to `Ready`: the caller must queue it (asked to continue, or used up its turn).
    Requeue,
    /// Finished by itself; the caller finalises it.
    Complete(ExitReason),
    /// Termination was requested; the caller finalises it.
    Terminated,
}

// SAFETY: every field but `process` and `step_suspended` is `Sync`. `process` is only
// reached through `with_process`/`take_process`, and `step_suspended` only in
// `run_turn`, whose callers own the process by the state word's protocol, so neither is
// ever accessed from two threads at once; and the process is `Send`, so moving between
// the threads that successively own it is fine.
unsafe impl Sync for ProcessCell {}

impl ProcessCell {
    pub(super) fn new(pid: Pid, process: Box<dyn Process>, spec: Spec, lineage: Lineage) -> Self {
        ProcessCell {
            pid,
            state: State::new(),
            inbox: Inbox::new(),
            process: UnsafeCell::new(Some(process)),
            step_suspended: UnsafeCell::new(false),
            spec,
            lineage,
            journal_seq: AtomicU64::new(0),
            listed_for_suspension: AtomicBool::new(false),
            suspended: AtomicBool::new(false),
            journaled: parking_lot::Mutex::new(None),
        }
    }

    pub(super) fn pid(&self) -> Pid {
        self.pid
    }

    /// The scheduler this process belongs to.
    pub(super) fn scheduler(&self) -> &Arc<Shared> {
        self.spec.scheduler.as_ref().expect("only loom models make cells without a scheduler")
    }

    /// The producers' half of the protocol: push, then wake. `Ok(Wake::Schedule)` makes
    /// the caller responsible for queueing the process.
    pub(super) fn deliver(&self, event: Event) -> Result<Wake, Refused> {
        self.deliver_identified(event, None)
    }

    /// Delivers the exit of `pid`, with `reason`, that a monitor of this process reports:
    /// `Ok(None)`, and nothing delivered, if the process has demonitored `pid` since.
    pub(super) fn deliver_monitor_exit(&self, pid: Pid, reason: ExitReason) -> Result<Option<Wake>, Refused> {
        Ok(self.inbox.push_monitor_exit(pid, reason)?.then(|| self.state.wake()))
    }

    /// As [`ProcessCell::deliver`], for a message with an identity.
    pub(super) fn deliver_identified(&self, event: Event, id: Option<MessageId>) -> Result<Wake, Refused> {
        let bound = MailboxBound { messages: self.spec.mailbox_capacity, bytes: self.spec.mailbox_bytes };
        self.inbox.push_identified(event, bound, id)?;
        Ok(self.state.wake())
    }

    /// Whether a message of `topic` and `body` would fit the mailbox now (see
    /// [`Handle::check_room`](super::Handle::check_room)).
    pub(super) fn check_room(&self, topic: &str, body: &Payload) -> Result<(), SendError> {
        let bound = MailboxBound { messages: self.spec.mailbox_capacity, bytes: self.spec.mailbox_bytes };
        let pid = self.pid;
        self.inbox.check_room(message_size(topic, body), bound).map_err(|refused| match refused {
            Refused::Closed => SendError::Closed(pid),
            Refused::Full { capacity } => SendError::MailboxFull { pid, limit: MailboxLimit::Messages(capacity) },
            Refused::FullBytes { limit } => SendError::MailboxFull { pid, limit: MailboxLimit::Bytes(limit) },
        })
    }

    /// Runs `f` on the process. `None` if it has been closed.
    ///
    /// # Safety
    ///
    /// The caller must own the process, which the state word makes exclusive: the
    /// spawner while it is `Init` (it is in no queue and no worker can take it), or the
    /// worker that moved it to `Running` (and keeps it until it parks, requeues or
    /// completes it).
    pub(super) unsafe fn with_process<R>(&self, f: impl FnOnce(&mut dyn Process) -> R) -> Option<R> {
        // SAFETY: the caller owns the process (this function's contract), so no other
        // reference to the slot exists while `f` runs.
        let slot = unsafe { &mut *self.process.get() };
        slot.as_deref_mut().map(f)
    }

    /// Lets the process give back memory it does not need while it waits
    /// ([`Process::hibernate`]), if it waits: claims it (`Blocked`/`Idle → Running`),
    /// calls it, and hands it back to the same waiting state. An event that arrives
    /// meanwhile finds it `Running` and sets `WAKEUP`, and the hand-back then makes it
    /// `Ready` instead, for the caller to queue (as a step that ends with events pending
    /// reruns): nothing delivered during the call is left in a parked process's inbox.
    pub(super) fn hibernate(&self) -> Hibernation {
        let Some(waiting) = self.state.try_claim_waiting() else {
            return Hibernation::NotWaiting;
        };
        // SAFETY: claimed above: this thread owns the process until the hand-back below.
        let released = unsafe { self.with_process(|process| catch_unwind(AssertUnwindSafe(|| process.hibernate()))) };
        let released = matches!(released, Some(Ok(true)));
        match self.state.transition_to_waiting(waiting) {
            Waiting::Parked => Hibernation::Waiting { released },
            Waiting::Rerun => {
                self.state.transition_to_ready_from_running();
                Hibernation::Woken { released }
            }
        }
    }

    /// Suspends the process if it waits and, once claimed (so it cannot step meanwhile),
    /// `may` agrees: claims it as [`ProcessCell::hibernate`] does, closes and drops the
    /// process, marks the cell suspended, and hands it back to the same waiting state.
    /// `released` in the answer says whether it was suspended. An event that arrives
    /// meanwhile makes it `Ready` for the caller to queue, and its turn brings it back.
    pub(super) fn suspend(&self, may: impl FnOnce() -> bool) -> Hibernation {
        let Some(waiting) = self.state.try_claim_waiting() else {
            return Hibernation::NotWaiting;
        };
        let released = !self.suspended.load(Ordering::Relaxed) && may();
        if released {
            // SAFETY: claimed above: this thread owns the process until the hand-back below.
            if let Some(mut process) = unsafe { self.take_process() }
                && let Err(panic) = catch_unwind(AssertUnwindSafe(|| process.close()))
            {
                tracing::error!(
                    panic = super::worker::panic_message(&*panic),
                    "a suspended process's `close` panicked"
                );
            }
            // What the journal keeps between steps is made again by the replay that
            // brings it back (`recovery::bring_back`), and its inbox waits empty.
            *self.journaled.lock() = None;
            self.inbox.shrink_to_fit();
            self.suspended.store(true, Ordering::Release);
        }
        match self.state.transition_to_waiting(waiting) {
            Waiting::Parked => Hibernation::Waiting { released },
            Waiting::Rerun => {
                self.state.transition_to_ready_from_running();
                Hibernation::Woken { released }
            }
        }
    }

    /// Puts a process made again into a suspended cell.
    ///
    /// # Safety
    ///
    /// As for [`ProcessCell::with_process`]: the caller owns the process (`Running`).
    pub(super) unsafe fn put_process(&self, process: Box<dyn Process>) {
        // SAFETY: as in `with_process`.
        unsafe { *self.process.get() = Some(process) };
    }

    /// Takes the process out for closing; `None` the second time.
    ///
    /// # Safety
    ///
    /// As for [`ProcessCell::with_process`]: called by the owner that is retiring it,
    /// after its inbox is closed.
    pub(super) unsafe fn take_process(&self) -> Option<Box<dyn Process>> {
        // SAFETY: as in `with_process`.
        unsafe { (*self.process.get()).take() }
    }

    /// The worker's half of the protocol, for a process it just dequeued.
    ///
    /// Runs up to `budget` steps back to back while events keep arriving during the
    /// steps (each rerun is what the `WAKEUP` flag asks for). `step` receives the drained
    /// events in `events`, must leave it empty, and says what the process wants next.
    ///
    /// A step that was preempted ([`Decision::Preempted`]) is resumed by the process's
    /// next turn with no events: the inbox is not drained into a process whose step is
    /// suspended, so what arrives meanwhile stays there, counted against the mailbox's
    /// bounds, until the step that will see it begins (see `state.rs`, "Suspended steps").
    pub(super) fn run_turn(
        &self,
        budget: u32,
        events: &mut Vec<Event>,
        mut step: impl FnMut(&mut Vec<Event>) -> Decision,
    ) -> TurnEnd {
        let mut terminate = self.state.transition_to_running().is_terminate_requested();
        // SAFETY: this worker owns the process from `transition_to_running` on, until
        // the turn ends; `step` does not touch the flag.
        let mut suspended = unsafe { *self.step_suspended.get() };
        // Whether the inbox may hold events no step has been given: at first, those
        // that arrived while the process was queued or waiting.
        let mut undrained = true;
        for _ in 0..budget.max(1) {
            if terminate {
                return TurnEnd::Terminated;
            }
            if undrained && !suspended {
                self.inbox.drain_into(events);
                undrained = false;
            }
            let decision = step(events);
            let preempted = matches!(decision, Decision::Preempted);
            if preempted != suspended {
                suspended = preempted;
                // SAFETY: as above.
                unsafe { *self.step_suspended.get() = preempted };
            }
            terminate = self.state.load().is_terminate_requested();
            match decision {
                Decision::Complete(reason) if reason.is_normal() => return TurnEnd::Complete(reason),
                // A terminate request that came during the step wins over any other end
                // of it: the step may have been cut short by the request (a Wasm step
                // fails at its next epoch tick), and its error is not the process's.
                _ if terminate => return TurnEnd::Terminated,
                Decision::Complete(reason) => return TurnEnd::Complete(reason),
                // A suspended step still has work: it is queued again, whatever came.
                Decision::Continue | Decision::Preempted => {
                    self.state.transition_to_ready_from_running();
                    return TurnEnd::Requeue;
                }
                // The inbox needs draining if a producer flagged a push, or if this turn
                // resumed a suspended step and has not drained it yet.
                Decision::Rerun => undrained = self.state.take_wakeup() || undrained,
                // A resumed step has finished without seeing what arrived before this
                // turn (those pushes set no flag): it goes to the next step, never left
                // in the inbox of a parked process. What arrives after this look sets
                // `WAKEUP`, as the process is `Running`, and fails the park below.
                Decision::Wait(_) if undrained && !self.inbox.is_empty() => {}
                Decision::Wait(target) => match self.state.transition_to_waiting(target) {
                    Waiting::Parked => return TurnEnd::Parked,
                    Waiting::Rerun => undrained = true,
                },
            }
        }
        // Out of budget with events pending: let others run first. The pending events
        // stay in the inbox for the next turn.
        self.state.transition_to_ready_from_running();
        TurnEnd::Requeue
    }
}

impl Member for ProcessCell {
    fn pid(&self) -> Pid {
        self.pid
    }
}

/// The port of `cell`'s process, handed to it at `init`.
pub(super) fn port(cell: &Arc<ProcessCell>) -> Port {
    let target: Weak<dyn PortTarget> = Arc::downgrade(cell) as Weak<ProcessCell>;
    Port::new(cell.pid(), target)
}

impl PortTarget for ProcessCell {
    fn send(&self, to: Pid, topic: String, body: Payload) -> Result<(), PortError> {
        if self.state.load().lifecycle() != Lifecycle::Running {
            return Err(PortError::NotInStep);
        }
        self.scheduler().send_as(self, to, topic, body, None)
    }

    fn respond(&self, id: u64, result: Outcome) -> Result<(), PortError> {
        let scheduler = self.scheduler();
        scheduler.requests.respond(self.pid(), scheduler.limits_of(self).max_payload_size, id, result)
    }

    fn parent(&self) -> Pid {
        self.spec.parent
    }

    fn limits(&self) -> &Limits {
        self.scheduler().limits_of(self)
    }

    fn is_terminate_requested(&self) -> bool {
        self.state.load().is_terminate_requested()
    }

    fn has_waiting_work(&self) -> bool {
        self.scheduler().has_waiting_work()
    }

    fn step_time_micros(&self) -> Option<u64> {
        self.scheduler().durable.as_ref()?.step_time(self)
    }

    fn random_seed(&self) -> Option<[u8; 32]> {
        self.scheduler().durable.as_ref()?.random_seed(self)
    }
}

/// What [`ProcessCell::hibernate`] did. `released`: the process gave memory back.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Hibernation {
    /// It was not waiting (queued, running or ended), and was left alone.
    NotWaiting,
    /// It waits again, as before.
    Waiting { released: bool },
    /// An event arrived meanwhile: it is `Ready`, and the caller must queue it.
    Woken { released: bool },
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Models of the wakeup protocol. Run them as `.ci/test` does: `--cfg loom` in
    //! `RUSTFLAGS`, `--lib --release --no-default-features`, filter `loom`.
    //!
    //! Each model runs one worker turn against concurrent producers and checks that every
    //! event is consumed exactly once and that the process ends where it should: never
    //! parked with an event in its inbox, never queued twice.

    use std::sync::Arc;

    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    use super::*;
    use crate::step::{Events, StepOutput};
    use wasmproc_types::Payload;

    struct Inert;

    impl Process for Inert {
        fn init(&mut self, _: crate::process::Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, _: Events<'_>, _: &mut StepOutput) -> anyhow::Result<()> {
            Ok(())
        }
    }

    fn ready_cell() -> Arc<ProcessCell> {
        ready_cell_with_mailbox(8)
    }

    /// A `Ready` cell whose mailbox holds at most `capacity` messages.
    fn ready_cell_with_mailbox(capacity: usize) -> Arc<ProcessCell> {
        let spec = Spec {
            scheduler: None,
            parent: Pid::HOST,
            kind: None,
            caps: Arc::default(),
            mailbox_capacity: capacity,
            mailbox_bytes: usize::MAX,
        };
        let cell = Arc::new(ProcessCell::new(Pid::from_u64(1), Box::new(Inert), spec, Lineage::default()));
        cell.state.transition_to_ready_from_init();
        cell
    }

    fn completion(tag: u64) -> Event {
        Event::Completion { tag, result: Ok(Payload::empty()) }
    }

    fn message() -> Event {
        Event::Message { sender: Pid::HOST, topic: String::new(), body: Payload::empty() }
    }

    /// A producer thread delivering `event`; a `Wake::Schedule` it gets counts as one
    /// queue entry in `schedules`, and the process must never be queued twice at once.
    fn spawn_producer(cell: &Arc<ProcessCell>, schedules: &Arc<AtomicUsize>, event: Event) -> thread::JoinHandle<()> {
        let (cell, schedules) = (cell.clone(), schedules.clone());
        thread::spawn(move || {
            if cell.deliver(event) == Ok(Wake::Schedule) {
                let queued = schedules.fetch_add(1, Ordering::SeqCst);
                assert_eq!(queued, 0, "process queued twice");
            }
        })
    }

    /// Runs turns the way the scheduler would: `turns_owed` now, and one more for every
    /// producer that reports `Wake::Schedule` meanwhile (each report is one queue entry).
    /// A process is in at most one queue at a time, so at most one turn is ever owed: two
    /// would be two workers running it at once.
    fn run_owed_turns(cell: &ProcessCell, target: Lifecycle, schedules: &AtomicUsize, mut turns_owed: usize) -> usize {
        let mut seen = 0;
        let mut buf = Vec::new();
        while turns_owed > 0 {
            assert_eq!(turns_owed, 1, "process queued twice");
            turns_owed -= 1;
            let end = cell.run_turn(4, &mut buf, |events| {
                seen += events.drain(..).count();
                Decision::Wait(target)
            });
            match end {
                TurnEnd::Parked => {}
                TurnEnd::Requeue => turns_owed += 1,
                other => panic!("unexpected turn end {other:?}"),
            }
            turns_owed += schedules.swap(0, Ordering::SeqCst);
        }
        seen
    }

    /// One turn of a process whose step is suspended and stays so: it must be given no
    /// events, and it is queued again (`TurnEnd::Requeue`) whatever its inbox holds.
    fn preempted_turn(cell: &ProcessCell, buf: &mut Vec<Event>) {
        let end = cell.run_turn(4, buf, |events| {
            assert!(events.is_empty(), "a suspended step is given no events");
            Decision::Preempted
        });
        assert!(matches!(end, TurnEnd::Requeue), "a suspended step still has work: {end:?}");
    }

    /// DESIGN 5 and 6: a completion racing the `Running → Blocked` transition (including
    /// a handler completing it before the step even returns) is never lost.
    #[test]
    fn loom_completion_races_transition_to_blocked() {
        loom::model(|| {
            let cell = ready_cell();
            let schedules = Arc::new(AtomicUsize::new(0));
            let producer = spawn_producer(&cell, &schedules, completion(1));
            let mut seen = run_owed_turns(&cell, Lifecycle::Blocked, &schedules, 1);
            producer.join().unwrap();
            // A schedule that landed after the worker's last look is still owed its turn.
            seen += run_owed_turns(&cell, Lifecycle::Blocked, &schedules, schedules.swap(0, Ordering::SeqCst));
            assert_eq!(seen, 1, "the completion must be consumed exactly once");
            assert_eq!(cell.inbox.len(), 0);
            assert_eq!(cell.state.load().lifecycle(), Lifecycle::Blocked);
        });
    }

    /// DESIGN 6 and 7: a message and a completion racing `Running → Idle` from two
    /// threads; both are consumed and the process is queued at most once at a time.
    #[test]
    fn loom_send_and_completion_race_transition_to_idle() {
        loom::model(|| {
            let cell = ready_cell();
            let schedules = Arc::new(AtomicUsize::new(0));
            let producers: Vec<_> =
                [message(), completion(2)].into_iter().map(|event| spawn_producer(&cell, &schedules, event)).collect();
            let mut seen = run_owed_turns(&cell, Lifecycle::Idle, &schedules, 1);
            for p in producers {
                p.join().unwrap();
            }
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, schedules.swap(0, Ordering::SeqCst));
            assert_eq!(seen, 2);
            assert_eq!(cell.inbox.len(), 0);
            assert_eq!(cell.state.load().lifecycle(), Lifecycle::Idle);
        });
    }

    /// A message racing a worker that claims the waiting process to hibernate it: the
    /// message is consumed exactly once, the process is queued at most once at a time,
    /// and it ends parked with an empty inbox (never parked with the message in it).
    #[test]
    fn loom_send_races_hibernate() {
        loom::model(|| {
            let cell = ready_cell();
            let schedules = Arc::new(AtomicUsize::new(0));
            let mut seen = run_owed_turns(&cell, Lifecycle::Idle, &schedules, 1);
            let producer = spawn_producer(&cell, &schedules, message());
            let owed = match cell.hibernate() {
                Hibernation::Woken { .. } => 1,
                Hibernation::Waiting { .. } | Hibernation::NotWaiting => 0,
            };
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, owed);
            producer.join().unwrap();
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, schedules.swap(0, Ordering::SeqCst));
            assert_eq!(seen, 1, "the message must be consumed exactly once");
            assert_eq!(cell.inbox.len(), 0);
            assert_eq!(cell.state.load().lifecycle(), Lifecycle::Idle);
        });
    }

    /// DESIGN 5: a producer racing a step that reruns without trying to park (the
    /// worker kept a completion made during dispatch, so it skips the inbox unless
    /// `WAKEUP` says a producer pushed): the producer's event is still consumed.
    #[test]
    fn loom_completion_races_rerun_after_dispatch() {
        loom::model(|| {
            let cell = ready_cell();
            let schedules = Arc::new(AtomicUsize::new(0));
            let producer = spawn_producer(&cell, &schedules, completion(3));
            let mut seen = 0;
            let mut reruns = 0;
            let mut buf = Vec::new();
            let end = cell.run_turn(4, &mut buf, |events| {
                seen += events.drain(..).count();
                reruns += 1;
                if reruns == 1 { Decision::Rerun } else { Decision::Wait(Lifecycle::Blocked) }
            });
            assert!(matches!(end, TurnEnd::Parked), "{end:?}");
            producer.join().unwrap();
            seen += run_owed_turns(&cell, Lifecycle::Blocked, &schedules, schedules.swap(0, Ordering::SeqCst));
            assert_eq!(seen, 1);
            assert_eq!(cell.inbox.len(), 0);
        });
    }

    /// A message racing a step that is preempted and resumed on the next turn: the
    /// resumed step is given no events (the message waits in the inbox), and once it has
    /// finished the message is consumed exactly once, by a later step, and never left in
    /// the inbox of a parked process (`state.rs`, "Suspended steps").
    #[test]
    fn loom_send_races_suspended_step() {
        loom::model(|| {
            let cell = ready_cell();
            let schedules = Arc::new(AtomicUsize::new(0));
            let producer = spawn_producer(&cell, &schedules, message());
            let mut seen = 0;
            let mut buf = Vec::new();
            let first = cell.run_turn(4, &mut buf, |events| {
                seen += events.drain(..).count();
                Decision::Preempted
            });
            assert!(matches!(first, TurnEnd::Requeue), "a suspended step still has work: {first:?}");
            let mut resumed = false;
            let end = cell.run_turn(4, &mut buf, |events| {
                if !resumed {
                    resumed = true;
                    assert!(events.is_empty(), "a resumed step is given no events");
                }
                seen += events.drain(..).count();
                Decision::Wait(Lifecycle::Idle)
            });
            let owed = match end {
                TurnEnd::Parked => 0,
                TurnEnd::Requeue => 1,
                other => panic!("unexpected turn end {other:?}"),
            };
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, owed);
            producer.join().unwrap();
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, schedules.swap(0, Ordering::SeqCst));
            assert_eq!(seen, 1, "the message must be consumed exactly once");
            assert_eq!(cell.inbox.len(), 0);
            assert_eq!(cell.state.load().lifecycle(), Lifecycle::Idle);
        });
    }

    /// Two messages from one sender racing a step that is preempted, resumed and
    /// preempted again, then finishes and waits, with a mailbox of one message: the turns
    /// that resume the step take nothing out of the inbox (so the second message finds
    /// the mailbox full if the first came while the step was suspended); every message
    /// taken is consumed exactly once, by a step that began after it arrived; the process
    /// is never queued twice, and ends parked with its inbox empty (`state.rs`,
    /// "Suspended steps").
    #[test]
    fn loom_sends_race_preempted_turns_at_the_mailbox_bound() {
        loom::model(|| {
            let cell = ready_cell_with_mailbox(1);
            let schedules = Arc::new(AtomicUsize::new(0));
            let taken = Arc::new(AtomicUsize::new(0));
            let producer = {
                let (cell, schedules, taken) = (cell.clone(), schedules.clone(), taken.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        match cell.deliver(message()) {
                            Ok(wake) => {
                                taken.fetch_add(1, Ordering::SeqCst);
                                if wake == Wake::Schedule {
                                    assert_eq!(schedules.fetch_add(1, Ordering::SeqCst), 0, "process queued twice");
                                }
                            }
                            Err(refused) => assert_eq!(refused, Refused::Full { capacity: 1 }),
                        }
                    }
                })
            };
            let mut seen = 0;
            let mut buf = Vec::new();
            // The step begins (taking what has come so far) and is preempted.
            let first = cell.run_turn(4, &mut buf, |events| {
                seen += events.drain(..).count();
                Decision::Preempted
            });
            assert!(matches!(first, TurnEnd::Requeue), "a suspended step still has work: {first:?}");
            assert_eq!(schedules.load(Ordering::SeqCst), 0, "a suspended process is queued by its worker alone");
            preempted_turn(&cell, &mut buf);
            assert_eq!(schedules.load(Ordering::SeqCst), 0, "a suspended process is queued by its worker alone");
            // The step is resumed and finishes; what came meanwhile goes to the next one.
            let mut resumed = false;
            let end = cell.run_turn(4, &mut buf, |events| {
                if !resumed {
                    resumed = true;
                    assert!(events.is_empty(), "a resumed step is given no events");
                }
                seen += events.drain(..).count();
                Decision::Wait(Lifecycle::Idle)
            });
            let owed = match end {
                TurnEnd::Parked => schedules.swap(0, Ordering::SeqCst),
                TurnEnd::Requeue => 1,
                other => panic!("unexpected turn end {other:?}"),
            };
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, owed);
            producer.join().unwrap();
            seen += run_owed_turns(&cell, Lifecycle::Idle, &schedules, schedules.swap(0, Ordering::SeqCst));
            assert_eq!(seen, taken.load(Ordering::SeqCst), "every message taken is consumed exactly once");
            assert!(seen >= 1, "an empty mailbox takes a message");
            assert_eq!(cell.inbox.len(), 0);
            assert_eq!(cell.state.load().lifecycle(), Lifecycle::Idle);
        });
    }

    /// DESIGN 10: a terminate request racing a step is seen: the turn ends `Terminated`
    /// either now or on the turn the requester scheduled.
    #[test]
    fn loom_terminate_races_step() {
        loom::model(|| {
            let cell = ready_cell();
            let requester = {
                let cell = cell.clone();
                thread::spawn(move || cell.state.request_terminate())
            };
            let mut buf = Vec::new();
            let first = cell.run_turn(4, &mut buf, |_| Decision::Wait(Lifecycle::Blocked));
            let wake = requester.join().unwrap();
            let terminated = match first {
                TurnEnd::Terminated => {
                    assert_eq!(wake, Wake::Nothing);
                    true
                }
                TurnEnd::Parked => {
                    assert_eq!(wake, Wake::Schedule, "parked without being rescheduled");
                    let again = cell.run_turn(4, &mut buf, |_| Decision::Wait(Lifecycle::Blocked));
                    matches!(again, TurnEnd::Terminated)
                }
                other => panic!("unexpected turn end {other:?}"),
            };
            assert!(terminated);
        });
    }
}
