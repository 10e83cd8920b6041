//! The supervisor as a native [`Process`]: starts its children, watches them through
//! links (monitors if it may not trap exits), restarts them per its [`SupervisorSpec`],
//! and stops them in reverse order.
//!
//! # How it works
//!
//! Everything the supervisor does to its children is one *operation* at a time, from a
//! queue: start a child (a `spawn` yield, linked, or monitored if it may not trap exits), stop one (an exit
//! signal: `kill` for `brutal`, else `shutdown` and `kill` once its timeout passes, the
//! stop over when the child's exit arrives), wait (a `sleep` yield, the backoff). One operation is in flight at most, so
//! children start and stop in the order the queue says; between operations, and while
//! one is in flight, the supervisor goes on reading its mailbox (control requests) and
//! its children's exits, which add operations. An exit of a child being stopped is the
//! stop's, never a failure; an exit or a completion of a child no longer held (stopped,
//! forgotten) is ignored.
//!
//! # Restart accounting
//!
//! Each automatic restart (and each failed attempt at one) is counted at the time it is
//! decided, in a sliding window of `period`: past `intensity` restarts in the window, the
//! supervisor stops every child in reverse start order and ends with an error naming the
//! child, the count, the period and the child's last exit. The `n`th restart within the
//! window waits `backoff.delay(n)` first; a window without restarts starts the count
//! again.
//!
//! # In a durable run
//!
//! A supervisor decides by the time (its restart window) and at random (the backoff's
//! jitter). In a durable scheduler both come from its journal, so that a replay after a
//! host crash decides as the run did: the time is the recorded time of the step under
//! way ([`Port::step_time`]), and the jitter is drawn from the seed recorded at its spawn
//! ([`Port::random_seed`]). Its backoff is a `sleep` yield, which the journal re-arms
//! for what is left of it. So a resumed supervisor holds the children, the restart
//! counts and the operations in flight it held before the crash, and a crash restarts
//! no child and counts as no restart. Elsewhere it reads the monotonic clock and draws
//! from a seed of the system's.

use std::collections::VecDeque;
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::{Value, json};
use wasmproc_types::{ExitReason, Payload, Pid};

use super::spec::{AutoShutdown, ChildSpec, MAX_CHILDREN, Restart, Shutdown, Strategy, SupervisorSpec, duration_text};
use super::{Request, START};
use crate::process::{Port, Process};
use crate::step::{Command, Event, Events, ExitSignal, Outcome, SpawnRequest, Status, StepOutput};

/// The tag of a stop in flight, which waits for the child's exit rather than for a
/// completion: no yield has it (tags count up from 1).
const WAITING_FOR_EXIT: u64 = 0;

/// A supervisor: see the module docs.
pub(crate) struct Supervisor {
    spec: SupervisorSpec,
    port: Option<Port>,
    /// In start order; a `simple_one_for_one` supervisor's in the order they were added.
    children: Vec<Child>,
    /// The operations to carry out, in order, after the one in flight.
    ops: VecDeque<Op>,
    in_flight: Option<(u64, Op)>,
    next_tag: u64,
    /// The next key of a child, never reused, so an operation queued for a child that has
    /// gone since finds nothing rather than another child.
    next_key: u64,
    /// When each restart within the current window was decided, oldest first, as
    /// [`Clock::now`] reads it.
    restarts: VecDeque<Duration>,
    clock: Clock,
    /// The exit signal of the stop in flight and the child it is for: if it cannot be
    /// sent, the child is terminated instead.
    stop_signal: Option<(u64, Pid)>,
    /// The shutdown timeout of the stop in flight, and the child it kills when it passes.
    stop_timer: Option<(u64, Pid)>,
    /// Commands decided while reading events, yielded before the next operation.
    urgent: Vec<Command>,
    /// Whether children are spawned linked: once the supervisor traps exits.
    linking: bool,
    /// Set once the supervisor is ending: what it ends with, once its children are
    /// stopped.
    ending: Option<ExitReason>,
    rng: u64,
}

/// Where a supervisor reads the time.
enum Clock {
    /// The monotonic clock, from when the supervisor was made.
    Monotonic(Instant),
    /// The journal's time of the step under way (a durable process's).
    Journaled,
    /// A time the test sets.
    #[cfg(test)]
    Manual(Duration),
}

