//! Typed wrappers of the host's providers (`ctx.http()`, `ctx.kv()`, `ctx.fs()`, …), and
//! serving requests as a provider ([`Ctx::next_request`]).
//!
//! Each wrapper method is one custom command, so it waits like any other: the step ends,
//! other processes run, and the answer arrives as a completion (in a durable process, a
//! recorded one). A command the process was not granted fails with [`Error::Denied`](crate::Error::Denied),
//! whose message names the grant to ask for; other failures are
//! [`Error::Command`](crate::Error::Command) with the provider's [`ErrorCode`](crate::ErrorCode).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::ctx::{Completion, Ctx};
use crate::error::Error;
use crate::executor::Shared;
use crate::payload::{Payload, Pid};

impl Ctx {
    /// Outbound HTTP through the host's `http` provider (`wasmproc run --allow-host`).
    pub fn http(&self) -> Http {
        Http { ctx: self.clone() }
    }

    /// The host's persistent key-value store (`wasmproc run --kv DIR`).
    pub fn kv(&self) -> Kv {
        Kv { ctx: self.clone() }
    }

    /// Files in the directories granted to the process (`wasmproc run --dir`).
    pub fn fs(&self) -> Fs {
        Fs { ctx: self.clone() }
    }

    /// The environment variable `name`, if it was granted (`wasmproc run --env`).
    pub fn env(&self, name: &str) -> Completion<Option<String>> {
        self.call("env.get", json!({ "name": name }))
    }

    /// The host's wall clock, as a command: a durable process reads the same time when
    /// it is replayed. It only reads, so a durable host answers it without waiting for
    /// the step's record to be synced.
    pub fn now(&self) -> Completion<SystemTime> {
        self.call_with("time.now", json!({}), |payload| {
            #[derive(Deserialize)]
            struct Now {
                unix_nanos: u64,
            }
            let now: Now = payload.decode().map_err(bad_answer)?;
            Ok(UNIX_EPOCH + Duration::from_nanos(now.unix_nanos))
        })
    }

    /// `count` random bytes from the host's generator (at most 64 KiB), as a command: a
    /// durable process reads the same bytes when it is replayed, and, as with
    /// [`Ctx::now`], does not wait for its step's record to be synced.
    pub fn random_bytes(&self, count: usize) -> Completion<Vec<u8>> {
        self.call_with("random.bytes", json!({ "count": count }), |payload| Ok(payload.data))
    }
}

/// `http.*`: see [`Ctx::http`].
pub struct Http {
    ctx: Ctx,
}

/// An HTTP request for [`Http::send`].
#[derive(Clone, Debug, Serialize)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// `http://` or `https://`, to a host the process was granted.
    pub url: String,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// An HTTP response.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text.
    ///
    /// # Errors
    ///
    /// If it is not UTF-8.
    pub fn text(&self) -> anyhow::Result<&str> {
        std::str::from_utf8(&self.body).map_err(|e| anyhow!("the response body is not UTF-8: {e}"))
    }

    /// The body decoded from JSON.
    ///
    /// # Errors
    ///
    /// If it does not decode into a `T`.
    pub fn json<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| anyhow!("the response body is not the JSON expected: {e}"))
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl Http {
    /// `GET url`.
    pub fn get(&self, url: &str) -> Completion<Response> {
        self.send(Request { method: "GET".to_owned(), url: url.to_owned(), headers: Vec::new(), body: None })
    }

    /// `POST url` with `body` as JSON.
    pub fn post_json(&self, url: &str, body: &impl Serialize) -> Completion<Response> {
        let body = serde_json::to_string(body).unwrap_or_default();
        let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        self.send(Request { method: "POST".to_owned(), url: url.to_owned(), headers, body: Some(body) })
    }

    /// Any request.
    pub fn send(&self, request: Request) -> Completion<Response> {
        self.ctx.call_with("http.request", request, decode_response)
    }
}

fn decode_response(payload: Payload) -> Result<Response, Error> {
    #[derive(Deserialize)]
    struct Wire {
        status: u16,
        #[serde(default)]
        headers: Vec<(String, String)>,
        body: Option<String>,
        body_base64: Option<String>,
    }
    let wire: Wire = payload.decode().map_err(bad_answer)?;
    let body = match (wire.body, wire.body_base64) {
        (Some(text), _) => text.into_bytes(),
        (None, Some(encoded)) => base64_decode(&encoded).map_err(bad_answer)?,
        (None, None) => Vec::new(),
    };
    Ok(Response { status: wire.status, headers: wire.headers, body })
}

