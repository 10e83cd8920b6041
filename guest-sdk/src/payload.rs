//! The values a process exchanges with its host and with other processes: the boundary
//! types shared with the host, and [`Message`].

use serde::de::DeserializeOwned;
pub use wasmproc_types::{DecodeError, ExitReason, Format, Level, Payload, Pid, Trap, TrapKind};

/// A message from another process's mailbox.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Message {
    /// Who sent it ([`Pid::HOST`] for the embedder).
    pub sender: Pid,
    /// What it is about; [`Ctx::recv_topic`](crate::Ctx::recv_topic) filters on it.
    pub topic: String,
    /// The content.
    pub body: Payload,
}

/// An exit signal the process trapped ([`Ctx::trap_exits`](crate::Ctx::trap_exits)): a
/// linked process ended, or one sent it [`Ctx::exit`](crate::Ctx::exit). Received with
/// [`Ctx::recv_exit`](crate::Ctx::recv_exit).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LinkedExit {
    /// The process that ended (a link's), or that sent the signal.
    pub pid: Pid,
    /// Why: its exit reason, or the one sent. `noproc` for a link to a process that did
    /// not exist.
    pub reason: ExitReason,
}

impl Message {
    /// The body read as a `T`; see [`Payload::decode`].
    ///
    /// Fails with [`Error::Payload`](crate::Error::Payload) if the body does not decode
    /// into a `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, crate::Error> {
        self.body.decode().map_err(|e| {
            crate::Error::payload(format_args!("bad `{}` message from process {}", self.topic, self.sender), e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_errors_name_topic_and_sender() {
        let message = Message { sender: Pid::from_u64(4), topic: "job".into(), body: Payload::text("x") };
        let error = message.decode::<u8>().unwrap_err();
        assert_eq!(
            error.to_string().split(": ").take(2).collect::<Vec<_>>(),
            ["bad `job` message from process 4", "failed to decode a `text` payload"]
        );
    }
}