struct Child {
    key: u64,
    id: String,
    /// Its spec's place in `spec.children` (the template's, for a dynamic child).
    spec: usize,
    /// A `start_child`'s input, after the template's.
    extra: Vec<Value>,
    pid: Option<Pid>,
    state: ChildState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChildState {
    Running,
    /// Ended; a start of it is queued.
    Down,
    /// A stop of it is in flight.
    Stopping,
    /// Ended, and not to be restarted unless asked (`restart_child`).
    Stopped,
}

/// Who asked for an operation and how to answer them: a control request's sender and
/// topic.
#[derive(Clone, Debug)]
struct Reply {
    to: Pid,
    topic: String,
}

#[derive(Debug)]
enum Op {
    /// Trap exits, so that children can be linked: first of all.
    TrapExits,
    Start {
        key: u64,
        why: Why,
    },
    Stop {
        key: u64,
        then: AfterStop,
        reply: Option<Reply>,
    },
    Delay(Duration),
    /// Stop every running child in reverse start order, then end.
    Shutdown,
    End,
}

/// Why a child is started: what a failure to start means.
#[derive(Debug)]
enum Why {
    /// The supervisor's own start: a failure ends it.
    Initial,
    /// A restart: a failure counts as another restart.
    Restart,
    /// A control request (`start_child`, `restart_child`): a failure is its answer.
    Asked(Option<Reply>),
}

/// What becomes of a child once stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterStop {
    /// Started again by an operation queued after the stop (a strategy's restart).
    Restart,
    /// Kept, stopped, for `restart_child` (`terminate_child` of a static child).
    Keep,
    /// Forgotten (a temporary or dynamic child, or the supervisor's end).
    Forget,
}

impl Supervisor {
    pub(crate) fn new() -> Self {
        Supervisor {
            spec: SupervisorSpec::new(Strategy::OneForOne),
            port: None,
            children: Vec::new(),
            ops: VecDeque::new(),
            in_flight: None,
            next_tag: 1,
            next_key: 0,
            restarts: VecDeque::new(),
            clock: Clock::Monotonic(Instant::now()),
            linking: false,
            stop_signal: None,
            stop_timer: None,
            urgent: Vec::new(),
            ending: None,
            rng: seed(),
        }
    }

    fn child_spec(&self, child: &Child) -> &ChildSpec {
        &self.spec.children[child.spec]
    }

    fn index_of_key(&self, key: u64) -> Option<usize> {
        self.children.iter().position(|c| c.key == key)
    }

