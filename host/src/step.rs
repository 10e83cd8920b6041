//! The values of a step: the [`Event`]s that go into it ([`Events`]) and the [`Status`]
//! and [`Yield`]s ([`Command`]s) that come out ([`StepOutput`]), with the [`Outcome`] of
//! a command or a process.
//!
//! They are plain data that name nothing of the scheduler's: the scheduler carries them
//! (see [`Process`](crate::Process)) and the journal records them, so both build on this
//! file and neither needs the other to read a record.

use std::borrow::Cow;
use std::time::Duration;

use wasmproc_types::{ExitReason, Payload, Pid};

/// The format of the payload that carries a workflow's id, after its entry's input: a
/// workflow started through a service (`wasmproc serve`) or on a cluster's shards is
/// given its id so, for the SDK to read (`Ctx::workflow_id`).
pub const WORKFLOW_ID_FORMAT: &str = "wasmproc-workflow-id";

/// The outcome of a yield.
///
/// Errors are strings because they cross into guests and between processes; the host
/// formats its own errors with their whole chain (`{:#}`) before they become one. A
/// whole process ends with an [`ExitReason`] instead (and an [`Exited`] for whoever
/// waits on it).
pub type Outcome = Result<Payload, String>;

/// How a process ended, as the host records it for whoever waits on it: the
/// [`ExitReason`], and the process whose exit signal ended it, if one did.
///
/// Displays as the end of a sentence about the process (`process 3 …`): its reason's
/// words (`trapped: panic: index out of bounds`), or, for a process ended by another's
/// exit signal, `exited because linked process 7 trapped: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    /// Why it ended.
    pub reason: ExitReason,
    /// The process whose exit signal ended it (a linked process's abnormal exit, or an
    /// `exit` command), when one did; `None` when it ended by itself, was terminated,
    /// or was stopped by the host.
    pub signal_from: Option<Pid>,
}

impl Exited {
    /// An end of the process's own, with `reason`.
    pub fn new(reason: ExitReason) -> Exited {
        Exited { reason, signal_from: None }
    }

    /// An end by the exit signal of process `from`, with the signal's `reason`.
    pub fn by_signal(reason: ExitReason, from: Pid) -> Exited {
        Exited { reason, signal_from: Some(from) }
    }

    /// The process's result: its payload for a normal exit, otherwise the reason.
    pub fn into_result(self) -> Result<Payload, ExitReason> {
        self.reason.into_result()
    }
}

impl From<ExitReason> for Exited {
    fn from(reason: ExitReason) -> Exited {
        Exited::new(reason)
    }
}

impl std::fmt::Display for Exited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.signal_from {
            Some(from) => write!(f, "exited because linked process {from} {}", self.reason),
            None => self.reason.fmt(f),
        }
    }
}

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
    /// A monitored process ended, or a linked one while this process traps exits.
    ///
    /// Exit events are never refused for a full mailbox: a process can only receive as
    /// many as it asked for with monitors and links.
    Exit {
        /// The process that ended.
        pid: Pid,
        /// Why. A process that did not exist when monitored (or linked to) reports
        /// [`ExitReason::Noproc`].
        reason: ExitReason,
        /// True when it arrived through a link (of a process that traps exits), false
        /// when through a monitor.
        linked: bool,
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
    /// End `pid` with the reason [`ExitReason::Terminated`]; completes once it has ended.
    Terminate(Pid),
    /// Link this process and `pid`, both ways: when either ends abnormally the other ends
    /// with the same reason, unless it traps exits ([`Command::TrapExits`]), when it gets
    /// an [`Event::Exit`] with `linked: true` instead. Completes at once.
    Link(Pid),
    /// Remove the link between this process and `pid`, both ways. Completes at once.
    Unlink(Pid),
    /// Stop monitoring `pid`: no [`Event::Exit`] of it arrives through the monitor
    /// afterwards. Completes at once.
    Demonitor(Pid),
    /// Send an exit signal; completes at once.
    Exit(ExitSignal),
    /// Set whether this process traps exits: with `true`, linked processes' abnormal
    /// exits arrive as [`Event::Exit`]s instead of ending it (an untrappable `kill` still
    /// ends it). Completes at once.
    TrapExits(bool),
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
            Command::Link(_) => CommandKind::Link,
            Command::Unlink(_) => CommandKind::Unlink,
            Command::Demonitor(_) => CommandKind::Demonitor,
            Command::Exit(_) => CommandKind::Exit,
            Command::TrapExits(_) => CommandKind::TrapExits,
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
            Command::Exit(signal) => signal.payload_size(),
            Command::Sleep(_)
            | Command::Monitor(_)
            | Command::Terminate(_)
            | Command::Link(_)
            | Command::Unlink(_)
            | Command::Demonitor(_)
            | Command::TrapExits(_) => 0,
        }
    }
}

/// An exit signal for another process ([`Command::Exit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitSignal {
    /// The process it is for.
    pub to: Pid,
    /// The reason it carries. [`ExitReason::Normal`] ends no process: one that traps
    /// exits gets it as an [`Event::Exit`], any other ignores it.
    pub reason: ExitReason,
    /// Untrappable: the receiver ends with [`ExitReason::Killed`] whether it traps exits
    /// or not (Erlang's `kill`).
    pub kill: bool,
}

impl ExitSignal {
    /// The bytes the signal's reason carries, counted against `max_payload_size`.
    pub(crate) fn payload_size(&self) -> usize {
        reason_size(&self.reason)
    }
}

/// The bytes of an exit reason's own text or payload.
pub(crate) fn reason_size(reason: &ExitReason) -> usize {
    match reason {
        ExitReason::Normal(payload) => payload.data.len(),
        ExitReason::Error(text) | ExitReason::Noconnection(text) => text.len(),
        ExitReason::Trap(trap) => trap.message.len(),
        _ => 0,
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
    Link,
    Unlink,
    Demonitor,
    Exit,
    TrapExits,
    /// Every custom command, whatever its name.
    Custom,
}

impl CommandKind {
    /// Every kind, in stats-slot order: the built-ins in the order `--help` lists them,
    /// then `Custom`.
    pub(crate) const ALL: [CommandKind; 11] = [
        CommandKind::Sleep,
        CommandKind::Spawn,
        CommandKind::Send,
        CommandKind::Monitor,
        CommandKind::Terminate,
        CommandKind::Link,
        CommandKind::Unlink,
        CommandKind::Demonitor,
        CommandKind::Exit,
        CommandKind::TrapExits,
        CommandKind::Custom,
    ];

    /// The built-in kinds: every kind but `Custom`.
    pub(crate) const BUILTINS: [CommandKind; 10] = {
        let mut builtins = [CommandKind::Custom; 10];
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
            CommandKind::Link => "link",
            CommandKind::Unlink => "unlink",
            CommandKind::Demonitor => "demonitor",
            CommandKind::Exit => "exit",
            CommandKind::TrapExits => "trap-exits",
            CommandKind::Custom => "custom",
        }
    }

    /// The built-in named `name`; `None` for any other name (a custom command's).
    pub(crate) fn builtin(name: &str) -> Option<CommandKind> {
        CommandKind::BUILTINS.into_iter().find(|kind| kind.name() == name)
    }

    /// The bit that grants a built-in in a capability set; `None` for `Custom`, which is
    /// granted by name.
    pub(crate) const fn capability_bit(self) -> Option<u16> {
        match self {
            CommandKind::Custom => None,
            builtin => Some(1 << builtin as u16),
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
    /// Also link to the child, atomically: the link holds from the child's first step
    /// (see [`Command::Link`]).
    pub link: bool,
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
        let mut bits = 0u16;
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
