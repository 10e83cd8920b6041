//! Durable processes: a scheduler with a journal records every process's spawn, steps
//! and exit (the journal's records), and lets nothing of a step take effect before its record is
//! committed (see [`crate::journal`], "Guarantees").
//!
//! The write-ahead rule is kept by moving a step's effects behind the commit: the worker
//! records the step and submits it with what the step asked for ([`AfterCommit`]); the
//! committer thread carries that out once the record's group is durable. The process
//! itself goes on as it would without a journal (it parks, or is queued again): its
//! yields complete later than they would, which a process cannot tell from a slow
//! command. A step whose yields only read keeps them and has them carried out at once
//! (`Durable::record_step`).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use wasmproc_types::{ExitReason, Payload, Pid};

use super::cell::ProcessCell;
use super::inbox::{MailboxBound, MessageId};
use super::recorded::Recorder;
use super::state::Wake;
use super::worker;
use crate::error::SendError;
use crate::journal::{
    Carried, CommitError, CommitStats, Committer, Journal, Key, OnCommit, Record, SnapshotRecord, SpawnRecord,
    StepRecord, now_micros,
};
use crate::step::{Event, Exited, Status, Yield};

/// Where a yield of a durable process is in its journal: the record of its step, and its
/// place among that step's yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Origin {
    pub(super) seq: u64,
    pub(super) index: u32,
}

impl Origin {
    /// The identity of the message a yielded `send` at this origin carries.
    pub(super) fn message_id(self) -> u64 {
        (self.seq << 20) | YIELD_SEND_BIT | u64::from(self.index)
    }
}

/// A message sent through a port during a step: (to, topic, body).
pub(super) type PortSend = (Pid, String, Payload);

/// The most submissions the committer may have in hand for a step that only reads to go
/// on before its commit (see `Durable::record_step`): beyond it such a step waits for its
/// commit like any other, so processes that only read cannot pile records up faster than
/// the store takes them.
const READING_BACKLOG: usize = 4096;

/// The identities of a durable process's messages: `step record << 20 | index`, the
/// index among the step's port sends, or among its yields with this bit set (a step's
/// port sends happen during it, before its yields: so a sender's identities grow in the
/// order its messages leave). Both counts stay below 2^19: `record_step` ends a durable
/// process whose step goes past it (the default yield limit is 1,024).
pub(super) const YIELD_SEND_BIT: u64 = 1 << 19;

/// The identity of the `index`th port send of step record `seq`.
pub(super) fn port_send_id(seq: u64, index: usize) -> u64 {
    (seq << 20) | index as u64
}

thread_local! {
    /// The cell whose recorded step this thread replays (0: none), and the port sends
    /// the replayed step made, for comparison with the record.
    static REPLAY: (Cell<usize>, RefCell<Vec<PortSend>>) = const { (Cell::new(0), RefCell::new(Vec::new())) };
}

thread_local! {
    /// Whether this thread is replaying a process's recorded history (its `init` or a
    /// step): what the process logs meanwhile was logged when that history first ran.
    static REPLAYING_HISTORY: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is replaying a durable process's recorded history now: a
/// line the process logs was logged before, when the replayed step first ran.
pub(crate) fn replaying_now() -> bool {
    REPLAYING_HISTORY.with(Cell::get)
}

/// Marks this thread as replaying a process's history while it lives.
pub(super) struct ReplayingHistory(());

impl ReplayingHistory {
    pub(super) fn begin() -> ReplayingHistory {
        REPLAYING_HISTORY.with(|replaying| replaying.set(true));
        ReplayingHistory(())
    }
}

impl Drop for ReplayingHistory {
    fn drop(&mut self) {
        REPLAYING_HISTORY.with(|replaying| replaying.set(false));
    }
}

/// Runs `step` as a replay of one of `cell`'s steps: its port sends are collected, not
/// sent, and returned.
pub(super) fn replaying<R>(cell: &ProcessCell, step: impl FnOnce() -> R) -> (R, Vec<PortSend>) {
    REPLAY.with(|(replaying, _)| replaying.set(std::ptr::from_ref(cell) as usize));
    let result = step();
    REPLAY.with(|(replaying, sends)| {
        replaying.set(0);
        (result, sends.take())
    })
}

/// Keeps a durable process's port send for its step's record: `Err` hands it back if
/// `cell` is not in a step on this thread (the port was used from elsewhere), nor in a
/// replayed one.
pub(super) fn keep_port_send(cell: &ProcessCell, send: PortSend) -> Result<(), PortSend> {
    if !worker::is_stepping(cell) {
        return keep_replayed_send(cell, send);
    }
    let mut slot = cell.journaled.lock();
    step_or_begin(&mut slot, now_micros).sends.push(send);
    Ok(())
}

/// Keeps `send` if this thread replays a step of `cell`; hands it back otherwise.
fn keep_replayed_send(cell: &ProcessCell, send: PortSend) -> Result<(), PortSend> {
    REPLAY.with(|(replaying, sends)| {
        if replaying.get() == std::ptr::from_ref(cell) as usize {
            sends.borrow_mut().push(send);
            Ok(())
        } else {
            Err(send)
        }
    })
}

/// A scheduler's journal, as its threads use it.
pub(super) struct Durable {
    committer: Committer<AfterCommit>,
    /// Read back for a suspended process's history (`recovery::bring_back`).
    journal: Journal,
    max_records: u64,
    /// Steps between two snapshots of a process (`Builder::snapshot_every`); `None`:
    /// none is taken.
    snapshot_every: Option<u64>,
    /// The process trees whose records go once they have all ended; `None` keeps them.
    trees: Option<Mutex<Trees>>,
    /// The last message (its identity) each process recorded from each sender of another
    /// journal, by (sender, receiver): see [`Durable::record_received`].
    received: Mutex<FxHashMap<(Pid, Pid), u64>>,
}

/// What became of a message from a process of another journal ([`Durable::record_received`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Receipt {
    /// Recorded in its receiver's history: it is delivered, and its `done` called, once
    /// that is committed.
    Recording,
    /// Its receiver recorded it, or a later message of its sender, before: not again.
    Duplicate,
    /// An earlier message of its sender to its receiver has not been recorded yet: it
    /// must come again after that one.
    Early,
    /// Its receiver's mailbox is full: it must come again later.
    Full,
    /// No such process here: it has ended, or never was.
    NoProcess,
    /// Not recorded: the journal failed, or the scheduler is suspending its processes.
    Refused(String),
}

