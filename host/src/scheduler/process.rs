//! What the scheduler runs: the [`Process`] trait and the values that cross it.
//!
//! A process is a state machine. The scheduler calls [`Process::init`] once, before the
//! process is ever queued, then [`Process::step`] each time it has something to do: the
//! step consumes [`Event`]s (completions of earlier yields, messages, cancellation) and
//! writes a [`StepOutput`]: a [`Status`] and any number of [`Yield`]s, commands for the
//! host to dispatch. [`Process::close`] runs exactly once at the end, whatever the end was.

// The values that cross the Wasm boundary, one type each, shared with the guest SDK.
pub(crate) use wasmproc_types::{Payload, Pid};

// The values of a step, defined below the scheduler so that the journal's records can
// hold them.
pub use crate::step::{Command, Event, Outcome, SpawnRequest, Status, Yield};
pub(crate) use crate::step::{CommandKind, message_size};

/// The events a step consumes, in arrival order: an iterator that hands each over by
/// value. Events the step does not take were delivered all the same and are dropped
/// with it.
pub struct Events<'a>(std::vec::Drain<'a, Event>);

impl<'a> Events<'a> {
    pub(crate) fn new(drain: std::vec::Drain<'a, Event>) -> Self {
        Events(drain)
    }
}

impl Iterator for Events<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.0.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for Events<'_> {}

impl DoubleEndedIterator for Events<'_> {
    fn next_back(&mut self) -> Option<Event> {
        self.0.next_back()
    }
}

impl std::iter::FusedIterator for Events<'_> {}

impl std::fmt::Debug for Events<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Events").field(&self.0.as_slice()).finish()
    }
}

/// A process: something the scheduler can initialise, step and close.
///
/// The scheduler never calls two methods of one process at once, and calls `close`
/// exactly once, after the last `step` (or after a failed `init`). Implementations need
/// not be `Sync`; a process moves between worker threads between steps.
pub trait Process: Send + 'static {
    /// Selects the entry `method` and hands the process its `input`, and its
    /// [`Port`](super::Port): its pid, and how it sends as itself during a step and asks
    /// whether a long step should yield. Keep the port to use it later.
    ///
    /// Runs before the process is queued.
    ///
    /// # Errors
    ///
    /// An error (for example an unknown method) is returned to whoever spawned the
    /// process; the process never runs and no exit is reported for it.
    fn init(&mut self, port: super::Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()>;

    /// Advances the process: consumes `events` and writes the status and yields to `out`.
    ///
    /// `out` arrives cleared with status [`Status::Blocked`].
    ///
    /// # Errors
    ///
    /// An error ends the process with that error as its result; nothing else is affected.
    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()>;

    /// Whether the process, about to wait, holds memory it could give back while it
    /// waits, and has not said so since its last [`Process::hibernate`]. Called after a
    /// step that ends in a wait; keep it cheap. A `true` is a promise that `hibernate`
    /// will be called once the process's worker, or another, has nothing else to run.
    fn wants_hibernation(&mut self) -> bool {
        false
    }

    /// Gives back memory the process does not need while it waits. Called between steps
    /// (never during one), after [`Process::wants_hibernation`] said yes, by a worker
    /// with nothing else to run, so the cost delays no one; under load, waiting
    /// processes stay as they are. The next step may have to fault the memory back in.
    /// Returns whether anything was given back, counted in
    /// [`Stats::hibernated`](super::Stats::hibernated).
    fn hibernate(&mut self) -> bool {
        false
    }

    /// The sandbox limits the process runs under, which bound every process it spawns
    /// (see [`KindLimits`](super::dispatch::KindLimits)); asked once, when the embedder
    /// spawns it. `None` (the default): none, as for a native process.
    fn limits(&self) -> Option<super::dispatch::KindLimits> {
        None
    }

    /// Releases the process's resources. Called exactly once.
    fn close(&mut self) {}
}

/// Where a step writes its status and yields. The scheduler reuses one per worker, so a
/// step allocates nothing here once the buffer has grown to fit.
#[derive(Debug, Default)]
pub struct StepOutput {
    status: Status,
    yields: Vec<Yield>,
    preempted: bool,
}

impl StepOutput {
    /// An empty output with status [`Status::Blocked`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `command` for dispatch; its completion will carry `tag`.
    // Inline across crates: an embedder's process writes straight into the buffer, where
    // a call would copy the ~100-byte command once more (11% of a yield cycle in `perf`).
    #[inline]
    pub fn yield_command(&mut self, tag: u64, command: Command) {
        self.yields.push(Yield { tag, command });
    }

    /// Sets what happens after this step.
    #[inline]
    pub fn set_status(&mut self, status: Status) {
        self.status = status;
    }

    /// Ends the process with `result`.
    #[inline]
    pub fn complete(&mut self, result: Outcome) {
        self.status = Status::Complete(result);
    }

    /// The status set so far.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The yields written so far.
    pub fn yields(&self) -> &[Yield] {
        &self.yields
    }

    /// Marks the step as stopped part-way, at its time slice, to resume where it
    /// stopped when stepped next (with [`Status::Continue`]). Until the step has
    /// finished, the steps that resume it are given no events: what arrives meanwhile
    /// waits in the process's mailbox, within its bounds, for the step after. A durable
    /// scheduler records the step once it finishes, as one step, and a replay runs it
    /// whole.
    pub fn set_preempted(&mut self) {
        self.preempted = true;
        self.status = Status::Continue;
    }

    /// Whether [`StepOutput::set_preempted`] was called in this step.
    pub fn is_preempted(&self) -> bool {
        self.preempted
    }

    pub(crate) fn reset(&mut self) {
        self.status = Status::Blocked;
        self.yields.clear();
        self.preempted = false;
    }

    pub(crate) fn take_status(&mut self) -> Status {
        std::mem::take(&mut self.status)
    }

    pub(crate) fn yields_mut(&mut self) -> &mut Vec<Yield> {
        &mut self.yields
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn step_output_resets_to_blocked() {
        let mut out = StepOutput::new();
        out.yield_command(1, Command::Sleep(Duration::ZERO));
        out.complete(Ok(Payload::empty()));
        out.reset();
        assert_eq!(out.status(), &Status::Blocked);
        assert!(out.yields().is_empty());
    }
}
