//! Resuming durable processes from their journal (see [`crate::journal`]).
//!
//! At build, a scheduler with a journal reads every history ([`Plan::read`]); processes
//! without a recorded exit are restored:
//!
//! 1. **Registered** under the pid they had, each made by its kind's factory, every one
//!    before any runs (so a message between two restored processes finds its receiver),
//!    with its recorded grants, narrowed to `Builder::resume_within`'s if given: a resume
//!    may take a grant away, never add one.
//! 2. **Replayed**: `init` with the recorded method and input, then each recorded step
//!    with its recorded events. A replayed step must yield the recorded commands and port
//!    sends and end with the recorded status; if it does not, the process ends with an
//!    error naming the step and what differed. Replay carries nothing out, and what the
//!    process logs meanwhile is marked as replayed (`replaying_now`): it was logged when
//!    the step first ran.
//! 3. **Rewired**: what was under way at the crash is taken up again. A command whose
//!    completion no step consumed runs again (a `sleep` for what is left of it, counted
//!    from its step's recorded start; a custom command with the same idempotency key; a
//!    `spawn` whose child was recorded completes with that child instead). A message that
//!    its receiver did not consume is delivered again, once: messages carry (sender,
//!    number) identities, and a step's record lists those it consumed. Monitors are
//!    registered again, and an exit that happened but was not consumed is delivered.
//! 4. **Queued** when they can run.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use wasmproc_types::{ExitReason, Payload, Pid};

use super::caps::Capabilities;
use super::cell::{ProcessCell, Spec, Watcher, port};
use super::completer::complete;
use super::durable::{Origin, ReplayingHistory, replaying};
use super::inbox::Signal;
use super::process_handle::{ExitSlot, ProcessHandle};
use super::shared::Shared;
use super::state::{Lifecycle, Waiting};
use crate::handler::make_under;
use crate::journal::{Carried, Decode, Journal, Record, Recorded, now_micros};
use crate::limits::{KindLimits, Lineage};
use crate::process::Process;
use crate::step::{Command, Status, StepOutput, Yield};

/// The limits each recorded process ran under: its kind's own, tightened by those its
/// spawner ran under, up to the embedder (every spawn went through `make_under`).
struct Sandboxes<'a> {
    plan: &'a Plan,
    shared: &'a Shared,
    known: HashMap<Pid, Option<KindLimits>>,
}

impl<'a> Sandboxes<'a> {
    fn new(plan: &'a Plan, shared: &'a Shared) -> Self {
        Sandboxes { plan, shared, known: HashMap::new() }
    }

    /// The limits `pid` ran under; `None` for the embedder, a process the journal does
    /// not hold, or a chain of kinds that report none.
    fn of(&mut self, pid: Pid) -> Option<KindLimits> {
        let mut chain = Vec::new();
        let mut at = pid;
        let mut bound = None;
        // Only a journal written by something else makes parents a cycle: its chain
        // stops once it is longer than the journal's processes.
        while at != Pid::HOST && chain.len() <= self.plan.saved.len() {
            if let Some(known) = self.known.get(&at) {
                bound = *known;
                break;
            }
            let Some(saved) = self.plan.saved.get(&at) else { break };
            chain.push(at);
            at = saved.spawn.parent;
        }
        for pid in chain.into_iter().rev() {
            let kind = self.plan.saved[&pid].spawn.kind.as_deref();
            let own = kind.and_then(|kind| self.shared.kinds.factory(kind)).and_then(|factory| factory.limits());
            bound = KindLimits::tighter(own, bound);
            self.known.insert(pid, bound);
        }
        bound
    }
}

/// A process made again: it, its spec, and the limits it runs under.
type Remade = (Box<dyn Process>, Spec, Option<KindLimits>, Option<crate::limits::ProcessQuota>);

/// Makes `saved`'s process again as it was spawned: by its recorded kind, within the
/// limits its spawner ran under, with its recorded grants narrowed to `grants` (never
/// widened). With its spec and the limits it runs under; otherwise why it cannot be made.
fn make_again(
    shared: &Arc<Shared>,
    saved: &Recorded,
    sandboxes: &mut Sandboxes<'_>,
    grants: Option<&Capabilities>,
) -> Result<Remade, String> {
    let Some(kind) = &saved.spawn.kind else {
        return Err("it was spawned as a value, not by a registered kind, so it cannot be made again".to_owned());
    };
    let Some((name, factory)) = shared.kinds.find(kind, None) else {
        return Err(format!("its kind `{kind}` is not registered"));
    };
    let bound = sandboxes.of(saved.spawn.parent);
    let (process, sandbox) = make_under(&*factory, bound).map_err(|e| format!("cannot be made: {e:#}"))?;
    let spec = Spec {
        scheduler: Some(shared.clone()),
        parent: saved.spawn.parent,
        kind: Some(name.clone()),
        caps: Arc::new(match grants {
            Some(bound) => saved.spawn.caps.intersect(bound),
            None => saved.spawn.caps.clone(),
        }),
        mailbox_capacity: (saved.spawn.mailbox_capacity as usize).max(1),
        mailbox_bytes: shared.settings.mailbox_bytes,
    };
    Ok((process, spec, sandbox, factory.quota()))
}

