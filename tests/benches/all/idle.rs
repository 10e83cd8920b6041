//! Idle processes: memory per process waiting for a message, at 10k, 100k and 1M.
//!
//! Each count runs in a child process of the bench (a fresh address space; a crash or a
//! map-count failure there is reported instead of ending the bench), one run each. The
//! runtime is sized to the count (`Config::max_instances`); the child spawns `idle`
//! processes until all have run their first step, or until the machine has less than
//! 4 GiB available, and reads RSS, page tables (`VmPTE`) and memory mappings from
//! `/proc/self` before and after, once they have hibernated and rested 3 s (a host at
//! rest: the engine gives back the memory no process took for a second). Every tenth of
//! the way it waits for the first steps to catch up and samples RSS: the
//! RSS-versus-live-processes plot. The baseline is raw
//! wasmtime's pooling allocator with copy-on-write images at 10k; without them, at 100k,
//! it shows where its map-count wall is (it has no 100k figure to compare with).
//!
//! The same is measured for a guest written with the SDK (`examples-wasm/ping-pong`'s
//! `pong`, waiting in `ctx.recv()`): `idle/sdk-rss-per-process-*`, at 10k and 100k (1k
//! and 10k quick), against the goal of Lunatic's 30 KiB.
//!
//! A child reports to the parent on its stdout: `@sample <live> <rss KiB over the
//! baseline>` lines and one `@result <json>` line; every other line is for the reader.

use std::io::Read;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc::Scheduler;
use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Payload, Pid};
use wasmproc_tests::bench::{Condition, Options, Record, Report};
use wasmtime::Store;

use crate::plot::Plots;
use crate::short;
use crate::wasm::{GUEST, INIT_TIME_LIMIT, RawState, RawWasm, step, watch, wit};
use wasmproc::scheduler::Spawnable;

/// How long the processes rest once hibernated, before their memory is read.
const REST: Duration = Duration::from_secs(3);
/// The longest a child may take before it is killed: spawning 1M instances takes about
/// a minute, so this only catches a hang.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest a child waits for its processes' first steps, or for them to end; a
/// bound on a failure, not a measurement.
const WAIT_CAP: Duration = Duration::from_secs(120);
/// A child stops spawning when the machine has less memory available than this
/// (`MemAvailable`), so that a count the RAM cannot hold ends the measurement instead of
/// waking the OOM killer.
const MIN_AVAILABLE_KIB: u64 = 4 * 1024 * 1024;
/// Set in a child's environment to the measurement it runs.
pub const CHILD_ENV: &str = "WASMPROC_BENCH_CHILD";
/// Processes whose wake a child times, one at a time, after measuring their memory.
const WAKES_TIMED: usize = 1_000;
/// The goals for a hibernated process's wake, in microseconds.
const WAKE_GOAL_P50_US: f64 = 50.0;
const WAKE_GOAL_P99_US: f64 = 500.0;
/// RSS samples a child takes on the way to its count.
const SAMPLES: u64 = 10;
/// The SDK guest of `idle/sdk-*`: its `pong` entry waits in `ctx.recv()` until a `stop`.
const SDK_GUEST: &str = env!("GUEST_PING_PONG");
/// What an idle SDK process may cost: Lunatic's 30 KiB for the same process (issue 34).
const SDK_GOAL_KIB: f64 = 30.0;

/// The guest an idle child spawns: its path, the entry that waits, and the message topic
/// that ends it.
#[derive(Clone, Copy)]
enum Guest {
    /// The bench guest, written without the SDK.
    Bench,
    /// [`SDK_GUEST`].
    Sdk,
}

impl Guest {
    fn path(self) -> &'static str {
        match self {
            Guest::Bench => GUEST,
            Guest::Sdk => SDK_GUEST,
        }
    }

    fn entry(self) -> &'static str {
        match self {
            Guest::Bench => "idle",
            Guest::Sdk => "pong",
        }
    }

    fn stop_topic(self) -> &'static str {
        match self {
            Guest::Bench => "",
            Guest::Sdk => "stop",
        }
    }

    fn task(self) -> &'static str {
        match self {
            Guest::Bench => "wasmproc",
            Guest::Sdk => "wasmproc-sdk",
        }
    }
}

