//! The per-process state word: lifecycle plus the wakeup and terminate flags, packed in
//! one atomic so every transition is a single compare-and-swap.
//!
//! ```text
//!  Init ──spawn──▶ Ready ──worker CAS──▶ Running ──▶ Complete
//!                    ▲                    │  ▲
//!                    │     waiting CAS    ▼  │ rerun (WAKEUP was set)
//!                    └──── wake CAS ──── Blocked / Idle
//! ```
//!
//! # The wakeup protocol
//!
//! Producers (completions, messages, cancel, terminate) and the worker that owns a
//! running process race on this word. The protocol that keeps every event from being
//! lost, given that the event itself is pushed into the process's inbox under its lock
//! *before* the producer touches the state word:
//!
//! 1. The worker moves `Ready → Running` ([`State::transition_to_running`]) and only
//!    then drains the inbox.
//! 2. A producer, after pushing, calls [`State::wake`]:
//!    - `Blocked`/`Idle` → CAS to `Ready`; the producer that wins schedules the process
//!      (exactly one queue entry per `Ready` process);
//!    - `Running` → CAS on the `WAKEUP` flag: the worker has drained the inbox or is
//!      about to, and will see the flag;
//!    - `Init`/`Ready` → nothing: whoever queues or runs the process next drains the
//!      inbox first;
//!    - `Complete` → nothing (the inbox is closed, so the push already failed).
//! 3. After the step and its dispatch, the worker CASes `Running → Blocked/Idle` expecting
//!    *no* flags ([`State::transition_to_waiting`]). If the CAS fails, a producer set
//!    `WAKEUP` (or `TERMINATE`) since step 1: the worker clears `WAKEUP`, keeps the
//!    process and runs it again.
//!
//! Why nothing is lost: all of these are read-modify-writes on one word, so they are
//! totally ordered. Take a producer whose event the worker's drain missed. Its push
//! acquired the inbox lock after the drain released it, and the drain follows step 1 in
//! program order, so the producer's `wake` is ordered after `Ready → Running` and reads
//! `Running` or something later. If it reads `Running` it sets `WAKEUP` before step 3's
//! CAS, which then fails: the worker reruns. If it reads `Blocked`/`Idle`, step 3 already
//! happened and the producer schedules the process itself. Either way the event is
//! drained by a later step. The loom models at the bottom of `cell.rs` check this.
//!
//! # Suspended steps
//!
//! A step stopped part-way at its time slice, to be resumed where it stopped
//! (`Decision::Preempted` in `cell.rs`), is given no events until it has finished: the
//! turns that resume it skip step 1's drain. What arrives meanwhile stays in the inbox,
//! where the mailbox's bounds count it and refuse a sender past them; handed to the
//! process, it would be held where no bound counts it. The argument above holds with
//! the drain moved, by two rules of the worker's:
//!
//! 4. A turn that ends with the step still suspended makes the process `Ready` and
//!    queues it again, whatever its inbox holds: it has work of its own, and waits for no
//!    wake.
//! 5. A turn whose resumed step finishes has not drained the inbox, and the pushes that
//!    came before its `Ready → Running` set no flag. So before it tries to park the
//!    process, the worker looks into the inbox (under its lock): if anything is there,
//!    the process runs again, draining first as in step 1 (or, its turn used up, is
//!    queued with the events in the inbox). A push the look missed took the inbox lock
//!    after the look released it, which follows `Ready → Running` in program order, so
//!    its producer's `wake` reads `Running` (and sets `WAKEUP`, which fails step 3's CAS)
//!    or a later state (and schedules the process), as for a push step 1's drain missed.
//!
//! So no event is left in the inbox of a parked process, suspended steps or not; the
//! model `loom_send_races_suspended_step` checks it.
//!
//! Orderings: the event payloads are published by the inbox mutex and the process itself
//! by the run queues, so the state word only needs the total order of its own
//! modifications. CASes still use `AcqRel` so a winner of `Ready` or `Running` sees the
//! writes of the thread it took the process from without relying on the queues' fences.

use crate::loom::{AtomicU32, Ordering};

const LIFECYCLE: u32 = 0b111;
const INIT: u32 = 0;
const READY: u32 = 1;
const RUNNING: u32 = 2;
const BLOCKED: u32 = 3;
const IDLE: u32 = 4;
const COMPLETE: u32 = 5;
/// An event arrived while the process was `Running`.
const WAKEUP: u32 = 1 << 3;
/// Someone asked to end the process; sticky until `Complete`.
const TERMINATE: u32 = 1 << 4;

/// Where a process is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lifecycle {
    /// Spawned, `init` not yet done; not queued.
    Init,
    /// In exactly one run queue.
    Ready,
    /// Owned by a worker.
    Running,
    /// Waiting for yields to complete.
    Blocked,
    /// Waiting for messages.
    Idle,
    /// Finished; the inbox is closed.
    Complete,
}

/// A value read from the state word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Snapshot(u32);

