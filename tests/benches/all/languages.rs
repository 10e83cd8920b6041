//! Guests in Rust, Python and JavaScript side by side: the same fan-out (`main(n)` spawns
//! `n` `square` children and gathers their results; `examples-wasm/fan-out`,
//! `examples-python/squares.py`, `examples-js/squares.js`) and the same `idle` entry
//! (the Rust side's is the bench guest's, `examples-wasm/bench`). For each language:
//!
//! - `lang/size-<lang>`: the component's size;
//! - `lang/cold-compile-<lang>`: `Runtime::load` with no cache: compiling the component,
//!   checking it against the world and asking it for its entries (runs without warm-up,
//!   at most 3: the JavaScript guest takes half a minute);
//! - `lang/cached-start-<lang>`: a new runtime loading the component from a warm disk
//!   cache and running `main(1)` to its end: what `wasmproc run` costs a cached program,
//!   without the process start of the binary;
//! - `lang/spawn-<lang>`: `main(200)` on `WORKERS` workers, over 200: one child's
//!   instantiation, `init`, step and exit, and its share of the parent's steps;
//! - `lang/idle-memory-<lang>`: memory added by `idle` processes that have run their
//!   first step and wait for a message, per process (200 of them; 20 with `QUICK`): the
//!   growth of the proportional set size (`Pss`) and the page tables. Not RSS: a page of
//!   a component's memory image shared by every process that reads it (`image.rs` in the
//!   host) would count in RSS once for each of them.
//!
//! The figures have no baseline: Rust's are the reference the others are read against
//! (BENCHMARKS.md).

use std::path::Path;
use std::time::{Duration, Instant};

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Payload, Scheduler};
use wasmproc_tests::bench::{Options, Record, Report, measure};

use crate::target_dir;

/// The languages: name, fan-out guest, idle guest.
const LANGUAGES: [(&str, &str, &str); 3] = [
    ("rust", env!("GUEST_FAN_OUT"), env!("GUEST_BENCH")),
    ("python", env!("GUEST_PY_SQUARES"), env!("GUEST_PY_SQUARES")),
    ("javascript", env!("GUEST_JS_SQUARES"), env!("GUEST_JS_SQUARES")),
];

/// Children of the spawn benchmark.
const CHILDREN: u64 = 200;

/// How long a run may take before the bench calls it a hang.
const HANG: Duration = Duration::from_secs(300);

/// Measures the selected languages' figures into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let cache = target_dir().join("bench").join("languages-cache");
    for (language, guest, idle_guest) in LANGUAGES {
        let name = |what: &str| format!("lang/{what}-{language}");
        if !["size", "cold-compile", "cached-start", "spawn", "idle-memory"].iter().any(|w| options.selected(&name(w)))
        {
            continue;
        }
        let bytes = std::fs::metadata(guest).unwrap_or_else(|e| panic!("`{guest}`: {e}")).len();
        report.push(Record::single(name("size"), "MiB", bytes as f64 / (1024.0 * 1024.0)));

        if options.selected(&name("cold-compile")) {
            let sample = measure(options.runs.min(3), 0, &mut || {
                let runtime = Runtime::new(config().no_disk_cache().max_instances(1)).expect("the runtime starts");
                let start = Instant::now();
                load(&runtime, guest);
                start.elapsed()
            });
            report.push(Record::time(name("cold-compile"), &sample, None));
        }

        // Fills the cache for what follows.
        let _ = std::fs::remove_dir_all(&cache);
        load(&cached_runtime(&cache), guest);
        load(&cached_runtime(&cache), idle_guest);

        if options.selected(&name("cached-start")) {
            let sample = measure(options.runs, 1, &mut || {
                let start = Instant::now();
                let component = load(&cached_runtime(&cache), guest);
                fan_out(&component, 1, options.workers);
                start.elapsed()
            });
            report.push(Record::time(name("cached-start"), &sample, None));
        }

        let component = load(&cached_runtime(&cache), guest);
        if options.selected(&name("spawn")) {
            let children = if options.quick { CHILDREN / 10 } else { CHILDREN };
            let sample = measure(options.runs, 1, &mut || fan_out(&component, children, options.workers));
            let per_child = |d: Duration| d.as_secs_f64() * 1e6 / children as f64;
            let mut record = Record::single(name("spawn"), "µs", per_child(sample.median));
            (record.min, record.max) = (per_child(sample.min), per_child(sample.max));
            report.push(record);
        }

        if options.selected(&name("idle-memory")) {
            let count = if options.quick { 20 } else { 200 };
            let idle = load(&cached_runtime(&cache), idle_guest);
            report.push(Record::single(name("idle-memory"), "KiB", idle_kib_per_process(&idle, count)));
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
}

/// The runtime settings of every side: the CLI's defaults, with the init time limit
/// raised so that a busy machine cannot fail a Python spawn (the figures are what they
/// cost, not whether they fit 100 ms).
fn config() -> Config {
    Config::default().init_time_limit(Duration::from_secs(10)).log_sink(|_: &wasmproc::wasm::LogRecord<'_>| {})
}

/// A runtime caching compiled code in `cache`.
fn cached_runtime(cache: &Path) -> Runtime {
    Runtime::new(config().cache_dir(cache)).expect("the runtime starts")
}

fn load(runtime: &Runtime, guest: &str) -> Component {
    runtime.load(guest).unwrap_or_else(|e| panic!("failed to load `{guest}`: {e:#}"))
}

/// Runs `main(n)` of `component` to its end on `workers` workers; how long it took.
fn fan_out(component: &Component, n: u64, workers: usize) -> Duration {
    let s =
        Scheduler::builder().workers(workers).kind("guest", component.clone()).build().expect("the scheduler starts");
    let start = Instant::now();
    let options = SpawnOptions::new("main").input(vec![Payload::json(&n).expect("a number serialises")]);
    let process = s.handle().spawn(Spawnable::kind("guest"), options).expect("`main` spawns");
    let result = process.join_timeout(HANG).expect("`main` ends");
    let took = start.elapsed();
    let squares: Vec<u64> = result.expect("`main` succeeds").decode().expect("a list of squares");
    assert_eq!(squares.len() as u64, n);
    s.stop(Duration::from_secs(1));
    took
}

/// Memory (`Pss` and page tables) added per process by `count` processes of `component`
/// waiting in `idle` after their first step.
fn idle_kib_per_process(component: &Component, count: u64) -> f64 {
    let s = Scheduler::builder().workers(1).kind("guest", component.clone()).build().expect("the scheduler starts");
    let rss_before = memory_kib();
    let mut processes = Vec::new();
    for _ in 0..count {
        let options = SpawnOptions::new("idle").input(vec![Payload::json(&()).expect("null serialises")]);
        processes.push(s.handle().spawn(Spawnable::kind("guest"), options).expect("`idle` spawns"));
    }
    let deadline = Instant::now() + HANG;
    while s.handle().stats().workers.iter().map(|w| w.executed).sum::<u64>() < count {
        assert!(Instant::now() < deadline, "the idle processes did not all step");
        std::thread::sleep(Duration::from_millis(10));
    }
    let per = memory_kib().saturating_sub(rss_before) as f64 / count as f64;
    s.stop(Duration::from_secs(5));
    drop(processes);
    per
}

/// This process's proportional set size (a page mapped by several mappings counted
/// once) and page tables, in KiB.
fn memory_kib() -> u64 {
    let field = |path: &str, name: &str| -> u64 {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("`{path}`: {e}"));
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` in `{path}`"))
    };
    field("/proc/self/smaps_rollup", "Pss:") + field("/proc/self/status", "VmPTE:")
}
