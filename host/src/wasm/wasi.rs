//! Unmodified WASI programs run as processes: a component exporting `wasi:cli/run`, or a
//! preview 1 core module with a `_start` export.
//!
//! Such a program has no steps of its own: it runs from start to exit in one call. As a
//! [`Process`] it has one entry method, [`COMMAND_ENTRY`]; `init` instantiates it and
//! the first step runs it to the end, completing with its exit code. It gets the same
//! sandbox as any process (memory cap, fuel budget, WASI with nothing granted) plus what
//! its [`WasiOptions`] grant: arguments, environment variables, directories, and the
//! host's standard streams.
//!
//! The program's one call is preempted like any process's step (unless
//! [`Config::preemption`] is off): it runs on a fiber, and past its time slice it is
//! suspended and the process queued again, so a program that never returns shares its
//! worker instead of holding it. It is stopped with an error when its
//! [`WasiOptions::time_limit`] passes, its [`WasiOptions::interrupt`] flag is raised
//! (both checked between slices), or it has run for its [`Config::cpu_budget`].
//! Without preemption the call holds the worker to its end, and the time limit and the
//! flag are checked at every epoch tick instead.
//!
//! Instantiation runs the program's start function, if it has one, as one plain call
//! bounded by [`Config::init_time_limit`]. A start function that exits (`proc_exit`)
//! ends the program with that exit code, as it would from `_start`.
//!
//! [`Config::preemption`]: super::Config::preemption
//! [`Config::cpu_budget`]: super::Config::cpu_budget
//! [`Config::init_time_limit`]: super::Config::init_time_limit

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use wasmtime::component::{InstancePre, Linker, ResourceTable};
use wasmtime::{Engine, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::sync::{Command as P2Command, CommandIndices};
use wasmtime_wasi::p2::bindings::{Command as PreemptibleP2Command, CommandIndices as PreemptibleIndices};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use wasmproc_types::{Payload, Pid};

use super::bindings::WORLD;
use super::config::Config;
use super::engine::EpochClock;
use super::image::GuestImage;
use super::log::{GuestOutput, LogSink, LogSource};
use super::store::{InstanceLimits, MemoryLimiter, fuel_for_instantiation, refuel};
use super::watch::{Stopped, Ticks, Watch, watch};
use crate::handler::Factory;
use crate::process::Port;
use crate::process::Process;
use crate::step::{Events, Status, StepOutput};

/// The one entry method of a WASI program.
pub const COMMAND_ENTRY: &str = "run";

/// A loaded WASI program, ready to run as processes (see the module docs). Cheap to
/// clone. As a [`Factory`] its processes get the default [`WasiOptions`]: nothing
/// granted, output to the log.
#[derive(Clone)]
pub struct WasiProgram {
    inner: Arc<Inner>,
}

struct Inner {
    code: Code,
    engine: Engine,
    config: Config,
    clock: EpochClock,
}

/// A WASI program's code, linked (see [`WasiLinkers`]).
pub(crate) enum Code {
    /// A `wasi:cli/run` component, with its export found for plain and for fiber calls.
    Component(InstancePre<WasiState>, CommandIndices, PreemptibleIndices, Option<Arc<GuestImage>>),
    /// A preview 1 module with `_start`.
    Module(wasmtime::InstancePre<P1State>),
}

impl WasiProgram {
    pub(crate) fn new(code: Code, engine: Engine, config: Config, clock: EpochClock) -> Self {
        WasiProgram { inner: Arc::new(Inner { code, engine, config, clock }) }
    }

    /// Whether it is a preview 1 core module (else a `wasi:cli/run` component).
    pub fn is_core_module(&self) -> bool {
        matches!(self.inner.code, Code::Module(_))
    }

    /// A process of this program with `options`, not yet initialised: hand it to
    /// [`Handle::spawn`](crate::Handle::spawn) with the method [`COMMAND_ENTRY`].
    pub fn process(&self, options: WasiOptions) -> WasiProcess {
        WasiProcess { program: self.clone(), options, state: State::Empty, deadline: None, cpu_ticks: 0 }
    }
}

impl std::fmt::Debug for WasiProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasiProgram").field("core_module", &self.is_core_module()).finish_non_exhaustive()
    }
}

impl Factory for WasiProgram {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(self.process(WasiOptions::default())))
    }
}

