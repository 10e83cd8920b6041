//! The values of a step: the [`Event`]s that go into it ([`Events`]) and the [`Status`]
//! and [`Yield`]s ([`Command`]s) that come out ([`StepOutput`]), with the [`Outcome`] of
//! a command or a process.
//!
//! They are plain data that name nothing of the scheduler's: the scheduler carries them
//! (see [`Process`](crate::Process)) and the journal records them, so both build on this
//! file and neither needs the other to read a record.

use std::borrow::Cow;
use std::time::Duration;

use wasmproc_types::{Payload, Pid};

/// The outcome of a yield, or the result of a whole process.
///
/// Errors are strings because they cross into guests and between processes; the host
/// formats its own errors with their whole chain (`{:#}`) before they become one.
pub type Outcome = Result<Payload, String>;

/// Something a process learns at the start of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A yield finished; `tag` is the tag the process gave it.
    Completion {
        /// The yield's tag.
        tag: u64,
        /// What the command produced, or why it failed.
        result: Outcome,
    },
    /// A message from another process (or from the embedder: sender [`Pid::HOST`]).
    Message {
        /// Who sent it.
        sender: Pid,
        /// What it is about; free-form, used by receivers to filter.
        topic: String,
        /// The content.
        body: Payload,
    },
    /// A monitored process ended with `result`.
    ///
    /// Exit events are never refused for a full mailbox: a process can only receive as
    /// many as it asked for with monitors.
    Exit {
        /// The process that ended.
        pid: Pid,
        /// Its result. A process that did not exist when monitored reports `Err("noproc")`.
        result: Outcome,
    },
    /// The host asks the process to finish (for example at shutdown). A process that
    /// ignores it is terminated when the host's deadline passes.
    Cancel {
        /// Why.
        reason: String,
    },
}

/// A command for the host, tagged so its completion can be matched to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Yield {
    /// Chosen by the process; comes back in [`Event::Completion::tag`].
    pub tag: u64,
    /// What to do.
    pub command: Command,
}

/// What a process can ask the host to do.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Command {
    /// Complete after this long, with an empty payload.
    Sleep(Duration),
    /// Start a process; completes with the child's pid ([`Payload::u64`]).
    Spawn(SpawnRequest),
    /// Put a message in another process's mailbox; completes with an empty payload, or
    /// with the reason it could not be delivered.
    Send {
        /// The receiver.
        to: Pid,
        /// See [`Event::Message::topic`].
        topic: String,
        /// The content.
        body: Payload,
    },
    /// Ask for an [`Event::Exit`] when `pid` ends; completes at once with an empty payload.
    Monitor(Pid),
    /// End `pid` with the result `Err("terminated")`; completes once it has ended.
    Terminate(Pid),
    /// A command handled by a handler the embedder registered under `name`.
    Custom {
        /// The handler's name.
        name: Cow<'static, str>,
        /// The handler's input.
        payload: Payload,
    },
}

impl Command {
    /// The command's name: the capability that grants it, and how errors refer to it.
    pub fn name(&self) -> &str {
        match self {
            Command::Custom { name, .. } => name,
            builtin => builtin.kind().name(),
        }
    }

    /// Which of the [`CommandKind`]s this is: the one match over the commands that their
    /// names, capabilities and stats go through.
    pub(crate) fn kind(&self) -> CommandKind {
        match self {
            Command::Sleep(_) => CommandKind::Sleep,
            Command::Spawn(_) => CommandKind::Spawn,
            Command::Send { .. } => CommandKind::Send,
            Command::Monitor(_) => CommandKind::Monitor,
            Command::Terminate(_) => CommandKind::Terminate,
            Command::Custom { .. } => CommandKind::Custom,
        }
    }

    /// The bytes the command carries that count against `max_payload_size`: a message's
    /// topic and body, a spawn's input, a custom command's payload.
    pub(crate) fn payload_size(&self) -> usize {
        match self {
            Command::Send { topic, body, .. } => message_size(topic, body),
            Command::Spawn(request) => request.input.iter().map(|p| p.data.len()).sum(),
            Command::Custom { payload, .. } => payload.data.len(),
            Command::Sleep(_) | Command::Monitor(_) | Command::Terminate(_) => 0,
        }
    }
}

/// The bytes a message counts against `max_payload_size`, whether yielded as a `send`
/// command or sent during a step (the `send` host function): its topic travels with the
/// body into the receiver's mailbox.
pub(crate) fn message_size(topic: &str, body: &Payload) -> usize {
    topic.len() + body.data.len()
}

