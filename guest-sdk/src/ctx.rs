//! [`Ctx`], a process's handle on its host, and the futures its methods return.

use std::borrow::Cow;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::executor::{Command, Shared};
use crate::payload::{ExitReason, Level, Message, Payload, Pid};

/// A process's handle on its host: commands, mailbox, children, cancellation.
///
/// Every entry method receives one. It is cheap to clone, and the futures its methods
/// return own what they need, so they can be stored, joined or raced freely. A command
/// is sent to the host when its future is first polled (`.await`ed, or polled by a
/// combinator), not when the method is called; several commands polled in the same step
/// are in flight at once, and each future resumes when its own completion arrives.
/// However many there are: past the host's per-step limit the rest go out in the
/// following steps.
///
/// Once the host cancels the process (at shutdown, or `--timeout`), every wait fails
/// with [`Error::Cancelled`], except for what has already arrived (a completion, a
/// queued message, an exit), so a process that propagates errors with `?` finishes by
/// itself. [`Ctx::send`] still works, to tell others.
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

    /// The process that spawned this one; `None` if the embedder started it (the entry
    /// process of `wasmproc run`, say).
    pub fn parent(&self) -> Option<Pid> {
        crate::host::parent()
    }

    /// Waits for `duration` (to the host's timer resolution).
    ///
    /// Fails if the process is cancelled first, or was not granted `sleep`.
    pub fn sleep(&self, duration: Duration) -> Completion<()> {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.command(Command::Sleep(nanos), "sleep", decode_unit)
    }

    /// Runs `future` for at most `duration`: its output, or [`Error::Timeout`] if the
    /// time runs out first (the future is then dropped: its commands still run on the
    /// host, their completions are ignored).
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// async fn answer_or_give_up(ctx: &Ctx) -> Result<Option<Message>> {
    ///     match ctx.timeout(Duration::from_secs(1), ctx.recv_topic("answer")).await {
    ///         Ok(message) => Ok(Some(message?)),
    ///         Err(Error::Timeout(_)) => Ok(None),
    ///         Err(other) => Err(other.into()),
    ///     }
    /// }
    /// ```
    pub fn timeout<F: Future>(&self, duration: Duration, future: F) -> Timeout<F> {
        Timeout { future: Box::pin(future), timer: self.sleep(duration), duration }
    }

    /// Starts a process of this component running entry `method` with `input`, and
    /// resolves to its pid once it runs. The child is monitored, so [`Ctx::wait`] can
    /// always collect its result. An entry's own `spawn` (`square::spawn(&ctx, 3)`, made
    /// by [`#[entry]`](crate::entry)) does the same with the entry's types.
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

    /// Like [`Ctx::spawn`], and links this process to the child before the child first
    /// runs (see [`Ctx::link`]): an abnormal end of either ends the other, unless it traps
    /// exits. The child is monitored too, so [`Ctx::wait`] gets its result.
    /// `#[entry]`'s generated `spawn_link` does the same with the entry's types.
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// async fn run(ctx: &Ctx) -> Result<u64> {
    ///     ctx.trap_exits(true).await?;
    ///     let worker = ctx.spawn_link("work", 7).await?;
    ///     let exit = ctx.recv_exit().await?;
    ///     ensure!(exit.pid == worker, "an exit of another process: {exit:?}");
    ///     Ok(ctx.wait::<u64>(worker).await?)
    /// }
    /// ```
    ///
    /// Fails as [`Ctx::spawn`] does, and past the host's limit of links (`max_links`).
    pub fn spawn_link(&self, method: &str, input: impl Serialize) -> Completion<Pid> {
        self.spawn_with(None, method, input, true)
    }

    fn spawn_request(&self, kind: Option<String>, method: &str, input: impl Serialize) -> Completion<Pid> {
        self.spawn_with(kind, method, input, false)
    }

    fn spawn_with(&self, kind: Option<String>, method: &str, input: impl Serialize, link: bool) -> Completion<Pid> {
        let what = Cow::Owned(format!("spawning `{method}`"));
        match Payload::json(&input) {
            Ok(input) => {
                let mut inputs = vec![input];
                // A workflow's children belong to it too: they learn its id the same way.
                if let Some(workflow) = self.shared.workflow() {
                    inputs.push(crate::service::workflow_payload(workflow));
                }
                let command = Command::Spawn { kind, method: method.to_owned(), input: inputs, monitor: true, link };
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
    /// Fails if the process ended abnormally ([`Error::Failed`], with its
    /// [`ExitReason`]: terminated, trapped, or its entry failed), did not exist when
    /// monitored ([`Error::NoProc`]), its result does not decode into a `T`, or this
    /// process is cancelled first.
    pub fn wait<T: DeserializeOwned>(&self, pid: Pid) -> Wait<T> {
        Wait { shared: self.shared.clone(), pid, result: PhantomData }
    }

    /// Why process `pid` ended, once it has: its [`ExitReason`], normal or not, as the
    /// host reported it (for a process that did not exist when monitored,
    /// [`ExitReason::Noproc`]). Collects the same exits as [`Ctx::wait`], for a process
    /// that tells a trap from a termination:
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// async fn supervise(ctx: &Ctx, worker: Pid) -> Result<&'static str> {
    ///     Ok(match ctx.exit_of(worker).await? {
    ///         ExitReason::Normal(_) => "done",
    ///         ExitReason::Trap(trap) if trap.kind == TrapKind::OutOfFuel => "out of fuel",
    ///         ExitReason::Trap(_) => "crashed",
    ///         _ => "ended otherwise",
    ///     })
    /// }
    /// ```
    ///
    /// Fails only with [`Error::Cancelled`], if this process is cancelled first.
    pub fn exit_of(&self, pid: Pid) -> ExitOf {
        ExitOf { shared: self.shared.clone(), pid }
    }

    /// Asks for the exit of process `pid`, to collect with [`Ctx::wait`]. A process that
    /// does not exist exits at once, and the wait fails with [`Error::NoProc`].
    pub fn monitor(&self, pid: Pid) -> Completion<()> {
        self.command(Command::Monitor(pid), "monitor", decode_unit)
    }

    /// Stops monitoring process `pid`: no exit of it arrives through a monitor from now
    /// on, and one that arrived and was not waited for is dropped. A [`Ctx::wait`] for it
    /// would then wait until cancelled.
    pub fn demonitor(&self, pid: Pid) -> Completion<()> {
        self.shared.forget_exit(pid);
        self.command(Command::Demonitor(pid), "demonitor", decode_unit)
    }

    /// Links this process and process `pid`, both ways, as Erlang's `link`: when either
    /// ends abnormally, the other ends with the same [`ExitReason`] (a normal end ends
    /// no one), unless it traps exits ([`Ctx::trap_exits`]), when the end arrives as a
    /// [`LinkedExit`](crate::LinkedExit) for [`Ctx::recv_exit`] instead. Linking to a
    /// process that does not exist (or has ended) is an exit signal `noproc` at once.
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// async fn pair(ctx: &Ctx, partner: Pid) -> Result<()> {
    ///     // From here on, if `partner` traps, this process ends with its reason.
    ///     ctx.link(partner).await?;
    ///     ctx.recv().await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// Fails past the host's limit of links (`max_links`), or if `link` is not granted.
    pub fn link(&self, pid: Pid) -> Completion<()> {
        self.command(Command::Link(pid), "link", decode_unit)
    }

    /// Removes the link to process `pid`, both ways: no exit signal of it arrives from
    /// now on. Unlinking what is not linked does nothing.
    pub fn unlink(&self, pid: Pid) -> Completion<()> {
        self.command(Command::Unlink(pid), "unlink", decode_unit)
    }

    /// Whether this process traps exit signals: with `true`, the ends of linked processes
    /// (normal ones too) and the signals of [`Ctx::exit`] arrive as
    /// [`LinkedExit`](crate::LinkedExit)s for [`Ctx::recv_exit`] instead of ending it;
    /// [`Ctx::kill`] still ends it. Off by default.
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// async fn outlive(ctx: &Ctx, worker: Pid) -> Result<ExitReason> {
    ///     ctx.trap_exits(true).await?;
    ///     ctx.link(worker).await?;
    ///     Ok(ctx.recv_exit().await?.reason)
    /// }
    /// ```
    pub fn trap_exits(&self, trap: bool) -> Completion<()> {
        self.command(Command::TrapExits(trap), "trap-exits", decode_unit)
    }

    /// The oldest exit signal this process trapped, once there is one: a linked process
    /// ended, or another sent one with [`Ctx::exit`]. Use it in a
    /// [`select`](crate::select) beside [`Ctx::recv`] to take messages and exits as they
    /// come.
    ///
    /// Fails once the process is cancelled and none is queued.
    pub fn recv_exit(&self) -> RecvExit {
        RecvExit { shared: self.shared.clone() }
    }

    /// Sends process `pid` an exit signal with `reason`, as a linked process's end would,
    /// without a link: a normal `reason` ends nothing, an abnormal one ends `pid` unless
    /// it traps exits (then it gets a [`LinkedExit`](crate::LinkedExit)). A signal to a
    /// process that does not exist is dropped.
    ///
    /// ```
    /// # use wasmproc_guest::prelude::*;
    /// async fn stop(ctx: &Ctx, worker: Pid) -> Result<()> {
    ///     Ok(ctx.exit(worker, ExitReason::Shutdown).await?)
    /// }
    /// ```
    ///
    /// Fails if `exit` is not granted.
    pub fn exit(&self, pid: Pid, reason: ExitReason) -> Completion<()> {
        self.command(Command::Exit { to: pid, reason, kill: false }, "exit", decode_unit)
    }

    /// Ends process `pid` with [`ExitReason::Killed`], whether it traps exits or not
    /// (Erlang's `exit(Pid, kill)`); its linked processes get `killed` in turn.
    ///
    /// Fails if `exit` is not granted.
    pub fn kill(&self, pid: Pid) -> Completion<()> {
        self.command(Command::Exit { to: pid, reason: ExitReason::Killed, kill: true }, "exit", decode_unit)
    }

    /// Puts `body`, as JSON, in the mailbox of process `to` under `topic`, now: the host
    /// delivers it during the step, so nothing is waited for, and a process that sends
    /// and then waits for an answer costs one step a message. Messages from one process
    /// arrive in the order it sent them.
    ///
    /// Fails with [`Error::NoProc`] (no such process, or it is ending),
    /// [`Error::MailboxFull`], [`Error::Denied`] (`send` not granted) or
    /// [`Error::Payload`] (`body` does not serialise). A body over the host's payload
    /// limit ends the process, as any command's would.
    pub fn send(&self, to: Pid, topic: &str, body: impl Serialize) -> Result<(), Error> {
        let body = Payload::json(&body).map_err(|e| Error::payload("failed to serialise a JSON payload", e))?;
        self.send_payload(to, topic, body)
    }

    /// Like [`Ctx::send`] with a payload of any format.
    pub fn send_payload(&self, to: Pid, topic: &str, body: Payload) -> Result<(), Error> {
        crate::host::send(to, topic, body).map_err(|refused| Error::send(to, refused))
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
    /// Fails if the command fails ([`Error::Command`], with its [`ErrorCode`]), is not
    /// granted ([`Error::Denied`]), or the process is cancelled first.
    ///
    /// [`ErrorCode`]: crate::ErrorCode
    pub fn call<T: DeserializeOwned>(&self, name: &str, input: impl Serialize) -> Completion<T> {
        self.call_with(name, input, decode_json::<T>)
    }

    /// Like [`Ctx::call`], with the answer read by `decode`.
    pub(crate) fn call_with<T>(
        &self,
        name: &str,
        input: impl Serialize,
        decode: fn(Payload) -> Result<T, Error>,
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

    pub(crate) fn shared_ref(&self) -> &Shared {
        &self.shared
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

    /// Writes `message` to the host's log at `level`, tagged with the process's pid. The
    /// `log` crate's macros (`log::info!`) write there too.
    pub fn log(&self, level: Level, message: &str) {
        crate::host::log(level, message);
    }

    fn command<T>(
        &self,
        command: Command,
        what: impl Into<Cow<'static, str>>,
        decode: fn(Payload) -> Result<T, Error>,
    ) -> Completion<T> {
        Completion { shared: self.shared.clone(), state: State::Unsent(command), what: what.into(), decode }
    }

    /// A spawn's completion that fails with `error` when polled.
    pub(crate) fn failed(&self, error: Error, what: &'static str) -> Completion<Pid> {
        Completion { shared: self.shared.clone(), state: State::Failed(error), what: what.into(), decode: decode_pid }
    }

    /// A completion that fails when polled, because its JSON input did not serialise.
    fn unserialisable<T>(
        &self,
        error: serde_json::Error,
        what: impl Into<Cow<'static, str>>,
        decode: fn(Payload) -> Result<T, Error>,
    ) -> Completion<T> {
        let what = what.into();
        let error = Error::payload(format_args!("{what} failed: failed to serialise a JSON payload"), error);
        Completion { shared: self.shared.clone(), state: State::Failed(error), what, decode }
    }
}

fn decode_unit(_: Payload) -> Result<(), Error> {
    Ok(())
}

fn decode_json<T: DeserializeOwned>(payload: Payload) -> Result<T, Error> {
    payload.decode().map_err(|e| Error::payload("bad answer", e))
}

/// The `spawn` completion: the child's pid as 8 little-endian bytes.
fn decode_pid(payload: Payload) -> Result<Pid, Error> {
    let bytes: [u8; 8] = payload.data.as_slice().try_into().map_err(|_| {
        Error::Payload(format!(
            "expected the child's pid as 8 bytes, got {} bytes of `{}`",
            payload.data.len(),
            payload.format
        ))
    })?;
    Ok(Pid::from_u64(u64::from_le_bytes(bytes)))
}

/// Spawns a child of this component running entry `method`, typed: what `#[entry]`'s
/// generated `spawn` calls.
#[doc(hidden)]
pub fn spawn_entry<T: Serialize, R>(ctx: &Ctx, method: &str, input: T) -> Spawn<R> {
    Spawn { spawning: ctx.spawn(method, input), result: PhantomData }
}

/// Spawns and links a child of this component running entry `method`, typed: what
/// `#[entry]`'s generated `spawn_link` calls.
#[doc(hidden)]
pub fn spawn_link_entry<T: Serialize, R>(ctx: &Ctx, method: &str, input: T) -> Spawn<R> {
    Spawn { spawning: ctx.spawn_link(method, input), result: PhantomData }
}

/// An entry's own `spawn` in progress (`square::spawn(&ctx, 3)` for `#[entry] async fn
/// square(…)`): resolves to the [`Child`] once it runs, or fails as [`Ctx::spawn`] does.
#[must_use = "a command is only sent when its future is polled"]
pub struct Spawn<R> {
    spawning: Completion<Pid>,
    result: PhantomData<fn() -> R>,
}

impl<R> Future for Spawn<R> {
    type Output = Result<Child<R>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = self.spawning.shared.clone();
        Pin::new(&mut self.spawning).poll(cx).map_ok(|pid| Child { pid, shared, result: PhantomData })
    }
}

/// A child process running an entry whose result is an `R`, from the entry's own
/// `spawn`. It is monitored: [`Child::join`] always gets its result.
#[must_use = "a child's result is only collected by `join`"]
pub struct Child<R> {
    pid: Pid,
    shared: Rc<Shared>,
    result: PhantomData<fn() -> R>,
}

impl<R> Child<R> {
    /// The child's pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }
}

impl<R: DeserializeOwned> Child<R> {
    /// The child's result, once it ends: [`Ctx::wait`] for its pid, typed, and failing
    /// as that does.
    pub fn join(self) -> Wait<R> {
        Wait { shared: self.shared, pid: self.pid, result: PhantomData }
    }
}

impl<R> std::fmt::Debug for Child<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child").field("pid", &self.pid).finish_non_exhaustive()
    }
}

/// A command in flight: sent to the host when first polled, resolved by its completion.
///
/// Dropping it before it resolves does not call the command back (the host still carries
/// it out, unless it was still queued past the per-step limit); its completion is ignored.
#[must_use = "a command is only sent when its future is polled"]
pub struct Completion<T> {
    shared: Rc<Shared>,
    state: State,
    /// What the command was, for its error.
    what: Cow<'static, str>,
    decode: fn(Payload) -> Result<T, Error>,
}

enum State {
    Unsent(Command),
    Sent(u64),
    Failed(Error),
    Done,
}

impl<T> Future for Completion<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match std::mem::replace(&mut this.state, State::Done) {
            State::Unsent(command) => match this.shared.yield_command(command, cx.waker()) {
                Ok(tag) => {
                    this.state = State::Sent(tag);
                    Poll::Pending
                }
                Err(reason) => Poll::Ready(Err(Error::Cancelled(reason))),
            },
            State::Sent(tag) => match this.shared.poll_completion(tag, cx.waker()) {
                Poll::Pending => {
                    this.state = State::Sent(tag);
                    Poll::Pending
                }
                Poll::Ready(Ok(answer)) => Poll::Ready(this.resolve(answer)),
                Poll::Ready(Err(reason)) => Poll::Ready(Err(Error::Cancelled(reason))),
            },
            State::Failed(error) => Poll::Ready(Err(error)),
            State::Done => panic!("`Completion` polled after it resolved"),
        }
    }
}

