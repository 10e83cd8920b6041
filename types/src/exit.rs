//! [`ExitReason`]: why a process ended, as data rather than a string.
//!
//! The same closed set crosses the Wasm boundary (the WIT `exit-reason` variant), the
//! journal and the cluster's wire, so a guest in any language, a monitor and the CLI all
//! tell a trap from a termination without parsing prose.

use alloc::string::String;
use core::fmt;

use crate::Payload;

/// Why a process ended.
///
/// Only [`ExitReason::Normal`] is a normal exit: it does not propagate over links, and a
/// supervisor's `transient` child that ends with it is not restarted. Every other reason
/// is abnormal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitReason {
    /// It completed, with this result.
    Normal(Payload),
    /// It returned an error (its entry's `Err`, or a step that failed without trapping).
    Error(String),
    /// It trapped: the guest panicked or hit a limit.
    Trap(Trap),
    /// It was killed: by the untrappable `kill` exit signal, or forced at a deadline
    /// (a shutdown timeout, the host's stop) after it ignored the request to finish.
    Killed,
    /// It was shut down in order: by its supervisor, or by the host's graceful stop.
    Shutdown,
    /// A `terminate` command (or the embedder's terminate) ended it.
    Terminated,
    /// It did not exist when it was linked to or monitored.
    Noproc,
    /// Its node left the cluster or could not be reached; the node's name (or its id
    /// when the name is unknown).
    Noconnection(String),
}

/// How a process trapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trap {
    /// Which kind of trap.
    pub kind: TrapKind,
    /// What the guest or the host said: the panic's message and location, the limit
    /// and its value.
    pub message: String,
}

/// The kinds of [`Trap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TrapKind {
    /// The guest panicked (a Rust panic, an uncaught Python or JavaScript exception).
    Panic,
    /// The guest reached `unreachable` without reporting a panic.
    Unreachable,
    /// The process used all of its fuel.
    OutOfFuel,
    /// The process used all of its CPU budget.
    CpuBudget,
    /// The process tried to grow its memory past its limit.
    MemoryLimit,
    /// The guest overflowed its stack.
    StackOverflow,
    /// Any other trap: out-of-bounds memory access, an integer division by zero, …
    Other,
}

impl TrapKind {
    /// Every kind, in declaration order.
    pub const ALL: [TrapKind; 7] = [
        TrapKind::Panic,
        TrapKind::Unreachable,
        TrapKind::OutOfFuel,
        TrapKind::CpuBudget,
        TrapKind::MemoryLimit,
        TrapKind::StackOverflow,
        TrapKind::Other,
    ];

    /// The kind's name, as the WIT `trap-kind` enum and the CLI's `--json` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            TrapKind::Panic => "panic",
            TrapKind::Unreachable => "unreachable",
            TrapKind::OutOfFuel => "out-of-fuel",
            TrapKind::CpuBudget => "cpu-budget",
            TrapKind::MemoryLimit => "memory-limit",
            TrapKind::StackOverflow => "stack-overflow",
            TrapKind::Other => "other",
        }
    }

    /// The kind named `name` ([`TrapKind::as_str`]); `None` for any other name.
    pub fn from_name(name: &str) -> Option<TrapKind> {
        TrapKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for TrapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ExitReason {
    /// Every reason's name, in declaration order ([`ExitReason::name`]).
    pub const NAMES: [&str; 8] =
        ["normal", "error", "trap", "killed", "shutdown", "terminated", "noproc", "noconnection"];

    /// Whether this is a normal exit: the only one that does not propagate over links.
    pub fn is_normal(&self) -> bool {
        matches!(self, ExitReason::Normal(_))
    }

    /// The reason's name: `normal`, `error`, `trap`, `killed`, `shutdown`, `terminated`,
    /// `noproc` or `noconnection`.
    pub fn name(&self) -> &'static str {
        match self {
            ExitReason::Normal(_) => "normal",
            ExitReason::Error(_) => "error",
            ExitReason::Trap(_) => "trap",
            ExitReason::Killed => "killed",
            ExitReason::Shutdown => "shutdown",
            ExitReason::Terminated => "terminated",
            ExitReason::Noproc => "noproc",
            ExitReason::Noconnection(_) => "noconnection",
        }
    }

    /// A trap of `kind` with `message`.
    pub fn trap(kind: TrapKind, message: impl Into<String>) -> ExitReason {
        ExitReason::Trap(Trap { kind, message: message.into() })
    }

    /// The process's result: its payload for a normal exit, otherwise the reason.
    pub fn into_result(self) -> Result<Payload, ExitReason> {
        match self {
            ExitReason::Normal(payload) => Ok(payload),
            abnormal => Err(abnormal),
        }
    }
}

impl From<Result<Payload, String>> for ExitReason {
    /// A process's own result: `Ok` is a normal exit, `Err` an error.
    fn from(result: Result<Payload, String>) -> Self {
        match result {
            Ok(payload) => ExitReason::Normal(payload),
            Err(error) => ExitReason::Error(error),
        }
    }
}

/// One line, as a sentence's end: `trapped: panic: index out of bounds`, `returned an
/// error: …`, `was terminated`. A normal exit writes `exited normally`, its payload left
/// to whoever knows its format.
impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitReason::Normal(_) => f.write_str("exited normally"),
            ExitReason::Error(error) => write!(f, "returned an error: {error}"),
            ExitReason::Trap(Trap { kind, message }) => write!(f, "trapped: {kind}: {message}"),
            ExitReason::Killed => f.write_str("was killed"),
            ExitReason::Shutdown => f.write_str("was shut down"),
            ExitReason::Terminated => f.write_str("was terminated"),
            ExitReason::Noproc => f.write_str("did not exist (noproc)"),
            ExitReason::Noconnection(node) => write!(f, "was lost with its node (noconnection: {node})"),
        }
    }
}

/// An error a native process's step may return to end it with this reason (a trap, say):
/// the host finds it in the step's error and ends the process with it.
impl core::error::Error for ExitReason {}

#[cfg(test)]
mod tests {
    use alloc::string::ToString;

    use super::*;

    #[test]
    fn trap_kinds_read_back_from_their_names() {
        for kind in TrapKind::ALL {
            assert_eq!(TrapKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(TrapKind::from_name("fire"), None);
    }

    #[test]
    fn only_normal_is_normal_and_names_are_listed_in_order() {
        let every = [
            ExitReason::Normal(Payload::empty()),
            ExitReason::Error("e".into()),
            ExitReason::trap(TrapKind::Panic, "boom"),
            ExitReason::Killed,
            ExitReason::Shutdown,
            ExitReason::Terminated,
            ExitReason::Noproc,
            ExitReason::Noconnection("b".into()),
        ];
        for (reason, name) in every.iter().zip(ExitReason::NAMES) {
            assert_eq!(reason.name(), name);
            assert_eq!(reason.is_normal(), name == "normal");
        }
    }

    #[test]
    fn displays_as_the_end_of_a_sentence() {
        let trap = ExitReason::trap(TrapKind::Panic, "index out of bounds");
        assert_eq!(trap.to_string(), "trapped: panic: index out of bounds");
        assert_eq!(ExitReason::from(Err::<Payload, _>("no".into())).to_string(), "returned an error: no");
        assert_eq!(ExitReason::from(Ok(Payload::text("x"))).into_result(), Ok(Payload::text("x")));
    }
}