/// What a journal holds, read at build.
pub(super) struct Plan {
    saved: BTreeMap<Pid, Recorded>,
    /// The newest pid whose records were removed: no new process gets one as old.
    removed_floor: Option<Pid>,
    /// Each recorded child by the yield that spawned it: (parent, step record, tag).
    children: HashMap<(Pid, u64, u64), Pid>,
}

impl Plan {
    /// Reads every history ([`Journal::read_processes`]).
    ///
    /// # Errors
    ///
    /// The store cannot be read, or a record is damaged (named by its key): a journal that
    /// cannot be trusted is not resumed at all.
    pub(super) fn read(journal: &Journal) -> anyhow::Result<Plan> {
        let saved = journal.read_processes()?;
        let removed_floor = journal.removed_floor().context("the journal is damaged and cannot be resumed")?;
        let children = saved
            .iter()
            .filter_map(|(pid, s)| s.spawn.origin.map(|(seq, tag)| ((s.spawn.parent, seq, tag), *pid)))
            .collect();
        Ok(Plan { saved, removed_floor, children })
    }

    /// Replays every unfinished process against its records, on processes registered
    /// nowhere: nothing is resumed, nothing runs, nothing is written.
    pub(super) fn verify(
        self,
        shared: &Arc<Shared>,
        grants: Option<&Capabilities>,
    ) -> Vec<(Pid, Result<usize, String>)> {
        let mut verdicts = Vec::new();
        let mut sandboxes = Sandboxes::new(&self, shared);
        for (pid, saved) in self.saved.iter().filter(|(_, s)| s.exit.is_none()) {
            // Made as a resume makes it, so the replay runs under the same limits.
            let verdict = make_again(shared, saved, &mut sandboxes, grants).and_then(|(process, spec, sandbox, _)| {
                let cell = Arc::new(ProcessCell::new(*pid, process, spec, Lineage::default().within(sandbox)));
                let replayed = replay(&cell, saved).map(|_| saved.steps.len());
                // SAFETY: `replay` left the process `Running`, owned by this thread; it is
                // in no registry and no queue, and is dropped here.
                if let Some(mut process) = unsafe { cell.take_process() } {
                    process.close();
                }
                replayed
            });
            verdicts.push((*pid, verdict));
        }
        verdicts
    }

    /// Refuses to resume processes this host cannot make as they were: of a kind it has
    /// not registered, or whose kind's factory makes them from something else (a Wasm
    /// component with another hash). Nothing is resumed then and the journal is left as
    /// it is, for a host that can.
    pub(super) fn check(&self, kinds: &super::kinds::Kinds) -> anyhow::Result<()> {
        for (pid, saved) in self.saved.iter().filter(|(_, s)| s.exit.is_none()) {
            let Some(kind) = &saved.spawn.kind else { continue };
            let Some(factory) = kinds.factory(kind) else {
                anyhow::bail!(
                    "the journal holds unfinished process {pid} of kind `{kind}`, which this host does not register"
                );
            };
            if let (Some(recorded), Some(now)) = (&saved.spawn.identity, factory.identity())
                && *recorded != now
            {
                anyhow::bail!(
                    "the journal's processes of kind `{kind}` (process {pid} first) ran {recorded}, and this host's \
                     `{kind}` is {now}: resume them with the program they ran, or move the journal aside"
                );
            }
        }
        Ok(())
    }

    /// The registry shards the recorded pids need.
    pub(super) fn shards(&self) -> usize {
        self.saved.keys().map(|pid| super::registry::shard_of(*pid) + 1).max().unwrap_or(0)
    }

    /// Restores every unfinished process and sets it going, its grants narrowed to
    /// `grants`; returns the handles of those the embedder had spawned. The steps of the
    /// module's docs, in order.
    pub(super) fn restore(self, shared: &Arc<Shared>, grants: Option<&Capabilities>) -> Vec<ProcessHandle> {
        shared.registry.reserve_generations(self.saved.keys().copied());
        if let Some(floor) = self.removed_floor {
            shared.registry.reserve_everywhere(floor);
        }
        let cells = self.register(shared, grants);
        let handles = self.watch_roots(&cells);
        let replayed = self.replay_all(shared, &cells);
        let consumed = self.consumed(&replayed);
        let Rewired { deliveries, later } = self.rewire(shared, &cells, &replayed, &consumed);
        self.forget_finished(shared, &cells, &deliveries);
        deliver_again(shared, deliveries);
        for (cell, origin, at, y) in later {
            self.resume_yield(shared, &cell, (origin, at), y, &consumed, &cells);
        }
        queue(shared, &cells, replayed);
        self.free_in_background();
        handles
    }

