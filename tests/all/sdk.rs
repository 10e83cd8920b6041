//! The guest SDK's features with real guests (`examples-wasm/sdk-tour`, `fan-out`):
//! commands past the per-step limit, cancellation of every wait, typed errors, timeouts,
//! parents, `select_any`, typed spawning and the `log` backend.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Level, LogRecord, LogSource, Runtime};
use wasmproc::{Outcome, Payload, Pid, Scheduler};
use wasmproc_tests::HANG;

const TOUR: &str = "sdk-tour";

fn load(path: &str, config: Config) -> Component {
    // Compiled components are cached under the test's scratch directory, not the user's.
    let runtime = Runtime::new(config.cache_dir(env!("CARGO_TARGET_TMPDIR"))).expect("the runtime starts");
    runtime.load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"))
}

fn tour() -> Scheduler {
    Scheduler::builder().kind(TOUR, load(env!("GUEST_SDK_TOUR"), Config::default())).build().expect("starts")
}

/// Runs `kind`'s entry `method` with `input` as JSON, waiting up to `limit`.
fn run(s: &Scheduler, kind: &str, method: &str, input: serde_json::Value, limit: Duration) -> Outcome {
    run_to_end(s, kind, method, input, limit).map_err(wasmproc_tests::said)
}

/// As [`run`], with the reason of an abnormal end.
fn run_to_end(
    s: &Scheduler,
    kind: &str,
    method: &str,
    input: serde_json::Value,
    limit: Duration,
) -> Result<Payload, wasmproc::ExitReason> {
    let input = vec![Payload::json(&input).expect("serialises")];
    let process = s
        .handle()
        .spawn(Spawnable::kind(kind), SpawnOptions::new(method).input(input))
        .unwrap_or_else(|e| panic!("spawn `{method}`: {e}"));
    process.join_timeout(limit).unwrap_or_else(|| panic!("`{kind}` `{method}` did not finish"))
}

/// A successful JSON result, decoded.
fn value(outcome: Outcome) -> serde_json::Value {
    let payload = outcome.unwrap_or_else(|e| panic!("the process failed: {e}"));
    serde_json::from_slice(&payload.data).expect("a JSON result")
}

/// The README's `squares` over 100,000 children: 98 steps' worth of spawns past the
/// default limit of 1,024 commands a step, which the SDK yields a step's worth at a time,
/// and then 100,000 waits, under the default process and child limits (children end as
/// fast as they are spawned).
#[test]
fn join_all_over_100000_spawns_completes() {
    const CHILDREN: u64 = 100_000;
    // The children's `init` is timed in wall time, which a loaded machine stretches: not
    // what this test bounds.
    let config = Config::default().init_time_limit(Duration::from_secs(5));
    let s = Scheduler::builder().kind("fan-out", load(env!("GUEST_FAN_OUT"), config)).build().expect("starts");
    // A bound on a failure (a debug build spawns slowly), not a measurement.
    let squares = value(run(&s, "fan-out", "main", CHILDREN.into(), HANG * 15));
    let squares = squares.as_array().expect("an array");
    assert_eq!(squares.len() as u64, CHILDREN);
    for i in [0, 1, 1023, 1024, 1025, 65_536, CHILDREN - 1] {
        assert_eq!(squares[i as usize].as_u64(), Some(i * i), "child {i}");
    }
    let stats = s.handle().stats();
    assert_eq!(stats.spawned, CHILDREN + 1, "{stats:?}");
}

/// The guest learns the host's limit rather than assuming the default: under a limit of
/// 8 commands a step, 100 spawns go out 8 at a time and the process is not ended for it.
#[test]
fn the_guest_keeps_to_a_lower_yield_limit_than_the_default() {
    let s = Scheduler::builder()
        .kind("fan-out", load(env!("GUEST_FAN_OUT"), Config::default()))
        .max_yields_per_step(8)
        .build()
        .expect("starts");
    let squares: Vec<u64> = (0..100).map(|i| i * i).collect();
    assert_eq!(value(run(&s, "fan-out", "main", 100.into(), HANG)), serde_json::json!(squares));
}

/// A guest waiting in a 10 s sleep, a receive and a timeout sees the shutdown's cancel in
/// each of them, as a typed `Cancelled` error, and ends by itself within the grace: it is
/// cancelled, not forced, and its result is what it made of the three errors (a sleep
/// that ran its course would have given "done").
#[test]
fn a_cancel_ends_every_wait_of_a_sleeping_guest() {
    let s = tour();
    let patient = s.handle().spawn(Spawnable::kind(TOUR), "patient").expect("spawns");
    // A grace far longer than the sleep: only a sleep that ignored the cancel would see
    // its end, and then report "done".
    let report = s.stop(Duration::from_secs(60));
    assert_eq!((report.cancelled, report.forced), (1, 0), "{report:?}");
    let outcome = patient.join_timeout(HANG).expect("the guest ended").map_err(wasmproc_tests::said);
    let cancelled = "cancelled (shutdown)";
    assert_eq!(value(outcome), serde_json::json!([cancelled, cancelled, cancelled]));
}

