//! Snapshots in the journal: a durable process recovered from its snapshot ends as one
//! never snapshotted, its journal stays bounded, and a snapshot that does not match its
//! kind is refused.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use wasmproc::handler::Factory;
use wasmproc::journal::{Journal, Key, MemoryStore, Store};
use wasmproc::scheduler::Spawnable;
use wasmproc::{Command, Event, Events, Payload, Pid, Port, Process, Scheduler, Status, StepOutput};
use wasmproc_tests::HANG;

/// The second byte of a record is its kind (after the format version).
const SPAWN: u8 = 1;
const SNAPSHOT: u8 = 6;

/// A workflow whose state is what it has seen: each message's text (a `sleep` of a
/// millisecond yielded for each), the sleeps completed, and its steps. `main` completes
/// at the message `end` with all of it; `count` steps on (`Continue`) until its input's
/// number of steps, then waits for `report` and completes with its count.
struct Tally {
    /// The version of its snapshots it writes and reads.
    version: u8,
    method: String,
    target: u64,
    seen: Vec<String>,
    completions: u64,
    steps: u64,
    /// The highest step count any `Tally` reached, for the test to wait on.
    reached: Arc<AtomicU64>,
}

impl Tally {
    fn encode(&self) -> Vec<u8> {
        let mut bytes = format!(
            "tally v{}\n{}\n{}\n{}\n{}\n",
            self.version, self.method, self.target, self.completions, self.steps
        )
        .into_bytes();
        bytes.extend_from_slice(self.seen.join("\n").as_bytes());
        bytes
    }
}

impl Process for Tally {
    fn init(&mut self, _: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.method = method.to_owned();
        self.target = input.first().and_then(Payload::to_u64).unwrap_or(0);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        self.steps += 1;
        self.reached.fetch_max(self.steps, Ordering::SeqCst);
        let mut status = Status::Idle;
        for event in events {
            match event {
                Event::Completion { .. } => self.completions += 1,
                Event::Message { topic, .. } if topic == "end" || topic == "report" => {
                    let result = match self.method.as_str() {
                        "count" => Payload::u64(self.steps),
                        _ => Payload::text(format!("{} | {} completions", self.seen.join(","), self.completions)),
                    };
                    out.complete(Ok(result));
                    return Ok(());
                }
                Event::Message { body, .. } => {
                    self.seen.push(String::from_utf8_lossy(&body.data).into_owned());
                    out.yield_command(self.seen.len() as u64, Command::Sleep(Duration::from_millis(1)));
                    status = Status::Blocked;
                }
                _ => {}
            }
        }
        if self.method == "count" && self.steps < self.target {
            status = Status::Continue;
        }
        out.set_status(status);
        Ok(())
    }

    fn snapshot(&mut self) -> Option<Vec<u8>> {
        Some(self.encode())
    }

    fn restore(&mut self, _: Port, state: &[u8]) -> anyhow::Result<()> {
        let text = std::str::from_utf8(state)?;
        let mut fields = text.splitn(6, '\n');
        let header = fields.next().unwrap_or_default();
        anyhow::ensure!(
            header == format!("tally v{}", self.version),
            "a snapshot of `{header}`, and this process is tally v{}",
            self.version
        );
        let mut next = || fields.next().ok_or_else(|| anyhow::anyhow!("a snapshot cut short"));
        self.method = next()?.to_owned();
        self.target = next()?.parse()?;
        self.completions = next()?.parse()?;
        self.steps = next()?.parse()?;
        let seen = next()?;
        self.seen = if seen.is_empty() { Vec::new() } else { seen.split('\n').map(str::to_owned).collect() };
        Ok(())
    }
}

/// The kind of [`Tally`]s of one version and identity.
struct TallyKind {
    version: u8,
    identity: Option<&'static str>,
    reached: Arc<AtomicU64>,
}

impl Factory for TallyKind {
    fn make(&self) -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(Tally {
            version: self.version,
            method: String::new(),
            target: 0,
            seen: Vec::new(),
            completions: 0,
            steps: 0,
            reached: self.reached.clone(),
        }))
    }

    fn identity(&self) -> Option<String> {
        self.identity.map(str::to_owned)
    }
}