/// Every durable process's tree, by its root (the process the embedder spawned).
#[derive(Default)]
pub(super) struct Trees {
    roots: FxHashMap<Pid, Pid>,
    trees: FxHashMap<Pid, Tree>,
}

#[derive(Default)]
struct Tree {
    /// Each process and how many records it has (known once it has ended).
    members: FxHashMap<Pid, u64>,
    live: usize,
    /// It sent a message to a process of another tree: its records are needed to deliver
    /// that again after a crash, so they stay until a start finds it delivered.
    sent_outside: bool,
}

impl Trees {
    /// Adds `pid`, spawned by `parent`, to its parent's tree (a tree of its own when its
    /// parent is the embedder or unknown); `live` if it has not ended.
    pub(super) fn add(&mut self, pid: Pid, parent: Pid, live: bool) {
        let root = self.roots.get(&parent).copied().unwrap_or(pid);
        self.add_to(pid, root, live);
    }

    /// Adds `pid` to the tree of `root`.
    pub(super) fn add_to(&mut self, pid: Pid, root: Pid, live: bool) {
        self.roots.insert(pid, root);
        let tree = self.trees.entry(root).or_default();
        tree.members.insert(pid, 0);
        tree.live += usize::from(live);
    }

    /// Notes how many records `pid` has.
    pub(super) fn set_records(&mut self, pid: Pid, records: u64) {
        if let Some(root) = self.roots.get(&pid)
            && let Some(tree) = self.trees.get_mut(root)
            && let Some(member) = tree.members.get_mut(&pid)
        {
            *member = records;
        }
    }

    /// Notes a message from `from` to `to`.
    pub(super) fn sent(&mut self, from: Pid, to: Pid) {
        let (Some(a), b) = (self.roots.get(&from).copied(), self.roots.get(&to).copied()) else { return };
        if Some(a) != b
            && let Some(tree) = self.trees.get_mut(&a)
        {
            tree.sent_outside = true;
        }
    }

    /// Notes the end of `pid`, which has `records` records; the members of its tree if
    /// that was the last and the tree can go.
    fn ended(&mut self, pid: Pid, records: u64) -> Option<Vec<(Pid, u64)>> {
        self.set_records(pid, records);
        let root = *self.roots.get(&pid)?;
        let tree = self.trees.get_mut(&root)?;
        tree.live = tree.live.saturating_sub(1);
        if tree.live > 0 || tree.sent_outside {
            return None;
        }
        let tree = self.trees.remove(&root)?;
        for member in tree.members.keys() {
            self.roots.remove(member);
        }
        Some(tree.members.into_iter().collect())
    }

    /// The finished trees that sent nothing still to deliver: those of `finished` roots
    /// whose members are not in `senders`.
    pub(super) fn finished_without(&mut self, senders: &std::collections::HashSet<Pid>) -> Vec<(Pid, u64)> {
        let done: Vec<Pid> = self
            .trees
            .iter()
            .filter(|(_, tree)| tree.live == 0 && !tree.members.keys().any(|m| senders.contains(m)))
            .map(|(root, _)| *root)
            .collect();
        let mut members = Vec::new();
        for root in done {
            if let Some(tree) = self.trees.remove(&root) {
                for member in tree.members.keys() {
                    self.roots.remove(member);
                }
                members.extend(tree.members);
            }
        }
        members
    }
}

