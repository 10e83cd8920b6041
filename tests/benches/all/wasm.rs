//! Wasm processes: what the host costs on top of wasmtime, and what its sandbox costs.
//!
//! The guest is `examples-wasm/bench`, written without the SDK, so a step's cost is
//! mostly the host's and wasmtime's: its own code was under a third of a step's time in
//! perf profiles of the `cycles` workload.
//!
//! The baseline is raw wasmtime as it is used for many instances: its pooling allocator
//! with copy-on-write memory images and a 64 KiB guard (the host's engine before the
//! memory arena of `host/src/wasm/memory.rs`; the other settings are the host's: memory
//! cap, stack, epochs), the same compiled guest and the same WASI setup (nothing granted,
//! stdout and stderr captured), driven by plain loops instead of a scheduler:
//!
//! - `lifecycle`: spawn → init → step → complete → close of `echo`. wasmproc: native
//!   driver processes (one per worker) keep 512 children in flight through `spawn`
//!   commands with `monitor`, and spawn another on each exit. Raw: one thread per worker
//!   looping `Store::new`, `instantiate` (from an `InstancePre`), `init`, `step`, drop.
//!   Measured at 1 to `WORKERS` workers (threads on the raw side).
//! - `cycles`: processes that each step yields one custom command, completed at once by
//!   its handler. Raw: one thread per worker calling each instance's `step` in a loop with
//!   the completion event the host would deliver. Also 1 to `WORKERS` workers.
//! - `ping-pong`: two processes pass a counter with the `send` host function (one step a
//!   message). Raw: one thread steps the two instances, each message in a step of its
//!   own, as in the scheduler.
//! - `ping-pong-wait`, `cycles-wait`: the same two workloads with each step ended in the
//!   host's `wait` (`examples-wasm/waiter`): one call of `step` a process, a message or
//!   a cycle each a suspension and resumption of its fiber. Against the same raw
//!   baseline, a call of `step` a message or cycle: the goal is half its time.
//! - `tree`: a tree of `tree` processes, 10 children a node, 10,000 leaves (11,111
//!   processes), each node spawning its children with `monitor` and summing their exits.
//!   Raw: the same nodes instantiated, initialised and stepped depth first, the root's
//!   subtrees shared among the threads; a parent gets all its children's spawn
//!   completions and exits in one step (the cheapest order for wasmtime).
//! - `sandbox/…`: wasmproc against wasmproc. `preemption`: steps on fibers (the default)
//!   against plain calls (`Config::preemption(false)`). `limits`: the scheduler's limits at
//!   their defaults plus a CPU budget, against every limit at its maximum and no budget.
//!   `fuel`: fuel metering compiled in (`Config::fuel`, a budget never reached) against
//!   none. The ratio is what the sandbox costs: above 1, the sandboxed side is slower.
//!
//! What-if knobs for the raw side only: `RAW_KEEP_RESIDENT=bytes` (default 256 KiB, the
//! host's; 0 for the pool's default) and `RAW_COW=0` (see `RawWasm::new`).

use std::collections::VecDeque;
use std::thread;
use std::time::{Duration, Instant};

use wasmproc::handler::Request;
use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Capabilities, Command, Event, Events, Payload, Port, Process, Scheduler, SpawnRequest};
use wasmproc::{Status, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample, measure_pair};
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::plot::Plots;
use crate::{WARMUP, short};
use wasmproc::scheduler::{SpawnOptions, Spawnable};

mod raw {
    wasmtime::component::bindgen!({ world: "process", path: "../wit", additional_derives: [PartialEq] });
}
pub(crate) use raw::wasmproc::process::types as wit;

pub(crate) const GUEST: &str = env!("GUEST_BENCH");
/// `bench`'s `ping-pong` and `cycles`, each step ended in `wait`.
const WAITER: &str = env!("GUEST_WAITER");

