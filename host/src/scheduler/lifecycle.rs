//! The life of a process in the scheduler: spawn (register, `init`, `Ready`), the
//! messages, monitors and termination requests that reach it, its end (retire), waiting
//! until none is left (drain), and the list of waiting processes to hibernate.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use wasmproc_types::{ExitReason, Payload, Pid};

use super::caps::Capabilities;
use super::cell::{ProcessCell, Spec, Watcher, port};
use super::durable::draw_seed;
use super::recorded::Recorder;
use super::registry;
use super::shared::Shared;
use super::state::Wake;
use super::worker;
use crate::error::{SendError, SpawnError};
use crate::handler::Factory;
use crate::journal::{SpawnRecord, now_micros};
use crate::limits::Lineage;
use crate::process::Process;
use crate::step::{Event, Exited};

/// The hibernation list's length below which it is never pruned, so that a scheduler
/// with few live processes does not prune at every listing. Picked out of thin air: 16
/// KiB of pids.
const HIBERNATION_LIST_FLOOR: usize = 2048;

/// The embedder's admission of a new pid, before its spawn is journaled: an error
/// refuses the spawn.
pub(super) type Admit<'a> = &'a mut dyn FnMut(Pid) -> Result<(), String>;

/// Everything a spawn needs besides the process.
pub(super) struct SpawnArgs {
    /// The spawner: [`Pid::HOST`] for the embedder.
    pub(super) parent: Pid,
    /// For a child of a durable process: the parent's step record and the spawn's tag.
    pub(super) origin: Option<(u64, u64)>,
    pub(super) kind: Option<Arc<str>>,
    pub(super) method: String,
    pub(super) input: Vec<Payload>,
    pub(super) caps: Arc<Capabilities>,
    pub(super) mailbox_capacity: usize,
    pub(super) watcher: Option<Watcher>,
    /// The process to link it to before it first runs (a `spawn` with `link`).
    pub(super) linked_to: Option<Arc<ProcessCell>>,
    /// Its place in its process tree: a root's when the embedder spawns.
    pub(super) lineage: Lineage,
    /// The embedder's note, kept with the spawn's record.
    pub(super) note: Option<Vec<u8>>,
    /// What the kind's factory says it is ([`Factory::identity`]), for a durable
    /// spawn's record: taken from the factory the process was made by, not looked up
    /// again. `None` without a journal.
    pub(super) identity: Option<String>,
    /// Told when the spawn's record is committed; at once without a journal.
    pub(super) recorder: Option<Recorder>,
}

impl Shared {
    /// What a process made by `factory` records as its identity ([`SpawnArgs::identity`]):
    /// the factory's, with a journal; nothing without one, which records no spawn.
    pub(super) fn identity_of(&self, factory: &dyn Factory) -> Option<String> {
        self.durable.as_ref().and_then(|_| factory.identity())
    }

    /// Registers and initialises a process and moves it to `Ready`; the caller queues it.
    pub(super) fn spawn_unqueued(
        self: &Arc<Self>,
        process: Box<dyn Process>,
        args: SpawnArgs,
    ) -> Result<Arc<ProcessCell>, SpawnError> {
        self.spawn_admitted(process, args, None)
    }

