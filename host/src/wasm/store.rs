//! A process's store: what it holds ([`ProcessState`]: its WASI context, granting
//! nothing, and what its host imports need), the limits it runs under
//! ([`ProcessLimits`], [`MemoryLimiter`]), how it is made ([`new_store`]) and fuelled.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{Engine, ResourceLimiter, Store, format_err};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use wasmproc_types::{Payload, Pid};

use super::bindings::handler::wasmproc::process::provider;
use super::bindings::wasmproc::process::{host, types};
use super::config::Config;
use super::convert;
use super::log::{GuestOutput, Level, LogRecord, LogSink, LogSource};
use super::output::{self, Bytes, Capped};
use super::watch::Ticks;
use crate::error::PortError;
use crate::process::Port;
use crate::step::Outcome;

/// Per-process limits; see [`Config::max_memory`], [`Config::time_slice`],
/// [`Config::fuel`], [`Config::cpu_budget`] and [`InstanceLimits`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcessLimits {
    pub(crate) max_memory: usize,
    pub(crate) instance: InstanceLimits,
    pub(crate) time_slice: Duration,
    pub(crate) time_slice_ticks: u64,
    /// The whole life's fuel budget; `None` when the engine does not meter fuel.
    pub(crate) fuel: Option<u64>,
    pub(crate) cpu_budget: Option<Duration>,
    pub(crate) cpu_budget_ticks: u64,
    pub(crate) init_time_limit: Duration,
    pub(crate) init_ticks: u64,
}

impl ProcessLimits {
    /// The limits of `config`, with this memory cap and time slice.
    pub(crate) fn new(config: &Config, max_memory: usize, time_slice: Duration) -> Self {
        ProcessLimits {
            max_memory,
            instance: InstanceLimits::of(config),
            time_slice,
            time_slice_ticks: config.ticks(time_slice),
            fuel: config.fuel,
            cpu_budget: config.cpu_budget,
            cpu_budget_ticks: config.cpu_budget.map_or(u64::MAX, |budget| config.ticks(budget)),
            init_time_limit: config.init_time_limit,
            init_ticks: config.ticks(config.init_time_limit),
        }
    }
}

/// A store for process `pid`, with its limits in force.
pub(crate) fn new_store(engine: &Engine, pid: Pid, log: LogSink, limits: &ProcessLimits) -> Store<ProcessState> {
    store_with(engine, ProcessState::with_limits(pid, log, limits), limits)
}

/// A store holding `state` (a new one's, or one a hibernated process kept), with
/// `limits` in force, as [`new_store`] makes it.
pub(crate) fn store_with(engine: &Engine, state: ProcessState, limits: &ProcessLimits) -> Store<ProcessState> {
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_trap();
    store.set_epoch_deadline(limits.init_ticks);
    fuel_for_instantiation(&mut store, limits.fuel);
    store
}

/// Lets `store` instantiate whatever its fuel `budget`. Instantiation copies the guest's
/// data segments into its memory with metered code (there are no copy-on-write images
/// with the memory arena; see `engine.rs`), at one unit of fuel a byte, and a budget is
/// for what the guest runs from `init` on, not for the size of its data; the time slice
/// still bounds instantiation. [`refuel`] sets the budget once the instance is made.
pub(crate) fn fuel_for_instantiation<T>(store: &mut Store<T>, budget: Option<u64>) {
    if budget.is_some() {
        // Only fails when the engine does not meter fuel, and a budget is set exactly
        // when it does (both come from `Config::fuel`).
        let _ = store.set_fuel(u64::MAX);
    }
}

/// Gives `store` its whole fuel `budget`, if it has one; see [`fuel_for_instantiation`].
pub(crate) fn refuel<T>(store: &mut Store<T>, budget: Option<u64>) {
    if let Some(budget) = budget {
        // As in `fuel_for_instantiation`.
        let _ = store.set_fuel(budget);
    }
}

/// The data of one process's `Store`.
pub(crate) struct ProcessState {
    pid: Pid,
    log: LogSink,
    /// Made on the guest's first WASI call: most processes make none, and building one
    /// seeds two random generators and boxes a dozen parts (about a microsecond and
    /// 1 KiB of heap a process, for nothing, on the lifecycle benchmark).
    wasi: Option<Box<WasiCtx>>,
    /// The stderr of `wasi`, made with it: where a Rust guest reports a panic.
    stderr: Option<GuestOutput>,
    /// Where a durable process's `wasi` is in its recorded clock and random streams,
    /// made with it: what its snapshot records, and sets again in a new context.
    positions: Option<WasiPositions>,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    /// Epoch ticks its steps have seen (see `watch.rs`).
    pub(crate) ticks: Ticks,
    /// The process's port, from `init` on: its `send` host function goes through it.
    /// `None` only in the store the runtime makes to ask a component for its `entries`.
    pub(crate) port: Option<Port>,
}

