//! How a yield is answered: every yield gets exactly one completion, delivered to its
//! process now (inside dispatch, on the worker that ran the step) or later from any
//! thread. A completer dropped without completing answers with an error rather than
//! leaving the process waiting forever.

use std::sync::Arc;

use wasmproc_types::Pid;

use super::cell::{ProcessCell, Release, Watcher};
use super::state::{Lifecycle, Wake};
use super::worker;
use crate::step::{Event, Outcome};

/// What a yield completes with when its completer (or its handler's [`Request`]) is
/// dropped unanswered.
///
/// [`Request`]: super::Request
pub(super) const DROPPED: &str = "command handler dropped the yield without completing it";

/// Completes one yield from anywhere, at any time. Consumed by [`Completer::complete`];
/// dropping it unused completes the yield with an error, so a process never waits on a
/// lost handler.
///
/// Completing a yield of a process that has ended in the meantime does nothing.
pub struct Completer {
    target: Option<Arc<ProcessCell>>,
    tag: u64,
}

impl Completer {
    pub(super) fn new(target: Arc<ProcessCell>, tag: u64) -> Self {
        Completer { target: Some(target), tag }
    }

    /// The tag of the yield this completes.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The process waiting for the completion.
    pub fn pid(&self) -> Pid {
        self.target.as_ref().map_or(Pid::HOST, |cell| cell.pid())
    }

    /// Whether the process waiting for the completion has ended: nobody will read it.
    pub(crate) fn caller_has_ended(&self) -> bool {
        self.target.as_ref().is_none_or(|cell| cell.state.load().lifecycle() == Lifecycle::Complete)
    }

    /// Calls `release` once the process waiting for the completion has ended, on the
    /// thread that retires it (so `release` must not block); hands it back if the process
    /// is ending already.
    pub(crate) fn on_caller_exit(&self, release: Release) -> Result<(), Release> {
        let Some(cell) = &self.target else { return Err(release) };
        cell.inbox.watch(Watcher::Release(release)).map_err(|watcher| match watcher {
            Watcher::Release(release) => release,
            _ => unreachable!("`watch` hands back the watcher it was given"),
        })
    }

    /// Delivers `result` to the process and wakes it.
    pub fn complete(mut self, result: Outcome) {
        if let Some(cell) = self.target.take() {
            complete(&cell, self.tag, result);
        }
    }
}

impl super::timer::Done for Completer {
    fn complete(self, result: Outcome) {
        Completer::complete(self, result);
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(cell) = self.target.take() {
            complete(&cell, self.tag, Err(DROPPED.to_owned()));
        }
    }
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer").field("pid", &self.pid()).field("tag", &self.tag).finish()
    }
}

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