    /// The handles of the registered processes the embedder had spawned.
    fn watch_roots(&self, cells: &BTreeMap<Pid, Arc<ProcessCell>>) -> Vec<ProcessHandle> {
        let mut handles = Vec::new();
        for (pid, cell) in cells {
            if self.saved[pid].spawn.parent == Pid::HOST {
                let slot = Arc::new(ExitSlot::default());
                if cell.inbox.watch(Watcher::Handle(slot.clone())).is_ok() {
                    handles.push(ProcessHandle::new(*pid, slot));
                }
            }
        }
        handles
    }

    /// Replays every registered process; a process whose replay fails ends with its error.
    /// Returns the status of each live one's last step (`None`: it has not stepped).
    fn replay_all(
        &self,
        shared: &Arc<Shared>,
        cells: &BTreeMap<Pid, Arc<ProcessCell>>,
    ) -> HashMap<Pid, Option<Status>> {
        // Replays touch nothing but their own process: one thread a worker shares them.
        let all: Vec<(&Pid, &Arc<ProcessCell>)> = cells.iter().collect();
        let chunk = all.len().div_ceil(shared.settings.workers).max(1);
        let saved = &self.saved;
        std::thread::scope(|scope| {
            let threads: Vec<_> = all
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        let mut done = Vec::with_capacity(part.len());
                        for &(pid, cell) in part {
                            match replay(cell, &saved[pid]) {
                                Ok(status) => done.push((*pid, status)),
                                // The process ends here, with its exit recorded like any other.
                                Err(error) => shared.end(cell, Some(ExitReason::Error(error))),
                            }
                        }
                        done
                    })
                })
                .collect();
            threads.into_iter().flat_map(|t| t.join().expect("a replay's panics are caught")).collect()
        })
    }

    /// The identities of the messages each live process consumed, by process.
    fn consumed(&self, replayed: &HashMap<Pid, Option<Status>>) -> HashMap<Pid, Consumed> {
        replayed
            .keys()
            .map(|pid| {
                let saved = &self.saved[pid];
                let ids = saved.steps.iter().flat_map(|(_, step)| step.message_ids.iter().copied()).collect();
                let marks = saved.snapshot.as_ref().map(|(_, s)| s.carried.consumed.clone()).unwrap_or_default();
                (*pid, Consumed { ids, marks })
            })
            .collect()
    }

    /// Registers the live processes' monitors again, and gathers what was under way: the
    /// messages to deliver again and the yields to take up once they are.
    fn rewire(
        &self,
        shared: &Arc<Shared>,
        cells: &BTreeMap<Pid, Arc<ProcessCell>>,
        replayed: &HashMap<Pid, Option<Status>>,
        consumed: &HashMap<Pid, Consumed>,
    ) -> Rewired {
        let live = |pid: &Pid| replayed.contains_key(pid);
        // Every message to deliver again, by receiver, in each sender's order; with the
        // yield to complete once it is delivered, for a `send` still in flight. A message
        // to a process of another journal (a shard's, on a cluster) is sent again
        // whatever became of it: only its receiver knows, and it records each once.
        let mut deliveries: Deliveries = BTreeMap::new();
        let mut undelivered = |from: Pid, to: Pid, id: u64, topic: &str, body: &Payload, yielded| {
            let fresh = shared.remote_for(to).is_some() || (live(&to) && !consumed[&to].contains(from, id));
            if fresh {
                let message = Redelivery { topic: topic.to_owned(), body: body.clone(), yielded };
                deliveries.entry(to).or_default().insert((from, id), message);
            }
            fresh
        };
        let mut later = Vec::new();
        for (pid, saved) in &self.saved {
            let pending = pending_yields(saved);
            for (seq, topic, body) in &pending.carried.host_messages {
                undelivered(Pid::HOST, *pid, *seq, topic, body, None);
            }
            for (from, id, topic, body) in &pending.carried.received {
                if let Some(durable) = &shared.durable {
                    durable.note_received(*from, *pid, *id);
                }
                undelivered(*from, *pid, *id, topic, body, None);
            }
            // Its port sends, and the yielded sends it saw complete: a sender that has
            // ended may still have messages its receiver did not take, as may one whose
            // step was replayed.
            for (to, id, topic, body) in &pending.carried.sent {
                undelivered(*pid, *to, *id, topic, body, None);
            }
            if !live(pid) {
                for (origin, _, y) in &pending.outstanding {
                    if let Command::Send { to, topic, body } = &y.command {
                        undelivered(*pid, *to, origin.message_id(), topic, body, None);
                    }
                }
                continue;
            }
            let cell = &cells[pid];
            self.rewire_monitors(shared, cell, &pending, cells);
            self.rewire_links(shared, cell, &pending, cells, replayed);
            for (origin, at, y) in pending.outstanding {
                // A `send` in flight is delivered with the others, in its sender's order.
                if let Command::Send { to, topic, body } = &y.command
                    && undelivered(*pid, *to, origin.message_id(), topic, body, Some((cell.clone(), y.tag)))
                {
                    continue;
                }
                later.push((cell.clone(), origin, at, y));
            }
        }
        Rewired { deliveries, later }
    }

    /// Removes the records of the trees whose every process has ended and whose messages
    /// need no delivering again: they are done with.
    fn forget_finished(&self, shared: &Arc<Shared>, cells: &BTreeMap<Pid, Arc<ProcessCell>>, deliveries: &Deliveries) {
        let Some(durable) = &shared.durable else { return };
        let Some(trees) = durable.trees() else { return };
        let senders: HashSet<Pid> = deliveries.values().flat_map(|m| m.keys().map(|(from, _)| *from)).collect();
        let mut trees = trees.lock();
        for (pid, saved) in &self.saved {
            trees.add_to(*pid, self.root_of(*pid), saved.exit.is_none() && cells.contains_key(pid));
            // A process that could not be made again had its exit recorded after its
            // last record.
            let lost = saved.exit.is_none() && !cells.contains_key(pid);
            trees.set_records(*pid, saved.next_seq + u64::from(lost));
        }
        // A tree that sent to another journal keeps its records, to send again.
        for (to, messages) in deliveries.iter().filter(|(to, _)| shared.remote_for(**to).is_some()) {
            for (from, _) in messages.keys() {
                trees.sent(*from, *to);
            }
        }
        let done = trees.finished_without(&senders);
        drop(trees);
        durable.remove(done);
    }

    /// Frees the histories, every replayed record's allocations, on a thread of their own:
    /// that took about a fifth of a second for a million records, which the resumed
    /// processes need not wait for. An empty journal, every fresh start's, has nothing
    /// worth a thread.
    fn free_in_background(self) {
        if self.saved.is_empty() {
            return;
        }
        let histories = self;
        let freeing = std::thread::Builder::new().name("journal-replayed".to_owned()).spawn(move || drop(histories));
        if let Err(error) = freeing {
            // The closure, and with it the histories, was dropped here instead.
            tracing::debug!(%error, "no thread to free the replayed histories on");
        }
    }

    /// The first process up `pid`'s chain of parents that the embedder spawned (or whose
    /// parent's records are gone).
    fn root_of(&self, mut pid: Pid) -> Pid {
        for _ in 0..self.saved.len() {
            match self.saved.get(&pid).map(|s| s.spawn.parent) {
                Some(parent) if parent != Pid::HOST && self.saved.contains_key(&parent) => pid = parent,
                _ => break,
            }
        }
        pid
    }

    /// Makes and registers every unfinished process, parents before children.
    fn register(&self, shared: &Arc<Shared>, grants: Option<&Capabilities>) -> BTreeMap<Pid, Arc<ProcessCell>> {
        let mut cells: BTreeMap<Pid, Arc<ProcessCell>> = BTreeMap::new();
        let unfinished: Vec<Pid> = self.saved.iter().filter(|(_, s)| s.exit.is_none()).map(|(pid, _)| *pid).collect();
        let waiting: HashSet<Pid> = unfinished.iter().copied().collect();
        // Parents first, so a child's lineage can count it in its parent's.
        let mut order = Vec::with_capacity(unfinished.len());
        let mut placed = HashSet::new();
        while order.len() < unfinished.len() {
            let before = order.len();
            for pid in &unfinished {
                let parent = self.saved[pid].spawn.parent;
                let parent_ready = parent == Pid::HOST || placed.contains(&parent) || !waiting.contains(&parent);
                if !placed.contains(pid) && parent_ready {
                    placed.insert(*pid);
                    order.push(*pid);
                }
            }
            if order.len() == before {
                // Only a journal written by something else makes parents a cycle: the
                // rest are taken as roots, whose limits count no parent.
                tracing::warn!(
                    "the journal's spawn records make a cycle of parents; resuming those processes as roots"
                );
                order.extend(unfinished.iter().filter(|pid| !placed.contains(*pid)));
                break;
            }
        }
        let mut sandboxes = Sandboxes::new(self, shared);
        for pid in order {
            let saved = &self.saved[&pid];
            // A child is made again under the limits its parent ran under, as it was
            // spawned (`make_under`), so a tree resumes no looser than it ran, whether or
            // not its parent has ended. Parents come first in `order`, for the lineage.
            let (process, spec, sandbox, quota) = match make_again(shared, saved, &mut sandboxes, grants) {
                Ok(made) => made,
                Err(reason) => {
                    tracing::error!(%pid, %reason, "a durable process cannot be resumed");
                    // Recorded as ended, so the next start does not try again.
                    if let Some(durable) = &shared.durable {
                        durable.record_lost_exit(pid, saved.next_seq, format!("cannot be resumed: {reason}"));
                    }
                    continue;
                }
            };
            // A root counts against its kind's quota as it did when it was spawned; a
            // child, against its parent's.
            let lineage = match cells.get(&saved.spawn.parent) {
                Some(parent) => Lineage::child_of(&parent.lineage),
                None => Lineage::default().bounded(quota.map(|quota| Arc::new(shared.quota_bound(&quota)))),
            };
            let cell = Arc::new(ProcessCell::new(pid, process, spec, lineage.within(sandbox)));
            cell.journal_seq.store(saved.next_seq, std::sync::atomic::Ordering::Relaxed);
            cells.insert(pid, cell);
        }
        for refused in shared.adopt(cells.values().cloned().collect()) {
            let pid = refused.pid();
            tracing::error!(%pid, "a durable process cannot be resumed: its pid is not one this host makes");
            cells.remove(&pid);
            if let Some(durable) = &shared.durable {
                durable.record_lost_exit(
                    pid,
                    self.saved[&pid].next_seq,
                    "cannot be resumed: a malformed pid".to_owned(),
                );
            }
        }
        cells
    }

    /// Registers again the monitors `cell`'s process had set up, and delivers the exits
    /// it did not consume of processes that ended.
    fn rewire_monitors(
        &self,
        shared: &Arc<Shared>,
        cell: &Arc<ProcessCell>,
        pending: &Pending,
        cells: &BTreeMap<Pid, Arc<ProcessCell>>,
    ) {
        let consumed_exits: HashSet<Pid> =
            pending.carried.exits_taken.iter().filter(|(_, linked)| !linked).map(|(pid, _)| *pid).collect();
        for target in &pending.carried.monitored {
            if consumed_exits.contains(target) {
                continue;
            }
            self.watch(shared, cell, *target, cells);
        }
    }

    /// Restores `cell`'s links and `trap-exits` flag as its history left them, on both
    /// sides of each link (a link another process made is in that one's history), and
    /// sends it the exit signal of each partner that ended without its signal being taken.
    fn rewire_links(
        &self,
        shared: &Arc<Shared>,
        cell: &Arc<ProcessCell>,
        pending: &Pending,
        cells: &BTreeMap<Pid, Arc<ProcessCell>>,
        replayed: &HashMap<Pid, Option<Status>>,
    ) {
        if pending.carried.trap_exits {
            cell.inbox.set_trap_exits(true);
        }
        for &partner in &pending.linked {
            // Restored links are not bounded again: they were within `max_links` when made.
            let _ = cell.inbox.add_link(partner, usize::MAX);
            if replayed.contains_key(&partner) {
                let _ = cells[&partner].inbox.add_link(cell.pid(), usize::MAX);
                continue;
            }
            let reason = match self.saved.get(&partner).and_then(|s| s.exit.clone()) {
                Some(exited) => exited.reason,
                None => ExitReason::Noproc,
            };
            shared.signal_cell(cell, partner, &reason, Signal::Link);
        }
    }

    /// `cell` gets an exit event when `target` ends: now, if it already has.
    fn watch(
        &self,
        shared: &Arc<Shared>,
        cell: &Arc<ProcessCell>,
        target: Pid,
        cells: &BTreeMap<Pid, Arc<ProcessCell>>,
    ) {
        cell.inbox.add_monitor(target);
        if let Some(target_cell) = cells.get(&target)
            && target_cell.inbox.watch(Watcher::Process(cell.clone())).is_ok()
        {
            return;
        }
        let reason = match self.saved.get(&target).and_then(|s| s.exit.clone()) {
            Some(exited) => exited.reason,
            None => ExitReason::Noproc,
        };
        if let Ok(Some(super::state::Wake::Schedule)) = cell.deliver_monitor_exit(target, reason) {
            shared.schedule(cell.clone());
        }
    }

    /// Takes up a yield whose completion was not consumed.
    fn resume_yield(
        &self,
        shared: &Arc<Shared>,
        cell: &Arc<ProcessCell>,
        (origin, started): (Origin, u64),
        y: Yield,
        consumed: &HashMap<Pid, Consumed>,
        cells: &BTreeMap<Pid, Arc<ProcessCell>>,
    ) {
        let tag = y.tag;
        match y.command {
            Command::Sleep(duration) => {
                let deadline = started.saturating_add(duration.as_micros().min(u128::from(u64::MAX)) as u64);
                let left = Duration::from_micros(deadline.saturating_sub(now_micros()));
                shared.dispatch_from(cell, Yield { tag, command: Command::Sleep(left) }, Some(origin));
            }
            Command::Spawn(request) => match self.children.get(&(cell.pid(), origin.seq, tag)) {
                Some(child) => {
                    complete(cell, tag, Ok(Payload::u64(child.as_u64())));
                    if request.monitor {
                        self.watch(shared, cell, *child, cells);
                    }
                }
                None => shared.dispatch_from(cell, Yield { tag, command: Command::Spawn(request) }, Some(origin)),
            },
            Command::Send { to, topic, body } => {
                let id = origin.message_id();
                if consumed.get(&to).is_some_and(|ids| ids.contains(cell.pid(), id)) {
                    complete(cell, tag, Ok(Payload::empty()));
                } else {
                    shared.dispatch_from(cell, Yield { tag, command: Command::Send { to, topic, body } }, Some(origin));
                }
            }
            command => shared.dispatch_from(cell, Yield { tag, command }, Some(origin)),
        }
    }
}

