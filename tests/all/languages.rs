//! Guests in Python and JavaScript (`examples-python/`, `examples-js/`, built by
//! `build.rs` with componentize-py and componentize-js) run end to end, and the
//! per-process instance limits they need: each limit, passed, fails naming its setting
//! and flag; raised, the guest runs.

use std::sync::OnceLock;
use std::time::Duration;

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{COMMAND_ENTRY, Component, Config, Program, Runtime, WasiOptions, exit_code};
use wasmproc::{ExitReason, Payload, Scheduler};
use wasmproc_tests::HANG;
use wasmproc_tests::guests::{JS_SQUARES, PY_SQUARES};

/// A runtime with its compiled code cached in the tests' scratch space, so a guest is
/// compiled once for every runtime of this binary (the Python guest takes seconds). The
/// init time limit is raised from 100 ms: instantiating the Python guest (14 core
/// modules) and CPython's start, in the unoptimised test build with the other tests on
/// the same cores, can take longer than that.
fn runtime(config: Config) -> Runtime {
    let config = config.init_time_limit(Duration::from_secs(10)).cache_dir(env!("CARGO_TARGET_TMPDIR"));
    Runtime::new(config.log_sink(|_: &wasmproc::wasm::LogRecord<'_>| {})).expect("the runtime starts")
}

/// The guest at `path`, loaded (and compiled, the first time) with the defaults.
fn load(path: &str) -> Component {
    runtime(Config::default()).load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"))
}

fn python() -> &'static Component {
    static GUEST: OnceLock<Component> = OnceLock::new();
    GUEST.get_or_init(|| load(PY_SQUARES))
}

fn javascript() -> &'static Component {
    static GUEST: OnceLock<Component> = OnceLock::new();
    GUEST.get_or_init(|| load(JS_SQUARES))
}

/// Runs `method` of `guest` with `input`.
fn run(guest: &Component, method: &str, input: Payload) -> Result<Result<Payload, ExitReason>, String> {
    let s = Scheduler::builder().kind("squares", guest.clone()).build().expect("the scheduler starts");
    let spawned = s.handle().spawn(Spawnable::kind("squares"), SpawnOptions::new(method).input(vec![input]));
    let outcome = spawned
        .map(|process| process.join_timeout(HANG).unwrap_or_else(|| panic!("`{method}` did not finish")))
        .map_err(|e| format!("{e:#}"));
    s.stop(Duration::from_secs(1));
    outcome
}

fn json(n: u64) -> Payload {
    Payload::json(&n).expect("a number serialises")
}

/// The fan-out of each example: `main(n)` spawns `n` children of its own component,
/// gathers their results from their exit events (which may come before the spawn's
/// completion names the child), sleeps, and returns the squares in order.
fn fans_out(guest: &Component, language: &str) {
    let squares = run(guest, "main", json(5)).expect("`main` spawns").expect("`main` completes");
    assert_eq!(squares.as_str(), Some("[0,1,4,9,16]"), "{language}");
    let many = run(guest, "main", json(100)).expect("`main` spawns").expect("`main` completes");
    let expected: Vec<u64> = (0..100).map(|i| i * i).collect();
    assert_eq!(many, Payload::json(&expected).unwrap(), "{language}");

    let unknown = run(guest, "cube", json(3)).expect_err("no such entry");
    assert!(
        unknown.contains("unknown entry method `cube`; this component has: main, square, idle"),
        "{language}: {unknown}"
    );
    let refused = run(guest, "main", Payload::json(&"five").unwrap()).expect_err("the guest refuses the input");
    assert!(refused.contains("`main` takes a count of children, got"), "{language}: {refused}");
}

/// `idle` waits for a message and completes with its body.
fn answers_a_message(guest: &Component, language: &str) {
    let s = Scheduler::builder().kind("squares", guest.clone()).build().expect("the scheduler starts");
    let options = SpawnOptions::new("idle").input(vec![Payload::json(&()).unwrap()]);
    let process = s.handle().spawn(Spawnable::kind("squares"), options).expect("`idle` spawns");
    let body = Payload::json(&"hello").unwrap();
    s.handle().send(process.pid(), "greeting", body.clone()).expect("the message is delivered");
    assert_eq!(process.join_timeout(HANG).expect("`idle` ends"), Ok(body), "{language}");
    s.stop(Duration::from_secs(1));
}