/// What a committed record lets happen.
pub(super) enum AfterCommit {
    /// A spawn, or a step with no effect.
    Nothing,
    /// A step whose yields were carried out before its commit, since they only read: its
    /// process ends if the commit fails.
    Read { cell: Arc<ProcessCell> },
    /// A step's yields and port sends, in order; `seq` is its record's. Held inline when
    /// there is one of each, as there nearly always is: a vector allocated by a worker and
    /// freed by the committing thread makes each of them take the other's `malloc` lock
    /// (docs/perf/durable.md, "A step's yields stay with its worker").
    Effects { cell: Arc<ProcessCell>, seq: u64, yields: SmallVec<[Yield; 1]>, sends: SmallVec<[PortSend; 1]> },
    /// A message from the embedder, recorded in its receiver's history as record `seq`.
    Deliver { cell: Arc<ProcessCell>, seq: u64, topic: String, body: Payload },
    /// A process's end: `None` is a termination.
    Exit { cell: Arc<ProcessCell>, result: Option<Exited> },
    /// A spawn whose spawner waits for its record
    /// ([`Handle::spawn_recorded`](super::Handle::spawn_recorded)).
    Spawned(Recorder),
    /// A message from a process of another journal, recorded in its receiver's history;
    /// `done` is told once it is delivered.
    Received { cell: Arc<ProcessCell>, message: Box<ReceivedMessage> },
}

/// A message from a process of another journal, and whom to tell once it is delivered.
pub(super) struct ReceivedMessage {
    from: Pid,
    id: u64,
    topic: String,
    body: Payload,
    done: Box<dyn FnOnce() + Send>,
}

impl Durable {
    pub(super) fn start(name: &str, journal: &Journal, snapshot_every: Option<u64>) -> std::io::Result<Durable> {
        let sync = journal.settings.durability == crate::journal::Durability::Sync;
        let on_commit: OnCommit<AfterCommit> = Box::new(|items, result| match result {
            Ok(()) => items.for_each(AfterCommit::carry_out),
            Err(error) => items.for_each(|item| item.fail(&error)),
        });
        let window = journal.settings.group_window;
        let busy_wait =
            if journal.settings.shared_cores { crate::journal::BUSY_WAIT } else { std::time::Duration::ZERO };
        let committer =
            Committer::start(name, journal.store.clone(), sync, window, busy_wait, AfterCommit::waited_for, on_commit)?;
        let trees = (!journal.settings.keep_finished).then(|| Mutex::new(Trees::default()));
        Ok(Durable {
            committer,
            journal: journal.clone(),
            max_records: journal.settings.max_records_per_process.max(2),
            snapshot_every: snapshot_every.map(|every| every.max(1)),
            trees,
            received: Mutex::new(FxHashMap::default()),
        })
    }

    pub(super) fn stats(&self) -> CommitStats {
        self.committer.stats()
    }

    /// How many records' submissions the committer has taken, and how many of them (the
    /// first ones) are durable: a process all of whose records were submitted before the
    /// first count was read has them all durable once the second reaches it.
    pub(super) fn submitted(&self) -> u64 {
        self.committer.submitted()
    }

    /// See [`Durable::submitted`].
    pub(super) fn committed(&self) -> u64 {
        self.committer.committed()
    }

    /// The journal, to read a process's history back.
    pub(super) fn journal(&self) -> &Journal {
        &self.journal
    }

    /// How many submissions' effects are still to come (see `Committer::in_flight`).
    pub(super) fn in_flight(&self) -> usize {
        self.committer.in_flight()
    }

    /// Whether the host's cores are shared with other busy threads
    /// ([`JournalSettings::shared_cores`](crate::journal::JournalSettings::shared_cores)).
    pub(super) fn shared_cores(&self) -> bool {
        self.journal.settings.shared_cores
    }

    pub(super) fn shut_down(&self) {
        self.committer.shut_down();
    }

    /// Submits `record` as the next of `cell`'s history; `then(seq)` is what its commit
    /// lets happen.
    fn submit(
        &self,
        cell: &ProcessCell,
        record: Record,
        then: impl FnOnce(u64, Record) -> AfterCommit,
    ) -> Result<(), String> {
        if cell.scheduler().suspending.load(Ordering::Acquire) {
            return Err(SUSPENDED.to_owned());
        }
        // Held across the submission when snapshots are taken, so that a record and a
        // snapshot reach the committer in the order of their sequence numbers: a record
        // numbered before a snapshot must be in the batch that removes it or an earlier
        // one, and what it carries is in the snapshot (`Durable::write_snapshot`).
        let mut slot = self.snapshot_every.map(|_| cell.journaled.lock());
        let seq = cell.journal_seq.fetch_add(1, Ordering::Relaxed);
        let held = seq - slot.as_mut().and_then(|slot| step_in(slot)).map_or(0, |step| step.snapshot_seq);
        // The exit is always allowed: a process at its limit must still be able to end.
        if held >= self.max_records && !matches!(record, Record::Exit(_)) {
            return Err(format!(
                "journal limit reached: process {} has {held} records, its journal's `max_records_per_process` \
                 (raise it with `--journal-limit`)",
                cell.pid()
            ));
        }
        if let Some(step) = slot.as_mut().and_then(|slot| step_in(slot)) {
            step.fold(seq, &record);
        }
        let key = Key { process: cell.pid().as_u64(), seq };
        let value = record.encode();
        self.committer.submit([(key, value)], then(seq, record)).map_err(|error| journal_failed(&error))
    }