/// The raw engine's pool: `Config::max_instances`'s default.
pub(crate) const POOL_SLOTS: u32 = 10_000;
/// The host runtimes' memory slots: room for the whole `tree` alive at once (its leaves
/// may all be spawned before the first has run), so that no spawn fails for want of one.
const HOST_SLOTS: u32 = 16_384;
/// Children in flight across the lifecycle drivers: enough that no worker waits for an
/// exit to have something to run, small against the pools.
const IN_FLIGHT: u64 = 512;
/// The host runtimes' `init_time_limit`. The default 100 ms is wall-clock time, and
/// on a machine that another build keeps busy a worker descheduled in the middle of an
/// instantiation passed it (the spawn failed with `wasm trap: interrupt`); the limit's
/// length costs nothing a spawn.
pub(crate) const INIT_TIME_LIMIT: Duration = Duration::from_secs(10);
/// The children a `tree` node spawns.
const TREE_WIDTH: u64 = 10;
/// A fuel budget no workload here reaches: metering is what is measured, not running out.
const FUEL: u64 = 1 << 40;

/// The workloads' sizes; quick mode divides them by 10.
#[derive(Clone, Copy)]
struct Sizes {
    /// About a second at the goal's 200k/s.
    lifecycles: u64,
    /// Processes and cycles each: 1M steps, half a second at the goal's 2M/s.
    cycle_processes: u64,
    cycles_each: u64,
    ping_pong_messages: u64,
    tree_leaves: u64,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        let scale = if quick { 10 } else { 1 };
        Sizes {
            lifecycles: 200_000 / scale,
            cycle_processes: 1_000 / scale,
            cycles_each: 1_000,
            ping_pong_messages: 1_000_000 / scale,
            tree_leaves: 10_000 / scale,
        }
    }

    /// Processes in the tree: every level has `TREE_WIDTH` times fewer.
    fn tree_processes(&self) -> u64 {
        let (mut total, mut level) = (0, self.tree_leaves);
        while level > 1 {
            total += level;
            level = level.div_ceil(TREE_WIDTH);
        }
        total + 1
    }
}

/// A scheduler with the bench guest as kind `bench` and the `now` command of `cycles`.
fn scheduler(bytes: &[u8], workers: usize, config: Config, limits: Limits) -> Scheduler {
    let config = config.max_instances(HOST_SLOTS).init_time_limit(INIT_TIME_LIMIT).no_disk_cache();
    let runtime = Runtime::new(config).expect("the runtime starts");
    let component = runtime.load_bytes(bytes).expect("the bench guest loads");
    let builder = Scheduler::builder()
        .workers(workers)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("bench", component);
    match limits {
        Limits::Default => builder,
        Limits::Off => builder
            .max_yields_per_step(usize::MAX)
            .max_payload_size(usize::MAX)
            .max_children(usize::MAX)
            .max_descendants(usize::MAX),
    }
    .build()
    .expect("the scheduler starts")
}

/// The scheduler's per-process limits (`Builder::max_yields_per_step` and the rest).
#[derive(Clone, Copy)]
enum Limits {
    Default,
    /// Every limit at its maximum: the checks still run, but nothing they count is kept
    /// near a bound.
    Off,
}