    fn add_child(&mut self, id: String, spec: usize, extra: Vec<Value>) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        self.children.push(Child { key, id, spec, extra, pid: None, state: ChildState::Down });
        key
    }

    /// Handles the end of the child at `index`, which the supervisor did not ask for.
    fn child_ended(&mut self, index: usize, reason: ExitReason) {
        let child = &mut self.children[index];
        child.pid = None;
        if self.ending.is_some() {
            child.state = ChildState::Stopped;
            return;
        }
        let spec = &self.spec.children[child.spec];
        let restart = match spec.restart {
            Restart::Permanent => true,
            Restart::Transient => !is_normal(&reason),
            Restart::Temporary => false,
        };
        if !restart {
            let significant = spec.significant;
            let forget = spec.restart == Restart::Temporary || self.spec.strategy == Strategy::SimpleOneForOne;
            child.state = ChildState::Stopped;
            tracing::debug!(child = %child.id, "a supervised child ended and is not restarted");
            if forget {
                self.children.remove(index);
            }
            if significant {
                self.significant_ended(reason);
            }
            return;
        }
        child.state = ChildState::Down;
        let key = child.key;
        self.restart(key, &reason);
    }

    /// Counts a restart of the child `key`, whose last end was `last`, and queues it
    /// (with the others its strategy takes along), or gives up past the intensity.
    fn restart(&mut self, key: u64, last: &ExitReason) {
        // Ending: a restart that failed meanwhile is not tried again.
        if self.ending.is_some() {
            return;
        }
        let Some(index) = self.index_of_key(key) else { return };
        let now = self.now();
        let period = self.spec.period;
        while self.restarts.front().is_some_and(|&at| now.saturating_sub(at) > period) {
            self.restarts.pop_front();
        }
        self.restarts.push_back(now);
        let n = self.restarts.len();
        if n > self.spec.intensity as usize {
            let id = &self.children[index].id;
            let reason = format!(
                "restart intensity reached: {n} restarts within {} (`intensity` {}), the last of child `{id}`, which \
                 {last}",
                duration_text::format(period),
                self.spec.intensity,
            );
            tracing::warn!(child = %id, "{reason}");
            self.shut_down(ExitReason::Error(reason));
            return;
        }
        let unit = self.draw();
        let delay = self.spec.backoff.delay(u32::try_from(n).unwrap_or(u32::MAX), unit);
        let (stop, start): (Vec<usize>, Vec<usize>) = match self.spec.strategy {
            Strategy::OneForOne | Strategy::SimpleOneForOne => (Vec::new(), vec![index]),
            Strategy::OneForAll => {
                ((0..self.children.len()).filter(|&i| i != index).collect(), (0..self.children.len()).collect())
            }
            Strategy::RestForOne => {
                ((index + 1..self.children.len()).collect(), (index..self.children.len()).collect())
            }
        };
        for &i in stop.iter().rev() {
            let child = &self.children[i];
            if child.state == ChildState::Running {
                // A temporary child stopped for another's restart is not restarted (its
                // start parameters are not kept), as in OTP.
                let then = if self.child_spec(child).restart == Restart::Temporary {
                    AfterStop::Forget
                } else {
                    AfterStop::Restart
                };
                self.ops.push_back(Op::Stop { key: child.key, then, reply: None });
            }
        }
        if !delay.is_zero() {
            self.ops.push_back(Op::Delay(delay));
        }
        for &i in &start {
            let child = &self.children[i];
            let restarted = i == index
                || matches!(child.state, ChildState::Running | ChildState::Down)
                    && self.child_spec(child).restart != Restart::Temporary;
            if restarted {
                self.ops.push_back(Op::Start { key: child.key, why: Why::Restart });
            }
        }
    }

    /// A significant child ended for good with `reason`: ends the supervisor if its
    /// `auto_shutdown` says so, with the same reason.
    fn significant_ended(&mut self, reason: ExitReason) {
        let end = match self.spec.auto_shutdown {
            AutoShutdown::Never => false,
            AutoShutdown::AnySignificant => true,
            AutoShutdown::AllSignificant => !self.children.iter().any(|child| {
                self.child_spec(child).significant
                    && matches!(child.state, ChildState::Running | ChildState::Down | ChildState::Stopping)
            }),
        };
        if end {
            self.shut_down(reason);
        }
    }

    /// Ends the supervisor with `reason` once every child is stopped, in reverse start
    /// order. Operations queued are dropped (their askers told), and a backoff in flight
    /// is not waited for; a start or stop in flight is.
    fn shut_down(&mut self, reason: ExitReason) {
        if self.ending.is_some() {
            return;
        }
        self.ending = Some(reason);
        for op in std::mem::take(&mut self.ops) {
            let reply = match op {
                Op::Start { why: Why::Asked(reply), .. } => reply,
                Op::Stop { reply, .. } => reply,
                _ => None,
            };
            if let Some(reply) = reply {
                self.answer(&reply, Err("the supervisor is shutting down".to_owned()));
            }
        }
        if matches!(self.in_flight, Some((_, Op::Delay(_)))) {
            self.in_flight = None;
        }
        self.ops.push_back(Op::Shutdown);
    }

    /// Carries out queued operations until one waits for a completion, or none is left;
    /// returns the supervisor's reason to end once it has stopped its children.
    fn pump(&mut self, out: &mut StepOutput) -> Option<ExitReason> {
        while self.in_flight.is_none() {
            let op = self.ops.pop_front()?;
            match op {
                Op::Start { key, why } => self.start(key, why, out),
                Op::Stop { key, then, reply } => self.stop(key, then, reply, out),
                Op::TrapExits => {
                    let tag = self.tag();
                    out.yield_command(tag, Command::TrapExits(true));
                    self.in_flight = Some((tag, Op::TrapExits));
                }
                Op::Delay(delay) => {
                    let tag = self.tag();
                    out.yield_command(tag, Command::Sleep(whole_micros(delay)));
                    self.in_flight = Some((tag, Op::Delay(delay)));
                }
                Op::Shutdown => {
                    let stops: Vec<Op> = self
                        .children
                        .iter()
                        .rev()
                        .filter(|child| child.state == ChildState::Running)
                        .map(|child| Op::Stop { key: child.key, then: AfterStop::Forget, reply: None })
                        .collect();
                    self.ops.extend(stops);
                    self.ops.push_back(Op::End);
                }
                Op::End => {
                    return Some(self.ending.take().unwrap_or_else(|| ExitReason::Error("ended".to_owned())));
                }
            }
        }
        None
    }

    fn start(&mut self, key: u64, why: Why, out: &mut StepOutput) {
        let Some(index) = self.index_of_key(key) else {
            if let Why::Asked(Some(reply)) = why {
                self.answer(&reply, Err("no such child".to_owned()));
            }
            return;
        };
        let child = &self.children[index];
        let startable = match why {
            Why::Asked(_) => child.state == ChildState::Stopped || child.state == ChildState::Down,
            _ => child.state == ChildState::Down,
        };
        if !startable {
            if let Why::Asked(Some(reply)) = why {
                let error = format!("child `{}` is {}", child.id, child.state.name());
                self.answer(&reply, Err(error));
            }
            return;
        }
        let spec = self.child_spec(child);
        let request = SpawnRequest {
            kind: Some(spec.kind.clone()),
            method: spec.method.clone(),
            input: spec.payloads(&child.extra),
            // Linked, with exits trapped, its end arrives as the link's exit event; a
            // monitor as well would only bring the same end twice.
            monitor: !self.linking,
            link: self.linking,
        };
        let tag = self.tag();
        out.yield_command(tag, Command::Spawn(request));
        self.in_flight = Some((tag, Op::Start { key, why }));
    }

    fn stop(&mut self, key: u64, then: AfterStop, reply: Option<Reply>, out: &mut StepOutput) {
        let Some(index) = self.index_of_key(key) else {
            if let Some(reply) = reply {
                self.answer(&reply, Err("no such child".to_owned()));
            }
            return;
        };
        let child = &mut self.children[index];
        match (child.state, child.pid) {
            (ChildState::Running, Some(pid)) => {
                child.state = ChildState::Stopping;
                let shutdown = self.spec.children[child.spec].shutdown;
                // `brutal`: killed at once. A timeout: asked to shut down (an exit signal a
                // child that traps exits may handle), and killed when the timeout passes.
                // The stop is over when the child's exit arrives.
                let signal = match shutdown {
                    Shutdown::Brutal => ExitSignal { to: pid, reason: ExitReason::Killed, kill: true },
                    Shutdown::Timeout(_) => ExitSignal { to: pid, reason: ExitReason::Shutdown, kill: false },
                };
                let tag = self.tag();
                out.yield_command(tag, Command::Exit(signal));
                self.stop_signal = Some((tag, pid));
                if let Shutdown::Timeout(timeout) = shutdown {
                    let tag = self.tag();
                    out.yield_command(tag, Command::Sleep(whole_micros(timeout)));
                    self.stop_timer = Some((tag, pid));
                }
                self.in_flight = Some((WAITING_FOR_EXIT, Op::Stop { key, then, reply }));
            }
            _ => self.stopped(index, then, reply),
        }
    }

    /// The child at `index`, being stopped, has ended: the stop in flight is over.
    fn stop_ended(&mut self, index: usize) {
        let key = self.children[index].key;
        self.children[index].pid = None;
        if let Some((_, Op::Stop { key: stopping, .. })) = &self.in_flight
            && *stopping == key
        {
            let Some((_, Op::Stop { then, reply, .. })) = self.in_flight.take() else { unreachable!("just matched") };
            self.stop_signal = None;
            self.stop_timer = None;
            self.stopped(index, then, reply);
        }
    }

    /// The child at `index` is stopped (or was not running): what `then` says becomes of
    /// it.
    fn stopped(&mut self, index: usize, then: AfterStop, reply: Option<Reply>) {
        let child = &mut self.children[index];
        child.pid = None;
        let forget = match then {
            AfterStop::Restart => false,
            AfterStop::Forget => true,
            AfterStop::Keep => {
                self.spec.strategy == Strategy::SimpleOneForOne
                    || self.spec.children[child.spec].restart == Restart::Temporary
            }
        };
        child.state = match then {
            AfterStop::Restart => ChildState::Down,
            AfterStop::Keep | AfterStop::Forget => ChildState::Stopped,
        };
        if forget && self.ending.is_none() {
            self.children.remove(index);
        }
        if let Some(reply) = reply {
            self.answer(&reply, Ok(Value::Null));
        }
    }

    /// The yield in flight, `tag`, completed with `result`.
    fn completed(&mut self, tag: u64, result: Outcome) {
        let Some((in_flight, _)) = &self.in_flight else { return };
        if *in_flight != tag {
            return;
        }
        let (_, op) = self.in_flight.take().expect("just matched");
        match op {
            Op::Start { key, why } => {
                let Some(index) = self.index_of_key(key) else { return };
                match result.as_ref().map(Payload::to_u64) {
                    Ok(Some(pid)) => {
                        let child = &mut self.children[index];
                        child.pid = Some(Pid::from_u64(pid));
                        child.state = ChildState::Running;
                        tracing::debug!(child = %child.id, pid, "a supervised child started");
                        if let Why::Asked(Some(reply)) = why {
                            self.answer(&reply, Ok(json!(pid)));
                        }
                    }
                    _ => {
                        let error = match result {
                            Err(error) => error,
                            Ok(_) => "the spawn answered without a pid".to_owned(),
                        };
                        self.start_failed(index, why, error);
                    }
                }
            }
            Op::Stop { key, then, reply } => {
                if let Some(index) = self.index_of_key(key) {
                    if let Err(error) = &result
                        && error.starts_with("permission denied")
                    {
                        tracing::warn!(child = %self.children[index].id, "the supervisor cannot stop its child: {error}");
                    }
                    self.stopped(index, then, reply);
                }
            }
            Op::TrapExits => match result {
                Ok(_) => self.linking = true,
                Err(error) => tracing::warn!(
                    "the supervisor cannot trap exits ({error}): its children are monitored, not linked, and outlive \
                     it if it is ended from outside"
                ),
            },
            Op::Delay(_) | Op::Shutdown | Op::End => {}
        }
    }

    fn start_failed(&mut self, index: usize, why: Why, error: String) {
        let child = &mut self.children[index];
        let id = child.id.clone();
        tracing::warn!(child = %id, "a supervised child failed to start: {error}");
        match why {
            Why::Initial => {
                child.state = ChildState::Stopped;
                self.shut_down(ExitReason::Error(format!("failed to start child `{id}`: {error}")));
            }
            Why::Restart => {
                child.state = ChildState::Down;
                let key = child.key;
                self.restart(key, &ExitReason::Error(format!("failed to restart: {error}")));
            }
            Why::Asked(reply) => {
                child.state = ChildState::Stopped;
                if self.spec.strategy == Strategy::SimpleOneForOne {
                    self.children.remove(index);
                }
                if let Some(reply) = reply {
                    self.answer(&reply, Err(format!("failed to start child `{id}`: {error}")));
                }
            }
        }
    }

    /// The time, as a duration since an origin fixed for the supervisor's life: the Unix
    /// epoch for a durable one (the journal's time), its making otherwise.
    fn now(&self) -> Duration {
        match &self.clock {
            Clock::Monotonic(origin) => origin.elapsed(),
            Clock::Journaled => self
                .port
                .as_ref()
                .and_then(Port::step_time)
                .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
                .unwrap_or_default(),
            #[cfg(test)]
            Clock::Manual(now) => *now,
        }
    }

    fn tag(&mut self) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        tag
    }

    /// A draw in `[0, 1)` for the backoff's jitter.
    fn draw(&mut self) -> f64 {
        draw(&mut self.rng)
    }

    /// Answers a control request; a request from the embedder ([`Pid::HOST`]) has no
    /// mailbox to answer to.
    fn answer(&self, reply: &Reply, result: Result<Value, String>) {
        if reply.to == Pid::HOST {
            return;
        }
        let Some(port) = &self.port else { return };
        let body = match result {
            Ok(value) => json!({ "ok": value }),
            Err(error) => json!({ "error": error }),
        };
        let body = Payload::json(&body).expect("a JSON value serialises");
        if let Err(error) = port.send(reply.to, format!("{}.reply", reply.topic), body) {
            tracing::debug!(to = %reply.to, "a supervisor's answer was not delivered: {error}");
        }
    }

    /// Carries out the control request `topic` from `sender`.
    fn request(&mut self, sender: Pid, topic: String, body: Payload) {
        let reply = Reply { to: sender, topic };
        let Some(request) = Request::from_message(&reply.topic, &body) else {
            tracing::debug!(%sender, topic = %reply.topic, "a supervisor ignored a message that is no request");
            return;
        };
        let request = match request {
            Ok(request) => request,
            Err(error) => return self.answer(&reply, Err(error)),
        };
        if self.ending.is_some() && !matches!(request, Request::WhichChildren | Request::CountChildren) {
            return self.answer(&reply, Err("the supervisor is shutting down".to_owned()));
        }
        match request {
            Request::WhichChildren => {
                let list: Vec<Value> = self
                    .children
                    .iter()
                    .map(|child| {
                        let spec = self.child_spec(child);
                        json!({
                            "id": child.id,
                            "pid": child.pid.map(Pid::as_u64),
                            "state": child.state.name(),
                            "kind": spec.kind,
                            "restart": spec.restart.name(),
                        })
                    })
                    .collect();
                self.answer(&reply, Ok(Value::Array(list)));
            }
            Request::CountChildren => {
                let active = self.children.iter().filter(|c| c.state == ChildState::Running).count();
                self.answer(&reply, Ok(json!({ "specs": self.children.len(), "active": active })));
            }
            Request::TerminateChild(target) => {
                let found = self.children.iter().find(|child| match &target {
                    ChildRef::Id(id) => child.id == *id,
                    ChildRef::Pid(pid) => child.pid == Some(*pid),
                });
                match found {
                    Some(child) => {
                        let op = Op::Stop { key: child.key, then: AfterStop::Keep, reply: Some(reply) };
                        self.ops.push_back(op);
                    }
                    None => self.answer(&reply, Err(format!("no child {target}"))),
                }
            }
            Request::RestartChild(id) => {
                if self.spec.strategy == Strategy::SimpleOneForOne {
                    return self.answer(
                        &reply,
                        Err("a `simple_one_for_one` supervisor restarts no child on request: use `start_child`".into()),
                    );
                }
                match self.children.iter().find(|child| child.id == id) {
                    Some(child) => {
                        let op = Op::Start { key: child.key, why: Why::Asked(Some(reply)) };
                        self.ops.push_back(op);
                    }
                    None => self.answer(&reply, Err(format!("no child `{id}`"))),
                }
            }
            Request::StartChild(extra) => {
                if self.spec.strategy != Strategy::SimpleOneForOne {
                    let strategy = self.spec.strategy.name();
                    return self.answer(
                        &reply,
                        Err(format!("`start_child` is for `simple_one_for_one` supervisors; this one is `{strategy}`")),
                    );
                }
                if self.children.len() >= MAX_CHILDREN {
                    return self.answer(&reply, Err(format!("the supervisor holds {MAX_CHILDREN} children, its most")));
                }
                let id = format!("{}-{}", self.spec.children[0].id, self.next_key);
                let key = self.add_child(id, 0, extra);
                self.ops.push_back(Op::Start { key, why: Why::Asked(Some(reply)) });
            }
        }
    }
}

