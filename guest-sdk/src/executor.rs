//! The single-threaded executor that runs a process's entry future.
//!
//! A process is one task: the future its entry method returned. The host drives it one
//! step at a time, and between steps the guest is not running at all, so the executor
//! needs no reactor and no threads: everything that can wake the task arrives as an
//! event at the start of a step.
//!
//! # A step
//!
//! 1. Route each event, in arrival order: a completion fills the slot of its tag and wakes
//!    the future waiting on it (a tag nobody waits for any more is dropped); a message
//!    goes to the mailbox, an exit to the exit buffer (waking whoever waits for that
//!    pid), a cancel sets the cancelled flag and wakes every waiter, each of which then
//!    fails with [`Error::Cancelled`](crate::Error::Cancelled) unless what it waits for
//!    has already arrived.
//! 2. While the task is awake, poll it, at most [`POLL_BUDGET`] times. A poll that reaches
//!    a command the host must carry out queues a yield (tag from a counter) and leaves a
//!    waker in the tag's slot. Nothing outside the task can wake it during the step, so
//!    once a poll leaves it asleep no further poll could make progress.
//! 3. Report: `complete(result)` if the task finished (its yields are dropped: the host
//!    would discard them). Otherwise hand over the queued yields, oldest first, up to the
//!    host's per-step limit (`host.max-yields`); the surplus stays queued, less the
//!    commands whose futures were dropped meanwhile, and goes out in later steps. The
//!    status is `continue` if yields remain queued or the task woke itself more often
//!    than the budget allows, `blocked` if some yield is outstanding, else `idle` (the
//!    task waits only on messages, exits or cancellation).
//!
//! Steps with no event that concerns the task (a message nobody is receiving yet) do not
//! poll it at all.
//!
//! The surplus keeps a process with many commands (`join_all` over 100,000 spawns) within
//! the limit without the guest's code knowing of it: the commands go out in the order
//! they were made, a step's worth at a time, and each one's completion still finds its
//! future by tag.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use crate::payload::{ExitReason, LinkedExit, Message, Payload, Pid};

/// Polls one step may spend on a task that keeps waking itself before it reports
/// `continue` and lets other processes run. Picked out of thin air: no future in the SDK
/// wakes itself, so this only bounds foreign ones.
pub(crate) const POLL_BUDGET: usize = 16;

/// A command's result, or a process's: a payload or why there is none.
pub(crate) type Outcome = Result<Payload, String>;

/// The entry future, as the executor holds it.
pub(crate) type Task = Pin<Box<dyn Future<Output = Outcome>>>;

/// Something the host tells the process at the start of a step.
#[derive(Debug)]
pub(crate) enum Event {
    Completion {
        tag: u64,
        result: Outcome,
    },
    Message(Message),
    /// A monitored process ended, or (`linked`) an exit signal this process trapped.
    Exit {
        pid: Pid,
        reason: ExitReason,
        linked: bool,
    },
    Cancel(String),
}

/// What a process can ask the host to do. (A `send` is no command: the host's `send`
/// function delivers it during the step.)
#[derive(Debug, PartialEq)]
pub(crate) enum Command {
    /// Nanoseconds.
    Sleep(u64),
    Spawn {
        kind: Option<String>,
        method: String,
        input: Vec<Payload>,
        monitor: bool,
        link: bool,
    },
    Monitor(Pid),
    Terminate(Pid),
    Link(Pid),
    Unlink(Pid),
    Demonitor(Pid),
    Exit {
        to: Pid,
        reason: ExitReason,
        kill: bool,
    },
    TrapExits(bool),
    Custom {
        name: String,
        payload: Payload,
    },
}

/// A command and the tag its completion will carry.
#[derive(Debug, PartialEq)]
pub(crate) struct Yield {
    pub(crate) tag: u64,
    pub(crate) command: Command,
}

/// What the host does after a step.
#[derive(Debug, PartialEq)]
pub(crate) enum Status {
    Complete(Outcome),
    Idle,
    Blocked,
    Continue,
}

/// The answer to a step.
#[derive(Debug)]
pub(crate) struct StepOutput {
    pub(crate) status: Status,
    pub(crate) yields: Vec<Yield>,
}

/// What the executor knows of its process, from `init` on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Identity {
    pub(crate) pid: Pid,
    /// The most yields the host takes from one step.
    pub(crate) max_yields: usize,
}

