//! Fuzzing the host on the stable toolchain: property tests (proptest) that feed it random
//! valid core modules (wasm-smith), random and mutated components, and random sequences of
//! embedder operations against live processes. The property is always the same: the host
//! does not panic, on any thread, and whatever it refuses it refuses with an `Err` that
//! says something. See `README.md` beside this file for how to run it long.
//!
//! cargo-fuzz would need a nightly toolchain; proptest runs under `cargo test`, shrinks a
//! failure to a small input, and keeps its seed (in `regressions/` here) so that every
//! later run tries it first.
//!
//! A panic in a process's step is caught by the scheduler and turned into the process's
//! error result ("process panicked: …"), so a host panic does not always reach the test's
//! thread: a panic hook records every panic of the binary with its thread, and each case
//! fails if one happened on its threads meanwhile.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use arbitrary::Unstructured;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, TestCaseError, TestRunner};
use wasmproc::scheduler::Spawnable;
use wasmproc::scheduler::{ProcessHandle, SpawnOptions};
use wasmproc::wasm::{
    COMMAND_ENTRY, Component, Config, LogRecord, Program, ProgramKind, Runtime, WasiOptions, WasiProgram, exit_code,
};
use wasmproc::{Capabilities, Format, Payload, Pid, Scheduler};
use wasmproc_tests::HANG;

const HELLO: &str = env!("GUEST_HELLO");
const HOSTILE: &str = env!("GUEST_HOSTILE");
const WASI_CLI: &str = env!("GUEST_WASI_CLI");

/// The entries of the `hello` and `hostile` guests, to spawn by name (the properties also
/// spawn names no guest has).
const HELLO_ENTRIES: &[&str] = &["greet", "add"];
const HOSTILE_ENTRIES: &[&str] = &[
    "spin",
    "memory-bomb",
    "stack-overflow",
    "deep-recursion",
    "panic",
    "trap-in-init",
    "send-in-init",
    "yield-flood",
    "flood-and-complete",
    "message-flood",
    "giant-payload",
    "giant-send",
    "giant-respond",
    "mailbox-hoard",
    "output-hoard",
    "spawn-bomb",
    "fuel-burn",
    "orphan",
    "busy",
    "probe",
];

/// Fuel for a process's whole life: bounds a random module's loops deterministically
/// (the CPU budget bounds them too, but only for processes of the `process` world).
const FUEL: u64 = 20_000_000;

/// How long a random WASI program may run: the backstop for what fuel does not meter
/// (a start function runs at instantiation, which is not charged).
const COMMAND_TIME_LIMIT: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------------
// Shared set-up

/// The cases each property runs: `PROPTEST_CASES` if set, else `default` times
/// `WASMPROC_FUZZ_SCALE` (1 unless set: `WASMPROC_FUZZ_SCALE=10` runs every property ten
/// times longer). The defaults keep the whole binary well under a minute in a debug build
/// on 2 cores. Failures are kept in `regressions` (proptest's corpus: replayed before any
/// new case).
fn proptest_config(default: u32, regressions: &'static str) -> ProptestConfig {
    let scale: u32 = std::env::var("WASMPROC_FUZZ_SCALE").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| default.saturating_mul(scale));
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..ProptestConfig::default()
    }
}

/// Runs `test` on values of `strategy` as a proptest property would (the `proptest!`
/// macro does the same), failing any case during which something panicked, and prints
/// what the cases came to (`--nocapture` shows it): the figures `README.md` quotes.
fn run_property<S: Strategy>(
    name: &str,
    config: ProptestConfig,
    threads: &str,
    strategy: S,
    test: impl Fn(S::Value, &Tally) -> Result<(), TestCaseError>,
) {
    // One property at a time: they share two cores and the thread pool wasmtime compiles
    // on, where one property's big compiles would queue another's small ones and make
    // every figure printed below meaningless.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let tally = Tally::default();
    let cases = config.cases;
    let start = Instant::now();
    let result = TestRunner::new(config).run(&strategy, |value| {
        let case = Instant::now();
        let result = without_panics(threads, || test(value, &tally));
        tally.add("(every case run, shrinking included)", case.elapsed());
        result
    });
    eprintln!("{name}: {cases} cases asked, {:.1?} in all; outcomes:\n{tally}", start.elapsed());
    if let Err(failure) = result {
        panic!("{name}: {failure}");
    }
}

/// How often each outcome came up, and the time the cases that ended in it took.
#[derive(Default)]
struct Tally(Mutex<BTreeMap<String, (u64, Duration)>>);

impl Tally {
    fn add(&self, outcome: impl Into<String>, took: Duration) {
        let mut outcomes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = outcomes.entry(outcome.into()).or_default();
        entry.0 += 1;
        entry.1 += took;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outcomes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for (outcome, (count, took)) in outcomes.iter() {
            writeln!(f, "  {count:>7}  {outcome} ({:.1?} in all)", *took)?;
        }
        Ok(())
    }
}

