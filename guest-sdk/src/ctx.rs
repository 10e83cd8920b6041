//! [`Ctx`], a process's handle on its host, and the futures its methods return.

use std::borrow::Cow;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CommandError;
use crate::executor::{Command, Shared};
use crate::payload::{Level, Message, Payload, Pid};

/// A process's handle on its host: commands, mailbox, children, cancellation.
///
/// Every entry method receives one. It is cheap to clone, and the futures its methods
/// return own what they need, so they can be stored, joined or raced freely. A command
/// is sent to the host when its future is first polled (`.await`ed, or polled by a
/// combinator), not when the method is called; several commands polled in the same step
/// are in flight at once, and each future resumes when its own completion arrives.
///
/// A `Ctx` belongs to its process: it is neither `Send` nor `Sync`, like everything in
/// a single-threaded guest.
#[derive(Clone)]
pub struct Ctx {
    shared: Rc<Shared>,
}

impl Ctx {
    pub(crate) fn new(shared: Rc<Shared>) -> Self {
        Ctx { shared }
    }

    /// The process's own pid.
    pub fn pid(&self) -> Pid {
        self.shared.pid()
    }

    /// Waits for `duration` (to the host's timer resolution).
    ///
    /// A sleep the host refuses (the process was not granted `sleep`) ends at once.
    pub fn sleep(&self, duration: Duration) -> Sleep {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Sleep(self.command(Command::Sleep(nanos), "sleep", decode_unit))
    }

    /// Starts a process of this component running entry `method` with `input`, and
    /// resolves to its pid once it runs. The child is monitored, so
    /// [`Ctx::wait`] can always collect its result.
    ///
    /// Fails if `input` does not serialise, the method does not exist, the input does not
    /// fit it, or the host refuses (not granted `spawn`, too many processes, stopping).
    pub fn spawn(&self, method: &str, input: impl Serialize) -> Completion<Pid> {
        self.spawn_request(None, method, input)
    }

    /// Like [`Ctx::spawn`] for a process of the registered kind `kind`.
    pub fn spawn_kind(&self, kind: &str, method: &str, input: impl Serialize) -> Completion<Pid> {
        self.spawn_request(Some(kind.to_owned()), method, input)
    }

    fn spawn_request(&self, kind: Option<String>, method: &str, input: impl Serialize) -> Completion<Pid> {
        let what = Cow::Owned(format!("spawning `{method}`"));
        match Payload::json(&input) {
            Ok(input) => {
                let command = Command::Spawn { kind, method: method.to_owned(), input: vec![input], monitor: true };
                self.command(command, what, decode_pid)
            }
            Err(error) => self.unserialisable(error, what, decode_pid),
        }
    }

    /// The result of process `pid`, decoded from JSON, once it ends.
    ///
    /// Works for every child started with [`Ctx::spawn`] and every process passed to
    /// [`Ctx::monitor`]: an exit that arrives before anybody waits for it is kept until
    /// someone does. Each exit is handed to one waiter.
    ///
    /// Fails if the process ended with an error (terminated, trapped, or its entry
    /// failed) or its result does not decode into a `T`.
    pub fn wait<T: DeserializeOwned>(&self, pid: Pid) -> Wait<T> {
        Wait { shared: self.shared.clone(), pid, result: PhantomData }
    }

    /// Asks for the exit of process `pid`, to collect with [`Ctx::wait`]. A process that
    /// does not exist exits at once with the error `noproc`.
    pub fn monitor(&self, pid: Pid) -> Completion<()> {
        self.command(Command::Monitor(pid), "monitor", decode_unit)
    }

    /// Puts `body`, as JSON, in the mailbox of process `to` under `topic`.
    ///
    /// Delivered when first polled, at once, through the host's `send` function: the
    /// future is ready on its first poll, so awaiting it does not end the step, and a
    /// process that sends and then waits for an answer costs one step a message.
    ///
    /// Fails if `body` does not serialise, or the message could not be delivered (no
    /// such process, exiting, mailbox full, `send` not granted).
    pub fn send(&self, to: Pid, topic: &str, body: impl Serialize) -> Completion<()> {
        match Payload::json(&body) {
            Ok(body) => self.send_payload(to, topic, body),
            Err(error) => self.unserialisable(error, "send", decode_unit),
        }
    }