#[test]
fn python_and_javascript_guests_answer_a_message() {
    answers_a_message(python(), "Python");
    answers_a_message(javascript(), "JavaScript");
}

/// A guest gets the typed exit reasons of its monitored children in their exit events:
/// the error of one that failed, and `terminated` for one it terminated.
fn reads_typed_exit_reasons(guest: &Component, language: &str) {
    let watched = run(guest, "watch", Payload::json(&"no luck").unwrap()).expect("`watch` spawns");
    let watched = watched.unwrap_or_else(|reason| panic!("{language}: `watch` {reason}"));
    let expected = serde_json::json!({"idle": ["terminated"], "fail": ["error", "no luck"]});
    assert_eq!(watched.parse_json::<serde_json::Value>().expect("JSON"), expected, "{language}");
}

#[test]
fn python_and_javascript_guests_read_the_typed_exit_reasons_of_their_children() {
    reads_typed_exit_reasons(python(), "Python");
    reads_typed_exit_reasons(javascript(), "JavaScript");
}

/// A guest links to a child through the WIT: trapping exits, it gets the child's error
/// as an exit event with `linked`; not trapping, the child's error ends it.
fn links_to_a_child(guest: &Component, language: &str) {
    let trapped = run(guest, "trap", Payload::json(&"no luck").unwrap()).expect("`trap` spawns");
    let trapped = trapped.unwrap_or_else(|reason| panic!("{language}: `trap` {reason}"));
    let expected = serde_json::json!({"child": true, "linked": true, "reason": ["error", "no luck"]});
    assert_eq!(trapped.parse_json::<serde_json::Value>().expect("JSON"), expected, "{language}");

    let linked = run(guest, "linked", Payload::json(&"no luck").unwrap()).expect("`linked` spawns");
    assert_eq!(linked, Err(ExitReason::Error("no luck".to_owned())), "{language}: ended by its linked child's error");
}

#[test]
fn python_and_javascript_guests_link_to_a_child_and_trap_its_exit_or_end_with_it() {
    links_to_a_child(python(), "Python");
    links_to_a_child(javascript(), "JavaScript");
}

/// A guest starts the host's supervisor by spawning the kind `supervisor` with its spec
/// as JSON: the child, which fails at once, is restarted twice (the intensity) and the
/// supervisor then gives up with an error naming it.
fn supervises_a_crashing_child(guest: &Component, language: &str) {
    let ended = run(guest, "supervise", Payload::json(&"squares").unwrap()).expect("`supervise` spawns");
    let ended = ended.unwrap_or_else(|reason| panic!("{language}: `supervise` {reason}"));
    let reason: (String, String) = ended.parse_json().unwrap_or_else(|e| panic!("{language}: {e:#}"));
    assert_eq!(reason.0, "error", "{language}: {reason:?}");
    assert!(reason.1.starts_with("restart intensity reached: 3 restarts within 1m"), "{language}: {}", reason.1);
    assert!(reason.1.contains("child `crasher`, which returned an error: boom"), "{language}: {}", reason.1);
}

#[test]
fn python_and_javascript_guests_start_a_supervisor_that_gives_up_on_a_crashing_child() {
    supervises_a_crashing_child(python(), "Python");
    supervises_a_crashing_child(javascript(), "JavaScript");
}

#[test]
fn a_python_guest_spawns_children_and_gathers_their_results() {
    fans_out(python(), "Python");
}

#[test]
fn a_javascript_guest_spawns_children_and_gathers_their_results() {
    fans_out(javascript(), "JavaScript");
}