impl Snapshot {
    pub(super) fn lifecycle(self) -> Lifecycle {
        match self.0 & LIFECYCLE {
            INIT => Lifecycle::Init,
            READY => Lifecycle::Ready,
            RUNNING => Lifecycle::Running,
            BLOCKED => Lifecycle::Blocked,
            IDLE => Lifecycle::Idle,
            COMPLETE => Lifecycle::Complete,
            other => unreachable!("inconsistent process state; actual = {other:#b}"),
        }
    }

    pub(super) fn is_terminate_requested(self) -> bool {
        self.0 & TERMINATE != 0
    }

    fn is_wakeup_set(self) -> bool {
        self.0 & WAKEUP != 0
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("lifecycle", &self.lifecycle())
            .field("wakeup", &self.is_wakeup_set())
            .field("terminate", &self.is_terminate_requested())
            .finish()
    }
}

/// What a producer must do after waking a process.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// This caller moved the process to `Ready` and must put it in a run queue.
    Schedule,
    /// Someone else will run the process (or it has finished).
    Nothing,
}

/// What the worker does after trying to park a process.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiting {
    /// The process is `Blocked`/`Idle`; the worker lets go of it.
    Parked,
    /// Events arrived (or termination was requested) during the step: the worker still
    /// owns the process (`Running`, `WAKEUP` cleared) and must run it again.
    Rerun,
}

/// The state word of one process.
pub(super) struct State {
    word: AtomicU32,
}

impl State {
    pub(super) fn new() -> Self {
        State { word: AtomicU32::new(INIT) }
    }

    pub(super) fn load(&self) -> Snapshot {
        Snapshot(self.word.load(Ordering::Acquire))
    }

    /// `Init → Ready` after a successful `init`; the caller then queues the process.
    /// Flags set during `init` (a terminate request) are kept.
    pub(super) fn transition_to_ready_from_init(&self) {
        let prev = self.update(|s| {
            assert_eq!(s & LIFECYCLE, INIT, "spawned process not in `Init`; actual = {:?}", Snapshot(s));
            (s & TERMINATE) | READY
        });
        debug_assert_eq!(prev.lifecycle(), Lifecycle::Init);
    }

    /// `Ready → Running` by the worker that popped the process. The returned snapshot
    /// tells whether termination was requested.
    ///
    /// # Panics
    ///
    /// If the process was not `Ready`: a queue held a process it does not own.
    pub(super) fn transition_to_running(&self) -> Snapshot {
        let prev = self.update(|s| {
            assert_eq!(s & LIFECYCLE, READY, "dequeued process not `Ready`; actual = {:?}", Snapshot(s));
            (s & TERMINATE) | RUNNING
        });
        Snapshot((prev.0 & TERMINATE) | RUNNING)
    }

    /// `Blocked`/`Idle → Running` for a worker that works on a waiting process between
    /// its steps (`ProcessCell::hibernate`); `None`, changing nothing, unless it waits
    /// with no flag set (it was woken, is queued or running, or has ended). The claimer
    /// owns the process as the worker of a step would, and gives it back with
    /// [`State::transition_to_waiting`] to the returned state: producers meanwhile see
    /// `Running` and set `WAKEUP`, which that transition turns into `Rerun`, exactly as
    /// for an event that arrives during a step.
    pub(super) fn try_claim_waiting(&self) -> Option<Lifecycle> {
        let cur = self.word.load(Ordering::Acquire);
        let waiting = match cur {
            BLOCKED => Lifecycle::Blocked,
            IDLE => Lifecycle::Idle,
            _ => return None,
        };
        // Acquire on success: what the last worker wrote to the process (its step) is
        // visible to the claimer, as `transition_to_running` makes it for a worker.
        self.word.compare_exchange(cur, RUNNING, Ordering::AcqRel, Ordering::Relaxed).ok().map(|_| waiting)
    }

