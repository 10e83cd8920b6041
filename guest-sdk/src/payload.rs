//! The values a process exchanges with its host and with other processes.

use std::fmt;

use anyhow::{Context as _, bail};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A process id.
///
/// Serialises as a plain number, so pids can travel inside messages and results.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Pid(u64);

impl Pid {
    /// The sender of messages that come from the embedder rather than from a process.
    pub const HOST: Pid = Pid(0);

    /// The pid with the host's number `raw`.
    pub const fn from_u64(raw: u64) -> Self {
        Pid(raw)
    }

    /// The pid as the host's number.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pid({})", self.0)
    }
}

/// Bytes plus the name of their format: inputs, results, message bodies.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Payload {
    /// How to read `data`: `json`, `bytes`, `text`, or a name both sides agree on.
    pub format: String,
    /// The content.
    pub data: Vec<u8>,
}

impl Payload {
    /// The format name of JSON payloads.
    pub const JSON: &str = "json";
    /// The format name of opaque bytes.
    pub const BYTES: &str = "bytes";
    /// The format name of UTF-8 text.
    pub const TEXT: &str = "text";

    /// `value` serialised as JSON.
    ///
    /// # Errors
    ///
    /// Fails if `value` cannot be serialised (for example a map with non-string keys).
    pub fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<Self> {
        let data = serde_json::to_vec(value).context("failed to serialise a JSON payload")?;
        Ok(Payload { format: Self::JSON.to_owned(), data })
    }

    /// Opaque bytes.
    pub fn bytes(data: impl Into<Vec<u8>>) -> Self {
        Payload { format: Self::BYTES.to_owned(), data: data.into() }
    }

    /// UTF-8 text.
    pub fn text(text: impl Into<String>) -> Self {
        Payload { format: Self::TEXT.to_owned(), data: text.into().into_bytes() }
    }

    /// The data as text, if it is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.data).ok()
    }

    /// Reads the payload as a `T`.
    ///
    /// A `json` payload is parsed; a `text` payload is read as a JSON string; an empty
    /// `bytes` payload (what commands that return nothing complete with) is read as JSON
    /// `null`, so it decodes into `()` or `None`.
    ///
    /// # Errors
    ///
    /// Fails if the data does not have the shape `T` expects, or the format is none of
    /// the above.
    pub fn decode<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        let value = match self.format.as_str() {
            Self::JSON => return serde_json::from_slice(&self.data).context("failed to decode a JSON payload"),
            Self::TEXT => serde_json::Value::String(self.as_str().context("a `text` payload is not UTF-8")?.to_owned()),
            Self::BYTES if self.data.is_empty() => serde_json::Value::Null,
            other => bail!("cannot decode a `{other}` payload of {} bytes; expected `json` or `text`", self.data.len()),
        };
        serde_json::from_value(value).with_context(|| format!("failed to decode a `{}` payload", self.format))
    }
}

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

impl Message {
    /// The body read as a `T`; see [`Payload::decode`].
    ///
    /// # Errors
    ///
    /// Fails if the body does not decode into a `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        self.body.decode().with_context(|| format!("bad `{}` message from process {}", self.topic, self.sender))
    }
}

/// How important a log line is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the process survived.
    Warn,
    /// Something failed.
    Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_format() {
        assert_eq!(Payload::json(&[1, 2]).unwrap().decode::<Vec<u8>>().unwrap(), [1, 2]);
        assert_eq!(Payload::text("hi").decode::<String>().unwrap(), "hi");
        Payload::bytes([]).decode::<()>().unwrap();
        assert_eq!(Payload::bytes([]).decode::<Option<u8>>().unwrap(), None);
        let error = Payload::bytes([1, 2]).decode::<u8>().unwrap_err();
        assert_eq!(error.to_string(), "cannot decode a `bytes` payload of 2 bytes; expected `json` or `text`");
    }

    #[test]
    fn pids_serialise_as_numbers() {
        assert_eq!(serde_json::to_string(&Pid::from_u64(7)).unwrap(), "7");
        assert_eq!(serde_json::from_str::<Pid>("7").unwrap(), Pid::from_u64(7));
    }
}
