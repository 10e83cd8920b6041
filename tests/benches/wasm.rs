//! Wasm processes: what the host costs on top of wasmtime, in one run.
//!
//! `cargo bench -p wasmproc-tests --bench wasm` (release build). Options: `WORKERS=n`
//! (default 2: the CI machine class), `RUNS=n`, a name filter such as
//! `… --bench wasm -- ping`, and two what-if knobs for the raw side only:
//! `RAW_KEEP_RESIDENT=bytes` and `RAW_COW=0` (see `RawWasm::new`).
//!
//! The guest is `examples-wasm/bench`, written without the SDK, so a step's cost is
//! mostly the host's and wasmtime's: its own code was under a third of a step's time in
//! perf profiles of the `cycles` workload.
//!
//! Each paired workload runs once per side to warm up and then alternates the sides
//! `RUNS` times (as `host/benches/scheduler.rs` does); the table shows medians with
//! min–max. The baseline is raw wasmtime as it is used for many instances: its pooling
//! allocator with copy-on-write memory images and a 64 KiB guard (the host's engine before
//! the memory arena of `host/src/wasm/memory.rs`; the other settings are the host's:
//! memory cap, stack, epochs), the same compiled guest and the same WASI setup (nothing
//! granted, stdout and stderr captured), driven by plain loops instead of a scheduler:
//!
//! - `lifecycle`: spawn → init → step → complete → close of `echo`. wasmproc: native
//!   driver processes (one per worker) keep [`IN_FLIGHT`] children in flight through
//!   `spawn` commands with `monitor`, and spawn another on each exit. Raw: one thread per
//!   worker looping `Store::new`, `instantiate` (from an `InstancePre`), `init`, `step`,
//!   drop.
//! - `cycles`: processes that each step yields one custom command, completed at once by
//!   its handler. Raw: one thread per worker calling each instance's `step` in a loop with
//!   the completion event the host would deliver.
//! - `ping-pong`: two processes pass a counter through `send` commands. Raw: one thread
//!   steps the two instances with the events the host delivers (each message, then the
//!   sender's send completion: two calls per message, as in the scheduler).
//! - `idle`: memory per process waiting for a message. Each count runs in a child process
//!   of this bench (a fresh address space, and a crash or map-count failure there is
//!   reported instead of ending the bench), one run each.

use std::collections::VecDeque;
use std::io::Read as _;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Capabilities, Command, Event, Events, Payload, Pid, Process, Request, Scheduler, SpawnRequest};
use wasmproc::{Status, StepOutput};
use wasmproc_tests::bench::measure_pair;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

mod raw {
    wasmtime::component::bindgen!({ world: "process", path: "../wit", additional_derives: [PartialEq] });
}
use raw::wasmproc::process::{host, types as wit};

const GUEST: &str = env!("GUEST_BENCH");

/// Measured runs per paired workload; `RUNS` in the environment overrides it.
const DEFAULT_RUNS: usize = 5;
/// Lifecycles per run: about a second at the goal's 200k/s.
const LIFECYCLES: u64 = 200_000;
/// Children in flight across the drivers: enough that no worker waits for an exit to
/// have something to run, small against the pool (`Config::max_instances`, 10,000).
const IN_FLIGHT: u64 = 512;
/// `cycles` processes and cycles each: 1M steps, half a second at the goal's 2M/s.
const CYCLE_PROCESSES: u64 = 1_000;
const CYCLES_EACH: u64 = 1_000;
const PING_PONG_MESSAGES: u64 = 1_000_000;
/// Idle process counts: the two, then 1M slots to see what the address space
/// and the kernel allow.
const IDLE_COUNTS: [u32; 3] = [10_000, 100_000, 1_000_000];
/// The longest a child measuring idle processes may take before it is killed: spawning
/// 100k instances takes seconds, so this only catches a hang.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest the idle measurement waits for its processes' first steps, or for them
/// to end; a bound on a failure, not a measurement.
const WAIT_CAP: Duration = Duration::from_secs(120);
/// The raw engine's pool: `Config::max_instances`'s default, the host runtime's here.
const POOL_SLOTS: u32 = 10_000;
/// The idle measurement stops spawning when the machine has less memory available than
/// this (`MemAvailable`), so that a count the RAM cannot hold ends the measurement
/// instead of waking the OOM killer.
const MIN_AVAILABLE_KIB: u64 = 4 * 1024 * 1024;
/// Set in a child's environment to the measurement it runs.
const CHILD_ENV: &str = "WASMPROC_BENCH_CHILD";

