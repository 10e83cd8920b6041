//! WASI programs run as processes (`host/src/wasm/command.rs`), through the library: what
//! is refused at load, exits from start functions, and the sandbox's time limits applied to
//! a program that never returns. The CLI's side is in `cli.rs`.

use std::time::Duration;

use wasmproc::Scheduler;
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{COMMAND_ENTRY, Config, Program, Runtime, WasiOptions, WasiProgram, exit_code};
use wasmproc_tests::HANG;

const HELLO: &str = env!("GUEST_HELLO");

fn runtime(config: Config) -> Runtime {
    Runtime::new(config.cache_dir(env!("CARGO_TARGET_TMPDIR")).log_sink(|_: &wasmproc::wasm::LogRecord<'_>| {}))
        .expect("the runtime starts")
}

/// A preview 1 module from WAT that imports `proc_exit`, with `body` as the rest of it.
fn module(body: &str) -> Vec<u8> {
    let wat = format!(
        r#"(module
          (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
          (memory (export "memory") 1)
          {body})"#
    );
    wat::parse_str(wat).expect("valid WAT")
}

fn command(runtime: &Runtime, bytes: &[u8]) -> WasiProgram {
    match runtime.load_program_bytes(bytes).expect("the program loads") {
        Program::Wasi(command) => command,
        Program::Process(_) => panic!("a core module with `_start` is a WASI command"),
    }
}

/// Endless: a loop with nothing in it but its back edge, where the epoch is checked.
const SPIN: &str = r#"(func (export "_start") (loop $l (br $l)))"#;

#[test]
fn a_start_export_of_the_wrong_type_is_refused_at_load() {
    let runtime = runtime(Config::default());
    let with_param = module(r#"(func (export "_start") (param i32))"#);
    let error = runtime.load_program_bytes(&with_param).map(|_| ()).expect_err("refused at load");
    let message = format!("{error:#}");
    assert!(message.contains("`_start` export is a function of type"), "{message}");
    assert!(message.contains("takes no parameters and returns nothing"), "{message}");
    let inspection = runtime.inspect(&with_param).expect("it compiles, so it can be described");
    let problem = inspection.problem.as_deref().expect("inspect says why it cannot run");
    assert!(problem.contains("`_start` export is a function of type"), "{problem}");
    assert!(inspection.entries.is_empty(), "nothing to run: {:?}", inspection.entries);

    let global = wat::parse_str(r#"(module (global (export "_start") i32 (i32.const 0)))"#).expect("valid WAT");
    let error = runtime.load_program_bytes(&global).map(|_| ()).expect_err("refused at load");
    assert!(format!("{error:#}").contains("`_start` export is not a function"), "{error:#}");
}

#[test]
fn a_start_function_that_exits_ends_the_program_with_its_code() {
    let runtime = runtime(Config::default());
    let program = command(
        &runtime,
        &module(r#"(func $init (call $proc_exit (i32.const 5))) (start $init) (func (export "_start") unreachable)"#),
    );
    let s = Scheduler::builder().workers(1).build().expect("the scheduler starts");
    let process = s.handle().spawn(program.process(WasiOptions::new()), COMMAND_ENTRY).expect("the spawn succeeds");
    let result = process.join_timeout(HANG).expect("it ends").expect("an exit is a result, not an error");
    assert_eq!(exit_code(&result), Some(5), "the start function's exit code, and `_start` never ran");
    s.stop(Duration::from_secs(1));
}

#[test]
fn an_endless_start_function_is_stopped_at_the_init_time_limit() {
    let runtime = runtime(Config::default().init_time_limit(Duration::from_millis(50)));
    let program =
        command(&runtime, &module(r#"(func $init (loop $l (br $l))) (start $init) (func (export "_start"))"#));
    let s = Scheduler::builder().workers(1).build().expect("the scheduler starts");
    let error = s.handle().spawn(program.process(WasiOptions::new()), COMMAND_ENTRY).map(|_| ()).unwrap_err();
    assert!(error.to_string().contains("init time limit exceeded"), "{error}");
    assert!(error.to_string().contains("`init_time_limit` of 50ms"), "{error}");
    s.stop(Duration::from_secs(1));
}

#[test]
fn an_endless_program_is_preempted_so_others_run_on_its_worker() {
    let runtime = runtime(Config::default().time_slice(Duration::from_millis(5)));
    let spin = command(&runtime, &module(SPIN));
    let s = Scheduler::builder()
        .workers(1)
        .kind("hello", runtime.load(HELLO).expect("hello loads"))
        .kind("spin", spin.clone())
        .build()
        .expect("the scheduler starts");
    // Both ways in: with options, and as a kind (the default options: no time limit).
    let spinners = [
        s.handle().spawn(spin.process(WasiOptions::new()), COMMAND_ENTRY).expect("the spinner starts"),
        s.handle().spawn(Spawnable::kind("spin"), COMMAND_ENTRY).expect("the kind starts"),
    ];
    for n in 0..20u32 {
        let good = s
            .handle()
            .spawn(
                Spawnable::kind("hello"),
                SpawnOptions::new("add").input(vec![wasmproc::Payload::json(&[n, 1]).unwrap()]),
            )
            .unwrap();
        let result = good.join_timeout(HANG).expect("a good process runs beside the programs").unwrap();
        assert_eq!(result.as_str(), Some((n + 1).to_string().as_str()));
    }
    for spinner in &spinners {
        assert!(spinner.try_result().is_none(), "without a limit the program runs on");
        s.handle().terminate(spinner.pid()).expect("the spinner is alive");
        let error = wasmproc_tests::said(spinner.join_timeout(HANG).expect("termination ends it").unwrap_err());
        assert!(error.contains("terminated"), "{error}");
    }
    s.stop(Duration::from_secs(1));
}

#[test]
fn an_endless_program_is_ended_at_its_time_limit_or_cpu_budget() {
    let budget = runtime(Config::default().time_slice(Duration::from_millis(5)).cpu_budget(Duration::from_millis(60)));
    let limit = runtime(Config::default().time_slice(Duration::from_millis(5)));
    let unpreempted = runtime(Config::default().preemption(false));
    let s = Scheduler::builder().workers(2).build().expect("the scheduler starts");
    let run = |runtime: &Runtime, options: WasiOptions| {
        let process = s.handle().spawn(command(runtime, &module(SPIN)).process(options), COMMAND_ENTRY).unwrap();
        wasmproc_tests::said(process.join_timeout(HANG).expect("the program is stopped").unwrap_err())
    };
    assert_eq!(
        run(&budget, WasiOptions::new()),
        "CPU budget exceeded: the process ran for longer than its `cpu_budget` of 60ms and was stopped"
    );
    let ms = Duration::from_millis(40);
    let expected = "time limit exceeded: the program ran longer than 40ms";
    assert_eq!(run(&limit, WasiOptions::new().time_limit(ms)), expected, "checked at epoch ticks, with preemption");
    assert_eq!(
        run(&unpreempted, WasiOptions::new().time_limit(ms)),
        expected,
        "checked at epoch ticks, without preemption"
    );
    s.stop(Duration::from_secs(1));
}
