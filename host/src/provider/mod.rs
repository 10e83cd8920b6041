//! Providers: families of commands that give processes real I/O, each denied until
//! granted.
//!
//! A [`Provider`] serves every command of one family (`kv.get`, `kv.put`… for the
//! family `kv`), registered with [`Builder::provider`](crate::scheduler::Builder::provider).
//! Its commands are custom commands like any other: a process yields them, a
//! [`Capabilities`](crate::Capabilities) grant (`allow("kv.*")` for the family) lets
//! them through, they complete later without holding a worker, and in a durable process
//! their completions are journaled, so a resumed process does not repeat one it saw
//! complete.
//!
//! # The wire
//!
//! A command's input and its answer are JSON payloads. A failure is a string
//! `"<code>: <message>"`, where `<code>` is one of [`ErrorCode`]'s names, so that a
//! guest can tell a missing grant from a full quota without parsing prose.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Payload;
use crate::handler::Request;
use crate::scheduler::Outcome;

pub use crate::handler::Provider;
/// Why a provider's command failed, as the first word of its error string; the guest SDK
/// reads it back as the same type.
pub use wasmproc_types::ErrorCode;

/// A provider command's failure: its code and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure { code, message: message.into() }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl From<Failure> for String {
    fn from(failure: Failure) -> String {
        failure.to_string()
    }
}

/// Decodes a command's JSON input, or says what was wrong with it.
pub fn input<T: DeserializeOwned>(command: &str, payload: &Payload) -> Result<T, Failure> {
    payload.parse_json().map_err(|e| Failure::new(ErrorCode::Invalid, format!("`{command}` takes JSON input: {e}")))
}

/// A command's answer: `value` as JSON, or the failure.
pub fn answer<T: Serialize>(result: Result<T, Failure>) -> Outcome {
    match result {
        Ok(value) => Payload::json(&value).map_err(|e| format!("unavailable: the answer did not serialise: {e}")),
        Err(failure) => Err(failure.into()),
    }
}

/// The answer to a command the family does not have, listing the ones it has.
pub fn unknown(command: &str, family: &str, commands: &[&str]) -> Failure {
    let list = commands.iter().map(|c| format!("{family}.{c}")).collect::<Vec<_>>().join(", ");
    Failure::new(ErrorCode::Invalid, format!("unknown command `{command}`; the {family} commands are {list}"))
}

pub mod clock;
pub mod env;
pub mod fs;
pub mod http;
pub mod kv;

/// A family of commands served by a process: each command is
/// [forwarded](crate::Handle::forward) to it as a request, and completes when the
/// process answers. How a provider written as a Wasm component serves its family.
#[derive(Clone)]
pub struct Served {
    family: String,
    handle: crate::Handle,
    server: crate::Pid,
    reads: std::sync::Arc<[String]>,
}

impl Served {
    /// The family `family`, served by the process `server` of the scheduler `handle`
    /// (one without a journal: see [`Handle::forward`](crate::Handle::forward)).
    pub fn new(family: impl Into<String>, handle: crate::Handle, server: crate::Pid) -> Self {
        Served { family: family.into(), handle, server, reads: std::sync::Arc::new([]) }
    }

    /// Declares that the commands `names` (whole names, `family.command`) only read (see
    /// [`Provider::reads_only`]): a durable step that yields only reads has them carried
    /// out before its record is committed. The server's code cannot say so itself, so
    /// whoever registers it vouches for it; a command with an effect declared here
    /// loses the write-ahead guarantee. By default none.
    #[must_use]
    pub fn reads(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.reads = names.into_iter().map(Into::into).collect();
        self
    }
}

impl Provider for Served {
    fn family(&self) -> &str {
        &self.family
    }

    fn handle(&self, request: Request<'_>) {
        // A refused forward has completed the command with the reason already.
        if let Err(error) = self.handle.forward(self.server, request) {
            tracing::debug!(family = self.family.as_str(), %error, "a provider process refused a request");
        }
    }

    fn reads_only(&self, name: &str) -> bool {
        self.reads.iter().any(|read| read == name)
    }
}