/// Delivers every message again, in each sender's order, and completes the `send`
/// yields in flight with whether theirs was delivered.
fn deliver_again(shared: &Arc<Shared>, deliveries: Deliveries) {
    for (to, messages) in deliveries {
        for ((from, id), message) in messages {
            let sent = shared.send(from, to, message.topic, message.body, Some(id));
            match message.yielded {
                Some((cell, tag)) => complete(&cell, tag, sent.map(|()| Payload::empty()).map_err(|e| e.to_string())),
                None => {
                    if let Err(error) = sent {
                        tracing::warn!(%from, %to, %error, "a recovered message could not be delivered again");
                    }
                }
            }
        }
    }
}

/// Sets every replayed process going as its last step left it: ended, waiting, or queued.
fn queue(shared: &Arc<Shared>, cells: &BTreeMap<Pid, Arc<ProcessCell>>, replayed: HashMap<Pid, Option<Status>>) {
    let mut listed = false;
    for (pid, status) in replayed {
        let cell = &cells[&pid];
        // Its last recorded step completed it, and the host died before its exit was
        // recorded: the replay gave the result again, so it ends with it now rather
        // than being stepped past its end.
        if let Some(Status::Complete(result)) = status {
            let result = match &result {
                Ok(payload) => {
                    shared.settings.limits.check_payload(payload.data.len(), "the result").map_or_else(Err, |()| result)
                }
                Err(_) => result,
            };
            shared.end(cell, Some(result.into()));
            continue;
        }
        let target = match status {
            Some(Status::Blocked) => Some(Lifecycle::Blocked),
            Some(Status::Idle) => Some(Lifecycle::Idle),
            _ => None,
        };
        // Listed to be suspended as a step that ends waiting lists it (`suspension.rs`),
        // before it can be woken and step.
        if target.is_some() && shared.settings.suspend_after.is_some() && cell.spec.kind.is_some() {
            cell.listed_for_suspension.store(true, std::sync::atomic::Ordering::Relaxed);
            shared.list_for_suspension(cell);
            listed = true;
        }
        match target.map(|target| cell.state.transition_to_waiting(target)) {
            Some(Waiting::Parked) => {}
            Some(Waiting::Rerun) | None => {
                cell.state.transition_to_ready_from_running();
                shared.schedule_global(cell.clone());
            }
        }
    }
    // The workers run already, and may all have parked with nothing listed: one looks
    // at the list (`Shared::has_unseen_suspensions`).
    if listed {
        shared.idle.notify_one();
    }
}

