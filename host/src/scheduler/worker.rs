//! The worker loop: find a process, run its turn, repeat; search and park when there is
//! nothing to run.
//!
//! Work is looked for in this order (docs/design.md, "Finding work"):
//! 1. the worker's LIFO slot: the process it woke or spawned last, whose data is still in
//!    cache (see "The LIFO slot" below);
//! 2. the worker's own deque, LIFO, for the same reason;
//! 3. the global injector, FIFO: take one and move up to [`GLOBAL_BATCH`] more into the
//!    local deque, so the next few pops need no shared queue;
//! 4. the other workers' deques: starting at a random victim and walking all of them,
//!    steal half of a victim's oldest entries;
//! 5. before parking, a slot that has held the same process for [`SLOT_PATIENCE`] (below).
//!
//! Every [`GLOBAL_CHECK_INTERVAL`]th tick the global queue, or (every other time first)
//! the bottom of the worker's own deque, is looked at ahead of the slot and the deque's
//! top: so a worker with an endless supply of local work (a ping-pong pair waking each
//! other) still lets queued processes in, and runs what lies beneath that work.
//!
//! # The LIFO slot
//!
//! A process woken or spawned by a worker goes into that worker's slot, and the slot's
//! previous occupant, if any, onto its deque. The slot is what keeps a request-reply pair
//! on one core: the deque's top is stealable at any time, so a worker spinning for work
//! took the process just woken by the other worker's step, and from then on every message
//! of the pair crossed between the cores (every inbox, state word and cell moving with
//! it). Another worker takes a slot only when it is about to park and the slot has held
//! the same process, with no put in between, for [`SLOT_PATIENCE`]: the owner is then in
//! a long step, and the process would otherwise wait for it to end. A worker parks with
//! an alarm for that moment while it watches a full slot. A long Wasm step also yields
//! at its next epoch tick when a slot is full ([`Shared::has_waiting_work`]). The slot
//! itself is `slot.rs`; its loom model checks that the owner and a thief never both take
//! one process, and that none is lost.
//!
//! # Completions during dispatch
//!
//! A handler that completes a yield synchronously does so while the worker still owns
//! the yielding process (`Running`). Such a completion skips the inbox: it is kept in
//! the worker's `early` buffer and the worker steps the process again at once, with no
//! inbox lock, no wake and no failed attempt to park it (the wakeup protocol exists for
//! producers that race the worker; this one *is* the worker). The next step sees the
//! inbox's events first, then these. If the process leaves the worker instead (it asked
//! to continue, or used up its turn) the kept events go into its inbox before it is
//! queued, while no one else can own it.
//!
//! # Preempted steps
//!
//! A step that stops part-way at its time slice ([`StepOutput::set_preempted`]) makes
//! its process `Ready` again and queues it at the back of the global queue, like one
//! that asked to continue. Its next turns resume the step without draining the inbox:
//! events wait there, within the mailbox's bounds, until the step that will see them
//! begins; a sender past the bounds is refused, as for any process that does not read.
//! Once the resumed step finishes, the turn looks into the inbox before it parks the
//! process (`state.rs`, "Suspended steps", argues why nothing is left there).
//!
//! # Hibernation
//!
//! A process that can give memory back while it waits ([`Process::wants_hibernation`])
//! is not made to at once: an answer may be on its way, and it would fault the memory
//! straight back in. Instead:
//! 1. after the step, still `Running`, it is listed in `Shared::hibernating` (at most
//!    once until it hibernates; the list is pruned of ended processes as it grows, see
//!    `Shared::list_for_hibernation`), then parked as usual;
//! 2. a worker about to park, with no work queued anywhere, takes the listed processes
//!    that are due (seen waiting for `Builder::hibernate_after`; see
//!    `hibernation.rs` for why) and, the longest waiting first, claims each that still
//!    waits with no flag set (`Blocked`/`Idle → Running`, one CAS), calls
//!    [`Process::hibernate`], and hands it back to the same waiting state; it then parks
//!    until work comes or the next listed process is due;
//! 3. a producer that pushes an event in between sees `Running` and sets `WAKEUP`, as
//!    during a step, so the hand-back fails to park it and makes it `Ready` instead: the
//!    worker stops there and runs it. A process that is not waiting when looked at
//!    (queued, running elsewhere) is listed afresh.
//!
//! So an event is never left in the inbox of a parked process (the same argument as for
//! a step, `state.rs`: the claim is the worker's step transition, the hand-back its park;
//! a process whose step is suspended is never waiting, so it is never claimed), and the
//! cost falls only on a worker that had nothing else to do, stopping as soon as work is
//! queued. The loom model `loom_send_races_hibernate` checks the race.
//!
//! [`Process::wants_hibernation`]: super::Process::wants_hibernation
//! [`StepOutput::set_preempted`]: super::StepOutput::set_preempted
//! [`Process::hibernate`]: super::Process::hibernate

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_deque::{Steal, Worker};

