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
//!
//! `wait` (`waiting.rs`): a guest of a component that imports it may end a step inside
//! its call of `step`, suspended on the same kind of fiber. The step's future is then kept
//! as waiting, the output given to `wait` is the step's, and the next step resumes the
//! future with its events instead of calling `step` again. Every call into such a
//! component is asynchronous (wasmtime's rule for an instance with an import that
//! suspends), its steps on fibers even without preemption. A process waiting so past the
//! hibernation threshold is told to return from `step` ([`Process::hibernate`]).
//!
//! [`Config::preemption`]: super::Config::preemption

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use anyhow::{anyhow, bail};
use wasmtime::component::{ComponentExportIndex, ComponentNamedList, Instance, Lift, Lower};
use wasmtime::{Store, Trap, WasmBacktrace};

use wasmproc_types::{ExitReason, Payload, TrapKind};

use super::bindings::wasmproc::process::types as wit;
use super::bindings::{Process as Guest, ProcessIndices, ProcessPre};
use super::component::suspended;
use super::config::Config;
use super::convert;
use super::engine::EpochClock;
use super::hibernate;
use super::input;
use super::log::{Escaped, LogSink};
use super::output::{self, Caps};
use super::spare;
use super::stacks;
use super::store::{MemoryExceeded, ProcessLimits, ProcessState, new_store, refuel, store_with};
use super::waiting::{self, Polling};
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
    /// The component imports `wait` (`waiting.rs`): every call into its instances is
    /// asynchronous, and its steps run on fibers even without preemption.
    pub(crate) waits: bool,
    /// The memory image taken out of the component (`image.rs`), given to every
    /// instantiation of `pre`.
    pub(crate) image: Option<Arc<super::image::GuestImage>>,
    /// How a waiting process of the component gives back its whole instance
    /// (`hibernate.rs`); `None` for a component that cannot, or when
    /// [`Config::hibernate_instances`] is off.
    pub(crate) hooks: Option<Hooks>,
}

/// The exports [`hibernate::instrument`] added to a component, and its memory's initial
/// contents.
pub(crate) struct Hooks {
    memory_size: ComponentExportIndex,
    memory_grow: ComponentExportIndex,
    /// Getter and setter of each mutable global, and whether it is 64-bit.
    globals: Vec<(ComponentExportIndex, ComponentExportIndex, bool)>,
    reference: Arc<hibernate::Reference>,
    counts: Arc<hibernate::Counts>,
}

impl Hooks {
    /// The hooks of `component`, if it has them all.
    pub(crate) fn of(
        component: &wasmtime::component::Component,
        reference: Arc<hibernate::Reference>,
        counts: Arc<hibernate::Counts>,
    ) -> Option<Hooks> {
        let index = |name: &str| component.get_export_index(None, name);
        let memory_size = index(hibernate::names::MEMORY_SIZE)?;
        let memory_grow = index(hibernate::names::MEMORY_GROW)?;
        let mut globals = Vec::new();
        for k in 0.. {
            let found = [false, true].into_iter().find_map(|wide| {
                Some((index(&hibernate::names::get(k, wide))?, index(&hibernate::names::set(k, wide))?, wide))
            });
            match found {
                Some(global) => globals.push(global),
                None => break,
            }
        }
        Some(Hooks { memory_size, memory_grow, globals, reference, counts })
    }
}

/// A process that gave back its whole instance: what its next step makes it again from.
struct Hibernated {
    /// The store's data, kept whole: its WASI context, its resource table (empty),
    /// its limiter, its ticks and its port.
    data: ProcessState,
    memory: hibernate::Captured,
    globals: Vec<u64>,
    /// Fuel left, when the engine meters it.
    fuel: Option<u64>,
    on_fiber: bool,
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
    /// Between steps, the guest suspended in `wait` (`waiting.rs`): the future owns the
    /// store, and the next step resumes it with its events.
    Waiting(Pin<Box<StepFuture>>),
    /// The guest broke `wait`'s contract when it was told to return from `step` (see
    /// [`Process::hibernate`]): the next step ends the process with this error.
    Broken(anyhow::Error),
    /// Between steps, its instance given back (`hibernate.rs`): the next step makes it
    /// again.
    Hibernated(Box<Hibernated>),
}

