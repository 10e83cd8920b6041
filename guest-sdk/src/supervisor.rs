//! A builder for the host's built-in supervisor: a supervision tree described as data
//! and started with one spawn of the kind `supervisor`, the same supervisor whatever the
//! guest's language (the format is the README's "Supervision").
//!
//! ```
//! use wasmproc_guest::prelude::*;
//! use wasmproc_guest::supervisor::{ChildSpec, Restart, Supervisor};
//!
//! /// Runs three workers under a `one_for_one` supervisor that restarts each when it
//! /// fails, at most 3 times in 5 seconds, and answers with the supervisor's pid.
//! #[entry]
//! async fn start(ctx: Ctx, _: ()) -> Result<u64> {
//!     let mut supervisor = Supervisor::one_for_one().intensity(3, Duration::from_secs(5));
//!     for n in 0..3 {
//!         let worker = ChildSpec::new(format!("worker-{n}"), "worker", "main").input(n).restart(Restart::Transient);
//!         supervisor = supervisor.child(worker);
//!     }
//!     let pid = supervisor.spawn(&ctx).await?;
//!     Ok(pid.as_u64())
//! }
//! # wasmproc_guest::export!(start);
//! # fn main() {}
//! ```
//!
//! The builder's child is a [`ChildSpec`], not the crate's [`Child`](crate::Child) (a
//! typed handle on a spawned child).

use std::time::Duration;

use serde::Serialize;
/// The JSON values of specs and answers.
pub use serde_json::Value;
use serde_json::{Map, json};
use wasmproc_types::supervisor::duration_text;

use crate::ctx::{Completion, Ctx};
use crate::error::Error;
use crate::payload::Pid;

/// The name of the host's built-in supervisor kind.
pub const KIND: &str = "supervisor";

pub use wasmproc_types::supervisor::{AutoShutdown, Backoff, Restart, Shutdown, Strategy};

/// One child of a supervisor: what to start, and how to restart and stop it.
#[derive(Clone, Debug)]
pub struct ChildSpec {
    id: String,
    kind: String,
    method: String,
    input: Vec<Value>,
    restart: Restart,
    shutdown: Option<Shutdown>,
    significant: bool,
    /// An input that did not serialise: the spawn fails with it.
    error: Option<String>,
}

impl ChildSpec {
    /// A permanent child `id` (unique among its supervisor's children) of the host's
    /// process kind `kind`, starting in entry `method`.
    pub fn new(id: impl Into<String>, kind: impl Into<String>, method: impl Into<String>) -> Self {
        ChildSpec {
            id: id.into(),
            kind: kind.into(),
            method: method.into(),
            input: Vec::new(),
            restart: Restart::Permanent,
            shutdown: None,
            significant: false,
            error: None,
        }
    }

    /// Adds an input payload, as JSON (an SDK entry takes the first).
    pub fn input(mut self, input: impl Serialize) -> Self {
        match serde_json::to_value(input) {
            Ok(value) => self.input.push(value),
            Err(error) => self.error = Some(format!("the input of child `{}` does not serialise: {error}", self.id)),
        }
        self
    }

    /// When the child is restarted.
    pub fn restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// How the child is stopped.
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// Whether its end counts for the supervisor's [`AutoShutdown`] (a transient or
    /// temporary child only).
    pub fn significant(mut self, significant: bool) -> Self {
        self.significant = significant;
        self
    }

    fn to_json(&self) -> Value {
        let mut child = Map::new();
        child.insert("id".into(), json!(self.id));
        child.insert("kind".into(), json!(self.kind));
        child.insert("method".into(), json!(self.method));
        child.insert("input".into(), Value::Array(self.input.clone()));
        child.insert("restart".into(), json!(self.restart.name()));
        if let Some(shutdown) = self.shutdown {
            child.insert("shutdown".into(), json!(shutdown));
        }
        child.insert("significant".into(), json!(self.significant));
        Value::Object(child)
    }
}

/// A supervisor to start: build it, then [`Supervisor::spawn`] it. What the host
/// refuses (duplicate ids, no children, a backoff out of range…) fails the spawn with
/// the host's error, which names the field.
#[derive(Clone, Debug)]
pub struct Supervisor {
    strategy: Strategy,
    intensity: Option<(u32, Duration)>,
    backoff: Option<Backoff>,
    auto_shutdown: AutoShutdown,
    children: Vec<ChildSpec>,
}

impl Supervisor {
    fn new(strategy: Strategy) -> Self {
        Supervisor {
            strategy,
            intensity: None,
            backoff: None,
            auto_shutdown: AutoShutdown::Never,
            children: Vec::new(),
        }
    }

    /// Restarts only the child that ended.
    pub fn one_for_one() -> Self {
        Supervisor::new(Strategy::OneForOne)
    }

    /// Restarts every child when one ends.
    pub fn one_for_all() -> Self {
        Supervisor::new(Strategy::OneForAll)
    }

    /// Restarts the child that ended and those started after it.
    pub fn rest_for_one() -> Self {
        Supervisor::new(Strategy::RestForOne)
    }

    /// A pool of children made from `template`, started by
    /// [`SupervisorRef::start_child`] with input after the template's.
    pub fn simple_one_for_one(template: ChildSpec) -> Self {
        Supervisor::new(Strategy::SimpleOneForOne).child(template)
    }

    /// At most `restarts` restarts within `period`; one more stops every child and ends
    /// the supervisor with an error naming the child. By default 1 within 5 s.
    pub fn intensity(mut self, restarts: u32, period: Duration) -> Self {
        self.intensity = Some((restarts, period));
        self
    }

