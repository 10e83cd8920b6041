//! What the binary compiles and reserves, and what `inspect` answers: compile bombs
//! refused before compiling, `inspect` under an address-space limit, modules `inspect`
//! must not call runnable, flag values that cannot work.

use super::*;

/// `n` as unsigned LEB128, as the Wasm binary format writes counts and sizes.
fn leb(n: usize, out: &mut Vec<u8>) {
    wasmproc_types::leb128::write(out, n as u64);
}

/// A core module of `functions` functions of type `[] -> []`, each with the body `body`
/// (its instructions, without the locals or the final `end`), built directly in the
/// binary format: a WAT text of a million functions would take the test longer to parse
/// than the host takes to refuse it.
fn module(functions: usize, body: &[u8]) -> Vec<u8> {
    let mut wasm = b"\0asm\x01\0\0\0".to_vec();
    let mut section = |id: u8, content: Vec<u8>| {
        wasm.push(id);
        leb(content.len(), &mut wasm);
        wasm.extend_from_slice(&content);
    };
    section(1, vec![1, 0x60, 0, 0]);
    let mut declared = Vec::new();
    leb(functions, &mut declared);
    declared.resize(declared.len() + functions, 0);
    section(3, declared);
    let mut one = Vec::new();
    leb(body.len() + 2, &mut one);
    one.push(0); // no locals
    one.extend_from_slice(body);
    one.push(0x0b); // end
    let mut code = Vec::new();
    leb(functions, &mut code);
    for _ in 0..functions {
        code.extend_from_slice(&one);
    }
    section(10, code);
    wasm
}

#[test]
fn the_module_builder_makes_modules_that_run() {
    let dir = scratch("limits-builder");
    let small = dir.join("small.wasm");
    std::fs::write(&small, module(3, &[0x01])).expect("write");
    let found = run(&["inspect", small.to_str().expect("utf-8"), "--json", "--no-cache"]).expect(3).json();
    assert_eq!(found["kind"], "core module (not runnable)", "it compiled: {found}");
}

/// Issue 13: 1,000,000 empty functions took 44 s and 5.4 GiB to compile. Every command
/// that compiles refuses them, naming the limit, at once.
#[test]
fn a_million_functions_are_refused_before_compiling() {
    let dir = scratch("limits-functions");
    let bomb = dir.join("bomb.wasm");
    std::fs::write(&bomb, module(1_000_000, &[])).expect("write");
    let bomb = bomb.to_str().expect("utf-8");
    let out = dir.join("bomb.cwasm");
    for args in [vec!["run", bomb], vec!["inspect", bomb], vec!["compile", bomb, "-o", out.to_str().expect("utf-8")]] {
        let start = Instant::now();
        run(&args).expect(3).error_says(
            "the module has 1000000 functions, more than `max_functions` of 100000 (raise it with `--max-functions`)",
        );
        let took = start.elapsed();
        // Under a second on an idle machine (the whole command, a debug build); the
        // bound leaves room for a loaded CI machine, and a compile would take minutes.
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
    }
    run(&["inspect", bomb, "--max-functions", "999999"]).expect(3).error_says("more than `max_functions` of 999999");
    assert!(!out.exists());
}

#[test]
fn a_function_past_max_function_size_is_refused_before_compiling() {
    let dir = scratch("limits-function-size");
    let big = dir.join("big.wasm");
    std::fs::write(&big, module(1, &vec![0x01; 2 * 1024 * 1024])).expect("write");
    run(&["inspect", big.to_str().expect("utf-8")])
        .expect(3)
        .error_says("function 0 of the module's code is 2097154 bytes, more than `max_function_size` of 1048576");
    run(&["inspect", big.to_str().expect("utf-8"), "--max-function-size", "1KiB"])
        .expect(3)
        .error_says("more than `max_function_size` of 1024");
}