    /// Writes a snapshot of `cell`'s process after its step just recorded, if one is due
    /// ([`Durable::snapshot_due`]).
    ///
    /// # Safety
    ///
    /// The caller owns the process (`Running`), between two of its steps.
    pub(super) unsafe fn snapshot_if_due(&self, cell: &ProcessCell) -> Result<(), String> {
        if !self.snapshot_due(cell) {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        let state =
            unsafe { cell.with_process(|p| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.snapshot()))) };
        let state = match state {
            Some(Ok(state)) => state,
            Some(Err(_)) => return Err("process panicked while its snapshot was taken".to_owned()),
            None => return Ok(()),
        };
        self.write_snapshot(cell, state)
    }

    /// Whether processes are snapshotted (`Builder::snapshot_every`).
    pub(super) fn takes_snapshots(&self) -> bool {
        self.snapshot_every.is_some()
    }

    /// Whether a snapshot of `cell`'s process is due: [`Builder::snapshot_every`] steps
    /// have been recorded since its last (or its spawn).
    ///
    /// [`Builder::snapshot_every`]: super::Builder::snapshot_every
    pub(super) fn snapshot_due(&self, cell: &ProcessCell) -> bool {
        let Some(every) = self.snapshot_every else { return false };
        step_in(&mut cell.journaled.lock())
            .is_some_and(|step| step.for_snapshot.is_some() && step.since_snapshot >= every)
    }

    /// Writes a snapshot of `cell`'s process, whose own state is `state`, as its next
    /// record, in one batch with the removal of every record before it. `None` for
    /// `state`: the process could not be captured now; it is asked again after as many
    /// steps again.
    pub(super) fn write_snapshot(&self, cell: &ProcessCell, state: Option<Vec<u8>>) -> Result<(), String> {
        if cell.scheduler().suspending.load(Ordering::Acquire) {
            return Err(SUSPENDED.to_owned());
        }
        let mut slot = cell.journaled.lock();
        let Some(step) = step_in(&mut slot) else { return Ok(()) };
        step.since_snapshot = 0;
        let (Some(state), Some(carried), Some(spawn)) = (state, &mut step.for_snapshot, &step.spawn) else {
            return Ok(());
        };
        // A message to a process of another journal is sent again at a recovery whatever
        // became of it (only its receiver knows): those are kept.
        let shared = cell.scheduler();
        carried.prune(|pid| pid != Pid::HOST && shared.remote_for(pid).is_none() && !shared.registry.contains(pid));
        let snapshot = SnapshotRecord {
            spawn: spawn.clone(),
            at: step.step_at,
            steps: step.steps,
            status: step.last_status.clone(),
            state,
            carried: carried.clone(),
        };
        let seq = cell.journal_seq.fetch_add(1, Ordering::Relaxed);
        let key = Key { process: cell.pid().as_u64(), seq };
        let value = Record::Snapshot(Box::new(snapshot)).encode();
        step.snapshot_seq = seq;
        self.committer
            .submit_replacing([(key, value)], vec![(cell.pid().as_u64(), seq)], AfterCommit::Nothing)
            .map_err(|error| journal_failed(&error))
    }

    /// Records the spawn of `cell`; its steps' records follow it in the same order.
    pub(super) fn record_spawn(
        &self,
        cell: &ProcessCell,
        spawn: SpawnRecord,
        recorder: Option<Recorder>,
    ) -> Result<(), String> {
        let parent = spawn.parent;
        if self.snapshot_every.is_some()
            && let Some(step) = step_in(&mut cell.journaled.lock())
        {
            step.spawn = Some(spawn.clone());
            step.for_snapshot = Some(Carried::default());
        }
        let then = |_, _| recorder.map_or(AfterCommit::Nothing, AfterCommit::Spawned);
        self.submit(cell, Record::Spawn(spawn), then)?;
        if let Some(trees) = &self.trees {
            trees.lock().add(cell.pid(), parent, true);
        }
        Ok(())
    }

    /// The process trees, for recovery to fill; `None` when finished ones are kept.
    pub(super) fn trees(&self) -> Option<&Mutex<Trees>> {
        self.trees.as_ref()
    }

    /// Removes the records of `processes`, each with how many it has.
    pub(super) fn remove(&self, processes: Vec<(Pid, u64)>) {
        if processes.is_empty() {
            return;
        }
        let removals = processes.iter().map(|(pid, records)| (pid.as_u64(), *records)).collect();
        let submitted = self.journal.removing(processes.iter().map(|(pid, _)| *pid), |floor| {
            self.committer.submit_with(floor, removals, AfterCommit::Nothing)
        });
        let error = match submitted {
            Ok(Ok(())) => return,
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        tracing::warn!(%error, "the records of finished processes were not removed");
    }

    /// Records a message from the embedder in its receiver's history, and delivers it
    /// once that is committed.
    pub(super) fn record_host_message(
        &self,
        cell: &Arc<ProcessCell>,
        topic: String,
        body: Payload,
    ) -> Result<(), String> {
        self.submit(cell, Record::HostMessage { topic, body }, |seq, record| {
            let Record::HostMessage { topic, body } = record else { unreachable!("built above") };
            AfterCommit::Deliver { cell: cell.clone(), seq, topic, body }
        })
    }

    /// Notes that `to` recorded message `id` of `from` (a process of another journal), as
    /// a recovery reads it back.
    pub(super) fn note_received(&self, from: Pid, to: Pid, id: u64) {
        let mut received = self.received.lock();
        let last = received.entry((from, to)).or_default();
        *last = (*last).max(id);
    }

    /// Records message `id` of `from`, a process of another journal, in `cell`'s history,
    /// and delivers it once that is committed, then calls `done`: unless its receiver
    /// recorded it or a later one of the same sender before (`Duplicate`), or has not yet
    /// recorded `prev`, the message its sender sent it before this one (`Early`; 0:
    /// none). A sender's identities grow in the order its messages leave, so the last
    /// one recorded is all a receiver keeps of each sender, and the messages of one
    /// sender are delivered in its order, each once.
    pub(super) fn record_received(
        &self,
        cell: &Arc<ProcessCell>,
        from: Pid,
        (id, prev): (u64, u64),
        topic: String,
        body: Payload,
        done: Box<dyn FnOnce() + Send>,
    ) -> Receipt {
        // Held across the submission: the check and the record of one receiver's messages
        // go in one order.
        let mut received = self.received.lock();
        let last = received.get(&(from, cell.pid())).copied().unwrap_or(0);
        if id <= last {
            return Receipt::Duplicate;
        }
        if prev > last {
            return Receipt::Early;
        }
        match cell.check_room(&topic, &body) {
            Ok(()) => {}
            Err(SendError::MailboxFull { .. }) => return Receipt::Full,
            Err(_) => return Receipt::NoProcess,
        }
        let record = Record::Received { from, id, topic, body };
        let submitted = self.submit(cell, record, |_, record| {
            let Record::Received { from, id, topic, body } = record else { unreachable!("built above") };
            AfterCommit::Received {
                cell: cell.clone(),
                message: Box::new(ReceivedMessage { from, id, topic, body, done }),
            }
        });
        match submitted {
            Ok(()) => {
                received.insert((from, cell.pid()), id);
                Receipt::Recording
            }
            Err(error) => Receipt::Refused(error),
        }
    }

    /// Records a step and hands its effects to the committer. On error nothing of the
    /// step has happened, and the process must end with the error. The step's vector of
    /// yields comes back, emptied, for the worker's next step.
    ///
    /// A step whose yields all only read (`Shared::reads_only`) and that sent nothing
    /// has nothing that leaves its process: its record's sequence number comes back, and
    /// its yields stay in the vector, to be carried out now. Their answers reach only the
    /// process's next steps, whose records follow this one's, so a crash that loses this
    /// record loses every step that saw them, and the step runs again from the record
    /// before.
    pub(super) fn record_step(
        &self,
        cell: &Arc<ProcessCell>,
        step: StepRecord,
    ) -> Result<(Option<u64>, Vec<Yield>), String> {
        if step.sends.len() >= YIELD_SEND_BIT as usize || step.yields.len() >= YIELD_SEND_BIT as usize {
            return Err(format!(
                "a durable step may yield, and send through its port, fewer than {YIELD_SEND_BIT} of each"
            ));
        }
        let reads_only = step.sends.is_empty()
            && !step.yields.is_empty()
            && self.committer.backlog() < READING_BACKLOG
            && step.yields.iter().all(|y| cell.scheduler().reads_only(&y.command));
        let mut back = (None, Vec::new());
        self.submit(cell, Record::Step(step), |seq, record| {
            let Record::Step(mut step) = record else { unreachable!("built above") };
            if reads_only {
                back = (Some(seq), step.yields);
                return AfterCommit::Read { cell: cell.clone() };
            }
            let item = if step.yields.is_empty() && step.sends.is_empty() {
                AfterCommit::Nothing
            } else {
                let yields = step.yields.drain(..).collect();
                AfterCommit::Effects { cell: cell.clone(), seq, yields, sends: step.sends.drain(..).collect() }
            };
            back.1 = step.yields;
            item
        })?;
        Ok(back)
    }

    /// Records the end of a process that could not be restored (it has no cell), so the
    /// next start does not try again.
    pub(super) fn record_lost_exit(&self, pid: Pid, seq: u64, reason: String) {
        let key = Key { process: pid.as_u64(), seq };
        let record = Record::Exit(Exited::new(ExitReason::Error(reason)));
        if let Err(error) = self.committer.submit([(key, record.encode())], AfterCommit::Nothing) {
            tracing::error!(%pid, %error, "the exit of a process that cannot be resumed was not recorded");
        }
    }

    /// Records the end of `cell`'s process; the committer finalises it once that is
    /// durable. Hands `result` back if the journal has failed, for the caller to finalise
    /// the process with the failure.
    pub(super) fn record_exit(&self, cell: &Arc<ProcessCell>, result: Option<Exited>) -> Result<(), String> {
        // A terminated process's exit is recorded with the reason its watchers are given.
        let recorded = match &result {
            Some(result) => result.clone(),
            None => cell.inbox.terminate_reason().unwrap_or_else(|| Exited::new(ExitReason::Terminated)),
        };
        self.submit(cell, Record::Exit(recorded), |_, _| AfterCommit::Exit { cell: cell.clone(), result })
    }
}