/// componentize-py links CPython and its libraries as 14 core modules.
#[test]
fn a_guest_past_max_core_instances_fails_naming_it_and_runs_with_it_raised() {
    python();
    let error = runtime(Config::default().max_core_instances(13)).load(PY_SQUARES).map(|_| ()).unwrap_err();
    let error = format!("{error:#}");
    assert!(error.contains("more than the 13 core instances a process may have, its `max_core_instances`"), "{error}");
    assert!(error.contains("raise it with `--max-core-instances`"), "{error}");
    let raised = runtime(Config::default().max_core_instances(14)).load(PY_SQUARES).expect("14 are enough");
    assert_eq!(run(&raised, "main", json(2)).expect("spawns").expect("completes").as_str(), Some("[0,1]"));

    javascript();
    let error = runtime(Config::default().max_core_instances(3)).load(JS_SQUARES).map(|_| ()).unwrap_err();
    assert!(format!("{error:#}").contains("its `max_core_instances`"), "{error:#}");
    runtime(Config::default().max_core_instances(4)).load(JS_SQUARES).expect("componentize-js needs 4");
}

/// Spawns the WASI preview 1 program `wat` under `config`; its exit code, or why the
/// spawn failed.
fn run_command(config: Config, wat: &str) -> Result<Option<i32>, String> {
    let runtime = runtime(config);
    let bytes = wat::parse_str(wat).expect("valid WAT");
    let Program::Wasi(program) = runtime.load_program_bytes(&bytes).expect("the program loads") else {
        panic!("a core module with `_start` is a WASI command");
    };
    let s = Scheduler::builder().workers(1).build().expect("the scheduler starts");
    let outcome = s.handle().spawn(program.process(WasiOptions::new()), COMMAND_ENTRY).map_err(|e| format!("{e:#}"));
    let result = outcome.and_then(|process| {
        let result = process.join_timeout(HANG).expect("it ends");
        result.map(|payload| exit_code(&payload)).map_err(|e| e.to_string())
    });
    s.stop(Duration::from_secs(1));
    result
}

#[test]
fn a_module_past_max_tables_fails_naming_it_and_runs_with_it_raised() {
    let wat = r#"(module (table 1 funcref) (table 1 funcref) (func (export "_start")))"#;
    let error = run_command(Config::default().max_tables(1), wat).unwrap_err();
    assert!(error.contains("more than the 1 tables a process may have, its `max_tables`"), "{error}");
    assert!(error.contains("raise it with `--max-tables`"), "{error}");
    assert_eq!(run_command(Config::default().max_tables(2), wat), Ok(Some(0)));
}

#[test]
fn a_module_past_max_memories_fails_naming_it_and_runs_with_it_raised() {
    let wat = r#"(module (memory (export "memory") 1) (memory 1) (func (export "_start")))"#;
    let error = run_command(Config::default(), wat).unwrap_err();
    assert!(error.contains("more than the 1 linear memories a process may have, its `max_memories`"), "{error}");
    assert!(error.contains("raise it with `--max-memories`"), "{error}");
    // Two memories a process: the arena has two slots for each process.
    assert_eq!(run_command(Config::default().max_memories(2).max_instances(1), wat), Ok(Some(0)));
}

/// A table made past the limit fails instantiation; one grown past it ends the process.
#[test]
fn tables_past_max_table_elements_fail_naming_it_and_run_with_it_raised() {
    let made = r#"(module (table 100 funcref) (func (export "_start")))"#;
    let error = run_command(Config::default().max_table_elements(99), made).unwrap_err();
    assert!(error.contains("a table of 100 elements (from 0), past its `max_table_elements` of 99"), "{error}");
    assert!(error.contains("raise it with `--max-table-elements`"), "{error}");
    assert_eq!(run_command(Config::default().max_table_elements(100), made), Ok(Some(0)));

    let grown = r#"(module (table 1 funcref)
        (func (export "_start") (drop (table.grow (ref.null func) (i32.const 199)))))"#;
    let error = run_command(Config::default().max_table_elements(100), grown).unwrap_err();
    assert!(error.contains("a table of 200 elements (from 1), past its `max_table_elements` of 100"), "{error}");
    assert_eq!(run_command(Config::default().max_table_elements(200), grown), Ok(Some(0)));
}