fn main() {
    if let Ok(task) = std::env::var(CHILD_ENV) {
        child(&task);
        return;
    }
    let workers = env_number("WORKERS").unwrap_or(2);
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let selected = |name: &str| filter.as_ref().is_none_or(|f| name.contains(f.as_str()));
    let bytes = std::fs::read(GUEST).unwrap_or_else(|e| panic!("failed to read `{GUEST}`: {e}"));

    let scheduler_with = |config: Config| {
        let runtime = Runtime::new(config.no_disk_cache()).expect("the runtime starts");
        let component = runtime.load_bytes(&bytes).expect("the bench guest loads");
        Scheduler::builder()
            .workers(workers)
            .capabilities(Capabilities::default().allow("now"))
            .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
            .kind("bench", component)
            .build()
            .expect("the scheduler starts")
    };
    let scheduler = scheduler_with(Config::default());
    // The same without preemption: steps are plain calls instead of running on fibers.
    let unpreempted = scheduler_with(Config::default().preemption(false));
    let raw = RawWasm::new(&bytes, POOL_SLOTS, true);

    println!("Wasm processes vs raw wasmtime — {workers} workers, {} runs after 1 warm-up", runs());
    println!(
        "{:<16} {:>26} {:>26} {:>7} {:>14} {:>14}",
        "workload", "wasmproc median (range)", "raw wasmtime median (range)", "ratio", "wasmproc rate", "raw rate"
    );
    type Bench<'a> = (&'a str, u64, Box<dyn Fn() -> Duration + 'a>, Box<dyn Fn() -> Duration + 'a>);
    let benches: Vec<Bench<'_>> = vec![
        (
            "lifecycle-200k",
            LIFECYCLES,
            Box::new(|| lifecycles_wasmproc(&scheduler, workers)),
            Box::new(|| lifecycles_raw(&raw, workers)),
        ),
        (
            "cycles-1kx1k",
            CYCLE_PROCESSES * CYCLES_EACH,
            Box::new(|| cycles_wasmproc(&scheduler)),
            Box::new(|| cycles_raw(&raw, workers)),
        ),
        (
            "lifecycle-nopre",
            LIFECYCLES,
            Box::new(|| lifecycles_wasmproc(&unpreempted, workers)),
            Box::new(|| lifecycles_raw(&raw, workers)),
        ),
        (
            "cycles-nopre",
            CYCLE_PROCESSES * CYCLES_EACH,
            Box::new(|| cycles_wasmproc(&unpreempted)),
            Box::new(|| cycles_raw(&raw, workers)),
        ),
        (
            "ping-pong-1M",
            PING_PONG_MESSAGES,
            Box::new(|| ping_pong_wasmproc(&scheduler)),
            Box::new(|| ping_pong_raw(&raw)),
        ),
    ];
    for (name, work, ours, theirs) in benches {
        if !selected(name) {
            continue;
        }
        let counted = if name.ends_with("nopre") { &unpreempted } else { &scheduler };
        let before = counted.stats();
        // One warm-up a side, then alternating runs, so drift affects both alike.
        let (ours, theirs) = measure_pair(runs(), 1, &mut || ours(), &mut || theirs());
        let after = counted.stats();
        println!(
            "{name:<16} {:>26} {:>26} {:>7.2} {:>14} {:>14}",
            ours.to_string(),
            theirs.to_string(),
            ours.ratio(&theirs),
            rate(work, ours.median),
            rate(work, theirs.median),
        );
        let steps = |s: &wasmproc::Stats| s.workers.iter().map(|w| w.executed).sum::<u64>();
        let per_worker: Vec<_> =
            before.workers.iter().zip(&after.workers).map(|(b, a)| a.executed - b.executed).collect();
        println!(
            "  wasmproc: {:.2} steps per unit of work, steps per worker {per_worker:?}",
            (steps(&after) - steps(&before)) as f64 / (work * (runs() as u64 + 1)) as f64,
        );
    }
    scheduler.stop(Duration::from_secs(1));
    unpreempted.stop(Duration::from_secs(1));
    drop(raw);

    if selected("idle") {
        idle_report(workers);
    }
}