/// Runs `init` and every recorded step again, checking each against its record. Leaves
/// the process `Running`, and returns the status of its last step (`None`: it has not
/// stepped yet).
fn replay(cell: &Arc<ProcessCell>, saved: &Recorded) -> Result<Option<Status>, String> {
    let _replaying = ReplayingHistory::begin();
    let init = replay_init(cell, saved);
    cell.state.transition_to_ready_from_init();
    cell.state.transition_to_running();
    init?;
    replay_steps(cell, saved)
}

/// Brings a suspended process back (`suspension.rs`): makes it again by its kind, as it
/// was made (within the sandbox it ran under), and brings it to its state by replaying
/// its history from its journal. Called by the worker that owns it (`Running`), before
/// the step its waking event is for; what it logs meanwhile is marked as replayed. On
/// error the process has not come back and must end with the error.
///
/// The one way back from suspension: a snapshot of the process (issue 35's item 3)
/// takes the place of the history's prefix here, and nowhere else.
pub(super) fn bring_back(shared: &Shared, cell: &Arc<ProcessCell>) -> Result<(), String> {
    let pid = cell.pid();
    let fail = |why: String| Err(format!("process {pid} could not come back from suspension: {why}"));
    let Some(durable) = &shared.durable else { return fail("its scheduler has no journal".to_owned()) };
    let Some(kind) = &cell.spec.kind else { return fail("it was not made by a registered kind".to_owned()) };
    let process = pid.as_u64();
    let saved = match durable.journal().read_range(process, process.checked_add(1), Decode::All) {
        Ok(mut histories) => histories.remove(&pid),
        Err(error) => return fail(format!("its journal cannot be read: {error}")),
    };
    let Some(saved) = saved else { return fail("its journal holds no history of it".to_owned()) };
    if saved.exit.is_some() {
        return fail("its journal records its end".to_owned());
    }
    let Some(factory) = shared.kinds.factory(kind) else {
        return fail(format!("its kind `{kind}` is no longer registered"));
    };
    if let (Some(recorded), Some(now)) = (&saved.spawn.identity, factory.identity())
        && *recorded != now
    {
        return fail(format!("it ran {recorded}, and its kind `{kind}` is now {now}"));
    }
    let made = match make_under(&*factory, cell.lineage.sandbox()) {
        Ok((made, _)) => made,
        Err(error) => return fail(format!("it cannot be made again: {error:#}")),
    };
    // SAFETY: the caller owns the process (`Running`), whose slot is empty while it is
    // suspended.
    unsafe { cell.put_process(made) };
    let _replaying = ReplayingHistory::begin();
    let replayed = replay_init(cell, &saved).and_then(|()| replay_steps(cell, &saved));
    match replayed {
        Ok(Some(Status::Complete(_))) => fail("its replayed history ends it".to_owned()),
        Ok(_) => {
            // Still suspended on an error: its end counts it out (`Shared::retire`).
            if cell.suspended.swap(false, std::sync::atomic::Ordering::AcqRel) {
                shared.suspended.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        }
        Err(error) => fail(error),
    }
}

/// Begins `cell`'s journal as recorded and runs its `init` again with the recorded
/// method and input, or restores the snapshot its history begins with, as the owner of
/// the process.
fn replay_init(cell: &Arc<ProcessCell>, saved: &Recorded) -> Result<(), String> {
    let spawn = &saved.spawn;
    cell.begin_journal(spawn.seed, spawn.at);
    if cell.scheduler().durable.as_ref().is_some_and(|durable| durable.takes_snapshots()) {
        let snapshot = saved.snapshot.as_ref().map(|(seq, s)| (*seq, &**s));
        let steps = saved.steps.iter().map(|(seq, step)| (*seq, Record::Step(step.clone())));
        let messages = saved
            .host_messages
            .iter()
            .map(|(seq, topic, body)| (*seq, Record::HostMessage { topic: topic.clone(), body: body.clone() }));
        let received = saved.received.iter().map(|(from, id, topic, body)| {
            (0, Record::Received { from: *from, id: *id, topic: topic.clone(), body: body.clone() })
        });
        cell.resume_carried(spawn, snapshot, steps.chain(messages).chain(received));
    }
    let what = if saved.snapshot.is_some() { "its snapshot's restore" } else { "its init" };
    // SAFETY: the caller owns the process: it was registered moments ago and is in
    // `Init`, in no queue (recovery), or its worker brings it back (`bring_back`).
    let init = unsafe {
        cell.with_process(|p| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &saved.snapshot {
                Some((_, snapshot)) => p.restore(port(cell), &snapshot.state),
                None => p.init(port(cell), &spawn.method, spawn.input.clone()),
            }))
        })
    }
    .expect("a process being replayed is not closed");
    match init {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("cannot be resumed: {what} failed on replay: {error:#}")),
        Err(_) => Err(format!("cannot be resumed: {what} panicked on replay")),
    }
}