/// What a child found, from its `@result` line.
#[derive(Default)]
struct Found {
    result: Option<Value>,
    samples: Vec<(u64, f64)>,
}

/// Runs the selected idle counts, each in a child, into `report`, and their RSS samples
/// into `plots`.
pub fn run(options: &Options, report: &mut Report, plots: &mut Plots) {
    let counts: &[u64] = if options.quick { &[1_000, 10_000] } else { &[10_000, 100_000, 1_000_000] };
    let name = |what: &str, count: u64| format!("idle/{what}-{}", short(count));
    let sdk_counts: &[u64] = if options.quick { &[1_000, 10_000] } else { &[10_000, 100_000] };
    let bench_selected = counts.iter().any(|&c| options.selected(&name("rss-per-process", c)));
    if !bench_selected && !sdk_counts.iter().any(|&c| options.selected(&name("sdk-rss-per-process", c))) {
        return;
    }
    let max_maps = std::fs::read_to_string("/proc/sys/vm/max_map_count").map(|s| s.trim().to_owned());
    println!(
        "  idle: one run a count, each in a child process; vm.max_map_count = {}",
        max_maps.as_deref().unwrap_or("?")
    );
    if bench_selected {
        bench_guest(options, counts, report, plots);
    }
    for &count in sdk_counts {
        let name = name("sdk-rss-per-process", count);
        if !options.selected(&name) {
            continue;
        }
        let found = run_child(&format!("{} {count} {}", Guest::Sdk.task(), options.workers));
        let figure = |field: &str| found.result.as_ref().and_then(|r| r[field].as_f64()).unwrap_or(f64::NAN);
        report.push(Record::single(name, "KiB", figure("rss_kib_per")).goal(Condition::median_at_most(SDK_GOAL_KIB)));
        let name = |what: &str| format!("idle/sdk-{what}-{}", short(count));
        report.push(Record::single(name("page-tables-per-process"), "KiB", figure("pte_kib_per")));
        report.push(
            Record::single(name("wake-p50"), "µs", figure("wake_p50_us"))
                .goal(Condition::median_at_most(WAKE_GOAL_P50_US)),
        );
        report.push(
            Record::single(name("wake-p99"), "µs", figure("wake_p99_us"))
                .goal(Condition::median_at_most(WAKE_GOAL_P99_US)),
        );
    }
}

/// The bench guest's rows, at `counts`, against raw wasmtime's.
fn bench_guest(options: &Options, counts: &[u64], report: &mut Report, plots: &mut Plots) {
    let name = |what: &str, count: u64| format!("idle/{what}-{}", short(count));
    let raw_with_cow = counts[0];
    let raw = run_child(&format!("raw {raw_with_cow} true"));
    if !options.quick {
        // Without copy-on-write images raw wasmtime needs 2 mappings an instance instead
        // of 4: how far that moves its wall at 100k.
        let wall = run_child("raw 100000 false");
        plots.rss.push(("raw wasmtime (pool, no CoW)".to_owned(), wall.samples));
    }
    let raw_rss = raw.result.as_ref().and_then(|r| r["rss_kib_per"].as_f64());
    plots.rss.push(("raw wasmtime (pool)".to_owned(), raw.samples));
    for &count in counts {
        if !options.selected(&name("rss-per-process", count)) {
            continue;
        }
        let found = run_child(&format!("{} {count} {}", Guest::Bench.task(), options.workers));
        let Some(result) = found.result else {
            report.push(Record::single(name("reached", count), "processes", 0.0));
            continue;
        };
        let figure = |field: &str| result[field].as_f64().unwrap_or(f64::NAN);
        report.push(Record::single(name("reached", count), "processes", figure("spawned")));
        let mut rss = Record::single(name("rss-per-process", count), "KiB", figure("rss_kib_per"));
        if count == raw_with_cow
            && let Some(raw_rss) = raw_rss
        {
            let ratio = rss.median / raw_rss;
            rss = rss.with_baseline(raw_rss, ratio);
        }
        if count == 100_000 {
            rss = rss.goal(Condition::median_at_most(20.0));
        }
        report.push(rss);
        report.push(Record::single(name("page-tables-per-process", count), "KiB", figure("pte_kib_per")));
        report.push(
            Record::single(name("wake-p50", count), "µs", figure("wake_p50_us"))
                .goal(Condition::median_at_most(WAKE_GOAL_P50_US)),
        );
        report.push(
            Record::single(name("wake-p99", count), "µs", figure("wake_p99_us"))
                .goal(Condition::median_at_most(WAKE_GOAL_P99_US)),
        );
        plots.rss.push((format!("wasmproc, {} asked", short(count)), found.samples));
    }
}