fn env_number(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0)
}

fn runs() -> usize {
    env_number("RUNS").unwrap_or(DEFAULT_RUNS)
}

fn rate(work: u64, time: Duration) -> String {
    let per_second = work as f64 / time.as_secs_f64();
    if per_second >= 1e6 { format!("{:.2} M/s", per_second / 1e6) } else { format!("{:.0} k/s", per_second / 1e3) }
}

// --- raw wasmtime --------------------------------------------------------------------

/// The pool the host used before its memory arena, and the host's other engine settings
/// (`host/src/wasm/engine.rs`, private there; keep them in step with it).
const CORE_INSTANCES_PER_PROCESS: u32 = 8;
const TABLES_PER_PROCESS: u32 = 4;
const TABLE_ELEMENTS: usize = 10_000;
const GUARD: u64 = 64 * 1024;
const MAX_WASM_STACK: usize = 256 * 1024;
/// `wasmproc::wasm::Config`'s defaults: `max_memory`, and `time_slice` in `epoch_tick`s.
const MAX_MEMORY: usize = 64 * 1024 * 1024;
const TIME_SLICE_TICKS: u64 = 100;
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// The host's `MAX_LINE`: what its per-process output buffer is bounded by.
const OUTPUT_CAPACITY: usize = 16 * 1024;

/// The guest compiled by a pooling engine otherwise configured like the host's, ready to
/// instantiate.
struct RawWasm {
    engine: Engine,
    pre: raw::ProcessPre<RawState>,
}

/// What a raw store holds: the host's `ProcessState` less the log sink.
struct RawState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: RawLimiter,
}

impl RawState {
    /// WASI as the host sets it up: nothing granted, output captured.
    fn new() -> Self {
        let wasi = WasiCtxBuilder::new()
            .stdout(MemoryOutputPipe::new(OUTPUT_CAPACITY))
            .stderr(MemoryOutputPipe::new(OUTPUT_CAPACITY))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        RawState { wasi, table: ResourceTable::new(), limiter: RawLimiter }
    }
}

impl WasiView for RawState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl host::Host for RawState {
    fn log(&mut self, _: host::Level, _: String) {}
}

impl wit::Host for RawState {}

struct RawLimiter;

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
    fn new(bytes: &[u8], instances: u32, cow: bool) -> RawWasm {
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
        // What-if knobs for the baseline only (see BENCHMARKS.md): keep this many bytes
        // of each memory and table resident, cleared with memset, instead of giving
        // them back with `madvise`; and no copy-on-write images.
        if let Some(bytes) = env_number("RAW_KEEP_RESIDENT") {
            pool.linear_memory_keep_resident(bytes).table_keep_resident(bytes);
        }
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
    fn start(&self, pid: u64, method: &str, input: &[wit::Payload]) -> (Store<RawState>, raw::Process) {
        let mut store = Store::new(&self.engine, RawState::new());
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(TIME_SLICE_TICKS);
        let guest = self.pre.instantiate(&mut store).expect("the guest instantiates");
        guest.call_init(&mut store, pid, method, input).expect("init runs").expect("init accepts");
        (store, guest)
    }
}