/// The kinds of [`Command`], and everything that is decided per kind rather than per
/// command: the name (of a built-in; a custom command is named by its yield), the
/// capability bit that grants it, and its slot in
/// [`Stats::yields_by_command`](crate::scheduler::Stats::yields_by_command). Adding a built-in
/// command is adding a variant here (before `Custom`) and to [`Command`] and
/// [`Command::kind`], a field to [`YieldCounts`](crate::scheduler::YieldCounts), then handling it
/// in dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CommandKind {
    Sleep,
    Spawn,
    Send,
    Monitor,
    Terminate,
    /// Every custom command, whatever its name.
    Custom,
}

impl CommandKind {
    /// Every kind, in stats-slot order: the built-ins in the order `--help` lists them,
    /// then `Custom`.
    pub(crate) const ALL: [CommandKind; 6] = [
        CommandKind::Sleep,
        CommandKind::Spawn,
        CommandKind::Send,
        CommandKind::Monitor,
        CommandKind::Terminate,
        CommandKind::Custom,
    ];

    /// The built-in kinds: every kind but `Custom`.
    pub(crate) const BUILTINS: [CommandKind; 5] = {
        let mut builtins = [CommandKind::Custom; 5];
        let mut i = 0;
        while i < builtins.len() {
            builtins[i] = CommandKind::ALL[i];
            i += 1;
        }
        builtins
    };

    /// The built-in's name (`custom` for every custom command).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            CommandKind::Sleep => "sleep",
            CommandKind::Spawn => "spawn",
            CommandKind::Send => "send",
            CommandKind::Monitor => "monitor",
            CommandKind::Terminate => "terminate",
            CommandKind::Custom => "custom",
        }
    }

    /// The built-in named `name`; `None` for any other name (a custom command's).
    pub(crate) fn builtin(name: &str) -> Option<CommandKind> {
        CommandKind::BUILTINS.into_iter().find(|kind| kind.name() == name)
    }

    /// The bit that grants a built-in in a capability set; `None` for `Custom`, which is
    /// granted by name.
    pub(crate) const fn capability_bit(self) -> Option<u8> {
        match self {
            CommandKind::Custom => None,
            builtin => Some(1 << builtin as u8),
        }
    }

    /// The kind's index in [`CommandKind::ALL`] and in the per-kind counters.
    pub(crate) const fn slot(self) -> usize {
        self as usize
    }
}

/// A request to start a process.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpawnRequest {
    /// The registered kind to start; `None` starts another process of the spawner's kind.
    pub kind: Option<String>,
    /// The entry method to run.
    pub method: String,
    /// The entry method's input.
    pub input: Vec<Payload>,
    /// Also monitor the child, atomically: its [`Event::Exit`] is sure to arrive even if it
    /// ends before the spawn completes.
    pub monitor: bool,
}

/// What a step asks the scheduler to do next.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Status {
    /// Wait for completions of outstanding yields (messages wake the process too).
    #[default]
    Blocked,
    /// Wait for messages (completions wake the process too).
    Idle,
    /// Run again as soon as other processes have had a turn.
    Continue,
    /// The process is finished with this result. Yields written in the same step are
    /// discarded.
    Complete(Outcome),
}

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
    use super::*;

    #[test]
    fn command_kinds_agree_on_names_bits_and_slots() {
        let mut bits = 0u8;
        for (slot, kind) in CommandKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.slot(), slot);
            match kind.capability_bit() {
                Some(bit) => {
                    assert_eq!(CommandKind::builtin(kind.name()), Some(kind));
                    assert_eq!(bits & bit, 0, "{kind:?} shares a capability bit");
                    bits |= bit;
                }
                None => assert_eq!(kind, CommandKind::Custom),
            }
        }
        assert_eq!(CommandKind::BUILTINS.len() + 1, CommandKind::ALL.len());
        assert_eq!(CommandKind::builtin("custom"), None, "`custom` is not a built-in's name");
        let send = Command::Send { to: Pid::HOST, topic: "t".into(), body: Payload::text("body") };
        assert_eq!((send.kind(), send.name(), send.payload_size()), (CommandKind::Send, "send", 5));
        let custom = Command::Custom { name: "db.get".into(), payload: Payload::bytes([1, 2]) };
        assert_eq!((custom.kind(), custom.name(), custom.payload_size()), (CommandKind::Custom, "db.get", 2));
    }

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