use wasmproc_types::{ExitReason, Payload, TrapKind};

use super::caps::Capabilities;
use super::cell::{Decision, Hibernation, ProcessCell, TurnEnd};
use super::commands::{Resolution, Resolved};
use super::durable::Origin;
use super::idle::{PARK_AFTER_ROUNDS, Unparked, YIELD_AFTER_ROUNDS};
use super::inbox::MailboxBound;
use super::recovery;
use super::shared::Shared;
use super::state::Lifecycle;
use super::suspension::{Listed, Seen};
use crate::step::{Event, Events, Status, StepOutput};

/// How many more processes to move from the global queue into the local deque when
/// taking one: the value of
/// the Go scheduler wasmproc's design comes from (docs/design.md, "Finding work").
const GLOBAL_BATCH: usize = 16;
/// Ticks between looks at the global queue, or the bottom of the local deque, ahead of
/// the deque's top. 61 is Go's value: prime, so it does not fall into step with periodic
/// work.
const GLOBAL_CHECK_INTERVAL: u32 = 61;
/// How long another worker's slot must hold the same process, with no put in between,
/// before a worker about to park takes it: far longer than a step (microseconds), so a
/// request-reply pair stays on its core, and short enough that a process woken by a
/// native step that runs for long waits about this much (a Wasm step yields at its next
/// epoch tick instead, as a full slot counts as waiting work).
const SLOT_PATIENCE: Duration = Duration::from_millis(1);
/// How long a worker with nothing to run stays on its core while a durable commit is in
/// flight (a synced commit takes 0.1–0.3 ms here), before it parks as usual.
const COMMIT_PATIENCE: Duration = Duration::from_millis(1);

/// On a host whose cores other busy threads share, the most submissions in flight for
/// which a worker out of work stays on its core for their commit (see
/// `WorkerLoop::awaiting_commit`).
const SPIN_WHILE_AT_MOST: usize = 8;

/// One task from `steal`, retrying while it asks to; `None` when there is none.
fn steal_one(steal: impl Fn() -> Steal<Arc<ProcessCell>>) -> Option<Arc<ProcessCell>> {
    loop {
        match steal() {
            Steal::Success(task) => return Some(task),
            Steal::Empty => return None,
            Steal::Retry => std::hint::spin_loop(),
        }
    }
}

/// What [`WorkerLoop::hibernate_waiting`] left the worker with.
enum Hibernated {
    /// A process an event woke while it was being hibernated: `Ready`, in no queue.
    Woken(Arc<ProcessCell>),
    /// Nothing to run; when the next listed process is due, if any is listed.
    Due(Option<Instant>),
}

thread_local! {
    /// The worker running on this thread, if any: a pointer to the [`Local`] in the
    /// worker's own stack frame (see [`run`]). A plain pointer in a destructor-free cell
    /// keeps every access a single load, where a `RefCell<Option<…>>` would pay for lazy
    /// initialisation and a borrow flag on each of the several accesses per step.
    static CURRENT: Cell<*const Local> = const { Cell::new(std::ptr::null()) };
}

/// The identity and queue of the worker running on this thread.
struct Local {
    scheduler: usize,
    index: usize,
    queue: Worker<Arc<ProcessCell>>,
    dispatch: Dispatching,
    resolved: RefCell<Resolved>,
}