/// A provider's answer that does not decode.
fn bad_answer(error: impl std::fmt::Display) -> Error {
    Error::payload("bad answer", error)
}

/// Standard base64 with padding, as the host encodes a body that is not UTF-8.
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c).ok_or_else(|| anyhow!("bad base64 in the response body"))? << (18 - 6 * i);
        }
        let produced = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + produced]);
    }
    Ok(out)
}

/// `kv.*`: see [`Ctx::kv`]. Values are JSON.
pub struct Kv {
    ctx: Ctx,
}

/// A value read from the key-value store, with the version to compare-and-swap against.
#[derive(Clone, Debug, Deserialize)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// Its version: every write gives the key a new, larger one.
    pub version: u64,
}

/// A page of keys from [`Kv::list`].
#[derive(Clone, Debug, Deserialize)]
pub struct Keys {
    /// The keys, in order.
    pub keys: Vec<String>,
    /// Whether more keys follow the last one (list again with `after`).
    pub more: bool,
}

impl Kv {
    /// The value of `key` and its version; `None` when it has none.
    pub fn get<T: DeserializeOwned + 'static>(&self, key: &str) -> Completion<Option<Versioned<T>>> {
        self.ctx.call("kv.get", json!({ "key": key }))
    }

    /// Sets `key` to `value`; resolves to the new version.
    pub fn put(&self, key: &str, value: &impl Serialize) -> Completion<u64> {
        self.ctx.call_with("kv.put", json!({ "key": key, "value": value }), version_of)
    }

    /// Sets `key` to `value` only if it is at `version` (0: only if it has no value);
    /// fails with [`ErrorCode::Conflict`](crate::ErrorCode::Conflict) otherwise. Resolves to the new version.
    pub fn compare_and_swap(&self, key: &str, version: u64, value: &impl Serialize) -> Completion<u64> {
        self.ctx.call_with("kv.cas", json!({ "key": key, "version": version, "value": value }), version_of)
    }

    /// Removes `key`; resolves to whether it had a value.
    pub fn delete(&self, key: &str) -> Completion<bool> {
        self.ctx.call_with("kv.delete", json!({ "key": key }), |payload| {
            #[derive(Deserialize)]
            struct Deleted {
                deleted: bool,
            }
            Ok(payload.decode::<Deleted>().map_err(bad_answer)?.deleted)
        })
    }

    /// The keys that start with `prefix`, in order, after `after` if given: one page.
    pub fn list(&self, prefix: &str, after: Option<&str>) -> Completion<Keys> {
        self.ctx.call("kv.list", json!({ "prefix": prefix, "after": after }))
    }
}

fn version_of(payload: Payload) -> Result<u64, Error> {
    #[derive(Deserialize)]
    struct Version {
        version: u64,
    }
    Ok(payload.decode::<Version>().map_err(bad_answer)?.version)
}

/// `fs.*`: see [`Ctx::fs`]. Paths are the guest paths of the grants (`/data/in.txt`).
pub struct Fs {
    ctx: Ctx,
}

/// One entry of [`Fs::list`].
#[derive(Clone, Debug, Deserialize)]
pub struct DirEntry {
    /// Its name in the directory.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Its size in bytes.
    pub size: u64,
}

impl Fs {
    /// The bytes of the file at `path`.
    pub fn read(&self, path: &str) -> Completion<Vec<u8>> {
        self.ctx.call_with("fs.read", json!({ "path": path }), |payload| Ok(payload.data))
    }

    /// The file at `path` as text.
    pub fn read_to_string(&self, path: &str) -> Completion<String> {
        self.ctx.call_with("fs.read", json!({ "path": path }), |payload| {
            String::from_utf8(payload.data).map_err(|e| Error::payload("the file is not UTF-8", e))
        })
    }

    /// Creates or replaces the file at `path` with `text` (a writable grant only).
    pub fn write(&self, path: &str, text: &str) -> Completion<()> {
        self.ctx.call_with("fs.write", json!({ "path": path, "text": text }), |_| Ok(()))
    }

    /// Appends `text` to the file at `path`, creating it if missing (a writable grant
    /// only).
    pub fn append(&self, path: &str, text: &str) -> Completion<()> {
        self.ctx.call_with("fs.write", json!({ "path": path, "text": text, "append": true }), |_| Ok(()))
    }

