//! Retrying a durable process that traps from its last journaled step, with a backoff,
//! as Golem retries a failed worker ([`Retry`]).
//!
//! # Why a retry is a resume
//!
//! A trap ends the step it happens in, and nothing of that step takes effect: a durable
//! step's yields and port sends wait for its record, and a step that traps has none.
//! What the process did before is in its journal, effects included. So retrying it
//! from its last journaled step is exactly what a host crash at the trap, then a resume,
//! does (see `recovery.rs`): a fresh instance replayed through the recorded steps, which
//! carries nothing out again; the commands whose answers no recorded step took asked
//! again (a custom command with the same idempotency key, so a provider that keeps
//! answers by key does not do it twice; a spawn completes with the recorded child); the
//! messages no recorded step took delivered again. The retried step is given fresh
//! answers, so a trap on something passing (a server that failed, a read that came too
//! early) is not met again, while a trap the process makes of its own journaled history
//! is, and the retries run out.
//!
//! # How
//!
//! 1. A root (a process the embedder spawned) of a scheduler built with a [`Retry`]
//!    traps (a trap of its own, not a linked process's signal).
//! 2. If the policy admits another attempt (at most `intensity` within `period`), the
//!    scheduler does as a crash would at that moment: it suspends, so nothing after the
//!    trap is recorded (neither the root's end nor any other process's; no process
//!    hears of it), and ends the root's handle with [`ExitReason::Shutdown`]. The retry
//!    is noted, with its delay from the backoff: [`Retry::take`].
//! 3. The embedder stops the scheduler (which suspends the rest), waits the delay, and
//!    builds a scheduler on the same journal, with the same `Retry`: it resumes the run.
//! 4. Past the intensity the trap is recorded as the root's end, as without a `Retry`.
//!
//! The policy's count lives in the `Retry`, in memory: a host that crashes and starts
//! again counts from zero.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmproc_types::{ExitReason, Pid};

use crate::supervisor::{self, Backoff};

/// How often a durable root is retried: at most `intensity` retries within any `period`,
/// each after the backoff's delay (the `n`th within the period waits `backoff.delay(n)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The most retries within `period`; one more trap fails the process.
    pub intensity: u32,
    /// The sliding window retries are counted in.
    pub period: Duration,
    /// The delay before each retry.
    pub backoff: Backoff,
}

/// A retry the scheduler has decided on: the embedder stops it, waits `delay`, and builds
/// a scheduler on the journal again (see the module docs).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Retrying {
    /// The root that trapped.
    pub pid: Pid,
    /// Its trap.
    pub reason: ExitReason,
    /// Which retry this is within the period, from 1.
    pub attempt: u32,
    /// The backoff's delay before it.
    pub delay: Duration,
}

/// Retries the durable roots of the schedulers built with it that trap, from their last
/// journaled step ([`Builder::retry`](super::Builder::retry); see the module docs). Clones
/// share one count: give each scheduler of a run the same `Retry`.
#[derive(Clone, Debug)]
pub struct Retry {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    policy: RetryPolicy,
    /// When each retry within the window was decided, oldest first.
    retries: VecDeque<Instant>,
    pending: Option<Retrying>,
    rng: u64,
}

impl Retry {
    /// A retry of `policy`, with no retry counted yet.
    pub fn new(policy: RetryPolicy) -> Retry {
        let state = State { policy, retries: VecDeque::new(), pending: None, rng: supervisor::seed() };
        Retry { state: Arc::new(Mutex::new(state)) }
    }

    /// The policy.
    pub fn policy(&self) -> RetryPolicy {
        self.state.lock().policy
    }

    /// The retry decided on since the last call, if any: after a root's handle ended with
    /// [`ExitReason::Shutdown`], whether that was a retry's suspension (`Some`) or the
    /// scheduler's stop (`None`).
    pub fn take(&self) -> Option<Retrying> {
        self.state.lock().pending.take()
    }

    /// Whether the policy admits a retry of `pid`, which has just trapped with `reason`:
    /// if so, counted and noted for [`Retry::take`].
    pub(super) fn admit(&self, pid: Pid, reason: &ExitReason) -> bool {
        let mut state = self.state.lock();
        let now = Instant::now();
        let period = state.policy.period;
        while state.retries.front().is_some_and(|at| now.duration_since(*at) > period) {
            state.retries.pop_front();
        }
        if state.retries.len() >= state.policy.intensity as usize {
            return false;
        }
        state.retries.push_back(now);
        let attempt = u32::try_from(state.retries.len()).unwrap_or(u32::MAX);
        let unit = supervisor::draw(&mut state.rng);
        let delay = state.policy.backoff.delay(attempt, unit);
        state.pending = Some(Retrying { pid, reason: reason.clone(), attempt, delay });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trap() -> ExitReason {
        ExitReason::trap(wasmproc_types::TrapKind::Panic, "boom".to_owned())
    }

    /// The policy admits `intensity` retries within its period, each with the backoff's
    /// delay for its place, and no more.
    #[test]
    fn retries_are_admitted_up_to_the_intensity_with_the_backoffs_delays() {
        let backoff =
            Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1), multiplier: 2.0, jitter: 0.0 };
        let retry = Retry::new(RetryPolicy { intensity: 3, period: Duration::from_secs(3600), backoff });
        let pid = Pid::from_u64(7);
        assert_eq!(retry.take(), None);
        for (attempt, delay) in [(1, 100), (2, 200), (3, 400)] {
            assert!(retry.admit(pid, &trap()));
            let taken = retry.take().expect("a retry noted");
            assert_eq!((taken.attempt, taken.delay), (attempt, Duration::from_millis(delay)));
            assert_eq!(taken.reason, trap());
            assert_eq!(retry.take(), None, "taken once");
        }
        assert!(!retry.admit(pid, &trap()), "past the intensity");
        assert_eq!(retry.take(), None);
    }
}