/// What a WASI program is granted beyond the sandbox's defaults, which are: no
/// arguments, no environment, no files, no network, stdin at end of file, stdout and
/// stderr to the host log.
#[derive(Clone, Default)]
pub struct WasiOptions {
    args: Vec<String>,
    env: Vec<(String, String)>,
    dirs: Vec<(PathBuf, String, bool)>,
    inherit_stdio: bool,
    time_limit: Option<Duration>,
    interrupt: Option<Arc<AtomicBool>>,
}

impl WasiOptions {
    /// The defaults: nothing granted.
    pub fn new() -> Self {
        Self::default()
    }

    /// The program's arguments, the program's name first (as `argv[0]`).
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the environment variable `key` to `value` for the program.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Gives the program the host directory `host` as `guest`, read-only unless
    /// `writable`.
    pub fn dir(mut self, host: impl Into<PathBuf>, guest: impl Into<String>, writable: bool) -> Self {
        self.dirs.push((host.into(), guest.into(), writable));
        self
    }

    /// Connects the program's stdin, stdout and stderr to the host's own, instead of the
    /// log (what a command-line runner wants).
    pub fn inherit_stdio(mut self) -> Self {
        self.inherit_stdio = true;
        self
    }

    /// Stops the program with an error once it has run for `limit`.
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = Some(limit);
        self
    }

    /// Stops the program with an error soon after `flag` becomes true (within an epoch
    /// tick): how a host interrupts a program that never yields.
    pub fn interrupt(mut self, flag: Arc<AtomicBool>) -> Self {
        self.interrupt = Some(flag);
        self
    }

    fn wasi(&self, pid: Pid, log: &LogSink) -> anyhow::Result<WasiCtxBuilder> {
        let mut builder = WasiCtxBuilder::new();
        builder.args(&self.args).envs(&self.env).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        if self.inherit_stdio {
            builder.inherit_stdio();
        } else {
            builder.stdout(GuestOutput::new(pid, LogSource::Stdout, log.clone())).stderr(GuestOutput::new(
                pid,
                LogSource::Stderr,
                log.clone(),
            ));
        }
        for (host, guest, writable) in &self.dirs {
            let perms = if *writable { FsPerms::ReadWrite } else { FsPerms::ReadOnly };
            builder
                .preopened_dir(host, guest, perms)
                .map_err(anyhow::Error::from)
                .with_context(|| format!("cannot open the directory `{}` to grant it", host.display()))?;
        }
        Ok(builder)
    }
}

/// What a `wasi:cli/run` component's store holds: WASI and the memory limit.
pub(crate) struct WasiState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    /// See [`watch`].
    ticks: Ticks,
}

impl WasiView for WasiState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// What a preview 1 module's store holds.
pub(crate) struct P1State {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
    /// See [`watch`].
    ticks: Ticks,
}

/// The linkers of WASI programs: WASI p2 for components, preview 1 for core modules.
/// Made when a runtime loads its first WASI program.
pub(crate) struct WasiLinkers {
    component: Linker<WasiState>,
    module: wasmtime::Linker<P1State>,
}

impl WasiLinkers {
    pub(crate) fn new(engine: &Engine) -> anyhow::Result<Self> {
        let mut component = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut component)
            .map_err(anyhow::Error::from)
            .context("failed to link WASI")?;
        let mut module = wasmtime::Linker::new(engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut module, |state: &mut P1State| &mut state.wasi)
            .map_err(anyhow::Error::from)
            .context("failed to link WASI preview 1")?;
        Ok(WasiLinkers { component, module })
    }

    /// The code of a `wasi:cli/run` component (see [`is_command`]), linked.
    pub(crate) fn component(
        &self,
        component: &wasmtime::component::Component,
        image: Option<Arc<GuestImage>>,
    ) -> anyhow::Result<Code> {
        let pre = self
            .component
            .instantiate_pre(component)
            .map_err(anyhow::Error::from)
            .context("the WASI command needs something wasmproc does not provide")?;
        let unknown_run = "the component's `wasi:cli/run` export is not the one wasmproc knows";
        let indices = CommandIndices::new(&pre).map_err(anyhow::Error::from).context(unknown_run)?;
        let preemptible = PreemptibleIndices::new(&pre).map_err(anyhow::Error::from).context(unknown_run)?;
        Ok(Code::Component(pre, indices, preemptible, image))
    }

    /// The code of a preview 1 core module, linked, once it is known to be a command: it
    /// has a `_start` of the right type and, if it calls WASI, the memory WASI needs.
    pub(crate) fn module(&self, module: &wasmtime::Module) -> anyhow::Result<Code> {
        ensure!(
            module.get_export("_start").is_some(),
            "a core module without a `_start` export is neither a WASI command nor a process: processes are \
             components of the `{WORLD}` world (build the guest for `wasm32-wasip2`)"
        );
        if let Some(problem) = start_problem(module) {
            bail!("{problem}");
        }
        // wasmtime-wasi's preview 1 functions find their arguments in the caller's export
        // `memory`, and fail every call without one.
        let imports_wasi = module.imports().any(|import| import.module() == "wasi_snapshot_preview1");
        ensure!(
            !imports_wasi || matches!(module.get_export("memory"), Some(wasmtime::ExternType::Memory(_))),
            "the module imports WASI preview 1 functions but exports no memory named `memory`, where they \
             read and write their arguments: every call would fail (export the module's memory as `memory`)"
        );
        let pre = self
            .module
            .instantiate_pre(module)
            .map_err(anyhow::Error::from)
            .context("the WASI program needs something wasmproc does not provide")?;
        Ok(Code::Module(pre))
    }
}