/// An error message's kind, for a [`Tally`]: its first three clauses, with what is
/// between backticks and every word with a digit left out (those differ from case to case).
fn kind_of(message: &str) -> String {
    let clauses = message.split(": ").take(3).collect::<Vec<_>>().join(": ");
    let mut unquoted = String::new();
    for (i, part) in clauses.split('`').enumerate() {
        unquoted.push_str(if i % 2 == 0 { part } else { "`…`" });
    }
    let words: Vec<&str> =
        unquoted.split(' ').map(|word| if word.contains(|c: char| c.is_ascii_digit()) { "N" } else { word }).collect();
    words.join(" ").chars().take(120).collect()
}

/// The thread of every panic so far, by name.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The tests of this binary: the test harness names each one's thread after it.
const TESTS: &[&str] = &[
    "random_modules_load_or_fail_cleanly_and_runs_end",
    "mutated_components_and_random_bytes_are_refused_cleanly",
    "random_operations_on_live_processes_end_in_a_clean_stop",
    "the_entry_lists_match_the_guests",
];

/// Installs the hook that records each panic's thread (and still prints the panic,
/// through the default hook).
fn record_panics() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("<unnamed>").to_owned();
            PANICS.lock().unwrap_or_else(PoisonError::into_inner).push(thread);
            default(info);
        }));
    });
}

/// Panics so far that may be this property's: on its test thread or its schedulers'
/// threads (named `threads`…), or on a thread no test owns (wasmtime's, the epoch
/// thread), which every property running at the time is blamed for.
fn panics(threads: &str) -> usize {
    let own = std::thread::current().name().unwrap_or_default().to_owned();
    let panics = PANICS.lock().unwrap_or_else(PoisonError::into_inner);
    panics
        .iter()
        .filter(|t| **t == own || t.starts_with(threads) || !(t.starts_with("fuzz-") || TESTS.contains(&t.as_str())))
        .count()
}

/// Runs one case and fails it if something panicked meanwhile: a worker's panic in a
/// step would otherwise only show as a process's error result. `threads` is the name
/// prefix of the property's scheduler threads; the panic's message and place are printed
/// by the default hook, above proptest's report.
fn without_panics(threads: &str, case: impl FnOnce() -> Result<(), TestCaseError>) -> Result<(), TestCaseError> {
    record_panics();
    let before = panics(threads);
    let result = case();
    let after = panics(threads);
    prop_assert_eq!(before, after, "something panicked during this case (printed above)");
    result
}

/// One runtime for the binary: making one reserves its arenas and starts its epoch thread.
/// Small limits keep random programs cheap; fuel and a CPU budget make every one end.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let config = Config::default()
            .max_memory(16 << 20)
            .max_instances(1024)
            .time_slice(Duration::from_millis(2))
            .cpu_budget(Duration::from_millis(50))
            .fuel(FUEL)
            .cache_dir(concat!(env!("CARGO_TARGET_TMPDIR"), "/fuzz-cache"))
            .log_sink(|_: &LogRecord<'_>| {});
        Runtime::new(config).expect("the runtime starts")
    })
}

/// A scheduler for a property that only needs somewhere to run what it loaded, its
/// threads named `name`…: one per property, so that a panic on one of its threads is
/// blamed on that property. Never stopped: the binary's exit ends its threads.
fn scheduler(name: &'static str, slot: &'static OnceLock<Scheduler>) -> &'static Scheduler {
    slot.get_or_init(|| {
        Scheduler::builder().workers(2).max_processes(256).thread_name(name).build().expect("the scheduler starts")
    })
}

const MODULES_THREADS: &str = "fuzz-modules";
const MUTATIONS_THREADS: &str = "fuzz-mutations";
const EVENTS_THREADS: &str = "fuzz-events";

fn modules_scheduler() -> &'static Scheduler {
    static SCHEDULER: OnceLock<Scheduler> = OnceLock::new();
    scheduler(MODULES_THREADS, &SCHEDULER)
}

fn mutations_scheduler() -> &'static Scheduler {
    static SCHEDULER: OnceLock<Scheduler> = OnceLock::new();
    scheduler(MUTATIONS_THREADS, &SCHEDULER)
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read `{path}`: {e}"))
}

fn load(path: &str) -> Component {
    runtime().load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"))
}

fn hello() -> &'static Component {
    static HELLO_COMPONENT: OnceLock<Component> = OnceLock::new();
    HELLO_COMPONENT.get_or_init(|| load(HELLO))
}

fn hostile() -> &'static Component {
    static HOSTILE_COMPONENT: OnceLock<Component> = OnceLock::new();
    HOSTILE_COMPONENT.get_or_init(|| load(HOSTILE))
}

fn wasi_cli() -> &'static WasiProgram {
    static WASI_CLI_COMMAND: OnceLock<WasiProgram> = OnceLock::new();
    WASI_CLI_COMMAND.get_or_init(|| match runtime().load_program(WASI_CLI) {
        Ok(Program::Wasi(command)) => command,
        other => panic!("`{WASI_CLI}` should load as a WASI command: {other:?}"),
    })
}

