//! `examples-wasm/bench`, the benchmarks' guest: each entry runs once through the
//! scheduler with the result `tests/benches/all/wasm.rs` relies on.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use wasmproc::error::SpawnError;
use wasmproc::handler::Request;
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Capabilities, Format, Payload, Scheduler};
use wasmproc_tests::HANG;

/// Loaded once for all the tests here: a debug build compiles a guest slowly.
fn bench_guest() -> Component {
    static GUEST: OnceLock<Component> = OnceLock::new();
    GUEST
        .get_or_init(|| {
            let runtime = Runtime::new(Config::default().no_disk_cache()).expect("the runtime starts");
            runtime.load(env!("GUEST_BENCH")).unwrap_or_else(|e| panic!("failed to load the bench guest: {e:#}"))
        })
        .clone()
}

/// Two workers, the guest as kind `bench`, and the `now` command it yields in `cycles`.
fn scheduler() -> Scheduler {
    Scheduler::builder()
        .workers(2)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("bench", bench_guest())
        .build()
        .expect("the scheduler starts")
}

#[test]
fn bench_guest_lists_its_entries() {
    assert_eq!(bench_guest().entries(), ["echo", "cycles", "ping-pong", "idle", "tree"]);
}

#[test]
fn echo_completes_with_its_first_input_or_an_empty_payload() {
    let s = scheduler();
    let first = Payload { format: Format::from_name("cbor"), data: vec![1, 2, 3] };
    let echo = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("echo").input(vec![first.clone(), Payload::text("ignored")]))
        .unwrap();
    assert_eq!(echo.join_timeout(HANG), Some(Ok(first)));
    let empty = s.handle().spawn(Spawnable::kind("bench"), "echo").unwrap();
    assert_eq!(empty.join_timeout(HANG), Some(Ok(Payload::empty())));
}

#[test]
fn cycles_yields_one_command_per_step_until_n_came_back() {
    let s = scheduler();
    let cycles =
        s.handle().spawn(Spawnable::kind("bench"), SpawnOptions::new("cycles").input(vec![Payload::u64(100)])).unwrap();
    assert_eq!(cycles.join_timeout(HANG), Some(Ok(Payload::u64(100))));
    let stats = s.handle().stats();
    assert_eq!(stats.yields, 100);
    let steps: u64 = stats.workers.iter().map(|w| w.executed).sum();
    assert_eq!(steps, 101, "one step per completion, plus the first");
    let none =
        s.handle().spawn(Spawnable::kind("bench"), SpawnOptions::new("cycles").input(vec![Payload::u64(0)])).unwrap();
    assert_eq!(none.join_timeout(HANG), Some(Ok(Payload::u64(0))));
}

#[test]
fn cycles_without_a_count_is_refused_at_init() {
    let s = scheduler();
    let error = s.handle().spawn(Spawnable::kind("bench"), "cycles").unwrap_err();
    assert!(matches!(error, SpawnError::Init { .. }), "{error:?}");
    assert!(format!("{error:#}").contains("`cycles` expects `n`"), "{error:#}");
}

#[test]
fn ping_pong_passes_the_counter_up_to_the_limit_and_both_end() {
    let s = scheduler();
    let limit = 1_000;
    let server = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("ping-pong").input(vec![Payload::u64(limit)]))
        .unwrap();
    let peer = Payload::u64(server.pid().as_u64());
    let client = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("ping-pong").input(vec![Payload::u64(limit), peer]))
        .unwrap();
    assert_eq!(client.join_timeout(HANG), Some(Ok(Payload::u64(limit))));
    assert_eq!(server.join_timeout(HANG), Some(Ok(Payload::u64(limit))));
    // Counts 0..=limit, one message each.
    assert_eq!(s.handle().stats().messages, limit + 1);
}

#[test]
fn idle_waits_for_a_message_then_completes_with_it() {
    let s = scheduler();
    let idle = s.handle().spawn(Spawnable::kind("bench"), "idle").unwrap();
    let deadline = Instant::now() + HANG;
    while s.handle().stats().workers.iter().map(|w| w.executed).sum::<u64>() < 1 {
        assert!(Instant::now() < deadline, "the idle process never ran its first step");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(idle.join_timeout(Duration::from_millis(50)), None, "it waits for a message");
    s.handle().send(idle.pid(), "wake", Payload::text("up")).unwrap();
    assert_eq!(idle.join_timeout(HANG), Some(Ok(Payload::text("up"))));
}

#[test]
fn tree_spawns_its_leaves_as_processes_and_sums_them() {
    let s = scheduler();
    // 23 leaves, width 4: uneven shares at every level (6, 6, 6, 5 leaves, then 2 or 1).
    let tree = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("tree").input(vec![Payload::u64(23), Payload::u64(4)]))
        .unwrap();
    assert_eq!(tree.join_timeout(HANG), Some(Ok(Payload::u64(23))));
    // The root, its 4 children, their 16 (7 nodes of 2 leaves, 9 leaves), and 14 leaves.
    assert_eq!(s.handle().stats().spawned, 1 + 4 + 16 + 14);
    let narrow = s
        .handle()
        .spawn(Spawnable::kind("bench"), SpawnOptions::new("tree").input(vec![Payload::u64(8), Payload::u64(1)]))
        .unwrap_err();
    assert!(format!("{narrow:#}").contains("`width` of at least 2"), "{narrow:#}");
}