/// One turn of a durable process: when it began, the events it was given and the
/// identities of the messages among them.
pub(super) struct Turn {
    at: u64,
    events: Vec<Event>,
    ids: Vec<MessageId>,
}

/// What the worker calls around a durable process's step, the one way a step reaches
/// the journal: [`Durable::begin_turn`] before it, [`Durable::end_turn`] after it, and
/// [`Durable::record_finished`] once its status and yields are known. The worker holds
/// what these return without looking inside.
impl Durable {
    /// The time `cell`'s process reads in its step under way (see
    /// [`Port::step_time`](crate::Port::step_time)), in microseconds since the Unix epoch.
    pub(super) fn step_time(&self, cell: &ProcessCell) -> Option<u64> {
        step_in(&mut cell.journaled.lock()).map(|step| step.step_at)
    }

    /// The recorded seed of `cell`'s process's random numbers (see
    /// [`Port::random_seed`](crate::Port::random_seed)).
    pub(super) fn random_seed(&self, cell: &ProcessCell) -> Option<[u8; 32]> {
        step_in(&mut cell.journaled.lock()).map(|step| step.seed)
    }

    /// Begins a turn of `cell`'s step, given `events` (just drained from its inbox).
    pub(super) fn begin_turn(&self, cell: &ProcessCell, events: &[Event]) -> Turn {
        Turn { at: cell.begin_durable_turn(now_micros()), events: events.to_vec(), ids: cell.inbox.take_drained_ids() }
    }

