//! The `sleep` command: one timer thread over a binary heap of deadlines.
//!
//! One thread for all sleeps, not one per sleep: a million sleeping processes cost a
//! million heap entries (a deadline and a completer each), nothing more. A heap is
//! O(log n) per sleep; a timer wheel would be O(1), but at the rates a step-driven host
//! produces sleeps the heap has not shown up in a profile.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use wasmproc_types::Payload;

use crate::step::Outcome;

/// What a sleep completes: the yield's completer (`completer.rs`). A parameter rather
/// than the type, so that the timer names nothing of the processes it wakes.
pub(super) trait Done: Send + 'static {
    /// Completes the sleep with `result`.
    fn complete(self, result: Outcome);
}

/// The handle to the timer thread, held by the scheduler.
pub(super) struct Timer<D> {
    shared: Arc<TimerShared<D>>,
}

struct TimerShared<D> {
    state: Mutex<TimerState<D>>,
    condvar: Condvar,
}

struct TimerState<D> {
    heap: BinaryHeap<Entry<D>>,
    /// Breaks ties between equal deadlines in insertion order.
    next_seq: u64,
    shutdown: bool,
}

struct Entry<D> {
    deadline: Instant,
    seq: u64,
    done: D,
}

impl<D> Ord for Entry<D> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap and the earliest deadline must be on top.
        (other.deadline, other.seq).cmp(&(self.deadline, self.seq))
    }
}

impl<D> PartialOrd for Entry<D> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<D> PartialEq for Entry<D> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<D> Eq for Entry<D> {}

impl<D: Done> Timer<D> {
    /// Starts the timer thread.
    pub(super) fn start(name: &str) -> std::io::Result<(Timer<D>, JoinHandle<()>)> {
        let shared = Arc::new(TimerShared {
            state: Mutex::new(TimerState { heap: BinaryHeap::new(), next_seq: 0, shutdown: false }),
            condvar: Condvar::new(),
        });
        let thread = {
            let shared = shared.clone();
            thread::Builder::new().name(format!("{name}-timer")).spawn(move || shared.run())?
        };
        Ok((Timer { shared }, thread))
    }

    /// Completes `done` with an empty payload after `duration`. Zero completes at once.
    pub(super) fn sleep(&self, duration: Duration, done: D) {
        if duration.is_zero() {
            return done.complete(Ok(Payload::empty()));
        }
        // A duration too long for `Instant` means "never" for every practical purpose;
        // a century stands in for it.
        let deadline = Instant::now()
            .checked_add(duration)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut state = self.shared.state.lock();
        if state.shutdown {
            drop(state);
            return done.complete(Err("sleep refused: the scheduler is stopping".to_owned()));
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let earliest = state.heap.peek().is_none_or(|top| deadline < top.deadline);
        state.heap.push(Entry { deadline, seq, done });
        drop(state);
        if earliest {
            self.shared.condvar.notify_one();
        }
    }

    /// Stops the thread; pending sleeps are dropped (their completers answer with an
    /// error, which reaches no one once every process has ended).
    pub(super) fn shutdown(&self) {
        self.shared.state.lock().shutdown = true;
        self.shared.condvar.notify_one();
    }
}

impl<D: Done> TimerShared<D> {
    fn run(&self) {
        let mut due = Vec::new();
        loop {
            let mut state = self.state.lock();
            loop {
                if state.shutdown {
                    let pending = std::mem::take(&mut state.heap);
                    drop(state);
                    drop(pending);
                    return;
                }
                let now = Instant::now();
                while state.heap.peek().is_some_and(|top| top.deadline <= now) {
                    due.extend(state.heap.pop());
                }
                if !due.is_empty() {
                    break;
                }
                match state.heap.peek().map(|top| top.deadline) {
                    Some(deadline) => {
                        self.condvar.wait_until(&mut state, deadline);
                    }
                    None => self.condvar.wait(&mut state),
                }
            }
            drop(state);
            // Completing outside the lock: completion pushes into inboxes and may wake
            // workers, and sleepers must be able to add entries meanwhile.
            for entry in due.drain(..) {
                entry.done.complete(Ok(Payload::empty()));
            }
        }
    }
}