/// Runs every recorded step of `cell`'s process again, checking each against its
/// record, as the owner of the process (`Running`); the status of the last (`None`: it
/// has not stepped yet).
fn replay_steps(cell: &Arc<ProcessCell>, saved: &Recorded) -> Result<Option<Status>, String> {
    let pid = cell.pid();
    let mut out = StepOutput::new();
    // With no step after its snapshot, the process goes on as the snapshot's last step
    // left it.
    let mut last = saved.snapshot.as_ref().map(|(_, snapshot)| snapshot.status.clone());
    for (seq, step) in &saved.steps {
        out.reset();
        cell.set_replayed_step_time(step.at);
        let (stepped, sends) = replaying(cell, || {
            // SAFETY: as above; the process is `Running` and owned by this thread.
            unsafe {
                cell.with_process(|p| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        p.step(crate::step::Events::new(step.events.clone().drain(..)), &mut out)?;
                        // A step preempted now (a loaded machine, an instance made again)
                        // goes on, given nothing, as its first run's turns went on: its
                        // record holds the whole step.
                        while out.is_preempted() {
                            out.reset();
                            p.step(crate::step::Events::new(Vec::new().drain(..)), &mut out)?;
                        }
                        Ok::<(), anyhow::Error>(())
                    }))
                })
            }
        });
        let differs = |what: String| Err(format!("non-determinism in process {pid} at step record {seq}: {what}"));
        match stepped {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(error))) => return differs(format!("the step failed on replay ({error:#})")),
            Some(Err(_)) | None => return differs("the step panicked on replay".to_owned()),
        }
        if !same_as_recorded(out.yields(), &step.yields) {
            return differs(format!("recorded yields {:?}, replay yielded {:?}", step.yields, out.yields()));
        }
        if sends != step.sends {
            return differs(format!("recorded port sends {:?}, replay sent {sends:?}", step.sends));
        }
        let status = out.take_status();
        // Only finishing is part of the history: whether a step waits or runs again
        // decides when the process runs next, which replay does not follow.
        let same_status = matches!(status, Status::Complete(_)) == matches!(step.status, Status::Complete(_));
        if !same_status {
            return differs(format!("recorded status {:?}, replay ended with {status:?}", step.status));
        }
        last = Some(status);
    }
    Ok(last)
}

