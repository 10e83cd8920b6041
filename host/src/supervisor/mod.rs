//! Supervisors as data: a built-in process kind, `supervisor`, that starts, watches,
//! restarts and stops a list of children as its [`SupervisorSpec`] says, with OTP's
//! semantics (`one_for_one`, `one_for_all`, `rest_for_one`, `simple_one_for_one`;
//! restart intensity within a period; `permanent`, `transient` and `temporary`
//! children; significant children and `auto_shutdown`), and a restart backoff.
//!
//! Every scheduler has the kind (unless its embedder registered another under the name),
//! so any process, in any guest language, starts a supervisor with a plain `spawn` of
//! kind `supervisor`, entry method `start`, and the spec as its one JSON input; the
//! embedder does the same with [`SupervisorSpec::spawn_options`]:
//!
//! ```
//! use wasmproc::supervisor::{ChildSpec, Strategy, SupervisorSpec};
//! use wasmproc::scheduler::Spawnable;
//! use wasmproc::{Event, Events, ExitReason, Payload, Port, Process, Scheduler, StepOutput};
//!
//! /// Ends at once with an error: the supervisor restarts it, twice, and gives up.
//! struct Crasher;
//! impl Process for Crasher {
//!     fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> { Ok(()) }
//!     fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
//!         out.complete(Err("boom".into()));
//!         Ok(())
//!     }
//! }
//!
//! let crasher = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Crasher)) };
//! let scheduler = Scheduler::builder().workers(1).kind("crasher", crasher).build()?;
//! let mut spec = SupervisorSpec::new(Strategy::OneForOne);
//! spec.intensity = 2;
//! spec.children.push(ChildSpec::new("worker", "crasher", "main"));
//! let supervisor = scheduler.handle().spawn(Spawnable::kind("supervisor"), spec.spawn_options()?)?;
//! let Err(ExitReason::Error(reason)) = supervisor.join() else { panic!("the supervisor escalates") };
//! assert!(reason.starts_with("restart intensity reached: 3 restarts within 5s"), "{reason}");
//! assert!(reason.contains("child `worker`, which returned an error: boom"), "{reason}");
//! # scheduler.stop(std::time::Duration::from_secs(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The supervisor's result: the error of its escalation (above), of a child that failed
//! to start when the supervisor started (`failed to start child `db`: …`), or of its
//! cancellation; or, when significant children end it (`auto_shutdown`), the result of
//! the one whose end did. It traps exits and spawns its children linked (not monitored),
//! so a supervisor ended from outside takes its children with it, and the end of a
//! parent that spawned it linked ends it (after it has stopped its children). If
//! `trap-exits` is denied it monitors its children only.
//!
//! # Control requests
//!
//! A supervisor answers messages whose topic names a request, with a message back to
//! the sender whose topic is the request's followed by `.reply` and whose body is JSON,
//! `{"ok": VALUE}` or `{"error": "why"}`; requests from one sender are answered in
//! order. A message with any other topic is ignored (and logged), so that two
//! supervisors never answer each other's answers. From the embedder, [`ask`] sends one
//! and waits for the answer. Bodies are JSON:
//!
//! | topic | body | answer |
//! | --- | --- | --- |
//! | `which_children` | anything | `[{"id", "pid" (null unless running), "state", "kind", "restart"}]` in start order; `state` is `running`, `restarting`, `stopping` or `stopped` |
//! | `count_children` | anything | `{"specs": N, "active": N}` |
//! | `terminate_child` | the child's id (a string) or pid (a number) | `null` once it is stopped; a static child is kept, stopped, for `restart_child`; a temporary or dynamic one is forgotten |
//! | `restart_child` | the child's id | its new pid, once started (a child that is running is refused) |
//! | `start_child` | an array of input values, after the template's (`simple_one_for_one` only) | the new child's pid, once started; it is `ID-N` in `which_children`, `ID` the template's |
//!
//! Children stopped by a request never count as restarts and never end the supervisor
//! through `auto_shutdown`.

use std::time::Duration;

use serde_json::Value;
use wasmproc_types::{ExitReason, Payload, Pid};

use crate::handler::Factory;
use crate::process::{Port, Process};
use crate::scheduler::{Handle, SpawnOptions};
use crate::step::{Command, Event, Events, Status, StepOutput};

mod runtime;
pub mod spec;

pub use self::runtime::ChildRef;
pub(crate) use self::runtime::{draw, seed};
pub use self::spec::{AutoShutdown, Backoff, ChildSpec, MAX_CHILDREN, Restart, Shutdown, Strategy, SupervisorSpec};

/// The name of the built-in kind.
pub const KIND: &str = "supervisor";

/// The supervisor's one entry method.
pub const START: &str = "start";

/// Makes supervisors: the built-in kind [`KIND`], which every scheduler registers
/// unless its embedder registered a kind of that name. Register it under another name
/// with [`Builder::kind`](crate::scheduler::Builder::kind) to have it twice.
#[derive(Clone, Copy, Debug, Default)]
pub struct SupervisorKind;

impl Factory for SupervisorKind {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(runtime::Supervisor::new()))
    }
}

impl SupervisorSpec {
    /// The options that spawn a supervisor of this spec: entry method [`START`], the
    /// spec as JSON its input.
    ///
    /// # Errors
    ///
    /// A spec that does not validate ([`SupervisorSpec::validate`]).
    pub fn spawn_options(&self) -> anyhow::Result<SpawnOptions> {
        self.validate()?;
        Ok(SpawnOptions::new(START).input(vec![Payload::json(self)?]))
    }
}

