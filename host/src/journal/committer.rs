//! Group commit: one thread writes what every worker submitted since its last commit in
//! one batch and one sync, then carries out the submissions, committed or failed, before
//! it takes the next group. What is submitted meanwhile joins that next group, which only
//! grows for the wait.
//!
//! The items are carried out on the committing thread because it is awake at that moment
//! anyway: handing them to a thread of their own, so that the next sync overlapped them,
//! cost a wake-up and two context switches a commit, on cores the workers need, to
//! overlap a few microseconds of effects with a sync of a hundred (docs/perf/durable.md).
//!
//! A submission is its records and an item (what to do once they are durable). Items are
//! carried out in submission order, and a submission is never carried out before every
//! earlier one: so what one process submits commits in order, and a record submitted
//! after another is never durable without it.
//!
//! After a failed commit the committer takes nothing more: every later submission is
//! refused with the first failure, since what the store holds after a failed write is
//! unknown to it.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::store::{Batch, Began, Done, Key, Store};

/// Why a submission was not made durable: the store's failure, shared by every
/// submission of the failed batch and refused after it.
pub type CommitError = Arc<io::Error>;

/// What the committer does with each committed (or failed) group, on its thread.
pub(crate) type OnCommit<T> = Box<dyn FnMut(std::vec::Drain<'_, T>, Result<(), CommitError>) + Send>;

/// Counts of the committer's work since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Batches written.
    pub commits: u64,
    /// Records in them.
    pub records: u64,
    /// Bytes of record values in them.
    pub bytes: u64,
}

pub(crate) struct Committer<T> {
    shared: Arc<Shared<T>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared<T> {
    pending: Mutex<Pending<T>>,
    /// Submissions not yet carried out (queued, being committed, or being carried out).
    in_flight: AtomicUsize,
    /// Submissions whose records are durable, in submission order: the first this many
    /// submitted (see [`Committer::submitted`]).
    committed: AtomicU64,
    wake: Condvar,
    store: Arc<dyn Store>,
    sync: bool,
    window: Duration,
    /// How long, after a group of [`BUSY_GROUP`] items or more, the next waits to be as
    /// large (zero: it does not wait).
    busy_wait: Duration,
    /// Whether anything waits for an item's commit (see [`Committer::start`]).
    waited_for: fn(&T) -> bool,
}

struct Pending<T> {
    batch: Batch,
    items: Vec<T>,
    /// Something waits for an item of this group.
    waited_for: bool,
    /// Wake the committer once the group holds this many items (0: never for its size).
    wake_at: usize,
    failed: Option<CommitError>,
    shut_down: bool,
    stats: CommitStats,
    /// Submissions taken so far.
    submitted: u64,
}

/// How long a group that nothing waits for waits for company: for something waited for
/// to join it, or for [`UNHURRIED_ITEMS`] items. Such a group (steps that only read,
/// removals) commits its records to make them durable, not to let anything happen, so
/// fewer, larger commits (fewer syncs, fewer wake-ups) cost it nothing; what a crash
/// meanwhile loses runs again.
const UNHURRIED_WAIT: Duration = Duration::from_millis(1);

/// The most items a group that nothing waits for gathers before it commits.
const UNHURRIED_ITEMS: usize = 1024;

/// A group of at least this many items shows a busy journal (see [`BUSY_WAIT`]).
const BUSY_GROUP: usize = 16;

/// How long, after a group of [`BUSY_GROUP`] items or more, the next waits to be as large
/// before it commits, on a host whose cores other busy threads share
/// ([`JournalSettings::shared_cores`](super::JournalSettings::shared_cores)). Many
/// processes are then stepping and submitting, and each commit costs a sync, whose CPU
/// (the kernel's, and a virtual machine's exits to its host) those threads could use:
/// fewer, larger commits leave the cores to the work. A journal that is not busy commits
/// at once, so a lone workflow's latency is untouched; a busy one's records wait at most
/// this long more. Where the scheduler has the cores to itself, the wait is only lost.
pub(crate) const BUSY_WAIT: Duration = Duration::from_millis(1);

impl<T: Send + 'static> Committer<T> {
    /// Starts the committer's thread. `window`: how long it waits after the first
    /// submission of a group for more to join it (zero: commit at once; what arrives
    /// while a commit runs forms the next group either way). `waited_for`: whether
    /// anything waits for an item's commit; a group of items nothing waits for waits up
    /// to [`UNHURRIED_WAIT`] for more.
    pub(crate) fn start(
        name: &str,
        store: Arc<dyn Store>,
        sync: bool,
        window: Duration,
        busy_wait: Duration,
        waited_for: fn(&T) -> bool,
        on_commit: OnCommit<T>,
    ) -> io::Result<Committer<T>> {
        let shared = Arc::new(Shared {
            in_flight: AtomicUsize::new(0),
            pending: Mutex::new(Pending {
                batch: Batch::default(),
                items: Vec::new(),
                waited_for: false,
                wake_at: 0,
                failed: None,
                shut_down: false,
                stats: CommitStats::default(),
                submitted: 0,
            }),
            committed: AtomicU64::new(0),
            wake: Condvar::new(),
            store,
            sync,
            window,
            busy_wait,
            waited_for,
        });
        let committing = shared.clone();
        let thread =
            std::thread::Builder::new().name(format!("{name}-journal")).spawn(move || committing.run(on_commit))?;
        Ok(Committer { shared, thread: Mutex::new(Some(thread)) })
    }

