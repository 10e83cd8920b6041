use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wasmproc::journal::{Journal, JournalSettings, MemoryStore};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Command, Events, ExitReason, Payload, Port, Process, Scheduler, Status, StepOutput};

/// Far past any wait here: a test that reaches it has hung.
const HANG: Duration = Duration::from_secs(60);

fn component(path: &str) -> Component {
    Runtime::new(Config::default().cache_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap().load(path).unwrap()
}

fn keep_finished() -> JournalSettings {
    let mut settings = JournalSettings::default();
    settings.keep_finished = true;
    settings
}

/// A durable scheduler over `store` with the durable example as kind `durable`, suspending
/// its processes once they have waited `suspend` (at every wait, for zero).
fn durable(store: &Arc<MemoryStore>, suspend: Option<Duration>) -> Scheduler {
    Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store.clone()).settings(keep_finished()))
        .kind("durable", component(env!("GUEST_DURABLE")))
        .suspend_after(suspend)
        .build()
        .unwrap()
}

fn spawn(scheduler: &Scheduler, method: &str, input: Payload) -> wasmproc::scheduler::ProcessHandle {
    let options = SpawnOptions::new(method).input(vec![input]);
    scheduler.handle().spawn(Spawnable::kind("durable"), options).unwrap()
}

/// Waits until `done` holds, for at most [`HANG`].
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !done() {
        assert!(Instant::now() < deadline, "waited {HANG:?} for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every process's history as the journal shows it, with what differs between two runs
/// of the same workflow taken out (times, pids, sleeps' lengths drawn from the clock, and
/// steps that took nothing and did nothing):
/// each record's kind, what went in and what came out. Sorted, as pids are not comparable.
fn histories(store: &Arc<MemoryStore>) -> Vec<(String, u64, Vec<String>)> {
    let journal = Journal::with_store(store.clone());
    let mut all: Vec<(String, u64, Vec<String>)> = journal
        .history()
        .unwrap()
        .into_iter()
        .map(|h| {
            // A step given nothing that did nothing is the scheduler's timing (a message
            // that came before the process's first step or after it), not its history.
            let lines: Vec<String> = h
                .records
                .iter()
                .map(|line| without_times_and_numbers(line))
                .filter(|line| !line.ends_with("step no events → idle"))
                .collect();
            (h.method, lines.iter().filter(|line| line.starts_with("# step")).count() as u64, lines)
        })
        .collect();
    all.sort();
    all
}

/// `line` without its time (`+1.2 ms`, or a spawn's date) and the spaces that align it,
/// and with every run of digits made `#`.
fn without_times_and_numbers(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = words[i];
        let unit = words.get(i + 1).copied().unwrap_or_default();
        if word.starts_with('+') && ["ns", "µs", "us", "ms", "s"].contains(&unit) {
            i += 2;
            continue;
        }
        if word == "UTC" {
            // A spawn's `date time UTC`.
            kept.truncate(kept.len().saturating_sub(2));
            i += 1;
            continue;
        }
        kept.push(word);
        i += 1;
    }
    let mut out = String::new();
    let mut in_number = false;
    for c in kept.join(" ").chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// A workflow suspended at every wait (each timer, each message, each child's exit brings
/// it back, replayed from its journal) ends with the result, and leaves the history, of
/// the same workflow never suspended.
#[test]
fn a_workflow_suspended_at_every_wait_ends_as_one_never_suspended() {
    let run = |suspend: Option<Duration>| {
        let store = Arc::new(MemoryStore::new());
        let scheduler = durable(&store, suspend);
        let root = spawn(&scheduler, "main", Payload::json(&(2, 3)).unwrap());
        let result = root.join_timeout(HANG).expect("the workflow ended");
        let stats = scheduler.handle().stats();
        scheduler.stop(Duration::from_secs(1));
        (result, histories(&store), stats)
    };
    let (never, never_histories, never_stats) = run(None);
    // 2 workers answer 1, 4 and 9, and answered 3 each.
    assert_eq!(never, Ok(Payload::json(&34).unwrap()));
    assert_eq!(never_stats.suspensions, 0);
    // Its waits are short: on a loaded machine a run may end before a worker parks to
    // suspend anything, so it runs again (each run compared) until one was suspended.
    let mut tries = 0;
    loop {
        tries += 1;
        let (suspended, suspended_histories, stats) = run(Some(Duration::ZERO));
        assert_eq!(suspended, never);
        assert_eq!(stats.suspended, 0, "every process ended");
        assert_eq!(suspended_histories, never_histories);
        if stats.suspensions > 0 && stats.returns > 0 {
            break;
        }
        assert!(tries < 10, "no process was suspended in {tries} runs: {stats:?}");
    }
}

/// Messages sent to a suspended process, in a burst, are delivered once each and in the
/// order they were sent, and wake it once.
#[test]
fn messages_to_a_suspended_process_are_delivered_once_in_order() {
    let store = Arc::new(MemoryStore::new());
    let scheduler = durable(&store, Some(Duration::ZERO));
    let gatherer = spawn(&scheduler, "gather", Payload::json(&20).unwrap());
    until("the gatherer to be suspended", || scheduler.handle().stats().suspended == 1);
    for i in 0..20u64 {
        scheduler.handle().send(gatherer.pid(), format!("m{i}"), Payload::json(&i).unwrap()).unwrap();
    }
    let got = gatherer.join_timeout(HANG).expect("the gatherer ended");
    let expected: Vec<(String, u64)> = (0..20).map(|i| (format!("m{i}"), i)).collect();
    assert_eq!(got, Ok(Payload::json(&expected).unwrap()));
    let stats = scheduler.handle().stats();
    assert!(stats.returns >= 1, "{stats:?}");
    assert_eq!(stats.suspended, 0);
    scheduler.stop(Duration::from_secs(1));
}

/// A suspended process can be terminated (it is not brought back for that) and cancelled
/// (it is brought back, and its step sees the cancel); either way it is counted out of
/// the suspended ones.
#[test]
fn a_suspended_process_is_terminated_or_cancelled() {
    let store = Arc::new(MemoryStore::new());
    let scheduler = durable(&store, Some(Duration::ZERO));
    let handle = scheduler.handle();
    let terminated = spawn(&scheduler, "gather", Payload::json(&1).unwrap());
    let cancelled = spawn(&scheduler, "gather", Payload::json(&1).unwrap());
    until("both to be suspended", || handle.stats().suspended == 2);
    handle.terminate(terminated.pid()).unwrap();
    assert_eq!(terminated.join_timeout(HANG), Some(Err(ExitReason::Terminated)));
    assert_eq!(handle.stats().returns, 0, "a termination brings nothing back");
    handle.cancel(cancelled.pid(), "no longer wanted").unwrap();
    let ended = cancelled.join_timeout(HANG).expect("the cancelled process ended");
    let error = ended.unwrap_err().to_string();
    assert!(error.contains("no longer wanted"), "{error}");
    let stats = handle.stats();
    assert_eq!((stats.suspended, stats.returns), (0, 1), "{stats:?}");
    scheduler.stop(Duration::from_secs(1));
}

/// A native process that sleeps `first` then completes with how many processes of its
/// kind were made before it.
struct Napper {
    first: Duration,
    made: usize,
}

impl Process for Napper {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, mut events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if events.next().is_none() {
            out.yield_command(1, Command::Sleep(self.first));
            out.set_status(Status::Blocked);
        } else {
            out.complete(Ok(Payload::json(&self.made)?));
        }
        Ok(())
    }
}

/// A process that cannot come back ends, when woken, with an error naming why: its kind
/// cannot make it again, or what it is made into replays differently from its history.
#[test]
fn a_process_that_cannot_come_back_ends_with_an_error_naming_why() {
    for (case, expected) in [("gone", "cannot be made again: the component is gone"), ("diverges", "non-determinism")] {
        let made = Arc::new(AtomicUsize::new(0));
        let counted = made.clone();
        let factory = move || -> anyhow::Result<Box<dyn Process>> {
            let before = counted.fetch_add(1, Ordering::SeqCst);
            match (case, before) {
                // A nap long enough, on a loaded machine, for a worker to suspend it first.
                (_, 0) => Ok(Box::new(Napper { first: Duration::from_secs(3), made: before })),
                ("gone", _) => anyhow::bail!("the component is gone"),
                _ => Ok(Box::new(Napper { first: Duration::from_millis(3001), made: before })),
            }
        };
        let store = Arc::new(MemoryStore::new());
        let scheduler = Scheduler::builder()
            .workers(2)
            .journal(Journal::with_store(store.clone()).settings(keep_finished()))
            .kind("napper", factory)
            .suspend_after(Some(Duration::ZERO))
            .build()
            .unwrap();
        let napper = scheduler.handle().spawn(Spawnable::kind("napper"), SpawnOptions::new("main")).unwrap();
        until("the napper to be suspended", || scheduler.handle().stats().suspended == 1);
        let ended = napper.join_timeout(HANG).expect("the napper ended, never hung");
        let error = ended.unwrap_err().to_string();
        assert!(error.contains("could not come back from suspension"), "{case}: {error}");
        assert!(error.contains(expected), "{case}: {error}");
        assert_eq!(scheduler.handle().stats().suspended, 0, "{case}");
        scheduler.stop(Duration::from_secs(1));
    }
}

/// What a [`Gated`] process's first `hibernate` tells the test, and waits for from it.
#[derive(Default)]
struct Gate {
    /// Its first `hibernate` has begun.
    entered: AtomicBool,
    /// Its first `hibernate` may end.
    opened: AtomicBool,
}

/// A native process that waits for ever (idle) and wants to hibernate; its first
/// `hibernate` holds the process claimed until the test opens the gate (for at most
/// [`HANG`]): a whole-instance hibernation that takes long.
struct Gated {
    gate: Arc<Gate>,
    hibernated: bool,
}

impl Process for Gated {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.set_status(Status::Idle);
        Ok(())
    }

    fn wants_hibernation(&mut self) -> bool {
        !self.hibernated
    }

    fn hibernate(&mut self) -> bool {
        if !std::mem::replace(&mut self.hibernated, true) {
            self.gate.entered.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + HANG;
            while !self.gate.opened.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        true
    }
}

/// A native process that waits for ever (idle), and never hibernates.
struct Waits;

impl Process for Waits {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// A process that one worker is hibernating (it holds it claimed, as a long
/// whole-instance hibernation does) when another worker finds its suspension due is
/// still suspended once its hibernation ends: a worker that finds a listed process busy
/// leaves it listed. (Made here with a process whose hibernation waits for the test;
/// a second process, suspended by the other worker after it looked at the first, tells
/// the test that look has happened.)
#[test]
fn a_process_being_hibernated_when_its_suspension_is_due_is_suspended_after() {
    let gate = Arc::new(Gate::default());
    let gated = gate.clone();
    let store = Arc::new(MemoryStore::new());
    let scheduler = Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store.clone()).settings(keep_finished()))
        .kind("gated", move || -> anyhow::Result<Box<dyn Process>> {
            Ok(Box::new(Gated { gate: gated.clone(), hibernated: false }))
        })
        .kind("waits", || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Waits)) })
        .hibernate_after(Duration::ZERO)
        .suspend_after(Some(Duration::from_millis(50)))
        .build()
        .unwrap();
    let handle = scheduler.handle();
    let _gated = handle.spawn(Spawnable::kind("gated"), SpawnOptions::new("main")).unwrap();
    until("the first process's hibernation to begin", || gate.entered.load(Ordering::SeqCst));
    let _waits = handle.spawn(Spawnable::kind("waits"), SpawnOptions::new("main")).unwrap();
    until("the second process to be suspended", || handle.stats().suspended >= 1);
    assert_eq!(handle.stats().suspended, 1, "the first process is still being hibernated");
    gate.opened.store(true, Ordering::SeqCst);
    until("both to be suspended", || handle.stats().suspended == 2);
    scheduler.stop(Duration::from_secs(1));
}