/// Measures the selected workloads into `report`, and the rates by worker count into
/// `plots`.
pub fn run(options: &Options, report: &mut Report, plots: &mut Plots) {
    let sizes = Sizes::new(options.quick);
    let workers = options.workers;
    let lifecycle = |w: usize| format!("wasm/lifecycle-{}-w{w}", short(sizes.lifecycles));
    let cycles = |w: usize| format!("wasm/cycles-{}x{}-w{w}", short(sizes.cycle_processes), short(sizes.cycles_each));
    let ping_pong = format!("wasm/ping-pong-{}", short(sizes.ping_pong_messages));
    let ping_pong_wait = format!("wasm/ping-pong-wait-{}", short(sizes.ping_pong_messages));
    let cycles_wait =
        format!("wasm/cycles-wait-{}x{}-w{workers}", short(sizes.cycle_processes), short(sizes.cycles_each));
    let tree = format!("wasm/tree-{}", short(sizes.tree_leaves));
    let sandbox = |what: &str| format!("sandbox/{what}");
    let bytes = std::fs::read(GUEST).unwrap_or_else(|e| panic!("failed to read `{GUEST}`: {e}"));
    let waiter = std::fs::read(WAITER).unwrap_or_else(|e| panic!("failed to read `{WAITER}`: {e}"));
    let raw = RawWasm::new(&bytes, POOL_SLOTS, true);
    let pair = |ours: &dyn Fn() -> Duration, theirs: &dyn Fn() -> Duration| {
        measure_pair(options.runs, WARMUP, &mut || ours(), &mut || theirs())
    };

    // Lifecycles and steps at each worker count, for the plots; the goals are those of
    // the CI machine class's 2 workers.
    for w in 1..=workers {
        let (lifecycle, cycles) = (lifecycle(w), cycles(w));
        if !options.selected(&lifecycle) && !options.selected(&cycles) {
            continue;
        }
        let s = scheduler(&bytes, w, Config::default(), Limits::Default);
        if options.selected(&lifecycle) {
            let (ours, theirs) = pair(&|| lifecycles_wasmproc(&s, w, sizes), &|| lifecycles_raw(&raw, w, sizes));
            let mut record = Record::rate(&lifecycle, "lifecycles/s", sizes.lifecycles, &ours, Some(&theirs));
            if w == 2 {
                record = record.goal(Condition::median_at_least(200_000.0)).goal(Condition::ratio_at_most(1.3));
            }
            plots.lifecycles.push((w, record.median, theirs_rate(sizes.lifecycles, &theirs)));
            report.push(record);
        }
        if options.selected(&cycles) {
            let steps = sizes.cycle_processes * sizes.cycles_each;
            let (ours, theirs) = pair(&|| cycles_wasmproc(&s, sizes), &|| cycles_raw(&raw, w, sizes));
            let mut record = Record::rate(&cycles, "steps/s", steps, &ours, Some(&theirs));
            if w == 2 {
                record = record.goal(Condition::median_at_least(2e6)).goal(Condition::ratio_at_most(1.3));
            }
            plots.steps.push((w, record.median, theirs_rate(steps, &theirs)));
            report.push(record);
        }
        s.stop(Duration::from_secs(1));
    }

    if options.selected(&ping_pong) || options.selected(&tree) {
        let s = scheduler(&bytes, workers, Config::default(), Limits::Default);
        if options.selected(&ping_pong) {
            let messages = sizes.ping_pong_messages;
            let (ours, theirs) = pair(&|| ping_pong_wasmproc(&s, messages), &|| ping_pong_raw(&raw, messages));
            let record = Record::rate(&ping_pong, "messages/s", messages, &ours, Some(&theirs));
            report.push(record.goal(Condition::median_at_least(1e6)).goal(Condition::ratio_at_most(1.3)));
        }
        if options.selected(&tree) {
            let (ours, theirs) = pair(&|| tree_wasmproc(&s, sizes), &|| tree_raw(&raw, workers, sizes));
            report.push(Record::rate(&tree, "processes/s", sizes.tree_processes(), &ours, Some(&theirs)));
        }
        s.stop(Duration::from_secs(1));
    }

    // The same workloads ending their steps in `wait` (`examples-wasm/waiter`, as kind
    // `bench`), against the same raw baseline of a call of `step` a message or cycle.
    if options.selected(&ping_pong_wait) || options.selected(&cycles_wait) {
        let s = scheduler(&waiter, workers, Config::default(), Limits::Default);
        if options.selected(&ping_pong_wait) {
            let messages = sizes.ping_pong_messages;
            let (ours, theirs) = pair(&|| ping_pong_wasmproc(&s, messages), &|| ping_pong_raw(&raw, messages));
            let record = Record::rate(&ping_pong_wait, "messages/s", messages, &ours, Some(&theirs));
            report.push(record.goal(Condition::ratio_at_most(0.5)));
        }
        if options.selected(&cycles_wait) {
            let steps = sizes.cycle_processes * sizes.cycles_each;
            let (ours, theirs) = pair(&|| cycles_wasmproc(&s, sizes), &|| cycles_raw(&raw, workers, sizes));
            let record = Record::rate(&cycles_wait, "steps/s", steps, &ours, Some(&theirs));
            report.push(record.goal(Condition::ratio_at_most(0.5)));
        }
        s.stop(Duration::from_secs(1));
    }

    // The sandbox against itself: each pair differs in one setting only.
    let unpreempted = Config::default().preemption(false).time_slice(Duration::from_secs(1));
    type Variant = (&'static str, Config, Limits, Config, Limits);
    let variants: [Variant; 3] = [
        // Without preemption a step that the OS deschedules for a whole slice is stopped,
        // which a busy machine does now and then; a longer slice costs nothing a step.
        ("preemption", Config::default(), Limits::Default, unpreempted, Limits::Default),
        (
            "limits",
            Config::default().cpu_budget(Duration::from_secs(3600)),
            Limits::Default,
            Config::default(),
            Limits::Off,
        ),
        ("fuel", Config::default().fuel(FUEL), Limits::Default, Config::default(), Limits::Default),
    ];
    for (what, on, on_limits, off, off_limits) in variants {
        let (lifecycle, cycles) = (sandbox(&format!("{what}-lifecycle")), sandbox(&format!("{what}-cycles")));
        if !options.selected(&lifecycle) && !options.selected(&cycles) {
            continue;
        }
        let sandboxed = scheduler(&bytes, workers, on, on_limits);
        let bare = scheduler(&bytes, workers, off, off_limits);
        if options.selected(&lifecycle) {
            let (ours, theirs) = pair(&|| lifecycles_wasmproc(&sandboxed, workers, sizes), &|| {
                lifecycles_wasmproc(&bare, workers, sizes)
            });
            let record = Record::rate(&lifecycle, "lifecycles/s", sizes.lifecycles, &ours, Some(&theirs));
            report.push(record.goal(Condition::ratio_at_most(1.1)));
        }
        if options.selected(&cycles) {
            let steps = sizes.cycle_processes * sizes.cycles_each;
            let (ours, theirs) = pair(&|| cycles_wasmproc(&sandboxed, sizes), &|| cycles_wasmproc(&bare, sizes));
            report.push(
                Record::rate(&cycles, "steps/s", steps, &ours, Some(&theirs)).goal(Condition::ratio_at_most(1.1)),
            );
        }
        sandboxed.stop(Duration::from_secs(1));
        bare.stop(Duration::from_secs(1));
    }
}

fn theirs_rate(work: u64, theirs: &Sample) -> f64 {
    work as f64 / theirs.median.as_secs_f64()
}

// --- raw wasmtime --------------------------------------------------------------------

/// The pool the host used before its memory arena, and the host's other engine settings
/// (`host/src/wasm/engine.rs`, private there; keep them in step with it).
const CORE_INSTANCES_PER_PROCESS: u32 = 8;
const TABLES_PER_PROCESS: u32 = 4;
const TABLE_ELEMENTS: usize = 10_000;
const GUARD: u64 = 64 * 1024;
const MAX_WASM_STACK: usize = 256 * 1024;
/// `wasmproc::wasm::Config`'s default `max_memory`.
const MAX_MEMORY: usize = 64 * 1024 * 1024;
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// The host's `KEEP_RESIDENT`: what a freed memory slot keeps resident.
const HOST_KEEP_RESIDENT: usize = 256 * 1024;
/// The host's `MAX_LINE`: what its per-process output buffer is bounded by.
const OUTPUT_CAPACITY: usize = 16 * 1024;

/// The guest compiled by a pooling engine otherwise configured like the host's, ready to
/// instantiate.
pub(crate) struct RawWasm {
    pub(crate) engine: Engine,
    pub(crate) pre: raw::ProcessPre<RawState>,
}

/// What a raw store holds: the host's `ProcessState` less the log sink. Like the host's,
/// the WASI context is made on the guest's first WASI call, so that the ratio measures
/// the host's own costs rather than a setup the host skips.
pub(crate) struct RawState {
    wasi: Option<Box<WasiCtx>>,
    table: ResourceTable,
    pub(crate) limiter: RawLimiter,
    /// What the guest sent with the `send` host function in its last step: (to, body).
    outbox: Vec<(u64, wit::Payload)>,
}

impl RawState {
    pub(crate) fn new() -> Self {
        RawState { wasi: None, table: ResourceTable::new(), limiter: RawLimiter, outbox: Vec::new() }
    }
}

/// WASI as the host sets it up: nothing granted, output captured.
fn raw_wasi() -> WasiCtx {
    WasiCtxBuilder::new()
        .stdout(MemoryOutputPipe::new(OUTPUT_CAPACITY))
        .stderr(MemoryOutputPipe::new(OUTPUT_CAPACITY))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

impl WasiView for RawState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let wasi = self.wasi.get_or_insert_with(|| Box::new(raw_wasi()));
        WasiCtxView { ctx: wasi, table: &mut self.table }
    }
}

