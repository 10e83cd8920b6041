//! Cold start: a whole `wasmproc run` of a module whose compiled code is cached, against
//! `wasmtime run` of the same program, in one run.
//!
//! `cargo bench -p wasmproc-tests --bench cli`. The wasmtime CLI is taken from `WASMTIME`
//! (a path), else from `PATH`; without it only wasmproc's figures are printed.
//! `RUNS=n` sets the measured runs per side (default 20, after 3 warm-ups each).
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

use wasmproc_tests::bench::{Sample, measure_pair};

const WASI_CLI: &str = env!("GUEST_WASI_CLI");
const HELLO: &str = env!("GUEST_HELLO");
const WARMUP: usize = 3;

fn main() {
    let runs = std::env::var("RUNS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(20);
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
    // is then left out.
    let their_compile = wasmtime.is_some()
        && theirs(&["compile", WASI_CLI, "-o", their_cwasm]).output().is_ok_and(|o| o.status.success());
    if wasmtime.is_some() && !their_compile {
        println!("this wasmtime CLI cannot `compile`: the precompiled pair is left out");
    }

    println!("cold start, {runs} runs a side after {WARMUP} warm-ups; median (min–max)");
    println!("{:<34} {:>24} {:>24} {:>7}", "program", "wasmproc run", "wasmtime run", "ratio");
    let pairs: [(&str, Command, Command); 2] = [
        (
            "wasi-cli (cached compile)",
            ours(&["run", WASI_CLI, "--", "hello"]),
            theirs(&["run", "-C", "cache=y", WASI_CLI, "hello"]),
        ),
        (
            "wasi-cli (precompiled)",
            ours(&["run", our_cwasm, "--", "hello"]),
            theirs(&["run", "--allow-precompiled", their_cwasm, "hello"]),
        ),
    ];
    let mut baseline = None;
    for (name, mut a, mut b) in pairs {
        if name.contains("precompiled") && wasmtime.is_some() && !their_compile {
            continue;
        }
        if wasmtime.is_none() {
            let sample = measure(runs, &mut a);
            println!("{name:<34} {:>24} {:>24}", sample.to_string(), "(no wasmtime CLI)");
            continue;
        }
        let (ours, theirs) = measure_pair(runs, WARMUP, &mut || time(&mut a), &mut || time(&mut b));
        println!("{name:<34} {:>24} {:>24} {:>6.2}×", ours.to_string(), theirs.to_string(), ours.ratio(&theirs));
        baseline.get_or_insert(theirs);
    }
    let hello = measure(runs, &mut ours(&["run", HELLO, "--method", "greet", "--input", "\"bench\""]));
    match baseline {
        Some(theirs) => println!(
            "{:<34} {:>24} {:>24} {:>6.2}×",
            "hello greet (process world)",
            hello.to_string(),
            format!("{theirs} *"),
            hello.ratio(&theirs)
        ),
        None => println!("{:<34} {:>24}", "hello greet (process world)", hello.to_string()),
    }
    if baseline.is_some() {
        println!("* wasmtime cannot run the process world: its wasi-cli time above is the nearest baseline");
    }
}

/// Builds the release `wasmproc` binary of this workspace and returns its path.
fn build_wasmproc() -> PathBuf {
    // This bench is `<target>/release/deps/cli-<hash>`.
    let exe = std::env::current_exe().expect("the bench knows its path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--release", "-p", "wasmproc", "--bin", "wasmproc"])
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

fn measure(runs: usize, command: &mut Command) -> Sample {
    for _ in 0..WARMUP {
        time(command);
    }
    Sample::of((0..runs).map(|_| time(command)).collect())
}

fn check(mut command: Command) {
    time(&mut command);
}