/// The state the task's futures share with the executor (through [`crate::Ctx`]).
///
/// Every access borrows `state` only for the length of one method, never across an
/// await, so the task and the executor never hold it at once.
pub(crate) struct Shared {
    identity: Identity,
    /// The id of the workflow the process belongs to, when the service started it (see
    /// [`crate::Ctx::workflow_id`]); set once, at `init`.
    workflow: std::cell::OnceCell<String>,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    next_tag: u64,
    /// Yields not yet handed to the host, oldest first: this step's, and the surplus of
    /// earlier steps past the host's limit.
    yields: VecDeque<Yield>,
    /// Outstanding yields by tag, sent or still queued.
    slots: BTreeMap<u64, Slot>,
    mailbox: VecDeque<Message>,
    mailbox_waiters: Vec<Waker>,
    /// Exits nobody has waited for yet, by pid.
    exits: BTreeMap<Pid, ExitReason>,
    /// Who waits for which pid's exit: keyed, so that an exit wakes only its own waiters
    /// (a `join_all` over many waits would otherwise be woken, and scanned, in full for
    /// every exit).
    exit_waiters: BTreeMap<Pid, Vec<Waker>>,
    /// Exit signals the process trapped, oldest first, for `recv_exit`.
    signals: VecDeque<LinkedExit>,
    signal_waiters: Vec<Waker>,
    cancel: Option<String>,
    cancel_waiters: Vec<Waker>,
}

enum Slot {
    Waiting(Waker),
    Done(Outcome),
}

/// How a wait ended: with what it waited for, or with the process's cancellation
/// (its reason) while it still had to wait.
pub(crate) type Waited<T> = Result<T, String>;

impl Shared {
    /// The process's own pid.
    pub(crate) fn pid(&self) -> Pid {
        self.identity.pid
    }

    /// The id of the workflow the process belongs to, if any.
    pub(crate) fn workflow(&self) -> Option<&str> {
        self.workflow.get().map(String::as_str)
    }

    /// Sets the id of the workflow the process belongs to (once, at `init`).
    pub(crate) fn set_workflow(&self, id: String) {
        let _ = self.workflow.set(id);
    }

    /// Queues `command` as a yield; its completion will wake `waker`. `Err(reason)`, and
    /// nothing queued, once the process is cancelled: the command would only be waited
    /// for in vain.
    pub(crate) fn yield_command(&self, command: Command, waker: &Waker) -> Waited<u64> {
        let mut state = self.state.borrow_mut();
        if let Some(reason) = &state.cancel {
            return Err(reason.clone());
        }
        state.next_tag += 1;
        let tag = state.next_tag;
        state.yields.push_back(Yield { tag, command });
        state.slots.insert(tag, Slot::Waiting(waker.clone()));
        Ok(tag)
    }

    /// The outcome of the yield `tag` if it completed; otherwise `Err(reason)` (and the
    /// yield forgotten) once the process is cancelled, or `waker` is woken when it does.
    pub(crate) fn poll_completion(&self, tag: u64, waker: &Waker) -> Poll<Waited<Outcome>> {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        if let Some(Slot::Waiting(old)) = state.slots.get_mut(&tag) {
            if let Some(reason) = &state.cancel {
                state.slots.remove(&tag);
                return Poll::Ready(Err(reason.clone()));
            }
            old.clone_from(waker);
            return Poll::Pending;
        }
        match state.slots.remove(&tag) {
            Some(Slot::Done(outcome)) => Poll::Ready(Ok(outcome)),
            _ => panic!("inconsistent executor state: yield {tag} polled after its completion was taken"),
        }
    }

    /// Stops waiting for the yield `tag`: its completion, when it comes, is dropped, and
    /// if it is still queued it is not sent at all.
    pub(crate) fn forget(&self, tag: u64) {
        self.state.borrow_mut().slots.remove(&tag);
    }

    /// Takes the oldest message whose topic is `topic` (any topic for `None`), leaving the
    /// others queued. With none queued: `Err(reason)` once the process is cancelled,
    /// otherwise `waker` is woken when a message arrives.
    /// Any topic leaves out the service's requests, which only
    /// [`crate::Ctx::next_workflow_request`] takes.
    pub(crate) fn poll_message(&self, topic: Option<&str>, waker: &Waker) -> Poll<Waited<Message>> {
        match topic {
            Some(wanted) => self.poll_message_where(|t| t == wanted, waker),
            None => self.poll_message_where(|t| !t.starts_with(crate::service::TOPIC_PREFIX), waker),
        }
    }

    /// The oldest message whose topic `wanted` accepts; the others stay queued in order.
    pub(crate) fn poll_message_where(&self, wanted: impl Fn(&str) -> bool, waker: &Waker) -> Poll<Waited<Message>> {
        let mut state = self.state.borrow_mut();
        let position = state.mailbox.iter().position(|m| wanted(&m.topic));
        if let Some(message) = position.and_then(|i| state.mailbox.remove(i)) {
            return Poll::Ready(Ok(message));
        }
        if let Some(reason) = &state.cancel {
            return Poll::Ready(Err(reason.clone()));
        }
        register(&mut state.mailbox_waiters, waker);
        Poll::Pending
    }

