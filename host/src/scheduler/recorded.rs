//! Waiting for a spawn's record to be in the journal: an embedder that answers for a
//! spawn (a service telling its client the workflow started) waits for that, not for a
//! write of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::{Condvar, Mutex};

/// Whether a spawn's record is in its journal, from [`Handle::spawn_recorded`](super::Handle::spawn_recorded).
#[derive(Debug, Clone)]
pub struct Recorded(Arc<State>);

#[derive(Debug, Default)]
struct State {
    outcome: Mutex<Outcome>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct Outcome {
    set: Option<Result<(), String>>,
    /// The tasks awaiting it ([`Recorded::recorded`]), woken when it is set.
    wakers: Vec<Waker>,
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
            if let Some(set) = &outcome.set {
                return set.clone();
            }
            self.0.done.wait(&mut outcome);
        }
    }

    /// As [`Recorded::wait`], for an async task: the commit wakes it, and no thread
    /// waits meanwhile.
    pub fn recorded(&self) -> impl Future<Output = Result<(), String>> + Send + 'static {
        Awaited(self.0.clone())
    }
}

struct Awaited(Arc<State>);

impl Future for Awaited {
    type Output = Result<(), String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut outcome = self.0.outcome.lock();
        if let Some(set) = &outcome.set {
            return Poll::Ready(set.clone());
        }
        if !outcome.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            outcome.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Recorder {
    pub(super) fn set(self, outcome: Result<(), String>) {
        self.settle(outcome);
    }

    fn settle(&self, outcome: Result<(), String>) {
        let wakers = {
            let mut state = self.0.outcome.lock();
            if state.set.is_some() {
                return;
            }
            state.set = Some(outcome);
            std::mem::take(&mut state.wakers)
        };
        self.0.done.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.settle(Err("the scheduler stopped before the spawn's record was committed".to_owned()));
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

    #[cfg(feature = "serve")]
    #[test]
    fn a_task_awaiting_the_record_is_woken_by_its_commit() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (recorded, recorder) = pair();
        let committer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            recorder.set(Err("a full disk".to_owned()));
        });
        let outcome = runtime.block_on(async {
            let first = recorded.recorded();
            let second = recorded.recorded();
            tokio::time::timeout(std::time::Duration::from_secs(10), async { (first.await, second.await) }).await
        });
        committer.join().unwrap();
        let failed = Err("a full disk".to_owned());
        assert_eq!(outcome.expect("woken, not timed out"), (failed.clone(), failed));
    }
}