fn builder(store: &Arc<MemoryStore>, every: Option<u64>, kind: TallyKind) -> wasmproc::scheduler::Builder {
    Scheduler::builder()
        .workers(1)
        .journal(Journal::with_store(store.clone()))
        .snapshot_every(every)
        .suspend_after(None)
        .kind("tally", kind)
}

fn tally(version: u8, reached: &Arc<AtomicU64>) -> TallyKind {
    TallyKind { version, identity: Some("tally-1"), reached: reached.clone() }
}

/// The kinds of `pid`'s records in `store`, in order.
fn kinds(store: &MemoryStore, pid: Pid) -> Vec<u8> {
    let mut kinds = Vec::new();
    store
        .scan(Key { process: pid.as_u64(), seq: 0 }, &mut |key, value| {
            if key.process != pid.as_u64() {
                return ControlFlow::Break(());
            }
            kinds.push(value[1]);
            ControlFlow::Continue(())
        })
        .unwrap();
    kinds
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < HANG, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Half of the messages to a first scheduler, which stops (suspending the workflow, as a
/// crash would leave it); the rest to a second one on the same journal: the result,
/// with and without snapshots every two steps, is the same, and with them the
/// workflow's first records are gone, replaced by a snapshot.
#[test]
fn a_workflow_recovered_from_its_snapshot_ends_as_one_never_snapshotted() {
    let mut results = Vec::new();
    for every in [None, Some(2)] {
        let store = Arc::new(MemoryStore::new());
        let reached = Arc::new(AtomicU64::new(0));
        let first = builder(&store, every, tally(1, &reached)).build().unwrap();
        let pid = first.handle().spawn(Spawnable::kind("tally"), "main").unwrap().pid();
        for n in 0..10 {
            first.handle().send(pid, "add", Payload::text(format!("m{n}"))).unwrap();
            // One message a step, so that there are steps to snapshot.
            wait_until("a step", || reached.load(Ordering::SeqCst) > n);
        }
        if every.is_some() {
            wait_until("a snapshot", || kinds(&store, pid).contains(&SNAPSHOT));
        }
        first.stop(HANG);
        drop(first);
        let records = kinds(&store, pid);
        match every {
            None => assert_eq!(records.first(), Some(&SPAWN), "{records:?}"),
            Some(_) => {
                assert_eq!(records.first(), Some(&SNAPSHOT), "the snapshot replaced what was before it: {records:?}");
                assert!(!records.contains(&SPAWN), "{records:?}");
            }
        }

        let second = builder(&store, every, tally(1, &reached)).build().unwrap();
        let resumed = second.resumed();
        assert_eq!(resumed.len(), 1);
        for n in 10..20 {
            second.handle().send(pid, "add", Payload::text(format!("m{n}"))).unwrap();
        }
        // Every sleep completes before the end (a Tally counts the completions it saw).
        std::thread::sleep(Duration::from_millis(50));
        second.handle().send(pid, "end", Payload::empty()).unwrap();
        results.push(resumed[0].join_timeout(HANG).expect("it ends"));
        second.stop(HANG);
    }
    let expected: Vec<String> = (0..20).map(|n| format!("m{n}")).collect();
    assert_eq!(results[0], Ok(Payload::text(format!("{} | 20 completions", expected.join(",")))));
    assert_eq!(results[1], results[0], "with snapshots as without");
}

/// A workflow that steps on holds at most a snapshot and the records after it: after
/// 3,000 steps with a snapshot every 50, fewer than 53 records; resumed from them, it
/// has its count of 3,000.
#[test]
fn the_journal_of_a_workflow_that_steps_on_stays_bounded() {
    const EVERY: u64 = 50;
    const STEPS: u64 = 3_000;
    let store = Arc::new(MemoryStore::new());
    let reached = Arc::new(AtomicU64::new(0));
    let first = builder(&store, Some(EVERY), tally(1, &reached)).build().unwrap();
    let spawn = wasmproc::scheduler::SpawnOptions::from("count").input(vec![Payload::u64(STEPS)]);
    let pid = first.handle().spawn(Spawnable::kind("tally"), spawn).unwrap().pid();
    wait_until("the steps", || reached.load(Ordering::SeqCst) >= STEPS);
    first.stop(HANG);
    drop(first);
    let records = kinds(&store, pid);
    assert!(records.len() as u64 <= EVERY + 2, "{} records: {records:?}", records.len());
    assert_eq!(records.first(), Some(&SNAPSHOT));
    assert_eq!(store.len(), records.len(), "no record of it is left elsewhere");

    let second = builder(&store, Some(EVERY), tally(1, &reached)).build().unwrap();
    let resumed = second.resumed();
    second.handle().send(pid, "report", Payload::empty()).unwrap();
    // The report's step is one more.
    assert_eq!(resumed[0].join_timeout(HANG).expect("it ends"), Ok(Payload::u64(STEPS + 1)));
    second.stop(HANG);
}

/// Runs a `count` workflow to a snapshot and stops: the journal holds it suspended.
fn snapshotted() -> (Arc<MemoryStore>, Pid) {
    let store = Arc::new(MemoryStore::new());
    let reached = Arc::new(AtomicU64::new(0));
    let first = builder(&store, Some(10), tally(1, &reached)).build().unwrap();
    let spawn = wasmproc::scheduler::SpawnOptions::from("count").input(vec![Payload::u64(25)]);
    let pid = first.handle().spawn(Spawnable::kind("tally"), spawn).unwrap().pid();
    wait_until("the steps", || reached.load(Ordering::SeqCst) >= 25);
    first.stop(HANG);
    (store, pid)
}

/// A snapshot is restored only into what wrote it: a kind of another identity is
/// refused before anything runs, and a process that does not read the snapshot's
/// version ends with why, never run from it.
#[test]
fn a_snapshot_that_does_not_match_its_kind_is_refused() {
    let (store, _) = snapshotted();
    let reached = Arc::new(AtomicU64::new(0));
    let other = TallyKind { version: 1, identity: Some("tally-2"), reached: reached.clone() };
    let error = builder(&store, Some(10), other).build().err().expect("refused");
    assert!(format!("{error:#}").contains("ran tally-1, and this host's `tally` is tally-2"), "{error:#}");

    let newer = builder(&store, Some(10), tally(2, &reached)).build().unwrap();
    let resumed = newer.resumed();
    let ended = resumed[0].join_timeout(HANG).expect("it ends");
    let Err(wasmproc::ExitReason::Error(why)) = ended else { panic!("{ended:?}") };
    assert!(
        why.contains("its snapshot's restore failed")
            && why.contains("a snapshot of `tally v1`, and this process is tally v2"),
        "{why}"
    );
    assert_eq!(reached.load(Ordering::SeqCst), 0, "it never ran");
    newer.stop(HANG);
}

/// `verify_journal` restores a snapshot and replays the steps after it against their
/// records.
#[test]
fn verifying_a_journal_replays_from_its_snapshots() {
    let (store, pid) = snapshotted();
    let records = kinds(&store, pid);
    assert_eq!(records.first(), Some(&SNAPSHOT));
    let steps_after = records.iter().filter(|kind| **kind == 2).count();
    let reached = Arc::new(AtomicU64::new(0));
    let verdicts = builder(&store, Some(10), tally(1, &reached)).verify_journal().unwrap();
    assert_eq!(verdicts, vec![(pid, Ok(steps_after))]);
    let verdicts = builder(&store, Some(10), tally(2, &reached)).verify_journal().unwrap();
    let Err(why) = &verdicts[0].1 else { panic!("{verdicts:?}") };
    assert!(why.contains("its snapshot's restore failed"), "{why}");
}

/// Counts the sleeps it waits for, one a step, up to `ENOUGH`: each step takes the
/// completion of the sleep the step before yielded and yields the next. A completion
/// lost at a crash would leave it waiting for ever, one delivered twice ends it with an
/// error; its result is the last tag and the sum of every tag it took.
struct Sleeper {
    started: bool,
    next: u64,
    sum: u64,
}

const ENOUGH: u64 = 150;

impl Process for Sleeper {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if !self.started {
            self.started = true;
            self.next = 1;
            out.yield_command(1, Command::Sleep(Duration::from_millis(1)));
        }
        for event in events {
            let Event::Completion { tag, .. } = event else { continue };
            if tag != self.next {
                out.complete(Err(format!("completion {tag} while waiting for {}", self.next)));
                return Ok(());
            }
            self.sum += tag;
            self.next += 1;
            if self.next > ENOUGH {
                out.complete(Ok(Payload::text(format!("{} {}", self.next, self.sum))));
                return Ok(());
            }
            out.yield_command(self.next, Command::Sleep(Duration::from_millis(1)));
        }
        out.set_status(Status::Blocked);
        Ok(())
    }

    fn snapshot(&mut self) -> Option<Vec<u8>> {
        Some(format!("{} {} {}", self.started, self.next, self.sum).into_bytes())
    }

    fn restore(&mut self, _: Port, state: &[u8]) -> anyhow::Result<()> {
        let text = std::str::from_utf8(state)?;
        let fields: Vec<&str> = text.split(' ').collect();
        anyhow::ensure!(fields.len() == 3, "not a sleeper's snapshot: {text:?}");
        (self.started, self.next, self.sum) = (fields[0].parse()?, fields[1].parse()?, fields[2].parse()?);
        Ok(())
    }
}

/// Set in the child of the crash test: the journal's directory.
const CRASH_CHILD: &str = "WASMPROC_SNAPSHOT_CRASH_DIR";

/// The crash test's child: resumes the sleeper from the journal in its directory (or
/// spawns it into an empty one), a snapshot every other step, every commit synced, and
/// prints its result.
fn crash_child(dir: &str) {
    let make = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Sleeper { started: false, next: 0, sum: 0 })) };
    let scheduler = Scheduler::builder()
        .workers(2)
        .journal(Journal::open(dir).unwrap())
        .snapshot_every(Some(2))
        .kind("sleeper", make)
        .build()
        .unwrap();
    let handle = match scheduler.resumed().pop() {
        Some(handle) => handle,
        None => scheduler.handle().spawn(Spawnable::kind("sleeper"), "main").unwrap(),
    };
    let result = handle.join_timeout(HANG).expect("it ends");
    println!("result: {result:?}");
    scheduler.stop(HANG);
}

