//! The `wasmproc` binary, run as a user runs it: every subcommand, every exit code, and
//! the bad inputs a user will try (missing file, not Wasm, wrong world, unknown method,
//! invalid JSON, bad sizes and durations, unknown flags).
//!
//! An integration test of the host package, so that cargo builds the binary for it, in
//! the same build and with the same features as everything else: a `cargo build` of the
//! binary from inside a test resolves features for the host package alone, which
//! compiles a second wasmtime (gigabytes of disk, minutes of CI).

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmproc_tests::HANG;
use wasmproc_tests::guests::{FAN_OUT, HELLO, HOSTILE, TIMERS, WASI_CLI};

mod cache;
mod cluster;
mod console;
mod durable;
mod hardening;
mod languages;
mod limits;
mod new_user;
mod providers;
mod rough_edges;
mod service;
mod supervise;

const BINARY: &str = env!("CARGO_BIN_EXE_wasmproc");

/// A scratch directory of the test's own, emptied. The same for every run of the test, so
/// a run clears what the last one left instead of adding a directory of its own.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the scratch directory can be made");
    dir
}

/// `wasmproc` with `args`, its compile cache and the cache's key in the test's scratch
/// space (shared by the tests so each guest compiles once; never the user's own).
fn wasmproc(args: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    command.args(args).env("XDG_CACHE_HOME", tmp.join("cli-cache")).env("XDG_CONFIG_HOME", tmp.join("cli-config"));
    command
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Ran {
    finish(wasmproc(args).stdin(Stdio::null()).output().expect("wasmproc runs"))
}

fn finish(output: Output) -> Ran {
    Ran {
        code: output.status.code().expect("wasmproc exits (not killed by a signal)"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

impl Ran {
    /// Asserts the exit code, showing everything when it is not the expected one.
    #[track_caller]
    fn expect(self, code: i32) -> Ran {
        assert_eq!(self.code, code, "exit code; stdout: {}\nstderr: {}", self.stdout, self.stderr);
        self
    }

    /// Asserts that stderr has exactly one `error:` line and that it contains `text`.
    #[track_caller]
    fn error_says(self, text: &str) -> Ran {
        let errors: Vec<&str> = self.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "one error line expected; stderr: {}", self.stderr);
        assert!(errors[0].contains(text), "the error should say {text:?}; it says: {}", errors[0]);
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

// --- run: results and exit codes -------------------------------------------------------

#[test]
fn run_prints_the_result_as_json_and_exits_0() {
    let ran = run(&["run", HELLO, "--method", "greet", "--input", "\"wasmproc\""]).expect(0);
    assert_eq!(ran.stdout, "\"hello, wasmproc\"\n");
    let ran = run(&["run", HELLO, "-m", "add", "-i", "[2, 40]", "--json"]).expect(0);
    assert_eq!(ran.json(), serde_json::json!({"ok": 42}));
}

#[test]
fn run_takes_input_from_a_file_and_from_stdin() {
    let dir = scratch("input");
    let file = dir.join("input.json");
    std::fs::write(&file, "[20, 22]").expect("write the input");
    let ran = run(&["run", HELLO, "--method", "add", "--input-file", file.to_str().expect("utf-8")]).expect(0);
    assert_eq!(ran.stdout.trim(), "42");

    let mut child = wasmproc(&["run", HELLO, "--method", "add", "--input-file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wasmproc runs");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"[1, 2]").expect("write stdin");
    let ran = finish(child.wait_with_output().expect("wasmproc ends")).expect(0);
    assert_eq!(ran.stdout.trim(), "3");
}

#[test]
fn a_failing_process_exits_1_with_its_error() {
    // `add` fails on a sum past an i64.
    let ran = run(&["run", HELLO, "--method", "add", "--input", "[9223372036854775807, 1]"]).expect(1);
    let ran = ran.error_says("error: process ").error_says(" returned an error: ");
    assert!(ran.stdout.is_empty(), "no result on stdout: {}", ran.stdout);
    let ran = run(&["run", HELLO, "--method", "add", "--input", "[9223372036854775807, 1]", "--json"]).expect(1);
    let json = ran.json();
    assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{}", ran.stdout);
    assert_eq!(json["exit"]["reason"], "error", "{json}");
    assert!(json["exit"]["error"].as_str().is_some_and(|e| !e.is_empty()), "{json}");
}

#[test]
fn a_fuel_budget_ends_the_process_that_spends_it() {
    run(&["run", FAN_OUT, "--input", "50", "--fuel", "20000"]).expect(1).error_says("fuel budget exhausted");
    let ran = run(&["run", FAN_OUT, "--input", "3", "--fuel", "100000000"]).expect(0);
    assert_eq!(ran.stdout.trim(), "[0,1,4]");
}

#[test]
fn a_looping_process_is_preempted_and_ended_by_its_cpu_budget() {
    run(&["run", HOSTILE, "--method", "spin", "--time-slice", "5", "--cpu-budget", "100ms"])
        .expect(1)
        .error_says("CPU budget exceeded: the process ran for longer than its `--cpu-budget` of 100ms");
    run(&["run", HOSTILE, "--method", "spin", "--time-slice", "50ms", "--no-preemption"])
        .expect(1)
        .error_says("time slice exceeded: `step` ran longer than the process's `--time-slice` of 50ms");
}

#[test]
fn stats_count_processes_and_yields_by_command() {
    let ran = run(&["run", FAN_OUT, "--input", "20", "--stats", "--json"]).expect(0);
    let out = ran.json();
    assert_eq!(out["ok"].as_array().map(Vec::len), Some(20));
    let stats = &out["stats"];
    assert_eq!(stats["processes"], 21, "{stats}");
    assert_eq!(stats["yields_by_command"]["spawn"], 20, "{stats}");
    assert!(stats["steps"].as_u64().is_some_and(|steps| steps >= 21), "{stats}");
    assert_eq!(stats["workers"].as_array().map(Vec::len), stats["workers"].as_array().map(|w| w.len().max(1)));

    let ran = run(&["run", FAN_OUT, "--input", "5", "--stats", "--workers", "2"]).expect(0);
    for line in ["processes   6", "yields      5: spawn 5", "hibernated  ", "worker 0", "worker 1", "wall time"] {
        assert!(ran.stderr.contains(line), "stats should show {line:?}: {}", ran.stderr);
    }
}

/// `timers` sleeping 100 ms and 200 ms is hibernated whole while it waits (the default
/// threshold, 10 ms), and with `--no-hibernate-instances` only gives back its stack.
#[test]
fn a_sleeping_process_is_hibernated_whole_unless_told_not_to() {
    let whole = |extra: &[&str]| {
        let mut args = vec!["run", TIMERS, "--input", "[200, 100]", "--stats", "--json"];
        args.extend_from_slice(extra);
        let ran = run(&args).expect(0);
        let stats = ran.json()["stats"].clone();
        (stats["hibernated_whole"].as_u64().expect("counted"), stats["woken_whole"].as_u64().expect("counted"))
    };
    let (hibernated, woken) = whole(&[]);
    assert!(hibernated >= 1 && woken == hibernated, "{hibernated} hibernated whole, {woken} woken");
    assert_eq!(whole(&["--no-hibernate-instances"]), (0, 0));
    assert_eq!(whole(&["--hibernate-after", "1h"]), (0, 0));
}

#[test]
fn timeout_stops_everything_and_exits_4() {
    // `timers` sleeps for each duration given; a minute is far past the timeout.
    let ran = run(&["run", TIMERS, "--input", "[60000]", "--timeout", "300ms"]).expect(4);
    assert!(ran.stderr.contains("timed out after 300ms"), "{}", ran.stderr);
    // A WASI command that never yields is stopped too, by the epoch.
    let ran = run(&["run", WASI_CLI, "--timeout", "300ms", "--", "--spin"]).expect(4);
    assert!(ran.stderr.contains("timed out"), "{}", ran.stderr);
}

#[test]
fn ctrl_c_stops_gracefully_and_exits_130() {
    let mut child = wasmproc(&["run", WASI_CLI, "--", "--spin"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wasmproc runs");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the program says it started");
    assert_eq!(line, "spinning\n");
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    let start = Instant::now();
    let output = loop {
        if child.try_wait().expect("wait works").is_some() {
            break child.wait_with_output().expect("output");
        }
        assert!(start.elapsed() < HANG, "wasmproc did not stop after Ctrl-C");
        std::thread::sleep(Duration::from_millis(10));
    };
    let ran = finish(output).expect(130);
    assert!(ran.stderr.contains("interrupted"), "{}", ran.stderr);
}

// --- run: bad input ----------------------------------------------------------------------

#[test]
fn usage_errors_exit_2_with_one_line_that_says_what_to_do() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", HELLO, "--method", "nope"], "no entry method `nope`: pass --method with one of: greet, add"),
        (&["run", HELLO, "--method", "add", "--input", "{oops"], "--input #1 is not valid JSON"),
        (&["run", HELLO, "--memory", "lots"], "is not a size: write a number with a unit, like 64MiB"),
        (&["run", HELLO, "--memory", "1KiB"], "at least 64KiB"),
        (&["run", HELLO, "--timeout", "5"], "needs a unit: write 500ms, 2s or 1m"),
        (&["run", HELLO, "--time-slice", "soon"], "is not a duration"),
        (&["run", "/no/such/app.wasm"], "cannot read `/no/such/app.wasm`"),
        (&["run", HELLO, "--allow", "launch.missiles"], "--allow `launch.missiles`: no such command"),
        (&["run", HELLO, "-m", "greet", "--", "x"], "arguments after `--` applies to WASI commands only"),
        (&["run", HELLO, "-m", "greet", "--dir", "/no/such/dir"], "--dir `/no/such/dir`: no such directory"),
        (&["run", HELLO, "-m", "greet", "--allow-host", "http://x/path"], "--allow-host `http://x/path`"),
        (&["run", HELLO, "-m", "greet", "--provider", "inventory"], "--provider `inventory`: write NAME=FILE"),
        (&["run", HELLO, "-m", "greet", "--provider", "kv=x.wasm"], "`kv` is a built-in family or command"),
        (&["run", WASI_CLI, "--kv", "/tmp/x"], "--kv gives process components a provider"),
        (&["run", HELLO, "--input-file", "/no/such/input.json"], "cannot read --input-file"),
        (&["run", WASI_CLI, "--input", "1"], "a WASI command takes no --input"),
        (&["run", WASI_CLI, "--method", "main"], "is a WASI command: it has no entry method `main`"),
        (&["run", WASI_CLI, "--env", "WASMPROC_SURELY_UNSET_VARIABLE"], "the host has no such variable"),
    ];
    for (args, says) in cases {
        let ran = run(args);
        assert_eq!(ran.code, 2, "{args:?}: stderr: {}", ran.stderr);
        let errors: Vec<&str> = ran.stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: one error line expected: {}", ran.stderr);
        assert!(errors[0].contains(says), "{args:?}: should say {says:?}: {}", errors[0]);
    }
}

#[test]
fn unknown_flags_and_subcommands_exit_2_and_point_at_help() {
    for args in [&["run", HELLO, "--frobnicate"][..], &["launch"][..], &["run"][..]] {
        let ran = run(args).expect(2);
        assert!(ran.stderr.contains("error:"), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains("--help"), "{args:?}: should point at --help: {}", ran.stderr);
    }
}

#[test]
fn bad_modules_exit_3() {
    let dir = scratch("bad-modules");
    let text = dir.join("notes.wasm");
    std::fs::write(&text, "just some text").expect("write");
    let no_start = dir.join("library.wasm");
    std::fs::write(&no_start, wat::parse_str("(module (func (export \"add\")))").expect("valid WAT")).expect("write");
    let other_world = dir.join("other.wasm");
    std::fs::write(&other_world, wat::parse_str("(component)").expect("valid WAT")).expect("write");
    let broken = dir.join("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\0\x01\0garbage").expect("write");

    let path = |p: &Path| p.to_str().expect("utf-8").to_owned();
    run(&["run", &path(&text)]).expect(3).error_says("not a WebAssembly file");
    run(&["run", &path(&no_start)]).expect(3).error_says("neither a WASI command nor a process");
    run(&["run", &path(&other_world)]).expect(3).error_says("does not fit the `wasmproc:process/process@0.2.1` world");
    run(&["run", &path(&broken)]).expect(3).error_says("failed to compile");
}

// --- WASI commands ----------------------------------------------------------------------

#[test]
fn wasi_commands_run_with_their_arguments_and_output_passed_through() {
    let ran = run(&["run", WASI_CLI, "--", "hello", "from", "wasi"]).expect(0);
    assert_eq!(ran.stdout, "hello from wasi\n", "stdout passes through untagged");
    assert!(ran.stderr.contains("wasi-cli: done"), "{}", ran.stderr);
    // WASI preview 2's `exit` carries success or failure only, so any failure is 1.
    run(&["run", WASI_CLI, "--", "--exit", "7"]).expect(1);
}

#[test]
fn wasi_commands_get_files_and_environment_only_when_granted() {
    let dir = scratch("wasi-grants");
    std::fs::write(dir.join("in.txt"), "granted text\n").expect("write");
    let host = dir.to_str().expect("utf-8");
    let guest_file = "/data/in.txt";

    let ran = run(&["run", WASI_CLI, "--", "--cat", guest_file]).expect(1);
    assert!(ran.stderr.contains("cannot read /data/in.txt"), "no directory without --dir: {}", ran.stderr);
    let mapping = format!("{host}::/data");
    let ran = run(&["run", WASI_CLI, "--dir", &mapping, "--", "--cat", guest_file]).expect(0);
    assert!(ran.stdout.starts_with("granted text\n"), "{}", ran.stdout);

    run(&["run", WASI_CLI, "--dir", &mapping, "--", "--write", "/data/out.txt"]).expect(1);
    assert!(!dir.join("out.txt").exists(), "--dir is read-only");
    run(&["run", WASI_CLI, "--dir-rw", &mapping, "--", "--write", "/data/out.txt"]).expect(0);
    assert_eq!(std::fs::read_to_string(dir.join("out.txt")).expect("written"), "written by wasi-cli\n");

    let ran = run(&["run", WASI_CLI, "--", "--env", "HOME"]).expect(0);
    assert!(ran.stdout.starts_with("HOME=<unset>\n"), "no environment by default: {}", ran.stdout);
    let ran = run(&["run", WASI_CLI, "--env", "GREETING=hi", "--", "--env", "GREETING"]).expect(0);
    assert!(ran.stdout.starts_with("GREETING=hi\n"), "{}", ran.stdout);
}

#[test]
fn preview_1_modules_run_with_their_exit_code() {
    let dir = scratch("p1");
    let module = dir.join("hello-p1.wasm");
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
      (memory (export "memory") 1)
      (data (i32.const 16) "hello from preview 1\n")
      (func (export "_start")
        (i32.store (i32.const 0) (i32.const 16))
        (i32.store (i32.const 4) (i32.const 21))
        (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
        (call $proc_exit (i32.const 3))))"#;
    std::fs::write(&module, wat::parse_str(wat).expect("valid WAT")).expect("write");
    let ran = run(&["run", module.to_str().expect("utf-8")]).expect(3);
    assert_eq!(ran.stdout, "hello from preview 1\n");
    let ran = run(&["inspect", module.to_str().expect("utf-8")]).expect(0);
    assert!(ran.stdout.contains("WASI preview 1 command module"), "{}", ran.stdout);
}

// --- inspect and compile ----------------------------------------------------------------

#[test]
fn inspect_describes_a_process_component_and_its_cache_state() {
    let cache = scratch("inspect-cache");
    let inspect = |json: bool| {
        let mut args = vec!["inspect", HELLO];
        if json {
            args.push("--json");
        }
        finish(wasmproc(&args).env("XDG_CACHE_HOME", &cache).output().expect("runs")).expect(0)
    };
    let first = inspect(false);
    for line in ["kind:      process component", "runnable:  yes", "entries:   greet, add", "was not cached"] {
        assert!(first.stdout.contains(line), "should show {line:?}: {}", first.stdout);
    }
    assert!(first.stdout.contains("wasi:cli/environment"), "imports are listed: {}", first.stdout);
    let second = inspect(true).json();
    assert_eq!(second["cached"], true, "{second}");
    assert_eq!(second["runnable"], true);
    assert_eq!(second["entries"], serde_json::json!(["greet", "add"]));
    assert!(second["exports"].as_array().is_some_and(|e| e.iter().any(|x| x == "step")), "{second}");
}

#[test]
fn inspect_says_why_a_component_cannot_run_and_exits_3() {
    let dir = scratch("inspect-bad");
    let other = dir.join("other.wasm");
    std::fs::write(&other, wat::parse_str("(component)").expect("valid WAT")).expect("write");
    let ran = run(&["inspect", other.to_str().expect("utf-8"), "--json"]).expect(3);
    let out = ran.json();
    assert_eq!(out["runnable"], false);
    assert!(out["problem"].as_str().is_some_and(|p| p.contains("does not fit")), "{out}");
}

#[test]
fn compiled_files_run_without_compiling_and_refuse_other_settings() {
    let dir = scratch("compile");
    let out = dir.join("hello.cwasm");
    let out_path = out.to_str().expect("utf-8");
    run(&["compile", HELLO, "-o", out_path]).expect(0);
    let ran = run(&["run", out_path, "--method", "greet", "--input", "\"again\""]).expect(0);
    assert_eq!(ran.stdout, "\"hello, again\"\n");
    run(&["inspect", out_path]).expect(0);

    // The memory cap is not compiled in (bounds checks use each memory's current size).
    let ran = run(&["run", out_path, "--method", "greet", "--input", "\"big\"", "--memory", "128MiB"]).expect(0);
    assert_eq!(ran.stdout, "\"hello, big\"\n");
    run(&["run", out_path, "--method", "greet", "--fuel", "1000000"]).expect(3).error_says("without fuel metering");

    let mut damaged = std::fs::read(&out).expect("read");
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    let damaged_path = dir.join("damaged.cwasm");
    std::fs::write(&damaged_path, damaged).expect("write");
    run(&["run", damaged_path.to_str().expect("utf-8")]).expect(3).error_says("damaged (checksum mismatch)");

    let elf = dir.join("wasmtime.cwasm");
    std::fs::write(&elf, b"\x7fELF\x02\x01\x01\0rest").expect("write");
    run(&["run", elf.to_str().expect("utf-8")]).expect(3).error_says("precompiled by `wasmtime compile`");

    run(&["compile", HELLO, "-o", HELLO]).expect(2).error_says("refusing to overwrite the input");
}

#[test]
fn help_lists_every_flag_with_units_and_defaults() {
    let ran = run(&["run", "--help"]).expect(0);
    for text in [
        "--method",
        "--input",
        "--input-file",
        "--workers",
        "--memory",
        "[default: 64MiB]",
        "--fuel",
        "--time-slice",
        "[default: 10ms]",
        "--no-preemption",
        "--cpu-budget",
        "--timeout",
        "--allow",
        "--deny",
        "--dir",
        "--env",
        "--stats",
        "--progress",
        "--json",
        "Exit codes",
        "130",
    ] {
        assert!(ran.stdout.contains(text), "`run --help` should mention {text:?}");
    }
    let ran = run(&["--help"]).expect(0);
    for text in ["run", "inspect", "compile"] {
        assert!(ran.stdout.contains(text), "`--help` should list {text:?}");
    }
    assert!(run(&["--version"]).expect(0).stdout.starts_with("wasmproc "));
}