impl raw::wasmproc::process::host::Host for RawState {
    fn log(&mut self, _: raw::wasmproc::process::host::Level, _: String) {}

    fn send(&mut self, to: u64, _: String, body: wit::Payload) -> Result<(), String> {
        self.outbox.push((to, body));
        Ok(())
    }

    fn parent(&mut self) -> Option<u64> {
        None
    }

    /// The host's default (`--max-yields`).
    fn max_yields(&mut self) -> u32 {
        1024
    }

    /// Never called: the bench guest does not import it.
    fn wait(&mut self, _: wit::StepOutput) -> Option<Vec<wit::Event>> {
        None
    }
}

impl wit::Host for RawState {}

pub(crate) struct RawLimiter;

impl ResourceLimiter for RawLimiter {
    fn memory_growing(&mut self, _: usize, desired: usize, _: Option<usize>) -> wasmtime::Result<bool> {
        if desired > MAX_MEMORY {
            return Err(wasmtime::format_err!("memory limit exceeded"));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _: usize, _: usize, _: Option<usize>) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

impl RawWasm {
    /// An engine for `instances` processes, with copy-on-write memory images or not.
    pub(crate) fn new(bytes: &[u8], instances: u32, cow: bool) -> RawWasm {
        let n = instances;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_PROCESS))
            .max_core_instances_per_component(CORE_INSTANCES_PER_PROCESS)
            .total_memories(n)
            .max_memories_per_component(1)
            .max_memory_size(MAX_MEMORY)
            .total_tables(n.saturating_mul(TABLES_PER_PROCESS))
            .max_tables_per_component(TABLES_PER_PROCESS)
            .table_elements(TABLE_ELEMENTS);
        // Freed memory and table slots keep this many bytes resident, cleared with
        // memset, instead of giving them back with `madvise`: by default the host's
        // `KEEP_RESIDENT` (`host/src/wasm/engine.rs`), so that both sides pay for a
        // freed slot alike; `RAW_KEEP_RESIDENT=0` gives the pool's default back.
        let keep_resident = std::env::var("RAW_KEEP_RESIDENT").ok().and_then(|v| v.parse().ok());
        let keep_resident = keep_resident.unwrap_or(HOST_KEEP_RESIDENT);
        if keep_resident > 0 {
            pool.linear_memory_keep_resident(keep_resident).table_keep_resident(keep_resident);
        }
        // What-if knob for the baseline only (see docs/perf/wasm.md): no copy-on-write images.
        let cow = cow && std::env::var("RAW_COW").map_or(true, |v| v != "0");
        let mut config = wasmtime::Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            .memory_init_cow(cow)
            .memory_reservation(MAX_MEMORY as u64)
            .memory_reservation_for_growth(0)
            .memory_guard_size(GUARD)
            .max_wasm_stack(MAX_WASM_STACK)
            .parallel_compilation(true);
        let engine = Engine::new(&config).expect("the raw engine starts");
        let weak = engine.weak();
        // The host's epoch thread, so both sides pay the same ticks.
        thread::spawn(move || {
            loop {
                thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        });
        let component = wasmtime::component::Component::new(&engine, bytes).expect("the guest compiles");
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).expect("WASI links");
        raw::Process::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).expect("the host imports link");
        let pre = linker.instantiate_pre(&component).expect("the guest fits the linker");
        RawWasm { engine, pre: raw::ProcessPre::new(pre).expect("the guest fits the world") }
    }

    /// A store set up as the host's `new_store` does, with the guest instantiated and
    /// initialised with `method`.
    pub(crate) fn start(&self, pid: u64, method: &str, input: &[wit::Payload]) -> (Store<RawState>, raw::Process) {
        let mut store = Store::new(&self.engine, RawState::new());
        store.limiter(|state| &mut state.limiter);
        watch(&mut store);
        let guest = self.pre.instantiate(&mut store).expect("the guest instantiates");
        guest.call_init(&mut store, pid, method, input).expect("init runs").expect("init accepts");
        (store, guest)
    }
}