/// Whether a replayed step's `yields` are the `recorded` ones as the journal keeps them: a
/// `sleep` is recorded in whole microseconds, so a replayed one is compared at that
/// precision.
fn same_as_recorded(yields: &[Yield], recorded: &[Yield]) -> bool {
    yields.len() == recorded.len()
        && yields.iter().zip(recorded).all(|(now, then)| {
            now.tag == then.tag
                && match (&now.command, &then.command) {
                    (Command::Sleep(now), Command::Sleep(then)) => {
                        now.as_micros().min(u128::from(u64::MAX)) == then.as_micros()
                    }
                    (now, then) => now == then,
                }
        })
}

/// The messages to deliver again, by receiver, each sender's in the order it sent them.
type Deliveries = BTreeMap<Pid, BTreeMap<(Pid, u64), Redelivery>>;

/// What [`Plan::rewire`] found under way.
struct Rewired {
    deliveries: Deliveries,
    /// The yields to take up once the messages are delivered again.
    later: Vec<(Arc<ProcessCell>, Origin, u64, Yield)>,
}

/// A message to deliver again at recovery.
struct Redelivery {
    topic: String,
    body: Payload,
    /// The process and tag of the `send` yield to complete once it is delivered.
    yielded: Option<(Arc<ProcessCell>, u64)>,
}

