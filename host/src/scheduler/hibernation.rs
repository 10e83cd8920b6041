//! Which waiting processes give memory back ([`Process::hibernate`]), and when.
//!
//! A process that could give memory back while it waits is listed after its step
//! (`Shared::list_for_hibernation`), and a worker with nothing to run takes the list
//! (`worker.rs`, "Hibernation"). It hibernates only the processes that have waited for
//! [`HIBERNATE_AFTER`] since a worker first saw them listed: a wait that short is most
//! likely a round trip under way (a durable process's commit, an answer from a process
//! on the other worker), after which the process would fault the pages straight back
//! in, paying a `madvise` and its TLB shootdown, then page faults, for every wait. A
//! worker that parks with processes listed sets its alarm for when the oldest is due.
//!
//! The first sighting is stamped by the worker that looks, not at the listing, so a
//! listing (once a wait, on the step's hot path) reads no clock.
//!
//! [`Process::hibernate`]: super::Process::hibernate

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use wasmproc_types::Pid;

/// The default of [`Builder::hibernate_after`](super::Builder::hibernate_after), 10 ms:
/// how long a listed process must have waited before it hibernates. A commit of the
/// journal, or a round trip through another worker, takes well under a millisecond; a
/// process that waits longer than this is waiting for something slow (a timer, a
/// message, a provider), and what its stack's pages cost it to fault back in is small
/// against that wait. Picked from those two orders of magnitude, not tuned further.
pub const HIBERNATE_AFTER: Duration = Duration::from_millis(10);

/// The listed processes: at most one entry a live process (see
/// `Shared::list_for_hibernation`), plus ended ones until they are pruned.
pub(super) struct Hibernating {
    /// How long a listed process must have waited before it hibernates.
    after: Duration,
    /// Listed since a worker last looked.
    fresh: Vec<Pid>,
    /// Seen listed by a worker at the instant beside each, the earliest first. (Two
    /// workers that put entries back at once may leave a few out of order: such an
    /// entry only hibernates a little early or late.)
    seen: VecDeque<(Pid, Instant)>,
}

impl Default for Hibernating {
    fn default() -> Self {
        Hibernating::new(HIBERNATE_AFTER)
    }
}

impl Hibernating {
    /// An empty list whose processes hibernate once they have waited `after`.
    pub(super) fn new(after: Duration) -> Self {
        Hibernating { after, fresh: Vec::new(), seen: VecDeque::new() }
    }

    /// Entries, live and ended.
    pub(super) fn len(&self) -> usize {
        self.fresh.len() + self.seen.len()
    }

    /// Lists `pid` (after a step that ended waiting).
    pub(super) fn push(&mut self, pid: Pid) {
        self.fresh.push(pid);
    }

    /// Keeps the entries `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(Pid) -> bool) {
        self.fresh.retain(|&pid| keep(pid));
        self.seen.retain(|&(pid, _)| keep(pid));
    }

    /// Stamps the fresh entries as seen at `now`, and takes the entries seen at least
    /// its threshold before `now`, the earliest first.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<(Pid, Instant)> {
        self.seen.extend(self.fresh.drain(..).map(|pid| (pid, now)));
        let due = self.seen.partition_point(|&(_, seen)| now.saturating_duration_since(seen) >= self.after);
        self.seen.drain(..due).collect()
    }

    /// Gives back what a worker took with [`Hibernating::take_due`] and did not
    /// hibernate: `unlooked`, which it had no time for (still due, so ahead of every
    /// other entry), and `waiting_again`, processes that were not waiting when looked
    /// at (queued or running): their wait starts over.
    pub(super) fn put_back(&mut self, unlooked: &[(Pid, Instant)], waiting_again: &[Pid]) {
        for &entry in unlooked.iter().rev() {
            self.seen.push_front(entry);
        }
        self.fresh.extend_from_slice(waiting_again);
    }

    /// When the earliest entry is due, if any is listed; `now` for an entry not yet seen
    /// (it is stamped at the next look, and due its threshold after that).
    pub(super) fn next_due(&self, now: Instant) -> Option<Instant> {
        let seen = self.seen.front().map(|&(_, seen)| seen);
        let fresh = (!self.fresh.is_empty()).then_some(now);
        // A threshold past what an `Instant` holds is never due.
        seen.into_iter().chain(fresh).min().and_then(|earliest| earliest.checked_add(self.after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(n: u64) -> Pid {
        Pid::from_u64(n)
    }

    #[test]
    fn a_listed_process_is_due_once_it_has_been_seen_waiting_long_enough() {
        let mut list = Hibernating::default();
        let start = Instant::now();
        list.push(pid(1));
        assert_eq!(list.next_due(start), Some(start + HIBERNATE_AFTER));
        // The first look only stamps it.
        assert!(list.take_due(start).is_empty());
        list.push(pid(2));
        let later = start + HIBERNATE_AFTER / 2;
        assert!(list.take_due(later).is_empty());
        assert_eq!(list.next_due(later), Some(start + HIBERNATE_AFTER));
        assert_eq!(list.take_due(start + HIBERNATE_AFTER), [(pid(1), start)]);
        assert_eq!(list.take_due(later + HIBERNATE_AFTER), [(pid(2), later)]);
        assert_eq!(list.len(), 0);
        assert_eq!(list.next_due(later), None);
    }

    #[test]
    fn what_was_not_looked_at_stays_due_and_a_process_found_running_starts_over() {
        let mut list = Hibernating::default();
        let start = Instant::now();
        for n in 1..=4 {
            list.push(pid(n));
        }
        assert!(list.take_due(start).is_empty());
        let due_at = start + HIBERNATE_AFTER;
        let due = list.take_due(due_at);
        assert_eq!(due, (1..=4).map(|n| (pid(n), start)).collect::<Vec<_>>());
        // 1 hibernated, 2 was running, 3 and 4 were not looked at.
        list.put_back(&due[2..], &[pid(2)]);
        assert_eq!(list.take_due(due_at), [(pid(3), start), (pid(4), start)]);
        assert!(list.take_due(due_at).is_empty(), "2 is seen afresh");
        assert_eq!(list.take_due(due_at + HIBERNATE_AFTER), [(pid(2), due_at)]);
    }

    #[test]
    fn retain_prunes_both_halves() {
        let mut list = Hibernating::default();
        list.push(pid(1));
        list.push(pid(2));
        let _ = list.take_due(Instant::now());
        list.push(pid(3));
        list.push(pid(4));
        list.retain(|pid| pid.as_u64() % 2 == 0);
        assert_eq!(list.len(), 2);
    }
}
