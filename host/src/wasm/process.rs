//! [`WasmProcess`]: a [`Process`] whose steps run in a component instance.
//!
//! Preemption (on unless [`Config::preemption`] is off): a step runs on a fiber
//! (wasmtime's async call) and is looked at every epoch tick ([`watch`]). At the end of
//! its time slice, or at any tick while other processes wait in the scheduler's queues,
//! the fiber yields instead of trapping: the poll returns `Pending`, the process answers
//! the scheduler [`Status::Continue`] (queued again behind everyone waiting) and keeps
//! the suspended step, which its next turn resumes where it stopped. So a process that
//! computes for long holds a worker for at most one tick once someone else wants it.
//! The scheduler gives a resumed step no events: what arrives meanwhile waits in the
//! process's mailbox, within its bounds, for the guest's next step. The future is polled with a no-op waker: the scheduler's queue, not a
//! waker, is what brings the process back. Without preemption a step is a plain call,
//! cheaper (see `docs/perf/sandbox.md`), and one past its slice is stopped with an error instead.
//!
//! [`Config::preemption`]: super::Config::preemption

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use anyhow::{anyhow, bail};
use wasmtime::{Store, Trap, WasmBacktrace};

use wasmproc_types::{ExitReason, Payload, TrapKind};

use super::bindings::wasmproc::process::types as wit;
use super::bindings::{Process as Guest, ProcessIndices, ProcessPre};
use super::config::Config;
use super::convert;
use super::engine::EpochClock;
use super::input;
use super::log::{Escaped, LogSink};
use super::output::{self, Caps};
use super::spare;
use super::stacks;
use super::store::{MemoryExceeded, ProcessLimits, ProcessState, new_store, refuel};
use super::watch::{Stopped, Watch, watch};
use crate::handler::KindLimits;
use crate::process::Port;
use crate::process::Process;
use crate::step::{Events, Status, StepOutput};

/// What the processes of one component share: its code, checked against the world, and
/// the runtime's settings. Made once per component (see `component.rs`).
pub(crate) struct Loaded {
    pub(crate) pre: ProcessPre<ProcessState>,
    /// Where the exports are, found and type-checked once for every instance.
    pub(crate) indices: ProcessIndices,
    pub(crate) entries: Vec<String>,
    pub(crate) log: LogSink,
    pub(crate) clock: EpochClock,
    pub(crate) config: Config,
    /// The SHA-256 of the bytes it was loaded from.
    pub(crate) digest: super::cache::Digest,
}

/// A process running a [`Component`](super::Component): one store and one instance,
/// created by `init` and dropped by `close`, which gives the instance's memory slot back.
///
/// Every call into the guest runs under the component's memory cap; a step past its
/// time slice is preempted (see the module docs), an `init` past it stopped. A trap
/// (including a limit hit) fails that call with an error that says which export
/// trapped and why; the scheduler then ends this process with it, and nothing else.
pub struct WasmProcess {
    loaded: Arc<Loaded>,
    limits: ProcessLimits,
    state: State,
    /// Events not yet handed to the guest: those of the step about to start (or any
    /// given to a suspended one, which the scheduler gives none). Kept so that steps
    /// reuse its allocation.
    events: Vec<input::Event>,
    /// Epoch ticks the process's steps have run for (see [`Config::cpu_budget`]).
    ///
    /// [`Config::cpu_budget`]: super::Config::cpu_budget
    cpu_ticks: u64,
    /// The fiber stack the store keeps between steps (wasmtime keeps the last one a store
    /// used), once a step has made one; and whether a step ran on it since the last
    /// [`Process::hibernate`] gave its pages back.
    stack: Option<std::ops::Range<usize>>,
    stack_warm: bool,
    /// `wants_hibernation` said yes, and `hibernate` has not come since.
    hibernation_asked: bool,
    /// What one step's output may hold: the scheduler's limits, read at `init`.
    caps: Caps,
}

enum State {
    /// Not initialised, or closed.
    Empty,
    /// Between steps.
    Ready(Running),
    /// In a step that was preempted; the future owns the store until the step ends.
    Suspended(Pin<Box<StepFuture>>),
}

type StepFuture = dyn Future<Output = Stepped> + Send;

/// A step's end: the store back, the events buffer back (its events handed over), and
/// the guest's answer.
type Stepped = (Running, Vec<input::Event>, wasmtime::Result<output::StepOutput>);

struct Running {
    store: Store<ProcessState>,
    guest: Guest,
    /// Steps run on a fiber (wasmtime's async call), to be preempted.
    preemptible: bool,
}