    /// Ends a turn of `cell`'s step: the step once it has finished (not `preempted`),
    /// with the messages it sent through its port, for its record.
    pub(super) fn end_turn(&self, cell: &ProcessCell, turn: Turn, preempted: bool) -> Option<Finished> {
        cell.durable_turn(turn, preempted)
    }

    /// Records a finished step that yielded `yields` and ended with `status`: see
    /// [`Durable::record_step`].
    pub(super) fn record_finished(
        &self,
        cell: &Arc<ProcessCell>,
        step: Finished,
        yields: Vec<Yield>,
        status: Status,
    ) -> Result<(Option<u64>, Vec<Yield>), String> {
        self.record_step(cell, step.into_record(yields, status))
    }
}

/// A step of a durable process as far as its turns have gone: a preempted step spans
/// several turns ([`StepOutput::set_preempted`](super::StepOutput::set_preempted)). The
/// turns that resume it are given no events, so its record holds what it began with;
/// any a resumed turn were given would be carried to the next step's record, which
/// would then hold exactly what that step began with.
struct StepInProgress {
    /// The seed of the process's random numbers, drawn at spawn and recorded.
    seed: [u8; 32],
    /// The time of the step under way (of `init` before the first), as recorded: what
    /// the process reads as the time.
    step_at: u64,
    /// The step under way (begun, preempted, not finished).
    started: Option<(u64, Vec<Event>, Vec<MessageId>)>,
    carried: Vec<Event>,
    carried_ids: Vec<MessageId>,
    sends: Vec<PortSend>,
    /// With snapshots on: the spawn a snapshot holds, and what the records since the
    /// spawn carry for a recovery ([`Carried`]), kept up to date record by record.
    spawn: Option<SpawnRecord>,
    for_snapshot: Option<Carried>,
    /// Steps recorded since the spawn, and since the last snapshot, and the status the
    /// last ended with.
    steps: u64,
    last_status: Status,
    since_snapshot: u64,
    /// The sequence number of the last snapshot (0: none): the records it holds are
    /// those after it, which `max_records_per_process` bounds.
    snapshot_seq: u64,
}

/// A finished step, less what it yielded and its status.
pub(super) struct Finished {
    at: u64,
    events: Vec<Event>,
    ids: Vec<MessageId>,
    sends: Vec<PortSend>,
}

impl Finished {
    fn into_record(self, yields: Vec<Yield>, status: Status) -> StepRecord {
        StepRecord { at: self.at, events: self.events, message_ids: self.ids, yields, sends: self.sends, status }
    }
}

impl StepInProgress {
    fn new(seed: [u8; 32], step_at: u64) -> Box<StepInProgress> {
        Box::new(StepInProgress {
            seed,
            step_at,
            started: None,
            carried: Vec::new(),
            carried_ids: Vec::new(),
            sends: Vec::new(),
            spawn: None,
            for_snapshot: None,
            steps: 0,
            last_status: Status::Continue,
            since_snapshot: 0,
            snapshot_seq: 0,
        })
    }