/// An error must say something: an empty message leaves the embedder nothing to show, and
/// a caught panic is a host bug however it is reported.
/// Counts a send or terminate request: `done` when accepted, else its refusal, which must
/// say something.
fn tally_request(
    tally: &Tally,
    what: &str,
    done: &str,
    result: Result<(), impl std::fmt::Display>,
) -> Result<(), TestCaseError> {
    match result {
        Ok(()) => tally.add(format!("{what}: {done}"), Duration::ZERO),
        Err(e) => {
            let message = e.to_string();
            says_something(what, &message)?;
            tally.add(format!("{what}: refused: {}", kind_of(&message)), Duration::ZERO);
        }
    }
    Ok(())
}

fn says_something(context: &str, message: &str) -> Result<(), TestCaseError> {
    prop_assert!(!message.trim().is_empty(), "{}: an error with an empty message", context);
    prop_assert!(!without_guest_panics(message).contains("panicked"), "{}: a caught panic: {}", context, message);
    Ok(())
}

/// `message` without the reports of a guest's own panics (``guest `step` panicked at
/// FILE:L:C: MESSAGE``, the host's account of a Rust guest's `unreachable`): those are
/// the guest's doing, where any other `panicked` is the host's.
fn without_guest_panics(message: &str) -> String {
    let mut rest = message;
    let mut kept = String::with_capacity(message.len());
    while let Some(at) = rest.find("guest `") {
        let after = &rest[at + "guest `".len()..];
        match after.split_once("` panicked at ") {
            Some((export, tail)) if !export.contains('`') => {
                kept.push_str(&rest[..at]);
                rest = tail;
            }
            _ => {
                kept.push_str(&rest[..at + "guest `".len()]);
                rest = after;
            }
        }
    }
    kept.push_str(rest);
    kept
}

fn check_err<T>(context: &str, result: &anyhow::Result<T>) -> Result<(), TestCaseError> {
    match result {
        Ok(_) => Ok(()),
        Err(e) => says_something(context, &format!("{e:#}")),
    }
}

/// Waits for `process` to end; it must, well within [`HANG`], and a failure must say why.
/// Returns what it ended with, for a [`Tally`].
fn ends(context: &str, process: &ProcessHandle) -> Result<String, TestCaseError> {
    let Some(outcome) = process.join_timeout(HANG) else {
        return Err(TestCaseError::fail(format!("{context}: process {} did not end within {HANG:?}", process.pid())));
    };
    match outcome {
        Ok(result) => Ok(match exit_code(&result) {
            Some(code) => format!("ended: exit code {code}"),
            None => "ended: a result".to_owned(),
        }),
        Err(e) => {
            let e = wasmproc_tests::said(e);
            says_something(context, &e)?;
            Ok(format!("ended: error: {}", kind_of(&e)))
        }
    }
}

/// Runs a loaded WASI program to its end on `scheduler`, with a time limit.
fn run_command(scheduler: &Scheduler, command: &WasiProgram) -> Result<String, TestCaseError> {
    let process = command.process(WasiOptions::new().args(["fuzz"]).time_limit(COMMAND_TIME_LIMIT));
    match scheduler.handle().spawn(process, COMMAND_ENTRY) {
        Ok(process) => ends("the WASI program", &process),
        Err(e) => {
            says_something("spawning the WASI program", &e.to_string())?;
            Ok(format!("spawn refused: {}", kind_of(&e.to_string())))
        }
    }
}