/// A step as the host makes it: a fresh time slice, then the call.
fn step(store: &mut Store<RawState>, guest: &raw::Process, events: &[wit::Event]) -> wit::StepOutput {
    store.set_epoch_deadline(TIME_SLICE_TICKS);
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
    fn init(&mut self, _: Pid, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            match event {
                Event::Exit { result, .. } => {
                    result.map_err(|e| anyhow::anyhow!("an echo child failed: {e}"))?;
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
fn lifecycles_wasmproc(s: &Scheduler, drivers: usize) -> Duration {
    let drivers = drivers as u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..drivers)
        .map(|_| {
            let driver = Driver { total: LIFECYCLES / drivers, in_flight: IN_FLIGHT / drivers, spawned: 0, ended: 0 };
            s.spawn(driver, "main", vec![]).expect("the driver starts")
        })
        .collect();
    let ended: u64 = handles.iter().map(|h| h.join().expect("the driver succeeds").to_u64().unwrap_or(0)).sum();
    let elapsed = start.elapsed();
    assert_eq!(ended, LIFECYCLES / drivers * drivers);
    elapsed
}

fn lifecycles_raw(raw: &RawWasm, threads: usize) -> Duration {
    let each = LIFECYCLES / threads as u64;
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

fn cycles_wasmproc(s: &Scheduler) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..CYCLE_PROCESSES)
        .map(|_| s.spawn_kind("bench", "cycles", vec![Payload::u64(CYCLES_EACH)]).expect("`cycles` starts"))
        .collect();
    for h in handles {
        assert_eq!(h.join(), Ok(Payload::u64(CYCLES_EACH)));
    }
    start.elapsed()
}

/// Each instance runs all its cycles back to back: the cheapest order for wasmtime.
fn cycles_raw(raw: &RawWasm, threads: usize) -> Duration {
    let each = CYCLE_PROCESSES / threads as u64;
    let start = Instant::now();
    thread::scope(|scope| {
        for t in 0..threads as u64 {
            scope.spawn(move || {
                for i in 0..each {
                    let (mut store, guest) = raw.start(t * each + i + 1, "cycles", &[wit_u64(CYCLES_EACH)]);
                    let mut output = step(&mut store, &guest, &[]);
                    for tag in 0..CYCLES_EACH {
                        let done = wit::Completion {
                            tag,
                            result: Ok(wit::Payload { format: "bytes".to_owned(), data: vec![] }),
                        };
                        output = step(&mut store, &guest, &[wit::Event::Completion(done)]);
                    }
                    assert_eq!(wit_complete(&output), Some(&Ok(wit_u64(CYCLES_EACH))));
                }
            });
        }
    });
    start.elapsed()
}

// --- ping-pong -----------------------------------------------------------------------

fn ping_pong_wasmproc(s: &Scheduler) -> Duration {
    let limit = PING_PONG_MESSAGES;
    let start = Instant::now();
    let server = s.spawn_kind("bench", "ping-pong", vec![Payload::u64(limit)]).expect("the server starts");
    let peer = Payload::u64(server.pid().as_u64());
    let client = s.spawn_kind("bench", "ping-pong", vec![Payload::u64(limit), peer]).expect("the client starts");
    let (a, b) = (server.join(), client.join());
    let elapsed = start.elapsed();
    assert_eq!((a, b), (Ok(Payload::u64(limit)), Ok(Payload::u64(limit))));
    elapsed
}

/// The two instances on one thread, each event in a step of its own in the order the
/// scheduler delivers them: the sender's send completion, then the receiver's message.
fn ping_pong_raw(raw: &RawWasm) -> Duration {
    let limit = PING_PONG_MESSAGES;
    let start = Instant::now();
    let mut processes =
        [raw.start(1, "ping-pong", &[wit_u64(limit)]), raw.start(2, "ping-pong", &[wit_u64(limit), wit_u64(1)])];
    let mut results = [None, None];
    let mut queue: VecDeque<(usize, wit::Event)> = VecDeque::new();
    for index in [0, 1] {
        let (store, guest) = &mut processes[index];
        let output = step(store, guest, &[]);
        handle_output(index, output, &mut queue, &mut results);
    }
    while let Some((index, event)) = queue.pop_front() {
        if results[index].is_some() {
            continue;
        }
        let (store, guest) = &mut processes[index];
        let output = step(store, guest, &[event]);
        handle_output(index, output, &mut queue, &mut results);
    }
    let elapsed = start.elapsed();
    assert_eq!(results, [Some(Ok(wit_u64(limit))), Some(Ok(wit_u64(limit)))]);
    elapsed
}

/// What the scheduler does with a step's output, for the two processes of
/// [`ping_pong_raw`] (pids 1 and 2, at indices 0 and 1).
fn handle_output(
    index: usize,
    output: wit::StepOutput,
    queue: &mut VecDeque<(usize, wit::Event)>,
    results: &mut [Option<Result<wit::Payload, String>>; 2],
) {
    if let wit::Status::Complete(result) = output.status {
        results[index] = Some(result);
        return;
    }
    for y in output.yields {
        let wit::Command::Send(send) = y.command else { panic!("ping-pong only sends") };
        let empty = wit::Payload { format: "bytes".to_owned(), data: vec![] };
        queue.push_back((index, wit::Event::Completion(wit::Completion { tag: y.tag, result: Ok(empty) })));
        let message = wit::Message { sender: index as u64 + 1, topic: send.topic, body: send.body };
        queue.push_back((send.to as usize - 1, wit::Event::Message(message)));
    }
}

// --- idle ----------------------------------------------------------------------------

/// Runs the idle measurements, each in a child process, and prints what they found.
fn idle_report(workers: usize) {
    let max_maps = std::fs::read_to_string("/proc/sys/vm/max_map_count").map(|s| s.trim().to_owned());
    println!();
    println!(
        "idle processes (one run each, in a child process); vm.max_map_count = {}",
        max_maps.as_deref().unwrap_or("unknown")
    );
    for count in IDLE_COUNTS {
        report_child(&format!("wasmproc {count} {workers}"));
    }
    // The adapter's `Config` has no switch for copy-on-write images, so the mappings
    // without them are measured on raw wasmtime, up to the wall they move.
    report_child("raw 10000 true");
    report_child("raw 100000 false");
}

/// Runs the child measurement `task` and prints its findings, or how it died.
fn report_child(task: &str) {
    let exe = std::env::current_exe().expect("the bench knows its own path");
    let child = std::process::Command::new(exe)
        .env(CHILD_ENV, task)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return println!("{task}: could not start the child: {e}"),
    };
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    print!("{stdout}");
    match status {
        Some(status) if status.success() => {}
        Some(status) => {
            let tail: Vec<_> = stderr.lines().rev().take(5).collect();
            println!("  {task}: the child ended with {status}; its last words: {:?}", tail);
        }
        None => println!("  {task}: killed after {CHILD_TIMEOUT:?}"),
    }
}

fn child(task: &str) {
    let words: Vec<&str> = task.split(' ').collect();
    match words.as_slice() {
        ["wasmproc", count, workers] => {
            idle_wasmproc(count.parse().expect("a count"), workers.parse().expect("workers"))
        }
        ["raw", count, cow] => idle_raw(count.parse().expect("a count"), cow.parse().expect("a bool")),
        _ => panic!("unknown child task `{task}`"),
    }
}

/// A `/proc/self/status` field in KiB (see [`proc_kib`]).
fn status_kib(field: &str) -> u64 {
    proc_kib("/proc/self/status", field)
}

/// A field in KiB of a `/proc` file of `field: n kB` lines, read through a fixed buffer
/// (see [`map_count`]).
fn proc_kib(path: &str, field: &str) -> u64 {
    static BUFFER: std::sync::Mutex<[u8; 8 * 1024]> = std::sync::Mutex::new([0; 8 * 1024]);
    let mut buffer = BUFFER.lock().expect("no reader panicked");
    let mut file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path} is not readable: {e}"));
    let mut len = 0;
    while len < buffer.len() {
        match file.read(&mut buffer[len..]).unwrap_or_else(|e| panic!("{path} is not readable: {e}")) {
            0 => break,
            n => len += n,
        }
    }
    std::str::from_utf8(&buffer[..len])
        .unwrap_or_else(|_| panic!("{path} is not text"))
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':')?.trim().strip_suffix(" kB")?.parse().ok())
        .unwrap_or_else(|| panic!("no `{field}` in {path}"))
}