#[test]
fn a_timeout_ends_a_wait_with_a_typed_error() {
    let s = tour();
    assert_eq!(value(run(&s, TOUR, "deadline", 5.into(), HANG)), serde_json::json!("timeout (5ms)"));
}

#[test]
fn select_any_gives_the_index_of_the_first_to_finish() {
    let s = tour();
    assert_eq!(value(run(&s, TOUR, "race", serde_json::json!([40, 50, 0, 30]), HANG)), serde_json::json!(2));
}

/// A typed child reports its parent; the embedder's process has none.
#[test]
fn a_typed_child_knows_its_parent() {
    let s = tour();
    let family = value(run(&s, TOUR, "family", serde_json::Value::Null, HANG));
    let (pid, parent, childs_parent): (u64, Option<u64>, Option<u64>) =
        serde_json::from_value(family).expect("three pids");
    assert_eq!((parent, childs_parent), (None, Some(pid)));
}

/// Sends fail with typed errors the guest matches on: the fourth message to a mailbox of
/// three, and a message to a pid that never was. A mailbox holds the messages its process
/// has not yet been given in a step, so the deaf child must not step between two sends:
/// one worker, and no preemption (which would suspend the sender at a tick, with the child
/// queued, and let the child take its messages).
#[test]
fn refused_sends_are_typed_mailbox_full_and_noproc() {
    let s = Scheduler::builder()
        .kind(TOUR, load(env!("GUEST_SDK_TOUR"), Config::default().preemption(false)))
        .workers(1)
        .mailbox_capacity(3)
        .build()
        .expect("starts");
    let nobody = Pid::from_u64(999_999).as_u64();
    let refused = value(run(&s, TOUR, "flood", serde_json::json!([5, nobody]), HANG));
    assert_eq!(refused, serde_json::json!([[4, "mailbox full"], [5, "mailbox full"], [6, "noproc"]]));
}

/// `log::info!` in a guest reaches the host's log through `host.log`, at its level and
/// tagged with the process's pid.
#[test]
fn the_log_crate_writes_to_the_hosts_log() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    let config = Config::default().log_sink(move |record: &LogRecord<'_>| {
        if let LogSource::Log(level) = record.source {
            kept.lock().expect("not poisoned").push((record.pid, level, record.message.to_owned()));
        }
    });
    let s = Scheduler::builder().kind(TOUR, load(env!("GUEST_SDK_TOUR"), config)).build().expect("starts");
    let process = s
        .handle()
        .spawn(Spawnable::kind(TOUR), SpawnOptions::new("chatty").input(vec![Payload::json(&"wasm").expect("JSON")]))
        .expect("spawns");
    let pid = process.pid();
    assert_eq!(process.join_timeout(HANG), Some(Ok(Payload::json(&()).expect("JSON"))));
    assert_eq!(
        *lines.lock().expect("not poisoned"),
        [(pid, Level::Info, "hello, wasm".to_owned()), (pid, Level::Warn, "a line without arguments".to_owned())]
    );
}

/// Links from a Rust guest: a trapping process gets the exit of its linked child and a
/// `noproc` for a link to no process, as events; one that does not trap ends with its
/// linked child's error, naming the child.
#[test]
fn a_guest_links_traps_exits_and_ends_with_its_linked_child() {
    let s = tour();
    let nobody = Pid::from_u64(9999 << 32);
    let (child, exits): (u64, Vec<(u64, String)>) =
        serde_json::from_value(value(run(&s, TOUR, "trapping", serde_json::json!(nobody.as_u64()), HANG))).unwrap();
    let mut expected = vec![(child, "error".to_owned()), (nobody.as_u64(), "noproc".to_owned())];
    expected.sort();
    assert_eq!(exits, expected);

    let process = s
        .handle()
        .spawn(Spawnable::kind(TOUR), SpawnOptions::new("linked_to_failure").input(vec![Payload::json(&()).unwrap()]))
        .unwrap();
    let exited = process.wait_timeout(HANG).expect("it ends");
    assert!(
        matches!(&exited.reason, wasmproc::ExitReason::Error(error) if error.contains("the linked child failed")),
        "{exited}"
    );
    let child = exited.signal_from.expect("ended by its child's exit signal");
    assert!(exited.to_string().starts_with(&format!("exited because linked process {child} returned an error")));
    s.stop(HANG);
}
