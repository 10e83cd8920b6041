//! `wait` (`wasmproc:process/host@0.2.1`) with `examples-wasm/waiter`: a step that ends
//! in `wait` is a step in every rule a returned one is (journal, limits, preemption,
//! cancellation, completions in the same batch, `close`), and a guest waiting long is
//! made to return from `step`.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use wasmproc::handler::Request;
use wasmproc::journal::{Journal, JournalSettings, MemoryStore};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Capabilities, ExitReason, Payload, Scheduler};
use wasmproc_tests::HANG;

fn runtime(config: Config) -> Runtime {
    Runtime::new(config.no_disk_cache()).expect("the runtime starts")
}

/// The waiter guest in a runtime of default settings, loaded once for the tests here.
fn waiter() -> Component {
    static GUEST: OnceLock<Component> = OnceLock::new();
    GUEST.get_or_init(|| load(&runtime(Config::default()), env!("GUEST_WAITER"))).clone()
}

fn load(runtime: &Runtime, path: &str) -> Component {
    runtime.load(path).unwrap_or_else(|e| panic!("failed to load `{path}`: {e:#}"))
}

/// `workers` workers, `waiter` as kind `waiter`, and the `now` command of `cycles`.
fn builder(workers: usize, waiter: Component) -> wasmproc::scheduler::Builder {
    Scheduler::builder()
        .workers(workers)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("waiter", waiter)
}

fn scheduler() -> Scheduler {
    builder(2, waiter()).build().expect("the scheduler starts")
}

fn spawn(s: &Scheduler, method: &str, input: Vec<Payload>) -> wasmproc::scheduler::ProcessHandle {
    s.handle().spawn(Spawnable::kind("waiter"), SpawnOptions::new(method).input(input)).expect("spawns")
}

/// The input that makes the waiter return from every step instead of waiting.
fn returns() -> Payload {
    Payload::bytes(b"returns".to_vec())
}

/// Waits, boundedly, until `done` holds.
fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + HANG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn ping_pong_through_wait_passes_the_counter_and_both_end() {
    for config in [Config::default(), Config::default().preemption(false)] {
        let s = builder(2, load(&runtime(config), env!("GUEST_WAITER"))).build().unwrap();
        let limit = 1_000;
        let first = spawn(&s, "ping-pong", vec![Payload::u64(limit)]);
        let second = spawn(&s, "ping-pong", vec![Payload::u64(limit), Payload::u64(first.pid().as_u64())]);
        assert_eq!(first.join_timeout(HANG), Some(Ok(Payload::u64(limit))));
        assert_eq!(second.join_timeout(HANG), Some(Ok(Payload::u64(limit))));
        assert_eq!(s.handle().stats().messages, limit + 1);
    }
}

/// `now` completes inside the dispatch of the yield that asked for it, while the step
/// that yielded it is still the process's: the completion reaches the guest in `wait`,
/// one step a completion, as for a guest that returns.
#[test]
fn a_completion_made_during_the_waits_dispatch_is_not_lost() {
    for input in [vec![Payload::u64(100)], vec![Payload::u64(100), returns()]] {
        let s = scheduler();
        let cycles = spawn(&s, "cycles", input);
        assert_eq!(cycles.join_timeout(HANG), Some(Ok(Payload::u64(100))));
        let stats = s.handle().stats();
        assert_eq!(stats.yields, 100);
        let steps: u64 = stats.workers.iter().map(|w| w.executed).sum();
        assert_eq!(steps, 101, "one step per completion, plus the first");
    }
}

/// The journal records a step that ended in `wait` as it records one that returned:
/// the same records.
#[test]
fn a_guest_that_waits_journals_the_steps_of_one_that_returns() {
    let run = |input: Vec<Payload>| {
        let store = Arc::new(MemoryStore::default());
        let s =
            builder(1, waiter()).journal(Journal::with_store(store.clone()).settings(keep_finished())).build().unwrap();
        assert_eq!(spawn(&s, "cycles", input).join_timeout(HANG), Some(Ok(Payload::u64(20))));
        s.stop(Duration::from_secs(1));
        let history = Journal::with_store(store).history().unwrap();
        assert_eq!((history.len(), history[0].steps), (1, 21));
        // Each step's and the exit's record, without the step's time (`12 µs`, its third
        // and fourth words); the spawn's names the input, which differs.
        let records = history[0].records.iter().filter(|line| !line.contains(" spawn "));
        let untimed = |line: &String| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let timed = words.get(1) == Some(&"step");
            let kept = words.iter().enumerate().filter(|(i, _)| !(timed && (*i == 2 || *i == 3)));
            kept.map(|(_, word)| *word).collect::<Vec<&str>>().join(" ")
        };
        records.map(untimed).collect::<Vec<String>>()
    };
    let waited = run(vec![Payload::u64(20)]);
    assert_eq!(waited.len(), 22, "{waited:#?}");
    assert_eq!(waited, run(vec![Payload::u64(20), returns()]));
}