    /// Adds record `seq` to what a snapshot carries, when snapshots are taken.
    fn fold(&mut self, seq: u64, record: &Record) {
        let Some(carried) = &mut self.for_snapshot else { return };
        match record {
            Record::Step(step) => {
                carried.fold(seq, step);
                self.last_status = step.status.clone();
                self.steps += 1;
                self.since_snapshot += 1;
            }
            Record::HostMessage { topic, body } => carried.host_messages.push((seq, topic.clone(), body.clone())),
            Record::Received { from, id, topic, body } => {
                carried.received.push((*from, *id, topic.clone(), body.clone()));
            }
            Record::Spawn(_) | Record::Exit(_) | Record::Snapshot(_) => {}
        }
    }
}

/// What a cell's journal slot ([`ProcessCell::journaled`]) holds: only this file fills
/// it, and only with a [`StepInProgress`].
type Slot = Option<Box<dyn Any + Send>>;

/// The step under way in `slot`, if the process has one.
fn step_in(slot: &mut Slot) -> Option<&mut StepInProgress> {
    slot.as_mut().map(|state| state.downcast_mut().expect("a cell's journal slot holds its step in progress"))
}

/// The step under way in `slot`, begun (with a fresh seed, at `now`) if the process has
/// none.
fn step_or_begin(slot: &mut Slot, now: impl FnOnce() -> u64) -> &mut StepInProgress {
    let state = slot.get_or_insert_with(|| StepInProgress::new(draw_seed(), now()));
    state.downcast_mut().expect("a cell's journal slot holds its step in progress")
}

/// `carried` followed by `fresh`, without a new allocation when nothing was carried (a
/// step that was not preempted: nearly every one).
fn prepend<T>(mut carried: Vec<T>, fresh: Vec<T>) -> Vec<T> {
    if carried.is_empty() {
        return fresh;
    }
    carried.extend(fresh);
    carried
}

/// A fresh seed for a durable process's random numbers.
pub(super) fn draw_seed() -> [u8; 32] {
    let mut seed = [0; 32];
    if let Err(error) = getrandom::fill(&mut seed) {
        // The seed is recorded, so replay never depends on this: a fixed seed only makes
        // this process's random numbers predictable, which the log says.
        tracing::error!(%error, "no randomness for a durable process's seed; it reads predictable numbers");
    }
    seed
}

impl ProcessCell {
    /// Begins the process's journal as its spawn records it (or as recovery reads it
    /// back): the seed of its random numbers, and the time its `init` reads.
    pub(super) fn begin_journal(&self, seed: [u8; 32], at: u64) {
        let state: Box<dyn Any + Send> = StepInProgress::new(seed, at);
        *self.journaled.lock() = Some(state);
    }

    /// Takes up, with snapshots on, what `cell`'s history read back says a snapshot
    /// carries: its spawn, its last snapshot (with its sequence number) and the records
    /// after it, for the next snapshot. Called after
    /// [`ProcessCell::begin_journal`].
    pub(super) fn resume_carried(
        &self,
        spawn: &SpawnRecord,
        snapshot: Option<(u64, &SnapshotRecord)>,
        after: impl Iterator<Item = (u64, Record)>,
    ) {
        let mut slot = self.journaled.lock();
        let Some(step) = step_in(&mut slot) else { return };
        step.spawn = Some(spawn.clone());
        step.for_snapshot = Some(snapshot.map(|(_, s)| s.carried.clone()).unwrap_or_default());
        if let Some((seq, snapshot)) = snapshot {
            step.snapshot_seq = seq;
            step.steps = snapshot.steps;
            step.last_status = snapshot.status.clone();
        }
        for (seq, record) in after {
            step.fold(seq, &record);
        }
    }

    /// Sets the time the step about to be replayed reads: the recorded time of that step.
    pub(super) fn set_replayed_step_time(&self, at: u64) {
        if let Some(step) = step_in(&mut self.journaled.lock()) {
            step.step_at = at;
        }
    }

    /// The time of the turn about to run: now, unless it resumes a preempted step, whose
    /// time is the time the step began. What the process reads as the time meanwhile.
    pub(super) fn begin_durable_turn(&self, now: u64) -> u64 {
        let mut slot = self.journaled.lock();
        let step = step_or_begin(&mut slot, || now);
        if step.started.is_none() {
            step.step_at = now;
        }
        step.step_at
    }

    /// Adds a turn to the step under way (its port sends are kept there as they are
    /// made, see [`keep_port_send`]); the step once it has finished (`preempted` false),
    /// for its record.
    fn durable_turn(&self, turn: Turn, preempted: bool) -> Option<Finished> {
        let mut slot = self.journaled.lock();
        let step = step_or_begin(&mut slot, || turn.at);
        match &mut step.started {
            None => {
                let events = prepend(std::mem::take(&mut step.carried), turn.events);
                let ids = prepend(std::mem::take(&mut step.carried_ids), turn.ids);
                step.started = Some((turn.at, events, ids));
            }
            Some(_) => {
                step.carried.extend(turn.events);
                step.carried_ids.extend(turn.ids);
            }
        }
        if preempted {
            return None;
        }
        let (at, events, ids) = step.started.take().expect("set above");
        let sends = std::mem::take(&mut step.sends);
        Some(Finished { at, events, ids, sends })
    }
}