/// A child named in a control request: by id, or by pid (a dynamic child's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildRef {
    /// The child's id.
    Id(String),
    /// The child's current pid.
    Pid(Pid),
}

impl std::fmt::Display for ChildRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildRef::Id(id) => write!(f, "`{id}`"),
            ChildRef::Pid(pid) => write!(f, "with pid {pid}"),
        }
    }
}

impl ChildState {
    fn name(self) -> &'static str {
        match self {
            ChildState::Running => "running",
            ChildState::Down => "restarting",
            ChildState::Stopping => "stopping",
            ChildState::Stopped => "stopped",
        }
    }
}

/// Whether a child's end is one a `transient` child is not restarted after: normal, or
/// shut down (as OTP's `shutdown`).
fn is_normal(reason: &ExitReason) -> bool {
    reason.is_normal() || *reason == ExitReason::Shutdown
}

/// `duration` rounded up to whole microseconds, a journal's precision for a `sleep`: a
/// durable supervisor's replay yields the sleeps its record holds.
fn whole_micros(duration: Duration) -> Duration {
    let micros = duration.as_nanos().div_ceil(1_000);
    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
}

/// A draw in `[0, 1)` from the generator `state` (xorshift64*: a backoff's jitter needs
/// spread, not secrecy), which it advances.
pub(crate) fn draw(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
}