/// `inspect` and `compile` reserve one instance's address space, not `--max-processes`'
/// (10,000 × 64 MiB), so they work under `ulimit -v`; `run` past the limit says which
/// flags to lower, and works once they are.
#[test]
fn inspect_and_compile_work_under_an_address_space_limit() {
    let dir = scratch("limits-ulimit");
    let limited = |args: &[&str]| {
        let mut command = Command::new("bash");
        command
            .args(["-c", "ulimit -v 4000000 && exec \"$@\"", "bash", BINARY])
            .args(args)
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .stdin(Stdio::null());
        finish(command.output().expect("bash runs"))
    };
    let ran = limited(&["inspect", HELLO]).expect(0);
    assert!(ran.stdout.contains("runnable:  yes"), "{}", ran.stdout);
    let out = dir.join("hello.cwasm");
    limited(&["compile", HELLO, "-o", out.to_str().expect("utf-8")]).expect(0);

    let ran = limited(&["run", HELLO, "--method", "greet", "--input", "\"limited\""]).expect(5);
    let ran = ran.error_says("lower `max_instances` (`--max-processes`), `max_memory` (`--memory`) or `max_memories`");
    assert!(ran.stderr.contains("ulimit -v"), "{}", ran.stderr);
    let ran =
        limited(&["run", HELLO, "--method", "greet", "--input", "\"limited\"", "--max-processes", "16"]).expect(0);
    assert_eq!(ran.stdout, "\"hello, limited\"\n");
}

/// Issue 13: a preview 1 module with `_start` that calls WASI but exports no memory was
/// "runnable: yes" and then failed at run. `inspect` now says what `run` says.
#[test]
fn inspect_refuses_a_preview_1_module_without_a_memory_export() {
    let dir = scratch("limits-p1-memory");
    let module = dir.join("no-memory.wasm");
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory 1)
      (func (export "_start") (call $exit (i32.const 0))))"#;
    std::fs::write(&module, wat::parse_str(wat).expect("valid WAT")).expect("write");
    let path = module.to_str().expect("utf-8");
    let found = run(&["inspect", path, "--json"]).expect(3).json();
    assert_eq!(found["runnable"], false, "{found}");
    let problem = found["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("exports no memory named `memory`"), "{found}");
    run(&["run", path]).expect(3).error_says("exports no memory named `memory`");
}

/// `--fuel 0` exited 3, "bad module": the host's own call to `entries` at load was
/// charged to the process's budget. Now 0 is a usage error, and a small budget is the
/// process's failure, not the module's.
#[test]
fn a_fuel_budget_too_small_fails_the_process_not_the_module() {
    run(&["run", HELLO, "--method", "greet", "--fuel", "0"]).expect(2).error_says("0 is not in 1..");
    run(&["run", HELLO, "--method", "greet", "--input", "\"x\"", "--fuel", "10"])
        .expect(1)
        .error_says("fuel budget exhausted");
    run(&["inspect", HELLO, "--fuel", "1"]).expect(0);
}

/// The byte bounds of a mailbox and of a step's output are flags, explained in `--help`,
/// and a value that cannot work is a usage error.
#[test]
fn mailbox_and_step_output_bytes_are_flags_with_their_bounds() {
    let help = run(&["run", "--help"]).expect(0);
    for text in ["--mailbox-bytes <SIZE>", "[default: 64MiB]", "--max-step-output <SIZE>", "4 × --max-payload"] {
        assert!(help.stdout.contains(text), "`run --help` should mention {text:?}");
    }
    let help = run(&["node", "--help"]).expect(0);
    assert!(help.stdout.contains("--mailbox-bytes <SIZE>"), "`node --help` should mention --mailbox-bytes");
    run(&["run", HELLO, "--method", "greet", "--mailbox-bytes", "0"]).expect(2).error_says("at least 1 byte");
    run(&["run", HELLO, "--method", "greet", "--max-step-output", "1MiB"])
        .expect(2)
        .error_says("--max-step-output (1048576 bytes) must be at least --max-payload (16777216 bytes)");
    run(&[
        "run",
        HELLO,
        "--method",
        "greet",
        "--input",
        "\"x\"",
        "--mailbox-bytes",
        "1KiB",
        "--max-step-output",
        "32MiB",
    ])
    .expect(0);
}