/// A process stopped while it waited in `wait` replays from its records (the replay
/// feeds its steps' events through `wait` again) and resumes where it was.
#[test]
fn a_guest_stopped_in_wait_replays_and_resumes() {
    let store = Arc::new(MemoryStore::default());
    let durable = || builder(1, waiter()).journal(Journal::with_store(store.clone()).settings(keep_finished()));
    let s = durable().build().unwrap();
    let collect = spawn(&s, "collect", vec![Payload::u64(3)]);
    let pid = collect.pid();
    for count in [5, 7] {
        s.handle().send(pid, "", Payload::u64(count)).unwrap();
    }
    until("both messages' sleeps completed", || {
        let history = Journal::with_store(store.clone()).history().unwrap();
        history
            .first()
            .is_some_and(|h| h.records.iter().map(|line| line.matches("completion").count()).sum::<usize>() >= 2)
    });
    s.stop(Duration::from_secs(1));
    drop(s);
    let verdicts = durable().verify_journal().unwrap();
    assert!(matches!(verdicts[..], [(p, Ok(steps))] if p == pid && steps >= 2), "{verdicts:?}");
    let s = durable().build().unwrap();
    let resumed = s.resumed();
    assert_eq!(resumed.len(), 1);
    s.handle().send(pid, "", Payload::u64(30)).unwrap();
    assert_eq!(resumed[0].join_timeout(HANG), Some(Ok(Payload::u64(42))));
}

fn keep_finished() -> JournalSettings {
    let mut settings = JournalSettings::default();
    settings.keep_finished = true;
    settings
}

/// A guest that computes for long between its `wait`s is preempted like any step, and
/// the process beside it on the one worker runs; the loop is resumed, then terminated.
#[test]
fn a_long_loop_of_waits_is_preempted_so_others_run_on_its_worker() {
    let runtime = runtime(Config::default().time_slice(Duration::from_millis(5)));
    let s = builder(1, load(&runtime, env!("GUEST_WAITER")))
        .kind("bench", load(&runtime, env!("GUEST_BENCH")))
        .build()
        .unwrap();
    // Each round computes far past the time slice, then ends its step in `wait`.
    let spinner = spawn(&s, "spin", vec![Payload::u64(u64::MAX), Payload::u64(1 << 40)]);
    for n in 0..10 {
        let echo =
            s.handle().spawn(Spawnable::kind("bench"), SpawnOptions::new("echo").input(vec![Payload::u64(n)])).unwrap();
        assert_eq!(echo.join_timeout(HANG), Some(Ok(Payload::u64(n))), "a process runs beside the loop");
    }
    assert!(spinner.try_result().is_none(), "the loop runs on");
    s.handle().terminate(spinner.pid()).expect("the spinner is alive");
    assert_eq!(spinner.join_timeout(HANG), Some(Err(ExitReason::Terminated)));
}

#[test]
fn a_loop_of_waits_is_ended_at_its_cpu_budget() {
    let config = Config::default().time_slice(Duration::from_millis(5)).cpu_budget(Duration::from_millis(50));
    let s = builder(1, load(&runtime(config), env!("GUEST_WAITER"))).build().unwrap();
    // Short rounds: the budget runs out over many steps, each ended in `wait`.
    let spinner = spawn(&s, "spin", vec![Payload::u64(u64::MAX), Payload::u64(10_000)]);
    let error = spinner.join_timeout(HANG).expect("the budget ends it").unwrap_err();
    assert_eq!(
        wasmproc_tests::said(error),
        "CPU budget exceeded: the process ran for longer than its `cpu_budget` of 50ms and was stopped"
    );
}

/// An output given to `wait` is held to the step's limits as a returned one is, with the
/// same error.
#[test]
fn a_wait_past_the_yield_limit_ends_the_process_as_a_return_does() {
    let limited = || builder(1, waiter()).max_yields_per_step(4).build().unwrap();
    let errors: Vec<String> = [vec![Payload::u64(10)], vec![Payload::u64(10), returns()]]
        .into_iter()
        .map(|input| {
            let s = limited();
            let error = spawn(&s, "flood", input).join_timeout(HANG).expect("it ends").unwrap_err();
            wasmproc_tests::said(error)
        })
        .collect();
    assert!(errors[0].contains("max_yields_per_step"), "{}", errors[0]);
    assert_eq!(errors[0], errors[1]);
    // Within the limit, the completions come back through `wait`.
    let s = scheduler();
    assert_eq!(spawn(&s, "flood", vec![Payload::u64(10)]).join_timeout(HANG), Some(Ok(Payload::u64(10))));
}

/// A command given to `wait` is checked against the process's capabilities as a
/// returned one is: `now`, not granted, completes with the refusal.
#[test]
fn a_command_given_to_wait_is_refused_without_its_capability() {
    let s = Scheduler::builder()
        .workers(1)
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("waiter", waiter())
        .build()
        .unwrap();
    let error = spawn(&s, "cycles", vec![Payload::u64(3)]).join_timeout(HANG).expect("it ends").unwrap_err();
    let error = wasmproc_tests::said(error);
    assert!(error.starts_with("`now` failed: ") && error.contains("permission denied"), "{error}");
}

