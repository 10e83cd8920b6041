//! The Wasm host end to end with `examples-wasm/raw`, a guest written straight against
//! the WIT contract: loading, the compile caches, the world check, entry methods, traps.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use wasmproc::error::SpawnError;
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, LogRecord, Runtime};
use wasmproc::{Format, Payload, Scheduler};
use wasmproc_tests::HANG;

const RAW: &str = env!("GUEST_RAW");

/// Every log line of the shared runtime's processes, formatted.
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A cache directory of its own for each caller, under cargo's scratch space for tests.
fn cache_dir(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("wasm-cache-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One runtime for the tests that only run the guest, so they compile it once.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        // The same directory on every run (a disk cache is safe to share between runs, and
        // stays within its size cap), so runs do not leave a directory each behind.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache-shared");
        let config =
            Config::default().cache_dir(dir).log_sink(|record: &LogRecord<'_>| LOG.lock().push(record.to_string()));
        Runtime::new(config).expect("the runtime starts")
    })
}

fn raw() -> Component {
    runtime().load(RAW).unwrap_or_else(|e| panic!("failed to load the raw guest: {e:#}"))
}

fn scheduler() -> Scheduler {
    Scheduler::builder().workers(2).kind("raw", raw()).build().expect("the scheduler starts")
}

fn logged(needle: &str) -> bool {
    LOG.lock().iter().any(|line| line.contains(needle))
}

#[test]
fn raw_guest_lists_its_entries() {
    assert_eq!(raw().entries(), ["main", "echo"]);
}

#[test]
fn main_sleeps_then_counts_its_input() {
    let s = scheduler();
    let input = vec![Payload::text("a"), Payload::u64(7), Payload::json(&[1, 2]).unwrap()];
    let process = s.handle().spawn(Spawnable::kind("raw"), SpawnOptions::new("main").input(input)).unwrap();
    let pid = process.pid();
    let result = process.join_timeout(HANG).expect("main finishes").expect("main succeeds");
    assert_eq!(result.format, Format::Json);
    assert_eq!(result.parse_json::<u64>().unwrap(), 3);
    assert!(s.handle().stats().yields >= 1, "the sleep went through the dispatcher");
    assert!(logged(&format!("[pid {pid}] info: process {pid} starts `main` with 3 inputs")), "{:?}", LOG.lock());
}

/// DESIGN 4 with a Wasm guest: `main` yields once and then completes, so on one worker it
/// takes exactly two steps, the second woken by the timer's completion.
#[test]
fn a_guest_that_yields_once_takes_exactly_two_steps() {
    let s = Scheduler::builder().workers(1).kind("raw", raw()).build().expect("the scheduler starts");
    let process = s.handle().spawn(Spawnable::kind("raw"), "main").unwrap();
    assert_eq!(process.join_timeout(HANG).expect("main finishes"), Ok(Payload::json(&0).unwrap()));
    assert_eq!(s.handle().stats().workers[0].executed, 2);
}

#[test]
fn echo_answers_with_its_first_input() {
    let s = scheduler();
    let first = Payload { format: Format::from_name("cbor"), data: vec![0xa1, 0x01, 0x02] };
    let process = s
        .handle()
        .spawn(Spawnable::kind("raw"), SpawnOptions::new("echo").input(vec![first.clone(), Payload::text("ignored")]))
        .unwrap();
    let pid = process.pid();
    assert_eq!(process.join_timeout(HANG), Some(Ok(first)));
    assert!(logged(&format!("[pid {pid}] stdout: echo: 3 bytes of `cbor`")), "{:?}", LOG.lock());
}

#[test]
fn processes_spawn_directly_from_a_component() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let process =
        s.handle().spawn(raw().process(), SpawnOptions::new("echo").input(vec![Payload::text("hi")])).unwrap();
    assert_eq!(process.join_timeout(HANG), Some(Ok(Payload::text("hi"))));
}

#[test]
fn unknown_method_is_an_init_error_that_lists_the_entries() {
    let s = scheduler();
    let err = s.handle().spawn(Spawnable::kind("raw"), "nope").unwrap_err();
    assert!(matches!(err, SpawnError::Init { ref method, .. } if method == "nope"), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("unknown entry method `nope`; this component has: main, echo"), "{message}");
    assert_eq!((s.handle().live(), s.handle().stats().spawned), (0, 0));
}