/// Looks at `store`'s calls once an epoch tick, as the host does (`process::watch`), and
/// lets them go on whatever the tick: a slow machine must not fail a baseline.
pub(crate) fn watch(store: &mut Store<RawState>) {
    store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Continue(1)));
    store.set_epoch_deadline(1);
}

/// A step as the host makes it: a deadline at the next tick, then the call.
pub(crate) fn step(store: &mut Store<RawState>, guest: &raw::Process, events: &[wit::Event]) -> wit::StepOutput {
    store.set_epoch_deadline(1);
    guest.call_step(&mut *store, events).expect("step runs")
}

fn wit_u64(value: u64) -> wit::Payload {
    wit::Payload { format: "bytes".to_owned(), data: value.to_le_bytes().to_vec() }
}

fn wit_complete(output: &wit::StepOutput) -> Option<&Result<wit::Payload, String>> {
    match &output.status {
        wit::Status::Complete(result) => Some(result),
        _ => None,
    }
}

// --- lifecycle -----------------------------------------------------------------------

/// Keeps `in_flight` `echo` children alive until `total` have ended.
struct Driver {
    total: u64,
    in_flight: u64,
    spawned: u64,
    ended: u64,
}

impl Process for Driver {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            match event {
                Event::Exit { reason, .. } => {
                    reason.into_result().map_err(|e| anyhow::anyhow!("an echo child {e}"))?;
                    self.ended += 1;
                }
                Event::Completion { result: Err(e), .. } => anyhow::bail!("spawn failed: {e}"),
                _ => {}
            }
        }
        if self.ended == self.total {
            out.complete(Ok(Payload::u64(self.ended)));
            return Ok(());
        }
        while self.spawned < self.total && self.spawned - self.ended < self.in_flight {
            let request = SpawnRequest {
                kind: Some("bench".to_owned()),
                method: "echo".to_owned(),
                input: vec![],
                monitor: true,
                link: false,
            };
            out.yield_command(self.spawned, Command::Spawn(request));
            self.spawned += 1;
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// One driver per worker: a spawn runs the child's `init` (instantiation included) on
/// the spawner's worker, so a single driver would serialise every instantiation.
fn lifecycles_wasmproc(s: &Scheduler, drivers: usize, sizes: Sizes) -> Duration {
    let drivers = drivers as u64;
    let total = sizes.lifecycles;
    let start = Instant::now();
    let handles: Vec<_> = (0..drivers)
        .map(|_| {
            let driver = Driver { total: total / drivers, in_flight: IN_FLIGHT / drivers, spawned: 0, ended: 0 };
            s.handle().spawn(driver, "main").expect("the driver starts")
        })
        .collect();
    let ended: u64 = handles.iter().map(|h| h.join().expect("the driver succeeds").to_u64().unwrap_or(0)).sum();
    let elapsed = start.elapsed();
    assert_eq!(ended, total / drivers * drivers);
    elapsed
}

fn lifecycles_raw(raw: &RawWasm, threads: usize, sizes: Sizes) -> Duration {
    let each = sizes.lifecycles / threads as u64;
    let start = Instant::now();
    thread::scope(|scope| {
        for t in 0..threads as u64 {
            scope.spawn(move || {
                for i in 0..each {
                    let (mut store, guest) = raw.start(t * each + i + 1, "echo", &[]);
                    let output = step(&mut store, &guest, &[]);
                    assert!(matches!(wit_complete(&output), Some(Ok(_))));
                }
            });
        }
    });
    start.elapsed()
}

// --- cycles --------------------------------------------------------------------------

fn cycles_wasmproc(s: &Scheduler, sizes: Sizes) -> Duration {
    let each = sizes.cycles_each;
    let start = Instant::now();
    let handles: Vec<_> = (0..sizes.cycle_processes)
        .map(|_| {
            s.handle()
                .spawn(Spawnable::kind("bench"), SpawnOptions::new("cycles").input(vec![Payload::u64(each)]))
                .expect("`cycles` starts")
        })
        .collect();
    for h in handles {
        assert_eq!(h.join(), Ok(Payload::u64(each)));
    }
    start.elapsed()
}

/// Each instance runs all its cycles back to back: the cheapest order for wasmtime.
fn cycles_raw(raw: &RawWasm, threads: usize, sizes: Sizes) -> Duration {
    let (each, cycles_each) = (sizes.cycle_processes / threads as u64, sizes.cycles_each);
    let start = Instant::now();
    thread::scope(|scope| {
        for t in 0..threads as u64 {
            scope.spawn(move || {
                for i in 0..each {
                    let (mut store, guest) = raw.start(t * each + i + 1, "cycles", &[wit_u64(cycles_each)]);
                    let mut output = step(&mut store, &guest, &[]);
                    for tag in 0..cycles_each {
                        let done = wit::Completion {
                            tag,
                            result: Ok(wit::Payload { format: "bytes".to_owned(), data: vec![] }),
                        };
                        output = step(&mut store, &guest, &[wit::Event::Completion(done)]);
                    }
                    assert_eq!(wit_complete(&output), Some(&Ok(wit_u64(cycles_each))));
                }
            });
        }
    });
    start.elapsed()
}

// --- ping-pong -----------------------------------------------------------------------

fn ping_pong_wasmproc(s: &Scheduler, limit: u64) -> Duration {
    let start = Instant::now();
    let server = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("ping-pong").input(vec![Payload::u64(limit)]))
        .expect("the server starts");
    let peer = Payload::u64(server.pid().as_u64());
    let client = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("ping-pong").input(vec![Payload::u64(limit), peer]))
        .expect("the client starts");
    let (a, b) = (server.join(), client.join());
    let elapsed = start.elapsed();
    assert_eq!((a, b), (Ok(Payload::u64(limit)), Ok(Payload::u64(limit))));
    elapsed
}