impl WasmProcess {
    pub(crate) fn new(loaded: Arc<Loaded>, limits: ProcessLimits) -> Self {
        WasmProcess {
            loaded,
            limits,
            state: State::Empty,
            events: Vec::new(),
            cpu_ticks: 0,
            stack: None,
            stack_warm: false,
            hibernation_asked: false,
            caps: Caps { yields: 0, bytes: 0, output: 0 },
        }
    }

    /// Runs a step of `running` over the events gathered so far: `None` if it was
    /// preempted (and is kept to resume).
    fn run(&mut self, running: Running) -> anyhow::Result<Option<Stepped>> {
        match running {
            mut running @ Running { preemptible: false, .. } => {
                running.store.data_mut().ticks.slice = 0;
                running.store.set_epoch_deadline(1);
                let clock = &self.loaded.clock;
                let started = clock.now();
                let step = running.guest.step();
                let result = output::with_caps(self.caps, || step.call(&mut running.store, (&self.events,)));
                let result = result.map(|(output,)| output);
                self.cpu_ticks += clock.now() - started;
                let batch = std::mem::take(&mut self.events);
                Ok(Some((running, batch, result)))
            }
            Running { mut store, guest, preemptible: true } => {
                store.data_mut().ticks.slice = 0;
                store.set_epoch_deadline(1);
                // The future owns what it borrows (store, events) so that it can outlive
                // this turn when preempted.
                let batch = std::mem::take(&mut self.events);
                let future = spare::boxed(async move {
                    let result = guest.step().call_async(&mut store, (&batch,)).await.map(|(output,)| output);
                    (Running { store, guest, preemptible: true }, batch, result)
                });
                self.resume(future)
            }
        }
    }

    /// Polls a step once: runs it until it ends or its time slice does.
    fn resume(&mut self, mut future: Pin<Box<StepFuture>>) -> anyhow::Result<Option<Stepped>> {
        let clock = &self.loaded.clock;
        let started = clock.now();
        // What another store's call left behind is not this store's stack.
        let _ = stacks::take_made();
        // The output is lifted in the poll that ends the step.
        let polled = output::with_caps(self.caps, || future.as_mut().poll(&mut Context::from_waker(Waker::noop())));
        self.cpu_ticks += clock.now() - started;
        if let Some(made) = stacks::take_made() {
            self.stack = Some(made);
        }
        self.stack_warm = true;
        match polled {
            Poll::Ready(stepped) => {
                spare::recycle(future);
                Ok(Some(stepped))
            }
            // Dropping the future unwinds the suspended guest and frees its fiber.
            Poll::Pending if self.cpu_ticks >= self.limits.cpu_budget_ticks => Err(cpu_budget_exceeded(&self.limits)),
            Poll::Pending => {
                self.state = State::Suspended(future);
                Ok(None)
            }
        }
    }
}