#[test]
fn a_trap_ends_only_its_own_process() {
    let s = scheduler();
    // `echo` with no input indexes past the end: a Rust panic, which is a trap in Wasm.
    let trapping = s.handle().spawn(Spawnable::kind("raw"), "echo").unwrap();
    let healthy =
        s.handle().spawn(Spawnable::kind("raw"), SpawnOptions::new("main").input(vec![Payload::empty()])).unwrap();
    let pid = trapping.pid();
    let reason = trapping.join_timeout(HANG).expect("the trapping process ends").unwrap_err();
    let wasmproc::ExitReason::Trap(trap) = reason else { panic!("a panic is a trap: {reason:?}") };
    // The panic's message and place, as std's hook wrote them to the guest's stderr; the
    // Wasm backtrace is a debug event, not a line of the process's log.
    assert_eq!(trap.kind, wasmproc::TrapKind::Panic);
    let error = trap.message;
    assert!(error.starts_with("swap_remove index (is 0) should be < len (is 0) (at "), "{error}");
    assert!(!logged("wasm backtrace"), "{:?}", LOG.lock());
    eprintln!("{error}");
    assert!(logged(&format!("[pid {pid}] stderr: ")) && logged("panicked"), "{:?}", LOG.lock());
    let result = healthy.join_timeout(HANG).expect("the other process ends").expect("and succeeds");
    assert_eq!(result.parse_json::<u64>().unwrap(), 1);
    assert!(s.handle().wait_idle(Some(HANG)));
    assert_eq!(s.handle().registered(), 0);
}

