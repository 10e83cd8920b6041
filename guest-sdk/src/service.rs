//! What a workflow of `wasmproc serve` has beyond a process: its id
//! ([`Ctx::workflow_id`]), requests it answers ([`Ctx::next_workflow_request`]) and
//! typed signals ([`Ctx::recv_signal`]).
//!
//! The contract has nothing of its own for workflows; the service speaks to a workflow through
//! what every process has:
//!
//! - its **id** is a payload after the entry's input, of format `wasmproc-workflow-id`
//!   (the id's UTF-8 bytes), which `init` takes out before the entry decodes its input,
//!   and which the SDK passes on to every child it spawns, so the whole tree knows it;
//! - a **request** is a message from the host with topic `wasmproc:request:ID:TOPIC`
//!   and the request's JSON body; plain receives ([`Ctx::recv`]) leave such messages
//!   to [`Ctx::next_workflow_request`];
//! - an **answer** is the custom command `workflow.answer` with `{"request": ID, "ok":
//!   VALUE}` or `{"request": ID, "error": TEXT}`: a command, so the service records it
//!   in the workflow's history before it carries it out.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::ctx::{Completion, Ctx};
use crate::error::Error;
use crate::executor::Shared;
use crate::payload::{Format, Payload};

/// The topics of requests begin with this, then `ID:TOPIC`.
pub(crate) const TOPIC_PREFIX: &str = "wasmproc:request:";

/// The format of the payload that carries the workflow's id.
pub(crate) const WORKFLOW_ID_FORMAT: &str = "wasmproc-workflow-id";

/// The custom command that answers a request.
const ANSWER: &str = "workflow.answer";

/// The payload that tells a process the workflow it belongs to.
pub(crate) fn workflow_payload(id: &str) -> Payload {
    Payload { format: Format::Other(WORKFLOW_ID_FORMAT.into()), data: id.as_bytes().to_vec() }
}

/// The request id and topic of a request message's topic.
fn parse_topic(topic: &str) -> Option<(&str, &str)> {
    topic.strip_prefix(TOPIC_PREFIX)?.split_once(':')
}

impl Ctx {
    /// The id of the workflow this process belongs to: the one it was started with
    /// through `wasmproc serve` (`wasmproc start --id`), for the workflow's root process
    /// and every process it spawns with this SDK. `None` for a process started otherwise
    /// (`wasmproc run`).
    pub fn workflow_id(&self) -> Option<&str> {
        self.shared_ref().workflow()
    }

    /// The next request to this workflow (`wasmproc request`, `POST
    /// /v1/workflows/{id}/request`), on any topic, once there is one. Answer it with
    /// [`WorkflowRequest::respond`], now or later: the caller waits for the answer.
    ///
    /// Requests are delivered to the workflow's root process, and only it may answer
    /// them. Each is delivered once, even across restarts of the server.
    ///
    /// Fails once the process is cancelled and no request is waiting.
    pub fn next_workflow_request(&self) -> NextWorkflowRequest {
        NextWorkflowRequest { shared: self.shared(), topic: None }
    }

    /// Like [`Ctx::next_workflow_request`], for requests on `topic` only; others stay
    /// queued, in order.
    pub fn next_workflow_request_on(&self, topic: &str) -> NextWorkflowRequest {
        NextWorkflowRequest { shared: self.shared(), topic: Some(topic.to_owned()) }
    }

    /// The next signal on `topic` (`wasmproc signal`, or a message from another process
    /// on that topic), its JSON body decoded into a `T`.
    ///
    /// Fails with [`Error::Payload`] naming the topic and the type if the body does not
    /// decode: the message is taken all the same, so a loop may report it and go on. Fails
    /// once the process is cancelled and no such message is waiting.
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// #[derive(serde::Deserialize)]
    /// struct Deposit { amount: u64 }
    ///
    /// async fn next_deposit(ctx: &Ctx) -> Result<u64> {
    ///     loop {
    ///         match ctx.recv_signal::<Deposit>("deposit").await {
    ///             Ok(deposit) => return Ok(deposit.amount),
    ///             Err(Error::Payload(why)) => log::warn!("{why}"),
    ///             Err(other) => return Err(other.into()),
    ///         }
    ///     }
    /// }
    /// ```
    pub fn recv_signal<T: DeserializeOwned>(&self, topic: &str) -> RecvSignal<T> {
        RecvSignal { shared: self.shared(), topic: topic.to_owned(), value: PhantomData }
    }
}

