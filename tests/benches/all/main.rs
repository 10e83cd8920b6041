//! Every benchmark of wasmproc in one run, each against its baseline measured in the
//! same run: a table on stdout, `target/bench/results.json` and SVG plots beside it.
//!
//! ```text
//! cargo bench -p wasmproc-tests --bench all [-- FILTER...]
//!
//! FILTER      run only the benchmarks whose names contain one of these
//!             (`scheduler/`, `wasm/`, `sandbox/`, `idle/`, `cli/`, `tree`, `w1`, …)
//! WORKERS=n   worker threads (and raw-side threads), default 2: the CI machine class;
//!             lifecycles and steps are also measured at every count from 1 to n
//! RUNS=n      measured runs a side after one warm-up a side, default 5
//! QUICK=1     counts divided by 10, 2 runs, idle at 1k and 10k: for development only,
//!             the figures are not comparable with a full run's
//! WASMTIME=p  the wasmtime CLI of the cold-start baseline (else `wasmtime` on PATH)
//! DURABLE_WINDOW_US=n
//!             the journal's group window for `durable/` (default: the library's, 0)
//! RAW_KEEP_RESIDENT=bytes, RAW_COW=0
//!             what-if engine settings for the raw wasmtime side only
//! TAIL_ONLY=a,b
//!             `sandbox/tail-…`: only these of the hostile guests that misbehave once
//! SERVICE_WASMPROC=p
//!             `service/`, `console/`: run this `wasmproc` binary as the server instead of building
//!             this workspace's (to alternate an older build against a newer one)
//! ```
//!
//! A paired benchmark runs each side once to warm up, then alternates the sides so that
//! drift on the machine (frequency, other load) affects both alike; a record holds the
//! median, min and max of the runs, the baseline's median, the ratio of wasmproc's cost
//! to the baseline's and the goal (see `wasmproc_tests::bench::Record` and
//! BENCHMARKS.md). The modules, in the order they run:
//!
//! - [`scheduler`]: the scheduler alone, with native processes, against tokio;
//! - [`links`]: a spawn with `link` against one with `monitor`, and a ring of linked
//!   processes that fails as one;
//! - [`supervision`]: a supervised child's restart latency against a plain spawn's;
//! - [`wasm`]: Wasm processes against raw wasmtime, and the sandbox against itself;
//! - [`tail`]: well-behaved processes' latency beside hostile guests, against quiet;
//! - [`durable`]: Wasm processes with a journal against the same without;
//! - [`snapshot`]: resuming a workflow of a million steps from its snapshot, against
//!   from every step;
//! - [`kv`]: the `kv` provider's round trip against the store's own read rate;
//! - [`http`]: an `http` provider call against a direct request with the same client;
//! - [`cluster`]: two nodes over a real `nats-server` against one node and raw NATS;
//! - [`idle`]: memory per idle process, each count in a child process;
//! - [`suspend`]: memory per suspended durable process and its wake latency, each count
//!   in a child process;
//! - [`languages`]: Rust, Python and JavaScript guests side by side;
//! - [`cli`]: `wasmproc run` against `wasmtime run`, cold;
//! - [`service`]: `wasmproc serve`'s HTTP API against the library, and against Restate
//!   when node and npm can install it;
//! - [`console`]: the console's page in headless chromium with 100,000 workflows in the
//!   server: its weight and its time to first render, against their budgets;
//! - [`plot`]: the SVGs drawn from what the others measured.

mod cli;
mod cluster;
mod console;
mod durable;
mod http;
mod idle;
mod jetstream;
mod kv;
mod languages;
mod links;
mod plot;
mod scheduler;
mod service;
mod snapshot;
mod supervision;
mod suspend;
mod tail;
mod wasm;

use std::path::PathBuf;

use serde_json::json;
use wasmproc_tests::bench::{Options, Report, human};

/// Runs a side makes before it is measured: the first run of a workload pays for code
/// and allocator pages the others find ready.
pub(crate) const WARMUP: usize = 1;