#[test]
fn a_module_compiles_once_per_runtime_and_once_per_cache_dir() {
    let dir = cache_dir("stats");
    let config = || Config::default().cache_dir(&dir);

    let first = Runtime::new(config()).unwrap();
    let a = first.load(RAW).unwrap();
    let b = first.load(RAW).unwrap();
    assert_eq!(a.entries(), b.entries());
    let stats = first.stats();
    assert_eq!((stats.compiled, stats.disk_hits, stats.memory_hits), (1, 0, 1));

    // A new runtime (a second run of the host) finds the compiled code on disk.
    let second = Runtime::new(config()).unwrap();
    let component = second.load(RAW).unwrap();
    let stats = second.stats();
    assert_eq!((stats.compiled, stats.disk_hits), (0, 1));
    let s = Scheduler::builder().workers(1).kind("raw", component).build().unwrap();
    let result = s.handle().spawn(Spawnable::kind("raw"), "main").unwrap().join_timeout(HANG).unwrap().unwrap();
    assert_eq!(result.parse_json::<u64>().unwrap(), 0);

    // A damaged entry is compiled again, not loaded.
    // The directory also holds the runtime's key (`key`), beside the `.cwasm` entries.
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cwasm"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&entries[0], &bytes).unwrap();
    let third = Runtime::new(config()).unwrap();
    assert_eq!(third.load(RAW).unwrap().entries(), ["main", "echo"]);
    let stats = third.stats();
    assert_eq!((stats.compiled, stats.disk_hits), (1, 0));
    // ...and the fresh entry is good again.
    let fourth = Runtime::new(config()).unwrap();
    fourth.load(RAW).unwrap();
    assert_eq!(fourth.stats().disk_hits, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_that_are_not_components_are_refused_clearly() {
    let rt = runtime();
    let err = rt.load_bytes(b"\0asm\x01\0\0\0").unwrap_err();
    assert!(format!("{err:#}").contains("core WebAssembly module, not a component"), "{err:#}");
    let err = rt.load_bytes(b"#!/bin/sh\necho hi\n").unwrap_err();
    assert!(format!("{err:#}").contains("not a WebAssembly file"), "{err:#}");
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-guest.wasm");
    let err = rt.load(&missing).unwrap_err();
    assert!(format!("{err:#}").contains("failed to read") && format!("{err:#}").contains("no-such-guest.wasm"));
}

/// A component built for the contract before exit reasons were typed imports its
/// interfaces at `@0.1.0`: refused by both versions' names, with what to do, instead of
/// a type mismatch deep in a record.
#[test]
fn a_component_of_the_previous_contract_is_refused_naming_both_versions() {
    let old = wat::parse_str(
        r#"(component
            (import "wasmproc:process/host@0.1.0" (instance
                (export "max-yields" (func (result u32)))
            ))
        )"#,
    )
    .unwrap();
    let err = format!("{:#}", runtime().load_bytes(&old).unwrap_err());
    assert!(
        err.contains("built for `wasmproc:process@0.1.0`, but this host runs `wasmproc:process@0.2.1`")
            && err.contains("rebuild it with the current SDK"),
        "{err}"
    );
}

#[test]
fn a_component_of_another_world_is_refused_naming_the_export() {
    let rt = runtime();
    let empty = wat::parse_str("(component)").unwrap();
    let err = format!("{:#}", rt.load_bytes(&empty).unwrap_err());
    assert!(err.contains("`wasmproc:process/process@0.2.1`") && err.contains("`entries`"), "{err}");

    // `entries` exported, with the wrong type.
    let wrong = wat::parse_str(
        r#"(component
            (core module $m (func (export "f") (result i32) i32.const 0))
            (core instance $i (instantiate $m))
            (func (export "entries") (result u32) (canon lift (core func $i "f"))))"#,
    )
    .unwrap();
    let err = format!("{:#}", rt.load_bytes(&wrong).unwrap_err());
    assert!(err.contains("`entries`") && err.contains("type"), "{err}");
    eprintln!("{err}");

    // An import the host does not provide.
    let importer = wat::parse_str(r#"(component (import "acme:db/query" (instance (export "get" (func)))))"#).unwrap();
    let err = format!("{:#}", rt.load_bytes(&importer).unwrap_err());
    assert!(err.contains("acme:db/query"), "{err}");
    eprintln!("{err}");
}

#[test]
fn a_memory_cap_below_the_guest_s_needs_fails_init_naming_the_limit() {
    let s = Scheduler::builder().workers(1).kind("tiny", raw().with_max_memory(64 * 1024).unwrap()).build().unwrap();
    let err = s.handle().spawn(Spawnable::kind("tiny"), "main").unwrap_err().to_string();
    assert!(err.contains("memory limit exceeded") && err.contains("`max_memory` of 65536 bytes"), "{err}");
    assert!(raw().with_max_memory(usize::MAX).is_err(), "no more than the pool gives");
}

#[test]
fn log_lines_arrive_whole_and_tagged() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = lines.clone();
    let config = Config::default()
        .no_disk_cache()
        .log_sink(move |r: &LogRecord<'_>| seen.lock().push((r.pid, r.source.to_string(), r.message.to_owned())));
    let component = Runtime::new(config).unwrap().load(RAW).unwrap();
    let s = Scheduler::builder().workers(1).build().unwrap();
    let process =
        s.handle().spawn(component.process(), SpawnOptions::new("echo").input(vec![Payload::text("x")])).unwrap();
    let pid = process.pid();
    process.join_timeout(HANG).unwrap().unwrap();
    let lines = lines.lock();
    assert!(lines.contains(&(pid, "stdout".to_owned(), "echo: 1 bytes of `text`".to_owned())), "{lines:?}");
}

/// A component of the `process` world written by hand, whose steps never end: `spin`
/// loops, `hog` grows its memory without bound. Small enough to read, and it pins down
/// that the limits hold for any guest, not only for Rust ones.
const RUNAWAY: &str = r#"(component
    (type $payload' (record (field "format" string) (field "data" (list u8))))
    (export $payload "payload" (type $payload'))
    (type $completion' (record (field "tag" u64) (field "result" (result $payload (error string)))))
    (export $completion "completion" (type $completion'))
    (type $message' (record (field "sender" u64) (field "topic" string) (field "body" $payload)))
    (export $message "message" (type $message'))
    (type $trap-kind' (enum "panic" "unreachable" "out-of-fuel" "cpu-budget" "memory-limit" "stack-overflow"
                            "other"))
    (export $trap-kind "trap-kind" (type $trap-kind'))
    (type $trap' (record (field "kind" $trap-kind) (field "message" string)))
    (export $trap "trap" (type $trap'))
    (type $reason' (variant (case "normal" $payload) (case "error" string) (case "trap" $trap) (case "killed")
                            (case "shutdown") (case "terminated") (case "noproc") (case "noconnection" string)))
    (export $reason "exit-reason" (type $reason'))
    (type $exit' (record (field "pid" u64) (field "reason" $reason) (field "linked" bool)))
    (export $exit "exit" (type $exit'))
    (type $event' (variant (case "completion" $completion) (case "message" $message) (case "exit" $exit)
                           (case "cancel" string)))
    (export $event "event" (type $event'))
    (type $spawn' (record (field "kind" (option string)) (field "method" string) (field "input" (list $payload))
                          (field "monitor" bool) (field "link" bool)))
    (export $spawn "spawn-request" (type $spawn'))
    (type $send' (record (field "to" u64) (field "topic" string) (field "body" $payload)))
    (export $send "send-request" (type $send'))
    (type $custom' (record (field "name" string) (field "payload" $payload)))
    (export $custom "custom-command" (type $custom'))
    (type $signal' (record (field "to" u64) (field "reason" $reason) (field "kill" bool)))
    (export $signal "exit-signal" (type $signal'))
    (type $command' (variant (case "sleep" u64) (case "spawn" $spawn) (case "send" $send) (case "monitor" u64)
                             (case "terminate" u64) (case "link" u64) (case "unlink" u64) (case "demonitor" u64)
                             (case "exit" $signal) (case "trap-exits" bool) (case "custom" $custom)))
    (export $command "command" (type $command'))
    (type $yield' (record (field "tag" u64) (field "command" $command)))
    (export $yield "yield-command" (type $yield'))
    (type $status' (variant (case "complete" (result $payload (error string))) (case "idle") (case "blocked")
                            (case "continue")))
    (export $status "status" (type $status'))
    (type $output' (record (field "status" $status) (field "yields" (list $yield))))
    (export $output "step-output" (type $output'))

    (core module $m
        (memory (export "memory") 1)
        ;; entries: a list of 2 strings at 16, "spin" at 64 and "hog" at 72.
        (data (i32.const 0) "\10\00\00\00\02\00\00\00")
        (data (i32.const 16) "\40\00\00\00\04\00\00\00\48\00\00\00\03\00\00\00")
        (data (i32.const 64) "spin")
        (data (i32.const 72) "hog")
        ;; 128: `ok` of init's result.
        (global $heap (mut i32) (i32.const 1024))
        (global $method (mut i32) (i32.const 0))
        (func (export "realloc") (param i32 i32 i32 i32) (result i32)
            (local $ptr i32)
            (local.set $ptr (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                                     (i32.sub (i32.const 0) (local.get 2))))
            (global.set $heap (i32.add (local.get $ptr) (local.get 3)))
            (local.get $ptr))
        (func (export "entries") (result i32) (i32.const 0))
        (func (export "init") (param i64 i32 i32 i32 i32) (result i32)
            (global.set $method (i32.load8_u (local.get 1)))
            (i32.const 128))
        (func (export "step") (param i32 i32) (result i32)
            (if (i32.eq (global.get $method) (i32.const 0x73))
                (then (loop $spin (br $spin))))
            (loop $hog (drop (memory.grow (i32.const 16))) (br $hog))
            (unreachable)))
    (core instance $i (instantiate $m))

    (func $entries (result (list string))
        (canon lift (core func $i "entries") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
    (export "entries" (func $entries))
    (func $init (param "pid" u64) (param "method" string) (param "input" (list $payload)) (result (result (error string)))
        (canon lift (core func $i "init") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
    (export "init" (func $init))
    (func $step (param "events" (list $event)) (result $output)
        (canon lift (core func $i "step") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
    (export "step" (func $step))
)"#;

fn runaway() -> Component {
    let bytes = wat::parse_str(RUNAWAY).expect("the runaway component is valid WAT");
    runtime().load_bytes(&bytes).unwrap_or_else(|e| panic!("failed to load the runaway component: {e:#}"))
}

/// The step never ends, but it holds the only worker for one time slice at a time: the
/// other process completes, and the runaway ends when its CPU budget does.
#[test]
fn an_endless_step_is_preempted_and_ended_at_its_cpu_budget() {
    let config = Config::default()
        .no_disk_cache()
        .time_slice(Duration::from_millis(2))
        .cpu_budget(Duration::from_millis(50))
        .log_sink(|_: &LogRecord<'_>| {});
    let budgeted = Runtime::new(config).expect("the runtime starts");
    let spinner = budgeted.load_bytes(&wat::parse_str(RUNAWAY).unwrap()).unwrap();
    assert_eq!(spinner.entries(), ["spin", "hog"]);
    let s = Scheduler::builder().workers(1).kind("spin", spinner).kind("raw", raw()).build().unwrap();
    let spinning = s.handle().spawn(Spawnable::kind("spin"), "spin").unwrap();
    let healthy = s.handle().spawn(Spawnable::kind("raw"), "main").unwrap();
    assert!(healthy.join_timeout(HANG).unwrap().is_ok());
    let error = wasmproc_tests::said(spinning.join_timeout(HANG).expect("the CPU budget ends the step").unwrap_err());
    assert_eq!(error, "CPU budget exceeded: the process ran for longer than its `cpu_budget` of 50ms and was stopped");
}

#[test]
fn growing_past_the_memory_cap_ends_the_process_naming_the_limit() {
    let hog = runaway().with_max_memory(1024 * 1024).unwrap();
    let s = Scheduler::builder().workers(1).kind("hog", hog).build().unwrap();
    let error = wasmproc_tests::said(
        s.handle().spawn(Spawnable::kind("hog"), "hog").unwrap().join_timeout(HANG).unwrap().unwrap_err(),
    );
    assert!(error.starts_with("memory limit exceeded"), "{error}");
    assert!(error.contains("past its `max_memory` of 1048576 bytes"), "{error}");
}
