//! Whole-instance hibernation: the same guests stepped with and without it between every
//! step give the same outputs, and a guest cannot tell (issue 35, item 2).

use std::time::{Duration, Instant};

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{ExitReason, Payload, Scheduler};
use wasmproc_tests::HANG;
use wasmproc_tests::guests::{HOSTILE, JS_SQUARES, PY_SQUARES};

const PING_PONG: &str = env!("GUEST_PING_PONG");
const TIMERS: &str = env!("GUEST_TIMERS");

/// A runtime with hibernation of whole instances on or off; its compiled code cached in
/// the tests' scratch space (the Python guest takes seconds to compile).
fn runtime(whole: bool) -> Runtime {
    let config = Config::default()
        .hibernate_instances(whole)
        .init_time_limit(Duration::from_secs(10))
        .cache_dir(env!("CARGO_TARGET_TMPDIR"));
    Runtime::new(config.log_sink(|_: &wasmproc::wasm::LogRecord<'_>| {})).expect("the runtime starts")
}

fn load(runtime: &Runtime, path: &str) -> Component {
    runtime.load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"))
}

/// A scheduler of one kind, `guest`, whose waiting processes hibernate as soon as a
/// worker is idle when `hibernating`, and never otherwise.
fn scheduler(guest: Component, hibernating: bool) -> Scheduler {
    let after = if hibernating { Duration::ZERO } else { Duration::from_secs(3600) };
    Scheduler::builder().kind("guest", guest).hibernate_after(after).build().expect("the scheduler starts")
}

/// Waits until `runtime` has hibernated `count` processes whole so far.
fn await_hibernations(runtime: &Runtime, count: u64) {
    let deadline = Instant::now() + HANG;
    while runtime.hibernation_stats().hibernations < count {
        assert!(Instant::now() < deadline, "no hibernation came: {:?}", runtime.hibernation_stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `method` of the guest at `path` with `input` and sends it `messages` one at a
/// time; with `whole`, each only once the process has hibernated whole since the last
/// (so that every step after the first runs in an instance made again). Its result, and
/// how many times it was hibernated whole.
fn run(
    path: &str,
    method: &str,
    input: Payload,
    messages: &[(&str, Payload)],
    whole: bool,
) -> (Result<Payload, ExitReason>, u64) {
    let runtime = runtime(whole);
    let s = scheduler(load(&runtime, path), whole);
    let process = s
        .handle()
        .spawn(Spawnable::kind("guest"), SpawnOptions::new(method).input(vec![input]))
        .unwrap_or_else(|e| panic!("`{method}` spawns: {e:#}"));
    for (i, (topic, body)) in messages.iter().enumerate() {
        if whole {
            await_hibernations(&runtime, i as u64 + 1);
        }
        s.handle().send(process.pid(), *topic, body.clone()).expect("the message is delivered");
    }
    let result = process.join_timeout(HANG).unwrap_or_else(|| panic!("`{method}` did not finish"));
    s.stop(Duration::from_secs(1));
    let stats = runtime.hibernation_stats();
    assert_eq!(stats.hibernated, 0, "a process that ended keeps nothing: {stats:?}");
    (result, stats.hibernations)
}

fn text(s: &str) -> Payload {
    Payload::bytes(s.as_bytes().to_vec())
}

/// The hostile guest's `probe`: at each message it grows its memory by a page and fills
/// it, checks every page it filled, calls through its table, notes where its stack is
/// (a global) and copies the message through its heap. Its transcript must be the same
/// whether each of its steps ran in the instance that ran the one before or in one made
/// again from what hibernation kept.
#[test]
fn a_probe_cannot_tell_it_was_hibernated_between_every_step() {
    let messages: Vec<(&str, Payload)> =
        (0..12).map(|i| ("m", text(&format!("message {i}")))).chain(std::iter::once(("stop", text("")))).collect();
    let (kept, never) = run(HOSTILE, "probe", text(""), &messages, false);
    let (woken, hibernations) = run(HOSTILE, "probe", text(""), &messages, true);
    assert_eq!(never, 0, "hibernation of whole instances was off");
    assert!(hibernations >= messages.len() as u64, "hibernated whole before every message: {hibernations}");
    let kept = kept.expect("`probe` completes");
    assert_eq!(woken.expect("`probe` completes after hibernations"), kept);
    let transcript = String::from_utf8(kept.data.clone()).unwrap();
    assert!(transcript.contains("12 grown, 12 intact"), "every page it filled is as it left it:\n{transcript}");
}

/// An SDK guest sleeping waits inside its step (`wait`): it is told to return from it,
/// hibernated whole, and made again when its timers fire, its executor and its sleeps
/// carried on in the new instance.
#[test]
fn an_sdk_guest_sleeping_hibernates_whole_and_wakes_in_order() {
    // Timers 200 ms apart: time enough, on a loaded machine, for a worker to find it
    // waiting and hibernate it between two of them.
    let lengths = Payload::json(&Some(vec![800u64, 200, 600, 400])).unwrap();
    let (kept, never) = run(TIMERS, "main", lengths.clone(), &[], false);
    let (woken, hibernations) = run(TIMERS, "main", lengths, &[], true);
    assert_eq!(never, 0);
    assert!(hibernations >= 3, "hibernated whole between its timers: {hibernations}");
    let kept = kept.expect("`main` completes");
    assert_eq!(kept, Payload::json(&vec![200u64, 400, 600, 800]).unwrap());
    assert_eq!(woken.expect("`main` completes after hibernations"), kept);
}

/// `ping-pong`'s two processes hibernate whole whenever a worker is idle, racing each
/// other's messages: none is lost.
#[test]
fn sdk_guests_playing_catch_with_hibernation_on_lose_no_message() {
    let runtime = runtime(true);
    let s = scheduler(load(&runtime, PING_PONG), true);
    let input = Payload::json(&300u32).unwrap();
    let process = s.handle().spawn(Spawnable::kind("guest"), SpawnOptions::new("main").input(vec![input])).unwrap();
    let result = process.join_timeout(HANG).expect("`main` finishes");
    assert_eq!(result.expect("`main` succeeds"), Payload::json(&300u32).unwrap());
    s.stop(Duration::from_secs(1));
    let stats = runtime.hibernation_stats();
    assert_eq!(stats.hibernated, 0, "{stats:?}");
    assert_eq!(stats.hibernations, stats.wakes, "every hibernated process was woken to finish: {stats:?}");
}

/// The JavaScript guest (its memory image mapped copy-on-write) is hibernated whole while
/// it waits in `idle`, and answers the message that wakes it as it would have. The Python
/// guest (componentize-py nests a component, which the host does not instrument) is
/// never hibernated whole, and answers too.
#[test]
fn python_and_javascript_guests_answer_after_hibernation() {
    let body = Payload::json(&"hello").unwrap();
    let messages = [("greeting", body.clone())];
    let (result, hibernations) = run(JS_SQUARES, "idle", Payload::json(&()).unwrap(), &messages, true);
    assert_eq!(result.expect("`idle` completes"), body);
    assert!(hibernations >= 1, "the JavaScript guest was hibernated whole");

    let runtime = runtime(true);
    let s = scheduler(load(&runtime, PY_SQUARES), true);
    let options = SpawnOptions::new("idle").input(vec![Payload::json(&()).unwrap()]);
    let process = s.handle().spawn(Spawnable::kind("guest"), options).expect("`idle` spawns");
    std::thread::sleep(Duration::from_millis(50));
    s.handle().send(process.pid(), "greeting", body.clone()).expect("the message is delivered");
    assert_eq!(process.join_timeout(HANG).expect("`idle` finishes").expect("`idle` completes"), body);
    s.stop(Duration::from_secs(1));
    assert_eq!(runtime.hibernation_stats().hibernations, 0, "the Python guest is not hibernated whole");
}