impl<T> Completion<T> {
    /// The command's answer, decoded.
    fn resolve(&self, answer: Result<Payload, String>) -> Result<T, Error> {
        match answer {
            Ok(payload) => (self.decode)(payload).map_err(|error| match error {
                Error::Payload(message) => Error::Payload(format!("{} failed: {message}", self.what)),
                other => other,
            }),
            Err(error) => Err(Error::command(&self.what, error)),
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

/// A [`Ctx::timeout`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct Timeout<F> {
    future: Pin<Box<F>>,
    timer: Completion<()>,
    duration: Duration,
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The future first: one that is ready at once never starts the timer, and of the
        // two finishing in the same step the future wins.
        if let Poll::Ready(output) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        let duration = self.duration;
        Pin::new(&mut self.timer).poll(cx).map(|slept| match slept {
            Ok(()) => Err(Error::Timeout(duration)),
            Err(error) => Err(error),
        })
    }
}

/// A [`Ctx::wait`] or [`Child::join`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct Wait<T> {
    shared: Rc<Shared>,
    pid: Pid,
    result: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Future for Wait<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let pid = self.pid;
        self.shared.poll_exit(pid, cx.waker()).map(|waited| match waited {
            Ok(ExitReason::Normal(payload)) => {
                payload.decode().map_err(|e| Error::payload(format_args!("bad result from process {pid}"), e))
            }
            Ok(reason) => Err(Error::exited(pid, reason)),
            Err(reason) => Err(Error::Cancelled(reason)),
        })
    }
}

/// A [`Ctx::exit_of`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct ExitOf {
    shared: Rc<Shared>,
    pid: Pid,
}

impl Future for ExitOf {
    type Output = Result<ExitReason, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.poll_exit(self.pid, cx.waker()).map(|waited| waited.map_err(Error::Cancelled))
    }
}

/// A [`Ctx::recv`] or [`Ctx::recv_topic`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct Recv {
    shared: Rc<Shared>,
    topic: Option<String>,
}

impl Future for Recv {
    type Output = Result<Message, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.poll_message(self.topic.as_deref(), cx.waker()).map(|waited| waited.map_err(Error::Cancelled))
    }
}

/// A [`Ctx::recv_exit`] in progress.
#[must_use = "futures do nothing unless polled"]
pub struct RecvExit {
    shared: Rc<Shared>,
}

impl Future for RecvExit {
    type Output = Result<crate::LinkedExit, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.poll_signal(cx.waker()).map(|waited| waited.map_err(Error::Cancelled))
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
