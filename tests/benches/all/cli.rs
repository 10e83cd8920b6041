//! Cold start: a whole `wasmproc run` of a module whose compiled code is cached, against
//! `wasmtime run` of the same program.
//!
//! The wasmtime CLI is taken from `WASMTIME` (a path), else from `PATH`; without it the
//! records have no baseline. 20 runs a side (a cold start is short and noisy; `RUNS` if
//! larger, 5 in quick mode) after 3 warm-ups each.
//!
//! Programs, each run as a fresh OS process with its output captured:
//! - `wasi-cli`: `examples-wasm/wasi-cli`, a plain WASI command (a `wasi:cli/run`
//!   component) printing its arguments: the same file for both CLIs, each with its own
//!   compile cache warm;
//! - the same, precompiled by each CLI (`wasmproc compile`, `wasmtime compile`);
//! - `hello greet`: a process of the `wasmproc:process` world (wasmproc only: wasmtime
//!   cannot run the world), against the `wasi-cli` baseline as the nearest equivalent.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wasmproc_tests::bench::{Condition, Options, Record, Report, measure, measure_pair};

const WASI_CLI: &str = env!("GUEST_WASI_CLI");
const HELLO: &str = env!("GUEST_HELLO");
const WARMUP: usize = 3;

/// Measures the selected cold starts into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let names = ["cli/cold-start-wasi-cli", "cli/cold-start-precompiled", "cli/cold-start-hello"];
    if !names.iter().any(|n| options.selected(n)) {
        return;
    }
    let runs = if options.quick { 5 } else { options.runs.max(20) };
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-cli");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("the scratch directory can be made");
    let wasmproc = build_wasmproc();
    let wasmtime = find_wasmtime();

    let ours = |args: &[&str]| {
        let mut command = Command::new(&wasmproc);
        command.args(args).env("XDG_CACHE_HOME", scratch.join("wasmproc-cache"));
        command
    };
    let theirs = |args: &[&str]| {
        let mut command = Command::new(wasmtime.as_deref().unwrap_or(Path::new("wasmtime")));
        command.args(args).env("XDG_CACHE_HOME", scratch.join("wasmtime-cache"));
        command
    };

    let our_cwasm = scratch.join("wasi-cli.wasmproc.cwasm");
    let their_cwasm = scratch.join("wasi-cli.wasmtime.cwasm");
    check(ours(&["compile", WASI_CLI, "-o", our_cwasm.to_str().expect("utf-8")]));
    let our_cwasm = our_cwasm.to_str().expect("utf-8");
    let their_cwasm = their_cwasm.to_str().expect("utf-8");
    // A wasmtime CLI built without its `compile` feature cannot precompile: that pair
    // then has no baseline.
    let their_compile = wasmtime.is_some()
        && theirs(&["compile", WASI_CLI, "-o", their_cwasm]).output().is_ok_and(|o| o.status.success());
    if wasmtime.is_some() && !their_compile {
        println!("  this wasmtime CLI cannot `compile`: the precompiled pair has no baseline");
    }

    let pairs: [(&str, Command, Command, bool); 2] = [
        (
            names[0],
            ours(&["run", WASI_CLI, "--", "hello"]),
            theirs(&["run", "-C", "cache=y", WASI_CLI, "hello"]),
            wasmtime.is_some(),
        ),
        (
            names[1],
            ours(&["run", our_cwasm, "--", "hello"]),
            theirs(&["run", "--allow-precompiled", their_cwasm, "hello"]),
            their_compile,
        ),
    ];
    let mut baseline = None;
    for (name, mut a, mut b, with_baseline) in pairs {
        if !options.selected(name) {
            continue;
        }
        if !with_baseline {
            report.push(Record::time(name, &measure(runs, WARMUP, &mut || time(&mut a)), None));
            continue;
        }
        let (ours, theirs) = measure_pair(runs, WARMUP, &mut || time(&mut a), &mut || time(&mut b));
        let mut record = Record::time(name, &ours, Some(&theirs));
        if name == names[0] {
            record = record.goal(Condition::ratio_at_most(1.2));
            baseline = Some(theirs);
        }
        report.push(record);
    }
    if options.selected(names[2]) {
        let mut hello = ours(&["run", HELLO, "--method", "greet", "--input", "\"bench\""]);
        let sample = measure(runs, WARMUP, &mut || time(&mut hello));
        // wasmtime cannot run the process world: its wasi-cli time is the nearest baseline.
        report.push(Record::time(names[2], &sample, baseline.as_ref()));
    }
}

/// Builds the `wasmproc` binary of this workspace, optimised, and returns its path.
///
/// Built with this bench named beside it: cargo then resolves features as for this
/// bench's own build, and reuses what that build compiled. A build of the binary alone
/// resolves them for the host package alone, and compiles a second wasmtime (minutes).
pub(crate) fn build_wasmproc() -> PathBuf {
    // This bench is `<target>/release/deps/all-<hash>`.
    let exe = std::env::current_exe().expect("the bench knows its path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--profile", "bench", "-p", "wasmproc", "--bin", "wasmproc"])
        .args(["-p", "wasmproc-tests", "--bench", "all"])
        .arg("--target-dir")
        .arg(profile_dir.parent().expect("<target>"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building wasmproc failed");
    profile_dir.join("wasmproc")
}

fn find_wasmtime() -> Option<PathBuf> {
    let candidate = std::env::var_os("WASMTIME").map(PathBuf::from).unwrap_or_else(|| "wasmtime".into());
    let works = Command::new(&candidate).arg("--version").output().is_ok_and(|o| o.status.success());
    if !works {
        println!("no wasmtime CLI (set WASMTIME=/path/to/wasmtime): printing wasmproc's figures only");
    }
    works.then_some(candidate)
}

/// Runs `command` once (it must succeed) and returns its wall time.
fn time(command: &mut Command) -> Duration {
    let start = Instant::now();
    let output = command.stdin(Stdio::null()).output().expect("the CLI runs");
    let elapsed = start.elapsed();
    assert!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    elapsed
}

fn check(mut command: Command) {
    time(&mut command);
}