    /// Queues `records` for the next group, and `item` to carry out once they are
    /// durable.
    ///
    /// # Errors
    ///
    /// The failure of an earlier commit (nothing more is taken after one), or an
    /// `io::ErrorKind::BrokenPipe` error once the committer has shut down.
    pub(crate) fn submit(&self, records: impl IntoIterator<Item = (Key, Vec<u8>)>, item: T) -> Result<(), CommitError> {
        self.submit_with(records, Vec::new(), item)
    }

    /// As [`Committer::submit`], also removing every record of `removals` in the same
    /// batch.
    pub(crate) fn submit_with(
        &self,
        records: impl IntoIterator<Item = (Key, Vec<u8>)>,
        removals: Vec<(u64, u64)>,
        item: T,
    ) -> Result<(), CommitError> {
        self.submit_removing(records, removals, false, item)
    }

    /// As [`Committer::submit_with`], for `records` (a snapshot) that replace those
    /// `removals` remove: records of the removed ranges still waiting for their group
    /// are dropped from it, so that every record the removals cover is gone once the
    /// batch is written, whichever group it was submitted to.
    pub(crate) fn submit_replacing(
        &self,
        records: impl IntoIterator<Item = (Key, Vec<u8>)>,
        removals: Vec<(u64, u64)>,
        item: T,
    ) -> Result<(), CommitError> {
        self.submit_removing(records, removals, true, item)
    }