    /// The delay before each restart. By default none.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Whether significant children's end ends the supervisor. By default never.
    pub fn auto_shutdown(mut self, auto_shutdown: AutoShutdown) -> Self {
        self.auto_shutdown = auto_shutdown;
        self
    }

    /// Adds a child, started after those added before it.
    pub fn child(mut self, child: ChildSpec) -> Self {
        self.children.push(child);
        self
    }

    /// The spec as the host reads it.
    pub fn to_json(&self) -> Value {
        let mut spec = Map::new();
        spec.insert("strategy".into(), json!(self.strategy.name()));
        if let Some((intensity, period)) = self.intensity {
            spec.insert("intensity".into(), json!(intensity));
            spec.insert("period".into(), json!(duration_text::format(period)));
        }
        if let Some(backoff) = self.backoff {
            spec.insert("backoff".into(), json!(backoff));
        }
        spec.insert("auto_shutdown".into(), json!(self.auto_shutdown));
        spec.insert("children".into(), Value::Array(self.children.iter().map(ChildSpec::to_json).collect()));
        Value::Object(spec)
    }

    /// Spawns the supervisor (a child of this process, monitored, so [`Ctx::wait`]
    /// collects its result); resolves to its pid once its spec is accepted. Its children
    /// start after.
    ///
    /// Fails if a child's input did not serialise, or as [`Ctx::spawn_kind`] fails: the
    /// host refuses the spec (the error names the field and the value), or `spawn` is
    /// not granted.
    pub fn spawn(&self, ctx: &Ctx) -> Completion<Pid> {
        match self.children.iter().find_map(|child| child.error.clone()) {
            Some(error) => ctx.failed(Error::Payload(error), "spawning a supervisor"),
            None => ctx.spawn_kind(KIND, "start", self.to_json()),
        }
    }
}

/// A running supervisor, to send control requests to. Each request is a message; the
/// answer comes back as a message whose topic is the request's plus `.reply`. Ask one
/// supervisor at a time: answers are told apart by topic only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SupervisorRef(pub Pid);

impl SupervisorRef {
    /// Sends `topic` with `body` and waits for the answer's `ok` value.
    ///
    /// Fails with the supervisor's `error` ([`Error::Command`]), as [`Ctx::send`] fails,
    /// or as [`Ctx::recv_topic`] fails (cancellation).
    pub async fn request(&self, ctx: &Ctx, topic: &str, body: impl Serialize) -> Result<Value, Error> {
        ctx.send(self.0, topic, body)?;
        let reply = format!("{topic}.reply");
        loop {
            let message = ctx.recv_topic(&reply).await?;
            if message.sender != self.0 {
                continue;
            }
            let mut answer: Value = message.decode()?;
            if let Some(error) = answer.get("error") {
                let error = error.as_str().map_or_else(|| error.to_string(), str::to_owned);
                return Err(Error::command(&format!("supervisor request `{topic}`"), error));
            }
            return Ok(answer.get_mut("ok").map(Value::take).unwrap_or_default());
        }
    }

    /// Starts a child of a `simple_one_for_one` supervisor, with `input` after the
    /// template's; resolves to its pid.
    pub async fn start_child(&self, ctx: &Ctx, input: impl Serialize) -> Result<Pid, Error> {
        let input = serde_json::to_value(input).map_err(|e| Error::payload("a child's input", e))?;
        let pid = self.request(ctx, "start_child", [input]).await?;
        pid.as_u64().map(Pid::from_u64).ok_or_else(|| Error::Payload(format!("a pid expected, got {pid}")))
    }

    /// The children, in start order: `[{"id", "pid", "state", "kind", "restart"}]`.
    pub async fn which_children(&self, ctx: &Ctx) -> Result<Value, Error> {
        self.request(ctx, "which_children", ()).await
    }

    /// Stops the child `id`.
    pub async fn terminate_child(&self, ctx: &Ctx, id: &str) -> Result<(), Error> {
        self.request(ctx, "terminate_child", id).await.map(drop)
    }

    /// Starts the stopped child `id` again; resolves to its pid.
    pub async fn restart_child(&self, ctx: &Ctx, id: &str) -> Result<Pid, Error> {
        let pid = self.request(ctx, "restart_child", id).await?;
        pid.as_u64().map(Pid::from_u64).ok_or_else(|| Error::Payload(format!("a pid expected, got {pid}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_writes_the_hosts_format() {
        let spec = Supervisor::rest_for_one()
            .intensity(3, Duration::from_secs(5))
            .backoff(Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).jitter(0.5))
            .auto_shutdown(AutoShutdown::AnySignificant)
            .child(ChildSpec::new("db", "store", "serve").input(serde_json::json!({"port": 1})))
            .child(
                ChildSpec::new("web", "app", "main")
                    .restart(Restart::Transient)
                    .shutdown(Shutdown::Timeout(Duration::from_micros(1500)))
                    .significant(true),
            );
        assert_eq!(
            spec.to_json(),
            json!({
                "strategy": "rest_for_one", "intensity": 3, "period": "5s",
                "backoff": {"initial": "100ms", "max": "2s", "multiplier": 2.0, "jitter": 0.5},
                "auto_shutdown": "any_significant",
                "children": [
                    {"id": "db", "kind": "store", "method": "serve", "input": [{"port": 1}],
                     "restart": "permanent", "significant": false},
                    {"id": "web", "kind": "app", "method": "main", "input": [], "restart": "transient",
                     "shutdown": "1ms 500us", "significant": true},
                ],
            })
        );
    }
}
