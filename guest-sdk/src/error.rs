//! The SDK's typed [`Error`], and the [`ErrorCode`] of a failed command.

use std::fmt;
use std::time::Duration;

pub use wasmproc_types::ErrorCode;

use crate::payload::{ExitReason, Pid};

/// Why something a process asked of its host did not happen.
///
/// Every [`Ctx`](crate::Ctx) method that can fail returns it, so a guest can match on what
/// it can handle (a full mailbox, a conflict, a cancellation) and pass the rest on with
/// `?`: it converts into an `anyhow::Error` like any error, and its text says what failed.
///
/// ```
/// # use wasmproc_guest::prelude::*;
/// # use wasmproc_guest::ErrorCode;
/// async fn notify(ctx: &Ctx, to: Pid) -> Result<bool> {
///     match ctx.send(to, "news", "hello") {
///         Ok(()) => Ok(true),
///         // Gone, or too busy to hear it: not this process's problem.
///         Err(Error::NoProc(_) | Error::MailboxFull(_)) => Ok(false),
///         Err(other) => Err(other.into()),
///     }
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The host asked the process to finish, for this reason. From then on every wait
    /// fails with it (what had already arrived is still delivered), so the process can
    /// finish before the host's deadline.
    Cancelled(String),
    /// [`Ctx::timeout`](crate::Ctx::timeout) ran out after this long.
    Timeout(Duration),
    /// No such process: it never existed, has ended, or is exiting.
    NoProc(Pid),
    /// The receiver's mailbox is full; the message was not delivered.
    MailboxFull(Pid),
    /// Not granted: what was refused and why, as the host words it (naming the grant).
    Denied(String),
    /// A limit of the host was reached (processes, a quota): what and which, as the host
    /// words it.
    Limit(String),
    /// A command failed for another reason.
    Command {
        /// The command, as a phrase: ``custom command `kv.get` ``, ``spawning `square` ``.
        command: String,
        /// What kind of failure, as the host's providers classify it.
        code: ErrorCode,
        /// The host's error.
        message: String,
    },
    /// A process this one waited for ended abnormally: terminated, trapped, or its entry
    /// failed.
    Failed {
        /// The process.
        pid: Pid,
        /// Why it ended: any [`ExitReason`] but `Normal` (and `Noproc`, which is
        /// [`Error::NoProc`]).
        reason: ExitReason,
    },
    /// A value did not serialise, or a payload did not decode into the type asked for.
    Payload(String),
}

impl Error {
    /// The error of `command` (a phrase) whose completion was the host's `message`.
    pub(crate) fn command(command: &str, message: String) -> Error {
        match ErrorCode::of(&message) {
            ErrorCode::Denied => Error::Denied(format!("{command} failed: {message}")),
            ErrorCode::Limit => Error::Limit(format!("{command} failed: {message}")),
            code => Error::Command { command: command.to_owned(), code, message },
        }
    }

    /// The error of a message to `to` that the host's `send` refused with `message`
    /// (its `SendError` and `PortError` texts).
    pub(crate) fn send(to: Pid, message: String) -> Error {
        if message.starts_with("no process ") || message.ends_with("is exiting and accepts no more messages") {
            Error::NoProc(to)
        } else if message.starts_with("mailbox of process ") {
            Error::MailboxFull(to)
        } else {
            Error::command("send", message)
        }
    }

    /// The error of a process that ended abnormally with `reason`; `noproc` is the
    /// host's exit for a process that did not exist when it was monitored.
    pub(crate) fn exited(pid: Pid, reason: ExitReason) -> Error {
        match reason {
            ExitReason::Noproc => Error::NoProc(pid),
            reason => Error::Failed { pid, reason },
        }
    }

    /// A payload that would not serialise or decode, as `what` says.
    pub(crate) fn payload(what: impl fmt::Display, error: impl fmt::Display) -> Error {
        Error::Payload(format!("{what}: {error}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cancelled(reason) => write!(f, "cancelled: {reason}"),
            Error::Timeout(after) => write!(f, "timed out after {after:?}"),
            Error::NoProc(pid) => write!(f, "no process {pid}: it never existed, has ended or is exiting"),
            Error::MailboxFull(pid) => write!(f, "the mailbox of process {pid} is full"),
            Error::Denied(message) | Error::Limit(message) | Error::Payload(message) => f.write_str(message),
            Error::Command { command, message, .. } => write!(f, "{command} failed: {message}"),
            Error::Failed { pid, reason } => write!(f, "process {pid} {reason}"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(message: &str) -> Option<ErrorCode> {
        match Error::command("custom command `x`", message.to_owned()) {
            Error::Command { code, .. } => Some(code),
            Error::Denied(_) => Some(ErrorCode::Denied),
            Error::Limit(_) => Some(ErrorCode::Limit),
            _ => None,
        }
    }

    #[test]
    fn command_errors_are_classified_by_their_code() {
        assert_eq!(code("denied: no"), Some(ErrorCode::Denied));
        assert_eq!(code("permission denied: kv.get"), Some(ErrorCode::Denied));
        assert_eq!(code("unknown command `x`"), Some(ErrorCode::Unknown));
        assert_eq!(code("conflict: k is at 3"), Some(ErrorCode::Conflict));
        assert_eq!(code("limit: 10 keys"), Some(ErrorCode::Limit));
        assert_eq!(code("process limit reached: 10 processes are running"), Some(ErrorCode::Limit));
        assert_eq!(code("the database is down"), Some(ErrorCode::Other));
        assert_eq!(
            Error::command("custom command `x`", "permission denied: x".into()).to_string(),
            "custom command `x` failed: permission denied: x"
        );
    }

    #[test]
    fn send_refusals_and_exits_are_typed() {
        let to = Pid::from_u64(9);
        assert_eq!(Error::send(to, "no process 9: it never existed or has ended".into()), Error::NoProc(to));
        assert_eq!(Error::send(to, "process 9 is exiting and accepts no more messages".into()), Error::NoProc(to));
        assert_eq!(
            Error::send(to, "mailbox of process 9 is full (1024 undelivered messages); retry later".into()),
            Error::MailboxFull(to)
        );
        assert_eq!(
            Error::send(to, "permission denied: send".into()),
            Error::Denied("send failed: permission denied: send".into())
        );
        assert_eq!(Error::exited(to, ExitReason::Noproc), Error::NoProc(to));
        assert_eq!(Error::exited(to, ExitReason::Terminated).to_string(), "process 9 was terminated");
        let trap = ExitReason::trap(crate::TrapKind::Panic, "index out of bounds");
        assert_eq!(Error::exited(to, trap).to_string(), "process 9 trapped: panic: index out of bounds");
    }
}