/// Lines in `/proc/self/maps`, read through a fixed buffer: at the map-count wall every
/// new mapping fails, so this must not need one (a `String` of the whole file would).
fn map_count() -> Option<usize> {
    static BUFFER: std::sync::Mutex<[u8; 64 * 1024]> = std::sync::Mutex::new([0; 64 * 1024]);
    let mut buffer = BUFFER.lock().ok()?;
    let mut file = std::fs::File::open("/proc/self/maps").ok()?;
    let mut lines = 0;
    loop {
        match file.read(&mut buffer[..]).ok()? {
            0 => return Some(lines),
            n => lines += buffer[..n].iter().filter(|&&b| b == b'\n').count(),
        }
    }
}

fn maps_text(maps: Option<usize>) -> String {
    maps.map_or_else(|| "unreadable".to_owned(), |n| n.to_string())
}

/// Maps added per process between two counts.
fn maps_per(before: Option<usize>, after: Option<usize>, processes: usize) -> String {
    match (before, after) {
        (Some(b), Some(a)) if processes > 0 => format!("{:.2}", a.saturating_sub(b) as f64 / processes as f64),
        _ => "?".to_owned(),
    }
}

fn kib(bytes: u64) -> String {
    const GIB: u64 = 1024 * 1024;
    const TIB: u64 = 1024 * GIB;
    if bytes >= TIB {
        format!("{:.2} TiB", bytes as f64 / TIB as f64)
    } else {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    }
}

