//! The binary against hostile inputs and a hostile environment: closed pipes, endless
//! and special files, huge flag values, signals, guests that never yield.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, ExitStatus};

use proptest::prelude::*;
use wasmproc_tests::guests::BENCH;

use super::*;

/// A pipe whose reading end is already closed: every write to the other end fails with
/// `EPIPE`, as when the reader (`head -c1`, `true`) has gone.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("a pipe can be made");
    drop(reader);
    writer
}

/// `wasmproc` with `args` run to its end with no stdin and the given stdout and stderr.
fn output_with(args: &[&str], stdout: impl Into<Stdio>, stderr: impl Into<Stdio>) -> Output {
    wasmproc(args).stdin(Stdio::null()).stdout(stdout).stderr(stderr).output().expect("wasmproc runs")
}

/// How a run of the binary ended: the exit code, or the signal that killed it.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => format!("{status:?}"),
    }
}

/// Waits for `child` up to [`HANG`]; kills it and fails the test past that.
fn wait(mut child: Child) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait works").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("wasmproc did not exit within {HANG:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_closed_stdout_ends_each_subcommand_with_exit_141_not_a_panic() {
    let cases: [&[&str]; 5] = [
        &["inspect", HELLO],
        &["inspect", "--json", HELLO],
        &["run", HELLO, "--method", "greet", "--input", "\"x\"", "--json"],
        &["run", HELLO, "--method", "greet", "--input", "\"x\""],
        &["--help"],
    ];
    for args in cases {
        let output = output_with(args, closed_pipe(), Stdio::piped());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(141), "{args:?}: {}; stderr: {stderr}", describe(output.status));
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_closed_stderr_changes_nothing_but_what_is_seen() {
    // Guest output (a panic message), the stats and an error message all go to stderr.
    let cases: [(&[&str], i32); 4] = [
        (&["run", HOSTILE, "--method", "panic"], 1),
        (&["run", FAN_OUT, "--input", "3", "--stats", "--progress"], 0),
        (&["run", HELLO, "--method", "nope"], 2),
        (&["run", HOSTILE, "--method", "spin", "--timeout", "200ms"], 4),
    ];
    for (args, code) in cases {
        let output = output_with(args, Stdio::piped(), closed_pipe());
        assert_eq!(output.status.code(), Some(code), "{args:?}: {}", describe(output.status));
    }
    // Both closed at once, with guest output on the way.
    let output = output_with(&["run", HOSTILE, "--method", "panic", "--json"], closed_pipe(), closed_pipe());
    assert_eq!(output.status.code(), Some(141), "{}", describe(output.status));
}

#[test]
fn a_wasi_program_writing_to_a_closed_stdout_does_not_take_the_host_down() {
    let output = output_with(&["run", WASI_CLI, "--", "hello", "world"], closed_pipe(), Stdio::piped());
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The program's own write fails (how it reacts is its business); the host reports
    // its exit code and does not panic.
    assert!(output.status.code().is_some_and(|code| code < 100), "{}; stderr: {stderr}", describe(output.status));
    assert!(!stderr.contains("wasmproc") || !stderr.contains("panicked at"), "{stderr}");
}

/// A guest that never returns from its step, with a time slice it never reaches: the
/// timeout, the CPU budget and termination are looked at every epoch tick anyway.
#[test]
fn a_spinning_guest_is_stopped_whatever_the_time_slice() {
    for preemption in [&[][..], &["--no-preemption"][..]] {
        let mut args = vec!["run", HOSTILE, "--method", "spin", "--time-slice", "1h", "--timeout", "1s"];
        args.extend(["--grace", "200ms"]);
        args.extend(preemption);
        let start = Instant::now();
        let ran = run(&args).expect(4);
        assert!(start.elapsed() < Duration::from_secs(2), "{preemption:?}: took {:?}", start.elapsed());
        assert!(ran.stderr.contains("timed out after 1s"), "{}", ran.stderr);

        let mut args = vec!["run", HOSTILE, "--method", "spin", "--time-slice", "1h", "--cpu-budget", "200ms"];
        args.extend(preemption);
        let start = Instant::now();
        run(&args).expect(1).error_says("CPU budget exceeded");
        assert!(start.elapsed() < Duration::from_secs(1), "{preemption:?}: took {:?}", start.elapsed());
    }
    // A WASI program too.
    let start = Instant::now();
    run(&["run", WASI_CLI, "--time-slice", "1h", "--timeout", "1s", "--", "--spin"]).expect(4);
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
}

/// Runs `args` and returns how it ended, the child's peak resident memory and how long it
/// took.
///
/// The peak is taken by a small `python3` between this test binary and `wasmproc`, from
/// its children's `ru_maxrss`: a process spawned sharing its parent's memory (as
/// `posix_spawn` does) carries the parent's own peak into its `ru_maxrss` when it execs,
/// so measured from here it would be this test binary's peak, which the tests running
/// beside it raise past the bound. The intermediary's peak is a few MiB.
fn run_measured(args: &[&str], stdin: Stdio) -> (Ran, u64, Duration) {
    const MEASURE: &str = "import os, resource, subprocess, sys\n\
        code = subprocess.call(sys.argv[2:])\n\
        open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n\
        os.kill(os.getpid(), -code) if code < 0 else sys.exit(code)\n";
    static MEASURED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let report =
        scratch("measured").join(format!("{}.maxrss", MEASURED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let start = Instant::now();
    let wasmproc = wasmproc(args);
    let mut command = Command::new("python3");
    command.arg("-c").arg(MEASURE).arg(&report).arg(wasmproc.get_program()).args(wasmproc.get_args());
    for (name, value) in wasmproc.get_envs() {
        if let Some(value) = value {
            command.env(name, value);
        }
    }
    let child = command.stdin(stdin).output().expect("python3 runs wasmproc");
    let took = start.elapsed();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&child.stdout).into_owned(), String::from_utf8_lossy(&child.stderr).into_owned());
    let ran = Ran {
        code: child.status.code().unwrap_or_else(|| panic!("{}: {stderr}", describe(child.status))),
        stdout,
        stderr,
    };
    let kib: u64 = std::fs::read_to_string(&report)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak measured for {args:?}: {}", ran.stderr));
    (ran, kib * 1024, took)
}

#[test]
fn endless_and_special_files_are_refused_within_a_bounded_read() {
    let fifo = scratch("fifo").join("module.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    let fifo = fifo.to_str().expect("UTF-8 path");
    let cases: [(&[&str], &str, &str); 5] = [
        (&["run", "/dev/zero"], "is a character device", "a device as the module"),
        (&["run", fifo], "is a FIFO", "a FIFO nobody writes as the module"),
        (&["inspect", fifo], "is a FIFO", "a FIFO given to inspect"),
        (
            &["run", HELLO, "--method", "greet", "--input-file", "/dev/urandom"],
            "is larger than --max-payload",
            "endless random input",
        ),
        (
            &["run", HELLO, "--method", "greet", "--input-file", "/dev/zero", "--max-payload", "1MiB"],
            "is larger than --max-payload (1048576 bytes)",
            "endless zeroes as input",
        ),
    ];
    for (args, says, what) in cases {
        let (ran, peak, took) = run_measured(args, Stdio::null());
        let ran = ran.expect(2).error_says(says);
        assert!(peak < 100 << 20, "{what}: peak RSS {peak} bytes; {}", ran.stderr);
        assert!(took < Duration::from_secs(1), "{what}: took {took:?}");
    }
    // Stdin is read with the same bound.
    let (ran, peak, _) = run_measured(
        &["run", HELLO, "--method", "greet", "--input-file", "-", "--max-payload", "1MiB"],
        std::fs::File::open("/dev/zero").expect("/dev/zero opens").into(),
    );
    ran.expect(2).error_says("--input-file `-` is larger than --max-payload");
    assert!(peak < 100 << 20, "peak RSS {peak} bytes");
}

#[test]
fn inputs_are_held_to_the_payload_limit_before_anything_runs() {
    let big = format!("\"{}\"", "x".repeat(2000));
    run(&["run", HELLO, "--method", "greet", "--input", &big, "--max-payload", "1KiB"])
        .expect(2)
        .error_says("--input #1 (2002 bytes) is larger than --max-payload (1024 bytes)");
    let file = scratch("big-input").join("input.json");
    std::fs::write(&file, &big).expect("the input can be written");
    run(&["run", HELLO, "--method", "greet", "--input-file", file.to_str().expect("UTF-8"), "--max-payload", "1KiB"])
        .expect(2)
        .error_says("(2002 bytes) is larger than --max-payload (1024 bytes)");
}

#[test]
fn a_module_is_checked_before_it_is_read_whole() {
    let dir = scratch("not-wasm");
    let text = dir.join("big.txt");
    std::fs::write(&text, "x".repeat(1 << 20)).expect("the file can be written");
    run(&["run", text.to_str().expect("UTF-8")]).expect(3).error_says("not a WebAssembly file");
    run(&["run", HELLO, "--max-module-size", "1KiB"])
        .expect(3)
        .error_says("larger than --max-module-size (1024 bytes)");
    run(&["run", dir.to_str().expect("UTF-8")]).expect(2).error_says("is a directory");
}

#[test]
fn the_largest_durations_do_not_overflow() {
    let huge = "9223372036854775807s";
    for flag in ["--timeout", "--cpu-budget", "--time-slice", "--grace"] {
        let ran = run(&["run", HELLO, "--method", "greet", "--input", "\"x\"", flag, huge]).expect(0);
        assert_eq!(ran.stdout.trim(), "\"hello, x\"", "{flag}");
    }
    run(&["run", WASI_CLI, "--timeout", huge, "--", "hi"]).expect(0);
}

#[test]
fn the_entry_result_is_printed_when_its_children_outlive_the_timeout() {
    // `orphan` spawns a child that spins forever and completes at once.
    let ran = run(&["run", HOSTILE, "--method", "orphan", "--timeout", "500ms", "--grace", "100ms"]).expect(4);
    assert_eq!(ran.stdout.trim(), "\"orphaned\"", "{}", ran.stderr);
    assert!(ran.stderr.contains("timed out after 500ms"), "{}", ran.stderr);
    let ran =
        run(&["run", HOSTILE, "--method", "orphan", "--timeout", "500ms", "--grace", "100ms", "--json"]).expect(4);
    let out = ran.json();
    assert_eq!(out["ok"], "orphaned", "{out}");
    assert_eq!(out["stopped"], "timeout", "{out}");
}

/// Waits until the run of `child` has started its scheduler (its worker threads exist):
/// a signal before that ends the host at once, with nothing to cancel.
pub(super) fn wait_until_running(child: &Child) {
    let tasks = PathBuf::from(format!("/proc/{}/task", child.id()));
    let start = Instant::now();
    loop {
        let workers = std::fs::read_dir(&tasks).into_iter().flatten().flatten().any(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|name| name.starts_with("wasmproc-worker"))
        });
        if workers {
            // The flag that makes a signal graceful is set just after the workers start.
            std::thread::sleep(Duration::from_millis(100));
            return;
        }
        assert!(start.elapsed() < HANG, "the run did not start its workers");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `wasmproc` with `args` in the background, with no stdin and its output piped,
/// and waits until its run has started (see [`wait_until_running`]).
pub(super) fn start_running(args: &[&str]) -> Child {
    let child = wasmproc(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let child = child.expect("wasmproc runs");
    wait_until_running(&child);
    child
}

/// Starts `args`, waits until the run has started, and sends `signal`.
fn signalled(args: &[&str], signal: &str) -> Ran {
    let child = start_running(args);
    let status = Command::new("kill").args([signal, &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    finish(wait(child))
}

#[test]
fn sigterm_and_sighup_stop_gracefully_like_ctrl_c() {
    // The bench guest's `idle` ends at once when cancelled, with the reason as its error.
    let ran = signalled(&["run", BENCH, "--method", "idle"], "-TERM").expect(143);
    assert!(ran.stderr.contains("terminated (SIGTERM)"), "{}", ran.stderr);
    assert!(ran.stderr.contains("cancelled: terminated (SIGTERM)"), "cancelled, not killed: {}", ran.stderr);
    assert!(!ran.stderr.contains("did not end when cancelled"), "{}", ran.stderr);
    let ran = signalled(&["run", BENCH, "--method", "idle", "--json"], "-HUP").expect(129);
    assert_eq!(ran.json()["stopped"], "SIGHUP", "{}", ran.stdout);
}

#[test]
fn a_second_signal_ends_the_host_at_once() {
    let mut child = start_running(&["run", HOSTILE, "--method", "spin", "--time-slice", "1h", "--grace", "1h"]);
    let pid = child.id().to_string();
    for _ in 0..2 {
        assert!(Command::new("kill").args(["-INT", &pid]).status().expect("kill runs").success());
        std::thread::sleep(Duration::from_millis(100));
    }
    let start = Instant::now();
    while child.try_wait().expect("wait works").is_none() {
        assert!(start.elapsed() < HANG, "a second Ctrl-C did not end the host");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(finish(child.wait_with_output().expect("output")).code, 130);
}

/// The flags' value parsers and the arithmetic done with the values: whatever the values,
/// the binary ends with one of its documented exit codes, never a panic (101), an abort
/// (134) or a signal. Part of the fuzz suite (`tests/fuzz/README.md`): 48 cases, times
/// `WASMPROC_FUZZ_SCALE`, or `PROPTEST_CASES`.
#[test]
fn no_flag_value_makes_the_binary_panic() {
    let scale: u32 = std::env::var("WASMPROC_FUZZ_SCALE").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| 48u32.saturating_mul(scale));
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    let number = prop_oneof![
        Just(u64::MAX.to_string()),
        Just((u64::MAX / 1000).to_string()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("18446744073709551616".to_owned()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..100).prop_map(|n| n.to_string()),
    ];
    let unit = prop_oneof![Just(""), Just("ns"), Just("ms"), Just("s"), Just("h"), Just("y"), Just("KiB"), Just("EiB")];
    let value = prop_oneof![
        (number.clone(), unit).prop_map(|(n, unit)| format!("{n}{unit}")),
        "[ -~]{0,12}",
        Just("1.5e300s".to_owned()),
    ];
    let flag = proptest::sample::select(vec![
        "--timeout",
        "--cpu-budget",
        "--time-slice",
        "--grace",
        "--memory",
        "--max-payload",
        "--max-module-size",
        "--max-functions",
        "--max-function-size",
        "--fuel",
        "--workers",
        "--max-processes",
        "--max-children",
        "--max-yields",
        "--mailbox",
        "--mailbox-bytes",
        "--max-step-output",
    ]);
    let flags = proptest::collection::vec((flag, value), 1..4);
    let documented = [0, 1, 2, 3, 4, 5, 141];
    proptest!(config, |(flags in flags)| {
        let mut args = vec!["run", HELLO, "--method", "greet", "--input", "\"x\""];
        for (flag, value) in &flags {
            args.push(flag);
            args.push(value.as_str());
        }
        // A bound on every case, unless the case sets one itself.
        if !flags.iter().any(|(flag, _)| *flag == "--timeout") {
            args.extend(["--timeout", "5s"]);
        }
        let output = wasmproc(&args).stdin(Stdio::null()).output().expect("wasmproc runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        prop_assert!(
            output.status.code().is_some_and(|code| documented.contains(&code)),
            "{args:?}: {}; stderr: {stderr}",
            describe(output.status)
        );
        prop_assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    });
}

/// A program that writes more than a pipe holds to a stdout nobody reads blocks in the
/// write, outside Wasm: the timeout still ends the run, without waiting for that step.
#[test]
fn a_stdout_nobody_reads_does_not_hold_the_timeout() {
    let dir = scratch("unread-stdout");
    let big = dir.join("big.txt");
    std::fs::write(&big, "x".repeat(1 << 20)).expect("the file can be written");
    let (dir, big) = (dir.to_str().expect("UTF-8"), big.to_str().expect("UTF-8"));
    let (reader, writer) = std::io::pipe().expect("a pipe can be made");
    let start = Instant::now();
    let child = wasmproc(&["run", WASI_CLI, "--dir", dir, "--timeout", "1s", "--grace", "100ms", "--", "--cat", big])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("wasmproc runs");
    let ran = finish(wait(child));
    drop(reader);
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    assert!(ran.stderr.contains("exiting with steps still running"), "{}", ran.stderr);
}