    /// Why process `pid` ended, once its exit has arrived (buffered if it came early);
    /// `Err(reason)` if it has not by the time the process is cancelled.
    pub(crate) fn poll_exit(&self, pid: Pid, waker: &Waker) -> Poll<Waited<ExitReason>> {
        let mut state = self.state.borrow_mut();
        if let Some(outcome) = state.exits.remove(&pid) {
            return Poll::Ready(Ok(outcome));
        }
        if let Some(reason) = &state.cancel {
            return Poll::Ready(Err(reason.clone()));
        }
        register(state.exit_waiters.entry(pid).or_default(), waker);
        Poll::Pending
    }

    /// The oldest exit signal the process trapped; with none: `Err(reason)` once the
    /// process is cancelled, otherwise `waker` is woken when one arrives.
    pub(crate) fn poll_signal(&self, waker: &Waker) -> Poll<Waited<LinkedExit>> {
        let mut state = self.state.borrow_mut();
        if let Some(signal) = state.signals.pop_front() {
            return Poll::Ready(Ok(signal));
        }
        if let Some(reason) = &state.cancel {
            return Poll::Ready(Err(reason.clone()));
        }
        register(&mut state.signal_waiters, waker);
        Poll::Pending
    }

    /// Drops the exit of `pid` a monitor buffered and nobody has waited for.
    pub(crate) fn forget_exit(&self, pid: Pid) {
        self.state.borrow_mut().exits.remove(&pid);
    }

    /// The cancel reason once the host has asked the process to finish.
    pub(crate) fn poll_cancel(&self, waker: &Waker) -> Poll<String> {
        let mut state = self.state.borrow_mut();
        if let Some(reason) = &state.cancel {
            return Poll::Ready(reason.clone());
        }
        register(&mut state.cancel_waiters, waker);
        Poll::Pending
    }

    /// Whether the host has asked the process to finish.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.state.borrow().cancel.is_some()
    }
}

/// Adds `waker` unless an equivalent one is there already.
fn register(waiters: &mut Vec<Waker>, waker: &Waker) {
    if !waiters.iter().any(|w| w.will_wake(waker)) {
        waiters.push(waker.clone());
    }
}

fn wake_all(waiters: &mut Vec<Waker>) {
    waiters.drain(..).for_each(Waker::wake);
}

impl State {
    fn route(&mut self, event: Event) {
        match event {
            Event::Completion { tag, result } => {
                if let Some(slot) = self.slots.get_mut(&tag)
                    && let Slot::Waiting(waker) = std::mem::replace(slot, Slot::Done(result))
                {
                    waker.wake();
                }
            }
            Event::Message(message) => {
                self.mailbox.push_back(message);
                wake_all(&mut self.mailbox_waiters);
            }
            Event::Exit { pid, reason, linked: true } => {
                self.signals.push_back(LinkedExit { pid, reason });
                wake_all(&mut self.signal_waiters);
            }
            Event::Exit { pid, reason, linked: false } => {
                self.exits.insert(pid, reason);
                if let Some(mut waiters) = self.exit_waiters.remove(&pid) {
                    wake_all(&mut waiters);
                }
            }
            Event::Cancel(reason) => {
                if self.cancel.is_some() {
                    return;
                }
                self.cancel = Some(reason);
                // Every wait ends with the cancellation: wake them all to see it.
                wake_all(&mut self.cancel_waiters);
                wake_all(&mut self.mailbox_waiters);
                wake_all(&mut self.signal_waiters);
                for (_, mut waiters) in std::mem::take(&mut self.exit_waiters) {
                    wake_all(&mut waiters);
                }
                for slot in self.slots.values() {
                    if let Slot::Waiting(waker) = slot {
                        waker.wake_by_ref();
                    }
                }
            }
        }
    }

    /// Takes the queued yields to hand to the host, oldest first, at most `max`; the rest
    /// stay queued for later steps.
    fn take_yields(&mut self, max: usize) -> Vec<Yield> {
        if self.yields.len() <= max {
            // The common case: the queue's buffer itself, without a copy.
            return Vec::from(std::mem::take(&mut self.yields));
        }
        // Commands whose futures were dropped before they went out need not go at all.
        let slots = &self.slots;
        self.yields.retain(|y| slots.contains_key(&y.tag));
        let count = max.min(self.yields.len());
        self.yields.drain(..count).collect()
    }
}

/// Set when the task is woken.
struct Awake(AtomicBool);