/// The host killed with SIGKILL at random moments, a snapshot written every other step
/// (so that many kills land during one's write), and started again each time: the
/// workflow ends as it would uncrashed, every sleep's completion taken once.
#[test]
fn a_workflow_with_snapshots_killed_at_random_moments_ends_as_uncrashed() {
    if let Ok(dir) = std::env::var(CRASH_CHILD) {
        crash_child(&dir);
        return;
    }
    let dir = std::env::temp_dir().join(format!("wasmproc-snapshot-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "snapshots::a_workflow_with_snapshots_killed_at_random_moments_ends_as_uncrashed"])
            .args(["--nocapture", "--test-threads=1"])
            .env(CRASH_CHILD, &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut state = u64::from(std::process::id()) | 1;
    let mut kills = 0;
    let output = loop {
        let mut running = child();
        // xorshift: a kill between 5 and 60 ms after the start, often mid-commit.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        std::thread::sleep(Duration::from_millis(5 + state % 55));
        if running.try_wait().unwrap().is_some() || kills >= 40 {
            break running.wait_with_output().unwrap();
        }
        running.kill().unwrap();
        running.wait().unwrap();
        kills += 1;
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    let expected = format!("result: Ok({:?})", Payload::text(format!("{} {}", ENOUGH + 1, ENOUGH * (ENOUGH + 1) / 2)));
    assert!(stdout.contains(&expected), "after {kills} kills: {stdout}");
    assert!(kills > 0, "the child was never killed");
}

/// Whether `store` holds a snapshot record, of any process.
fn holds_a_snapshot(store: &MemoryStore) -> bool {
    let mut found = false;
    store
        .scan(Key { process: 1, seq: 0 }, &mut |_, value| {
            found = value[1] == SNAPSHOT;
            if found { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap();
    found
}

/// The durable example (timers, children, messages, the clock and random numbers
/// through std's `HashMap`) with a snapshot at every step: suspended at every wait, so
/// that each return restores its last snapshot, and then stopped part-way and resumed by
/// another scheduler from the journal, it ends with the result of the same workflow
/// never snapshotted.
#[test]
fn a_wasm_workflow_restored_from_its_snapshots_ends_as_one_never_snapshotted() {
    let component =
        wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default().cache_dir(env!("CARGO_TARGET_TMPDIR")))
            .unwrap()
            .load(env!("GUEST_DURABLE"))
            .unwrap();
    let scheduler = |store: &Arc<MemoryStore>, every: Option<u64>, suspend: Option<Duration>| {
        let mut settings = wasmproc::journal::JournalSettings::default();
        settings.keep_finished = true;
        Scheduler::builder()
            .workers(2)
            .journal(Journal::with_store(store.clone()).settings(settings))
            .kind("durable", component.clone())
            .snapshot_every(every)
            .suspend_after(suspend)
            .build()
            .unwrap()
    };
    let input = || wasmproc::scheduler::SpawnOptions::from("main").input(vec![Payload::json(&(2, 3)).unwrap()]);
    let never = {
        let store = Arc::new(MemoryStore::new());
        let s = scheduler(&store, None, None);
        let result = s.handle().spawn(Spawnable::kind("durable"), input()).unwrap().join_timeout(HANG);
        s.stop(HANG);
        assert!(!holds_a_snapshot(&store));
        result.expect("it ends")
    };
    assert_eq!(never, Ok(Payload::json(&34).unwrap()));

    let store = Arc::new(MemoryStore::new());
    let s = scheduler(&store, Some(1), Some(Duration::ZERO));
    let result = s.handle().spawn(Spawnable::kind("durable"), input()).unwrap().join_timeout(HANG);
    let stats = s.handle().stats();
    s.stop(HANG);
    assert_eq!(result.expect("it ends"), never, "suspended and restored from snapshots");
    assert!(stats.returns > 0, "{stats:?}");
    assert!(holds_a_snapshot(&store));

    let store = Arc::new(MemoryStore::new());
    let first = scheduler(&store, Some(1), None);
    let root = first.handle().spawn(Spawnable::kind("durable"), input()).unwrap().pid();
    wait_until("a snapshot", || holds_a_snapshot(&store));
    first.stop(HANG);
    drop(first);
    let second = scheduler(&store, Some(1), None);
    let resumed = second.resumed();
    assert_eq!(resumed.iter().map(|h| h.pid()).collect::<Vec<_>>(), [root]);
    assert_eq!(resumed[0].join_timeout(HANG).expect("it ends"), never, "resumed from its snapshot");
    second.stop(HANG);
}

/// A Wasm process's snapshot is never restored into another component: a journal whose
/// snapshots the durable example wrote is refused by a host whose `durable` is another
/// component, naming both hashes, and nothing runs.
#[test]
fn a_wasm_snapshot_is_refused_by_another_component() {
    let runtime =
        wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default().cache_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let durable = runtime.load(env!("GUEST_DURABLE")).unwrap();
    let other = runtime.load(env!("GUEST_TIMERS")).unwrap();
    let store = Arc::new(MemoryStore::new());
    let scheduler = |component: &wasmproc::wasm::Component| {
        Scheduler::builder()
            .workers(2)
            .journal(Journal::with_store(store.clone()))
            .kind("durable", component.clone())
            .snapshot_every(Some(1))
            .suspend_after(None)
    };
    let first = scheduler(&durable).build().unwrap();
    let input = wasmproc::scheduler::SpawnOptions::from("main").input(vec![Payload::json(&(2, 3)).unwrap()]);
    first.handle().spawn(Spawnable::kind("durable"), input).unwrap();
    wait_until("a snapshot", || holds_a_snapshot(&store));
    first.stop(HANG);
    drop(first);
    let error = scheduler(&other).build().err().expect("refused");
    let error = format!("{error:#}");
    assert!(error.contains("ran sha256:") && error.contains("resume them with the program they ran"), "{error}");
    let error = scheduler(&other).verify_journal().expect_err("refused");
    assert!(format!("{error:#}").contains("resume them with the program they ran"), "{error:#}");
}