/// How a poll of a step's future ended.
enum Polled {
    /// The guest returned from `step`.
    Returned(Stepped),
    /// The guest called `wait` with this output; its future, to resume with the next
    /// step's events.
    Waited(Pin<Box<StepFuture>>, output::StepOutput),
    /// The step was preempted: its future, to resume.
    Preempted(Pin<Box<StepFuture>>),
}

type StepFuture = dyn Future<Output = Stepped> + Send;

/// A step's end: the store back, the events buffer back (its events handed over), and
/// the guest's answer.
type Stepped = (Running, Vec<input::Event>, wasmtime::Result<output::StepOutput>);

struct Running {
    store: Store<ProcessState>,
    guest: Guest,
    instance: Instance,
    /// The address of the instance's memory, for a component with [`Hooks`].
    memory: usize,
    /// Steps run on a fiber (wasmtime's async call): to be preempted, or because the
    /// guest may suspend in `wait`.
    on_fiber: bool,
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

    /// Runs a step of `running` over the events gathered so far.
    fn run(&mut self, running: Running) -> anyhow::Result<Polled> {
        match running {
            mut running @ Running { on_fiber: false, .. } => {
                running.store.data_mut().ticks.slice = 0;
                running.store.set_epoch_deadline(1);
                let clock = &self.loaded.clock;
                let started = clock.now();
                let step = running.guest.step();
                let result = output::with_caps(self.caps, || step.call(&mut running.store, (&self.events,)));
                let result = result.map(|(output,)| output);
                self.cpu_ticks += clock.now() - started;
                let batch = std::mem::take(&mut self.events);
                Ok(Polled::Returned((running, batch, result)))
            }
            Running { mut store, guest, instance, memory, on_fiber: true } => {
                store.data_mut().ticks.slice = 0;
                store.set_epoch_deadline(1);
                // The future owns what it borrows (store, events) so that it can outlive
                // this turn when preempted.
                let batch = std::mem::take(&mut self.events);
                let future = spare::boxed(async move {
                    let result = guest.step().call_async(&mut store, (&batch,)).await.map(|(output,)| output);
                    (Running { store, guest, instance, memory, on_fiber: true }, batch, result)
                });
                self.resume(future, Polling::Step)
            }
        }
    }

    /// Polls a step once, for `polling`: runs it until it ends, calls `wait`, or its time
    /// slice ends.
    fn resume(&mut self, mut future: Pin<Box<StepFuture>>, polling: Polling) -> anyhow::Result<Polled> {
        let clock = &self.loaded.clock;
        let started = clock.now();
        // What another store's call left behind is not this store's stack.
        let _ = stacks::take_made();
        // The output is lifted in the poll that ends the step, or in `wait`.
        let (polled, waited) = output::with_caps(self.caps, || {
            polling.poll(|| future.as_mut().poll(&mut Context::from_waker(Waker::noop())))
        });
        self.cpu_ticks += clock.now() - started;
        if let Some(made) = stacks::take_made() {
            self.stack = Some(made);
        }
        self.stack_warm = true;
        match (polled, waited) {
            (Poll::Ready(stepped), _) => {
                spare::recycle(future);
                Ok(Polled::Returned(stepped))
            }
            // Dropping the future unwinds the suspended guest and frees its fiber.
            (Poll::Pending, _) if self.cpu_ticks >= self.limits.cpu_budget_ticks => {
                Err(cpu_budget_exceeded(&self.limits))
            }
            (Poll::Pending, Some(output)) => Ok(Polled::Waited(future, output)),
            (Poll::Pending, None) => Ok(Polled::Preempted(future)),
        }
    }