/// A seed for [`draw`] from the system (never 0, which xorshift never leaves).
pub(crate) fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = (nanos.as_nanos() as u64).to_le_bytes();
    }
    u64::from_le_bytes(bytes) | 1
}

impl Process for Supervisor {
    fn init(&mut self, port: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        anyhow::ensure!(
            method == START,
            "the built-in kind `supervisor` has no entry method `{method}`; its one entry is `{START}`, with the \
             supervisor spec as its input"
        );
        let [spec] = input.as_slice() else {
            anyhow::bail!("a supervisor takes one input, its spec as JSON, got {} inputs", input.len());
        };
        self.spec = SupervisorSpec::from_json(&spec.data)?;
        if let Some(seed) = port.random_seed() {
            let (word, _) = seed.split_at(8);
            self.rng = u64::from_le_bytes(word.try_into().expect("8 bytes")) | 1;
            self.clock = Clock::Journaled;
        }
        self.port = Some(port);
        self.ops.push_back(Op::TrapExits);
        if self.spec.strategy != Strategy::SimpleOneForOne {
            for index in 0..self.spec.children.len() {
                let id = self.spec.children[index].id.clone();
                let key = self.add_child(id, index, Vec::new());
                self.ops.push_back(Op::Start { key, why: Why::Initial });
            }
        }
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            match event {
                Event::Completion { tag, result } => {
                    if self.stop_timer.is_some_and(|(timer, _)| timer == tag) {
                        let (_, pid) = self.stop_timer.take().expect("just matched");
                        self.urgent.push(Command::Exit(ExitSignal { to: pid, reason: ExitReason::Killed, kill: true }));
                    } else if self.stop_signal.is_some_and(|(signal, _)| signal == tag) {
                        let (_, pid) = self.stop_signal.take().expect("just matched");
                        if let Err(error) = result {
                            tracing::debug!(%pid, "a child's exit signal was refused ({error}): terminated instead");
                            self.urgent.push(Command::Terminate(pid));
                        }
                    } else {
                        self.completed(tag, result);
                    }
                }
                Event::Exit { pid, reason, linked } => {
                    // The parent's end, through a link (a `spawn_link`): the supervisor's.
                    if linked && self.port.as_ref().is_some_and(|port| port.parent() == pid) {
                        self.shut_down(reason);
                        continue;
                    }
                    if let Some(index) = self.children.iter().position(|c| c.pid == Some(pid)) {
                        match self.children[index].state {
                            ChildState::Running => self.child_ended(index, reason),
                            ChildState::Stopping => self.stop_ended(index),
                            _ => self.children[index].pid = None,
                        }
                    }
                }
                Event::Message { sender, topic, body } => self.request(sender, topic, body),
                Event::Cancel { reason } => self.shut_down(ExitReason::Error(format!("cancelled: {reason}"))),
            }
        }
        for command in self.urgent.drain(..) {
            let tag = self.next_tag;
            self.next_tag += 1;
            out.yield_command(tag, command);
        }
        match self.pump(out) {
            None => out.set_status(Status::Idle),
            Some(ExitReason::Normal(payload)) => out.complete(Ok(payload)),
            Some(ExitReason::Error(error)) => out.complete(Err(error)),
            // A significant child's trap, say: the supervisor ends with the same reason.
            Some(other) => return Err(other.into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The supervisor driven by hand, without a scheduler: the yields it writes for the
    //! events it is given.

    use std::sync::{Arc, Weak};

    use super::*;
    use crate::process::PortTarget;
    use crate::supervisor::spec::Backoff;

    fn port() -> Port {
        let none: Weak<dyn PortTarget> = Weak::<NoTarget>::new();
        Port::new(Pid::from_u64(1), none)
    }

    struct NoTarget;
    impl PortTarget for NoTarget {
        fn send(&self, _: Pid, _: String, _: Payload) -> Result<(), crate::error::PortError> {
            unreachable!()
        }
        fn respond(&self, _: u64, _: Outcome) -> Result<(), crate::error::PortError> {
            unreachable!()
        }
        fn parent(&self) -> Pid {
            unreachable!()
        }
        fn limits(&self) -> &crate::limits::Limits {
            unreachable!()
        }
        fn is_terminate_requested(&self) -> bool {
            unreachable!()
        }
        fn has_waiting_work(&self) -> bool {
            unreachable!()
        }
        fn step_time_micros(&self) -> Option<u64> {
            unreachable!()
        }
        fn random_seed(&self) -> Option<[u8; 32]> {
            unreachable!()
        }
    }

    fn step(sup: &mut Supervisor, events: Vec<Event>) -> StepOutput {
        let mut events = events;
        let mut out = StepOutput::new();
        sup.step(Events::new(events.drain(..)), &mut out).unwrap();
        out
    }

    /// The first step: trapping exits (answered), then the first start.
    fn started(sup: &mut Supervisor) -> StepOutput {
        let first = step(sup, Vec::new());
        let [y] = first.yields() else { panic!("one yield expected, got {:?}", first.yields()) };
        assert_eq!(y.command, Command::TrapExits(true), "the supervisor traps exits before it starts children");
        let out = step(sup, vec![Event::Completion { tag: y.tag, result: Ok(Payload::empty()) }]);
        assert!(sup.linking);
        out
    }

    /// Answers the one spawn yielded with `pid`; returns the next step's output.
    fn spawned(sup: &mut Supervisor, out: &StepOutput, pid: u64) -> StepOutput {
        let [y] = out.yields() else { panic!("one yield expected, got {:?}", out.yields()) };
        assert!(matches!(y.command, Command::Spawn(_)), "{y:?}");
        step(sup, vec![Event::Completion { tag: y.tag, result: Ok(Payload::u64(pid)) }])
    }

    /// The backoff's delays are the sleeps the supervisor yields before restarts: the
    /// schedule `min(max, initial × multiplier^(n−1))`, jitter taking at most its share
    /// off, and the count starting again once restarts stop for a period.
    #[test]
    fn backoff_delays_are_the_sleeps_yielded_before_restarts() {
        let mut spec = SupervisorSpec::new(Strategy::OneForOne);
        spec.intensity = 10;
        spec.period = Duration::from_secs(3600);
        spec.backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
            multiplier: 2.0,
            jitter: 0.5,
        };
        spec.children.push(ChildSpec::new("w", "worker", "main"));
        let mut sup = Supervisor::new();
        sup.init(port(), START, vec![Payload::json(&spec).unwrap()]).unwrap();
        sup.clock = Clock::Manual(Duration::ZERO);
        let out = started(&mut sup);
        assert!(spawned(&mut sup, &out, 10).yields().is_empty());
        for (n, pid) in (1..=6).zip(11..) {
            let exit = step(
                &mut sup,
                vec![Event::Exit {
                    pid: Pid::from_u64(pid - 1),
                    reason: ExitReason::Error("boom".into()),
                    linked: false,
                }],
            );
            let [y] = exit.yields() else { panic!("{:?}", exit.yields()) };
            let Command::Sleep(delay) = y.command else { panic!("a sleep before restart {n}, got {y:?}") };
            let base = spec.backoff.base_delay(n);
            assert!(
                delay >= base.mul_f64(0.5) && delay <= base,
                "restart {n}: {delay:?} outside [{:?}, {base:?}]",
                base.mul_f64(0.5)
            );
            assert_eq!(base, Duration::from_millis([100, 200, 400, 500, 500, 500][n as usize - 1]));
            let slept = step(&mut sup, vec![Event::Completion { tag: y.tag, result: Ok(Payload::empty()) }]);
            assert!(spawned(&mut sup, &slept, pid).yields().is_empty());
        }
        // A period without restarts: the count starts again.
        sup.clock = Clock::Manual(Duration::from_secs(3601));
        let out = step(
            &mut sup,
            vec![Event::Exit { pid: Pid::from_u64(16), reason: ExitReason::Error("boom".into()), linked: false }],
        );
        let Command::Sleep(delay) = out.yields()[0].command else { panic!() };
        assert!(delay <= Duration::from_millis(100), "the first restart of a new window waits `initial`: {delay:?}");
    }

    /// Child `pid` ended with the error `error`.
    fn crashed(pid: u64, error: &str) -> Event {
        Event::Exit { pid: Pid::from_u64(pid), reason: ExitReason::Error(error.to_owned()), linked: false }
    }

    /// A restart whose spawn fails after the supervisor began to end is not tried again:
    /// the supervisor goes on stopping its children and ends (OTP `hanging_restart_loop`).
    #[test]
    fn a_restart_that_fails_while_ending_is_not_tried_again() {
        let mut spec = SupervisorSpec::new(Strategy::OneForOne);
        spec.intensity = 5;
        spec.children = vec![ChildSpec::new("a", "worker", "main"), ChildSpec::new("b", "worker", "main")];
        let mut sup = Supervisor::new();
        sup.init(port(), START, vec![Payload::json(&spec).unwrap()]).unwrap();
        let out = started(&mut sup);
        let out = spawned(&mut sup, &out, 10);
        assert!(spawned(&mut sup, &out, 11).yields().is_empty());
        let restart = step(&mut sup, vec![crashed(10, "boom")]);
        let [y] = restart.yields() else { panic!("{:?}", restart.yields()) };
        assert!(matches!(y.command, Command::Spawn(_)));
        assert!(step(&mut sup, vec![Event::Cancel { reason: "stop".into() }]).yields().is_empty());
        let failed = step(&mut sup, vec![Event::Completion { tag: y.tag, result: Err("spawn failed".into()) }]);
        let [signal, timeout] = failed.yields() else { panic!("{:?}", failed.yields()) };
        let shutdown = ExitSignal { to: Pid::from_u64(11), reason: ExitReason::Shutdown, kill: false };
        assert_eq!(signal.command, Command::Exit(shutdown), "b is asked to shut down; a is not started again");
        assert_eq!(timeout.command, Command::Sleep(Duration::from_secs(5)), "and killed past its timeout");
        let exit = Event::Exit { pid: Pid::from_u64(11), reason: ExitReason::Shutdown, linked: true };
        let done = step(&mut sup, vec![exit]);
        assert_eq!(done.status(), &Status::Complete(Err("cancelled: stop".into())));
        assert!(done.yields().is_empty());
    }

    #[test]
    fn a_spec_that_does_not_validate_fails_init() {
        let mut sup = Supervisor::new();
        let error = sup
            .init(port(), START, vec![Payload::json(&json!({"strategy": "one_for_one", "children": []})).unwrap()])
            .unwrap_err();
        assert!(format!("{error:#}").contains("needs at least one child"), "{error:#}");
        let error = Supervisor::new().init(port(), "main", Vec::new()).unwrap_err();
        assert!(format!("{error:#}").contains("no entry method `main`; its one entry is `start`"), "{error:#}");
        let _ = Arc::new(());
    }
}