/// `count` `idle` processes of the host, spawned from this thread, each waiting for a
/// message after its first step.
fn idle_wasmproc(count: u32, workers: usize) {
    let label = format!("wasmproc idle x{count}");
    let bytes = std::fs::read(GUEST).expect("the guest is readable");
    let vm_before = status_kib("VmSize");
    let runtime = match Runtime::new(Config::default().max_instances(count).no_disk_cache()) {
        Ok(runtime) => runtime,
        Err(e) => return println!("{label}: the runtime could not reserve its pool: {e:#}"),
    };
    let reserved = status_kib("VmSize") - vm_before;
    println!(
        "{label}: {count} memory slots reserve {} of address space, {:.1} MiB a slot; 1M slots would need {}",
        kib(reserved),
        reserved as f64 / f64::from(count) / 1024.0,
        kib(reserved * 1_000_000 / u64::from(count)),
    );
    for warning in runtime.warnings() {
        println!("{label}: the runtime warns: {warning}");
    }
    let component = runtime.load_bytes(&bytes).expect("the bench guest loads");
    let s = Scheduler::builder()
        .workers(workers)
        .kind("bench", component)
        .max_processes(count as usize + 16)
        .build()
        .expect("the scheduler starts");
    let steps = || s.stats().workers.iter().map(|w| w.executed).sum::<u64>();
    // One process first, so the first-use costs (code pages, buffers) are in the baseline.
    let warm = s.spawn_kind("bench", "idle", vec![]).expect("one idle process starts");
    s.send(warm.pid(), "", Payload::empty()).expect("it takes a message");
    warm.join().expect("it ends");

    let (rss_before, pte_before, maps_before, steps_before) =
        (status_kib("VmRSS"), status_kib("VmPTE"), map_count(), steps());
    let arena_rss_before = largest_mapping_rss_kib();
    let start = Instant::now();
    let mut pids = Vec::with_capacity(count as usize);
    let mut failure = None;
    for spawned in 0..count {
        if spawned % 1024 == 0 && proc_kib("/proc/meminfo", "MemAvailable") < MIN_AVAILABLE_KIB {
            failure = Some(format!(
                "stopped before spawn {}: the machine's available memory (`MemAvailable`) fell below {} GiB",
                spawned + 1,
                MIN_AVAILABLE_KIB / 1024 / 1024
            ));
            break;
        }
        match s.spawn_kind("bench", "idle", vec![]) {
            Ok(handle) => pids.push(handle.pid()),
            Err(e) => {
                failure = Some(format!("spawn {} failed: {e:#}", spawned + 1));
                break;
            }
        }
    }
    let spawned = pids.len() as u64;
    let deadline = Instant::now() + WAIT_CAP;
    while steps() < steps_before + spawned && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    let stepped = steps() - steps_before;
    let elapsed = start.elapsed();
    let (rss, pte, maps) = (status_kib("VmRSS"), status_kib("VmPTE"), map_count());
    let (arena_before, arena) = (arena_rss_before, largest_mapping_rss_kib());
    let per = |total: f64| if spawned == 0 { 0.0 } else { total / spawned as f64 };
    println!(
        "{label}: {spawned} spawned, {stepped} first steps in {:.0} ms; RSS +{:.1} MiB = {:.1} KiB a process \
         (linear memory {:.1} KiB, the rest the host's heap); page tables (VmPTE) +{:.1} MiB = {:.1} KiB a process; \
         {} memory maps = {} a process",
        elapsed.as_secs_f64() * 1e3,
        (rss.saturating_sub(rss_before)) as f64 / 1024.0,
        per(rss.saturating_sub(rss_before) as f64),
        per(arena.saturating_sub(arena_before) as f64),
        (pte.saturating_sub(pte_before)) as f64 / 1024.0,
        per(pte.saturating_sub(pte_before) as f64),
        maps_text(maps),
        maps_per(maps_before, maps, pids.len()),
    );
    if let Some(failure) = failure {
        println!("{label}: {failure}");
    }
    let release = Instant::now();
    for pid in pids {
        let _ = s.send(pid, "", Payload::empty());
    }
    let drained = s.wait_idle(Some(WAIT_CAP));
    println!(
        "{label}: all woken and ended in {:.0} ms{}; {} memory maps left; RSS then +{:.1} MiB over the baseline",
        release.elapsed().as_secs_f64() * 1e3,
        if drained { "" } else { " (NOT all ended within the cap)" },
        maps_text(map_count()),
        status_kib("VmRSS").saturating_sub(rss_before) as f64 / 1024.0,
    );
    s.stop(Duration::from_secs(1));
}