impl ProcessState {
    /// The state of process `pid` under `limits`, as [`new_store`] makes it.
    pub(crate) fn with_limits(pid: Pid, log: LogSink, limits: &ProcessLimits) -> Self {
        ProcessState::new(pid, log, MemoryLimiter { max_memory: limits.max_memory, instance: limits.instance })
    }

    /// The state of process `pid`, with WASI granting nothing: no preopened directories,
    /// no environment, no arguments, no network, and stdin at end of file. Clocks and
    /// randomness stay (Rust's std seeds its hash maps from them); stdout and stderr go
    /// to the log, line by line.
    pub(crate) fn new(pid: Pid, log: LogSink, limiter: MemoryLimiter) -> Self {
        ProcessState {
            pid,
            log,
            wasi: None,
            stderr: None,
            positions: None,
            table: ResourceTable::new(),
            limiter,
            ticks: Ticks::default(),
            port: None,
        }
    }
}

/// The WASI context of process `pid` (see [`ProcessState::new`]). A durable process
/// (its port has a recorded seed) reads its step's recorded time from the clocks and
/// numbers drawn from its recorded seed from the random interfaces, so a replay of its
/// steps reads what they read.
fn new_wasi(
    pid: Pid,
    log: &LogSink,
    port: Option<&Port>,
    stderr: GuestOutput,
    at: WasiPosition,
) -> (WasiCtx, Option<WasiPositions>) {
    let mut builder = WasiCtxBuilder::new();
    builder
        .stdout(GuestOutput::new(pid, LogSource::Stdout, log.clone()))
        .stderr(stderr)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    let mut positions = None;
    if let Some(port) = port
        && let Some(seed) = port.random_seed()
    {
        let mut insecure_seed = seed;
        insecure_seed[0] ^= 0xff;
        let made = WasiPositions {
            reads: Arc::new(AtomicU64::new(at.clock_reads)),
            secure: SharedRng::new(seed, at.secure),
            insecure: SharedRng::new(insecure_seed, at.insecure),
        };
        builder
            .wall_clock(StepClock { port: port.clone(), reads: made.reads.clone() })
            .monotonic_clock(StepClock { port: port.clone(), reads: made.reads.clone() })
            .secure_random(made.secure.clone())
            .insecure_random(made.insecure.clone())
            .insecure_random_seed(u128::from_le_bytes(seed[..16].try_into().expect("16 bytes")));
        positions = Some(made);
    }
    (builder.build(), positions)
}

/// Where a durable process's WASI context is in its recorded streams: the clock's reads
/// so far, and each random generator's position (in 32-bit words).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WasiPosition {
    pub(crate) clock_reads: u64,
    pub(crate) secure: u128,
    pub(crate) insecure: u128,
}

/// The handles on a durable WASI context's streams that [`WasiPosition`] reads.
struct WasiPositions {
    reads: Arc<AtomicU64>,
    secure: SharedRng,
    insecure: SharedRng,
}

/// A durable process's random generator, shared between its WASI context and its
/// store's data so that a snapshot can read its position: `rand`'s `StdRng` is this
/// same ChaCha12 generator from the same seed, so its numbers are the ones the journal's
/// earlier runs read.
#[derive(Clone)]
struct SharedRng(Arc<parking_lot::Mutex<chacha20::ChaCha12Rng>>);

impl SharedRng {
    fn new(seed: [u8; 32], position: u128) -> Self {
        use rand::SeedableRng as _;
        let mut rng = chacha20::ChaCha12Rng::from_seed(seed);
        rng.set_word_pos(position);
        SharedRng(Arc::new(parking_lot::Mutex::new(rng)))
    }

    fn position(&self) -> u128 {
        self.0.lock().get_word_pos()
    }
}

impl rand::TryRng for SharedRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        self.0.lock().try_next_u32()
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0.lock().try_next_u64()
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.lock().try_fill_bytes(dst)
    }
}

/// A durable process's clock: its step's recorded time, plus a nanosecond for each read
/// before in the same process, so that reads within a step still advance (a replayed
/// step makes the same reads, in the same order).
struct StepClock {
    port: Port,
    /// Shared by the wall clock and the monotonic one, as one stream of reads.
    reads: Arc<AtomicU64>,
}