/// A native process that sleeps for ten minutes, then completes.
struct Sleeps;

impl Process for Sleeps {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, mut events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if events.next().is_none() {
            out.yield_command(1, Command::Sleep(Duration::from_secs(600)));
            out.set_status(Status::Blocked);
        } else {
            out.complete(Ok(Payload::empty()));
        }
        Ok(())
    }
}

/// A process resumed from its journal by a new scheduler (after a crash, or a stop that
/// suspended it) is suspended again once it has waited, as it was before, even when its
/// making took so long (a Wasm component's, say) that every worker had parked before it
/// was listed.
#[test]
fn a_resumed_process_is_suspended_again() {
    let store = Arc::new(MemoryStore::new());
    let build = |making: Duration| {
        Scheduler::builder()
            .workers(2)
            .journal(Journal::with_store(store.clone()).settings(keep_finished()))
            .kind("sleeps", move || -> anyhow::Result<Box<dyn Process>> {
                std::thread::sleep(making);
                Ok(Box::new(Sleeps))
            })
            .suspend_after(Some(Duration::from_millis(10)))
            .build()
            .unwrap()
    };
    let first = build(Duration::ZERO);
    first.handle().spawn(Spawnable::kind("sleeps"), SpawnOptions::new("main")).unwrap();
    until("the sleeper to be suspended", || first.handle().stats().suspended == 1);
    first.stop(Duration::from_secs(1));
    drop(first);
    let second = build(Duration::from_millis(200));
    until("the resumed sleeper to be suspended", || second.handle().stats().suspended == 1);
    second.stop(Duration::from_secs(1));
}