/// Whether `component` is a WASI command rather than a process: it exports
/// `wasi:cli/run` and not the world's `step`.
pub(crate) fn is_command(engine: &Engine, component: &wasmtime::component::Component) -> bool {
    let ty = component.component_type();
    let names: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    names.iter().any(|name| name.starts_with("wasi:cli/run@")) && !names.contains(&"step")
}

/// Why a core module's `_start` export cannot start a WASI command, if it cannot: it must
/// be a function of no parameters and no results.
fn start_problem(module: &wasmtime::Module) -> Option<String> {
    match module.get_export("_start")? {
        wasmtime::ExternType::Func(ty) if ty.params().len() == 0 && ty.results().len() == 0 => None,
        wasmtime::ExternType::Func(ty) => Some(format!(
            "the module's `_start` export is a function of type {ty}; a WASI command's `_start` takes no \
             parameters and returns nothing"
        )),
        other => Some(format!("the module's `_start` export is not a function but {}", extern_kind(&other))),
    }
}

fn extern_kind(ty: &wasmtime::ExternType) -> &'static str {
    match ty {
        wasmtime::ExternType::Func(_) => "a function",
        wasmtime::ExternType::Global(_) => "a global",
        wasmtime::ExternType::Table(_) => "a table",
        wasmtime::ExternType::Memory(_) => "a memory",
        wasmtime::ExternType::Tag(_) => "a tag",
    }
}

/// A process running a WASI program: see the module docs.
pub struct WasiProcess {
    program: WasiProgram,
    options: WasiOptions,
    state: State,
    /// When the [`WasiOptions::time_limit`] passes, and the limit, from `init` on.
    deadline: Option<(Instant, Duration)>,
    /// Epoch ticks the program has run for, counted around each slice (as
    /// `process.rs` does for steps).
    cpu_ticks: u64,
}

enum State {
    /// Not initialised, or closed.
    Empty,
    /// Instantiated; the run has not begun.
    Ready(Running),
    /// The start function ended the program with this exit code during instantiation.
    Exited(u32),
    /// Preempted: the future owns the store until the run ends.
    Suspended(Pin<Box<RunFuture>>),
}

/// A run on a fiber, to its exit code.
type RunFuture = dyn Future<Output = wasmtime::Result<u32>> + Send;

enum Running {
    Component(Store<WasiState>, P2Command),
    PreemptibleComponent(Store<WasiState>, PreemptibleP2Command),
    Module(Store<P1State>, wasmtime::TypedFunc<(), ()>),
    PreemptibleModule(Store<P1State>, wasmtime::TypedFunc<(), ()>),
}

