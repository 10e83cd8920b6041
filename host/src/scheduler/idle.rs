//! Coordination of idle workers: who is searching for work, who is parked, and waking
//! parked workers when work appears.
//!
//! A worker that runs out of local work becomes a *searcher* (it spins, then yields, see
//! `worker.rs`), and after [`PARK_AFTER_ROUNDS`] empty rounds it *parks* on a condvar.
//! Publishing work ([`Idle::notify_one`]) wakes a parked worker only when nobody is
//! searching: a searcher will find the work, and waking more workers than there is work
//! for costs a futex call each for nothing. A searcher that finds work while it was the
//! last one searching wakes one more worker, so parallelism ramps up one worker at a time
//! (the same policy as tokio's and Go's schedulers).
//!
//! # No lost wakeups
//!
//! A publisher does: push the work, `fence(SeqCst)`, read `searching` and `sleepers`. A
//! worker going to sleep does: decrement `searching`, increment `sleepers`,
//! `fence(SeqCst)`, then re-check every queue before it waits. The two fences are
//! totally ordered: if the publisher's comes first the worker's re-check sees the work;
//! otherwise the publisher sees the worker counted as searching or sleeping, and in the
//! second case leaves a token under the mutex, which a waiter consumes before blocking.
//! Tokens are capped at the number of sleepers, so a stale one costs at most one
//! spurious wakeup.

use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Empty rounds before a worker parks. Fewer than [`YIELD_AFTER_ROUNDS`] spin, the rest
/// call `thread::yield_now`; the values are those of
/// the Go scheduler wasmproc's design comes from (docs/design.md, "Finding work").
pub(super) const PARK_AFTER_ROUNDS: u32 = 16;
/// Empty rounds before a searcher stops spinning and starts yielding its thread.
pub(super) const YIELD_AFTER_ROUNDS: u32 = 4;

pub(super) struct Idle {
    searching: AtomicUsize,
    sleepers: AtomicUsize,
    state: Mutex<IdleState>,
    condvar: Condvar,
}

struct IdleState {
    /// Wakeups handed out and not yet consumed.
    tokens: usize,
    /// Workers blocked (or about to block) in `park`.
    waiting: usize,
    shutdown: bool,
}

/// How a park ended.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unparked {
    /// Woken (or the re-check found work): search again.
    Search,
    /// The scheduler is shutting down.
    Shutdown,
}

impl Idle {
    pub(super) fn new() -> Self {
        Idle {
            searching: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            state: Mutex::new(IdleState { tokens: 0, waiting: 0, shutdown: false }),
            condvar: Condvar::new(),
        }
    }

    /// Called after publishing work that another worker could take.
    pub(super) fn notify_one(&self) {
        // Pairs with the fence in `park`: see the module docs.
        fence(Ordering::SeqCst);
        if self.searching.load(Ordering::Relaxed) > 0 || self.sleepers.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.wake_one();
    }

    /// A worker found its local queue empty and starts looking elsewhere.
    pub(super) fn transition_to_searching(&self) {
        self.searching.fetch_add(1, Ordering::SeqCst);
    }

    /// A searcher found work. If it was the last searcher, another worker is woken to
    /// look for more.
    pub(super) fn transition_from_searching(&self) {
        if self.searching.fetch_sub(1, Ordering::SeqCst) == 1 && self.sleepers.load(Ordering::SeqCst) > 0 {
            self.wake_one();
        }
    }

    /// A searcher gives up: parks until woken, unless `has_work` finds work after the
    /// worker has counted itself as a sleeper. Returns with the worker searching again
    /// (unless shutting down).
    ///
    /// With an `alarm`, it also wakes then, if nothing woke it before (as
    /// [`Unparked::Search`], like a spurious wakeup: the protocol does not depend on why
    /// a worker woke).
    pub(super) fn park(&self, has_work: impl Fn() -> bool, alarm: Option<Instant>) -> Unparked {
        self.searching.fetch_sub(1, Ordering::SeqCst);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `notify_one`: see the module docs.
        fence(Ordering::SeqCst);
        let outcome = if has_work() {
            Unparked::Search
        } else {
            let mut state = self.state.lock();
            state.waiting += 1;
            let mut rang = false;
            while state.tokens == 0 && !state.shutdown && !rang {
                match alarm {
                    Some(alarm) => rang = self.condvar.wait_until(&mut state, alarm).timed_out(),
                    None => self.condvar.wait(&mut state),
                }
            }
            state.waiting -= 1;
            if state.shutdown {
                Unparked::Shutdown
            } else {
                // A token left while the alarm rang is taken too: the worker searches
                // either way, and a token nobody takes would only wake another for nothing.
                state.tokens = state.tokens.saturating_sub(1);
                Unparked::Search
            }
        };
        self.searching.fetch_add(1, Ordering::SeqCst);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    /// Leaves searching for good (the worker exits).
    pub(super) fn leave(&self) {
        self.searching.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes every parked worker for good.
    pub(super) fn shutdown(&self) {
        self.state.lock().shutdown = true;
        self.condvar.notify_all();
    }

    fn wake_one(&self) {
        let mut state = self.state.lock();
        // A token for a worker that has not reached the condvar yet is kept for it; more
        // tokens than sleepers would only cause spurious wakeups.
        if state.tokens < self.sleepers.load(Ordering::Relaxed).max(state.waiting) {
            state.tokens += 1;
            self.condvar.notify_one();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::thread;
    use std::time::Duration;

    use super::*;

    #[test]
    fn notify_reaches_a_parked_worker() {
        let idle = Arc::new(Idle::new());
        let work = Arc::new(AtomicBool::new(false));
        let worker = {
            let (idle, work) = (idle.clone(), work.clone());
            thread::spawn(move || {
                idle.transition_to_searching();
                loop {
                    if work.load(Ordering::SeqCst) {
                        idle.transition_from_searching();
                        return;
                    }
                    assert_eq!(idle.park(|| work.load(Ordering::SeqCst), None), Unparked::Search);
                }
            })
        };
        thread::sleep(Duration::from_millis(20));
        work.store(true, Ordering::SeqCst);
        idle.notify_one();
        worker.join().unwrap();
    }

    #[test]
    fn shutdown_releases_parked_workers() {
        let idle = Arc::new(Idle::new());
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let idle = idle.clone();
                thread::spawn(move || {
                    idle.transition_to_searching();
                    while idle.park(|| false, None) != Unparked::Shutdown {}
                    idle.leave();
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        idle.shutdown();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(idle.searching.load(Ordering::SeqCst), 0);
    }
}