    /// Gives back `running`'s instance, keeping what makes it again (`hibernate.rs`);
    /// `running` back, and why, if it cannot be.
    #[expect(clippy::result_large_err, reason = "`running` handed back as it came, once a hibernation")]
    fn capture(&mut self, mut running: Running) -> Result<Hibernated, (Running, String)> {
        let Some(hooks) = self.loaded.hooks.as_ref() else {
            return Err((running, "the component has no hooks".into()));
        };
        if !running.store.data().holds_no_resources() {
            return Err((running, "it holds resources of the host's (WASI streams)".into()));
        }
        if running.memory == 0 {
            return Err((running, "its memory's address is unknown".into()));
        }
        // No tick may preempt a hook's call: each is a few instructions, and the next
        // step sets its own deadline.
        running.store.set_epoch_deadline(u64::MAX / 2);
        let asynchronous = running.on_fiber;
        let read = |running: &mut Running| -> anyhow::Result<(u32, Vec<u64>)> {
            let store = &mut running.store;
            let instance = &running.instance;
            let (pages,) = call::<(), (u32,)>(store, instance, &hooks.memory_size, (), asynchronous)?;
            let mut globals = Vec::with_capacity(hooks.globals.len());
            for (get, _, wide) in &hooks.globals {
                let value = match wide {
                    true => call::<(), (u64,)>(store, instance, get, (), asynchronous)?.0,
                    false => u64::from(call::<(), (u32,)>(store, instance, get, (), asynchronous)?.0),
                };
                globals.push(value);
            }
            Ok((pages, globals))
        };
        let (pages, globals) = match read(&mut running) {
            Ok(read) => read,
            Err(error) => return Err((running, format!("{error:#}"))),
        };
        let size = pages as usize * 65536;
        // SAFETY: the memory is the instance's, of `size` bytes (its own `memory.size`),
        // and no call of the store is under way.
        let Some(memory) =
            (unsafe { hibernate::Captured::take(running.memory as *const u8, size, &hooks.reference, &hooks.counts) })
        else {
            return Err((running, "its memory could not be captured".into()));
        };
        let fuel = self.limits.fuel.and_then(|_| running.store.get_fuel().ok());
        let Running { store, on_fiber, .. } = running;
        Ok(Hibernated { data: store.into_data(), memory, globals, fuel, on_fiber })
    }

    /// Makes `hibernated`'s instance again: a new instance of the component, its memory
    /// grown to the captured size and the captured pages written over it, its globals
    /// set.
    fn wake(&mut self, hibernated: Hibernated) -> anyhow::Result<Running> {
        let loaded = &self.loaded;
        let hooks =
            loaded.hooks.as_ref().ok_or_else(|| anyhow!("a hibernated process of a component without hooks"))?;
        let Hibernated { data, memory: captured, globals, fuel, on_fiber } = hibernated;
        let pid = data.pid();
        let Some(port) = data.port.clone() else { bail!("a hibernated process without a port") };
        let limits = self.limits;
        let mut store = store_with(loaded.pre.engine(), data, &limits);
        let woken = (|| -> anyhow::Result<(Instance, Guest, usize)> {
            let (instance, guest, memory) = instantiate(loaded, &mut store).map_err(anyhow::Error::from)?;
            anyhow::ensure!(memory != 0, "the new instance's memory was not made by the arena");
            let waits = loaded.waits;
            let (pages,) = call::<(), (u32,)>(&mut store, &instance, &hooks.memory_size, (), waits)?;
            let wanted = u32::try_from(captured.size / 65536)?;
            if wanted > pages {
                let (grown,) =
                    call::<(u32,), (u32,)>(&mut store, &instance, &hooks.memory_grow, (wanted - pages,), waits)?;
                anyhow::ensure!(grown == pages, "the memory could not grow back to {wanted} pages");
            }
            for ((_, set, wide), value) in hooks.globals.iter().zip(&globals) {
                match wide {
                    true => call::<(u64,), ()>(&mut store, &instance, set, (*value,), waits)?,
                    false => call::<(u32,), ()>(&mut store, &instance, set, (*value as u32,), waits)?,
                }
            }
            // SAFETY: the memory was just made for this instance, is `captured.size`
            // bytes now, and no call of the store is under way.
            unsafe { captured.restore(memory as *mut u8, rustix::param::page_size()) }.map_err(anyhow::Error::msg)?;
            Ok((instance, guest, memory))
        })();
        hooks.counts.woken();
        let (instance, guest, memory) =
            woken.map_err(|e| e.context(format!("failed to wake process {pid} from hibernation")))?;
        if let Some(fuel) = fuel {
            let _ = store.set_fuel(fuel);
        }
        watch_steps(&mut store, &limits, &loaded.config, port);
        Ok(Running { store, guest, instance, memory, on_fiber })
    }

