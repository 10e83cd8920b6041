//! The example guests of `examples-wasm/`, written with the guest SDK, run end to end: each
//! is loaded as a component, registered as a process kind and spawned by entry method.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use wasmproc::handler::Request;
use wasmproc::scheduler::SpawnOptions;
use wasmproc::scheduler::Spawnable;
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Capabilities, Outcome, Payload, Scheduler};
use wasmproc_tests::HANG;

/// The custom command the `workflow` guest calls.
const RESERVE: &str = "inventory.reserve";

fn load(path: &str) -> Component {
    // Compiled components are cached under the test's scratch directory, not the user's.
    let runtime = Runtime::new(Config::default().cache_dir(env!("CARGO_TARGET_TMPDIR"))).expect("the runtime starts");
    runtime.load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"))
}

/// A scheduler with the one example `kind` registered.
fn scheduler(kind: &str, path: &str) -> Scheduler {
    Scheduler::builder().kind(kind, load(path)).build().expect("the scheduler starts")
}

/// Runs `kind`'s entry `method` with `input` and returns its result.
fn run(scheduler: &Scheduler, kind: &str, method: &str, input: Vec<Payload>) -> Outcome {
    run_to_end(scheduler, kind, method, input).map_err(wasmproc_tests::said)
}

/// As [`run`], with the reason of an abnormal end.
fn run_to_end(
    scheduler: &Scheduler,
    kind: &str,
    method: &str,
    input: Vec<Payload>,
) -> Result<Payload, wasmproc::ExitReason> {
    let process = scheduler
        .handle()
        .spawn(Spawnable::kind(kind), SpawnOptions::new(method).input(input))
        .unwrap_or_else(|e| panic!("spawn `{method}`: {e}"));
    process.join_timeout(HANG).unwrap_or_else(|| panic!("`{kind}` `{method}` did not finish"))
}

/// The text of a successful JSON result.
fn json_text(outcome: Outcome) -> String {
    let payload = outcome.unwrap_or_else(|e| panic!("the process failed: {e}"));
    assert_eq!(payload.format.as_str(), "json");
    payload.as_str().expect("JSON is UTF-8").to_owned()
}

/// The README's demo (`cargo run --release -p wasmproc-tests --example demo`) runs every
/// example guest to the results it shows.
#[test]
fn the_readme_demo_shows_every_result() -> anyhow::Result<()> {
    let mut out = Vec::new();
    wasmproc_tests::demo::run(Config::default().cache_dir(env!("CARGO_TARGET_TMPDIR")), &mut out)?;
    let out = String::from_utf8(out)?;
    for line in [
        r#"hello.greet("wasmproc") → ok "hello, wasmproc""#,
        "hello.add([2,40]) → ok 42",
        "timers.main([30,10,20]) → ok [10,20,30]",
        "fan-out.main(1000) → ok [0,1,4,9,16,25,36,49,64,81,100,121,144,1 … 5,992016,994009,996004,998001]",
        "ping-pong.main(10000) → ok 10000",
        r#"workflow.main({"item":"widget","quantity":3}) → ok {"item":"widget","quantity":3,"reservation":"R-1001","attempts":2}"#,
        "hello.shout(null) → spawn refused: init of `shout` failed: unknown entry method `shout`; this component has: greet, add",
        "1007 processes,",
        "stopped in",
    ] {
        assert!(out.contains(line), "the demo should show {line:?}; it showed:\n{out}");
    }
    Ok(())
}

#[test]
fn hello_greets_and_adds() -> anyhow::Result<()> {
    let s = scheduler("hello", env!("GUEST_HELLO"));
    let greeting = run(&s, "hello", "greet", vec![Payload::json(&"world")?]);
    assert_eq!(greeting, Ok(Payload::json(&"hello, world")?));
    assert_eq!(run(&s, "hello", "add", vec![Payload::json(&(2, 40))?]), Ok(Payload::json(&42)?));
    Ok(())
}