/// The resident KiB of the process's largest mapping: in a wasmproc child, the memory
/// arena, which holds every linear memory.
fn largest_mapping_rss_kib() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps is readable");
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix(" kB")?.parse().ok()
    };
    let (mut largest, mut rss_of_largest, mut size) = (0, 0, 0);
    for line in smaps.lines() {
        if let Some(kib) = field(line, "Size") {
            size = kib;
        } else if let Some(kib) = field(line, "Rss")
            && size > largest
        {
            (largest, rss_of_largest) = (size, kib);
        }
    }
    rss_of_largest
}

/// `count` raw instances of `idle`, initialised and stepped once, kept alive.
fn idle_raw(count: u32, cow: bool) {
    let label = format!("raw wasmtime idle x{count}, memory_init_cow({cow})");
    let bytes = std::fs::read(GUEST).expect("the guest is readable");
    let vm_before = status_kib("VmSize");
    let raw = RawWasm::new(&bytes, count + 1, cow);
    println!("{label}: pool reserves {}", kib(status_kib("VmSize") - vm_before));
    let warm = raw.start(0, "idle", &[]);
    drop(warm);
    let (rss_before, pte_before, maps_before) = (status_kib("VmRSS"), status_kib("VmPTE"), map_count());
    let mut instances = Vec::with_capacity(count as usize);
    let mut failure = None;
    for pid in 1..=u64::from(count) {
        let mut store = Store::new(&raw.engine, RawState::new());
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(TIME_SLICE_TICKS);
        let guest = match raw.pre.instantiate(&mut store) {
            Ok(guest) => guest,
            Err(e) => {
                failure = Some(format!("{e:#}"));
                break;
            }
        };
        guest.call_init(&mut store, pid, "idle", &[]).expect("init runs").expect("init accepts");
        let output = step(&mut store, &guest, &[]);
        assert!(matches!(output.status, wit::Status::Idle));
        instances.push((store, guest));
    }
    let n = instances.len() as f64;
    let (rss, pte, maps) = (status_kib("VmRSS"), status_kib("VmPTE"), map_count());
    println!(
        "{label}: {} instances; RSS {:.1} KiB an instance; page tables {:.1} KiB an instance; \
         {} memory maps an instance",
        instances.len(),
        rss.saturating_sub(rss_before) as f64 / n,
        pte.saturating_sub(pte_before) as f64 / n,
        maps_per(maps_before, maps, instances.len()),
    );
    if let Some(failure) = failure {
        println!("{label}: instance {} failed: {failure}", instances.len() + 1);
    }
}