    /// As [`Shared::spawn_unqueued`], handing the pid to `admit` once `init` has
    /// succeeded, before the spawn is recorded or the process can run: if it refuses, the
    /// process is retired unborn and nothing of it reaches the journal.
    pub(super) fn spawn_admitted(
        self: &Arc<Self>,
        process: Box<dyn Process>,
        args: SpawnArgs,
        admit: Option<Admit<'_>>,
    ) -> Result<Arc<ProcessCell>, SpawnError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(SpawnError::Stopping);
        }
        let limit = self.settings.max_processes;
        let before = self.live.fetch_add(1, Ordering::AcqRel);
        if before >= limit {
            self.release_live();
            return Err(SpawnError::LimitExceeded { limit });
        }
        self.peak_live.fetch_max(before + 1, Ordering::Relaxed);

        let shard = worker::current_index(self.id).unwrap_or(self.settings.workers);
        let spec = Spec {
            scheduler: Some(self.clone()),
            parent: args.parent,
            kind: args.kind,
            caps: args.caps,
            mailbox_capacity: args.mailbox_capacity,
            mailbox_bytes: args.lineage.run_bound().map_or(self.settings.mailbox_bytes, |bound| bound.mailbox_bytes),
        };
        let parts = (process, spec, args.lineage);
        let made = self
            .registry
            .insert(shard, parts, |pid, (process, spec, lineage)| ProcessCell::new(pid, process, spec, lineage));
        let cell = match made {
            Ok(cell) => cell,
            Err((mut process, _, _)) => {
                self.release_live();
                close_quietly(&mut *process);
                return Err(SpawnError::LimitExceeded { limit: registry::MAX_PER_SHARD });
            }
        };
        // Counted from registration, so that `retire` (which every registered process
        // reaches, even one whose init fails) can always take it back.
        cell.lineage.enter();
        let pid = cell.pid();
        let method = args.method;
        // The spawn record needs the input that `init` consumes, and `init` the seed and
        // time it records.
        let durable_start = self.durable.as_ref().map(|durable| {
            let (seed, at) = (draw_seed(), now_micros());
            cell.begin_journal(seed, at);
            (durable, seed, at, args.input.clone())
        });
        // SAFETY: the process is in `Init`: registered but in no queue, so this spawner
        // is its only owner.
        let init = unsafe {
            cell.with_process(|p| {
                catch_unwind(AssertUnwindSafe(|| crate::heap::transient(|| p.init(port(&cell), &method, args.input))))
            })
        }
        .expect("a process in `Init` is not closed");
        let init = match init {
            Ok(result) => result,
            Err(panic) => Err(anyhow::anyhow!("init panicked: {}", worker::panic_message(&*panic))),
        };
        if let Err(source) = init {
            self.retire(&cell, Some(ExitReason::Error(format!("{source:#}")).into()), Ending::Unborn);
            return Err(SpawnError::Init { method, source });
        }
        if let Some(admit) = admit
            && let Err(reason) = admit(pid)
        {
            self.retire(&cell, Some(ExitReason::Error(reason.clone()).into()), Ending::Unborn);
            return Err(SpawnError::Refused(reason));
        }
        if let Some((durable, seed, at, input)) = durable_start {
            let record = SpawnRecord {
                parent: args.parent,
                origin: args.origin,
                kind: cell.spec.kind.as_deref().map(str::to_owned),
                identity: args.identity,
                method: method.clone(),
                input,
                caps: (*cell.spec.caps).clone(),
                mailbox_capacity: cell.spec.mailbox_capacity as u64,
                at,
                seed,
                note: args.note,
            };
            if let Err(reason) = durable.record_spawn(&cell, record, args.recorder) {
                self.retire(&cell, Some(ExitReason::Error(reason.clone()).into()), Ending::Unborn);
                return Err(SpawnError::Journal(reason));
            }
        } else if let Some(recorder) = args.recorder {
            recorder.set(Ok(()));
        }
        // Linked and watched before it is `Ready`: it cannot end before its partner and
        // its watcher are sure to hear of it. The partner is the spawner, running the
        // spawn, so its inbox is open; it was checked against its `max_links` before the
        // spawn (a link made to it meanwhile may take it one past).
        if let Some(partner) = args.linked_to {
            let linked = partner.inbox.add_link(pid, usize::MAX).and_then(|()| cell.inbox.add_link(partner.pid(), 1));
            debug_assert!(linked.is_ok(), "a spawner's inbox is open during its spawn");
        }
        if let Some(watcher) = args.watcher {
            if let Watcher::Process(watching) = &watcher {
                watching.inbox.add_monitor(pid);
            }
            if cell.inbox.watch(watcher).is_err() {
                unreachable!("inbox of process {pid} closed during its init");
            }
        }
        cell.state.transition_to_ready_from_init();
        self.count(|c| &c.spawned, 1);
        Ok(cell)
    }

    /// Registers restored processes under their recorded pids and counts them live, as
    /// a spawn would (see `recovery.rs`); they are in `Init` and in no queue.
    ///
    /// Hands back those whose pids no registry can hold (only a journal written by
    /// something else has such pids), not counted.
    pub(super) fn adopt(&self, cells: Vec<Arc<ProcessCell>>) -> Vec<Arc<ProcessCell>> {
        let refused = self.registry.restore(cells.clone());
        let count = cells.len() - refused.len();
        let before = self.live.fetch_add(count, Ordering::AcqRel);
        self.peak_live.fetch_max(before + count, Ordering::Relaxed);
        for cell in cells.iter().filter(|cell| !refused.iter().any(|r| Arc::ptr_eq(r, cell))) {
            cell.lineage.enter();
        }
        self.count(|c| &c.spawned, count as u64);
        refused
    }

    /// `watcher` gets an [`Event::Exit`] when `target` ends; at once
    /// ([`ExitReason::Noproc`]) if it already has.
    pub(super) fn monitor(&self, watcher: &Arc<ProcessCell>, target: Pid) {
        watcher.inbox.add_monitor(target);
        if let Some(remote) = self.remote_for(target) {
            return remote.monitor(watcher.pid(), target);
        }
        let refused = match self.registry.get(target) {
            Some(cell) => cell.inbox.watch(Watcher::Process(watcher.clone())).is_err(),
            None => true,
        };
        if refused && let Ok(Some(Wake::Schedule)) = watcher.deliver_monitor_exit(target, ExitReason::Noproc) {
            self.schedule(watcher.clone());
        }
    }

    /// Requests termination of `target`, telling `watcher` once it has ended. On error
    /// the watcher is handed back.
    pub(super) fn terminate(&self, target: Pid, watcher: Option<Watcher>) -> Result<(), (SendError, Option<Watcher>)> {
        let Some(cell) = self.registry.get(target) else {
            return Err((SendError::NotFound(target), watcher));
        };
        if let Some(watcher) = watcher
            && let Err(watcher) = cell.inbox.watch(watcher)
        {
            return Err((SendError::Closed(target), Some(watcher)));
        }
        // Once the watcher is registered the exit notifies it, even if the process
        // finishes by itself before the request lands.
        let _ = self.terminate_cell(&cell, ExitReason::Terminated);
        Ok(())
    }

    /// Ends `cell`'s process at once with `reason` (when its current step, if any,
    /// returns); the first reason given wins.
    pub(super) fn terminate_cell(&self, cell: &Arc<ProcessCell>, reason: ExitReason) -> Result<(), SendError> {
        self.terminate_cell_because(cell, Exited::new(reason))
    }

    /// As [`Shared::terminate_cell`], with the whole record of the end: an exit signal
    /// from a linked process names its sender ([`Exited::signal_from`]).
    pub(super) fn terminate_cell_because(&self, cell: &Arc<ProcessCell>, exited: Exited) -> Result<(), SendError> {
        if !cell.inbox.set_terminate_reason(exited) {
            return Err(SendError::Closed(cell.pid()));
        }
        if cell.state.request_terminate() == Wake::Schedule {
            self.schedule(cell.clone());
        }
        Ok(())
    }

    /// Ends a process whose turn ended it (`None`: terminated). A durable process's exit
    /// is recorded first, and it is finalised once that is committed.
    pub(super) fn end(&self, cell: &Arc<ProcessCell>, result: Option<ExitReason>) {
        let result = result.map(Exited::new);
        match &self.durable {
            // Its exit is not recorded: it resumes on the next start.
            Some(_) if self.suspending.load(Ordering::Acquire) => {
                self.finalize(cell, Some(suspended()));
            }
            Some(_) if self.retries(cell, result.as_ref()) => {
                // As a crash at the trap: nothing after it is recorded, and the next
                // scheduler on the journal resumes the root from its last recorded step
                // (see `retry.rs`).
                self.suspending.store(true, Ordering::SeqCst);
                self.finalize(cell, Some(suspended()));
            }
            Some(durable) => {
                if let Err(reason) = durable.record_exit(cell, result) {
                    let error = format!("{reason}; the result was not recorded");
                    self.finalize(cell, Some(ExitReason::Error(error).into()));
                }
            }
            None => self.finalize(cell, result),
        }
    }

    /// Whether `cell`'s end with `result` is retried rather than recorded: it is a root's
    /// own trap, and this scheduler's [`Retry`](super::Retry) admits another attempt.
    fn retries(&self, cell: &ProcessCell, result: Option<&Exited>) -> bool {
        let Some(retry) = &self.retry else { return false };
        let Some(exited) = result else { return false };
        cell.spec.parent == Pid::HOST
            && exited.signal_from.is_none()
            && matches!(exited.reason, ExitReason::Trap(_))
            && retry.admit(cell.pid(), &exited.reason)
    }

    /// Ends a process that was running (or was dequeued with a terminate request).
    /// `None` means terminated: the end is the termination's reason.
    pub(super) fn finalize(&self, cell: &Arc<ProcessCell>, result: Option<Exited>) {
        // Counted first, so that whoever sees the scheduler drained sees it counted.
        self.count(|c| &c.completed, 1);
        self.retire(cell, result, Ending::Ran);
    }

    /// The end of every process, in this order: close the inbox (later events are
    /// refused with `Closed`), mark it complete, close the process (exactly once: it is
    /// taken out of its cell), remove its pid (later sends get `NotFound`), give back its
    /// place under `max_processes`, tell the watchers (counting a failure that no one was
    /// told of, see [`Stats::unobserved_failures`]), and only then count it out of
    /// `retiring`, so a waiter for "no process left" also sees every exit delivered and
    /// counted.
    ///
    /// [`Stats::unobserved_failures`]: super::Stats::unobserved_failures
    fn retire(&self, cell: &Arc<ProcessCell>, result: Option<Exited>, ending: Ending) {
        let closed = cell.inbox.close();
        let result = result.or(closed.terminate_reason).unwrap_or_else(|| Exited::new(ExitReason::Terminated));
        cell.state.transition_to_complete();
        // Closed before the pid leaves the registry: while `close` runs (dropping a Wasm
        // store takes a while), senders get `Closed`, not `NotFound`.
        // SAFETY: the caller owns the process (it is retiring it: the worker that ran it
        // or the spawner whose init failed), and the inbox is closed.
        if let Some(mut process) = unsafe { cell.take_process() } {
            close_quietly(&mut *process);
        }
        // Ended while suspended (terminated, or it could not come back): no longer one.
        if cell.suspended.swap(false, Ordering::AcqRel) {
            self.suspended.fetch_sub(1, Ordering::Relaxed);
        }
        self.registry.remove(cell.pid());
        self.requests.abandon(cell.pid());
        cell.lineage.leave();
        // Before the watchers hear of the exit: one that spawns on hearing it must find
        // the room this process held under `max_processes`. `retiring` goes up first, so
        // that `live` and `retiring` are never both zero before the watchers are told.
        self.retiring.fetch_add(1, Ordering::AcqRel);
        self.release_live();
        let undelivered = closed.undelivered.iter().filter(|e| matches!(e, Event::Message { .. })).count();
        if undelivered > 0 {
            self.count(|c| &c.undelivered, undelivered as u64);
        }
        // Suspended processes tell no other process: they all go down together, and a
        // step that consumed a suspension as an exit would make it part of the history.
        let suspending = self.suspending.load(Ordering::Acquire);
        let mut told = false;
        for watcher in closed.watchers {
            match watcher {
                Watcher::Process(_) if suspending => {}
                Watcher::Process(watching) => {
                    // A watcher that has ended itself refuses the event: it was not told.
                    // Nor one that demonitored it meanwhile.
                    let delivered = watching.deliver_monitor_exit(cell.pid(), result.reason.clone());
                    told |= matches!(delivered, Ok(Some(_)));
                    if let Ok(Some(Wake::Schedule)) = delivered {
                        self.schedule(watching);
                    }
                }
                Watcher::Yield(done) => {
                    told = true;
                    done.complete(Ok(Payload::empty()));
                }
                Watcher::Handle(slot) => {
                    told = true;
                    slot.set(result.clone());
                }
                Watcher::Notify(notify) => {
                    told = true;
                    notify(cell.pid(), &result.reason);
                }
                Watcher::Release(release) => release(),
            }
        }
        // After the messages it sent, in its partners' inboxes already: its exit signal.
        if !suspending && !closed.links.is_empty() {
            told |= self.signal_links(cell.pid(), &result, closed.links);
        }
        // Only a failure costs anything here; a suspension is no failure.
        if !told && ending == Ending::Ran && !suspending && !result.reason.is_normal() {
            // An error in its own words; any other end in the reason's (`trapped: …`).
            match &result.reason {
                ExitReason::Error(error) if result.signal_from.is_none() => self.count_unobserved(cell.pid(), error),
                _ => self.count_unobserved(cell.pid(), &result.to_string()),
            }
        }
        if self.retiring.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.notify_drained();
        }
    }

    /// Lists `cell` in [`Shared::to_suspend`] (`suspension.rs`), with its records so far.
    /// The caller owns the process and has set its `listed_for_suspension`.
    pub(super) fn list_for_suspension(&self, cell: &ProcessCell) {
        let records = cell.journal_seq.load(Ordering::Relaxed);
        self.to_suspend.lock().push(super::suspension::Listed { pid: cell.pid(), records });
    }

    /// Whether processes were listed for suspension since a worker last looked at the
    /// list: a worker about to park looks first. Pairs with the [`Idle::notify_one`]
    /// that follows a listing by a thread that is no worker (a recovery): the listing
    /// is under the list's lock, taken here after the parking worker's fence, so either
    /// this sees it or the notification sees the worker parked (`idle.rs`).
    ///
    /// [`Idle::notify_one`]: super::idle::Idle::notify_one
    pub(super) fn has_unseen_suspensions(&self) -> bool {
        self.settings.suspend_after.is_some() && self.to_suspend.lock().has_fresh()
    }

    /// Lists `pid` in [`Shared::hibernating`].
    ///
    /// Entries of processes that ended are dropped only by a worker that runs out of
    /// work, which a scheduler under steady load may never do: so a listing that finds
    /// the list at twice the live processes (each live one is listed at most once)
    /// first drops the ended ones. The list then holds at most `live` entries, and the
    /// next pruning is `live` listings away: amortised O(1) a listing, and a list that
    /// stays within 2 × live (or [`HIBERNATION_LIST_FLOOR`]) whatever the load.
    pub(super) fn list_for_hibernation(&self, pid: Pid) {
        let mut listed = self.hibernating.lock();
        if listed.len() >= HIBERNATION_LIST_FLOOR.max(2 * self.live.load(Ordering::Relaxed)) {
            listed.retain(|pid| self.registry.contains(pid));
        }
        listed.push(pid);
    }

    fn release_live(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.notify_drained();
        }
    }

    /// Wakes the waiters of [`Shared::wait_drained`] to check again.
    fn notify_drained(&self) {
        // Taking the lock orders this notify after a waiter's check (made under the
        // lock), so the waiter is either still to check or already waiting.
        let _guard = self.drained_lock.lock();
        self.drained.notify_all();
    }

    /// No process alive and none retiring. `live` is read first: `retire` raises
    /// `retiring` before it lowers `live`, so a zero read from `live` (acquiring that
    /// decrement) is followed by a read of `retiring` that sees the raise, or its end.
    fn drained(&self) -> bool {
        self.live.load(Ordering::Acquire) == 0 && self.retiring.load(Ordering::Acquire) == 0
    }

    /// Waits until no process is alive; false if `deadline` passed first.
    pub(super) fn wait_drained(&self, deadline: Option<Instant>) -> bool {
        let mut guard = self.drained_lock.lock();
        while !self.drained() {
            match deadline {
                Some(deadline) => {
                    if self.drained.wait_until(&mut guard, deadline).timed_out() {
                        return self.drained();
                    }
                }
                None => self.drained.wait(&mut guard),
            }
        }
        true
    }
}