/// A request to the workflow, to answer with [`WorkflowRequest::respond`]: see
/// [`Ctx::next_workflow_request`].
pub struct WorkflowRequest {
    shared: Rc<Shared>,
    /// The request's id: the caller's, or one the server drew.
    pub id: String,
    /// What it is about.
    pub topic: String,
    /// Its body (JSON).
    pub body: Payload,
}

impl std::fmt::Debug for WorkflowRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowRequest")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("body", &self.body)
            .finish_non_exhaustive()
    }
}

impl WorkflowRequest {
    /// The body decoded from JSON into a `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Payload`], naming the request and the type, if it does not decode.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        self.body.decode().map_err(|e| {
            Error::payload(
                format_args!("the body of request `{}` on `{}` is not a `{}`", self.id, self.topic, type_name::<T>()),
                e,
            )
        })
    }

    /// Answers the request: a value, as JSON, or an error (its text, with its causes),
    /// which the caller gets as an error. Consumes the request: each is answered once.
    /// The answer is sent when the returned future is first polled, and is recorded in
    /// the workflow's history before the caller sees it.
    ///
    /// Fails if the value does not serialise, or the service refuses the answer (the
    /// process is not the workflow's root, or the request was answered already).
    pub fn respond<T: Serialize>(self, result: Result<T, impl Into<anyhow::Error>>) -> Completion<()> {
        let ctx = Ctx::new(self.shared);
        let input = match result {
            Ok(value) => match serde_json::to_value(&value) {
                Ok(value) => json!({"request": self.id, "ok": value}),
                Err(error) => {
                    return ctx.call_with(ANSWER, FailToSerialise(error.to_string()), decode_unit);
                }
            },
            Err(error) => json!({"request": self.id, "error": format!("{:#}", error.into())}),
        };
        ctx.call_with(ANSWER, input, decode_unit)
    }
}

/// A value whose serialisation fails with the error of another's, so that a `respond`
/// with a value that does not serialise fails as its future is polled, as a command with
/// such an input does.
struct FailToSerialise(String);

impl Serialize for FailToSerialise {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(&self.0))
    }
}

fn decode_unit(_: Payload) -> Result<(), Error> {
    Ok(())
}

/// The last segment of a type's path (`Deposit` for `my_crate::bank::Deposit`), generics kept.
fn type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let end = full.find('<').unwrap_or(full.len());
    full[..end].rfind("::").map_or(full, |at| &full[at + 2..])
}

/// A [`Ctx::next_workflow_request`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct NextWorkflowRequest {
    shared: Rc<Shared>,
    topic: Option<String>,
}

impl Future for NextWorkflowRequest {
    type Output = Result<WorkflowRequest, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let wanted = |topic: &str| {
            parse_topic(topic).is_some_and(|(_, topic)| self.topic.as_deref().is_none_or(|wanted| wanted == topic))
        };
        self.shared.poll_message_where(wanted, cx.waker()).map(|message| {
            let message = message.map_err(Error::Cancelled)?;
            let (id, topic) = parse_topic(&message.topic).expect("only messages with a request topic are taken");
            Ok(WorkflowRequest {
                shared: self.shared.clone(),
                id: id.to_owned(),
                topic: topic.to_owned(),
                body: message.body,
            })
        })
    }
}

/// A [`Ctx::recv_signal`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct RecvSignal<T> {
    shared: Rc<Shared>,
    topic: String,
    value: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Future for RecvSignal<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let topic = self.topic.as_str();
        self.shared.poll_message_where(|t| t == topic, cx.waker()).map(|message| {
            let message = message.map_err(Error::Cancelled)?;
            message.body.decode().map_err(|e| {
                Error::payload(format_args!("the `{topic}` signal's body is not a `{}`", type_name::<T>()), e)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_topics_parse() {
        assert_eq!(parse_topic("wasmproc:request:r1:get"), Some(("r1", "get")));
        assert_eq!(parse_topic("wasmproc:request:r1:a:b"), Some(("r1", "a:b")));
        assert_eq!(parse_topic("get"), None);
    }

    #[test]
    fn type_names_are_short() {
        assert_eq!(type_name::<u64>(), "u64");
        assert_eq!(type_name::<Vec<String>>(), "Vec<alloc::string::String>");
        assert_eq!(type_name::<WorkflowRequest>(), "WorkflowRequest");
    }
}