/// The two instances on one thread, each message in a step of its own, in the order
/// they were sent.
fn ping_pong_raw(raw: &RawWasm, limit: u64) -> Duration {
    let start = Instant::now();
    let mut processes =
        [raw.start(1, "ping-pong", &[wit_u64(limit)]), raw.start(2, "ping-pong", &[wit_u64(limit), wit_u64(1)])];
    let mut results = [None, None];
    let mut queue: VecDeque<(usize, wit::Event)> = VecDeque::new();
    for index in [0, 1] {
        let (store, guest) = &mut processes[index];
        let output = step(store, guest, &[]);
        handle_output(index, store, output, &mut queue, &mut results);
    }
    while let Some((index, event)) = queue.pop_front() {
        if results[index].is_some() {
            continue;
        }
        let (store, guest) = &mut processes[index];
        let output = step(store, guest, &[event]);
        handle_output(index, store, output, &mut queue, &mut results);
    }
    let elapsed = start.elapsed();
    assert_eq!(results, [Some(Ok(wit_u64(limit))), Some(Ok(wit_u64(limit)))]);
    elapsed
}

/// What the scheduler does with a step of one of the two processes of
/// [`ping_pong_raw`] (pids 1 and 2, at indices 0 and 1): queues what it sent as
/// messages, and keeps its result.
fn handle_output(
    index: usize,
    store: &mut Store<RawState>,
    output: wit::StepOutput,
    queue: &mut VecDeque<(usize, wit::Event)>,
    results: &mut [Option<Result<wit::Payload, String>>; 2],
) {
    for (to, body) in store.data_mut().outbox.drain(..) {
        let message = wit::Message { sender: index as u64 + 1, topic: String::new(), body };
        queue.push_back((to as usize - 1, wit::Event::Message(message)));
    }
    assert!(output.yields.is_empty(), "ping-pong sends with the host function, not commands");
    if let wit::Status::Complete(result) = output.status {
        results[index] = Some(result);
    }
}