impl StepClock {
    fn nanos(&self) -> u64 {
        let step = self.port.step_time().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
        let reads = self.reads.fetch_add(1, Ordering::Relaxed);
        (step.as_nanos() as u64).saturating_add(reads)
    }
}

impl wasmtime_wasi::HostWallClock for StepClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }
}

impl wasmtime_wasi::HostMonotonicClock for StepClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        self.nanos()
    }
}

impl ProcessState {
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Logs a line about this process on the host's behalf.
    pub(crate) fn log_host(&self, level: Level, message: &str) {
        (self.log)(&LogRecord::now(self.pid, LogSource::Log(level), message));
    }

    /// Whether the guest holds no resource of the host's (a WASI stream, say): an
    /// instance made again would not have its handles.
    pub(crate) fn holds_no_resources(&self) -> bool {
        self.table.is_empty()
    }

    /// Where its WASI context is in its recorded streams: `Ok(None)` if it has made none
    /// yet.
    ///
    /// # Errors
    ///
    /// Its context is not a durable process's (its streams are not recorded).
    pub(crate) fn wasi_position(&self) -> Result<Option<WasiPosition>, &'static str> {
        match (&self.wasi, &self.positions) {
            (None, _) => Ok(None),
            (Some(_), None) => Err("its WASI context is not a durable process's"),
            (Some(_), Some(made)) => Ok(Some(WasiPosition {
                clock_reads: made.reads.load(Ordering::Relaxed),
                secure: made.secure.position(),
                insecure: made.insecure.position(),
            })),
        }
    }

    /// Makes its WASI context now, at `at` in its recorded streams (from
    /// [`ProcessState::wasi_position`]), as it was when that was read.
    pub(crate) fn make_wasi_at(&mut self, at: WasiPosition) {
        let stderr = GuestOutput::new(self.pid, LogSource::Stderr, self.log.clone());
        self.stderr = Some(stderr.clone());
        let (wasi, positions) = new_wasi(self.pid, &self.log, self.port.as_ref(), stderr, at);
        self.wasi = Some(Box::new(wasi));
        self.positions = positions;
    }

    /// The panic the guest last reported on its stderr (see `GuestOutput::panic`).
    pub(crate) fn panic(&self) -> Option<String> {
        self.stderr.as_ref()?.panic()
    }
}

impl WasiView for ProcessState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        if self.wasi.is_none() {
            self.make_wasi_at(WasiPosition::default());
        }
        let wasi = self.wasi.as_mut().expect("made above");
        WasiCtxView { ctx: wasi, table: &mut self.table }
    }
}

impl host::Host for ProcessState {
    fn log(&mut self, level: host::Level, message: String) {
        self.log_host(convert::level_from_wit(level), &message);
    }

    /// The generated `send`, which lifts the whole message first; processes are linked
    /// to [`ProcessState::send_capped`] instead (`component::linker`), which shadows it.
    fn send(&mut self, to: types::Pid, topic: String, body: types::Payload) -> wasmtime::Result<Result<(), String>> {
        self.send_message(to, topic, convert::payload_from_wit(body))
    }

    fn parent(&mut self) -> Option<types::Pid> {
        let parent = self.port.as_ref()?.parent();
        (parent != Pid::HOST).then(|| parent.as_u64())
    }

    /// Saturated: a limit past `u32::MAX` commands is no limit a step can reach.
    fn max_yields(&mut self) -> u32 {
        let limit = self.port.as_ref().map_or(0, Port::max_yields_per_step);
        u32::try_from(limit).unwrap_or(u32::MAX)
    }

    /// The generated `wait`, which could only block the thread; processes are linked to
    /// the asynchronous one of `waiting.rs` instead (`component::linker`), which shadows
    /// it, so this one is never called.
    fn wait(&mut self, _: types::StepOutput) -> wasmtime::Result<Option<Vec<types::Event>>> {
        Err(wasmtime::format_err!("`wait` is linked asynchronously, not through the generated bindings"))
    }
}

impl ProcessState {
    /// The `send` host function, its topic and body lifted within the step's payload
    /// limit (`output::Capped`): a message over it ends the process without being copied
    /// out of the guest, and a known format is lifted without allocating.
    pub(crate) fn send_capped(
        &mut self,
        to: types::Pid,
        topic: Capped<String, Bytes>,
        body: output::Payload,
    ) -> wasmtime::Result<Result<(), String>> {
        let (topic, body) =
            convert::message_from_output(topic, body, output::lifting_caps()).map_err(wasmtime::Error::msg)?;
        self.send_message(to, topic, body)
    }