/// Runs the child measurement `task`, prints its lines for the reader and how it ended
/// if it failed, and returns what it reported.
fn run_child(task: &str) -> Found {
    run_child_for(task, CHILD_TIMEOUT).map(|stdout| parse_child(&stdout)).unwrap_or_default()
}

/// Runs this executable again as the child measurement `task` (see [`CHILD_ENV`]),
/// killed after `timeout`: its standard output, once it ended, or `None` if it could not
/// start. Its lines not meant for the parent (not starting with `@`) are printed for the
/// reader, and how it ended if it failed.
pub fn run_child_for(task: &str, timeout: Duration) -> Option<String> {
    let exe = std::env::current_exe().expect("the bench knows its own path");
    let child = std::process::Command::new(exe)
        .env(CHILD_ENV, task)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            println!("  {task}: could not start the child: {e}");
            return None;
        }
    };
    // Drained on threads while the child runs: a full pipe would stall it.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
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
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    for line in stdout.lines().filter(|l| !l.starts_with('@')) {
        println!("  {line}");
    }
    match status {
        Some(status) if status.success() => {}
        Some(status) => {
            let tail: Vec<_> = stderr.lines().rev().take(5).collect();
            println!("  {task}: the child ended with {status}; its last words: {tail:?}");
        }
        None => println!("  {task}: killed after {timeout:?}"),
    }
    Some(stdout)
}

/// The `@` lines of a child's output.
fn parse_child(stdout: &str) -> Found {
    let mut found = Found::default();
    for line in stdout.lines() {
        if let Some(sample) = line.strip_prefix("@sample ") {
            let mut words = sample.split(' ');
            if let (Some(Ok(live)), Some(Ok(kib))) = (words.next().map(str::parse), words.next().map(str::parse)) {
                found.samples.push((live, kib));
            }
        } else if let Some(result) = line.strip_prefix("@result ") {
            found.result = serde_json::from_str(result).ok();
        }
    }
    found
}