// --- tree ----------------------------------------------------------------------------

fn tree_wasmproc(s: &Scheduler, sizes: Sizes) -> Duration {
    let leaves = sizes.tree_leaves;
    let start = Instant::now();
    let root = s
        .handle()
        .spawn(
            Spawnable::kind("bench"),
            SpawnOptions::new("tree").input(vec![Payload::u64(leaves), Payload::u64(TREE_WIDTH)]),
        )
        .expect("the root starts");
    let result = root.join();
    let elapsed = start.elapsed();
    assert_eq!(result, Ok(Payload::u64(leaves)));
    elapsed
}

/// The root on this thread, its subtrees shared round-robin among `threads` threads,
/// each run depth first by [`tree_node_raw`].
fn tree_raw(raw: &RawWasm, threads: usize, sizes: Sizes) -> Duration {
    let leaves = sizes.tree_leaves;
    let start = Instant::now();
    let (mut store, root) = raw.start(1, "tree", &[wit_u64(leaves), wit_u64(TREE_WIDTH)]);
    let spawns = spawn_inputs(step(&mut store, &root, &[]));
    let mut results: Vec<Option<wit::Payload>> = vec![None; spawns.len()];
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let spawns = &spawns;
                scope.spawn(move || {
                    let mine = (t..spawns.len()).step_by(threads);
                    mine.map(|i| (i, tree_node_raw(raw, &spawns[i].1))).collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            for (i, result) in worker.join().expect("a raw tree thread succeeds") {
                results[i] = Some(result);
            }
        }
    });
    let events = tree_events(&spawns, results.into_iter().map(|r| r.expect("every subtree ran")).collect());
    let output = step(&mut store, &root, &events);
    let elapsed = start.elapsed();
    assert_eq!(wit_complete(&output), Some(&Ok(wit_u64(leaves))));
    elapsed
}