    /// Creates or replaces the file at `path` with `data` (a writable grant only).
    pub fn write_bytes(&self, path: &str, data: &[u8]) -> Completion<()> {
        self.ctx.call_with("fs.write", json!({ "path": path, "data": data }), |_| Ok(()))
    }

    /// The entries of the directory at `path`, by name.
    pub fn list(&self, path: &str) -> Completion<Vec<DirEntry>> {
        self.ctx.call_with("fs.list", json!({ "path": path }), |payload| {
            #[derive(Deserialize)]
            struct Entries {
                entries: Vec<DirEntry>,
            }
            Ok(payload.decode::<Entries>().map_err(bad_answer)?.entries)
        })
    }

    /// Removes the file or empty directory at `path` (a writable grant only).
    pub fn remove(&self, path: &str) -> Completion<()> {
        self.ctx.call_with("fs.remove", json!({ "path": path }), |_| Ok(()))
    }
}

/// A command this process was asked to carry out, as a provider: see
/// [`Ctx::next_request`].
#[derive(Debug)]
pub struct ServeRequest {
    id: u64,
    /// The process that yielded the command.
    pub caller: Pid,
    /// The command's whole name (`inventory.reserve`).
    pub command: String,
    /// For a command of a durable process, a key that is the same each time the
    /// command is carried out, so a retry after a crash can be recognised.
    pub idempotency_key: Option<String>,
    /// The command's input.
    pub input: Payload,
}

impl ServeRequest {
    /// The input decoded from JSON.
    ///
    /// # Errors
    ///
    /// If it does not decode into a `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        self.input.decode().map_err(|e| anyhow!("bad input to `{}`: {e}", self.command))
    }

    /// Completes the command with `result`: a value as JSON, or the error's text
    /// (with its causes). Consumes the request: each is answered once.
    ///
    /// # Errors
    ///
    /// If the value does not serialise, or the host no longer holds the request.
    pub fn respond<T: Serialize>(self, result: Result<T, impl Into<anyhow::Error>>) -> anyhow::Result<()> {
        let answer = match result {
            Ok(value) => Ok(Payload::json(&value)?),
            Err(error) => Err(format!("{:#}", error.into())),
        };
        crate::host::respond(self.id, answer).map_err(|e| anyhow!("cannot answer `{}`: {e}", self.command))
    }
}

/// The parts of a request's topic, `COMMAND#ID` or `COMMAND#ID#KEY`.
fn parse_request_topic(topic: &str) -> Option<(&str, u64, Option<&str>)> {
    let (command, rest) = topic.split_once('#')?;
    let (id, key) = match rest.split_once('#') {
        Some((id, key)) => (id, Some(key)),
        None => (rest, None),
    };
    Some((command, id.parse().ok()?, key))
}

impl Ctx {
    /// The next command this process is asked to carry out, as a provider (a component
    /// run with `wasmproc run --provider NAME=FILE`). Answer it with
    /// [`ServeRequest::respond`], now or later: requests are independent, so a provider
    /// may hold several and answer them in any order.
    ///
    /// Fails once the process is cancelled and no request is waiting, so a serving loop
    /// that propagates errors ends at shutdown by itself.
    pub fn next_request(&self) -> NextRequest {
        NextRequest { shared: self.shared() }
    }
}

/// A [`Ctx::next_request`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct NextRequest {
    shared: Rc<Shared>,
}

impl Future for NextRequest {
    type Output = Result<ServeRequest, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let poll = self.shared.poll_message_where(|topic| parse_request_topic(topic).is_some(), cx.waker());
        poll.map(|message| {
            let message = message.map_err(Error::Cancelled)?;
            let (command, id, key) =
                parse_request_topic(&message.topic).expect("only messages with a request topic are taken");
            Ok(ServeRequest {
                id,
                caller: message.sender,
                command: command.to_owned(),
                idempotency_key: key.map(str::to_owned),
                input: message.body,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_topics_parse() {
        assert_eq!(parse_request_topic("inventory.reserve#17"), Some(("inventory.reserve", 17, None)));
        assert_eq!(parse_request_topic("a.b#3#9-4-2"), Some(("a.b", 3, Some("9-4-2"))));
        assert_eq!(parse_request_topic("plain topic"), None);
        assert_eq!(parse_request_topic("a#x"), None);
    }

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("AP8=").unwrap(), [0, 255]);
        assert_eq!(base64_decode("").unwrap(), b"");
        assert!(base64_decode("a$==").is_err());
    }
}