    fn submit_removing(
        &self,
        records: impl IntoIterator<Item = (Key, Vec<u8>)>,
        removals: Vec<(u64, u64)>,
        replacing: bool,
        item: T,
    ) -> Result<(), CommitError> {
        let mut pending = self.shared.pending.lock();
        if let Some(error) = &pending.failed {
            return Err(error.clone());
        }
        if pending.shut_down {
            return Err(Arc::new(io::Error::new(io::ErrorKind::BrokenPipe, "the journal has shut down")));
        }
        let was_empty = pending.items.is_empty();
        // The committer waits for this one if it is the first of a group, or the first
        // waited for of a group that nothing waited for, or if it fills an unhurried one.
        let waited_for = (self.shared.waited_for)(&item);
        let wake = was_empty
            || waited_for && !pending.waited_for
            || !pending.waited_for && pending.items.len() + 1 == UNHURRIED_ITEMS
            || pending.items.len() + 1 == pending.wake_at;
        pending.waited_for |= waited_for;
        pending.submitted += 1;
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        if replacing {
            // A batch applies its removals before its puts: a record of this group that
            // the removal covers goes now, or it would outlive the snapshot.
            for &(process, count) in &removals {
                pending.batch.puts.retain(|(key, _)| key.process != process || key.seq >= count);
            }
        }
        pending.batch.puts.extend(records);
        pending.batch.removals.extend(removals);
        pending.items.push(item);
        drop(pending);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> CommitStats {
        self.shared.pending.lock().stats
    }

    /// How many submissions have not been carried out yet: their effects, which may wake
    /// processes, are still to come.
    pub(crate) fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// How many submissions it has taken so far. Once [`Committer::committed`] reaches
    /// this count, every record submitted before this call is durable.
    pub(crate) fn submitted(&self) -> u64 {
        self.shared.pending.lock().submitted
    }

    /// How many submissions, the first ones, have their records durable.
    pub(crate) fn committed(&self) -> u64 {
        self.shared.committed.load(Ordering::Acquire)
    }

    /// How many submissions have not been carried out yet.
    pub(crate) fn backlog(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Commits what is pending, stops the thread and waits for it.
    pub(crate) fn shut_down(&self) {
        self.shared.pending.lock().shut_down = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            join(thread);
        }
    }
}

impl<T> Drop for Committer<T> {
    fn drop(&mut self) {
        self.shared.pending.lock().shut_down = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.get_mut().take() {
            join(thread);
        }
    }
}

/// Waits for the committing thread, unless this is it: the last reference to what owns
/// the committer may be dropped by an item it carries out, and a thread cannot wait for
/// itself (it exits on its own once it sees the shutdown).
fn join(thread: JoinHandle<()>) {
    if thread.thread().id() != std::thread::current().id() {
        // The thread contains the panics of `on_commit`; a panic here is a bug in the
        // committer itself, already reported by the panic hook.
        let _ = thread.join();
    }
}

/// A group begun and not yet carried out.
struct Flight<T> {
    outcome: Outcome,
    batch: Batch,
    items: Vec<T>,
}

/// Where a group's outcome is.
enum Outcome {
    /// Known when it began: an empty group, written by nothing, or one committed at once
    /// by [`Store::commit`].
    Known(io::Result<()>),
    /// Begun by [`Store::begin`]; `known` is set (under the pending lock's notification)
    /// once [`Store::finish`] can take the outcome without waiting.
    Begun { began: Began, known: Arc<AtomicBool> },
}

impl<T> Flight<T> {
    fn known(&self) -> bool {
        match &self.outcome {
            Outcome::Known(_) => true,
            Outcome::Begun { known, .. } => known.load(Ordering::Acquire),
        }
    }
}

impl<T: Send + 'static> Shared<T> {
    /// The committer's loop. It begins a group whenever the store has room for another
    /// commit in flight ([`Store::depth`]) and a group is ready, and carries out the
    /// oldest group in flight once its outcome is known: so groups are carried out in
    /// the order they were begun, and with a store of depth 1 one group is written while
    /// the next gathers, as before pipelining.
    fn run(self: &Arc<Self>, mut on_commit: OnCommit<T>) {
        // The emptied vectors of groups carried out take the place of the pending ones,
        // so a group grows into room an earlier one made instead of from nothing.
        let mut spares: Vec<(Batch, Vec<T>)> = Vec::new();
        let mut flights: std::collections::VecDeque<Flight<T>> = std::collections::VecDeque::new();
        // The last group's size: a busy journal's next group waits to be as large.
        let mut last_group = 0usize;
        // When the pending group was first found ready to begin, and when its wait for
        // company (if nothing waits for it) ended: the window counts from there.
        let mut noticed: Option<Instant> = None;
        let mut gathered: Option<Instant> = None;
        let mut pending = self.pending.lock();
        loop {
            if flights.front().is_some_and(Flight::known) {
                let Flight { outcome, mut batch, mut items } = flights.pop_front().expect("a flight");
                drop(pending);
                let result = match outcome {
                    Outcome::Known(result) => result,
                    Outcome::Begun { began, .. } => self.store.finish(began),
                }
                .map_err(Arc::new);
                pending = self.pending.lock();
                let result = match (&pending.failed, result) {
                    // After a failure nothing more is acknowledged, whatever the store
                    // says of a later group: what it holds is unknown.
                    (Some(failed), _) => Err(failed.clone()),
                    (None, Ok(())) => {
                        pending.stats.commits += 1;
                        pending.stats.records += batch.puts.len() as u64;
                        pending.stats.bytes += batch.bytes() as u64;
                        Ok(())
                    }
                    (None, Err(error)) => {
                        tracing::error!(%error, "the journal's store failed a commit: no more durable work is accepted");
                        pending.failed = Some(error.clone());
                        Err(error)
                    }
                };
                drop(pending);
                let count = items.len();
                if result.is_ok() {
                    self.committed.fetch_add(count as u64, Ordering::Release);
                }
                call(&mut on_commit, &mut items, result);
                self.in_flight.fetch_sub(count, Ordering::Release);
                batch.puts.clear();
                batch.removals.clear();
                spares.push((batch, items));
                pending = self.pending.lock();
                continue;
            }
            if pending.items.is_empty() {
                noticed = None;
                gathered = None;
                if flights.is_empty() && pending.shut_down {
                    return;
                }
                self.wake.wait(&mut pending);
                continue;
            }
            if pending.failed.is_some() {
                // What was submitted after the failed group is refused with it, after the
                // groups in flight (refused too), in submission order.
                if !flights.is_empty() {
                    self.wake.wait(&mut pending);
                    continue;
                }
                let failed = pending.failed.clone().expect("a failure");
                let mut items = std::mem::take(&mut pending.items);
                pending.batch = Batch::default();
                drop(pending);
                let count = items.len();
                call(&mut on_commit, &mut items, Err(failed));
                self.in_flight.fetch_sub(count, Ordering::Release);
                pending = self.pending.lock();
                continue;
            }
            if flights.len() >= self.store.depth().max(1) {
                self.wake.wait(&mut pending);
                continue;
            }
            // Behind a group in flight, a group begins once it is as large as that one:
            // commits overlap when there is work enough for them, and groups do not
            // shrink into many small commits, each of which costs the store and the
            // server as much as a large one.
            if let Some(ahead) = flights.back()
                && pending.items.len() < ahead.items.len()
                && !pending.shut_down
            {
                pending.wake_at = ahead.items.len();
                self.wake.wait(&mut pending);
                pending.wake_at = 0;
                continue;
            }
            let now = Instant::now();
            let since = *noticed.get_or_insert(now);
            if !pending.waited_for && !pending.shut_down && pending.items.len() < UNHURRIED_ITEMS {
                let deadline = since + UNHURRIED_WAIT;
                if now < deadline {
                    self.wake.wait_until(&mut pending, deadline);
                    continue;
                }
            }
            let from = *gathered.get_or_insert(now);
            if !self.window.is_zero() && !pending.shut_down && now < from + self.window {
                self.wake.wait_until(&mut pending, from + self.window);
                continue;
            }
            if !self.busy_wait.is_zero()
                && last_group >= BUSY_GROUP
                && pending.items.len() < last_group
                && !pending.shut_down
                && now < from + self.busy_wait
            {
                pending.wake_at = last_group;
                self.wake.wait_until(&mut pending, from + self.busy_wait);
                pending.wake_at = 0;
                continue;
            }
            noticed = None;
            gathered = None;
            pending.waited_for = false;
            let (spare_batch, spare_items) = spares.pop().unwrap_or_default();
            let batch = std::mem::replace(&mut pending.batch, spare_batch);
            let items = std::mem::replace(&mut pending.items, spare_items);
            last_group = items.len();
            drop(pending);
            let outcome = if batch.is_empty() {
                Outcome::Known(Ok(()))
            } else if flights.is_empty() && self.store.depth() <= 1 {
                // One commit at a time: written here, as `begin` would, without the
                // allocations that carry an outcome from another thread.
                Outcome::Known(self.store.commit(&batch, self.sync))
            } else {
                let known = Arc::new(AtomicBool::new(false));
                let (told, shared) = (known.clone(), Arc::downgrade(self));
                let done = Done::new(move || {
                    told.store(true, Ordering::Release);
                    // Under the lock, so the committer cannot miss it between its look
                    // at the flag and its wait.
                    if let Some(shared) = shared.upgrade() {
                        let _pending = shared.pending.lock();
                        shared.wake.notify_one();
                    }
                });
                Outcome::Begun { began: self.store.begin(&batch, self.sync, done), known }
            };
            flights.push_back(Flight { outcome, batch, items });
            pending = self.pending.lock();
        }
    }
}