/// Runs each entry (the first few) of a component that loaded, with a made-up input.
fn run_entries(scheduler: &Scheduler, component: &Component, tally: &Tally) -> Result<(), TestCaseError> {
    for entry in component.entries().iter().take(4) {
        let input = vec![Payload::json(&[20, 22]).expect("encodes")];
        let outcome = match scheduler.handle().spawn(component.process(), SpawnOptions::new(entry).input(input)) {
            Ok(process) => ends(entry, &process)?,
            Err(e) => {
                says_something(entry, &e.to_string())?;
                format!("spawn refused: {}", kind_of(&e.to_string()))
            }
        };
        tally.add(format!("an entry {outcome}"), Duration::ZERO);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Property a: random valid core modules

/// What the generated module must export.
#[derive(Clone, Copy, Debug)]
enum Exports {
    /// A WASI command: `_start` and `memory`, so most modules load and run.
    Command,
    /// A `_start` of the wrong type.
    BadStart,
    /// Whatever wasm-smith picks (rarely a `_start`).
    Any,
}

/// WASI preview 1 functions a module may import: what the host links, so a module that
/// imports from this set links, and its calls reach the host with random arguments.
/// `poll_oneoff` is left out on purpose: a clock subscription would block the worker for
/// as long as the guest asks, since the time limit is checked in Wasm code, not during a
/// host call (a known limit of WASI programs, not something to find again every run).
const WASI_IMPORTS: &str = r#"
    (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "fd_read" (func (param i32 i32 i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "fd_close" (func (param i32) (result i32)))
    (import "wasi_snapshot_preview1" "fd_fdstat_get" (func (param i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "fd_prestat_get" (func (param i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "path_open"
        (func (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
    (import "wasi_snapshot_preview1" "random_get" (func (param i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "clock_time_get" (func (param i32 i64 i32) (result i32)))
    (import "wasi_snapshot_preview1" "args_sizes_get" (func (param i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "args_get" (func (param i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "environ_sizes_get" (func (param i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "sched_yield" (func (result i32)))
"#;

/// Imports the host does not provide, or not with that type.
const BOGUS_IMPORTS: &str = r#"
    (import "env" "missing" (func))
    (import "env" "memory" (memory 1))
    (import "wasi_snapshot_preview1" "random_get" (func (param i64)))
"#;

/// The configuration of one module: `exports` its shape; `unsupported` allows what the
/// host refuses (imports it does not provide, more memories than a process may have).
fn smith_config(exports: Exports, unsupported: bool) -> wasm_smith::Config {
    let imports = format!("(module {WASI_IMPORTS} {})", if unsupported { BOGUS_IMPORTS } else { "" });
    let shape = match exports {
        Exports::Command => Some(r#"(module (func (export "_start")) (memory (export "memory") 1))"#),
        Exports::BadStart => Some(r#"(module (func (export "_start") (param i32) (result i32) unreachable))"#),
        Exports::Any => None,
    };
    let mut config = wasm_smith::Config {
        available_imports: Some(wat::parse_str(imports).expect("the imports parse")),
        exports: shape.map(|wat| wat::parse_str(wat).expect("the exports parse")),
        ..wasm_smith::Config::default()
    };
    // Small modules compile fast in a debug build; more cases beat bigger ones.
    config.max_funcs = 8;
    config.max_types = 8;
    config.max_imports = 8;
    config.max_exports = 8;
    config.max_globals = 8;
    config.max_tables = 2;
    config.max_table_elements = 1_000;
    config.max_elements = 16;
    config.max_element_segments = 4;
    config.max_data_segments = 4;
    config.max_tags = 4;
    config.max_instructions = 64;
    config.max_nesting_depth = 6;
    // Memories of up to 64 MiB, past the 16 MiB cap, so instantiation refuses some (the
    // memory arena is host code); more than one only with `unsupported` (a process has
    // one, and most cases should get past instantiation). A command's exported memory
    // comes on top of `max_memories`.
    config.max_memories = match (unsupported, exports) {
        (true, _) => 4,
        (false, Exports::Command) => 0,
        (false, _) => 1,
    };
    config.max_memory32_bytes = 64 << 20;
    config.max_memory64_bytes = 64 << 20;
    // Features wasmtime 48 (as the host configures it) does not take: they only make the
    // module fail to compile, which the properties already cover with other modules.
    config.threads_enabled = false;
    config.shared_everything_threads_enabled = false;
    config.gc_enabled = false;
    config.exceptions_enabled = false;
    config.compact_imports_enabled = false;
    config.reference_types_enabled = false;
    config.wide_arithmetic_enabled = false;
    config
}

/// `module` as the one core module of an otherwise empty component: compiles as a
/// component, then fails the world check (and is no WASI command).
fn in_a_component(module: &[u8]) -> Vec<u8> {
    let mut component = b"\0asm\x0d\x00\x01\x00".to_vec();
    component.push(1); // the core module section
    wasmproc_types::leb128::write(&mut component, module.len() as u64);
    component.extend_from_slice(module);
    component
}

fn exports() -> impl Strategy<Value = Exports> {
    prop_oneof![4 => Just(Exports::Command), 1 => Just(Exports::BadStart), 2 => Just(Exports::Any)]
}

/// Checks one module; returns what became of it, for a [`Tally`].
fn check_module(bytes: &[u8]) -> Result<String, TestCaseError> {
    let runtime = runtime();
    let inspection = runtime.inspect(bytes);
    check_err("inspect", &inspection)?;
    let program = runtime.load_program_bytes(bytes);
    check_err("load_program_bytes", &program)?;
    // Both compile the same bytes: one cannot succeed where the other fails to compile.
    if let (Err(e), Ok(_)) = (&inspection, &program) {
        prop_assert!(false, "inspect failed ({:#}) where load_program_bytes succeeded", e);
    }
    let outcome = match &program {
        Ok(Program::Wasi(command)) => {
            if let Ok(inspection) = &inspection {
                prop_assert_eq!(inspection.kind, ProgramKind::WasiModule);
            }
            format!("a WASI command that {}", run_command(modules_scheduler(), command)?)
        }
        Ok(Program::Process(_)) => return Err(TestCaseError::fail("a core module loaded as a process component")),
        Err(e) => format!("refused: {}", kind_of(&format!("{e:#}"))),
    };
    let as_process = runtime.load_bytes(bytes);
    prop_assert!(as_process.is_err(), "a core module loaded as a process component");
    check_err("load_bytes", &as_process)?;

    // The precompiled file of what compiled loads as the same kind of program.
    if inspection.is_ok() {
        let precompiled = runtime.precompile(bytes);
        check_err("precompile", &precompiled)?;
        if let Ok(file) = precompiled {
            check_err("inspect (precompiled)", &runtime.inspect(&file))?;
            let reloaded = runtime.load_program_bytes(&file);
            check_err("load_program_bytes (precompiled)", &reloaded)?;
            prop_assert_eq!(
                matches!(reloaded, Ok(Program::Wasi(_))),
                matches!(program, Ok(Program::Wasi(_))),
                "the precompiled file loads as another kind of program"
            );
        }
    }

    let component = in_a_component(bytes);
    check_err("inspect (in a component)", &runtime.inspect(&component))?;
    let wrapped = runtime.load_program_bytes(&component);
    prop_assert!(wrapped.is_err(), "a component with nothing but a core module loaded");
    check_err("load_program_bytes (in a component)", &wrapped)?;
    Ok(outcome)
}

/// Random valid core modules (wasm-smith, from proptest's bytes), most shaped as WASI
/// commands importing WASI functions: inspected, loaded, precompiled and reloaded,
/// wrapped in a component, and run to their end when they load as a WASI command.
#[test]
fn random_modules_load_or_fail_cleanly_and_runs_end() {
    let strategy = (exports(), proptest::bool::weighted(0.2), proptest::collection::vec(any::<u8>(), 0..4096));
    let config = proptest_config(64, concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/modules.txt"));
    run_property("modules", config, MODULES_THREADS, strategy, |(exports, unsupported, seed), tally| {
        let start = Instant::now();
        let mut u = Unstructured::new(&seed);
        let outcome = match wasm_smith::Module::new(smith_config(exports, unsupported), &mut u) {
            Ok(module) => check_module(&module.to_bytes())?,
            Err(e) => format!("wasm-smith made no module: {e}"),
        };
        tally.add(outcome, start.elapsed());
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// Property b: random bytes and mutated components

/// What a case starts from.
#[derive(Clone, Copy, Debug)]
enum Base {
    Hello,
    Hostile,
    /// `hello` precompiled by this runtime (`Runtime::precompile`).
    HelloPrecompiled,
    /// A small WASI command module precompiled by this runtime.
    ModulePrecompiled,
    /// Random bytes behind a real header: a core module's, a component's, a precompiled
    /// file's (its magic line), or none.
    Random(Header),
}

#[derive(Clone, Copy, Debug)]
enum Header {
    Module,
    Component,
    Precompiled,
    None,
}

/// One edit of the bytes. Positions are [`Index`]es: proportions of the length.
#[derive(Clone, Debug)]
enum Mutation {
    FlipBit(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, u16),
    Truncate(Index),
    /// Copies a run of the bytes over another place (keeps them Wasm-like).
    Copy {
        from: Index,
        to: Index,
        len: u16,
    },
    /// Sets a field of a precompiled file's JSON header (a no-op on anything else). The
    /// checksum covers only the compiled code after the header, so these edits reach the
    /// header checks instead of stopping at the checksum.
    HeaderField(&'static str, serde_json::Value),
}

const HEADER_FIELDS: &[&str] =
    &["format", "wasmproc", "engine", "kind", "max_memory", "fuel", "source_sha256", "unknown"];

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::json!("module")),
        Just(serde_json::json!("component")),
        Just(serde_json::json!("")),
        ".{0,12}".prop_map(serde_json::Value::from),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
        Just(serde_json::json!([1, 2])),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), 0..8u8).prop_map(|(at, bit)| Mutation::FlipBit(at, bit)),
        3 => (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set(at, byte)),
        2 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(at, b)| Mutation::Insert(at, b)),
        2 => (any::<Index>(), 1..64u16).prop_map(|(at, len)| Mutation::Delete(at, len)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), any::<Index>(), 1..256u16).prop_map(|(from, to, len)| Mutation::Copy { from, to, len }),
        1 => prop_oneof![
            // The one header field the checks after it trust: the kind of code to load.
            1 => prop_oneof![Just("module"), Just("component")]
                .prop_map(|kind| Mutation::HeaderField("kind", serde_json::Value::from(kind))),
            2 => (proptest::sample::select(HEADER_FIELDS), json_value()).prop_map(|(f, v)| Mutation::HeaderField(f, v)),
        ],
    ]
}

fn base() -> impl Strategy<Value = Base> {
    prop_oneof![
        3 => Just(Base::Hello),
        3 => Just(Base::Hostile),
        2 => Just(Base::HelloPrecompiled),
        1 => Just(Base::ModulePrecompiled),
        1 => Just(Base::Random(Header::Module)),
        1 => Just(Base::Random(Header::Component)),
        1 => Just(Base::Random(Header::Precompiled)),
        1 => Just(Base::Random(Header::None)),
    ]
}

fn hello_precompiled() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| runtime().precompile(&read(HELLO)).expect("hello precompiles"))
}

fn base_bytes(base: Base, random: &[u8]) -> Vec<u8> {
    static HELLO_BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    static HOSTILE_BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    static MODULE_FILE: OnceLock<Vec<u8>> = OnceLock::new();
    match base {
        Base::Hello => HELLO_BYTES.get_or_init(|| read(HELLO)).clone(),
        Base::Hostile => HOSTILE_BYTES.get_or_init(|| read(HOSTILE)).clone(),
        Base::HelloPrecompiled => hello_precompiled().to_vec(),
        Base::ModulePrecompiled => MODULE_FILE
            .get_or_init(|| {
                let module = wat::parse_str(r#"(module (func (export "_start")) (memory (export "memory") 1))"#)
                    .expect("the module parses");
                runtime().precompile(&module).expect("the module precompiles")
            })
            .clone(),
        Base::Random(header) => {
            let mut bytes = match header {
                Header::Module => b"\0asm\x01\x00\x00\x00".to_vec(),
                Header::Component => b"\0asm\x0d\x00\x01\x00".to_vec(),
                // The magic line, taken from a real file rather than copied from the host.
                Header::Precompiled => {
                    let file = hello_precompiled();
                    let magic = file.iter().position(|&b| b == b'\n').map_or(0, |end| end + 1);
                    file[..magic].to_vec()
                }
                Header::None => Vec::new(),
            };
            bytes.extend_from_slice(random);
            bytes
        }
    }
}

fn mutate(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let at = |index: &Index, bytes: &[u8]| if bytes.is_empty() { 0 } else { index.index(bytes.len()) };
    match mutation {
        Mutation::FlipBit(index, bit) if !bytes.is_empty() => {
            let i = at(index, bytes);
            bytes[i] ^= 1 << bit;
        }
        Mutation::Set(index, byte) if !bytes.is_empty() => {
            let i = at(index, bytes);
            bytes[i] = *byte;
        }
        Mutation::Insert(index, new) => {
            let i = at(index, bytes);
            bytes.splice(i..i, new.iter().copied());
        }
        Mutation::Delete(index, len) => {
            let i = at(index, bytes);
            let end = (i + usize::from(*len)).min(bytes.len());
            bytes.drain(i..end);
        }
        Mutation::Truncate(index) => {
            let i = at(index, bytes);
            bytes.truncate(i);
        }
        Mutation::Copy { from, to, len } if !bytes.is_empty() => {
            let (from, to) = (at(from, bytes), at(to, bytes));
            let len = usize::from(*len).min(bytes.len() - from).min(bytes.len() - to);
            bytes.copy_within(from..from + len, to);
        }
        Mutation::HeaderField(field, value) => set_header_field(bytes, field, value),
        Mutation::FlipBit(..) | Mutation::Set(..) | Mutation::Copy { .. } => {}
    }
}

/// Rewrites one field of a precompiled file's header line, if `bytes` have one that is
/// a JSON object.
fn set_header_field(bytes: &mut Vec<u8>, field: &str, value: &serde_json::Value) {
    let Some(magic_end) = bytes.iter().position(|&b| b == b'\n').map(|end| end + 1) else { return };
    let Some(line_end) = bytes[magic_end..].iter().position(|&b| b == b'\n').map(|end| magic_end + end) else {
        return;
    };
    let Ok(serde_json::Value::Object(mut header)) = serde_json::from_slice(&bytes[magic_end..line_end]) else {
        return;
    };
    header.insert(field.to_owned(), value.clone());
    let line = serde_json::to_vec(&header).expect("a JSON object encodes");
    bytes.splice(magic_end..line_end, line);
}

/// Checks one file; returns what became of it, for `tally`.
fn check_bytes(bytes: &[u8], tally: &Tally) -> Result<String, TestCaseError> {
    let runtime = runtime();
    let inspection = runtime.inspect(bytes);
    check_err("inspect", &inspection)?;
    let program = runtime.load_program_bytes(bytes);
    check_err("load_program_bytes", &program)?;
    let component = runtime.load_bytes(bytes);
    check_err("load_bytes", &component)?;
    if let Ok(component) = &component {
        // What loads as a process is one to `inspect` too, and its processes end.
        match &inspection {
            Ok(inspection) => prop_assert!(
                inspection.kind == ProgramKind::Process && inspection.problem.is_none(),
                "loads as a process, but inspect says {:?} ({:?})",
                inspection.kind,
                inspection.problem
            ),
            Err(e) => prop_assert!(false, "loads as a process, but inspect fails: {:#}", e),
        }
        run_entries(mutations_scheduler(), component, tally)?;
    }
    Ok(match &program {
        Ok(Program::Process(_)) => "loaded as a process".to_owned(),
        Ok(Program::Wasi(command)) => {
            format!("a WASI command that {}", run_command(mutations_scheduler(), command)?)
        }
        Err(e) => format!("refused: {}", kind_of(&format!("{e:#}"))),
    })
}

/// Real components (and a precompiled file) with a few random edits, and random bytes
/// behind real headers: inspected and loaded, and run when they still load.
#[test]
fn mutated_components_and_random_bytes_are_refused_cleanly() {
    let strategy =
        (base(), proptest::collection::vec(any::<u8>(), 0..512), proptest::collection::vec(mutation(), 0..6));
    let config = proptest_config(12, concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/mutations.txt"));
    run_property("mutations", config, MUTATIONS_THREADS, strategy, |(base, random, mutations), tally| {
        let start = Instant::now();
        let mut bytes = base_bytes(base, &random);
        for mutation in &mutations {
            mutate(&mut bytes, mutation);
        }
        let outcome = check_bytes(&bytes, tally)?;
        tally.add(format!("{base:?}: {outcome}"), start.elapsed());
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// Property c: random operations against live processes

/// Who an operation is aimed at.
#[derive(Clone, Debug)]
enum Target {
    /// One of the processes this case spawned (alive or not).
    Spawned(Index),
    /// Any pid: the host's own (0), small ones that other processes (children) may have,
    /// and ones no process has.
    Raw(u64),
}

/// Capabilities for a process spawned with options.
#[derive(Clone, Copy, Debug)]
enum Caps {
    Default,
    None,
    All,
    NoSpawn,
    NoSend,
}

#[derive(Clone, Debug)]
enum Op {
    SpawnKind {
        kind: &'static str,
        method: String,
        input: Vec<Payload>,
    },
    SpawnWith {
        hostile: bool,
        method: String,
        input: Vec<Payload>,
        caps: Caps,
        mailbox: usize,
    },
    /// The `wasi-cli` example as a WASI command with these arguments.
    SpawnCommand {
        args: Vec<String>,
    },
    Send {
        to: Target,
        topic: String,
        body: Payload,
    },
    Terminate(Target),
    CancelAll(String),
    Pause(u8),
}

/// Any entry method: the guests' own, a WASI command's, and made-up ones.
fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(HELLO_ENTRIES).prop_map(str::to_owned),
        4 => proptest::sample::select(HOSTILE_ENTRIES).prop_map(str::to_owned),
        1 => Just(COMMAND_ENTRY.to_owned()),
        1 => ".{0,12}",
    ]
}

/// A process kind and an entry method: mostly ones that go together (so most spawns get
/// past `init`), sometimes any (unknown kinds, and entries of another kind).
fn kind_and_method() -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        3 => proptest::sample::select(HELLO_ENTRIES).prop_map(|m| ("hello", m.to_owned())),
        4 => proptest::sample::select(HOSTILE_ENTRIES).prop_map(|m| ("hostile", m.to_owned())),
        1 => Just(("cli", COMMAND_ENTRY.to_owned())),
        2 => (proptest::sample::select(&["hello", "hostile", "cli", "nope", ""][..]), method()),
    ]
}

/// Inputs the guests understand (numbers, pairs, strings) and ones they do not.
fn payload() -> impl Strategy<Value = Payload> {
    let json = |value: serde_json::Value| Payload { format: Format::Json, data: value.to_string().into_bytes() };
    prop_oneof![
        (any::<i64>(), any::<i64>()).prop_map(move |(a, b)| json(serde_json::json!([a, b]))),
        (-5..50i64, -5..50i64).prop_map(move |(a, b)| json(serde_json::json!([a, b]))),
        ".{0,16}".prop_map(move |s| json(serde_json::Value::from(s))),
        (0..200u64).prop_map(move |n| json(serde_json::Value::from(n))),
        // `message-flood` and `busy` read their input as text: a pid, or milliseconds.
        (0..40u64).prop_map(|n| Payload::text(n.to_string())),
        (
            prop_oneof![
                Just(Format::Json),
                Just(Format::Bytes),
                Just(Format::Text),
                ".{0,8}".prop_map(|f| Format::from_name(&f))
            ],
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(format, data)| Payload { format, data }),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => any::<Index>().prop_map(Target::Spawned),
        1 => (0..64u64).prop_map(Target::Raw),
        1 => any::<u64>().prop_map(Target::Raw),
    ]
}

fn caps() -> impl Strategy<Value = Caps> {
    prop_oneof![Just(Caps::Default), Just(Caps::None), Just(Caps::All), Just(Caps::NoSpawn), Just(Caps::NoSend)]
}

fn op() -> impl Strategy<Value = Op> {
    let input = || proptest::collection::vec(payload(), 0..3);
    prop_oneof![
        6 => (kind_and_method(), input())
            .prop_map(|((kind, method), input)| Op::SpawnKind { kind, method, input }),
        2 => (kind_and_method(), input(), caps(), 0..8usize).prop_map(|((kind, method), input, caps, mailbox)| {
            Op::SpawnWith { hostile: kind == "hostile", method, input, caps, mailbox }
        }),
        1 => proptest::collection::vec(
                prop_oneof![Just("--spin".to_owned()), Just("--exit".to_owned()), Just("--cat".to_owned()), "[a-z0-9/]{0,6}"],
                0..4,
            )
            .prop_map(|args| Op::SpawnCommand { args }),
        5 => (target(), ".{0,8}", payload()).prop_map(|(to, topic, body)| Op::Send { to, topic, body }),
        2 => target().prop_map(Op::Terminate),
        1 => ".{0,8}".prop_map(Op::CancelAll),
        2 => (0..20u8).prop_map(Op::Pause),
    ]
}

/// Runs `ops` against a fresh scheduler, stops it after `grace`, and checks that every
/// process spawned has ended, and said why if it failed.
fn run_ops(ops: &[Op], grace: Duration, tally: &Tally) -> Result<(), TestCaseError> {
    let scheduler = Scheduler::builder()
        .workers(2)
        .max_processes(64)
        .max_children(16)
        .mailbox_capacity(32)
        .thread_name(EVENTS_THREADS)
        .kind("hello", hello().clone())
        .kind("hostile", hostile().clone())
        .kind("cli", wasi_cli().clone())
        .build()
        .expect("the scheduler starts");
    let mut spawned: Vec<ProcessHandle> = Vec::new();
    let pid = |target: &Target, spawned: &[ProcessHandle]| match target {
        Target::Spawned(index) if !spawned.is_empty() => spawned[index.index(spawned.len())].pid(),
        Target::Spawned(_) => Pid::from_u64(1),
        Target::Raw(raw) => Pid::from_u64(*raw),
    };
    for op in ops {
        let spawn = match op {
            Op::SpawnKind { kind, method, input } => {
                Some(scheduler.handle().spawn(Spawnable::kind(*kind), SpawnOptions::new(method).input(input.clone())))
            }
            Op::SpawnWith { hostile: is_hostile, method, input, caps, mailbox } => {
                let component = if *is_hostile { hostile() } else { hello() };
                let caps = match caps {
                    Caps::Default => Capabilities::default(),
                    Caps::None => Capabilities::none(),
                    Caps::All => Capabilities::all(),
                    Caps::NoSpawn => Capabilities::default().deny("spawn"),
                    Caps::NoSend => Capabilities::default().deny("send"),
                };
                let options = SpawnOptions::new(method.as_str())
                    .input(input.clone())
                    .capabilities(caps)
                    .mailbox_capacity(*mailbox);
                Some(scheduler.handle().spawn(component.process(), options))
            }
            Op::SpawnCommand { args } => {
                let options = WasiOptions::new()
                    .args(std::iter::once("wasi-cli".to_owned()).chain(args.iter().cloned()))
                    .time_limit(Duration::from_millis(100));
                Some(scheduler.handle().spawn(wasi_cli().process(options), COMMAND_ENTRY))
            }
            Op::Send { to, topic, body } => {
                let sent = scheduler.handle().send(pid(to, &spawned), topic.as_str(), body.clone());
                tally_request(tally, "send", "delivered", sent)?;
                None
            }
            Op::Terminate(to) => {
                tally_request(tally, "terminate", "requested", scheduler.handle().terminate(pid(to, &spawned)))?;
                None
            }
            Op::CancelAll(reason) => {
                scheduler.handle().cancel_all(reason);
                tally.add("cancel_all", Duration::ZERO);
                None
            }
            Op::Pause(millis) => {
                std::thread::sleep(Duration::from_millis(u64::from(*millis)));
                None
            }
        };
        match spawn {
            Some(Ok(process)) => spawned.push(process),
            Some(Err(e)) => {
                says_something("spawn", &e.to_string())?;
                tally.add(format!("spawn: refused: {}", kind_of(&e.to_string())), Duration::ZERO);
            }
            None => {}
        }
    }
    let start = Instant::now();
    let report = scheduler.stop(grace);
    prop_assert!(start.elapsed() < HANG, "stop took {:?}", start.elapsed());
    prop_assert_eq!(scheduler.handle().live(), 0, "processes alive after stop");
    tally.add(format!("stop: {} processes forced", if report.forced == 0 { "no" } else { "some" }), start.elapsed());
    for process in &spawned {
        let outcome = ends("after stop", process)?;
        tally.add(format!("spawn: a process {outcome}"), Duration::ZERO);
    }
    Ok(())
}

/// Random spawns (known and unknown kinds and entries, good and garbage input, options),
/// messages, terminations and cancels, to live, dead and made-up pids, on a scheduler
/// running the `hello` and `hostile` guests and a WASI command; then a stop.
#[test]
fn random_operations_on_live_processes_end_in_a_clean_stop() {
    let strategy = (
        proptest::collection::vec(op(), 1..48),
        prop_oneof![Just(0u64), Just(10), Just(50)].prop_map(Duration::from_millis),
    );
    let config = proptest_config(64, concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/events.txt"));
    run_property("events", config, EVENTS_THREADS, strategy, |(ops, grace), tally| run_ops(&ops, grace, tally));
}

/// The entry lists above are the guests' own: otherwise the event property would spawn
/// only unknown entries and miss what the guests do.
#[test]
fn the_entry_lists_match_the_guests() {
    assert_eq!(hello().entries(), HELLO_ENTRIES);
    assert_eq!(hostile().entries(), HOSTILE_ENTRIES);
    assert!(!wasi_cli().is_core_module());
}