    /// Like [`Ctx::send`] with a payload of any format.
    pub fn send_payload(&self, to: Pid, topic: &str, body: Payload) -> Completion<()> {
        self.command(Command::Send { to, topic: topic.to_owned(), body }, "send", decode_unit)
    }

    /// The oldest message in the mailbox, once there is one.
    ///
    /// Fails once the process is cancelled and the mailbox is empty, so a receive loop
    /// that propagates errors (`ctx.recv().await?`) ends at shutdown by itself.
    pub fn recv(&self) -> Recv {
        Recv { shared: self.shared.clone(), topic: None }
    }

    /// The oldest message about `topic`; messages about other topics stay queued, in
    /// order, for later receives. Fails like [`Ctx::recv`].
    pub fn recv_topic(&self, topic: &str) -> Recv {
        Recv { shared: self.shared.clone(), topic: Some(topic.to_owned()) }
    }

    /// Runs the embedder's custom command `name` with `input` as JSON, and decodes its
    /// answer into a `T`.
    ///
    /// Fails if the command fails, is unknown, or the process was not granted it.
    pub fn call<T: DeserializeOwned>(&self, name: &str, input: impl Serialize) -> Completion<T> {
        self.call_with(name, input, decode_json::<T>)
    }

    /// Like [`Ctx::call`], with the answer read by `decode`.
    pub(crate) fn call_with<T>(
        &self,
        name: &str,
        input: impl Serialize,
        decode: fn(Payload) -> anyhow::Result<T>,
    ) -> Completion<T> {
        let what = Cow::Owned(format!("custom command `{name}`"));
        match Payload::json(&input) {
            Ok(payload) => self.command(Command::Custom { name: name.to_owned(), payload }, what, decode),
            Err(error) => self.unserialisable(error, what, decode),
        }
    }

    pub(crate) fn shared(&self) -> Rc<Shared> {
        self.shared.clone()
    }

    /// Ends process `pid` with the result `error("terminated")`; resolves once it has ended.
    pub fn terminate(&self, pid: Pid) -> Completion<()> {
        self.command(Command::Terminate(pid), "terminate", decode_unit)
    }

    /// Whether the host has asked the process to finish (at shutdown, for example).
    pub fn is_cancelled(&self) -> bool {
        self.shared.is_cancelled()
    }

    /// Resolves with the reason once the host asks the process to finish. A process that
    /// does not finish by the host's deadline is terminated.
    pub fn cancelled(&self) -> Cancellation {
        Cancellation { shared: self.shared.clone() }
    }

    /// Writes `message` to the host's log at `level`, tagged with the process's pid.
    pub fn log(&self, level: Level, message: &str) {
        crate::host::log(level, message);
    }

    fn command<T>(
        &self,
        command: Command,
        what: impl Into<Cow<'static, str>>,
        decode: fn(Payload) -> anyhow::Result<T>,
    ) -> Completion<T> {
        Completion { shared: self.shared.clone(), state: State::Unsent(command), what: what.into(), decode }
    }

    /// A completion that fails when polled, because its JSON input did not serialise.
    fn unserialisable<T>(
        &self,
        error: serde_json::Error,
        what: impl Into<Cow<'static, str>>,
        decode: fn(Payload) -> anyhow::Result<T>,
    ) -> Completion<T> {
        let error = anyhow::Error::new(error).context("failed to serialise a JSON payload");
        Completion { shared: self.shared.clone(), state: State::Failed(error), what: what.into(), decode }
    }
}

fn decode_unit(_: Payload) -> anyhow::Result<()> {
    Ok(())
}