    /// Tells the guest suspended in `wait` (`future`) to return from `step`, and waits
    /// for it to: the store is then between steps again, and its fiber's stack free. The
    /// guest has its time slice to return, with nothing to yield (see `wait` in
    /// `wit/host.wit`); past it, or with yields, it is broken.
    fn release(&mut self, future: Pin<Box<StepFuture>>) -> anyhow::Result<Running> {
        let mut polled = self.resume(future, Polling::Release)?;
        // A preempted poll is at least a tick: the slice's ticks bound the retries.
        for _ in 0..=self.limits.time_slice_ticks {
            let Polled::Preempted(future) = polled else { break };
            polled = self.resume(future, Polling::Step)?;
        }
        let limits = &self.limits;
        match polled {
            Polled::Returned((running, _, result)) => {
                let output = result.map_err(|e| step_error(e, limits, running.store.data()))?;
                let yields = match &output.yields.value {
                    Ok(yields) => yields.len(),
                    Err(len) => *len,
                };
                if matches!(output.status.0, output::StatusKind::Complete(_)) || yields > 0 {
                    bail!(
                        "the guest returned from `step` with {yields} yields{} after `wait` returned `none`; the \
                         step had ended at the `wait`, so they cannot be carried out",
                        if matches!(output.status.0, output::StatusKind::Complete(_)) {
                            " and a `complete` status"
                        } else {
                            ""
                        }
                    );
                }
                Ok(running)
            }
            // `wait` refuses to wait again once it answered `none`: the guest trapped.
            Polled::Waited(..) => bail!("the guest called `wait` again after `wait` returned `none`"),
            // Dropping the future unwinds the guest and frees its fiber.
            Polled::Preempted(_) => bail!(
                "the guest did not return from `step` within its time slice of {:?} after `wait` returned `none`",
                limits.time_slice
            ),
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
        // What another store's call left behind is not this store's stack.
        let _ = stacks::take_made();
        let instantiated = instantiate(loaded, &mut store);
        // Instantiation runs the core modules' start functions, under `init`'s limit.
        let (instance, guest, memory) = instantiated.map_err(|e| match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => guest_error(e, "init", &limits, store.data()),
            _ => match limits.instance.name_exceeded(&e) {
                Some(exceeded) => exceeded.context(format!("failed to instantiate process {pid}")),
                None => anyhow::Error::from(e).context(format!("failed to instantiate process {pid}")),
            },
        })?;
        let on_fiber = loaded.config.preemption || loaded.waits;
        refuel(&mut store, limits.fuel);
        let input: Vec<wit::Payload> = input.into_iter().map(convert::payload_to_wit).collect();
        let accepted = match loaded.waits {
            true => waiting::now(guest.call_init_async(&mut store, pid.as_u64(), method, &input))
                .unwrap_or_else(|| Err(suspended("init"))),
            false => guest.call_init(&mut store, pid.as_u64(), method, &input),
        };
        let accepted = accepted.map_err(|e| guest_error(e, "init", &limits, store.data()))?;
        // The asynchronous calls of a component that imports `wait` made the fiber stack
        // the store keeps for its steps.
        self.stack = stacks::take_made();
        accepted.map_err(InitRefused)?;
        // From here on the epoch callback watches the steps. With preemption a step past
        // its slice suspends instead of trapping; wasmtime then requires every call to be
        // async, and only steps come after `init`.
        watch_steps(&mut store, &limits, &loaded.config, port);
        self.state = State::Ready(Running { store, guest, instance, memory, on_fiber });
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        self.events.extend(events.map(input::Event::from));
        let polled = match std::mem::replace(&mut self.state, State::Empty) {
            State::Ready(running) => self.run(running)?,
            State::Suspended(future) => self.resume(future, Polling::Step)?,
            State::Waiting(future) => {
                let events = std::mem::take(&mut self.events);
                let polled = self.resume(future, Polling::Resume(events))?;
                // The events' buffer, emptied once they were lowered into the guest.
                self.events = waiting::take_spare();
                polled
            }
            State::Broken(error) => return Err(error),
            State::Hibernated(hibernated) => {
                let running = self.wake(*hibernated)?;
                self.run(running)?
            }
            State::Empty => bail!("`step` called on a Wasm process that is not initialised"),
        };
        let limits = &self.limits;
        let output = match polled {
            Polled::Preempted(future) => {
                self.state = State::Suspended(future);
                out.set_preempted();
                return Ok(());
            }
            Polled::Waited(future, output) => {
                self.state = State::Waiting(future);
                output
            }
            Polled::Returned((running, mut batch, result)) => {
                // The payloads are the guest's now (copied into its memory); free them at
                // once. Events given while the step was suspended (none from the
                // scheduler) stay, for the next step, in the buffer that keeps its
                // allocation.
                batch.clear();
                let unread = std::mem::replace(&mut self.events, batch);
                self.events.extend(unread);
                let output = result.map_err(|e| step_error(e, limits, running.store.data()))?;
                self.state = State::Ready(running);
                output
            }
        };
        if self.cpu_ticks >= limits.cpu_budget_ticks {
            return Err(cpu_budget_exceeded(limits));
        }
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
        let whole = self.loaded.hooks.is_some() && matches!(self.state, State::Ready(_) | State::Waiting(_));
        let wants = (self.stack_warm || whole) && !self.hibernation_asked;
        self.hibernation_asked |= wants;
        wants
    }