/// What this process's memory costs now, in KiB: its proportional set size (a page
/// shared by several mappings, as a memory image's page is by every process reading it,
/// counted once) and its page tables.
fn memory_kib() -> u64 {
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no `{name}`"))
    };
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("/proc/self/smaps_rollup is readable");
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status is readable");
    field(&rollup, "Pss:") + field(&status, "VmPTE:")
}

/// Idle processes of each guest a batch after the first: what each more one costs, in
/// KiB. The first batch pays for what its processes share (the image's pages they
/// read); the second is counted.
fn idle_kib_each(guest: &Component) -> u64 {
    const FIRST: usize = 10;
    const MORE: usize = 40;
    let s = Scheduler::builder().workers(1).kind("squares", guest.clone()).build().expect("the scheduler starts");
    let spawn = |count: usize| -> Vec<_> {
        let processes: Vec<_> = (0..count)
            .map(|_| {
                let options = SpawnOptions::new("idle").input(vec![Payload::json(&()).unwrap()]);
                s.handle().spawn(Spawnable::kind("squares"), options).expect("`idle` spawns")
            })
            .collect();
        // A bound on a failure, not a measurement: the suite runs beside this child, and
        // fifty interpreters' first steps take their time on a loaded machine.
        let deadline = std::time::Instant::now() + 5 * HANG;
        // Each took its first step once steps reach the count of live processes (a
        // process may take more than one).
        while s.handle().stats().workers.iter().map(|w| w.executed).sum::<u64>() < s.handle().stats().live as u64 {
            assert!(std::time::Instant::now() < deadline, "the idle processes did not all take their first step");
            std::thread::sleep(Duration::from_millis(10));
        }
        processes
    };
    let first = spawn(FIRST);
    let before = memory_kib();
    let more = spawn(MORE);
    let each = memory_kib().saturating_sub(before) / MORE as u64;
    s.stop(Duration::from_secs(5));
    drop((first, more));
    each
}

/// Run alone in a child process by the test below (`WASMPROC_IDLE_COST`), so that no
/// other test's memory is counted: prints what an idle process of each guest costs.
#[test]
#[ignore = "run by `idle_python_and_javascript_processes_cost_only_the_pages_they_write`"]
fn idle_cost_alone() {
    if std::env::var_os("WASMPROC_IDLE_COST").is_none() {
        return;
    }
    let (python, javascript) = (python(), javascript());
    println!("idle-cost python={} javascript={}", idle_kib_each(python), idle_kib_each(javascript));
}

/// A new process of a guest with a large memory image (CPython's, SpiderMonkey's) shares
/// the image's pages instead of copying them: an idle one costs the pages it wrote, its
/// page tables and its share of the host's heap. Measured: about 640 KiB for Python and
/// 615 KiB for JavaScript, of which about 590 KiB are image pages the guest itself writes
/// by its first step (docs/perf/cow-images.md); 11 MiB and 3.1 MiB when every instance
/// copied its image. The bound, 1 MiB, is what sharing gives, not the issue's goal of 256 KiB.
#[test]
fn idle_python_and_javascript_processes_cost_only_the_pages_they_write() {
    python();
    javascript();
    let mut child = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["languages::idle_cost_alone", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("WASMPROC_IDLE_COST", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the test binary runs again");
    let deadline = std::time::Instant::now() + 25 * HANG;
    while child.try_wait().expect("the child can be waited for").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the measuring child did not end");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("piped"), &mut out).expect("its output");
    let line = out
        .lines()
        .find_map(|line| line.find("idle-cost ").map(|at| &line[at..]))
        .unwrap_or_else(|| panic!("no figures: {out}"));
    let kib = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|part| part.strip_prefix(name))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` in `{line}`"))
    };
    let (python, javascript) = (kib("python="), kib("javascript="));
    assert!(python <= 1024, "an idle Python process costs {python} KiB");
    assert!(javascript <= 1024, "an idle JavaScript process costs {javascript} KiB");
}
