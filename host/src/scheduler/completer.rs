//! How a yield is answered: every yield gets exactly one completion, delivered to its
//! process now (inside dispatch, on the worker that ran the step) or later from any
//! thread. A [`Completer`] dropped without completing answers with an error rather than
//! leaving the process waiting forever.
//!
//! The handler API (`crate::handler`) reaches the yielding process through two traits
//! the cell implements here: [`Caller`], what a request borrows, and [`Waiter`], what a
//! completer holds.

use std::sync::Arc;

use wasmproc_types::Pid;

use super::cell::{ProcessCell, Watcher};
use super::state::{Lifecycle, Wake};
use super::timer::Done;
use super::worker;
use crate::handler::{Caller, Completer, Release, Waiter};
use crate::step::{Event, Outcome};

/// Delivers the completion of yield `tag` to `cell`: kept aside for its next step when
/// this thread is dispatching its yields right now, otherwise through its inbox.
pub(super) fn complete(cell: &Arc<ProcessCell>, tag: u64, result: Outcome) {
    let Err(event) = worker::deliver_during_dispatch(cell, Event::Completion { tag, result }) else {
        return;
    };
    // A refused completion is for a process that has ended (DESIGN 8): nothing to do.
    if let Ok(Wake::Schedule) = cell.deliver(event) {
        cell.scheduler().schedule(cell.clone());
    }
}

/// A completer of yield `tag` of `cell`'s process.
pub(super) fn completer(cell: &Arc<ProcessCell>, tag: u64) -> Completer {
    Completer::new(cell.clone(), tag)
}

impl Caller for Arc<ProcessCell> {
    fn pid(&self) -> Pid {
        ProcessCell::pid(self)
    }

    fn complete(&self, tag: u64, result: Outcome) {
        complete(self, tag, result);
    }

    fn completer(&self, tag: u64) -> Completer {
        completer(self, tag)
    }

    fn random_seed(&self) -> Option<[u8; 32]> {
        self.scheduler().durable.as_ref()?.random_seed(self)
    }

    fn kind(&self) -> Option<&str> {
        self.spec.kind.as_deref()
    }
}

impl Waiter for ProcessCell {
    fn pid(&self) -> Pid {
        ProcessCell::pid(self)
    }

    fn has_ended(&self) -> bool {
        self.state.load().lifecycle() == Lifecycle::Complete
    }

    fn on_exit(&self, release: Release) -> Result<(), Release> {
        self.inbox.watch(Watcher::Release(release)).map_err(|watcher| match watcher {
            Watcher::Release(release) => release,
            _ => unreachable!("`watch` hands back the watcher it was given"),
        })
    }

    fn complete(self: Arc<Self>, tag: u64, result: Outcome) {
        complete(&self, tag, result);
    }
}

impl Done for Completer {
    fn complete(self, result: Outcome) {
        Completer::complete(self, result);
    }
}
