//! Why a process ended, as data: the [`ExitReason`] its monitor's exit event and its
//! handle carry for each way a Wasm or a native process ends (a panic, a fuel budget, a
//! terminate, a stop's deadline, a pid that never was), and the reason a native process
//! reports for itself.

use std::sync::Arc;
use std::time::Duration;

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Command, Event, ExitReason, Payload, Pid, Process, Scheduler, SpawnRequest, Status, TrapKind};
use wasmproc_tests::guests::HOSTILE;
use wasmproc_tests::{HANG, Probe, Scripted};

/// The hostile guest under `config`, its compiled code cached in the tests' scratch space.
fn hostile(config: Config) -> Component {
    let config = config.cache_dir(env!("CARGO_TARGET_TMPDIR")).log_sink(|_: &wasmproc::wasm::LogRecord<'_>| {});
    Runtime::new(config).expect("the runtime starts").load(HOSTILE).expect("the hostile guest loads")
}

/// A process that spawns `method` of kind `kind`, monitored, and, if `terminate`,
/// terminates it once its pid is known; it ends when the child's exit arrives.
fn watcher(kind: &'static str, method: &'static str, terminate: bool) -> (Scripted, Arc<Probe>) {
    Scripted::new(move |t| {
        if t.step == 0 {
            let request = SpawnRequest {
                kind: Some(kind.to_owned()),
                method: method.to_owned(),
                input: vec![],
                monitor: true,
                link: false,
            };
            t.out.yield_command(1, Command::Spawn(request));
        }
        for event in &t.events {
            match event {
                Event::Completion { tag: 1, result: Ok(pid) } if terminate => {
                    let pid = Pid::from_u64(pid.to_u64().expect("a pid"));
                    t.out.yield_command(2, Command::Terminate(pid));
                }
                Event::Exit { .. } => {
                    t.out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                _ => {}
            }
        }
        t.out.set_status(Status::Blocked);
        Ok(())
    })
}

/// The reason of the one exit event `probe`'s process got, and whether it came through
/// a link.
fn exit_of(probe: &Probe) -> (ExitReason, bool) {
    let exits: Vec<(ExitReason, bool)> = probe
        .events()
        .into_iter()
        .filter_map(|event| match event {
            Event::Exit { reason, linked, .. } => Some((reason, linked)),
            _ => None,
        })
        .collect();
    match <[_; 1]>::try_from(exits) {
        Ok([exit]) => exit,
        Err(exits) => panic!("one exit event expected, got {exits:?}"),
    }
}

/// Runs a watcher of `method` of kind `kind` on `s` and returns the exit it got.
fn watched(s: &Scheduler, kind: &'static str, method: &'static str, terminate: bool) -> ExitReason {
    let (watcher, probe) = watcher(kind, method, terminate);
    let watching = s.handle().spawn(watcher, "main").expect("the watcher spawns");
    assert_eq!(watching.join_timeout(HANG), Some(Ok(Payload::empty())), "the watcher hears of the exit");
    let (reason, linked) = exit_of(&probe);
    assert!(!linked, "a monitor's exit comes through no link");
    reason
}

/// A Rust guest's panic reaches its monitor as a `panic` trap whose message is the
/// guest's own, with where it panicked.
#[test]
fn a_wasm_panic_is_a_panic_trap_with_the_guests_message() {
    let s = Scheduler::builder().kind("hostile", hostile(Config::default())).build().expect("starts");
    let reason = watched(&s, "hostile", "panic", false);
    let ExitReason::Trap(trap) = reason else { panic!("a panic is a trap: {reason:?}") };
    assert_eq!(trap.kind, TrapKind::Panic);
    assert!(
        trap.message.starts_with("the hostile guest panics on purpose (at hostile/src/lib.rs:"),
        "{}",
        trap.message
    );
    s.stop(Duration::from_secs(1));
}

/// A guest that burns its fuel budget traps with `out-of-fuel`, for its monitor and for
/// the embedder that waits on it.
#[test]
fn a_wasm_guest_out_of_fuel_is_an_out_of_fuel_trap() {
    let s = Scheduler::builder().kind("hostile", hostile(Config::default().fuel(1_000_000))).build().expect("starts");
    let reason = watched(&s, "hostile", "fuel-burn", false);
    assert!(matches!(&reason, ExitReason::Trap(trap) if trap.kind == TrapKind::OutOfFuel), "{reason:?}");
    assert!(reason.to_string().starts_with("trapped: out-of-fuel: fuel budget exhausted"), "{reason}");
    let direct = s.handle().spawn(Spawnable::kind("hostile"), "fuel-burn").expect("spawns");
    let ended = direct.join_timeout(HANG).expect("it runs out of fuel").unwrap_err();
    assert!(matches!(ended, ExitReason::Trap(trap) if trap.kind == TrapKind::OutOfFuel));
    s.stop(Duration::from_secs(1));
}

/// A terminated process, Wasm or native, ends with `terminated`; a monitor of a pid that
/// never was gets `noproc` at once.
#[test]
fn terminate_gives_terminated_and_a_pid_that_never_was_noproc() {
    let (idle, _) = Scripted::new(|t| {
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let idle = Arc::new(parking_lot::Mutex::new(Some(idle)));
    let native = move || -> anyhow::Result<Box<dyn Process>> {
        let idle = idle.lock().take();
        let idle = idle.map(|p| Box::new(p) as Box<dyn Process>);
        idle.ok_or_else(|| anyhow::anyhow!("made once"))
    };
    let s = Scheduler::builder()
        .kind("hostile", hostile(Config::default()))
        .kind("idle", native)
        .build()
        .expect("the scheduler starts");
    assert_eq!(watched(&s, "hostile", "spin", true), ExitReason::Terminated);
    assert_eq!(watched(&s, "idle", "main", true), ExitReason::Terminated);

    let nobody = Pid::from_u64(99 << 40);
    let (monitor, probe) = Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(1, Command::Monitor(nobody));
        }
        if t.events.iter().any(|e| matches!(e, Event::Exit { .. })) {
            t.out.complete(Ok(Payload::empty()));
        } else {
            t.out.set_status(Status::Blocked);
        }
        Ok(())
    });
    let monitoring = s.handle().spawn(monitor, "main").expect("spawns");
    assert_eq!(monitoring.join_timeout(HANG), Some(Ok(Payload::empty())));
    assert_eq!(exit_of(&probe), (ExitReason::Noproc, false));

    let spinning = s.handle().spawn(Spawnable::kind("hostile"), "spin").expect("spawns");
    s.handle().terminate(spinning.pid()).expect("it is alive");
    assert_eq!(spinning.join_timeout(HANG), Some(Err(ExitReason::Terminated)));
    s.stop(Duration::from_secs(1));
}

/// A stop that reaches its deadline kills what ignored its cancel, Wasm or native:
/// `killed`, not the process's own result.
#[test]
fn a_stop_past_its_deadline_kills_what_ignored_the_cancel() {
    let (stubborn, _) = Scripted::new(|t| {
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let s = Scheduler::builder().kind("hostile", hostile(Config::default())).build().expect("starts");
    let spinning = s.handle().spawn(Spawnable::kind("hostile"), "spin").expect("spawns");
    let native = s.handle().spawn(stubborn, "main").expect("spawns");
    let report = s.stop(Duration::from_millis(50));
    assert!(report.forced >= 2, "both are forced: {report:?}");
    assert_eq!(spinning.try_result(), Some(Err(ExitReason::Killed)));
    assert_eq!(native.try_result(), Some(Err(ExitReason::Killed)));
}

/// A native process reports a trap by returning an `ExitReason` as its step's error
/// (under context too); any other error is an `error` with its chain, and a panic in its
/// step a `panic` trap.
#[test]
fn a_native_process_reports_its_own_trap_error_or_panic() {
    let s = Scheduler::builder().build().expect("starts");
    let ends = |body: fn() -> anyhow::Result<()>| {
        let (process, _) = Scripted::new(move |_| body());
        s.handle().spawn(process, "main").expect("spawns").join_timeout(HANG).expect("it ends")
    };
    let overflow = ExitReason::trap(TrapKind::StackOverflow, "too deep");
    assert_eq!(ends(|| Err(ExitReason::trap(TrapKind::StackOverflow, "too deep").into())), Err(overflow.clone()));
    let under_context = || {
        let error: anyhow::Error = ExitReason::trap(TrapKind::StackOverflow, "too deep").into();
        Err(error.context("while recursing"))
    };
    assert_eq!(ends(under_context), Err(overflow));
    let failed = || Err(anyhow::anyhow!("no ledger").context("balancing"));
    assert_eq!(ends(failed), Err(ExitReason::Error("balancing: no ledger".to_owned())));
    let panicked = ends(|| panic!("out of cheese"));
    assert_eq!(panicked, Err(ExitReason::trap(TrapKind::Panic, "process panicked: out of cheese")));
    s.stop(Duration::from_secs(1));
}

/// The embedder sees the record of an end: the reason, and no exit signal's sender for a
/// process that ended by itself.
#[test]
fn the_handle_gives_the_whole_record_of_an_end() {
    let s = Scheduler::builder().build().expect("starts");
    let (failing, _) = Scripted::new(|t| {
        t.out.complete(Err("no".to_owned()));
        Ok(())
    });
    let process = s.handle().spawn(failing, SpawnOptions::new("main")).expect("spawns");
    let exited = process.wait_timeout(HANG).expect("it ends");
    assert_eq!((exited.reason.clone(), exited.signal_from), (ExitReason::Error("no".to_owned()), None));
    assert_eq!(exited.to_string(), "returned an error: no");
    let by_link = wasmproc::Exited::by_signal(ExitReason::trap(TrapKind::Panic, "boom"), Pid::from_u64(7));
    assert_eq!(by_link.to_string(), "exited because linked process 7 trapped: panic: boom");
    s.stop(Duration::from_secs(1));
}

/// `on_exit` calls back once with the end: registered before the end, from the thread
/// that ends the process; after it, at once. A cancel reaches one process only.
#[test]
fn on_exit_calls_back_with_the_end_before_or_after_it() {
    use std::sync::mpsc;
    let s = Scheduler::builder().workers(1).build().unwrap();
    let waiting = |_: &mut wasmproc_tests::Turn<'_>| Ok(());
    let (first, _) = Scripted::new(waiting);
    let (second, _) = Scripted::new(waiting);
    let first = s.handle().spawn(first, "main").unwrap();
    let second = s.handle().spawn(second, "main").unwrap();
    let (ended, endings) = mpsc::channel();
    let early = ended.clone();
    first.on_exit(move |exited| early.send(exited.reason.clone()).unwrap());
    s.handle().cancel(first.pid(), "only this one").unwrap();
    s.handle().terminate(first.pid()).unwrap();
    assert_eq!(endings.recv_timeout(HANG), Ok(ExitReason::Terminated));
    first.on_exit(move |exited| ended.send(exited.reason.clone()).unwrap());
    assert_eq!(endings.recv_timeout(HANG), Ok(ExitReason::Terminated), "at once, for an ended process");
    assert!(endings.recv_timeout(Duration::from_millis(50)).is_err(), "each callback once");
    assert!(second.try_exit().is_none(), "the other process runs on");
    s.stop(Duration::from_secs(1));
}