/// A cancel reaches a guest waiting in `wait` as an event, and it ends as it decides.
#[test]
fn a_cancel_reaches_a_guest_waiting_in_wait() {
    let s = scheduler();
    let idle = spawn(&s, "idle", vec![]);
    until("it waits", || s.handle().stats().workers.iter().map(|w| w.executed).sum::<u64>() >= 1);
    s.handle().cancel(idle.pid(), "enough").unwrap();
    let error = idle.join_timeout(HANG).expect("the cancel ends it").unwrap_err();
    assert_eq!(wasmproc_tests::said(error), "cancelled: enough");
}

/// Terminating processes suspended in `wait` closes each once: their instances and
/// fibers are given back, so as many again fit in a runtime that holds only so many.
#[test]
fn terminated_waiting_processes_give_their_instances_back() {
    let s = builder(2, load(&runtime(Config::default().max_instances(4)), env!("GUEST_WAITER"))).build().unwrap();
    for _ in 0..3 {
        let idle: Vec<_> = (0..4).map(|_| spawn(&s, "idle", vec![])).collect();
        for process in &idle {
            s.handle().terminate(process.pid()).unwrap();
        }
        for process in idle {
            assert_eq!(process.join_timeout(HANG), Some(Err(ExitReason::Terminated)));
        }
        until("every process is gone", || s.handle().stats().live == 0);
    }
}

/// A guest that waits longer than the host keeps a waiting guest's stack is told to
/// return from `step`; the next message starts a new call of `step`.
#[test]
fn a_guest_waiting_long_is_made_to_return_from_step() {
    let s = scheduler();
    let idle = spawn(&s, "idle", vec![]);
    until("the waiting guest was released", || s.handle().stats().hibernated >= 1);
    s.handle().send(idle.pid(), "", Payload::empty()).unwrap();
    assert_eq!(idle.join_timeout(HANG), Some(Ok(Payload::u64(2))), "`step` was called again");
    // Without the release the message reaches the guest in its first call.
    let s = scheduler();
    let idle = spawn(&s, "idle", vec![]);
    s.handle().send(idle.pid(), "", Payload::empty()).unwrap();
    assert_eq!(idle.join_timeout(HANG), Some(Ok(Payload::u64(1))));
}

/// What a guest does when told to return is held to `wait`'s contract: yields, another
/// `wait`, or a completion then end it with an error that names what it did.
#[test]
fn a_guest_that_breaks_the_contract_when_told_to_return_ends_naming_it() {
    for (how, says) in [
        (1, "returned from `step` with 1 yields after `wait` returned `none`"),
        (2, "called `wait` again after `wait` returned `none`"),
        (3, "with 0 yields and a `complete` status after `wait` returned `none`"),
    ] {
        let s = scheduler();
        let stubborn = spawn(&s, "stubborn", vec![Payload::u64(how)]);
        // A message before the release only wakes it in `wait`: each try leaves it
        // waiting long enough to be released (`hibernation::HIBERNATE_AFTER`), then
        // sends the message that finds it broken.
        let deadline = Instant::now() + HANG;
        while stubborn.try_result().is_none() {
            assert!(Instant::now() < deadline, "{how}: the broken guest did not end");
            std::thread::sleep(Duration::from_millis(100));
            let _ = s.handle().send(stubborn.pid(), "", Payload::empty());
            std::thread::sleep(Duration::from_millis(10));
        }
        let error = wasmproc_tests::said(stubborn.join_timeout(HANG).unwrap().unwrap_err());
        assert!(error.contains(says), "{how}: {error}");
    }
}

/// A component built for 0.2.0, before `wait`, loads and runs unchanged: the bench
/// guest with its imports renamed to 0.2.0.
#[test]
fn a_component_of_the_previous_version_runs_unchanged() {
    let bench = std::fs::read(env!("GUEST_BENCH")).unwrap();
    let (new, old) = (b"wasmproc:process/host@0.2.1", b"wasmproc:process/host@0.2.0");
    let mut renamed = bench.clone();
    let mut at = 0;
    let mut found = 0;
    while let Some(i) = renamed[at..].windows(new.len()).position(|w| w == new) {
        renamed[at + i..at + i + new.len()].copy_from_slice(old);
        at += i + new.len();
        found += 1;
    }
    assert!(found > 0, "the bench guest imports `{}`", String::from_utf8_lossy(new));
    let component = runtime(Config::default()).load_bytes(&renamed).expect("a 0.2.0 component loads");
    let s = Scheduler::builder().workers(1).kind("old", component).build().unwrap();
    let limit = 10;
    let first = s
        .handle()
        .spawn(Spawnable::kind("old"), SpawnOptions::new("ping-pong").input(vec![Payload::u64(limit)]))
        .unwrap();
    let second = s
        .handle()
        .spawn(
            Spawnable::kind("old"),
            SpawnOptions::new("ping-pong").input(vec![Payload::u64(limit), Payload::u64(first.pid().as_u64())]),
        )
        .unwrap();
    assert_eq!(first.join_timeout(HANG), Some(Ok(Payload::u64(limit))));
    assert_eq!(second.join_timeout(HANG), Some(Ok(Payload::u64(limit))));
}