    /// A guest waiting in `wait` is first told to return from `step` (`wait` answers
    /// `none`), which ends its call and frees its fiber: a process waits that long in
    /// `wait` only while it holds its fiber, not for ever. One that breaks the contract
    /// then is ended with the error at its next step.
    ///
    /// Between steps, a process of a component with [`Hooks`] then gives back its whole
    /// instance (`hibernate.rs`), unless it holds a resource of the host's; any other
    /// process its fiber stack's pages.
    fn hibernate(&mut self) -> bool {
        self.hibernation_asked = false;
        self.state = match std::mem::replace(&mut self.state, State::Empty) {
            State::Waiting(future) => match self.release(future) {
                Ok(running) => State::Ready(running),
                Err(error) => {
                    self.state = State::Broken(error);
                    return false;
                }
            },
            state => state,
        };
        if let State::Ready(_) = self.state
            && self.loaded.hooks.is_some()
        {
            let State::Ready(running) = std::mem::replace(&mut self.state, State::Empty) else { unreachable!() };
            match self.capture(running) {
                Ok(hibernated) => {
                    self.state = State::Hibernated(Box::new(hibernated));
                    // The store's fiber stack went with it.
                    self.stack = None;
                    self.stack_warm = false;
                    return true;
                }
                Err((running, why)) => {
                    tracing::debug!(pid = running.store.data().pid().as_u64(), "not hibernated whole: {why}");
                    self.state = State::Ready(running);
                }
            }
        }
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

    /// A hibernation written out (see [`snapshot`]): the process is left hibernated,
    /// and its next step makes its instance again. `None` for a component without
    /// [`Hooks`], a process that holds a host resource or is in a step, or whose WASI
    /// context is not a durable process's. A guest waiting inside `step` is told to
    /// return from it first (see [`Process::hibernate`]).
    fn snapshot(&mut self) -> Option<Vec<u8>> {
        if self.loaded.hooks.is_none() || !self.events.is_empty() {
            return None;
        }
        // A guest waiting inside `step` is told to return from it first, as for a
        // hibernation.
        let state = match std::mem::replace(&mut self.state, State::Empty) {
            State::Waiting(future) => match self.release(future) {
                Ok(running) => State::Ready(running),
                Err(error) => {
                    self.state = State::Broken(error);
                    return None;
                }
            },
            state => state,
        };
        let hibernated = match state {
            State::Ready(running) => match self.capture(running) {
                Ok(hibernated) => {
                    // The store's fiber stack went with it.
                    self.stack = None;
                    self.stack_warm = false;
                    hibernated
                }
                Err((running, why)) => {
                    tracing::debug!(pid = running.store.data().pid().as_u64(), "no snapshot: {why}");
                    self.state = State::Ready(running);
                    return None;
                }
            },
            State::Hibernated(hibernated) => *hibernated,
            other => {
                self.state = other;
                return None;
            }
        };
        let written = snapshot::write(&self.loaded.digest, &hibernated, self.cpu_ticks);
        self.state = State::Hibernated(Box::new(hibernated));
        written
    }

    fn restore(&mut self, port: Port, state: &[u8]) -> anyhow::Result<()> {
        let loaded = &self.loaded;
        let Some(hooks) = &loaded.hooks else {
            bail!("this component cannot be captured whole, so it has no snapshot to restore");
        };
        let read = snapshot::read(state, &loaded.digest, hooks.globals.len(), &hooks.counts)?;
        self.caps = Caps {
            yields: port.max_yields_per_step(),
            bytes: port.max_payload_size(),
            output: port.max_output_per_step(),
        };
        let mut data = ProcessState::with_limits(port.pid(), loaded.log.clone(), &self.limits);
        data.port = Some(port);
        if let Some(at) = read.wasi {
            data.make_wasi_at(at);
        }
        let on_fiber = loaded.config.preemption || loaded.waits;
        let fuel = self.limits.fuel.and(read.fuel);
        self.cpu_ticks = read.cpu_ticks;
        let hibernated = Hibernated { data, memory: read.memory, globals: read.globals, fuel, on_fiber };
        self.state = State::Hibernated(Box::new(hibernated));
        Ok(())
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
            State::Waiting(_) => (None, "waiting"),
            State::Broken(_) => (None, "broken"),
            State::Hibernated(hibernated) => (Some(hibernated.data.pid()), "hibernated"),
        };
        f.debug_struct("WasmProcess")
            .field("entries", &self.loaded.entries)
            .field("limits", &self.limits)
            .field("pid", &pid)
            .field("state", &state)
            .finish()
    }
}