impl Process for WasmProcess {
    fn init(&mut self, port: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        let pid = port.pid();
        let loaded = &self.loaded;
        if !loaded.entries.iter().any(|entry| entry == method) {
            bail!("unknown entry method `{method}`; this component has: {}", loaded.entries.join(", "));
        }
        let limits = self.limits;
        self.caps = Caps {
            yields: port.max_yields_per_step(),
            bytes: port.max_payload_size(),
            output: port.max_output_per_step(),
        };
        let mut store = new_store(loaded.pre.engine(), pid, loaded.log.clone(), &limits);
        store.data_mut().port = Some(port.clone());
        let instantiated = loaded.pre.instance_pre().instantiate(&mut store).and_then(|instance| {
            let guest = loaded.indices.load_prechecked(&mut store, &instance)?;
            Ok((guest, loaded.config.preemption))
        });
        // Instantiation runs the core modules' start functions, under `init`'s limit.
        let (guest, preemptible) = instantiated.map_err(|e| match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => guest_error(e, "init", &limits, store.data()),
            _ => match limits.instance.name_exceeded(&e) {
                Some(exceeded) => exceeded.context(format!("failed to instantiate process {pid}")),
                None => anyhow::Error::from(e).context(format!("failed to instantiate process {pid}")),
            },
        })?;
        refuel(&mut store, limits.fuel);
        let input: Vec<wit::Payload> = input.into_iter().map(convert::payload_to_wit).collect();
        let accepted = guest
            .call_init(&mut store, pid.as_u64(), method, &input)
            .map_err(|e| guest_error(e, "init", &limits, store.data()))?;
        accepted.map_err(InitRefused)?;
        // From here on the epoch callback watches the steps. With preemption a step past
        // its slice suspends instead of trapping; wasmtime then requires every call to be
        // async, and only steps come after `init`.
        let watching = Watch {
            slice: limits.time_slice_ticks,
            slice_limit: limits.time_slice,
            preemptible,
            cpu_budget: limits.cpu_budget.map(|budget| (limits.cpu_budget_ticks, budget)),
        };
        watch(&mut store, watching, |state| &mut state.ticks, port, || None);
        self.state = State::Ready(Running { store, guest, preemptible });
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        self.events.extend(events.map(input::Event::from));
        let stepped = match std::mem::replace(&mut self.state, State::Empty) {
            State::Ready(running) => self.run(running)?,
            State::Suspended(future) => self.resume(future)?,
            State::Empty => bail!("`step` called on a Wasm process that is not initialised"),
        };
        let Some((running, mut batch, result)) = stepped else {
            out.set_preempted();
            return Ok(());
        };
        let limits = &self.limits;
        // The payloads are the guest's now (copied into its memory); free them at once.
        // Events given while the step was suspended (none from the scheduler) stay, for
        // the next step, in the buffer that keeps its allocation.
        batch.clear();
        let unread = std::mem::replace(&mut self.events, batch);
        self.events.extend(unread);
        let output = result.map_err(|e| step_error(e, limits, running.store.data()))?;
        if self.cpu_ticks >= limits.cpu_budget_ticks {
            return Err(cpu_budget_exceeded(limits));
        }
        self.state = State::Ready(running);
        // An output past a limit ends the process with the scheduler's own error for it.
        convert::check_output_size(&output, self.caps).map_err(anyhow::Error::msg)?;
        let status = convert::status_from_output(output.status.0, self.caps).map_err(anyhow::Error::msg)?;
        // A completing step's yields are discarded (DESIGN 2); they were not even lifted.
        if !matches!(status, Status::Complete(_)) {
            for y in convert::yields_from_output(output.yields, self.caps).map_err(anyhow::Error::msg)? {
                let (tag, command) = y.map_err(anyhow::Error::msg)?;
                out.yield_command(tag, command);
            }
        }
        // Unread events must reach the guest even if it means to wait: waiting would not
        // bring them again.
        let status = match status {
            Status::Blocked | Status::Idle if !self.events.is_empty() => Status::Continue,
            status => status,
        };
        out.set_status(status);
        Ok(())
    }

    fn wants_hibernation(&mut self) -> bool {
        let wants = self.stack_warm && !self.hibernation_asked;
        self.hibernation_asked |= wants;
        wants
    }

    fn hibernate(&mut self) -> bool {
        self.hibernation_asked = false;
        // Only between steps: a suspended step's fiber is still on its stack.
        let (State::Ready(_), Some(stack), true) = (&self.state, &self.stack, self.stack_warm) else {
            return false;
        };
        // SAFETY: the state is `Ready`: every call of the store has returned, and the
        // store's next call only starts in a later step.
        unsafe { stacks::release_top(stack) };
        self.stack_warm = false;
        true
    }

    fn limits(&self) -> Option<KindLimits> {
        Some(kind_limits(&self.limits))
    }

    fn close(&mut self) {
        // A suspended step's future, dropped here, unwinds the guest's fiber first.
        self.state = State::Empty;
    }
}

impl std::fmt::Debug for WasmProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pid, state) = match &self.state {
            State::Empty => (None, "empty"),
            State::Ready(running) => (Some(running.store.data().pid()), "ready"),
            State::Suspended(_) => (None, "suspended"),
        };
        f.debug_struct("WasmProcess")
            .field("entries", &self.loaded.entries)
            .field("limits", &self.limits)
            .field("pid", &pid)
            .field("state", &state)
            .finish()
    }
}

/// The guest's `init` answered with an error: it does not take the entry method or the
/// input it was given (an SDK guest's `init` only decodes its input). The spawner asked
/// for something the guest does not do, rather than the guest failing; found in a
/// [`SpawnError::Init`](crate::error::SpawnError::Init)'s source by downcasting.
#[derive(Debug, thiserror::Error)]
#[error("the guest refused: {0}")]
pub struct InitRefused(pub String);

/// What of `limits` bounds the processes a process under them spawns.
pub(crate) fn kind_limits(limits: &ProcessLimits) -> KindLimits {
    let bound = KindLimits::new(limits.max_memory, limits.time_slice);
    KindLimits { fuel: limits.fuel, cpu_budget: limits.cpu_budget, ..bound }
}

fn cpu_budget_exceeded(limits: &ProcessLimits) -> anyhow::Error {
    let stopped = Stopped::CpuBudget(limits.cpu_budget.unwrap_or_default());
    anyhow::Error::new(ExitReason::trap(TrapKind::CpuBudget, stopped.to_string()))
}