#[test]
fn an_entry_error_is_the_process_result() -> anyhow::Result<()> {
    let s = scheduler("hello", env!("GUEST_HELLO"));
    let overflow = run(&s, "hello", "add", vec![Payload::json(&(i64::MAX, 1))?]);
    assert_eq!(overflow, Err(format!("{} + 1 overflows an i64", i64::MAX)));
    Ok(())
}

#[test]
fn entries_are_listed_and_bad_spawns_fail_naming_the_method() -> anyhow::Result<()> {
    let hello = load(env!("GUEST_HELLO"));
    assert_eq!(hello.entries(), ["greet", "add"]);
    let s = Scheduler::builder().kind("hello", hello).build()?;

    let unknown = s.handle().spawn(Spawnable::kind("hello"), "shout").expect_err("`shout` is no entry").to_string();
    assert!(unknown.contains("unknown entry method `shout`"), "{unknown}");
    assert!(unknown.contains("greet") && unknown.contains("add"), "the error lists the entries: {unknown}");

    let bad_input = s
        .handle()
        .spawn(Spawnable::kind("hello"), SpawnOptions::new("greet").input(vec![Payload::json(&5)?]))
        .expect_err("5 is no name")
        .to_string();
    assert!(bad_input.contains("invalid input for entry method `greet`"), "{bad_input}");
    Ok(())
}

#[test]
fn timers_finish_in_order_of_length_not_of_start() -> anyhow::Result<()> {
    let s = scheduler("timers", env!("GUEST_TIMERS"));
    // The default lengths, 30, 10 and 20 ms, started in that order.
    assert_eq!(json_text(run(&s, "timers", "main", vec![])), "[10,20,30]");
    let lengths = Payload::json(&[60, 0, 40, 20])?;
    assert_eq!(json_text(run(&s, "timers", "main", vec![lengths])), "[0,20,40,60]");
    Ok(())
}

#[test]
fn ping_pong_exchanges_messages_with_a_child_of_its_own_component() -> anyhow::Result<()> {
    let s = scheduler("ping-pong", env!("GUEST_PING_PONG"));
    assert_eq!(run(&s, "ping-pong", "main", vec![Payload::json(&25)?]), Ok(Payload::json(&25)?));
    Ok(())
}

#[test]
fn fan_out_gathers_its_children_results_in_order() -> anyhow::Result<()> {
    let s = scheduler("fan-out", env!("GUEST_FAN_OUT"));
    let squares: Vec<u64> = (0..20).map(|i| i * i).collect();
    assert_eq!(run(&s, "fan-out", "main", vec![Payload::json(&20)?]), Ok(Payload::json(&squares)?));
    Ok(())
}

#[test]
fn children_get_their_parents_grants_and_no_more() {
    let s = Scheduler::builder()
        .kind("fan-out", load(env!("GUEST_FAN_OUT")))
        .kind("workflow", load(env!("GUEST_WORKFLOW")))
        .capabilities(Capabilities::default().allow(RESERVE))
        .handler(RESERVE, |request: Request<'_>| request.complete(Ok(Payload::json(&"R-7").unwrap())))
        .build()
        .expect("the scheduler starts");
    let job = Payload::json(&("workflow", "main", serde_json::json!({"item": "apples", "quantity": 2}))).unwrap();
    let delegate = |caps: Capabilities| {
        let options = SpawnOptions::new("delegate").input(vec![job.clone()]).capabilities(caps);
        let process = s.handle().spawn(Spawnable::kind("fan-out"), options).expect("the supervisor starts");
        process.join_timeout(HANG).expect("the supervisor ends")
    };
    // Granted the command, the supervisor's child may call it.
    let summary = delegate(Capabilities::default().allow(RESERVE)).expect("the child may reserve");
    let summary: serde_json::Value = serde_json::from_slice(&summary.data).expect("JSON");
    assert_eq!(summary, serde_json::json!({"item": "apples", "quantity": 2, "reservation": "R-7", "attempts": 1}));
    // Not granted to the supervisor, it is not granted to its child either, although the
    // scheduler's default grants it: the child's call is denied, and so the supervisor fails.
    let error = wasmproc_tests::said(delegate(Capabilities::default()).expect_err("the child may not reserve"));
    assert!(error.starts_with("the `workflow` child running `main` failed"), "{error}");
    assert!(error.contains("permission denied: inventory.reserve"), "{error}");
}

/// A scheduler running `workflow` whose `inventory.reserve` fails `failures` times, then
/// answers `R-1`; and the count of calls it got with the expected order as input.
fn workflow(failures: usize) -> (Scheduler, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let s = Scheduler::builder()
        .kind("workflow", load(env!("GUEST_WORKFLOW")))
        .capabilities(Capabilities::default().allow(RESERVE))
        .handler(RESERVE, move |request: Request<'_>| {
            if request.payload() != &order() {
                let error = format!("unexpected order {:?}", request.payload().as_str());
                return request.complete(Err(error));
            }
            let call = counted.fetch_add(1, Ordering::SeqCst) + 1;
            if call <= failures {
                request.complete(Err(format!("out of stock (call {call})")));
            } else {
                request.complete(Ok(Payload::json(&"R-1").expect("a string serialises")));
            }
        })
        .build()
        .expect("the scheduler starts");
    (s, calls)
}