/// One node and its subtree, depth first; returns the node's result.
fn tree_node_raw(raw: &RawWasm, input: &[wit::Payload]) -> wit::Payload {
    // The pid only names the process to the guest; the tree does not use it.
    let (mut store, guest) = raw.start(2, "tree", input);
    let output = step(&mut store, &guest, &[]);
    if let Some(result) = wit_complete(&output) {
        return result.clone().expect("a leaf succeeds");
    }
    let spawns = spawn_inputs(output);
    let results = spawns.iter().map(|(_, input)| tree_node_raw(raw, input)).collect();
    let output = step(&mut store, &guest, &tree_events(&spawns, results));
    wit_complete(&output).expect("a node completes once its children ended").clone().expect("a node succeeds")
}

/// The tags and inputs of a step's `spawn` commands.
fn spawn_inputs(output: wit::StepOutput) -> Vec<(u64, Vec<wit::Payload>)> {
    output
        .yields
        .into_iter()
        .map(|y| match y.command {
            wit::Command::Spawn(spawn) => (y.tag, spawn.input),
            _ => panic!("a tree node only spawns"),
        })
        .collect()
}

/// What the host delivers to a node whose children all ended: a completion per spawn
/// (with the child's pid), then an exit per child.
fn tree_events(spawns: &[(u64, Vec<wit::Payload>)], results: Vec<wit::Payload>) -> Vec<wit::Event> {
    let pid = |i: usize| i as u64 + 2;
    let completions = spawns
        .iter()
        .enumerate()
        .map(|(i, (tag, _))| wit::Event::Completion(wit::Completion { tag: *tag, result: Ok(wit_u64(pid(i))) }));
    let exits = results.into_iter().enumerate().map(|(i, result)| {
        wit::Event::Exit(wit::Exit { pid: pid(i), reason: wit::ExitReason::Normal(result), linked: false })
    });
    completions.chain(exits).collect()
}