impl AfterCommit {
    /// Whether anything waits for this item's commit: a process for its effects or its
    /// messages, the embedder for a result. A spawn's record, a step with no effect, a
    /// step whose reads have gone on and a removal let nothing happen (a process waits
    /// for its steps' effects, which come with its next records).
    fn waited_for(&self) -> bool {
        !matches!(self, AfterCommit::Nothing | AfterCommit::Read { .. })
    }

    fn carry_out(self) {
        match self {
            AfterCommit::Nothing | AfterCommit::Read { .. } => {}
            AfterCommit::Spawned(recorder) => recorder.set(Ok(())),
            AfterCommit::Effects { cell, seq, yields, sends } => {
                let shared = cell.scheduler().clone();
                if let Some(trees) = shared.durable.as_ref().and_then(Durable::trees) {
                    let mut trees = trees.lock();
                    let to_yields = yields.iter().filter_map(|y| match &y.command {
                        crate::step::Command::Send { to, .. } => Some(*to),
                        _ => None,
                    });
                    for to in sends.iter().map(|(to, _, _)| *to).chain(to_yields) {
                        trees.sent(cell.pid(), to);
                    }
                }
                for (index, (to, topic, body)) in sends.into_iter().enumerate() {
                    let id = port_send_id(seq, index);
                    if let Err(error) = shared.send(cell.pid(), to, topic, body, Some(id)) {
                        shared.count(|c| &c.undelivered, 1);
                        tracing::debug!(from = %cell.pid(), %to, %error, "a message sent through a port was not delivered");
                    }
                }
                for (index, y) in yields.into_iter().enumerate() {
                    shared.dispatch_from(&cell, y, Some(Origin { seq, index: index as u32 }));
                }
            }
            AfterCommit::Deliver { cell, seq, topic, body } => {
                let shared = cell.scheduler().clone();
                if let Err(error) = shared.send(Pid::HOST, cell.pid(), topic, body, Some(seq)) {
                    shared.count(|c| &c.undelivered, 1);
                    tracing::debug!(to = %cell.pid(), %error, "a message from the embedder was not delivered");
                }
            }
            AfterCommit::Received { cell, message } => {
                let ReceivedMessage { from, id, topic, body, done } = *message;
                let shared = cell.scheduler().clone();
                // Its room was checked when it was recorded: it is delivered whatever came
                // into the mailbox since, which the messages recorded and not yet
                // committed bound (a cluster's inbox keeps them few, see `inbox.rs`).
                let unbounded = MailboxBound { messages: usize::MAX, bytes: usize::MAX };
                let event = Event::Message { sender: from, topic, body };
                match cell.inbox.push_identified(event, unbounded, Some((from, id))) {
                    Ok(()) => {
                        shared.count(|c| &c.messages, 1);
                        if cell.state.wake() == Wake::Schedule {
                            shared.schedule(cell.clone());
                        }
                    }
                    // It has ended since: as a message to an ended process, not delivered.
                    Err(_) => shared.count(|c| &c.undelivered, 1),
                }
                done();
            }
            AfterCommit::Exit { cell, result } => {
                let shared = cell.scheduler().clone();
                shared.finalize(&cell, result);
                if let Some(durable) = &shared.durable
                    && let Some(trees) = durable.trees()
                {
                    let records = cell.journal_seq.load(Ordering::Relaxed);
                    let finished = trees.lock().ended(cell.pid(), records);
                    durable.remove(finished.unwrap_or_default());
                }
            }
        }
    }

    fn fail(self, error: &CommitError) {
        let reason = journal_failed(error);
        match self {
            AfterCommit::Nothing | AfterCommit::Deliver { .. } | AfterCommit::Received { .. } => {}
            AfterCommit::Spawned(recorder) => recorder.set(Err(reason)),
            AfterCommit::Effects { cell, .. } | AfterCommit::Read { cell } => {
                let _ = cell.scheduler().clone().terminate_cell(&cell, ExitReason::Error(reason));
            }
            AfterCommit::Exit { cell, .. } => {
                let error = format!("{reason}; the result was not recorded");
                cell.scheduler().clone().finalize(&cell, Some(ExitReason::Error(error).into()));
            }
        }
    }
}

/// The result a durable process reports when its scheduler stops: it is not ended.
pub(super) const SUSPENDED: &str =
    "suspended: the host stopped; the process resumes when a host starts with its journal";

/// How the reason of a process ended by its journal's refusal begins.
const JOURNAL_FAILED: &str = "journal failed: ";

fn journal_failed(error: &CommitError) -> String {
    format!("{JOURNAL_FAILED}{error}")
}

/// Whether `reason` is an end its journal does not hold: the process was suspended with
/// its host (`lifecycle::suspended`), or ended because its journal refused a commit (a store fenced by another
/// owner, a full disk). Whoever reads the journal next finds the process's true state
/// there, so such an end must not be reported as the process's result.
pub(crate) fn unrecorded(reason: &ExitReason) -> bool {
    match reason {
        ExitReason::Shutdown => true,
        ExitReason::Error(message) => message == SUSPENDED || message.starts_with(JOURNAL_FAILED),
        _ => false,
    }
}