/// The process whose yields this worker is dispatching, and the completions it got
/// meanwhile. See the module docs, "Completions during dispatch".
#[derive(Default)]
struct Dispatching {
    /// Address of the process's cell; 0 when not dispatching. Compared, never followed.
    cell: Cell<usize>,
    early: RefCell<Vec<Event>>,
    /// Address of the cell of the process in a step on this worker; 0 between steps.
    stepping: Cell<usize>,
}

/// Runs `f` on this thread's worker if it is one of `scheduler`'s.
fn with_local<R>(scheduler: usize, f: impl FnOnce(&Local) -> R) -> Option<R> {
    let local = CURRENT.get();
    // SAFETY: a non-null `CURRENT` points at the `Local` owned by the `run` frame on this
    // very thread, which resets it to null (through `Installed`'s drop, even when
    // unwinding) before that frame ends. So the pointer is valid here, and only shared
    // references to the `Local` exist.
    let local = unsafe { local.as_ref() }?;
    (local.scheduler == scheduler).then(|| f(local))
}

/// Whether `cell`'s process is in a step on this thread: a port used during that step.
pub(super) fn is_stepping(cell: &ProcessCell) -> bool {
    let address = std::ptr::from_ref(cell) as usize;
    with_local(cell.scheduler().id, |local| local.dispatch.stepping.get() == address).unwrap_or(false)
}

/// Keeps `event` for the next step of `cell` if this thread is dispatching `cell`'s
/// yields right now; otherwise hands it back for the inbox.
pub(super) fn deliver_during_dispatch(cell: &Arc<ProcessCell>, event: Event) -> Result<(), Event> {
    let scheduler = cell.scheduler().id;
    let mut event = Some(event);
    with_local(scheduler, |local| {
        if local.dispatch.cell.get() == Arc::as_ptr(cell) as usize {
            local.dispatch.early.borrow_mut().extend(event.take());
        }
    });
    event.map_or(Ok(()), Err)
}

/// The custom command `name` yielded by a process granted `caps`, resolved through this
/// worker's cache; `None` off `shared`'s workers, or while the cache is in use further up
/// this thread's stack.
#[expect(clippy::ptr_arg, reason = "the `Cow` is kept: a borrowed name stays borrowed")]
pub(super) fn resolve(shared: &Shared, caps: &Arc<Capabilities>, name: &Cow<'static, str>) -> Option<Resolution> {
    with_local(shared.id, |local| {
        Some(local.resolved.try_borrow_mut().ok()?.get(caps, name, || shared.resolve(caps, name)))
    })
    .flatten()
}

/// What [`push_local`] did.
pub(super) enum Pushed {
    /// Into an empty LIFO slot: this worker runs the task next, no one else need wake.
    Alone,
    /// The slot's previous occupant went onto the deque: there is something to steal.
    Behind,
}

/// Puts `task` into this thread's LIFO slot if this thread is one of `shared`'s workers,
/// the slot's occupant onto the local deque; otherwise hands `task` back.
pub(super) fn push_local(shared: &Shared, task: Arc<ProcessCell>) -> Result<Pushed, Arc<ProcessCell>> {
    let mut task = Some(task);
    let pushed = with_local(shared.id, |local| match shared.slots[local.index].put(task.take().expect("taken once")) {
        None => Pushed::Alone,
        Some(previous) => {
            local.queue.push(previous);
            Pushed::Behind
        }
    });
    pushed.ok_or_else(|| task.take().expect("not pushed"))
}

/// This thread's worker index if it is one of `scheduler`'s workers.
pub(super) fn current_index(scheduler: usize) -> Option<usize> {
    with_local(scheduler, |local| local.index)
}

/// Resets `CURRENT` when the worker's frame ends, however it ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        CURRENT.set(std::ptr::null());
    }
}