/// Instantiates `loaded` in `store`: the instance, its bindings, and the address of its
/// memory (0 if none was made by the arena).
fn instantiate(loaded: &Loaded, store: &mut Store<ProcessState>) -> wasmtime::Result<(Instance, Guest, usize)> {
    let pre = loaded.pre.instance_pre();
    let _ = super::memory::take_made();
    let instance = super::image::instantiating(loaded.image.as_ref(), || match loaded.waits {
        true => waiting::now(pre.instantiate_async(&mut *store)).unwrap_or_else(|| Err(suspended("instantiation"))),
        false => pre.instantiate(&mut *store),
    })?;
    let memory = super::memory::take_made().unwrap_or(0);
    let guest = loaded.indices.load_prechecked(&mut *store, &instance)?;
    Ok((instance, guest, memory))
}

/// From here on the epoch callback watches the steps. With preemption a step past its
/// slice suspends instead of trapping; wasmtime then requires every call to be async.
fn watch_steps(store: &mut Store<ProcessState>, limits: &ProcessLimits, config: &Config, port: Port) {
    let watching = Watch {
        slice: limits.time_slice_ticks,
        slice_limit: limits.time_slice,
        preemptible: config.preemption,
        cpu_budget: limits.cpu_budget.map(|budget| (limits.cpu_budget_ticks, budget)),
    };
    watch(store, watching, |state| &mut state.ticks, port, || None);
}