impl WasiProcess {
    /// The limits every store shares: memory cap and fuel.
    fn limit<T: 'static>(&self, store: &mut Store<T>, limiter: fn(&mut T) -> &mut MemoryLimiter) {
        store.limiter(move |state| limiter(state));
        fuel_for_instantiation(store, self.program.inner.config.fuel);
    }

    /// What stops the program at an epoch tick whatever it is doing, besides a terminate
    /// request (which [`watch`] looks at through the port): its interrupt flag and its
    /// time limit.
    fn stop(&self) -> impl Fn() -> Option<Stopped> + Send + Sync + 'static {
        let deadline = self.deadline;
        let interrupt = self.options.interrupt.clone();
        move || {
            if interrupt.as_ref().is_some_and(|flag| flag.load(Ordering::Relaxed)) {
                return Some(Stopped::Interrupted);
            }
            if let Some((at, limit)) = deadline
                && Instant::now() >= at
            {
                return Some(Stopped::TimeLimit(limit));
            }
            None
        }
    }

    /// Stops instantiation (the start function, a plain call) at the first epoch tick past
    /// the `init_time_limit`, when its process is asked to terminate, or when
    /// [`WasiProcess::stop`] says so.
    fn watch_instantiation<T: 'static>(&self, store: &mut Store<T>, port: &Port) {
        let started = Instant::now();
        let limit = self.program.inner.config.init_time_limit;
        let stop = self.stop();
        let port = port.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if port.is_terminating() {
                return Err(wasmtime::Error::new(Stopped::Terminated));
            }
            if let Some(stopped) = stop() {
                return Err(wasmtime::Error::new(stopped));
            }
            if started.elapsed() >= limit {
                return Err(wasmtime::format_err!(
                    "init time limit exceeded: the program's start function ran longer than the \
                     `init_time_limit` of {limit:?}"
                ));
            }
            Ok(UpdateDeadline::Continue(1))
        });
    }

    /// Watches the run at every epoch tick (see [`watch`]): with preemption it yields its
    /// fiber as a process's step does; without, it holds its worker to its end. Either
    /// way the CPU budget and [`WasiProcess::stop`] end it within a tick.
    fn watch_run<T: 'static>(&self, store: &mut Store<T>, port: &Port, ticks: fn(&mut T) -> &mut Ticks) {
        let config = &self.program.inner.config;
        let watching = Watch {
            slice: if config.preemption { config.ticks(config.time_slice) } else { u64::MAX },
            slice_limit: config.time_slice,
            preemptible: config.preemption,
            cpu_budget: config.cpu_budget.map(|budget| (config.ticks(budget), budget)),
        };
        watch(store, watching, ticks, port.clone(), self.stop());
    }

    /// Instantiates the program: its start function runs here.
    fn instantiate(&mut self, port: &Port) -> anyhow::Result<State> {
        let pid = port.pid();
        let inner = self.program.inner.clone();
        let config = &inner.config;
        let mut wasi = self.options.wasi(pid, &config.log)?;
        let limiter = MemoryLimiter::of(config);
        let running = match &inner.code {
            Code::Component(pre, indices, preemptible, image) => {
                let state =
                    WasiState { wasi: wasi.build(), table: ResourceTable::new(), limiter, ticks: Ticks::default() };
                let mut store = Store::new(&inner.engine, state);
                self.limit(&mut store, |state| &mut state.limiter);
                self.watch_instantiation(&mut store, port);
                let instance = match super::image::instantiating(image.as_ref(), || pre.instantiate(&mut store)) {
                    Ok(instance) => instance,
                    Err(error) => return instantiation_failed(error, config).map(State::Exited),
                };
                refuel(&mut store, config.fuel);
                self.watch_run(&mut store, port, |state| &mut state.ticks);
                if config.preemption {
                    let command = preemptible.load(&mut store, &instance).map_err(|e| command_error(e, config))?;
                    Running::PreemptibleComponent(store, command)
                } else {
                    let command = indices.load(&mut store, &instance).map_err(|e| command_error(e, config))?;
                    Running::Component(store, command)
                }
            }
            Code::Module(pre) => {
                let mut store =
                    Store::new(&inner.engine, P1State { wasi: wasi.build_p1(), limiter, ticks: Ticks::default() });
                self.limit(&mut store, |state| &mut state.limiter);
                self.watch_instantiation(&mut store, port);
                let instance = match pre.instantiate(&mut store) {
                    Ok(instance) => instance,
                    Err(error) => return instantiation_failed(error, config).map(State::Exited),
                };
                refuel(&mut store, config.fuel);
                // The type was checked at load (`start_problem`).
                let start = instance
                    .get_typed_func::<(), ()>(&mut store, "_start")
                    .map_err(anyhow::Error::from)
                    .context("the module's `_start` export is not a function of no parameters")?;
                self.watch_run(&mut store, port, |state| &mut state.ticks);
                if config.preemption { Running::PreemptibleModule(store, start) } else { Running::Module(store, start) }
            }
        };
        Ok(State::Ready(running))
    }

    /// Polls a run once: to its end or to the end of its time slice. `None` if it was
    /// preempted (and is kept to resume).
    fn resume(&mut self, mut future: Pin<Box<RunFuture>>) -> anyhow::Result<Option<u32>> {
        let inner = self.program.inner.clone();
        let started = inner.clock.now();
        let polled = future.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        self.cpu_ticks += inner.clock.now() - started;
        match polled {
            Poll::Ready(result) => exit_status(result, &inner.config).map(Some),
            // Returning an error drops the future, which unwinds the suspended program.
            Poll::Pending => {
                // The epoch callback stops the run at the tick these become true; the
                // checks here catch one that became true as the slice ended. (A terminate
                // request needs none: the scheduler acts on it when the step returns.)
                if let Some(stopped) = self.stop()() {
                    bail!("{stopped}");
                }
                let config = &inner.config;
                if let Some(budget) = config.cpu_budget
                    && self.cpu_ticks >= config.ticks(budget)
                {
                    bail!("{}", Stopped::CpuBudget(budget));
                }
                self.state = State::Suspended(future);
                Ok(None)
            }
        }
    }
}