fn main() {
    if let Ok(task) = std::env::var(idle::CHILD_ENV) {
        if task.starts_with("suspended ") {
            suspend::child(&task);
        } else {
            idle::child(&task);
        }
        return;
    }
    let options = Options::from_env();
    let out = target_dir().join("bench");
    let load_before = load_average();
    let cpu_before = cpu_times();
    println!(
        "wasmproc benchmarks: {} workers, {} runs a side after {WARMUP} warm-up{}; load average {load_before}",
        options.workers,
        options.runs,
        if options.quick { ", QUICK (not comparable with a full run)" } else { "" },
    );
    println!("ratio: wasmproc's cost over the baseline's (time, or memory for `idle/`): below 1, wasmproc wins");
    println!("{}", Report::header());
    let mut report = Report::default();
    let mut plots = plot::Plots::default();
    scheduler::run(&options, &mut report);
    links::run(&options, &mut report);
    supervision::run(&options, &mut report);
    wasm::run(&options, &mut report, &mut plots);
    tail::run(&options, &mut report);
    durable::run(&options, &mut report);
    snapshot::run(&options, &mut report);
    jetstream::run(&options, &mut report);
    kv::run(&options, &mut report);
    http::run(&options, &mut report);
    cluster::run(&options, &mut report);
    idle::run(&options, &mut report, &mut plots);
    suspend::run(&options, &mut report);
    languages::run(&options, &mut report);
    cli::run(&options, &mut report);
    service::run(&options, &mut report);
    console::run(&options, &mut report);
    let load_after = load_average();
    let steal = cpu_times().zip(cpu_before).map(|(after, before)| after.steal_since(&before));

    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("failed to create `{}`: {e}", out.display()));
    let mut results = report.to_json(&options);
    results["load_average"] = json!({ "before": load_before, "after": load_after });
    results["cpu_steal"] = json!(steal);
    let path = out.join("results.json");
    let text = serde_json::to_string_pretty(&results).expect("the results serialise");
    std::fs::write(&path, text + "\n").unwrap_or_else(|e| panic!("failed to write `{}`: {e}", path.display()));
    println!();
    println!("load average after: {load_after}");
    if let Some(steal) = steal {
        // Time the hypervisor gave this VM's CPUs to others: a share of it makes every
        // figure slower, both sides alike only as far as the alternation evens it out.
        println!("CPU time stolen by the hypervisor during the run: {:.0}%", steal * 100.0);
    }
    println!("wrote {}", path.display());
    match plot::write(&plots, &out) {
        Ok(files) => files.iter().for_each(|f| println!("wrote {}", f.display())),
        Err(e) => println!("the plots could not be drawn: {e}"),
    }
    let missed: Vec<_> = report.records.iter().filter(|r| r.met() == Some(false)).collect();
    if !missed.is_empty() {
        println!("goals not met:");
        for record in missed {
            let ratio = record.ratio.map(|r| format!(", {r:.2}× the baseline")).unwrap_or_default();
            println!("  {}: {} {}{ratio}; goal {}", record.name, human(record.median), record.unit, record.goal_text());
        }
    }
}

/// The workspace's target directory, wherever `CARGO_TARGET_DIR` put it: the nearest
/// ancestor of this executable that cargo marked with its `CACHEDIR.TAG`.
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench knows its own path");
    exe.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        // `<target>/release/deps/all-<hash>` when cargo left no tag.
        .or_else(|| exe.ancestors().nth(3))
        .expect("the bench runs from a target directory")
        .to_path_buf()
}

/// `/proc/loadavg`'s first three fields: the machine's load while the figures were taken.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The machine's CPU time so far, from the first line of `/proc/stat`.
struct CpuTimes {
    total: u64,
    steal: u64,
}

impl CpuTimes {
    /// The share of the CPU time since `before` that the hypervisor stole.
    fn steal_since(&self, before: &CpuTimes) -> f64 {
        let total = self.total.saturating_sub(before.total);
        if total == 0 { 0.0 } else { self.steal.saturating_sub(before.steal) as f64 / total as f64 }
    }
}

/// `None` where `/proc/stat` is missing or has no steal field (not Linux, or too old).
fn cpu_times() -> Option<CpuTimes> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; guest time
    // is already counted in user time.
    let fields: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).map_while(|f| f.parse().ok()).collect();
    let steal = *fields.get(7)?;
    Some(CpuTimes { total: fields.iter().take(8).sum(), steal })
}

/// A count as it appears in a benchmark's name: `1M`, `200k`, `100`.
pub(crate) fn short(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}