/// The error of a failed call to the guest's `export`, in one line: the time slice by
/// name if that stopped it, the panic's location and message if a Rust guest panicked
/// (as its stderr reported it), otherwise the root cause (the trap, or the limiter's
/// message for a memory-limit hit). The Wasm backtrace, when there is one, is a `debug`
/// event of target `wasmproc::guest` instead (`wasmproc -v` shows it): it is many lines
/// long and helps whoever debugs the guest, not whoever reads the process's result.
pub(crate) fn guest_error(
    error: wasmtime::Error,
    export: &str,
    limits: &ProcessLimits,
    state: &ProcessState,
) -> anyhow::Error {
    let (_, message) = classify(error, export, limits, state);
    anyhow!("{message}")
}

/// The end of a process whose `step` failed with `error`: an [`ExitReason`] (a trap of
/// its kind, or [`ExitReason::Terminated`] for a step cut short by a terminate request),
/// as the error the scheduler ends the process with (see [`Process::step`]).
fn step_error(error: wasmtime::Error, limits: &ProcessLimits, state: &ProcessState) -> anyhow::Error {
    if let Some(Stopped::Terminated) = error.downcast_ref::<Stopped>() {
        return anyhow::Error::new(ExitReason::Terminated);
    }
    let (kind, message) = classify(error, "step", limits, state);
    let message = match kind {
        // The guest's own words are the trap's message; where it panicked follows them.
        TrapKind::Panic => message.strip_prefix("guest `step` panicked ").map_or(message.clone(), panic_words),
        _ => message,
    };
    anyhow::Error::new(ExitReason::trap(kind, message))
}

/// A panic as its hook reported it (`at src/lib.rs:3:5: boom`) as the trap's message:
/// `boom (at src/lib.rs:3:5)`.
fn panic_words(panic: &str) -> String {
    match panic.strip_prefix("at ").and_then(|rest| rest.split_once(": ")) {
        Some((location, words)) => format!("{words} (at {location})"),
        None => panic.to_owned(),
    }
}

/// What kind of trap `error` is, and its one-line message (see [`guest_error`]).
fn classify(error: wasmtime::Error, export: &str, limits: &ProcessLimits, state: &ProcessState) -> (TrapKind, String) {
    if let Some(stopped) = error.downcast_ref::<Stopped>() {
        let kind = match stopped {
            Stopped::CpuBudget(_) => TrapKind::CpuBudget,
            _ => TrapKind::Other,
        };
        return (kind, stopped.to_string());
    }
    if let Some(exceeded) = error.downcast_ref::<MemoryExceeded>() {
        return (TrapKind::MemoryLimit, exceeded.to_string());
    }
    let trap = error.downcast_ref::<Trap>().copied();
    match trap {
        Some(Trap::Interrupt) => {
            let message = format!(
                "init time limit exceeded: `{export}` ran longer than the `init_time_limit` of {:?} and was stopped \
                 (raise it with `--init-time-limit`)",
                limits.init_time_limit
            );
            return (TrapKind::Other, message);
        }
        Some(Trap::OutOfFuel) => {
            let message = format!(
                "fuel budget exhausted: the process used all of its {} units of `fuel` (in `{export}`)",
                limits.fuel.unwrap_or_default()
            );
            return (TrapKind::OutOfFuel, message);
        }
        _ => {}
    }
    // A Rust guest's panic aborts with `unreachable`, after its hook has written the
    // message to stderr; a stale report cannot pass for the cause of another trap.
    let panicked = match trap {
        Some(Trap::UnreachableCodeReached) => state.panic(),
        _ => None,
    };
    let kind = match (trap, &panicked) {
        (_, Some(_)) => TrapKind::Panic,
        (Some(Trap::UnreachableCodeReached), None) => TrapKind::Unreachable,
        (Some(Trap::StackOverflow), _) => TrapKind::StackOverflow,
        _ => TrapKind::Other,
    };
    let Some(backtrace) = error.downcast_ref::<WasmBacktrace>() else {
        let message = match panicked {
            Some(panic) => format!("guest `{export}` panicked {panic}"),
            None => format!("{:#}", anyhow::Error::from(error).context(format!("guest `{export}` failed"))),
        };
        return (kind, message);
    };
    // Indented, each line escaped: the frames' names are the guest's, and no frame can
    // pass for a line of the host's.
    let frames: Vec<String> = backtrace.to_string().lines().map(|line| format!("    {}", Escaped(line))).collect();
    tracing::debug!(
        target: "wasmproc::guest",
        pid = state.pid().as_u64(),
        "guest `{export}` failed; wasm backtrace:\n{}",
        frames.join("\n")
    );
    let message = match panicked {
        Some(panic) => format!("guest `{export}` panicked {panic}"),
        None => format!("guest `{export}` failed: {}", error.root_cause()),
    };
    (kind, message)
}