/// Calls the hook at `index` of `instance`, asynchronously if `asynchronous` (polled
/// once: a hook never suspends).
fn call<P, R>(
    store: &mut Store<ProcessState>,
    instance: &Instance,
    index: &ComponentExportIndex,
    params: P,
    asynchronous: bool,
) -> anyhow::Result<R>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: ComponentNamedList + Lift + Send + Sync + 'static,
{
    let func = instance.get_typed_func::<P, R>(&mut *store, index)?;
    let result = match asynchronous {
        true => {
            waiting::now(func.call_async(&mut *store, params)).unwrap_or_else(|| Err(suspended("a hibernation hook")))
        }
        false => func.call(&mut *store, params),
    };
    Ok(result?)
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

/// A Wasm process's snapshot ([`Process::snapshot`]): its hibernation
/// (`hibernate.rs`) written out, with what its store kept beside the instance.
///
/// Format: [`snapshot::MAGIC`], [`snapshot::VERSION`], the SHA-256 of the component it
/// ran, the epoch ticks its steps ran for, its fuel left (a flag, then `u64`), where its
/// WASI context was in its recorded streams (a flag, then the clock's reads `u64` and
/// each generator's word position `u128`), its globals (a count, then `u64` each), then
/// its memory as [`hibernate::Captured::encode`] writes it. Little-endian throughout.
mod snapshot {
    use std::sync::Arc;

    use super::{Hibernated, hibernate};
    use crate::wasm::store::WasiPosition;

    pub(super) const MAGIC: &[u8] = b"wasmproc wasm snapshot";
    pub(super) const VERSION: u8 = 1;

    /// What [`read`] found.
    pub(super) struct Read {
        pub(super) cpu_ticks: u64,
        pub(super) fuel: Option<u64>,
        pub(super) wasi: Option<WasiPosition>,
        pub(super) globals: Vec<u64>,
        pub(super) memory: hibernate::Captured,
    }

    /// `hibernated`'s snapshot, of the component of `digest`; `None` if its WASI
    /// context is not a durable process's.
    pub(super) fn write(digest: &[u8; 32], hibernated: &Hibernated, cpu_ticks: u64) -> Option<Vec<u8>> {
        let wasi = hibernated.data.wasi_position().ok()?;
        let mut out = Vec::with_capacity(256 + hibernated.memory.size / 64);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(digest);
        out.extend_from_slice(&cpu_ticks.to_le_bytes());
        optional(&mut out, hibernated.fuel.map(u64::to_le_bytes).as_ref().map(<[u8; 8]>::as_slice));
        match wasi {
            Some(at) => {
                out.push(1);
                out.extend_from_slice(&at.clock_reads.to_le_bytes());
                out.extend_from_slice(&at.secure.to_le_bytes());
                out.extend_from_slice(&at.insecure.to_le_bytes());
            }
            None => out.push(0),
        }
        out.extend_from_slice(&(hibernated.globals.len() as u64).to_le_bytes());
        for global in &hibernated.globals {
            out.extend_from_slice(&global.to_le_bytes());
        }
        hibernated.memory.encode(&mut out);
        Some(out)
    }

    fn optional(out: &mut Vec<u8>, value: Option<&[u8]>) {
        match value {
            Some(bytes) => {
                out.push(1);
                out.extend_from_slice(bytes);
            }
            None => out.push(0),
        }
    }

    /// Reads a snapshot written by [`write`] for the component of `digest`, whose hooks
    /// reach `globals` globals.
    ///
    /// # Errors
    ///
    /// Not a Wasm process's snapshot, of another version or component, or damaged.
    pub(super) fn read(
        bytes: &[u8],
        digest: &[u8; 32],
        globals: usize,
        counts: &Arc<hibernate::Counts>,
    ) -> anyhow::Result<Read> {
        let mut r = Cursor(bytes);
        anyhow::ensure!(r.take(MAGIC.len())? == MAGIC, "not a Wasm process's snapshot");
        let version = r.take(1)?[0];
        anyhow::ensure!(version == VERSION, "a snapshot of version {version}; this host reads version {VERSION}");
        let of = r.take(32)?;
        anyhow::ensure!(
            of == digest,
            "the snapshot is of component sha256:{}, and this process's component is sha256:{}",
            crate::codec::hex(of),
            crate::codec::hex(digest)
        );
        let cpu_ticks = r.u64()?;
        let fuel = if r.flag()? { Some(r.u64()?) } else { None };
        let wasi = if r.flag()? {
            Some(WasiPosition { clock_reads: r.u64()?, secure: r.u128()?, insecure: r.u128()? })
        } else {
            None
        };
        let count = r.u64()?;
        anyhow::ensure!(
            count == globals as u64,
            "the snapshot has {count} globals, and this component's instances have {globals}"
        );
        let values = (0..globals).map(|_| r.u64()).collect::<anyhow::Result<Vec<u64>>>()?;
        let (memory, left) = hibernate::Captured::decode(r.0, counts).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(left.is_empty(), "{} bytes after the snapshot's end", left.len());
        Ok(Read { cpu_ticks, fuel, wasi, globals: values, memory })
    }

    struct Cursor<'a>(&'a [u8]);

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
            anyhow::ensure!(self.0.len() >= n, "the snapshot is cut short");
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Ok(head)
        }

        fn u64(&mut self) -> anyhow::Result<u64> {
            Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
        }

        fn u128(&mut self) -> anyhow::Result<u128> {
            Ok(u128::from_le_bytes(self.take(16)?.try_into()?))
        }

        fn flag(&mut self) -> anyhow::Result<bool> {
            match self.take(1)?[0] {
                0 => Ok(false),
                1 => Ok(true),
                other => anyhow::bail!("a flag of {other}"),
            }
        }
    }
}
