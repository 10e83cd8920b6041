//! Which waiting durable processes leave memory altogether, and when.
//!
//! A durable process that has waited longer than its scheduler's threshold
//! (`Builder::suspend_after`) is **suspended**: its process (for a Wasm process: its
//! instance, store and fiber) is closed and dropped; its cell stays registered, with its
//! inbox, its monitors and links, its timers and its place under `max_processes`. Its
//! next event wakes it as any waiting process is woken (`state.rs`), and the worker that
//! runs it brings it back before its step: made again by its kind's factory and brought
//! to its state by replaying its own journal (`recovery::bring_back`). The journal is the
//! process's whole state: suspension writes nothing to it, so a crash at any moment
//! recovers as it would have without suspension.
//!
//! # The list
//!
//! A durable process made by a kind is listed once (the cell's `listed_for_suspension`),
//! with the number of its records then, and stays listed until it is suspended or ends.
//! The flag has a single owner at a time, whoever owns the process by its state word
//! (the worker of its step, or a worker that has claimed it waiting), and only the
//! owner sets or clears it:
//! 1. a step that ends waiting, still `Running`, lists the process unless it is listed
//!    (so does a recovery, for a process it resumes waiting: it owns the process then,
//!    and wakes a worker to look, as the workers may all have parked);
//! 2. a worker about to park stamps the fresh entries with the time and the journal's
//!    count of submissions, and takes those due: seen waiting the threshold;
//! 3. for each, it claims the process as hibernation claims (`cell.rs`). Claimed, it owns
//!    it: it suspends it if it has not stepped since listed (the same number of records)
//!    and every record it submitted is committed (the committer's count has passed the
//!    stamped one, so that replay reads its whole history back), and clears the flag; a
//!    process that stepped since is listed afresh, its wait starting over; one that an
//!    event woke while claimed runs next on this worker, off the list, for its next
//!    step that waits to list it again;
//! 4. a process it cannot claim (queued, stepping, or claimed by a worker that
//!    hibernates it) is someone else's: its entry goes back, its wait starting over, and
//!    its flag stays set.
//!
//! So every live process whose flag is set has exactly one entry (in the list, or in
//! the hands of the one worker that took it), and every process that waits after a
//! step has its flag set: a process that waits is looked at within the threshold of a
//! worker's look, whatever its steps and the looks interleave, until it is suspended.
//! A step that ends waiting finds the flag set only if an entry exists, since the flag
//! is cleared only with its entry taken, by the owner, and no one else writes it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use wasmproc_types::Pid;

/// The threshold a durable scheduler suspends its waiting processes at unless told
/// otherwise (`Builder::suspend_after`). Coming back costs a replay of the process's
/// history, a millisecond for a short workflow and more for a long one: a wait of ten
/// seconds is long against that, and a workflow waiting that long most likely waits
/// for a timer or a person.
pub const DEFAULT_SUSPEND_AFTER: Duration = Duration::from_secs(10);

/// A listed process: its pid and how many records it had when listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Listed {
    pub(super) pid: Pid,
    pub(super) records: u64,
}

/// A listed process seen by a worker: when, and how many submissions the journal had
/// taken by then (all of the process's records among them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Seen {
    pub(super) listed: Listed,
    pub(super) at: Instant,
    pub(super) submitted: u64,
}

/// The listed processes: at most one entry a live process (the cell's flag), plus ended
/// ones until they come due and are dropped.
#[derive(Default)]
pub(super) struct Suspending {
    /// Listed since a worker last looked.
    fresh: Vec<Listed>,
    /// Seen by a worker, the earliest first.
    seen: VecDeque<Seen>,
}

impl Suspending {
    /// Entries, live and ended.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.fresh.len() + self.seen.len()
    }

    /// Lists a process (after a step that ended waiting).
    pub(super) fn push(&mut self, listed: Listed) {
        self.fresh.push(listed);
    }

    /// Stamps the fresh entries as seen at `now` with `submitted`, and takes the entries
    /// seen at least `after` before `now`, the earliest first.
    pub(super) fn take_due(&mut self, now: Instant, submitted: u64, after: Duration) -> Vec<Seen> {
        self.seen.extend(self.fresh.drain(..).map(|listed| Seen { listed, at: now, submitted }));
        let due = self.seen.partition_point(|seen| now.saturating_duration_since(seen.at) >= after);
        self.seen.drain(..due).collect()
    }

    /// Gives back entries taken with [`Suspending::take_due`] and not suspended: `later`
    /// (not looked at, or not yet committed: still due, ahead of every other entry);
    /// `busy`, processes found owned by someone else, seen again as they were listed
    /// (their wait starts over at the look); and `afresh`, processes that stepped since
    /// they were listed and wait again: their wait starts over from the next look.
    pub(super) fn put_back(&mut self, later: &[Seen], busy: &[Seen], afresh: &[Listed]) {
        for &entry in later.iter().rev() {
            self.seen.push_front(entry);
        }
        self.seen.extend(busy.iter().copied());
        self.fresh.extend_from_slice(afresh);
    }

    /// Whether entries were listed since a worker last looked.
    pub(super) fn has_fresh(&self) -> bool {
        !self.fresh.is_empty()
    }

    /// When the earliest entry is due, if any is listed (`now` plus `after` for one not
    /// yet seen).
    pub(super) fn next_due(&self, now: Instant, after: Duration) -> Option<Instant> {
        let seen = self.seen.front().map(|seen| seen.at);
        let fresh = (!self.fresh.is_empty()).then_some(now);
        seen.into_iter().chain(fresh).min().map(|earliest| earliest + after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(n: u64, records: u64) -> Listed {
        Listed { pid: Pid::from_u64(n), records }
    }

    #[test]
    fn a_listed_process_is_due_once_seen_waiting_for_the_threshold() {
        let after = Duration::from_secs(10);
        let mut list = Suspending::default();
        let start = Instant::now();
        list.push(listed(1, 3));
        assert_eq!(list.next_due(start, after), Some(start + after));
        assert!(list.take_due(start, 7, after).is_empty(), "the first look only stamps it");
        list.push(listed(2, 5));
        assert!(list.take_due(start + after / 2, 9, after).is_empty());
        let due = list.take_due(start + after, 11, after);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].listed, due[0].submitted), (listed(1, 3), 7));
        assert_eq!(list.next_due(start + after, after), Some(start + after / 2 + after));
        list.put_back(&due, &[], &[]);
        assert_eq!(list.len(), 2);
        let again = list.take_due(start + 2 * after, 12, after);
        assert_eq!(again.iter().map(|s| s.listed.pid.as_u64()).collect::<Vec<_>>(), [1, 2]);
        list.put_back(&[], &[], &[listed(1, 4)]);
        assert_eq!(list.take_due(start + 2 * after, 13, after).len(), 0, "listed afresh: its wait starts over");
    }
}