/// The end a durable process is given when its scheduler stops: it is not ended, and
/// resumes from its journal (see `durable::SUSPENDED`).
pub(super) fn suspended() -> Exited {
    Exited::new(ExitReason::Shutdown)
}

/// Who hears of a process's end besides its watchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Its `init` (or its spawn record) failed: the spawner hears of it, as a
    /// [`SpawnError`].
    Unborn,
    /// It was spawned: only its watchers hear of it.
    Ran,
}

/// Closes and drops a process, containing any panic: a broken `close` must not take a
/// worker down with it.
fn close_quietly(process: &mut dyn Process) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| process.close())) {
        tracing::error!(panic = worker::panic_message(&*panic), "a process's `close` panicked");
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::scheduler::{Command, Events, Process, Scheduler, SpawnRequest, Status, StepOutput};
    use wasmproc_types::Payload;

    /// Waits once, for a sleep of a millisecond (one of no time completes during the
    /// dispatch, and the process runs on without waiting), asking to hibernate
    /// meanwhile, then ends.
    struct WaitsOnce(bool);

    impl Process for WaitsOnce {
        fn init(&mut self, _: crate::process::Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            if std::mem::replace(&mut self.0, true) {
                out.complete(Ok(Payload::empty()));
            } else {
                out.yield_command(0, Command::Sleep(Duration::from_millis(1)));
                out.set_status(Status::Blocked);
            }
            Ok(())
        }

        fn wants_hibernation(&mut self) -> bool {
            true
        }
    }

    /// Runs again at once until told to stop, so its worker never runs out of work.
    struct Busy(Arc<AtomicBool>);

    impl Process for Busy {
        fn init(&mut self, _: crate::process::Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            if self.0.load(Ordering::Relaxed) {
                out.complete(Ok(Payload::empty()));
            } else {
                out.set_status(Status::Continue);
            }
            Ok(())
        }
    }

    /// A worker that never runs out of work never prunes the hibernation list of the
    /// processes that ended: listing prunes it, so it stays bounded by the live
    /// processes (here 2 at most, so by the floor), not by every process that ever waited.
    #[test]
    fn the_hibernation_list_stays_bounded_on_a_busy_worker() {
        let scheduler = Scheduler::builder().workers(1).build().expect("the scheduler starts");
        let stop = Arc::new(AtomicBool::new(false));
        let busy = scheduler.handle().spawn(Busy(stop.clone()), "main").expect("spawn");
        // In batches, so that few are live at once and each batch's sleeps overlap.
        let (batches, batch) = (96, 64);
        let processes = batches * batch;
        assert!(processes > 2 * super::HIBERNATION_LIST_FLOOR);
        for _ in 0..batches {
            let waiters: Vec<_> =
                (0..batch).map(|_| scheduler.handle().spawn(WaitsOnce(false), "main").expect("spawn")).collect();
            for waiter in waiters {
                waiter.join_timeout(Duration::from_secs(20)).expect("the waiter ends").expect("ok");
            }
        }
        let listed = scheduler.handle().shared.hibernating.lock().len();
        stop.store(true, Ordering::Relaxed);
        busy.join_timeout(Duration::from_secs(20)).expect("the busy one ends").expect("ok");
        assert!(listed > 0, "no waiter was listed: the test shows nothing");
        assert!(listed <= super::HIBERNATION_LIST_FLOOR, "{listed} entries listed after {processes} waiters");
        scheduler.stop(Duration::from_secs(1));
    }

    /// Fails after a 20 ms sleep, so that a parent that does not wait has ended by then.
    struct FailsLater(bool);

    impl Process for FailsLater {
        fn init(&mut self, _: crate::process::Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            if std::mem::replace(&mut self.0, true) {
                out.complete(Err("boom".to_owned()));
            } else {
                out.yield_command(0, Command::Sleep(Duration::from_millis(20)));
                out.set_status(Status::Blocked);
            }
            Ok(())
        }
    }

    /// Spawns a `FailsLater` child, monitored if `watch`; then ends at once, or (if
    /// `watch`) once the child's exit arrives.
    struct Parent {
        watch: bool,
        spawned: bool,
    }

    impl Process for Parent {
        fn init(&mut self, _: crate::process::Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            let exited = events.into_iter().any(|event| matches!(event, crate::scheduler::Event::Exit { .. }));
            if !std::mem::replace(&mut self.spawned, true) {
                let request = SpawnRequest {
                    kind: Some("fails-later".to_owned()),
                    method: "main".to_owned(),
                    input: Vec::new(),
                    monitor: self.watch,
                    link: false,
                };
                out.yield_command(0, Command::Spawn(request));
                out.set_status(Status::Blocked);
            } else if !self.watch || exited {
                out.complete(Ok(Payload::empty()));
            } else {
                out.set_status(Status::Blocked);
            }
            Ok(())
        }
    }

    /// A failure is counted unobserved only when no watcher was told of it: not a
    /// monitored child's, nor the handle's of a root; a child's whose parent had ended,
    /// yes, with its pid and error.
    #[test]
    fn failures_no_one_was_told_of_are_counted_with_their_errors() {
        let factory = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(FailsLater(false))) };
        let scheduler = Scheduler::builder().workers(1).kind("fails-later", factory).build().expect("starts");
        let handle = scheduler.handle();
        let idle = || assert!(handle.wait_idle(Some(Duration::from_secs(20))), "the processes end");

        handle.spawn(FailsLater(false), "main").expect("spawn").join().expect_err("it fails");
        handle.spawn(Parent { watch: true, spawned: false }, "main").expect("spawn").join().expect("ok");
        idle();
        assert_eq!(handle.stats().unobserved_failures, 0, "the handle and the monitoring parent were told");

        handle.spawn(Parent { watch: false, spawned: false }, "main").expect("spawn").join().expect("ok");
        idle();
        let stats = handle.stats();
        assert_eq!(stats.unobserved_failures, 1);
        assert!(matches!(&stats.first_unobserved[..], [(_, error)] if error == "boom"), "{:?}", stats.first_unobserved);
        scheduler.stop(Duration::from_secs(1));
    }
}
