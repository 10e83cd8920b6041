//! What the crate's own tests share: one bound for every wait, and a wait on a condition
//! within it.

use std::time::{Duration, Instant};

use wasmproc_types::Payload;

use crate::{Events, Port, Process, Status, StepOutput};

/// The bound of every wait in the crate's tests: long enough for a loaded machine, short
/// enough that a test that can never pass fails instead of hanging the suite.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `done` until it holds; fails the test, naming `what`, past [`PATIENCE`].
pub(crate) fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A process that waits for ever: every step ends idle.
pub(crate) struct Idle;

impl Process for Idle {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.set_status(Status::Idle);
        Ok(())
    }
}