fn call<T>(on_commit: &mut OnCommit<T>, items: &mut Vec<T>, result: Result<(), CommitError>) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| on_commit(items.drain(..), result))) {
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        tracing::error!(panic = message, "handling a committed group panicked");
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;

    use super::*;
    use crate::journal::MemoryStore;

    /// A store in memory that can be told to fail.
    #[derive(Default)]
    struct Faulty {
        store: MemoryStore,
        fail: AtomicBool,
        syncs: Mutex<Vec<bool>>,
    }

    impl Store for Faulty {
        fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(io::Error::other("disk on fire"));
            }
            self.syncs.lock().push(sync);
            self.store.commit(batch, sync)
        }

        fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
            self.store.scan(from, visit)
        }
    }

    /// Whether `store` holds `key`.
    fn holds(store: &MemoryStore, key: Key) -> bool {
        let mut found = false;
        store
            .scan(key, &mut |k, _| {
                found = k == key;
                ControlFlow::Break(())
            })
            .unwrap();
        found
    }

    fn key(process: u64, seq: u64) -> Key {
        Key { process, seq }
    }

    /// What every commit must do: succeed, its items sent back as they come.
    fn sent_back() -> (OnCommit<u64>, mpsc::Receiver<u64>) {
        let (tx, rx) = mpsc::channel();
        let on_commit: OnCommit<u64> = Box::new(move |items, result| {
            result.unwrap();
            items.for_each(|item| tx.send(item).unwrap());
        });
        (on_commit, rx)
    }

    #[test]
    fn items_come_back_in_order_once_their_records_are_in_the_store() {
        let store = Arc::new(Faulty::default());
        let (tx, rx) = mpsc::channel();
        let seen = store.clone();
        let on_commit: OnCommit<u64> = Box::new(move |items, result| {
            result.unwrap();
            for item in items {
                // The item's record is in the store before the item comes back.
                assert!(holds(&seen.store, key(1, item)));
                tx.send(item).unwrap();
            }
        });
        let committer = Committer::start(
            "test",
            store.clone(),
            true,
            Duration::from_micros(200),
            Duration::ZERO,
            |_| true,
            on_commit,
        )
        .unwrap();
        for seq in 0..1000 {
            committer.submit([(key(1, seq), vec![seq as u8])], seq).unwrap();
        }
        let back: Vec<u64> = (0..1000).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        assert_eq!(back, (0..1000).collect::<Vec<_>>());
        let stats = committer.stats();
        assert_eq!(stats.records, 1000);
        assert!(stats.commits < 1000, "submissions are grouped: {stats:?}");
        assert!(store.syncs.lock().iter().all(|&sync| sync));
        committer.shut_down();
    }

    #[test]
    fn items_nothing_waits_for_commit_on_their_own_and_in_order_with_the_others() {
        let store = Arc::new(Faulty::default());
        let (on_commit, rx) = sent_back();
        // Every tenth item is waited for; the last one, alone, is not.
        let committer = Committer::start(
            "test",
            store.clone(),
            true,
            Duration::ZERO,
            Duration::ZERO,
            |item| item % 10 == 9,
            on_commit,
        )
        .unwrap();
        for seq in 0..=100 {
            committer.submit([(key(1, seq), vec![seq as u8])], seq).unwrap();
        }
        let back: Vec<u64> = (0..=100).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        assert_eq!(back, (0..=100).collect::<Vec<_>>());
        assert!(holds(&store.store, key(1, 100)));
        committer.shut_down();
    }

    /// With the wait of a busy journal (`JournalSettings::shared_cores`), submitters at
    /// once: every item comes back once, each submitter's in its order, and the groups
    /// gather several items each.
    #[test]
    fn a_busy_journal_gathers_larger_groups_and_loses_nothing() {
        let store = Arc::new(Faulty::default());
        let (on_commit, rx) = sent_back();
        let committer = Arc::new(
            Committer::start("test", store.clone(), true, Duration::ZERO, BUSY_WAIT, |_| true, on_commit).unwrap(),
        );
        let (submitters, each) = (4u64, 400u64);
        let threads: Vec<_> = (0..submitters)
            .map(|who| {
                let committer = committer.clone();
                std::thread::spawn(move || {
                    for seq in 0..each {
                        committer.submit([(key(who + 1, seq), vec![seq as u8])], who * each + seq).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let back: Vec<u64> =
            (0..submitters * each).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        for who in 0..submitters {
            let mine: Vec<u64> = back.iter().copied().filter(|item| item / each == who).collect();
            assert_eq!(mine, (who * each..(who + 1) * each).collect::<Vec<_>>(), "submitter {who}'s items, in order");
        }
        let stats = committer.stats();
        assert_eq!(stats.records, submitters * each);
        assert!(stats.commits < stats.records, "groups of one item each: {stats:?}");
        committer.shut_down();
    }

    #[test]
    fn after_a_failed_commit_nothing_is_acknowledged_and_nothing_more_taken() {
        let store = Arc::new(Faulty::default());
        store.fail.store(true, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        let on_commit: OnCommit<u64> = Box::new(move |items, result| {
            tx.send((items.collect::<Vec<_>>(), result.map_err(|e| e.to_string()))).unwrap();
        });
        let committer =
            Committer::start("test", store.clone(), true, Duration::ZERO, Duration::ZERO, |_| true, on_commit).unwrap();
        committer.submit([(key(1, 0), vec![1])], 7).unwrap();
        let (items, result) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(items, vec![7]);
        assert_eq!(result, Err("disk on fire".to_owned()));
        store.fail.store(false, Ordering::SeqCst);
        let refused = committer.submit([(key(1, 1), vec![1])], 8).unwrap_err();
        assert_eq!(refused.to_string(), "disk on fire");
        assert!(store.store.is_empty());
    }

    /// A store with commits in flight together, each answered by a thread of its own
    /// after a pause that shrinks with its number: later commits are answered first. The
    /// `fail_at`th commit (from 1) fails.
    struct Pipelined {
        store: MemoryStore,
        begun: AtomicUsize,
        fail_at: usize,
    }

    impl Store for Pipelined {
        fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()> {
            self.store.commit(batch, sync)
        }

        fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
            self.store.scan(from, visit)
        }

        fn depth(&self) -> usize {
            3
        }

        fn begin(&self, batch: &Batch, sync: bool, done: Done) -> Began {
            let number = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
            let outcome =
                if number == self.fail_at { Err(io::Error::other("refused")) } else { self.store.commit(batch, sync) };
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(300 * (3 - number as u64 % 3)));
                done.call();
            });
            Began(Box::new(outcome))
        }
    }

    #[test]
    fn commits_in_flight_together_are_carried_out_in_order_and_a_failure_stops_the_rest() {
        let store = Arc::new(Pipelined { store: MemoryStore::new(), begun: AtomicUsize::new(0), fail_at: 40 });
        let (tx, rx) = mpsc::channel();
        let on_commit: OnCommit<u64> = Box::new(move |items, result| {
            let ok = result.is_ok();
            items.for_each(|item| tx.send((item, ok)).unwrap());
        });
        let committer =
            Committer::start("test", store.clone(), true, Duration::ZERO, Duration::ZERO, |_| true, on_commit).unwrap();
        let mut refused = 0;
        for seq in 0..2000 {
            if committer.submit([(key(1, seq), vec![1])], seq).is_err() {
                refused += 1;
            }
            if seq % 7 == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let back: Vec<(u64, bool)> =
            (0..2000 - refused).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        let items: Vec<u64> = back.iter().map(|&(item, _)| item).collect();
        assert_eq!(items, (0..2000 - refused).collect::<Vec<_>>(), "carried out in submission order");
        // Every item is acknowledged up to the failed group, and none after it.
        let first_refused = back.iter().position(|&(_, ok)| !ok).expect("the 40th commit failed");
        assert!(back[first_refused..].iter().all(|&(_, ok)| !ok));
        assert!(store.begun.load(Ordering::SeqCst) >= 40);
        committer.shut_down();
    }

    #[test]
    fn shut_down_commits_what_is_pending() {
        let store = Arc::new(Faulty::default());
        let on_commit: OnCommit<()> = Box::new(|_, result| result.unwrap());
        let committer = Committer::start(
            "test",
            store.clone(),
            false,
            Duration::from_secs(60),
            Duration::ZERO,
            |_| true,
            on_commit,
        )
        .unwrap();
        committer.submit([(key(2, 0), vec![1]), (key(2, 1), vec![2])], ()).unwrap();
        committer.shut_down();
        assert_eq!(store.store.len(), 2);
        assert!(committer.submit([(key(2, 2), vec![3])], ()).is_err());
    }
}
