//! The tail: how long well-behaved processes wait while hostile guests run beside them.
//!
//! `sandbox/tail-beside-hostile`: a thousand `hello add` processes, spawned ten at a time
//! and each timed from spawn to result, while every misbehaviour of `examples-wasm/hostile`
//! runs at once on the same workers (an endless loop, a memory bomb, a stack overflow, deep
//! recursion, a panic, a flood of yields, a giant payload, a message flood into a victim, a
//! spawn bomb held to its quota). `sandbox/tail-beside-a-loop`: the same thousand beside one
//! endless loop. The baseline of both is the same thousand on the same scheduler with
//! nothing else running, measured in the same run. Each side is one run of a thousand (the
//! hostile guests cannot be made to misbehave the same way twice in one scheduler); the
//! figure is the p99 of the thousand, the goal is the issue's: at most 10 ms beside every
//! hostile guest.

use std::time::Duration;

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Config, Runtime};
use wasmproc::{Payload, Scheduler};
use wasmproc_tests::bench::{Condition, Options, Record, Report};
use wasmproc_tests::guests::{HELLO, HOSTILE};
use wasmproc_tests::{HANG, good_thousand as good};

/// The guests that misbehave once each, by entry, as `tests/all/sandbox.rs` runs them.
const HOSTILE_ENTRIES: [&str; 7] =
    ["spin", "memory-bomb", "stack-overflow", "deep-recursion", "panic", "yield-flood", "giant-payload"];

pub fn run(options: &Options, report: &mut Report) {
    let beside_all = "sandbox/tail-p99-beside-hostile";
    let beside_loop = "sandbox/tail-p99-beside-a-loop";
    if !options.selected(beside_all) && !options.selected(beside_loop) {
        return;
    }
    let s = scheduler(options.workers);
    // The quiet side first, after one warm-up thousand: nothing else on the workers.
    good(&s, 0);
    let quiet = p99(good(&s, 1));

    if options.selected(beside_all) {
        let victim = spawn(&s, "busy", vec![Payload::json(&0).unwrap()]);
        let bomb = spawn(&s, "spawn-bomb", vec![]);
        // `TAIL_ONLY=spin,panic`: only those of the seven, to see what each one costs.
        let only = std::env::var("TAIL_ONLY").unwrap_or_default();
        let chosen = |entry: &&&str| only.is_empty() || only.split(',').any(|o| o == **entry);
        let hostile: Vec<_> = HOSTILE_ENTRIES.iter().filter(chosen).map(|entry| spawn(&s, entry, vec![])).collect();
        let flood = spawn(&s, "message-flood", vec![Payload::text(victim.pid().as_u64().to_string())]);
        let measured = p99(good(&s, 2));
        for process in hostile.iter().chain([&flood, &victim]) {
            let _ended = process.join_timeout(HANG).expect("each hostile guest is stopped or ends");
        }
        s.handle().terminate(bomb.pid()).expect("the bomb's root lives until terminated");
        report.push(tail(beside_all, measured, quiet).goal(Condition::median_at_most(10.0)));
    }
    if options.selected(beside_loop) {
        let spinner = spawn(&s, "spin-unbounded", vec![]);
        let measured = p99(good(&s, 3));
        assert!(spinner.try_result().is_none(), "the loop ran beside every one of them");
        s.handle().terminate(spinner.pid()).expect("the loop runs until terminated");
        report.push(tail(beside_loop, measured, quiet));
    }
    s.stop(Duration::from_secs(1));
}

/// The sandbox test's scheduler: a CPU budget for the guests that misbehave once, none
/// for the endless loop (kind `loop`, entry `spin`).
fn scheduler(workers: usize) -> Scheduler {
    let runtime = |config: Config| Runtime::new(config.no_disk_cache()).expect("the runtime starts");
    let bounded = runtime(Config::default().cpu_budget(Duration::from_secs(5)));
    let unbounded = runtime(Config::default());
    let load =
        |runtime: &Runtime, path: &str| runtime.load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"));
    Scheduler::builder()
        .workers(workers)
        .max_descendants(200)
        .mailbox_capacity(64)
        .kind("hostile", load(&bounded, HOSTILE))
        .kind("loop", load(&unbounded, HOSTILE))
        .kind("hello", load(&bounded, HELLO))
        .build()
        .expect("the scheduler starts")
}

fn spawn(s: &Scheduler, entry: &str, input: Vec<Payload>) -> wasmproc::scheduler::ProcessHandle {
    let (kind, entry) = match entry {
        "spin-unbounded" => ("loop", "spin"),
        entry => ("hostile", entry),
    };
    s.handle()
        .spawn(Spawnable::kind(kind), SpawnOptions::new(entry).input(input))
        .unwrap_or_else(|e| panic!("`{entry}` starts: {e}"))
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort();
    latencies[(latencies.len() - 1) * 99 / 100]
}

fn tail(name: &str, measured: Duration, quiet: Duration) -> Record {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Record::single(name, "ms", ms(measured)).with_baseline(ms(quiet), ms(measured) / ms(quiet))
}