/// A finished run's exit code: 0 for a normal return, what the program passed to
/// `exit`, or 1 for a `wasi:cli/run` that returned an error.
/// The outcome of an instantiation that failed with `error`: a start function that
/// exits ends the program with its code; a count limit is named (see
/// [`InstanceLimits::name_exceeded`]).
fn instantiation_failed(error: wasmtime::Error, config: &Config) -> anyhow::Result<u32> {
    match InstanceLimits::of(config).name_exceeded(&error) {
        Some(exceeded) => Err(exceeded),
        None => exit_status(Err(error), config),
    }
}

fn exit_status(result: wasmtime::Result<u32>, config: &Config) -> anyhow::Result<u32> {
    match result {
        Ok(code) => Ok(code),
        Err(error) => match error.downcast_ref::<I32Exit>() {
            Some(I32Exit(code)) => Ok(*code as u32),
            None => Err(command_error(error, config)),
        },
    }
}

impl Process for WasiProcess {
    fn init(&mut self, port: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        ensure!(method == COMMAND_ENTRY, "unknown entry method `{method}`; a WASI command has one: {COMMAND_ENTRY}");
        ensure!(input.is_empty(), "a WASI command takes no input payloads: pass it arguments instead");
        // A limit past what `Instant` holds is no limit.
        self.deadline = self.options.time_limit.and_then(|limit| Some((Instant::now().checked_add(limit)?, limit)));
        self.state = self.instantiate(&port)?;
        Ok(())
    }

    fn step(&mut self, _events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let config = &self.program.inner.config;
        let code = match std::mem::replace(&mut self.state, State::Empty) {
            State::Empty => bail!("`step` called on a WASI command that is not initialised or has already run"),
            State::Exited(code) => Some(code),
            State::Ready(Running::Component(mut store, command)) => {
                Some(exit_status(command.wasi_cli_run().call_run(&mut store).map(|ok| u32::from(ok.is_err())), config)?)
            }
            State::Ready(Running::Module(mut store, start)) => {
                Some(exit_status(start.call(&mut store, ()).map(|()| 0), config)?)
            }
            // The futures own the store and the instance, so that a preempted run can
            // outlive this turn.
            State::Ready(Running::PreemptibleComponent(mut store, command)) => self.resume(Box::pin(async move {
                command.wasi_cli_run().call_run(&mut store).await.map(|ok| u32::from(ok.is_err()))
            }))?,
            State::Ready(Running::PreemptibleModule(mut store, start)) => {
                self.resume(Box::pin(async move { start.call_async(&mut store, ()).await.map(|()| 0) }))?
            }
            State::Suspended(future) => self.resume(future)?,
        };
        match code {
            Some(code) => out.complete(Ok(Payload::u64(u64::from(code)))),
            None => out.set_status(Status::Continue),
        }
        Ok(())
    }

    fn close(&mut self) {
        // A suspended run's future, dropped here, unwinds the program's fiber first.
        self.state = State::Empty;
    }
}

/// A failed instantiation or run, in one line: the fuel limit by name, else the root
/// cause (a trap, the memory limiter's message, or the epoch callback's).
fn command_error(error: wasmtime::Error, config: &Config) -> anyhow::Error {
    if let Some(Trap::OutOfFuel) = error.downcast_ref::<Trap>() {
        return anyhow!(
            "fuel budget exhausted: the program used all of its {} units of `fuel`",
            config.fuel.unwrap_or_default()
        );
    }
    anyhow!("{}", error.root_cause())
}

/// The exit code a finished WASI program's result holds (see [`WasiProcess`]).
pub fn exit_code(result: &Payload) -> Option<i32> {
    result.to_u64().and_then(|code| u32::try_from(code).ok()).map(|code| code as i32)
}
