//! Unmodified WASI programs run as processes: a component exporting `wasi:cli/run`, or a
//! preview 1 core module with a `_start` export.
//!
//! Such a program has no steps of its own: it runs from start to exit in one call. As a
//! [`Process`] it has one entry method, `run`; `init` instantiates it and the first
//! step runs it to the end, completing with its exit code. It gets the same sandbox as
//! any process (memory cap, fuel budget, WASI with nothing granted) plus what its
//! [`CommandOptions`] grant: arguments, environment variables, directories, and the
//! host's standard streams.
//!
//! A time slice cannot apply (the whole program is one call); instead the program is
//! stopped when its [`CommandOptions::time_limit`] passes or its
//! [`CommandOptions::interrupt`] flag is raised, checked at every epoch tick.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::sync::{Command as P2Command, CommandPre};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::config::Config;
use super::log::{GuestOutput, LogSink, LogSource};
use super::runtime::{fuel_for_instantiation, refuel};
use super::state::MemoryLimiter;
use crate::dispatch::Factory;
use crate::process::{Events, Payload, Pid, Process, StepOutput};

/// The one entry method of a WASI command.
pub const COMMAND_ENTRY: &str = "run";

/// A loaded WASI program, ready to run as processes (see the module docs). Cheap to
/// clone. As a [`Factory`] its processes get the default [`CommandOptions`]: nothing
/// granted, output to the log.
#[derive(Clone)]
pub struct Command {
    inner: Arc<Inner>,
}

struct Inner {
    code: Code,
    engine: Engine,
    config: Config,
}

pub(crate) enum Code {
    /// A `wasi:cli/run` component.
    Component(CommandPre<CommandState>),
    /// A preview 1 module with `_start`.
    Module(wasmtime::InstancePre<P1State>),
}

impl Command {
    pub(crate) fn new(code: Code, engine: Engine, config: Config) -> Self {
        Command { inner: Arc::new(Inner { code, engine, config }) }
    }

    /// Whether it is a preview 1 core module (else a `wasi:cli/run` component).
    pub fn is_core_module(&self) -> bool {
        matches!(self.inner.code, Code::Module(_))
    }

    /// A process of this program with `options`, not yet initialised: hand it to
    /// [`Handle::spawn`](crate::Handle::spawn) with the method [`COMMAND_ENTRY`].
    pub fn process(&self, options: CommandOptions) -> CommandProcess {
        CommandProcess { command: self.clone(), options, running: None }
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command").field("core_module", &self.is_core_module()).finish_non_exhaustive()
    }
}

impl Factory for Command {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(self.process(CommandOptions::default())))
    }
}

/// What a WASI program is granted beyond the sandbox's defaults, which are: no
/// arguments, no environment, no files, no network, stdin at end of file, stdout and
/// stderr to the host log.
#[derive(Clone, Default)]
pub struct CommandOptions {
    args: Vec<String>,
    env: Vec<(String, String)>,
    dirs: Vec<(PathBuf, String, bool)>,
    inherit_stdio: bool,
    time_limit: Option<Duration>,
    interrupt: Option<Arc<AtomicBool>>,
}

impl CommandOptions {
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

/// What a command's store holds: WASI and the memory limit.
pub(crate) struct CommandState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
}

impl WasiView for CommandState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// What a preview 1 module's store holds.
pub(crate) struct P1State {
    pub(crate) wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
}

/// A process running a WASI program: see the module docs.
pub struct CommandProcess {
    command: Command,
    options: CommandOptions,
    running: Option<Running>,
}

enum Running {
    Component(Store<CommandState>, P2Command),
    Module(Store<P1State>, wasmtime::TypedFunc<(), ()>),
}

impl CommandProcess {
    /// Limits every store shares: memory cap, fuel, and the epoch callback that enforces
    /// the time limit and the interrupt flag.
    fn limit<T: 'static>(&self, store: &mut Store<T>, limiter: fn(&mut T) -> &mut MemoryLimiter) {
        let config = &self.command.inner.config;
        store.limiter(move |state| limiter(state));
        fuel_for_instantiation(store, config.fuel);
        let deadline = self.options.time_limit.map(|limit| (Instant::now() + limit, limit));
        let interrupt = self.options.interrupt.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if interrupt.as_ref().is_some_and(|flag| flag.load(Ordering::Relaxed)) {
                return Err(wasmtime::format_err!("interrupted: the host stopped the program"));
            }
            if let Some((at, limit)) = deadline
                && Instant::now() >= at
            {
                return Err(wasmtime::format_err!("time limit exceeded: the program ran longer than {limit:?}"));
            }
            Ok(UpdateDeadline::Continue(1))
        });
    }
}

impl Process for CommandProcess {
    fn init(&mut self, pid: Pid, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        ensure!(method == COMMAND_ENTRY, "unknown entry method `{method}`; a WASI command has one: {COMMAND_ENTRY}");
        ensure!(input.is_empty(), "a WASI command takes no input payloads: pass it arguments instead");
        let inner = self.command.inner.clone();
        let mut wasi = self.options.wasi(pid, &inner.config.log)?;
        let limiter = MemoryLimiter { max_memory: inner.config.max_memory };
        let running = match &inner.code {
            Code::Component(pre) => {
                let state = CommandState { wasi: wasi.build(), table: ResourceTable::new(), limiter };
                let mut store = Store::new(&inner.engine, state);
                self.limit(&mut store, |state| &mut state.limiter);
                let command = pre.instantiate(&mut store).map_err(|e| command_error(e, &inner.config))?;
                refuel(&mut store, inner.config.fuel);
                Running::Component(store, command)
            }
            Code::Module(pre) => {
                let mut store = Store::new(&inner.engine, P1State { wasi: wasi.build_p1(), limiter });
                self.limit(&mut store, |state| &mut state.limiter);
                let instance = pre.instantiate(&mut store).map_err(|e| command_error(e, &inner.config))?;
                refuel(&mut store, inner.config.fuel);
                let start = instance
                    .get_typed_func::<(), ()>(&mut store, "_start")
                    .map_err(anyhow::Error::from)
                    .context("the module's `_start` export is not a function of no parameters")?;
                Running::Module(store, start)
            }
        };
        self.running = Some(running);
        Ok(())
    }

    fn step(&mut self, _events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let config = &self.command.inner.config;
        let result = match self.running.take() {
            None => bail!("`step` called on a WASI command that is not initialised or has already run"),
            Some(Running::Component(mut store, command)) => {
                command.wasi_cli_run().call_run(&mut store).map(|ok| if ok.is_ok() { 0 } else { 1 })
            }
            Some(Running::Module(mut store, start)) => start.call(&mut store, ()).map(|()| 0),
        };
        let code = match result {
            Ok(code) => code,
            Err(error) => match error.downcast_ref::<I32Exit>() {
                Some(I32Exit(code)) => *code,
                None => return Err(command_error(error, config)),
            },
        };
        out.complete(Ok(Payload::u64(u64::from(code as u32))));
        Ok(())
    }

    fn close(&mut self) {
        self.running = None;
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

/// The exit code a finished command's result holds (see [`CommandProcess`]).
pub fn exit_code(result: &Payload) -> Option<i32> {
    result.to_u64().and_then(|code| u32::try_from(code).ok()).map(|code| code as i32)
}