/// The `workflow` input: two apples.
fn order() -> Payload {
    Payload { format: wasmproc::Format::Json, data: br#"{"item":"apples","quantity":2}"#.to_vec() }
}

#[test]
fn workflow_retries_a_failing_command_until_it_succeeds() {
    let (s, calls) = workflow(2);
    let summary = json_text(run(&s, "workflow", "main", vec![order()]));
    assert_eq!(summary, r#"{"item":"apples","quantity":2,"reservation":"R-1","attempts":3}"#);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn workflow_gives_up_after_three_tries() {
    let (s, calls) = workflow(usize::MAX);
    let error = run(&s, "workflow", "main", vec![order()]).expect_err("every try fails");
    assert_eq!(
        error,
        "gave up reserving `apples` after 3 tries: custom command `inventory.reserve` failed: out of stock (call 3)"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn workflow_without_the_capability_is_denied() {
    let s = Scheduler::builder()
        .kind("workflow", load(env!("GUEST_WORKFLOW")))
        .handler(RESERVE, |request: Request<'_>| request.complete(Ok(Payload::empty())))
        .build()
        .expect("the scheduler starts");
    let error = run(&s, "workflow", "main", vec![order()]).expect_err("not granted");
    assert!(
        error.ends_with("custom command `inventory.reserve` failed: permission denied: inventory.reserve"),
        "{error}"
    );
}

/// DESIGN 11 with a Wasm guest: a command no handler is registered for completes with
/// "unknown command", which the guest sees as the error of its `call`.
#[test]
fn workflow_calling_an_unknown_command_gets_an_error() {
    let s = Scheduler::builder()
        .kind("workflow", load(env!("GUEST_WORKFLOW")))
        .capabilities(Capabilities::default().allow(RESERVE))
        .build()
        .expect("the scheduler starts");
    let error = run(&s, "workflow", "main", vec![order()]).expect_err("no handler");
    assert_eq!(
        error,
        "gave up reserving `apples` after 3 tries: custom command `inventory.reserve` failed: \
         unknown command `inventory.reserve`"
    );
}

#[test]
fn a_guest_waiting_in_recv_sees_the_cancel_at_shutdown() {
    let s = scheduler("ping-pong", env!("GUEST_PING_PONG"));
    let pong = s.handle().spawn(Spawnable::kind("ping-pong"), "pong").expect("`pong` spawns");
    // Let it reach its receive; the outcome is the same if the cancel comes first.
    std::thread::sleep(Duration::from_millis(50));
    let report = s.stop(Duration::from_secs(10));
    assert_eq!((report.cancelled, report.forced), (1, 0), "{report:?}");
    assert_eq!(pong.join_timeout(HANG), Some(Err(wasmproc::ExitReason::Error("cancelled: shutdown".to_owned()))));
}

#[test]
fn sdk_guests_run_in_their_initial_memory_and_one_page() -> anyhow::Result<()> {
    // Two pages: the 64 KiB stack (`examples-wasm/.cargo/config.toml`) and the data; and
    // the one the SDK's allocator grows for its blocks (`guest-sdk/src/alloc.rs`). The
    // executor allocates so little that one page serves a whole run, so any more growth,
    // which this cap turns into an error, is a regression.
    const CAP: usize = 3 * 64 * 1024;
    for (kind, path, input) in [
        ("fan-out", env!("GUEST_FAN_OUT"), 10),
        ("ping-pong", env!("GUEST_PING_PONG"), 10),
        ("timers", env!("GUEST_TIMERS"), 0),
    ] {
        let component = load(path).with_max_memory(CAP)?;
        let s = Scheduler::builder().kind(kind, component).build()?;
        let input = if kind == "timers" { vec![] } else { vec![Payload::json(&input)?] };
        let result = run(&s, kind, "main", input);
        assert!(result.is_ok(), "`{kind}` failed within {CAP} bytes: {result:?}");
    }
    Ok(())
}

/// The SDK's `ctx.send` goes through the host's `send` function, which refuses what a
/// yielded `send` would, with the same reason, and the sender alone hears of it: here a
/// `pong` answers a ping from the host, which is no process it can send to.
#[test]
fn a_send_the_host_function_refuses_fails_the_sender_alone() -> anyhow::Result<()> {
    let s = scheduler("ping-pong", env!("GUEST_PING_PONG"));
    let pong = s.handle().spawn(Spawnable::kind("ping-pong"), "pong")?;
    s.handle().send(pong.pid(), "ping", Payload::json(&7)?)?;
    let error = wasmproc_tests::said(pong.join_timeout(HANG).expect("`pong` ends").unwrap_err());
    assert_eq!(error, format!("no process {}: it never existed, has ended or is exiting", wasmproc::Pid::HOST));
    // Others send and receive all the same.
    assert_eq!(run(&s, "ping-pong", "main", vec![Payload::json(&5)?]), Ok(Payload::json(&5)?));
    Ok(())
}

/// Without the `send` capability the host function refuses, as a yielded `send` is.
#[test]
fn the_send_host_function_needs_the_send_capability() -> anyhow::Result<()> {
    let s = scheduler("ping-pong", env!("GUEST_PING_PONG"));
    let mute = SpawnOptions::new("pong").capabilities(Capabilities::all().deny("send"));
    let pong = s.handle().spawn(Spawnable::kind("ping-pong"), mute)?;
    s.handle().send(pong.pid(), "ping", Payload::json(&7)?)?;
    let denied = wasmproc::ExitReason::Error("send failed: permission denied: send".to_owned());
    assert_eq!(pong.join_timeout(HANG), Some(Err(denied)));
    Ok(())
}

/// A message over the payload limit (topic and body: "pong" and "12345") ends the sender
/// with the limit's error, as a yielded `send`'s would; the limit is checked before
/// anything else, so it wins over the refusal of the previous test.
#[test]
fn a_send_over_the_payload_limit_ends_the_sender() -> anyhow::Result<()> {
    let s = Scheduler::builder().kind("ping-pong", load(env!("GUEST_PING_PONG"))).max_payload_size(4).build()?;
    let pong = s.handle().spawn(Spawnable::kind("ping-pong"), "pong")?;
    s.handle().send(pong.pid(), "ping", Payload::json(&12345)?)?;
    let error = wasmproc_tests::said(pong.join_timeout(HANG).expect("`pong` ends").unwrap_err());
    assert!(
        error.contains("payload limit exceeded: a 9-byte payload for `send` is over `max_payload_size` (4 bytes)"),
        "{error}"
    );
    Ok(())
}

/// A process about to wait while its worker has nothing else to run gives its fiber
/// stack's pages back (`Process::hibernate`, counted in `Stats::hibernated`), and its
/// next steps run as before on the zeroed stack; processes that keep the worker busy
/// with each other do not hibernate.
#[test]
fn processes_waiting_on_an_idle_worker_hibernate_and_run_on() -> anyhow::Result<()> {
    // The `inventory.reserve` handler keeps each request's completer for the test, so
    // that the `workflow` waits until the test has seen it hibernate: no timing involved.
    let (gate, requests) = std::sync::mpsc::channel();
    let s = Scheduler::builder()
        .workers(1)
        .kind("ping-pong", load(env!("GUEST_PING_PONG")))
        .kind("workflow", load(env!("GUEST_WORKFLOW")))
        .capabilities(Capabilities::default().allow(RESERVE))
        .handler(RESERVE, move |request: Request<'_>| {
            let (_, completer) = request.into_parts();
            gate.send(completer).expect("the test holds the gate");
        })
        .build()?;
    let hibernated_more_than = |before: u64, what: &str| {
        let deadline = std::time::Instant::now() + HANG;
        while s.handle().stats().hibernated <= before {
            assert!(std::time::Instant::now() < deadline, "the waiting `{what}` never hibernated");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let pong = s.handle().spawn(Spawnable::kind("ping-pong"), "pong")?;
    hibernated_more_than(0, "pong");

    // 200 pings and pongs: each process waits while the other is queued on the one worker.
    let before = s.handle().stats().hibernated;
    assert_eq!(run(&s, "ping-pong", "main", vec![Payload::json(&200)?]), Ok(Payload::json(&200)?));
    let during = s.handle().stats().hibernated - before;
    assert!(during <= 2, "{during} hibernations among 400 busy waits");

    // A process that hibernated while waiting for a command's answer runs on from where
    // it waited when the answer comes.
    let before = s.handle().stats().hibernated;
    let workflow = s.handle().spawn(Spawnable::kind("workflow"), SpawnOptions::new("main").input(vec![order()]))?;
    let completer = requests.recv_timeout(HANG).expect("`workflow` calls `inventory.reserve`");
    hibernated_more_than(before, "workflow");
    completer.complete(Ok(Payload::json(&"R-1")?));
    let summary = json_text(workflow.join_timeout(HANG).expect("`workflow` ends").map_err(wasmproc_tests::said));
    assert_eq!(summary, r#"{"item":"apples","quantity":2,"reservation":"R-1","attempts":1}"#);

    // And the first one, woken from hibernation, answers.
    s.handle().send(pong.pid(), "stop", Payload::json(&())?)?;
    assert_eq!(pong.join_timeout(HANG), Some(Ok(Payload::json(&0)?)));
    Ok(())
}

/// The `inventory` provider component serving `workflow` processes, both Wasm: twenty
/// workflows at once ask for one of the ten apples each, and the provider, answering
/// each request as it takes it, lets exactly ten through; the others give up after their
/// tries with the provider's own error.
#[test]
fn the_inventory_provider_serves_concurrent_workflows_from_one_stock() {
    let services = Scheduler::builder().workers(1).kind("inventory", load(env!("GUEST_INVENTORY"))).build().unwrap();
    let server = services.handle().spawn(Spawnable::kind("inventory"), "serve").unwrap();
    let s = Scheduler::builder()
        .workers(2)
        .kind("workflow", load(env!("GUEST_WORKFLOW")))
        .provider(wasmproc::provider::Served::new("inventory", services.handle().clone(), server.pid()))
        .capabilities(Capabilities::default().allow("inventory.*"))
        .build()
        .unwrap();
    let one = Payload::json(&serde_json::json!({"item": "apples", "quantity": 1})).unwrap();
    let workflows: Vec<_> = (0..20)
        .map(|_| s.handle().spawn(Spawnable::kind("workflow"), SpawnOptions::new("main").input(vec![one.clone()])))
        .collect::<Result<_, _>>()
        .unwrap();
    let mut reservations = Vec::new();
    let mut refusals = 0;
    for workflow in workflows {
        match workflow.join_timeout(HANG).expect("the workflow finishes") {
            Ok(summary) => reservations.push(summary.parse_json::<serde_json::Value>().unwrap()["reservation"].clone()),
            Err(error) => {
                let error = wasmproc_tests::said(error);
                assert!(error.contains("out of stock: 0 of `apples` left"), "{error}");
                refusals += 1;
            }
        }
    }
    reservations.sort_by_key(|r| r.as_str().unwrap().to_owned());
    reservations.dedup();
    assert_eq!((reservations.len(), refusals), (10, 10), "each of the ten apples reserved once: {reservations:?}");
    s.stop(HANG);
    services.stop(HANG);
}