    /// Sends through the process's port. A payload past the limit ends the process (the
    /// trap), as for a yield; any other refusal is the guest's to handle.
    fn send_message(&mut self, to: types::Pid, topic: String, body: Payload) -> wasmtime::Result<Result<(), String>> {
        let Some(port) = &self.port else {
            // Only the runtime's own call to `entries`, at load, runs without a port.
            return Ok(Err(PortError::NotInStep.to_string()));
        };
        match port.send(Pid::from_u64(to), topic, body) {
            Ok(()) => Ok(Ok(())),
            Err(PortError::TooLarge(limit)) => Err(wasmtime::Error::msg(limit)),
            Err(refused) => Ok(Err(refused.to_string())),
        }
    }
}

impl types::Host for ProcessState {}

impl provider::Host for ProcessState {
    /// The generated `respond`, which lifts the whole answer first; provider components
    /// are linked to [`ProcessState::respond_capped`] instead (`component::linker`).
    fn respond(&mut self, id: u64, result: Result<types::Payload, String>) -> Result<(), String> {
        self.respond_with(id, result.map(convert::payload_from_wit))
    }
}

impl ProcessState {
    /// The `respond` host function, its answer lifted within the step's payload limit
    /// (`output::Capped`): an answer over it is refused, as it always was, but without
    /// being copied out of the provider first.
    pub(crate) fn respond_capped(
        &mut self,
        id: u64,
        result: Result<output::Payload, Capped<String, Bytes>>,
    ) -> Result<(), String> {
        let result = convert::response_from_output(result, output::lifting_caps())?;
        self.respond_with(id, result)
    }

    /// Answers request `id` through the process's port; any refusal is the provider's to
    /// handle.
    fn respond_with(&mut self, id: u64, result: Outcome) -> Result<(), String> {
        let Some(port) = &self.port else {
            return Err(PortError::NotInStep.to_string());
        };
        port.respond(id, result).map_err(|refused| refused.to_string())
    }
}

/// What instantiating one process may create, besides memory bytes: the settings
/// [`Config::max_core_instances`], [`Config::max_tables`], [`Config::max_table_elements`]
/// and [`Config::max_memories`]. With on-demand allocation nothing else bounds them (see
/// `engine.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct InstanceLimits {
    pub(crate) core_instances: usize,
    pub(crate) tables: usize,
    pub(crate) table_elements: usize,
    pub(crate) memories: usize,
}

impl InstanceLimits {
    pub(crate) fn of(config: &Config) -> Self {
        InstanceLimits {
            core_instances: config.max_core_instances as usize,
            tables: config.max_tables as usize,
            table_elements: config.max_table_elements as usize,
            memories: config.max_memories as usize,
        }
    }

    /// An error naming the setting (and the `wasmproc run` flag) that `error`, from an
    /// instantiation, ran into, if it is one of the counts: wasmtime checks them itself,
    /// before creating each core instance, and says only "resource limit exceeded:
    /// instance count too high at 9". `None` for any other error.
    ///
    /// The phrases matched are wasmtime's (`bump_resource_counts` in its `store.rs`);
    /// the tests of each limit fail if they change.
    pub(crate) fn name_exceeded(&self, error: &wasmtime::Error) -> Option<anyhow::Error> {
        let cause = error.root_cause().to_string();
        let rest = cause.strip_prefix("resource limit exceeded: ")?;
        let (setting, flag, what, limit) = if rest.starts_with("instance count too high") {
            ("max_core_instances", "--max-core-instances", "core instances", self.core_instances)
        } else if rest.starts_with("table count too high") {
            ("max_tables", "--max-tables", "tables", self.tables)
        } else if rest.starts_with("memory count too high") {
            ("max_memories", "--max-memories", "linear memories", self.memories)
        } else {
            return None;
        };
        Some(anyhow::anyhow!(
            "resource limit exceeded: the component needs more than the {limit} {what} a process may have, \
             its `{setting}` ({rest}); raise it with `{flag}`"
        ))
    }
}

/// Caps a process's linear memory. Growth past the cap traps with an error that names the
/// limit, instead of `memory.grow` returning -1 and the guest's allocator aborting with a
/// message that does not say why.
///
/// It also bounds what else a store may create (core instances, tables and their
/// elements, memories): with on-demand allocation nothing else does (see `engine.rs`).
pub(crate) struct MemoryLimiter {
    pub(crate) max_memory: usize,
    pub(crate) instance: InstanceLimits,
}

impl MemoryLimiter {
    /// The limiter of `config`'s processes.
    pub(crate) fn of(config: &Config) -> Self {
        MemoryLimiter { max_memory: config.max_memory, instance: InstanceLimits::of(config) }
    }
}