/// The messages a process took: those its steps list, and for those its snapshot
/// replaced, the highest identity of each sender.
struct Consumed {
    ids: HashSet<(Pid, u64)>,
    marks: Vec<(Pid, u64)>,
}

impl Consumed {
    fn contains(&self, from: Pid, id: u64) -> bool {
        self.ids.contains(&(from, id)) || self.marks.iter().any(|&(sender, last)| sender == from && id <= last)
    }
}

/// What a process's history says is still under way.
struct Pending {
    /// Yields with no consumed completion, in order, with their step's time.
    outstanding: Vec<(Origin, u64, Yield)>,
    /// What its snapshot carried, with every record after it added: the messages it
    /// sent and was sent, whom it monitors, whether it traps exits.
    carried: Carried,
    /// Processes it linked to through completed `link` yields and linked spawns, less
    /// those it unlinked and those whose exit signal it took (as an event).
    linked: BTreeSet<Pid>,
}

/// What `saved`'s history leaves under way: its snapshot's [`Carried`] with every record
/// after it added.
fn pending_yields(saved: &Recorded) -> Pending {
    let mut carried = saved.snapshot.as_ref().map(|(_, s)| s.carried.clone()).unwrap_or_default();
    for (seq, step) in &saved.steps {
        carried.fold(*seq, step);
    }
    for (seq, topic, body) in &saved.host_messages {
        carried.host_messages.push((*seq, topic.clone(), body.clone()));
    }
    for (from, id, topic, body) in &saved.received {
        carried.received.push((*from, *id, topic.clone(), body.clone()));
    }
    let outstanding = std::mem::take(&mut carried.outstanding)
        .into_iter()
        .map(|(seq, index, at, y)| (Origin { seq, index }, at, y))
        .collect();
    // Taken whenever it came: a `noproc` for a link to a process that was gone comes
    // before the link's completion. A pid is never used twice in a journal.
    let linked = carried.linked.iter().copied().filter(|pid| !carried.exits_taken.contains(&(*pid, true))).collect();
    Pending { outstanding, carried, linked }
}
