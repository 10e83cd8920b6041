//! Waiting for a spawn's record to be in the journal: an embedder that answers for a
//! spawn (a service telling its client the workflow started) waits for that, not for a
//! write of its own.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Whether a spawn's record is in its journal, from [`Handle::spawn_recorded`](super::Handle::spawn_recorded).
#[derive(Debug, Clone)]
pub struct Recorded(Arc<State>);

#[derive(Debug, Default)]
struct State {
    outcome: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

/// The committing side of a [`Recorded`]: set once, by the commit of the spawn's record
/// or its failure. Dropped unset (the scheduler stopped before the commit), it says so.
pub(super) struct Recorder(Arc<State>);

/// A new pair: the spawner keeps the [`Recorded`], the spawn carries the [`Recorder`].
pub(super) fn pair() -> (Recorded, Recorder) {
    let state = Arc::new(State::default());
    (Recorded(state.clone()), Recorder(state))
}

impl Recorded {
    /// Waits until the spawn's record is committed (as durable as the journal's
    /// settings make its commits: synced, with the default durability), or its commit
    /// failed.
    ///
    /// # Errors
    ///
    /// The journal refused the commit (a full disk, a store fenced by another owner), or
    /// the scheduler stopped before it: the spawn may not survive a crash.
    pub fn wait(&self) -> Result<(), String> {
        let mut outcome = self.0.outcome.lock();
        loop {
            if let Some(outcome) = &*outcome {
                return outcome.clone();
            }
            self.0.done.wait(&mut outcome);
        }
    }
}

impl Recorder {
    pub(super) fn set(self, outcome: Result<(), String>) {
        self.0.outcome.lock().get_or_insert(outcome);
        self.0.done.notify_all();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let mut outcome = self.0.outcome.lock();
        if outcome.is_none() {
            *outcome = Some(Err("the scheduler stopped before the spawn's record was committed".to_owned()));
            self.0.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorder_set_or_dropped_answers_its_waiter_once() {
        let (recorded, recorder) = pair();
        let waiter = std::thread::spawn({
            let recorded = recorded.clone();
            move || recorded.wait()
        });
        recorder.set(Ok(()));
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert_eq!(recorded.wait(), Ok(()), "set once, dropped after: the outcome stays");
        let (recorded, recorder) = pair();
        drop(recorder);
        assert!(recorded.wait().unwrap_err().contains("stopped before"));
    }
}