fn decode_json<T: DeserializeOwned>(payload: Payload) -> anyhow::Result<T> {
    Ok(payload.decode()?)
}

/// The `spawn` completion: the child's pid as 8 little-endian bytes.
fn decode_pid(payload: Payload) -> anyhow::Result<Pid> {
    let bytes: [u8; 8] = payload.data.as_slice().try_into().map_err(|_| {
        anyhow!("expected the child's pid as 8 bytes, got {} bytes of `{}`", payload.data.len(), payload.format)
    })?;
    Ok(Pid::from_u64(u64::from_le_bytes(bytes)))
}

/// A command in flight: sent to the host when first polled, resolved by its completion.
///
/// Dropping it before it resolves does not call the command back (the host still carries
/// it out); its completion is ignored.
#[must_use = "a command is only sent when its future is polled"]
pub struct Completion<T> {
    shared: Rc<Shared>,
    state: State,
    /// What the command was, for its error.
    what: Cow<'static, str>,
    decode: fn(Payload) -> anyhow::Result<T>,
}

enum State {
    Unsent(Command),
    Sent(u64),
    Failed(anyhow::Error),
    Done,
}

impl<T> Future for Completion<T> {
    type Output = anyhow::Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match std::mem::replace(&mut this.state, State::Done) {
            State::Unsent(command) => match crate::host::send_now(command) {
                Ok(sent) => Poll::Ready(this.resolve(sent.map(|()| Payload::bytes(Vec::new())))),
                Err(command) => {
                    this.state = State::Sent(this.shared.yield_command(command, cx.waker()));
                    Poll::Pending
                }
            },
            State::Sent(tag) => match this.shared.poll_completion(tag, cx.waker()) {
                Poll::Pending => {
                    this.state = State::Sent(tag);
                    Poll::Pending
                }
                Poll::Ready(result) => Poll::Ready(this.resolve(result)),
            },
            State::Failed(error) => Poll::Ready(Err(error.context(format!("{} failed", this.what)))),
            State::Done => panic!("`Completion` polled after it resolved"),
        }
    }
}

impl<T> Completion<T> {
    /// The command's answer, decoded.
    fn resolve(&self, answer: Result<Payload, String>) -> anyhow::Result<T> {
        match answer {
            Ok(payload) => (self.decode)(payload).with_context(|| format!("bad answer to {}", self.what)),
            Err(error) => Err(anyhow::Error::new(CommandError::parse(error)).context(format!("{} failed", self.what))),
        }
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        if let State::Sent(tag) = self.state {
            self.shared.forget(tag);
        }
    }
}

/// A [`Ctx::sleep`] in progress.
#[must_use = "a sleep only starts when its future is polled"]
pub struct Sleep(Completion<()>);

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A refused sleep has nothing to wait for; `Ctx::sleep` documents that it ends.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// A [`Ctx::wait`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct Wait<T> {
    shared: Rc<Shared>,
    pid: Pid,
    result: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Future for Wait<T> {
    type Output = anyhow::Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let pid = self.pid;
        self.shared.poll_exit(pid, cx.waker()).map(|outcome| match outcome {
            Ok(payload) => payload.decode().with_context(|| format!("bad result from process {pid}")),
            Err(error) => Err(anyhow!(error).context(format!("process {pid} failed"))),
        })
    }
}

/// A [`Ctx::recv`] or [`Ctx::recv_topic`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct Recv {
    shared: Rc<Shared>,
    topic: Option<String>,
}

impl Future for Recv {
    type Output = anyhow::Result<Message>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let poll = self.shared.poll_message(self.topic.as_deref(), cx.waker());
        poll.map(|message| message.map_err(|reason| anyhow!("cancelled: {reason}")))
    }
}

/// A [`Ctx::cancelled`] in progress; resolves to the reason.
#[must_use = "futures do nothing unless polled"]
pub struct Cancellation {
    shared: Rc<Shared>,
}

impl Future for Cancellation {
    type Output = String;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<String> {
        self.shared.poll_cancel(cx.waker())
    }
}