    /// Step 2 of the protocol: called by a producer after pushing an event.
    pub(super) fn wake(&self) -> Wake {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let next = match cur & LIFECYCLE {
                BLOCKED | IDLE => (cur & TERMINATE) | READY,
                RUNNING if cur & WAKEUP == 0 => cur | WAKEUP,
                _ => return Wake::Nothing,
            };
            match self.word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if next & LIFECYCLE == READY => return Wake::Schedule,
                Ok(_) => return Wake::Nothing,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Step 3 of the protocol: `Running → target` (`Blocked` or `Idle`) unless a flag
    /// was set since the process started running.
    pub(super) fn transition_to_waiting(&self, target: Lifecycle) -> Waiting {
        let target = match target {
            Lifecycle::Blocked => BLOCKED,
            Lifecycle::Idle => IDLE,
            other => unreachable!("a process can only wait as Blocked or Idle, not {other:?}"),
        };
        match self.word.compare_exchange(RUNNING, target, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Waiting::Parked,
            Err(actual) => {
                assert_eq!(
                    actual & LIFECYCLE,
                    RUNNING,
                    "running process changed state under its worker; actual = {:?}",
                    Snapshot(actual)
                );
                // Only producers touch a running process's word, and only to add flags;
                // clearing WAKEUP now is safe because the worker drains the inbox again
                // before the next step, which sees every event pushed before this point.
                self.word.fetch_and(!WAKEUP, Ordering::AcqRel);
                Waiting::Rerun
            }
        }
    }

    /// Called by the worker between two steps of one turn that did not try to park:
    /// clears `WAKEUP` and says whether it was set, that is, whether a producer has
    /// pushed into the inbox since the last drain. The worker must drain the inbox when
    /// this returns true; when it returns false every event pushed so far was drained,
    /// if the turn has drained the inbox since it began (a turn that resumed a suspended
    /// step has not: see "Suspended steps").
    ///
    /// Why false is safe: a producer pushes before it reads the state word. If its read
    /// came after the last clearing of `WAKEUP` it saw the flag clear and set it (so this
    /// returns true); if it came before, its push preceded that clearing, which preceded
    /// the drain that followed it.
    pub(super) fn take_wakeup(&self) -> bool {
        if self.word.load(Ordering::Acquire) & WAKEUP == 0 {
            return false;
        }
        self.word.fetch_and(!WAKEUP, Ordering::AcqRel);
        true
    }

    /// `Running → Ready` for a process that asked to continue or used up its turn; the
    /// caller queues it. `WAKEUP` is dropped: the next turn drains the inbox before the
    /// next step that begins, or, resuming a suspended step, looks into it before it
    /// parks the process ("Suspended steps").
    pub(super) fn transition_to_ready_from_running(&self) {
        self.update(|s| {
            assert_eq!(s & LIFECYCLE, RUNNING, "requeued process not `Running`; actual = {:?}", Snapshot(s));
            (s & TERMINATE) | READY
        });
    }

    /// Sets `TERMINATE` and wakes the process so a worker sees it.
    pub(super) fn request_terminate(&self) -> Wake {
        let prev = Snapshot(self.word.fetch_or(TERMINATE, Ordering::AcqRel));
        if prev.lifecycle() == Lifecycle::Complete {
            return Wake::Nothing;
        }
        self.wake()
    }

    /// Final transition, by the worker (or spawner) that owns the process.
    pub(super) fn transition_to_complete(&self) {
        self.word.store(COMPLETE, Ordering::Release);
    }

    /// Read-modify-write with a closure; returns the previous value.
    fn update(&self, mut f: impl FnMut(u32) -> u32) -> Snapshot {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            match self.word.compare_exchange_weak(cur, f(cur), Ordering::AcqRel, Ordering::Acquire) {
                Ok(prev) => return Snapshot(prev),
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn running() -> State {
        let s = State::new();
        s.transition_to_ready_from_init();
        s.transition_to_running();
        s
    }

    #[test]
    fn wake_while_running_sets_flag_and_forces_rerun() {
        let s = running();
        assert_eq!(s.wake(), Wake::Nothing);
        assert_eq!(s.wake(), Wake::Nothing, "second wake is absorbed by the flag");
        assert_eq!(s.transition_to_waiting(Lifecycle::Blocked), Waiting::Rerun);
        assert_eq!(s.load().lifecycle(), Lifecycle::Running);
        assert_eq!(s.transition_to_waiting(Lifecycle::Idle), Waiting::Parked);
        assert_eq!(s.load().lifecycle(), Lifecycle::Idle);
    }

    #[test]
    fn only_one_waker_schedules() {
        let s = running();
        assert_eq!(s.transition_to_waiting(Lifecycle::Blocked), Waiting::Parked);
        assert_eq!(s.wake(), Wake::Schedule);
        assert_eq!(s.wake(), Wake::Nothing);
        assert_eq!(s.load().lifecycle(), Lifecycle::Ready);
    }

    #[test]
    fn take_wakeup_reports_and_clears_the_flag() {
        let s = running();
        assert!(!s.take_wakeup());
        assert_eq!(s.wake(), Wake::Nothing);
        assert!(s.take_wakeup());
        assert!(!s.take_wakeup());
        assert_eq!(s.transition_to_waiting(Lifecycle::Idle), Waiting::Parked);
    }

    #[test]
    fn terminate_is_sticky_and_wakes() {
        let s = running();
        assert_eq!(s.transition_to_waiting(Lifecycle::Idle), Waiting::Parked);
        assert_eq!(s.request_terminate(), Wake::Schedule);
        assert!(s.transition_to_running().is_terminate_requested());
        s.transition_to_complete();
        assert_eq!(s.request_terminate(), Wake::Nothing);
        assert_eq!(s.wake(), Wake::Nothing);
    }

    #[test]
    fn terminate_while_running_forces_rerun() {
        let s = running();
        assert_eq!(s.request_terminate(), Wake::Nothing);
        assert_eq!(s.transition_to_waiting(Lifecycle::Blocked), Waiting::Rerun);
        assert!(s.load().is_terminate_requested());
    }
}