/// A control request (see the module docs), as a message's topic and body.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Request {
    /// `which_children`.
    WhichChildren,
    /// `count_children`.
    CountChildren,
    /// `terminate_child`.
    TerminateChild(ChildRef),
    /// `restart_child`.
    RestartChild(String),
    /// `start_child`, with the input after the template's.
    StartChild(Vec<Value>),
}

impl Request {
    /// The message's topic.
    pub fn topic(&self) -> &'static str {
        match self {
            Request::WhichChildren => "which_children",
            Request::CountChildren => "count_children",
            Request::TerminateChild(_) => "terminate_child",
            Request::RestartChild(_) => "restart_child",
            Request::StartChild(_) => "start_child",
        }
    }

    /// The message's body.
    pub fn body(&self) -> Payload {
        let value = match self {
            Request::WhichChildren | Request::CountChildren => Value::Null,
            Request::TerminateChild(ChildRef::Id(id)) | Request::RestartChild(id) => Value::from(id.as_str()),
            Request::TerminateChild(ChildRef::Pid(pid)) => Value::from(pid.as_u64()),
            Request::StartChild(input) => Value::Array(input.clone()),
        };
        Payload::json(&value).expect("a JSON value serialises")
    }

    /// The request a message is: `None` if its topic names none; an error naming the
    /// request if its body does not fit it.
    pub(crate) fn from_message(topic: &str, body: &Payload) -> Option<Result<Request, String>> {
        let value = || -> Result<Value, String> {
            if body.data.is_empty() {
                return Ok(Value::Null);
            }
            body.decode::<Value>().map_err(|e| format!("`{topic}`: the body is not JSON: {e}"))
        };
        let request = match topic {
            "which_children" => Ok(Request::WhichChildren),
            "count_children" => Ok(Request::CountChildren),
            "terminate_child" => value().and_then(|value| match value {
                Value::String(id) => Ok(Request::TerminateChild(ChildRef::Id(id))),
                Value::Number(n) if n.as_u64().is_some() => {
                    Ok(Request::TerminateChild(ChildRef::Pid(Pid::from_u64(n.as_u64().unwrap_or_default()))))
                }
                other => Err(format!("`terminate_child` takes a child's id or pid, got {other}")),
            }),
            "restart_child" => value().and_then(|value| match value {
                Value::String(id) => Ok(Request::RestartChild(id)),
                other => Err(format!("`restart_child` takes a child's id, got {other}")),
            }),
            "start_child" => value().and_then(|value| match value {
                Value::Array(input) => Ok(Request::StartChild(input)),
                Value::Null => Ok(Request::StartChild(Vec::new())),
                other => Err(format!("`start_child` takes an array of input values, got {other}")),
            }),
            _ => return None,
        };
        Some(request)
    }
}

/// Sends `request` to the supervisor `supervisor` from the embedder and waits up to
/// `timeout` for the answer: the `ok` value, or the `error`. A short-lived process of
/// the scheduler's sends it and takes the answer (a message to the embedder has nowhere
/// to go).
///
/// # Errors
///
/// The supervisor's error, or: it cannot be reached, it ended before it answered, no
/// answer within `timeout`, or the asking process could not be spawned.
pub fn ask(handle: &Handle, supervisor: Pid, request: &Request, timeout: Duration) -> Result<Value, String> {
    let asker = Asker { supervisor, topic: request.topic(), body: Some(request.body()) };
    let process = handle.spawn(asker, "ask").map_err(|e| format!("cannot ask supervisor {supervisor}: {e}"))?;
    let Some(answer) = process.join_timeout(timeout) else {
        let _ = handle.terminate(process.pid());
        return Err(format!("supervisor {supervisor} did not answer `{}` within {timeout:?}", request.topic()));
    };
    let body = answer.map_err(|reason| match reason {
        ExitReason::Error(error) => error,
        other => format!("the asking process {other}"),
    })?;
    let mut value: Value = body.parse_json().map_err(|e| format!("a supervisor's answer that is not JSON: {e}"))?;
    if let Some(error) = value.get("error") {
        return Err(error.as_str().map_or_else(|| error.to_string(), str::to_owned));
    }
    Ok(value.get_mut("ok").map(Value::take).unwrap_or_default())
}

/// Sends one request and ends with the answer's body.
struct Asker {
    supervisor: Pid,
    topic: &'static str,
    body: Option<Payload>,
}

impl Process for Asker {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if let Some(body) = self.body.take() {
            out.yield_command(0, Command::Monitor(self.supervisor));
            out.yield_command(1, Command::Send { to: self.supervisor, topic: self.topic.to_owned(), body });
        }
        for event in events {
            match event {
                Event::Completion { result: Err(error), .. } => out.complete(Err(error)),
                Event::Message { sender, topic, body }
                    if sender == self.supervisor && topic.strip_suffix(".reply") == Some(self.topic) =>
                {
                    out.complete(Ok(body));
                }
                Event::Exit { pid, reason, .. } if pid == self.supervisor => {
                    out.complete(Err(format!("supervisor {pid} ended before it answered: it {reason}")));
                }
                _ => {}
            }
            if matches!(out.status(), Status::Complete(_)) {
                return Ok(());
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}