/// The trap of a memory growth past `max_memory`: found again by downcasting, to tell a
/// memory-limit trap from the others.
#[derive(Debug)]
pub(crate) struct MemoryExceeded(pub(crate) String);

impl std::fmt::Display for MemoryExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MemoryExceeded {}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max_memory {
            return Err(wasmtime::Error::new(MemoryExceeded(format!(
                "memory limit exceeded: the process asked to grow its memory from {current} to {desired} bytes, \
                 past its `max_memory` of {} bytes",
                self.max_memory
            ))));
        }
        Ok(true)
    }

    /// Called also for each table an instantiation creates (with `current` 0), so a
    /// table whose initial size is past the bound fails instantiation with this error;
    /// growth past it traps, as memory growth past its cap does.
    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let limit = self.instance.table_elements;
        if desired > limit {
            return Err(format_err!(
                "table limit exceeded: the process asked for a table of {desired} elements (from {current}), \
                 past its `max_table_elements` of {limit}; raise it with `--max-table-elements`"
            ));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instance.core_instances
    }

    fn tables(&self) -> usize {
        self.instance.tables
    }

    fn memories(&self) -> usize {
        self.instance.memories
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::{Engine, Instance, Module, Store};

    use super::*;

    /// A durable process's generator draws what `StdRng` from the same seed draws (the
    /// numbers its journal's earlier runs read), and one set to a position read from
    /// another goes on as that one does.
    #[test]
    fn a_shared_generator_is_std_rng_and_resumes_at_its_position() {
        use rand::{Rng as _, SeedableRng as _};
        let seed = [7; 32];
        let mut std = rand::rngs::StdRng::from_seed(seed);
        let mut shared = SharedRng::new(seed, 0);
        let mut ours = [0u8; 13];
        let mut theirs = [0u8; 13];
        shared.fill_bytes(&mut ours);
        std.fill_bytes(&mut theirs);
        assert_eq!(ours, theirs);
        assert_eq!(shared.next_u64(), std.next_u64());
        assert_eq!(shared.next_u32(), std.next_u32());
        let mut resumed = SharedRng::new(seed, shared.position());
        for _ in 0..100 {
            assert_eq!(resumed.next_u64(), shared.next_u64());
        }
    }

    /// Instantiates the modules `wats` in one store limited by `config`'s counts, and
    /// names the limit the first failure ran into.
    fn instantiate(config: &Config, wats: &[&str]) -> Result<(), String> {
        let engine = Engine::default();
        let mut store = Store::new(&engine, MemoryLimiter::of(config));
        store.limiter(|limiter| limiter);
        for wat in wats {
            let module = Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
            if let Err(error) = Instance::new(&mut store, &module, &[]) {
                let limits = InstanceLimits::of(config);
                return Err(limits
                    .name_exceeded(&error)
                    .map_or_else(|| format!("unnamed: {error:#}"), |e| e.to_string()));
            }
        }
        Ok(())
    }

    /// wasmtime's own count errors are recognised and named with the setting and flag;
    /// the phrases are wasmtime's, so this fails first if an upgrade rewords them.
    #[test]
    fn each_count_wasmtime_refuses_is_named() {
        let one = "(module)";
        let error = instantiate(&Config::default().max_core_instances(2), &[one, one, one]).unwrap_err();
        assert_eq!(
            error,
            "resource limit exceeded: the component needs more than the 2 core instances a process may have, its \
             `max_core_instances` (instance count too high at 3); raise it with `--max-core-instances`"
        );
        instantiate(&Config::default().max_core_instances(3), &[one, one, one]).unwrap();

        let tables = "(module (table 1 funcref) (table 1 funcref))";
        let error = instantiate(&Config::default().max_tables(1), &[tables]).unwrap_err();
        assert!(
            error.contains("its `max_tables` (table count too high at 2); raise it with `--max-tables`"),
            "{error}"
        );
        instantiate(&Config::default().max_tables(2), &[tables]).unwrap();

        let memories = "(module (memory 1) (memory 1))";
        let error = instantiate(&Config::default(), &[memories]).unwrap_err();
        assert!(error.contains("its `max_memories` (memory count too high at 2)"), "{error}");
        instantiate(&Config::default().max_memories(2), &[memories]).unwrap();
    }

    #[test]
    fn other_errors_are_left_alone() {
        let error = wasmtime::format_err!("resource limit exceeded: something else");
        assert!(InstanceLimits::of(&Config::default()).name_exceeded(&error).is_none());
        let error = wasmtime::format_err!("instance count too high at 9");
        assert!(InstanceLimits::of(&Config::default()).name_exceeded(&error).is_none());
    }
}