/// A native process that sleeps 1 ms `naps` times, then waits for ever (idle).
struct Naps {
    naps: u32,
}

impl Process for Naps {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if self.naps == 0 {
            out.set_status(Status::Idle);
        } else {
            self.naps -= 1;
            out.yield_command(1, Command::Sleep(Duration::from_millis(1)));
            out.set_status(Status::Blocked);
        }
        Ok(())
    }
}

/// Every durable process that waits past the threshold is suspended, however its steps
/// and the workers' looks at the list interleave: many processes, each waking several
/// times just after it waited (so that workers often find it stepping or queued), all
/// end suspended.
#[test]
fn every_process_that_waits_past_the_threshold_is_suspended() {
    const PROCESSES: usize = 300;
    let store = Arc::new(MemoryStore::new());
    let scheduler = Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store.clone()).settings(keep_finished()))
        .kind("naps", || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Naps { naps: 20 })) })
        .suspend_after(Some(Duration::ZERO))
        .build()
        .unwrap();
    let handle = scheduler.handle();
    for _ in 0..PROCESSES {
        handle.spawn(Spawnable::kind("naps"), SpawnOptions::new("main")).unwrap();
    }
    until("every process to be suspended", || handle.stats().suspended == PROCESSES);
    scheduler.stop(Duration::from_secs(1));
}