/// The defaults `run --help` shows, and those the README's sandbox table states, are the
/// library's constants: written once, where the builder and the flag parser both take
/// them.
#[test]
fn documented_defaults_are_the_librarys_constants() {
    use wasmproc::{scheduler, wasm};
    let help = run(&["run", "--help"]).expect(0).stdout;
    // The `[default: …]` that follows the line that lists `flag`.
    let default_of = |flag: &str| -> String {
        let at = help.find(&format!("\n      {flag} ")).unwrap_or_else(|| panic!("`run --help` has no {flag}"));
        let rest = &help[at..];
        let start = rest.find("[default: ").expect("a default") + "[default: ".len();
        rest[start..start + rest[start..].find(']').expect("closed")].to_owned()
    };
    let mib = |bytes: usize| format!("{}MiB", bytes >> 20);
    let expected = [
        ("--max-processes", wasm::DEFAULT_MAX_INSTANCES.to_string()),
        ("--max-children", scheduler::DEFAULT_MAX_CHILDREN.to_string()),
        ("--max-yields", scheduler::DEFAULT_MAX_YIELDS_PER_STEP.to_string()),
        ("--max-payload", mib(scheduler::DEFAULT_MAX_PAYLOAD_SIZE)),
        ("--mailbox", scheduler::DEFAULT_MAILBOX_CAPACITY.to_string()),
        ("--mailbox-bytes", mib(scheduler::DEFAULT_MAILBOX_BYTES)),
        ("--memory", mib(wasm::DEFAULT_MAX_MEMORY)),
        ("--max-module-size", mib(wasm::DEFAULT_MAX_MODULE_SIZE)),
        ("--max-functions", wasm::DEFAULT_MAX_FUNCTIONS.to_string()),
        ("--time-slice", format!("{}ms", wasm::DEFAULT_TIME_SLICE.as_millis())),
        ("--init-time-limit", format!("{}ms", wasm::DEFAULT_INIT_TIME_LIMIT.as_millis())),
        ("--hibernate-after", format!("{}ms", scheduler::DEFAULT_HIBERNATE_AFTER.as_millis())),
    ];
    for (flag, default) in &expected {
        assert_eq!(&default_of(flag), default, "the default `run --help` shows for {flag}");
    }
    assert!(help.contains(&format!("Sandbox defaults: {} of memory", mib(wasm::DEFAULT_MAX_MEMORY))), "{help}");

    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let thousands = |n: usize| {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(digit);
        }
        out
    };
    let rows = [
        format!("| linear memory per process | {} MiB ", wasm::DEFAULT_MAX_MEMORY >> 20),
        format!(
            "| live processes | {} (`run`; a scheduler built by the library: {})",
            thousands(wasm::DEFAULT_MAX_INSTANCES as usize),
            thousands(scheduler::DEFAULT_MAX_PROCESSES)
        ),
        format!("| live children per process | {} ", thousands(scheduler::DEFAULT_MAX_CHILDREN)),
        format!("| live processes per process tree | {} ", thousands(scheduler::DEFAULT_MAX_DESCENDANTS)),
        format!("| commands per step | {} ", thousands(scheduler::DEFAULT_MAX_YIELDS_PER_STEP)),
        format!("| payload size | {} MiB ", scheduler::DEFAULT_MAX_PAYLOAD_SIZE >> 20),
        format!(
            "| output of a step | {} MiB ",
            (scheduler::DEFAULT_MAX_PAYLOAD_SIZE * scheduler::DEFAULT_OUTPUT_PER_PAYLOAD) >> 20
        ),
        format!(
            "| mailbox | {} messages and {} MiB ",
            thousands(scheduler::DEFAULT_MAILBOX_CAPACITY),
            scheduler::DEFAULT_MAILBOX_BYTES >> 20
        ),
    ];
    for row in &rows {
        assert!(readme.contains(row.as_str()), "README's sandbox table should have the row {row:?}");
    }
}