impl Wake for Awake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Relaxed: the flag is set and read on the guest's one thread (wakers only need
        // to be `Send + Sync` because the `Waker` type demands it), so no other memory
        // is published through it.
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs one process's entry future, a step at a time. Single-threaded: it and every
/// [`crate::Ctx`] of its task stay on one thread.
pub(crate) struct Executor {
    shared: Rc<Shared>,
    task: Option<Task>,
    awake: Arc<Awake>,
    waker: Waker,
}

impl Executor {
    /// An executor for the process `identity` describes, with no task yet.
    pub(crate) fn new(identity: Identity) -> Self {
        let awake = Arc::new(Awake(AtomicBool::new(false)));
        let waker = Waker::from(awake.clone());
        let shared = Shared { identity, workflow: std::cell::OnceCell::new(), state: RefCell::default() };
        Executor { shared: Rc::new(shared), task: None, awake, waker }
    }

    /// The state the task's [`crate::Ctx`] works on.
    pub(crate) fn shared(&self) -> Rc<Shared> {
        self.shared.clone()
    }

    /// Makes `task` the process's task; the next step polls it.
    pub(crate) fn start(&mut self, task: Task) {
        self.task = Some(task);
        self.awake.0.store(true, Ordering::Relaxed);
    }

    /// Routes `events`, runs the task as far as it can go, and reports.
    pub(crate) fn step(&mut self, events: impl IntoIterator<Item = Event>) -> StepOutput {
        {
            let mut state = self.shared.state.borrow_mut();
            events.into_iter().for_each(|event| state.route(event));
        }
        let Some(task) = self.task.as_mut() else {
            let status = Status::Complete(Err("the process has no running entry".to_owned()));
            return StepOutput { status, yields: Vec::new() };
        };
        let mut cx = Context::from_waker(&self.waker);
        for _ in 0..POLL_BUDGET {
            if !self.awake.0.swap(false, Ordering::Relaxed) {
                break;
            }
            if let Poll::Ready(outcome) = task.as_mut().poll(&mut cx) {
                // Dropped before the state is borrowed: its futures' destructors use it.
                self.task = None;
                self.shared.state.borrow_mut().yields.clear();
                return StepOutput { status: Status::Complete(outcome), yields: Vec::new() };
            }
        }
        let mut state = self.shared.state.borrow_mut();
        // At least one: a limit of 0 makes any yield end the process, with the host's
        // error naming the limit, rather than leave it queued for ever.
        let yields = state.take_yields(self.shared.identity.max_yields.max(1));
        let status = if self.awake.0.load(Ordering::Relaxed) || !state.yields.is_empty() {
            Status::Continue
        } else if state.slots.values().any(|slot| matches!(slot, Slot::Waiting(_))) {
            Status::Blocked
        } else {
            Status::Idle
        };
        StepOutput { status, yields }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;
    use crate::{Ctx, Either, join, join_all, select, select_any};

    const PID: Pid = Pid::from_u64(42);

    /// An executor running the task `body` builds from a fresh [`Ctx`].
    fn run<F>(body: impl FnOnce(Ctx) -> F) -> Executor
    where
        F: Future<Output = anyhow::Result<serde_json::Value>> + 'static,
    {
        run_limited(1024, body)
    }

    /// [`run`] with a host that takes at most `max_yields` yields a step.
    fn run_limited<F>(max_yields: usize, body: impl FnOnce(Ctx) -> F) -> Executor
    where
        F: Future<Output = anyhow::Result<serde_json::Value>> + 'static,
    {
        let mut executor = Executor::new(Identity { pid: PID, max_yields });
        let future = body(Ctx::new(executor.shared()));
        executor.start(Box::pin(async move {
            match future.await {
                Ok(value) => Ok(Payload::json(&value).map_err(|e| e.to_string())?),
                Err(error) => Err(format!("{error:#}")),
            }
        }));
        executor
    }

    fn done(tag: u64) -> Event {
        Event::Completion { tag, result: Ok(Payload::bytes([])) }
    }

    fn message(topic: &str, body: u32) -> Event {
        let body = Payload::json(&body).unwrap();
        Event::Message(Message { sender: Pid::from_u64(7), topic: topic.to_owned(), body })
    }

    fn json(value: serde_json::Value) -> Status {
        Status::Complete(Ok(Payload::json(&value).unwrap()))
    }

    fn tags(output: &StepOutput) -> Vec<u64> {
        output.yields.iter().map(|y| y.tag).collect()
    }

    #[test]
    fn sleeps_completing_out_of_order_resume_in_completion_order() {
        let order = Rc::new(RefCell::new(Vec::new()));
        let log = order.clone();
        let mut executor = run(move |ctx| async move {
            let nap = |ms, id| {
                let (ctx, log) = (ctx.clone(), log.clone());
                async move {
                    ctx.sleep(Duration::from_millis(ms)).await.expect("the sleep ends");
                    log.borrow_mut().push(id);
                }
            };
            join(nap(100, 1), nap(10, 2)).await;
            Ok(serde_json::json!(log.borrow().clone()))
        });

        let first = executor.step([]);
        assert_eq!(first.status, Status::Blocked);
        assert_eq!(
            first.yields,
            [
                Yield { tag: 1, command: Command::Sleep(100_000_000) },
                Yield { tag: 2, command: Command::Sleep(10_000_000) },
            ]
        );

        let second = executor.step([done(2)]);
        assert_eq!((second.status, second.yields.len()), (Status::Blocked, 0));
        assert_eq!(*order.borrow(), [2]);

        assert_eq!(executor.step([done(1)]).status, json(serde_json::json!([2, 1])));
    }

    #[test]
    fn completions_in_one_step_resume_in_arrival_order() {
        let mut executor = run(|ctx| async move {
            let order = RefCell::new(Vec::new());
            let nap = |ms: u64| {
                let (ctx, order) = (&ctx, &order);
                async move {
                    ctx.sleep(Duration::from_millis(ms)).await.expect("the sleep ends");
                    order.borrow_mut().push(ms);
                    Ok::<_, anyhow::Error>(ms)
                }
            };
            let joined = join_all([nap(30), nap(10), nap(20)]).await?;
            Ok(serde_json::json!({ "joined": joined, "order": order.into_inner() }))
        });
        assert_eq!(tags(&executor.step([])), [1, 2, 3]);
        assert_eq!(executor.step([done(2)]).status, Status::Blocked);
        // Both in one step: the 20 ms sleep (tag 3) finished first, so it resumes first.
        assert_eq!(
            executor.step([done(3), done(1)]).status,
            json(serde_json::json!({
                "joined": [30, 10, 20],
                "order": [10, 20, 30],
            }))
        );
    }

    #[test]
    fn select_picks_the_event_that_arrived_first_in_a_step() {
        let mut executor = run(|ctx| async move {
            let first = select(ctx.sleep(Duration::from_millis(100)), ctx.sleep(Duration::from_millis(10))).await;
            Ok(serde_json::json!(if first == Either::Left(Ok(())) { "left" } else { "right" }))
        });
        assert_eq!(tags(&executor.step([])), [1, 2]);
        assert_eq!(executor.step([done(2), done(1)]).status, json(serde_json::json!("right")));
    }

    #[test]
    fn recv_topic_leaves_other_messages_queued() {
        let mut executor = run(|ctx| async move {
            let b = ctx.recv_topic("b").await?;
            let next = ctx.recv().await?;
            let last = ctx.recv().await?;
            Ok(serde_json::json!([
                [b.topic, b.decode::<u32>()?],
                [next.topic, next.decode::<u32>()?],
                [last.topic, last.decode::<u32>()?],
            ]))
        });
        let waiting = executor.step([message("a", 1)]);
        assert_eq!((waiting.status, waiting.yields.len()), (Status::Idle, 0));
        assert_eq!(
            executor.step([message("c", 3), message("b", 2)]).status,
            json(serde_json::json!([["b", 2], ["a", 1], ["c", 3]]))
        );
    }

    #[test]
    fn wait_collects_an_exit_that_arrived_before_anyone_waited() {
        let mut executor = run(|ctx| async move {
            let child = ctx.spawn("square", 7).await?;
            ctx.sleep(Duration::from_millis(1)).await.expect("the sleep ends");
            let result: u64 = ctx.wait(child).await?;
            Ok(serde_json::json!([child, result]))
        });
        let spawn = executor.step([]);
        assert_eq!(
            spawn.yields,
            [Yield {
                tag: 1,
                command: Command::Spawn {
                    kind: None,
                    method: "square".to_owned(),
                    input: vec![Payload::json(&7).unwrap()],
                    monitor: true,
                    link: false,
                },
            }]
        );
        let child = Pid::from_u64(9);
        let pid = Payload::bytes(child.as_u64().to_le_bytes());
        let exit = Event::Exit { pid: child, reason: ExitReason::Normal(Payload::json(&49).unwrap()), linked: false };
        // The child finishes before the parent's sleep does.
        let sleeping = executor.step([Event::Completion { tag: 1, result: Ok(pid) }, exit]);
        assert_eq!(tags(&sleeping), [2]);
        assert_eq!(executor.step([done(2)]).status, json(serde_json::json!([9, 49])));
    }

    #[test]
    fn a_linked_child_is_linked_at_spawn_and_its_trapped_exit_reaches_recv_exit() {
        let mut executor = run(|ctx| async move {
            ctx.trap_exits(true).await?;
            let child = ctx.spawn_link("square", 7).await?;
            // Taken from `select` beside a receive, and kept apart from the monitor's exit.
            let exit = match select(ctx.recv(), ctx.recv_exit()).await {
                Either::Left(message) => anyhow::bail!("a message first: {message:?}"),
                Either::Right(exit) => exit?,
            };
            let result: u64 = ctx.wait(child).await?;
            Ok(serde_json::json!([exit.pid, exit.reason.name(), result]))
        });
        assert_eq!(executor.step([]).yields, [Yield { tag: 1, command: Command::TrapExits(true) }]);
        let spawn = executor.step([done(1)]);
        assert!(
            matches!(&spawn.yields[..], [Yield { tag: 2, command: Command::Spawn { link: true, monitor: true, .. } }]),
            "{:?}",
            spawn.yields
        );
        let child = Pid::from_u64(9);
        let pid = Payload::bytes(child.as_u64().to_le_bytes());
        let reason = ExitReason::Normal(Payload::json(&49).unwrap());
        let linked = Event::Exit { pid: child, reason: reason.clone(), linked: true };
        let monitored = Event::Exit { pid: child, reason, linked: false };
        let output = executor.step([Event::Completion { tag: 2, result: Ok(pid) }, linked, monitored]);
        assert_eq!(output.status, json(serde_json::json!([9, "normal", 49])));
    }

    #[test]
    fn link_commands_go_out_as_written() {
        let mut executor = run(|ctx| async move {
            let (a, b) = (Pid::from_u64(3), Pid::from_u64(4));
            join_all([ctx.link(a), ctx.unlink(a), ctx.demonitor(b), ctx.exit(b, ExitReason::Shutdown), ctx.kill(a)])
                .await?;
            Ok(serde_json::json!(null))
        });
        let (a, b) = (Pid::from_u64(3), Pid::from_u64(4));
        let commands: Vec<Command> = executor.step([]).yields.into_iter().map(|y| y.command).collect();
        assert_eq!(
            commands,
            [
                Command::Link(a),
                Command::Unlink(a),
                Command::Demonitor(b),
                Command::Exit { to: b, reason: ExitReason::Shutdown, kill: false },
                Command::Exit { to: a, reason: ExitReason::Killed, kill: true },
            ]
        );
    }

    #[test]
    fn a_failed_child_and_a_failed_command_are_errors_with_context() {
        let mut executor = run(|ctx| async move {
            let error = ctx.call::<u32>("inventory.reserve", "apples").await.unwrap_err();
            let failed = ctx.wait::<u32>(Pid::from_u64(5)).await.unwrap_err();
            Ok(serde_json::json!([format!("{error:#}"), format!("{failed:#}")]))
        });
        assert_eq!(
            executor.step([]).yields,
            [Yield {
                tag: 1,
                command: Command::Custom {
                    name: "inventory.reserve".to_owned(),
                    payload: Payload::json("apples").unwrap()
                },
            }]
        );
        let denied = Event::Completion { tag: 1, result: Err("permission denied: inventory.reserve".to_owned()) };
        assert_eq!(executor.step([denied]).status, Status::Idle);
        let exit = Event::Exit { pid: Pid::from_u64(5), reason: ExitReason::Terminated, linked: false };
        assert_eq!(
            executor.step([exit]).status,
            json(serde_json::json!([
                "custom command `inventory.reserve` failed: permission denied: inventory.reserve",
                "process 5 was terminated",
            ]))
        );
    }

    #[test]
    fn cancellation_is_visible_and_ends_receives() {
        let seen = Rc::new(Cell::new(false));
        let flag = seen.clone();
        let mut executor = run(move |ctx| async move {
            let reason = match select(ctx.sleep(Duration::from_secs(60)), ctx.cancelled()).await {
                Either::Left(_) => anyhow::bail!("slept through the cancel"),
                Either::Right(reason) => reason,
            };
            flag.set(ctx.is_cancelled());
            let error = ctx.recv().await.unwrap_err();
            Ok(serde_json::json!([reason, error.to_string()]))
        });
        assert_eq!(executor.step([]).status, Status::Blocked);
        let output = executor.step([Event::Cancel("shutdown".to_owned())]);
        assert_eq!(output.status, json(serde_json::json!(["shutdown", "cancelled: shutdown"])));
        assert!(seen.get());
    }

    #[test]
    fn queued_messages_are_received_before_the_cancellation() {
        let mut executor = run(|ctx| async move {
            let first = ctx.recv().await?.decode::<u32>()?;
            let second = ctx.recv().await;
            Ok(serde_json::json!([first, second.is_err()]))
        });
        assert_eq!(executor.step([]).status, Status::Idle);
        let output = executor.step([Event::Cancel("stop".to_owned()), message("a", 1)]);
        assert_eq!(output.status, json(serde_json::json!([1, true])));
    }

    #[test]
    fn completions_of_dropped_futures_and_unknown_tags_are_ignored() {
        let polls = Rc::new(Cell::new(0));
        let counter = polls.clone();
        let mut executor = run(move |ctx| {
            let ctx2 = ctx.clone();
            let counted = std::future::poll_fn(move |_| {
                counter.set(counter.get() + 1);
                Poll::Ready(())
            });
            async move {
                // The message wins; the 1 s sleep (tag 1) is dropped while outstanding.
                let first = select(ctx.recv(), ctx.sleep(Duration::from_secs(1))).await;
                assert!(matches!(first, Either::Left(Ok(_))));
                ctx2.sleep(Duration::from_millis(1)).await.expect("the sleep ends");
                counted.await;
                Ok(serde_json::json!("done"))
            }
        });
        executor.step([]);
        let after_message = executor.step([message("a", 1)]);
        assert_eq!((tags(&after_message), after_message.status), (vec![2], Status::Blocked));
        // The dropped sleep's completion and a tag never issued wake nothing.
        let stale = executor.step([done(1), done(99)]);
        assert_eq!((stale.status, stale.yields.len(), polls.get()), (Status::Blocked, 0, 0));
        assert_eq!(executor.step([done(2)]).status, json(serde_json::json!("done")));
        assert_eq!(polls.get(), 1);
    }

    #[test]
    fn a_message_nobody_receives_does_not_poll_the_task() {
        let polls = Rc::new(Cell::new(0));
        let counter = polls.clone();
        let mut executor = run(move |ctx| async move {
            std::future::poll_fn(|_| {
                counter.set(counter.get() + 1);
                Poll::Ready(())
            })
            .await;
            ctx.sleep(Duration::from_millis(1)).await.expect("the sleep ends");
            let message = ctx.recv().await?;
            Ok(serde_json::json!(message.decode::<u32>()?))
        });
        assert_eq!(executor.step([]).status, Status::Blocked);
        assert_eq!(polls.get(), 1);
        let early = executor.step([message("early", 5)]);
        assert_eq!((early.status, early.yields.len(), polls.get()), (Status::Blocked, 0, 1));
        assert_eq!(executor.step([done(1)]).status, json(serde_json::json!(5)));
    }

    #[test]
    fn a_task_that_keeps_waking_itself_continues_after_the_budget() {
        let mut executor = run(|_ctx| async move {
            let mut polls = 0;
            std::future::poll_fn(|cx| {
                polls += 1;
                if polls < POLL_BUDGET + 5 {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
            .await;
            Ok(serde_json::json!(polls))
        });
        assert_eq!(executor.step([]).status, Status::Continue);
        assert_eq!(executor.step([]).status, json(serde_json::json!(POLL_BUDGET + 5)));
    }

    #[test]
    fn yields_of_the_completing_step_are_dropped() {
        let mut executor = run(|ctx| async move {
            let unsent = ctx.sleep(Duration::from_secs(1));
            // Polled once, so it yields, then abandoned as the task returns.
            let _ = select(unsent, std::future::ready(())).await;
            Ok(serde_json::json!(null))
        });
        let output = executor.step([]);
        assert_eq!((output.status, output.yields.len()), (json(serde_json::json!(null)), 0));
    }

    #[test]
    fn serialisation_errors_surface_when_awaited() {
        let mut executor = run(|ctx| async move {
            let mut bad = std::collections::HashMap::new();
            bad.insert((1, 2), 3);
            let error = ctx.call::<()>("x", &bad).await.unwrap_err();
            Ok(serde_json::json!(format!("{error:#}")))
        });
        let output = executor.step([]);
        let Status::Complete(Ok(payload)) = output.status else { panic!("{output:?}") };
        let message: String = payload.decode().unwrap();
        assert!(message.starts_with("custom command `x` failed: failed to serialise a JSON payload"), "{message}");
        assert!(output.yields.is_empty());
    }

    #[test]
    fn a_step_without_a_task_reports_an_error() {
        let mut executor = Executor::new(Identity { pid: PID, max_yields: 1024 });
        let output = executor.step([]);
        assert_eq!(output.status, Status::Complete(Err("the process has no running entry".to_owned())));
    }

    #[test]
    fn yields_past_the_hosts_limit_go_out_in_later_steps_in_order() {
        let mut executor = run_limited(2, |ctx| async move {
            let naps = join_all((1..=5).map(|ms| ctx.sleep(Duration::from_millis(ms)))).await?;
            Ok(serde_json::json!(naps.len()))
        });
        let nanos = |output: &StepOutput| -> Vec<u64> {
            output.yields.iter().map(|y| if let Command::Sleep(n) = y.command { n / 1_000_000 } else { 0 }).collect()
        };
        let first = executor.step([]);
        assert_eq!((nanos(&first), tags(&first), first.status), (vec![1, 2], vec![1, 2], Status::Continue));
        // A completion of a command already sent arrives while the rest are still queued.
        let second = executor.step([done(1)]);
        assert_eq!((tags(&second), second.status), (vec![3, 4], Status::Continue));
        let third = executor.step([]);
        assert_eq!((tags(&third), third.status), (vec![5], Status::Blocked));
        assert_eq!(executor.step([done(2), done(3), done(4), done(5)]).status, json(serde_json::json!(5)));
    }

    #[test]
    fn queued_commands_of_dropped_futures_are_never_sent() {
        let mut executor = run_limited(1, |ctx| async move {
            // The first sleep to finish wins; the others are dropped, two of them unsent.
            let (first, _) = select_any((1..=4).map(|ms| ctx.sleep(Duration::from_millis(ms)))).await;
            ctx.sleep(Duration::from_millis(9)).await?;
            Ok(serde_json::json!(first))
        });
        assert_eq!(tags(&executor.step([])), [1]);
        assert_eq!(tags(&executor.step([])), [2]);
        let after = executor.step([done(2)]);
        // Sleeps 3 and 4 were never sent; the new sleep (tag 5) goes out alone.
        assert_eq!((tags(&after), after.status), (vec![5], Status::Blocked));
        assert_eq!(executor.step([done(5)]).status, json(serde_json::json!(1)));
    }

    #[test]
    fn a_cancel_fails_every_wait_with_the_reason_but_not_what_arrived() {
        let mut executor = run(|ctx| async move {
            let sleep = ctx.sleep(Duration::from_secs(10));
            let call = ctx.call::<u32>("db.query", 1);
            let done_call = ctx.call::<u32>("db.count", 2);
            let wait = ctx.wait::<u32>(Pid::from_u64(5));
            let ((sleep, call), (done_call, wait)) = join(join(sleep, call), join(done_call, wait)).await;
            // Started after the cancel: fails at once, and is never sent.
            let later = ctx.sleep(Duration::from_secs(1)).await;
            let recv = ctx.recv().await;
            Ok(serde_json::json!([
                sleep.unwrap_err().to_string(),
                matches!(call, Err(crate::Error::Cancelled(ref reason)) if reason == "stop"),
                done_call?,
                wait.unwrap_err().to_string(),
                later.unwrap_err().to_string(),
                recv.unwrap_err().to_string(),
            ]))
        });
        assert_eq!(tags(&executor.step([])), [1, 2, 3]);
        let answered = Event::Completion { tag: 3, result: Ok(Payload::json(&7).unwrap()) };
        let output = executor.step([answered, Event::Cancel("stop".to_owned())]);
        assert_eq!(output.yields.len(), 0);
        assert_eq!(
            output.status,
            json(serde_json::json!([
                "cancelled: stop",
                true,
                7,
                "cancelled: stop",
                "cancelled: stop",
                "cancelled: stop"
            ]))
        );
    }

    #[test]
    fn a_timeout_ends_a_slow_future_and_lets_a_fast_one_through() {
        let mut executor = run(|ctx| async move {
            let fast = ctx.timeout(Duration::from_secs(1), std::future::ready(3)).await?;
            let slow = ctx.timeout(Duration::from_millis(5), ctx.recv()).await;
            Ok(serde_json::json!([
                fast,
                matches!(slow, Err(crate::Error::Timeout(d)) if d == Duration::from_millis(5))
            ]))
        });
        // The fast future never started its timer: the only yield is the slow one's.
        let first = executor.step([]);
        assert_eq!((first.yields.len(), first.status), (1, Status::Blocked));
        assert_eq!(first.yields[0].command, Command::Sleep(5_000_000));
        assert_eq!(executor.step([done(1)]).status, json(serde_json::json!([3, true])));
    }

    #[test]
    fn select_any_resolves_to_the_first_finished_by_index() {
        let mut executor = run(|ctx| async move {
            let (index, slept) = select_any([30, 10, 20].map(|ms| ctx.sleep(Duration::from_millis(ms)))).await;
            slept?;
            Ok(serde_json::json!(index))
        });
        assert_eq!(tags(&executor.step([])), [1, 2, 3]);
        assert_eq!(executor.step([done(3), done(2)]).status, json(serde_json::json!(2)));
    }
}