/// The measurement `task` of a child process (see [`CHILD_ENV`]).
pub fn child(task: &str) {
    let words: Vec<&str> = task.split(' ').collect();
    match words.as_slice() {
        ["wasmproc", count, workers] => {
            idle_wasmproc(Guest::Bench, count.parse().expect("a count"), workers.parse().expect("workers"))
        }
        ["wasmproc-sdk", count, workers] => {
            idle_wasmproc(Guest::Sdk, count.parse().expect("a count"), workers.parse().expect("workers"))
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

/// `count` idle processes of `guest` on the host, spawned from this thread, each waiting
/// for a message after its first step.
fn idle_wasmproc(guest: Guest, count: u32, workers: usize) {
    let label = format!("{} idle x{count}", guest.task());
    let bytes = std::fs::read(guest.path()).expect("the guest is readable");
    let vm_before = status_kib("VmSize");
    let config = Config::default().max_instances(count).init_time_limit(INIT_TIME_LIMIT).no_disk_cache();
    let runtime = match Runtime::new(config) {
        Ok(runtime) => runtime,
        Err(e) => return println!("{label}: the runtime could not reserve its memory arena: {e:#}"),
    };
    let reserved = status_kib("VmSize") - vm_before;
    println!(
        "{label}: {count} memory slots reserve {} of address space, {:.1} MiB a slot",
        kib(reserved),
        reserved as f64 / f64::from(count) / 1024.0,
    );
    let component = runtime.load_bytes(&bytes).expect("the bench guest loads");
    let s = Scheduler::builder()
        .workers(workers)
        .kind("bench", component)
        .max_processes(count as usize + 16)
        .build()
        .expect("the scheduler starts");
    let steps = || s.handle().stats().workers.iter().map(|w| w.executed).sum::<u64>();
    // One process first, so the first-use costs (code pages, buffers) are in the baseline.
    let warm = s.handle().spawn(Spawnable::kind("bench"), guest.entry()).expect("one idle process starts");
    s.handle().send(warm.pid(), guest.stop_topic(), Payload::empty()).expect("it takes a message");
    warm.join().expect("it ends");

    let (rss_before, pte_before, maps_before, steps_before) =
        (status_kib("VmRSS"), status_kib("VmPTE"), map_count(), steps());
    let arena_rss_before = largest_mapping_rss_kib();
    let wait_for_first_steps = |spawned: u64| {
        let deadline = Instant::now() + WAIT_CAP;
        while steps() < steps_before + spawned && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
    };
    let sample_every = (u64::from(count) / SAMPLES).max(1);
    let start = Instant::now();
    let mut pids: Vec<Pid> = Vec::with_capacity(count as usize);
    // The first processes' handles, to time their wakes.
    let mut timed = Vec::with_capacity(WAKES_TIMED);
    let mut failure = None;
    for spawned in 0..u64::from(count) {
        if spawned % 1024 == 0 && proc_kib("/proc/meminfo", "MemAvailable") < MIN_AVAILABLE_KIB {
            failure = Some(format!(
                "stopped before spawn {}: the machine's available memory (`MemAvailable`) fell below {} GiB",
                spawned + 1,
                MIN_AVAILABLE_KIB / 1024 / 1024
            ));
            break;
        }
        if spawned > 0 && spawned % sample_every == 0 {
            wait_for_first_steps(spawned);
            println!("@sample {spawned} {}", status_kib("VmRSS").saturating_sub(rss_before));
        }
        match s.handle().spawn(Spawnable::kind("bench"), guest.entry()) {
            Ok(handle) => {
                pids.push(handle.pid());
                if timed.len() < WAKES_TIMED {
                    timed.push(handle);
                }
            }
            Err(e) => {
                failure = Some(format!("spawn {} failed: {e:#}", spawned + 1));
                break;
            }
        }
    }
    let spawned = pids.len() as u64;
    wait_for_first_steps(spawned);
    let stepped = steps() - steps_before;
    let elapsed = start.elapsed();
    // Workers left with nothing to run let the waiting processes give back their fiber
    // stacks' pages (`Stats::hibernated`): measured once that has settled.
    let hibernated = {
        let deadline = Instant::now() + WAIT_CAP;
        let mut last = s.handle().stats().hibernated;
        loop {
            // Longer than the heap's trim (about 0.1 s at 100k processes, during which
            // the workers' hibernations may wait on the allocator).
            thread::sleep(Duration::from_millis(250));
            let now = s.handle().stats().hibernated;
            if now == last || Instant::now() > deadline {
                break now;
            }
            last = now;
        }
    };
    // A host at rest: the memory slots and stacks the hibernated instances freed, that no
    // process took since, are given back within two of the engine's coolings (a second
    // apart), and the heap trimmed after them.
    thread::sleep(REST);
    let hibernated = hibernated.max(s.handle().stats().hibernated);
    let (rss, pte, maps) = (status_kib("VmRSS"), status_kib("VmPTE"), map_count());
    println!("@sample {spawned} {}", rss.saturating_sub(rss_before));
    let arena = largest_mapping_rss_kib().saturating_sub(arena_rss_before);
    let per = |total: u64| if spawned == 0 { 0.0 } else { total as f64 / spawned as f64 };
    let (rss_per, pte_per) = (per(rss.saturating_sub(rss_before)), per(pte.saturating_sub(pte_before)));
    println!(
        "{label}: {spawned} spawned, {stepped} first steps in {:.0} ms, {hibernated} hibernations; RSS +{:.1} MiB = {rss_per:.1} KiB a process \
         (linear memory and fiber stacks {:.1} KiB, the rest the host's heap); page tables (VmPTE) +{:.1} MiB = {pte_per:.1} KiB a \
         process; {} memory maps = {} a process",
        elapsed.as_secs_f64() * 1e3,
        rss.saturating_sub(rss_before) as f64 / 1024.0,
        per(arena),
        pte.saturating_sub(pte_before) as f64 / 1024.0,
        maps_text(maps),
        maps_per(maps_before, maps, pids.len()),
    );
    if let Some(failure) = &failure {
        println!("{label}: {failure}");
    }
    let whole = runtime.hibernation_stats();
    println!(
        "{label}: {} hibernated whole, keeping {:.1} KiB of memory a process",
        whole.hibernated,
        whole.kept_bytes as f64 / 1024.0 / whole.hibernated.max(1) as f64
    );
    // Wakes: a message to a hibernated process, one at a time, until it has ended (its
    // instance made again, its step run, its end reported to the handle).
    let mut wakes: Vec<f64> = Vec::with_capacity(timed.len());
    for handle in &timed {
        let sent = Instant::now();
        let _ = s.handle().send(handle.pid(), guest.stop_topic(), Payload::empty());
        if handle.join_timeout(WAIT_CAP).is_some() {
            wakes.push(sent.elapsed().as_secs_f64() * 1e6);
        }
    }
    wakes.sort_by(f64::total_cmp);
    let percentile =
        |p: f64| wakes.get(((wakes.len() as f64 * p) as usize).min(wakes.len().saturating_sub(1))).copied();
    let (wake_p50, wake_p99) = (percentile(0.5).unwrap_or(f64::NAN), percentile(0.99).unwrap_or(f64::NAN));
    println!("{label}: {} wakes timed: p50 {wake_p50:.1} µs, p99 {wake_p99:.1} µs", wakes.len());
    let result = json!({
        "wake_p50_us": wake_p50,
        "wake_p99_us": wake_p99,
        "hibernated_whole": whole.hibernated,
        "spawned": spawned,
        "rss_kib_per": rss_per,
        "arenas_kib_per": per(arena),
        "pte_kib_per": pte_per,
        "first_steps_ms": elapsed.as_secs_f64() * 1e3,
        "hibernated": hibernated,
        "stopped": failure,
    });
    println!("@result {result}");
    let release = Instant::now();
    for pid in pids {
        let _ = s.handle().send(pid, guest.stop_topic(), Payload::empty());
    }
    let drained = s.handle().wait_idle(Some(WAIT_CAP));
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
/// arena, which holds every linear memory, and the fiber-stack arena with it (the two
/// are anonymous mappings with the same flags, placed side by side, so the kernel
/// merges them into one).
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
    let sample_every = (u64::from(count) / SAMPLES).max(1);
    let mut instances = Vec::with_capacity(count as usize);
    let mut failure = None;
    for pid in 1..=u64::from(count) {
        if pid > 1 && (pid - 1) % sample_every == 0 {
            println!("@sample {} {}", pid - 1, status_kib("VmRSS").saturating_sub(rss_before));
        }
        let mut store = Store::new(&raw.engine, RawState::new());
        store.limiter(|state| &mut state.limiter);
        watch(&mut store);
        let guest = match raw.pre.instantiate(&mut store) {
            Ok(guest) => guest,
            Err(e) => {
                failure = Some(format!("instance {pid} failed: {e:#}"));
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
    println!("@sample {} {}", instances.len(), rss.saturating_sub(rss_before));
    let (rss_per, pte_per) = (rss.saturating_sub(rss_before) as f64 / n, pte.saturating_sub(pte_before) as f64 / n);
    println!(
        "{label}: {} instances; RSS {rss_per:.1} KiB an instance; page tables {pte_per:.1} KiB an instance; \
         {} memory maps an instance",
        instances.len(),
        maps_per(maps_before, maps, instances.len()),
    );
    if let Some(failure) = &failure {
        println!("{label}: {failure}");
    }
    let result =
        json!({ "spawned": instances.len(), "rss_kib_per": rss_per, "pte_kib_per": pte_per, "stopped": failure });
    println!("@result {result}");
}