/// The body of worker thread `index`.
pub(super) fn run(shared: Arc<Shared>, index: usize, queue: Worker<Arc<ProcessCell>>) {
    let local = Local {
        scheduler: shared.id,
        index,
        queue,
        dispatch: Dispatching::default(),
        resolved: RefCell::new(Resolved::new()),
    };
    CURRENT.set(&local);
    let _installed = Installed;
    let mut worker = WorkerLoop {
        shared: &shared,
        index,
        local: &local,
        rng: Rng::new(index as u64),
        tick: 0,
        events: Vec::new(),
        out: StepOutput::new(),
        watching: None,
    };
    worker.run();
}

struct WorkerLoop<'a> {
    shared: &'a Arc<Shared>,
    index: usize,
    /// This worker's queue and dispatch state, also reached through [`CURRENT`].
    local: &'a Local,
    rng: Rng,
    tick: u32,
    /// Reused for every step: the drained events.
    events: Vec<Event>,
    /// Reused for every step: the status and yields.
    out: StepOutput,
    /// Other workers' full slots as this worker last saw them before parking (index, puts),
    /// and when (see [`WorkerLoop::steal_stuck_slot`]).
    watching: Option<(Instant, Vec<(usize, u64)>)>,
}

impl WorkerLoop<'_> {
    fn run(&mut self) {
        loop {
            if let Some(task) = self.next_local() {
                self.run_task(task);
                continue;
            }
            // Out of local work: search, then park.
            self.shared.idle.transition_to_searching();
            match self.search() {
                Some(task) => {
                    self.shared.idle.transition_from_searching();
                    self.run_task(task);
                }
                None => {
                    self.shared.idle.leave();
                    return;
                }
            }
        }
    }

    /// Rounds of looking at the global queue and the victims; `None` at shutdown.
    fn search(&mut self) -> Option<Arc<ProcessCell>> {
        let mut rounds = 0;
        let mut awaiting_commit: Option<Instant> = None;
        loop {
            if let Some(task) = self.steal_global().or_else(|| self.steal_from_victims()) {
                return Some(task);
            }
            if self.shared.is_shut_down() {
                return None;
            }
            rounds += 1;
            if rounds < YIELD_AFTER_ROUNDS {
                for _ in 0..(1 << rounds) {
                    std::hint::spin_loop();
                }
            } else if rounds < PARK_AFTER_ROUNDS {
                thread::yield_now();
            } else if self.awaiting_commit(&mut awaiting_commit) {
                // More rounds of yielding the core, instead of parking.
                rounds = YIELD_AFTER_ROUNDS;
            } else {
                rounds = 0;
                let now = Instant::now();
                if let Some(task) = self.steal_stuck_slot(now) {
                    return Some(task);
                }
                let alarm = match self.hibernate_waiting() {
                    Hibernated::Woken(task) => return Some(task),
                    Hibernated::Due(next) => next,
                };
                let alarm = match self.suspend_waiting() {
                    Hibernated::Woken(task) => return Some(task),
                    Hibernated::Due(next) => alarm.into_iter().chain(next).min(),
                };
                // Back in time to look at the watched slots again.
                let watch = self.watching.as_ref().map(|(since, _)| *since + SLOT_PATIENCE);
                let alarm = alarm.into_iter().chain(watch).min();
                // Processes listed for suspension by a thread that is no worker (a
                // recovery) count as work: they need a worker's look (`suspension.rs`).
                let has_work = || self.shared.has_queued_work() || self.shared.has_unseen_suspensions();
                if self.shared.idle.park(has_work, alarm) == Unparked::Shutdown {
                    // Shutdown only starts once no process is left, so there is no work.
                    return None;
                }
            }
        }
    }

    /// Lets the listed waiting processes that are due (`hibernation.rs`) give memory
    /// back, before this worker parks, the longest waiting first. Stops as soon as work
    /// is queued anywhere, and at the first process that an event woke meanwhile, which
    /// it returns to be run (it is `Ready` and in no queue). A process not waiting now
    /// (queued, or running on another worker) is listed afresh; ended ones are dropped.
    /// Each entry costs a registry lookup and, for a waiting process, two
    /// compare-and-swaps and a system call, paid only by a worker that has nothing else
    /// to do.
    fn hibernate_waiting(&mut self) -> Hibernated {
        let shared = self.shared;
        let now = Instant::now();
        let due = shared.hibernating.lock().take_due(now);
        let counters = &shared.counters[self.index];
        let mut waiting_again = Vec::new();
        let mut looked = 0;
        let mut woken = None;
        while looked < due.len() && woken.is_none() && !shared.has_queued_work() {
            let (pid, _) = due[looked];
            looked += 1;
            let Some(cell) = shared.registry.get(pid) else {
                continue;
            };
            let released = match cell.hibernate() {
                Hibernation::NotWaiting => {
                    waiting_again.push(pid);
                    continue;
                }
                Hibernation::Waiting { released } => released,
                Hibernation::Woken { released } => {
                    woken = Some(cell);
                    released
                }
            };
            if released {
                counters.record_hibernation();
            }
        }
        let mut listed = shared.hibernating.lock();
        listed.put_back(&due[looked..], &waiting_again);
        match woken {
            Some(cell) => Hibernated::Woken(cell),
            None => Hibernated::Due(listed.next_due(now)),
        }
    }

    /// Suspends the listed durable processes that are due (`suspension.rs`), before
    /// this worker parks, the longest waiting first; as [`WorkerLoop::hibernate_waiting`]
    /// it stops as soon as work is queued anywhere, and at the first process an event
    /// woke meanwhile, which it returns to be run. An entry whose process stepped since
    /// it was listed is listed afresh if it waits again; one whose records are not all
    /// committed yet stays due; ended ones are dropped.
    fn suspend_waiting(&mut self) -> Hibernated {
        let shared = self.shared;
        let (Some(after), Some(durable)) = (shared.settings.suspend_after, shared.durable.as_ref()) else {
            return Hibernated::Due(None);
        };
        let now = Instant::now();
        let (due, submitted) = {
            let mut listed = shared.to_suspend.lock();
            // Read under the list's lock: every entry listed before it was listed after
            // its records were submitted, so this count covers them all.
            let submitted = durable.submitted();
            (listed.take_due(now, submitted, after), submitted)
        };
        let counters = &shared.counters[self.index];
        let committed = durable.committed();
        let (mut later, mut busy, mut afresh) = (Vec::new(), Vec::new(), Vec::new());
        let mut looked = 0;
        let mut woken = None;
        while looked < due.len() && woken.is_none() && !shared.has_queued_work() {
            let seen = due[looked];
            looked += 1;
            let Some(cell) = shared.registry.get(seen.listed.pid) else { continue };
            if committed < seen.submitted {
                later.push(seen);
                continue;
            }
            let records = seen.listed.records;
            let unchanged = || cell.journal_seq.load(Ordering::Relaxed) == records;
            let suspended = match cell.suspend(unchanged) {
                Hibernation::Waiting { released: true } => true,
                Hibernation::Woken { released } => {
                    // It runs next (`Ready`, queued by no one but this worker, which
                    // owns it): off the list, so that its next step that waits lists it
                    // again.
                    cell.listed_for_suspension.store(false, Ordering::Relaxed);
                    woken = Some(cell.clone());
                    released
                }
                Hibernation::Waiting { released: false } => {
                    if cell.suspended.load(Ordering::Acquire) {
                        cell.listed_for_suspension.store(false, Ordering::Relaxed);
                    } else {
                        // It stepped since it was listed, and waits again: its wait starts
                        // over, from the records it has now (all submitted: claimed, it is
                        // in no step).
                        let records = cell.journal_seq.load(Ordering::Relaxed);
                        afresh.push(Listed { pid: cell.pid(), records });
                    }
                    false
                }
                Hibernation::NotWaiting => {
                    // Owned by someone else (queued, stepping, or claimed by a worker that
                    // hibernates it): only its owner may take it off the list, so it stays
                    // listed, as it was, and its wait starts over now. Were it taken off
                    // here, a step that had found it listed, or a hibernation that hands
                    // it back, would leave it waiting unlisted for ever. Stamped with this
                    // look's `submitted`: it was listed before an earlier look, so its
                    // records were all submitted before this one began.
                    busy.push(Seen { listed: seen.listed, at: now, submitted });
                    false
                }
            };
            if suspended {
                shared.suspended.fetch_add(1, Ordering::Relaxed);
                counters.record_suspension();
                crate::heap::suspended();
                // Listed again by its next step that waits, once it has come back.
                cell.listed_for_suspension.store(false, Ordering::Relaxed);
            }
        }
        let mut listed = shared.to_suspend.lock();
        later.extend_from_slice(&due[looked..]);
        listed.put_back(&later, &busy, &afresh);
        match woken {
            Some(cell) => Hibernated::Woken(cell),
            // An entry left due (its records not yet committed) is looked at again after
            // a commit's time, not at once: the worker would spin until the commit lands.
            None => Hibernated::Due(listed.next_due(now, after).map(|due| due.max(now + COMMIT_PATIENCE))),
        }
    }

    fn next_local(&mut self) -> Option<Arc<ProcessCell>> {
        self.tick = self.tick.wrapping_add(1);
        if self.tick.is_multiple_of(GLOBAL_CHECK_INTERVAL) {
            // Just one from the global queue, as Go does: a batch would land on top of
            // the local work and push all of it back. Or the oldest of this worker's own
            // deque, through its own stealer: the deque pops the newest, so beneath a
            // stream of wake-ups (a ping-pong pair, each woken by the other's message) a
            // process would otherwise wait for ever. The two take turns at being asked
            // first, so neither can keep the other's turn: the process at the bottom of
            // the deque runs within two intervals, whatever is pushed on top of it.
            let global = || steal_one(|| self.shared.injector.steal());
            let oldest = || steal_one(|| self.shared.stealers[self.index].steal());
            let task = if (self.tick / GLOBAL_CHECK_INTERVAL).is_multiple_of(2) {
                global().or_else(oldest)
            } else {
                oldest().or_else(global)
            };
            if task.is_some() {
                return task;
            }
        }
        self.shared.slots[self.index].take().or_else(|| self.local.queue.pop())
    }

    /// Whether this worker, out of work, should stay on its core rather than park: a
    /// durable scheduler's commit is in flight, and [`COMMIT_PATIENCE`] has not passed
    /// since `until` was set (on the first look of this search). The commit's effects
    /// wake processes as soon as it lands, and a parked worker would add a wake-up from
    /// the kernel to every commit's round trip. On a host whose cores other busy threads
    /// share (`JournalSettings::shared_cores`), not while more than
    /// [`SPIN_WHILE_AT_MOST`] submissions are in flight: many processes are at work, and
    /// the cores are busy with the threads that feed them, with which a worker staying
    /// on its core would only take turns.
    fn awaiting_commit(&self, until: &mut Option<Instant>) -> bool {
        let Some(durable) = self.shared.durable.as_ref() else { return false };
        let in_flight = durable.in_flight();
        if in_flight == 0 || (durable.shared_cores() && in_flight > SPIN_WHILE_AT_MOST) {
            return false;
        }
        let until = *until.get_or_insert_with(|| Instant::now() + COMMIT_PATIENCE);
        Instant::now() < until
    }

    /// The occupant of another worker's slot that has been there, untaken and with no
    /// put since, for [`SLOT_PATIENCE`]: its owner is in a long step. Otherwise starts
    /// watching the slots that are full now, unless a watch is still maturing.
    fn steal_stuck_slot(&mut self, now: Instant) -> Option<Arc<ProcessCell>> {
        let slots = &self.shared.slots;
        if let Some((since, seen)) = &self.watching {
            if now.duration_since(*since) < SLOT_PATIENCE {
                return None;
            }
            let stuck = seen.iter().find(|&&(i, puts)| slots[i].puts() == puts);
            if let Some(task) = stuck.and_then(|&(i, _)| slots[i].take()) {
                self.watching = None;
                self.shared.counters[self.index].record_steal(1);
                return Some(task);
            }
        }
        let full = |i: &usize| *i != self.index && !slots[*i].is_empty();
        let seen: Vec<(usize, u64)> = (0..slots.len()).filter(full).map(|i| (i, slots[i].puts())).collect();
        self.watching = (!seen.is_empty()).then_some((now, seen));
        None
    }

    fn steal_global(&self) -> Option<Arc<ProcessCell>> {
        loop {
            match self.shared.injector.steal_batch_with_limit_and_pop(&self.local.queue, GLOBAL_BATCH + 1) {
                Steal::Success(task) => return Some(task),
                Steal::Empty => return None,
                Steal::Retry => std::hint::spin_loop(),
            }
        }
    }

    fn steal_from_victims(&mut self) -> Option<Arc<ProcessCell>> {
        let stealers = &self.shared.stealers;
        let n = stealers.len();
        if n <= 1 {
            return None;
        }
        loop {
            let mut retry = false;
            let start = self.rng.below(n);
            for i in (0..n).map(|k| (start + k) % n).filter(|&i| i != self.index) {
                let queue = &self.local.queue;
                let before = queue.len();
                match stealers[i].steal_batch_and_pop(queue) {
                    Steal::Success(task) => {
                        let stolen = (queue.len() - before) as u64 + 1;
                        self.shared.counters[self.index].record_steal(stolen);
                        return Some(task);
                    }
                    Steal::Empty => {}
                    Steal::Retry => retry = true,
                }
            }
            if !retry {
                return None;
            }
        }
    }

    fn run_task(&mut self, cell: Arc<ProcessCell>) {
        let shared = self.shared;
        let counters = &shared.counters[self.index];
        let out = &mut self.out;
        let local = self.local;
        let dispatch = &local.dispatch;
        let durable = shared.durable.as_ref();
        let end = cell.run_turn(shared.settings.turn_budget, &mut self.events, |events| {
            events.append(&mut dispatch.early.borrow_mut());
            out.reset();
            counters.record_step();
            // A suspended process comes back before the step its event is for.
            if cell.suspended.load(Ordering::Acquire) {
                counters.record_return();
                if let Err(error) = recovery::bring_back(shared, &cell) {
                    events.clear();
                    return Decision::Complete(ExitReason::Error(error));
                }
            }
            // A durable step's record holds the events it was given.
            let turn = durable.map(|durable| durable.begin_turn(&cell, events));
            dispatch.stepping.set(Arc::as_ptr(&cell) as usize);
            // SAFETY: `run_turn` runs this closure only while this worker holds the
            // process in `Running`.
            let stepped = unsafe {
                cell.with_process(|process| {
                    catch_unwind(AssertUnwindSafe(|| process.step(Events::new(events.drain(..)), out)))
                })
            };
            dispatch.stepping.set(0);
            // A preempted step is recorded once it finishes, as one step.
            let recorded = match (durable, turn) {
                (Some(durable), Some(turn)) => durable.end_turn(&cell, turn, out.is_preempted()),
                _ => None,
            };
            // A panic in the step was caught above, so this always runs.
            // A step may leave events it did not take; they were delivered to it all the same.
            events.clear();
            match stepped {
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(error))) => return Decision::Complete(step_failed(error)),
                Some(Err(panic)) => {
                    let message = format!("process panicked: {}", panic_message(&*panic));
                    return Decision::Complete(ExitReason::trap(TrapKind::Panic, message));
                }
                None => unreachable!("process {} closed while running", cell.pid()),
            }
            let status = out.take_status();
            let yields = out.yields_mut();
            let limits = shared.limits_of(&cell);
            if let Status::Complete(result) = status {
                // Yields written with `Complete` are discarded (DESIGN 2).
                yields.clear();
                if let Ok(payload) = &result
                    && let Err(error) = limits.check_payload(payload.data.len(), "the result")
                {
                    return Decision::Complete(ExitReason::Error(error));
                }
                if let Some(durable) = durable
                    && let Some(step) = recorded
                {
                    let status = Status::Complete(Ok(Payload::empty()));
                    if let Err(error) = durable.record_finished(&cell, step, Vec::new(), status) {
                        return Decision::Complete(ExitReason::Error(error));
                    }
                }
                return Decision::Complete(result.into());
            }
            if let Err(error) = limits.check(yields, &cell.lineage) {
                yields.clear();
                return Decision::Complete(ExitReason::Error(error));
            }
            // A durable step's yields are the committer's to carry out, unless they only
            // read: then they come back, with the step's record, to be carried out now.
            let mut record = None;
            if let Some(durable) = durable
                && let Some(step) = recorded
            {
                match durable.record_finished(&cell, step, std::mem::take(yields), status.clone()) {
                    Ok((seq, back)) => {
                        *yields = back;
                        record = seq;
                    }
                    Err(error) => return Decision::Complete(ExitReason::Error(error)),
                }
                // SAFETY: as for the step above; the process is still `Running`.
                if let Err(error) = unsafe { durable.snapshot_if_due(&cell) } {
                    return Decision::Complete(ExitReason::Error(error));
                }
            }
            dispatch.cell.set(Arc::as_ptr(&cell) as usize);
            for (index, y) in yields.drain(..).enumerate() {
                let origin = record.map(|seq| Origin { seq, index: index as u32 });
                shared.dispatch_from(&cell, y, origin);
            }
            dispatch.cell.set(0);
            let target = match status {
                Status::Continue if out.is_preempted() => return Decision::Preempted,
                Status::Continue => return Decision::Continue,
                _ if !dispatch.early.borrow().is_empty() => return Decision::Rerun,
                Status::Blocked => Lifecycle::Blocked,
                Status::Idle => Lifecycle::Idle,
                Status::Complete(_) => unreachable!("handled above"),
            };
            // A process that could give memory back while it waits is listed, once until
            // it has, for the next worker that runs out of work (`hibernate_waiting`):
            // not now, since an answer may be on its way and the process would only
            // fault the memory back in (a process waiting for another on the other
            // worker, say).
            // SAFETY: as for the step above; the process is still `Running`.
            let wants = unsafe { cell.with_process(|p| catch_unwind(AssertUnwindSafe(|| p.wants_hibernation()))) };
            if let Some(Ok(true)) = wants {
                shared.list_for_hibernation(cell.pid());
            }
            // A durable process that could be made again is listed to be suspended if it
            // waits long (`suspension.rs`): once until a worker that owns it takes it off
            // the list. Relaxed: only the process's owner reads or writes the flag, and
            // the state word orders successive owners.
            if shared.settings.suspend_after.is_some()
                && cell.spec.kind.is_some()
                && !cell.listed_for_suspension.swap(true, Ordering::Relaxed)
            {
                shared.list_for_suspension(&cell);
            }
            Decision::Wait(target)
        });
        {
            let mut early = dispatch.early.borrow_mut();
            if let TurnEnd::Requeue = end {
                // `Ready` but in no queue yet: no one else can touch the process, so the
                // kept completions can go into its inbox without a wake.
                for event in early.drain(..) {
                    cell.inbox
                        .push(event, MailboxBound { messages: usize::MAX, bytes: usize::MAX })
                        .expect("inbox of a live process is open");
                }
            } else {
                debug_assert!(
                    !matches!(end, TurnEnd::Parked) || early.is_empty(),
                    "parked with completions kept aside"
                );
                // A finished process never reads them.
                early.clear();
            }
        }
        match end {
            TurnEnd::Parked => {}
            // Requeued processes go to the back of the global queue: behind everything
            // already waiting, so one busy process cannot starve the others.
            TurnEnd::Requeue => shared.schedule_global(cell),
            TurnEnd::Complete(result) => shared.end(&cell, Some(result)),
            TurnEnd::Terminated => shared.end(&cell, None),
        }
    }
}

/// The reason a process whose step failed with `error` ends with: the [`ExitReason`] the
/// error is (or holds, under context), as a process reports a trap (see
/// [`Process::step`](crate::Process::step)); otherwise an [`ExitReason::Error`] with the
/// error's whole chain.
fn step_failed(error: anyhow::Error) -> ExitReason {
    match error.downcast::<ExitReason>() {
        Ok(reason) => reason,
        Err(error) => ExitReason::Error(format!("{error:#}")),
    }
}

/// The message of a caught panic, whichever way it was raised.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// xorshift64*: victim selection only needs to spread workers out, not be unpredictable.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize % n
    }
}
