use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use wasmproc::handler::ReadOnly;
use wasmproc::journal::{Batch, Durability, FjallStore, Journal, JournalSettings, Key, LogStore, MemoryStore, Store};
use wasmproc::scheduler::SpawnOptions;
use wasmproc::{Capabilities, Command, Event, Payload, Scheduler, Status};
use wasmproc_tests::Scripted;

const HANG: Duration = Duration::from_secs(20);

/// A store in memory that can hold every commit until let go, or fail them all.
#[derive(Default)]
struct TestStore {
    records: MemoryStore,
    held: Mutex<bool>,
    released: Condvar,
    fail: AtomicBool,
    commits: AtomicUsize,
    /// Commits taken before every later one is held for ever (0: never).
    crash_after: AtomicUsize,
    crashed: AtomicBool,
}

impl TestStore {
    fn hold(&self) {
        *self.held.lock() = true;
    }

    fn release(&self) {
        *self.held.lock() = false;
        self.released.notify_all();
    }

    /// Takes the crash point away and lets any commit it holds go: the host lives on.
    fn disarm(&self) {
        let mut held = self.held.lock();
        self.crash_after.store(0, Ordering::SeqCst);
        *held = false;
        self.released.notify_all();
    }

    /// Waits until a commit past `crash_after` is being held (true), or `done` (false: a
    /// run may group its records into fewer commits than another).
    fn wait_for_crash(&self, done: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + HANG;
        loop {
            if self.crashed.load(Ordering::SeqCst) {
                return true;
            }
            if done() {
                return false;
            }
            assert!(std::time::Instant::now() < deadline, "the run neither crashed nor ended");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// How many records of processes it holds: all but process 0's, the journal's own.
    fn process_records(&self) -> usize {
        let mut count = 0;
        self.records
            .scan(Key { process: 1, seq: 0 }, &mut |_, _| {
                count += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
        count
    }

    /// Waits until it holds no record of any process (at most [`HANG`]).
    fn wait_until_no_process_records(&self) {
        let deadline = std::time::Instant::now() + HANG;
        while self.process_records() > 0 {
            assert!(std::time::Instant::now() < deadline, "{} records left", self.process_records());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What a fresh start finds on the disk.
    fn copy(&self) -> TestStore {
        TestStore { records: self.records.snapshot(), ..TestStore::default() }
    }
}

impl Store for TestStore {
    fn commit(&self, batch: &Batch, _sync: bool) -> io::Result<()> {
        // The crash point is checked under the hold's lock, so `disarm` either comes first
        // or finds this commit held and lets it go.
        let mut held = self.held.lock();
        let crash_after = self.crash_after.load(Ordering::SeqCst);
        if crash_after > 0 && self.commits.load(Ordering::SeqCst) >= crash_after {
            self.crashed.store(true, Ordering::SeqCst);
            *held = true;
        }
        while *held {
            self.released.wait(&mut held);
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected sync failure"));
        }
        self.commits.fetch_add(1, Ordering::SeqCst);
        self.records.commit(batch, true)
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        self.records.scan(from, visit)
    }
}

fn keep_finished() -> JournalSettings {
    let mut settings = JournalSettings::default();
    settings.keep_finished = true;
    settings
}

/// A scheduler on `store` with a custom command `effect` that counts its calls.
fn durable(store: &Arc<TestStore>) -> (Scheduler, Arc<AtomicUsize>) {
    let (scheduler, effects, _) = counting(store);
    (scheduler, effects)
}

/// A scheduler on `store` with two custom commands that count their calls, `effect` and
/// `peek`, which only reads: the scheduler and the counts of each.
fn counting(store: &Arc<TestStore>) -> (Scheduler, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    counting_with(store, keep_finished())
}

/// As [`counting`], with the journal's `settings`.
fn counting_with(store: &Arc<TestStore>, settings: JournalSettings) -> (Scheduler, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (effects, reads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (effected, counted) = (effects.clone(), reads.clone());
    let scheduler = Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store.clone()).settings(settings))
        .capabilities(Capabilities::default().allow("effect").allow("peek"))
        .handler("effect", move |request: wasmproc::handler::Request| {
            effected.fetch_add(1, Ordering::SeqCst);
            request.complete(Ok(Payload::text("done")));
        })
        .handler(
            "peek",
            ReadOnly(move |request: wasmproc::handler::Request| {
                assert!(request.idempotency_key().is_some(), "a durable read has a key too");
                counted.fetch_add(1, Ordering::SeqCst);
                request.complete(Ok(Payload::empty()));
            }),
        )
        .build()
        .unwrap();
    (scheduler, effects, reads)
}

/// Yields `effect` once, then completes with its result.
fn effect_once() -> Scripted {
    Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(1, Command::Custom { name: "effect".into(), payload: Payload::empty() });
            return Ok(());
        }
        let result = t.events.iter().find_map(|e| wasmproc_tests::completion(e, 1).cloned());
        t.out.set_status(Status::Complete(result.expect("the effect's completion")));
        Ok(())
    })
    .0
}

#[test]
fn nothing_of_a_step_happens_before_its_record_is_committed() {
    let store = Arc::new(TestStore::default());
    let (scheduler, effects) = durable(&store);
    store.hold();
    let process = scheduler.handle().spawn(effect_once(), "main").unwrap();
    // The step ran and its record waits for the store: the command is not carried out
    // and, later, the result is not reported.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(effects.load(Ordering::SeqCst), 0, "the command ran before its step was committed");
    assert_eq!(process.try_result(), None);
    store.release();
    assert_eq!(process.join_timeout(HANG).unwrap(), Ok(Payload::text("done")));
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    let history = Journal::with_store(store.clone()).history().unwrap();
    assert_eq!(history.len(), 1);
    let process = &history[0];
    assert_eq!(process.parent, Some(wasmproc::Pid::HOST));
    assert_eq!(process.method, "main");
    assert_eq!(process.steps, 2);
    assert_eq!(process.result, wasmproc_tests::normal(Payload::text("done")));
    assert_eq!(process.records.len(), 4, "spawn, two steps, exit: {:#?}", process.records);
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_history_says_what_an_unfinished_process_waits_for() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _) = durable(&store);
    // Two commands, one answered at once: it then waits for the other, for an hour.
    let (waiter, probe) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(1, Command::Custom { name: "effect".into(), payload: Payload::empty() });
            t.out.yield_command(2, Command::Sleep(Duration::from_secs(3600)));
        }
        Ok(())
    });
    let process = scheduler.handle().spawn(waiter, "main").unwrap();
    let deadline = std::time::Instant::now() + HANG;
    let history = loop {
        let history = Journal::with_store(store.clone()).history().unwrap();
        if history.first().is_some_and(|h| h.steps == 2) {
            break history;
        }
        assert!(std::time::Instant::now() < deadline, "the completion's step was not recorded: {history:#?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    let waiting = &history[0];
    assert_eq!(waiting.pid, process.pid());
    assert_eq!(waiting.last_status, Some(Status::Blocked));
    assert_eq!(waiting.waiting_for, ["2: sleep 3600s"]);
    assert_eq!(waiting.result, None);
    assert!(waiting.records[1].ends_with("→ 1: effect (empty); 2: sleep 3600s → blocked"), "{:#?}", waiting.records);
    assert!(waiting.records[2].contains("completion 1: ok \"done\""), "{:#?}", waiting.records);
    assert_eq!(probe.steps(), 2);
    scheduler.stop(Duration::from_secs(1));
}

/// Yields `command` (tag 1) `times` times, one after another, then completes with how
/// many completions it got.
fn repeating(command: &'static str, times: usize) -> Scripted {
    let mut completions = 0;
    Scripted::new(move |t| {
        completions += t.events.iter().filter(|e| wasmproc_tests::completion(e, 1).is_some()).count();
        if completions >= times {
            t.out.set_status(Status::Complete(Ok(Payload::u64(times as u64))));
        } else {
            t.out.yield_command(1, Command::Custom { name: command.into(), payload: Payload::empty() });
        }
        Ok(())
    })
    .0
}

#[test]
fn a_step_that_only_reads_goes_on_before_its_commit_and_one_with_an_effect_does_not() {
    let store = Arc::new(TestStore::default());
    let (scheduler, effects, reads) = counting(&store);
    store.hold();
    // A step that reads and has an effect waits for its commit: neither runs meanwhile.
    let mut completions = 0;
    let (mixed, mixed_probe) = Scripted::new(move |t| {
        completions += t.events.len();
        if t.step == 0 {
            t.out.yield_command(1, Command::Custom { name: "peek".into(), payload: Payload::empty() });
            t.out.yield_command(2, Command::Custom { name: "effect".into(), payload: Payload::empty() });
        } else if completions >= 2 {
            t.out.set_status(Status::Complete(Ok(Payload::empty())));
        }
        Ok(())
    });
    let mixed = scheduler.handle().spawn(mixed, "main").unwrap();
    let reader = scheduler.handle().spawn(repeating("peek", 20), "main").unwrap();
    let deadline = std::time::Instant::now() + HANG;
    while (reads.load(Ordering::SeqCst) < 20 || mixed_probe.steps() == 0) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    let before_commit = (reads.load(Ordering::SeqCst), effects.load(Ordering::SeqCst), reader.try_result());
    // Let go before asserting: a scheduler whose store holds its commits cannot stop.
    store.release();
    assert_eq!(before_commit, (20, 0, None), "the reads (only) go on before the commit; no effect, no result");
    assert_eq!(reader.join_timeout(HANG).unwrap(), Ok(Payload::u64(20)));
    assert_eq!(mixed.join_timeout(HANG).unwrap(), Ok(Payload::empty()));
    assert_eq!((reads.load(Ordering::SeqCst), effects.load(Ordering::SeqCst)), (21, 1));
    let history = Journal::with_store(store.clone()).history().unwrap();
    let read = history.iter().find(|h| h.pid == reader.pid()).unwrap();
    assert_eq!((read.steps, read.result.clone()), (21, wasmproc_tests::normal(Payload::u64(20))));
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn the_commands_of_a_served_family_declared_reads_go_on_before_their_commits() {
    let services = Scheduler::builder().workers(1).build().unwrap();
    let (serve, seen) = crate::providers::server(1);
    let server = services.handle().spawn(serve, "main").unwrap().pid();
    let store = Arc::new(TestStore::default());
    let served = wasmproc::provider::Served::new("svc", services.handle().clone(), server).reads(["svc.look"]);
    let scheduler = Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store.clone()).settings(keep_finished()))
        .provider(served)
        .capabilities(Capabilities::default().allow("svc.*"))
        .build()
        .unwrap();
    let count = |command: &str| seen.lock().iter().filter(|(c, _)| c == command).count();
    store.hold();
    let looking = scheduler.handle().spawn(repeating("svc.look", 5), "main").unwrap();
    let changing = scheduler.handle().spawn(repeating("svc.change", 1), "main").unwrap();
    let deadline = std::time::Instant::now() + HANG;
    while count("svc.look") < 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    // With every commit held: the declared reads all reached the server, the command of
    // the same family not declared did not, and nothing was reported.
    let held = (count("svc.look"), count("svc.change"), looking.try_result(), changing.try_result());
    store.release();
    assert_eq!(held, (5, 0, None, None));
    assert_eq!(looking.join_timeout(HANG).unwrap(), Ok(Payload::u64(5)));
    assert_eq!(changing.join_timeout(HANG).unwrap(), Ok(Payload::u64(1)));
    assert_eq!((count("svc.look"), count("svc.change")), (5, 1));
    scheduler.stop(Duration::from_secs(1));
    services.stop(Duration::from_secs(1));
}

#[test]
fn reads_stop_going_on_before_their_commits_once_the_committer_has_thousands_in_hand() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _, reads) = counting(&store);
    store.hold();
    let reader = scheduler.handle().spawn(repeating("peek", 20_000), "main").unwrap();
    // While the store holds every commit, the reads go on until the committer's backlog
    // is full, and then wait: the count settles far below the 20,000 asked for.
    let deadline = std::time::Instant::now() + HANG;
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = reads.load(Ordering::SeqCst);
        if now == last || std::time::Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let settled = reads.load(Ordering::SeqCst);
    store.release();
    assert!((1_000..10_000).contains(&settled), "reads went on, then waited: {settled}");
    assert_eq!(reader.join_timeout(HANG).unwrap(), Ok(Payload::u64(20_000)));
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_failed_commit_ends_a_process_whose_reads_went_on() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _, _) = counting(&store);
    store.fail.store(true, Ordering::SeqCst);
    // It reads once and then waits for a message that never comes: only the failed
    // commit of its steps can end it.
    let (waiting, _) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(1, Command::Custom { name: "peek".into(), payload: Payload::empty() });
        } else {
            t.out.set_status(Status::Idle);
        }
        Ok(())
    });
    let waiting = scheduler.handle().spawn(waiting, "main").unwrap();
    let error = wasmproc_tests::said(waiting.join_timeout(HANG).unwrap().unwrap_err());
    assert!(error.contains("journal failed: injected sync failure"), "{error}");
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_process_past_its_journal_limit_ends_naming_it_and_the_others_go_on() {
    let store = Arc::new(TestStore::default());
    let mut settings = keep_finished();
    settings.max_records_per_process = 10;
    let (scheduler, effects, _) = counting_with(&store, settings);
    let endless = scheduler.handle().spawn(repeating("effect", usize::MAX), "main").unwrap();
    let short = scheduler.handle().spawn(repeating("effect", 3), "main").unwrap();
    let error = wasmproc_tests::said(endless.join_timeout(HANG).unwrap().unwrap_err());
    assert!(
        error.starts_with(&format!("journal limit reached: process {} has 10 records", endless.pid()))
            && error.contains("`max_records_per_process`"),
        "{error}"
    );
    assert_eq!(short.join_timeout(HANG).unwrap(), Ok(Payload::u64(3)));
    // Its spawn and nine steps, each of whose effects was carried out after its commit;
    // the tenth step was refused with its effect, and the exit is always recorded.
    assert_eq!(effects.load(Ordering::SeqCst), 9 + 3);
    let history = Journal::with_store(store.clone()).history().unwrap();
    let endless = history.iter().find(|h| h.pid == endless.pid()).unwrap();
    assert_eq!(endless.records.len(), 11, "{:#?}", endless.records);
    let recorded = endless.result.clone().map(|exited| wasmproc_tests::said(exited.reason));
    assert_eq!(recorded, Some(error));
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_port_send_is_delivered_after_the_commit_and_recorded() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _) = durable(&store);
    let (receiver, probe) = Scripted::new(|t| {
        if let Some(Event::Message { body, .. }) = t.events.first() {
            t.out.set_status(Status::Complete(Ok(body.clone())));
        } else {
            t.out.set_status(Status::Idle);
        }
        Ok(())
    });
    let receiver = scheduler.handle().spawn(receiver, "main").unwrap();
    let to = receiver.pid();
    let (sender, _) = Scripted::new(move |t| {
        t.port.send(to, "hello", Payload::u64(7))?;
        t.out.set_status(Status::Complete(Ok(Payload::empty())));
        Ok(())
    });
    store.hold();
    let sender = scheduler.handle().spawn(sender, "main").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(probe.events().is_empty(), "the message arrived before the sender's step was committed");
    store.release();
    assert_eq!(receiver.join_timeout(HANG).unwrap(), Ok(Payload::u64(7)));
    assert_eq!(sender.join_timeout(HANG).unwrap(), Ok(Payload::empty()));
    let history = Journal::with_store(store.clone()).history().unwrap();
    let sent = history.iter().find(|h| h.pid == sender.pid()).unwrap();
    let sends = format!("→ sends \"hello\" (8 bytes: 07 00 00 00 00 00 00 00, u64 7) to {}", receiver.pid());
    assert!(sent.records.iter().any(|r| r.contains(&sends)), "{:#?}", sent.records);
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_failed_sync_runs_no_effect_ends_the_process_and_refuses_later_spawns() {
    let store = Arc::new(TestStore::default());
    let (scheduler, effects) = durable(&store);
    store.fail.store(true, Ordering::SeqCst);
    let process = scheduler.handle().spawn(effect_once(), "main").unwrap();
    let result = process.join_timeout(HANG).unwrap();
    let error = wasmproc_tests::said(result.unwrap_err());
    assert!(error.contains("journal failed: injected sync failure"), "{error}");
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    let refused = scheduler.handle().spawn(effect_once(), "main").unwrap_err();
    assert!(refused.to_string().contains("injected sync failure"), "{refused}");
    assert_eq!(store.commits.load(Ordering::SeqCst), 0);
    scheduler.stop(Duration::from_secs(1));
}

/// Opens a journal on a store in a directory.
type Open = fn(&std::path::Path) -> io::Result<Journal>;

/// The stores on disk: the log (what `Journal::open` makes in a new directory) and fjall
/// (what it opens in a directory fjall wrote).
fn disk_stores() -> [(&'static str, Open); 2] {
    [
        ("log", |dir| Ok(Journal::with_store(LogStore::open(dir)?))),
        ("fjall", |dir| Ok(Journal::with_store(FjallStore::open(dir)?))),
    ]
}

#[test]
fn each_store_on_disk_keeps_the_history_across_a_reopen() {
    for (name, open) in disk_stores() {
        let dir =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pid = {
            let mut settings = keep_finished();
            settings.durability = Durability::Sync;
            let journal = open(&dir).unwrap().settings(settings);
            let scheduler = Scheduler::builder().workers(1).journal(journal).build().unwrap();
            let (sleeper, _) = Scripted::new(|t| {
                if t.step == 0 {
                    t.out.yield_command(1, Command::Sleep(Duration::from_millis(5)));
                } else {
                    t.out.set_status(Status::Complete(Ok(Payload::u64(t.step as u64))));
                }
                Ok(())
            });
            let options = SpawnOptions::new("main").input(vec![Payload::text("in")]);
            let process = scheduler.handle().spawn(sleeper, options).unwrap();
            assert_eq!(process.join_timeout(HANG).unwrap(), Ok(Payload::u64(1)));
            let stats = scheduler.handle().journal_stats().unwrap();
            assert!(stats.records >= 4 && stats.commits >= 1, "{name}: {stats:?}");
            scheduler.stop(Duration::from_secs(1));
            process.pid()
        };
        // Reopened by the same store, and by `Journal::open`, which tells them apart.
        let reopen = |open: Open| open(&dir).unwrap().history().unwrap();
        for history in [reopen(open), reopen(|dir| Journal::open(dir))] {
            assert_eq!(history.len(), 1, "{name}");
            assert_eq!(history[0].pid, pid);
            assert_eq!(history[0].result, wasmproc_tests::normal(Payload::u64(1)));
            let records = &history[0].records;
            assert!(
                records[0].contains("spawn") && records[0].contains("main(\"in\") by the host"),
                "{name}: {records:?}"
            );
            assert!(records[1].contains("1: sleep 5ms → blocked"), "{name}: {records:?}");
            assert!(
                records.last().unwrap().ends_with("exit   normal (8 bytes: 01 00 00 00 00 00 00 00, u64 1)"),
                "{name}: {records:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_journal_is_opened_by_one_host_at_a_time() {
    for (name, open) in disk_stores() {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("journal-locked-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = open(&dir).unwrap();
        let error = Journal::open(&dir).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ResourceBusy, "{name}: {error}");
        assert!(error.to_string().contains("one host at a time"), "{name}: {error}");
        drop(first);
        Journal::open(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A journal holds every input and message of its run: in a directory others can read (a
/// plain `mkdir`, mode 755) it is made private as it opens, the directory 0700 and every
/// file in it 0600, by either store.
#[test]
fn a_journal_others_can_read_is_made_private() {
    use std::os::unix::fs::PermissionsExt as _;
    for (name, open) in disk_stores() {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("journal-readable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        {
            let scheduler = Scheduler::builder().workers(1).journal(open(&dir).unwrap()).build().unwrap();
            let (process, _) = Scripted::new(|t| {
                t.out.set_status(Status::Complete(Ok(Payload::text("a secret"))));
                Ok(())
            });
            scheduler.handle().spawn(process, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
            scheduler.stop(Duration::from_secs(1));
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        drop(Journal::open(&dir).unwrap());
        let mut shared = Vec::new();
        let mut pending = vec![dir.clone()];
        while let Some(path) = pending.pop() {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            }
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                shared.push((path, mode));
            }
        }
        assert_eq!(shared, vec![], "{name}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Counts what reaches the outside world, across a crash: the `effect` command's calls
/// by idempotency key.
#[derive(Default)]
struct World {
    effects: Mutex<Vec<String>>,
}

/// A test store that takes `commits` commits and then holds every later one for ever,
/// as a crash at that moment would leave the disk.
fn crashing_store(commits: usize) -> Arc<TestStore> {
    let store = Arc::new(TestStore::default());
    store.crash_after.store(commits, Ordering::SeqCst);
    store
}

/// The workflow: `main` spawns a monitored `sink`, then a `source` that sends it five
/// numbers (three through its port, two as yields), sleeps, runs `effect`, reads `clock`
/// three times, and ends with the sink's result, the effect's and the count of reads.
fn workflow(store: Arc<TestStore>, world: Arc<World>) -> Scheduler {
    let sink = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        let mut got = Vec::new();
        Ok(Box::new(
            Scripted::new(move |t| {
                for event in &t.events {
                    if let Event::Message { body, .. } = event {
                        got.push(body.to_u64().unwrap());
                    }
                }
                if got.len() == 5 {
                    t.out.set_status(Status::Complete(Payload::json(&got).map_err(|e| e.to_string())));
                } else {
                    t.out.set_status(Status::Idle);
                }
                Ok(())
            })
            .0,
        ))
    };
    let source = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        Ok(Box::new(
            Scripted::new(move |t| {
                if t.step == 0 {
                    let to = wasmproc::Pid::from_u64(t.input[0].to_u64().unwrap());
                    for n in 1..=3 {
                        t.port.send(to, "n", Payload::u64(n))?;
                    }
                    for n in 4..=5 {
                        t.out.yield_command(n, Command::Send { to, topic: "n".into(), body: Payload::u64(n) });
                    }
                    return Ok(());
                }
                t.out.set_status(Status::Complete(Ok(Payload::empty())));
                Ok(())
            })
            .0,
        ))
    };
    let main = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        let mut effect = None;
        let mut exit = None;
        let mut reads = 0;
        Ok(Box::new(
            Scripted::new(move |t| {
                for event in &t.events {
                    match event {
                        Event::Completion { tag: 1, result } => {
                            let pid = result.as_ref().unwrap().to_u64().unwrap();
                            let spawn = wasmproc::SpawnRequest {
                                kind: Some("source".into()),
                                method: "main".into(),
                                input: vec![Payload::u64(pid)],
                                monitor: false,
                                link: false,
                            };
                            t.out.yield_command(2, Command::Spawn(spawn));
                            t.out.yield_command(3, Command::Sleep(Duration::from_millis(30)));
                        }
                        Event::Completion { tag: 3, .. } => {
                            t.out
                                .yield_command(4, Command::Custom { name: "effect".into(), payload: Payload::empty() });
                        }
                        Event::Completion { tag: 4, result } => {
                            effect = Some(result.clone().unwrap());
                            t.out.yield_command(5, Command::Custom { name: "clock".into(), payload: Payload::empty() });
                        }
                        // Reads, which go on before their steps' commits.
                        Event::Completion { tag: 5, .. } => {
                            reads += 1;
                            if reads < 3 {
                                t.out.yield_command(
                                    5,
                                    Command::Custom { name: "clock".into(), payload: Payload::empty() },
                                );
                            }
                        }
                        Event::Exit { reason, .. } => exit = Some(reason.clone().into_result().unwrap()),
                        _ => {}
                    }
                }
                if t.step == 0 {
                    let spawn = wasmproc::SpawnRequest {
                        kind: Some("sink".into()),
                        method: "main".into(),
                        input: vec![],
                        monitor: true,
                        link: false,
                    };
                    t.out.yield_command(1, Command::Spawn(spawn));
                }
                if let (Some(effect), Some(exit), 3) = (&effect, &exit, reads) {
                    let result = format!("{} {} {reads}", exit.as_str().unwrap(), effect.as_str().unwrap());
                    t.out.set_status(Status::Complete(Ok(Payload::text(result))));
                }
                Ok(())
            })
            .0,
        ))
    };
    Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store))
        .capabilities(Capabilities::default().allow("effect").allow("clock"))
        .kind("sink", sink)
        .kind("source", source)
        .kind("main", main)
        .handler("effect", move |request: wasmproc::handler::Request| {
            let key = request.idempotency_key().expect("a durable process's yield has a key");
            world.effects.lock().push(key);
            request.complete(Ok(Payload::text("effect")));
        })
        .handler("clock", ReadOnly(|request: wasmproc::handler::Request| request.complete(Ok(Payload::u64(1)))))
        .build()
        .unwrap()
}

#[test]
fn a_workflow_resumed_after_a_crash_at_every_commit_ends_as_an_uncrashed_one() {
    let expected = "[1,2,3,4,5] effect 3";
    // The uncrashed run, and how many commits it takes.
    let store = Arc::new(TestStore::default());
    let world = Arc::new(World::default());
    let scheduler = workflow(store.clone(), world.clone());
    let root = scheduler.handle().spawn(wasmproc::scheduler::Spawnable::kind("main"), "main").unwrap();
    assert_eq!(root.join_timeout(HANG).unwrap(), Ok(Payload::text(expected)));
    scheduler.stop(Duration::from_secs(1));
    let commits = store.commits.load(Ordering::SeqCst);
    assert!(commits >= 3, "{commits}");

    let mut crashes = 0;
    for crash_at in 1..commits {
        let store = crashing_store(crash_at);
        let world = Arc::new(World::default());
        let scheduler = workflow(store.clone(), world.clone());
        let root = scheduler.handle().spawn(wasmproc::scheduler::Spawnable::kind("main"), "main").unwrap();
        // A crash at the commit that removes the finished run's records finds the result
        // already reported (the committer reports a group before it writes the next).
        if !store.wait_for_crash(|| root.try_result().is_some()) || root.try_result().is_some() {
            assert_eq!(root.try_result().unwrap(), Ok(Payload::text(expected)));
            // The crash point may still be reached after the result, by the commit that
            // removes the run's records: disarm it and let a held commit through, so the
            // stop below (which commits what is pending) cannot wait on it for ever.
            store.disarm();
            scheduler.stop(Duration::from_secs(1));
            continue;
        }
        crashes += 1;
        let effects_before = world.effects.lock().clone();
        // The crashed host's threads wait on the store for ever; only its disk survives.
        std::mem::forget(scheduler);
        drop(root);
        let disk = Arc::new(store.copy());
        let resumed = workflow(disk.clone(), world.clone());
        let roots = resumed.resumed();
        assert_eq!(roots.len(), 1, "crash at commit {crash_at}: the root is resumed");
        let result = roots[0].join_timeout(Duration::from_secs(5)).unwrap_or_else(|| {
            let history = Journal::with_store(disk.clone()).history().unwrap();
            panic!("crash at commit {crash_at}: no result; the journal then: {history:#?}")
        });
        assert_eq!(result, Ok(Payload::text(expected)), "crash at commit {crash_at}");
        let effects = world.effects.lock().clone();
        assert!(!effects.is_empty() && effects.len() <= 2, "crash at commit {crash_at}: effects {effects:?}");
        assert!(effects.iter().all(|key| *key == effects[0]), "one key across retries: {effects:?}");
        assert!(effects.len() == 1 || effects_before.len() == 1, "run again only if in flight: {effects:?}");
        resumed.stop(Duration::from_secs(1));
    }
    assert!(crashes * 2 >= commits - 1, "{crashes} crashes of {} commit points", commits - 1);
}

#[test]
fn a_step_that_differs_on_replay_fails_its_process_naming_the_step() {
    static SECOND_RUN: AtomicBool = AtomicBool::new(false);
    let build = |store: Arc<TestStore>| {
        let kind = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
            Ok(Box::new(
                Scripted::new(|t| {
                    if t.step == 0 {
                        let ms = if SECOND_RUN.load(Ordering::SeqCst) { 20 } else { 10 };
                        t.out.yield_command(1, Command::Sleep(Duration::from_millis(ms)));
                        t.out.yield_command(2, Command::Custom { name: "never".into(), payload: Payload::empty() });
                    }
                    Ok(())
                })
                .0,
            ))
        };
        Scheduler::builder()
            .workers(1)
            .journal(Journal::with_store(store))
            .capabilities(Capabilities::default().allow("never"))
            .handler("never", |request: wasmproc::handler::Request| {
                // Answered never: the process waits for it across the crash.
                std::mem::forget(request.into_parts());
            })
            .kind("drifts", kind)
            .build()
            .unwrap()
    };
    let store = Arc::new(TestStore::default());
    let first = build(store.clone());
    first.handle().spawn(wasmproc::scheduler::Spawnable::kind("drifts"), "main").unwrap();
    // Spawn and first step committed; then the crash.
    while store.commits.load(Ordering::SeqCst) < 2 || Journal::with_store(store.clone()).history().unwrap()[0].steps < 1
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    store.hold();
    std::mem::forget(first);
    SECOND_RUN.store(true, Ordering::SeqCst);
    let resumed = build(Arc::new(store.copy()));
    let roots = resumed.resumed();
    let error = wasmproc_tests::said(roots[0].join_timeout(HANG).unwrap().unwrap_err());
    assert!(error.contains("non-determinism in process") && error.contains("at step record 1"), "{error}");
    assert!(error.contains("Sleep(10ms)") && error.contains("Sleep(20ms)"), "{error}");
    resumed.stop(Duration::from_secs(1));
}

#[test]
fn a_finished_tree_leaves_no_records_by_default() {
    let store = Arc::new(TestStore::default());
    let world = Arc::new(World::default());
    let scheduler = workflow(store.clone(), world);
    let root = scheduler.handle().spawn(wasmproc::scheduler::Spawnable::kind("main"), "main").unwrap();
    assert_eq!(root.join_timeout(HANG).unwrap(), Ok(Payload::text("[1,2,3,4,5] effect 3")));
    // The removal is committed right after the root's exit.
    store.wait_until_no_process_records();
    scheduler.stop(Duration::from_secs(1));
}

/// A pid whose records were removed is never given to another process: not by the
/// scheduler that removed them, nor by one resuming the journal after it, whose journal
/// no longer holds the pid. Others may remember it (the last message number another
/// journal took from it, a workflow's record), and would take the newcomer for it.
#[test]
fn a_pid_whose_records_were_removed_is_never_given_again() {
    let store = Arc::new(TestStore::default());
    let mut removed = Vec::new();
    for _ in 0..3 {
        let (scheduler, _, _) = counting_with(&store, JournalSettings::default());
        let run = scheduler.handle().spawn(effect_once(), "main").unwrap();
        assert_eq!(run.join_timeout(HANG).unwrap(), Ok(Payload::text("done")));
        store.wait_until_no_process_records();
        scheduler.stop(Duration::from_secs(1));
        assert!(!removed.contains(&run.pid()), "{} was given again, after {removed:?}", run.pid());
        removed.push(run.pid());
    }
}

/// A step preempted on replay (a Wasm guest's, on a loaded machine or in an instance
/// made again) goes on, given nothing, until it ends, as its first run's turns did: its
/// record is checked against the whole step, and the process resumes.
#[test]
fn a_step_preempted_on_replay_is_replayed_whole() {
    // Every step is preempted at its first turn and ends at its next, keeping the events
    // it was given; it sleeps, and completes with the first message's body.
    let halting = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        let (mut turns, mut kept) = (0, Vec::new());
        Ok(Box::new(
            Scripted::new(move |t| {
                turns += 1;
                kept.append(&mut t.events);
                if turns % 2 == 1 {
                    t.out.set_preempted();
                    return Ok(());
                }
                match kept.drain(..).find_map(|e| if let Event::Message { body, .. } = e { Some(body) } else { None }) {
                    Some(body) => t.out.set_status(Status::Complete(Ok(body))),
                    None => t.out.yield_command(1, Command::Sleep(Duration::from_secs(3600))),
                }
                Ok(())
            })
            .0,
        ))
    };
    let build = |store: Arc<TestStore>| {
        Scheduler::builder().workers(1).journal(Journal::with_store(store)).kind("halting", halting).build().unwrap()
    };
    let store = Arc::new(TestStore::default());
    let first = build(store.clone());
    let process = first.handle().spawn(wasmproc::scheduler::Spawnable::kind("halting"), "main").unwrap();
    let journal = Journal::with_store(store.clone());
    let deadline = std::time::Instant::now() + HANG;
    while journal.history().unwrap().iter().all(|h| h.pid != process.pid() || h.steps == 0) {
        assert!(std::time::Instant::now() < deadline, "the first step was not recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    let crashed = Arc::new(store.copy());
    first.stop(Duration::from_secs(1));

    let second = build(crashed);
    let resumed = second.resumed();
    assert_eq!(resumed.len(), 1, "the process resumed");
    second.handle().send(process.pid(), "go", Payload::text("after the replay")).unwrap();
    assert_eq!(resumed[0].join_timeout(HANG).unwrap(), Ok(Payload::text("after the replay")));
    second.stop(Duration::from_secs(1));
}

#[test]
fn a_message_from_the_embedder_is_recorded_before_it_is_delivered() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _) = durable(&store);
    let (echo, _) = Scripted::new(|t| {
        match t.events.first() {
            Some(Event::Message { body, .. }) => t.out.set_status(Status::Complete(Ok(body.clone()))),
            _ => t.out.set_status(Status::Idle),
        }
        Ok(())
    });
    let process = scheduler.handle().spawn(echo, "main").unwrap();
    // Let its first step be committed, so it waits idle.
    std::thread::sleep(Duration::from_millis(50));
    store.hold();
    scheduler.handle().send(process.pid(), "in", Payload::u64(9)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(process.try_result(), None, "delivered before it was recorded");
    store.release();
    assert_eq!(process.join_timeout(HANG).unwrap(), Ok(Payload::u64(9)));
    let history = Journal::with_store(store.clone()).history().unwrap();
    let records = &history.iter().find(|h| h.pid == process.pid()).unwrap().records;
    let message = "host   message \"in\" (8 bytes: 09 00 00 00 00 00 00 00, u64 9) from the host";
    assert!(records.iter().any(|r| r.ends_with(message)), "{records:#?}");
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_resumed_process_keeps_its_recorded_grants_narrowed_never_widened() {
    // After its first sleep, it yields `effect` (granted when it was spawned) and `extra`
    // (not), and completes with both answers.
    let kind = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        let mut answers: Vec<String> = Vec::new();
        Ok(Box::new(
            Scripted::new(move |t| {
                match t.step {
                    0 => t.out.yield_command(1, Command::Sleep(Duration::from_millis(1))),
                    1 => {
                        for (tag, name) in [(2, "effect"), (3, "extra")] {
                            t.out.yield_command(tag, Command::Custom { name: name.into(), payload: Payload::empty() });
                        }
                    }
                    _ => {}
                }
                for tag in [2, 3] {
                    if let Some(result) = t.events.iter().find_map(|e| wasmproc_tests::completion(e, tag)) {
                        let answer = match result {
                            Ok(payload) => String::from_utf8_lossy(&payload.data).into_owned(),
                            Err(error) => error.clone(),
                        };
                        answers.push(format!("{tag}: {answer}"));
                    }
                }
                if answers.len() == 2 {
                    answers.sort();
                    t.out.set_status(Status::Complete(Ok(Payload::text(answers.join("; ")))));
                }
                Ok(())
            })
            .0,
        ))
    };
    let build = |store: Arc<TestStore>, grants: Capabilities, resume_within: Option<Capabilities>| {
        let mut builder = Scheduler::builder()
            .workers(1)
            .journal(Journal::with_store(store))
            .capabilities(grants)
            .handler("effect", |request: wasmproc::handler::Request| request.complete(Ok(Payload::text("done"))))
            .handler("extra", |request: wasmproc::handler::Request| request.complete(Ok(Payload::text("done"))))
            .kind("asks", kind);
        if let Some(bound) = resume_within {
            builder = builder.resume_within(bound);
        }
        builder.build().unwrap()
    };
    // The spawn is committed, then the crash: the process is spawned with `effect` only.
    let store = Arc::new(TestStore::default());
    store.crash_after.store(1, Ordering::SeqCst);
    let first = build(store.clone(), Capabilities::default().allow("effect"), None);
    first.handle().spawn(wasmproc::scheduler::Spawnable::kind("asks"), "main").unwrap();
    assert!(store.wait_for_crash(|| false));
    let crashed = store.copy();
    store.disarm();
    first.stop(Duration::from_secs(1));
    let resume = |bound: Option<Capabilities>| {
        // A host that grants both to what it spawns now.
        let scheduler = build(Arc::new(crashed.copy()), Capabilities::default().allow("effect").allow("extra"), bound);
        let roots = scheduler.resumed();
        let result = roots[0].join_timeout(HANG).unwrap();
        scheduler.stop(Duration::from_secs(1));
        result
    };
    // As recorded: `effect` granted, `extra` not, whatever the host grants now.
    let recorded = resume(None).unwrap();
    assert_eq!(recorded, Payload::text("2: done; 3: permission denied: extra"));
    // Narrowed to a bound without `effect`; `extra` in the bound is not added.
    let narrowed = resume(Some(Capabilities::default().allow("extra"))).unwrap();
    assert_eq!(narrowed, Payload::text("2: permission denied: effect; 3: permission denied: extra"));
}

#[test]
fn runs_lists_each_run_a_journal_holds_and_forget_run_drops_one_finished_or_not() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _) = durable(&store);
    let options = SpawnOptions::new("main").input(vec![Payload::u64(1)]);
    let finished = scheduler.handle().spawn(effect_once(), options).unwrap();
    assert_eq!(finished.join_timeout(HANG).unwrap(), Ok(Payload::text("done")));
    let (waits, probe) = Scripted::new(|t| {
        t.out.yield_command(1, Command::Sleep(Duration::from_secs(3600)));
        Ok(())
    });
    let waiting = scheduler.handle().spawn(waits, SpawnOptions::new("main").input(vec![Payload::u64(2)])).unwrap();
    let deadline = std::time::Instant::now() + HANG;
    let journal = Journal::with_store(store.clone());
    while probe.steps() == 0 || journal.history().unwrap().iter().all(|h| h.pid != waiting.pid() || h.steps == 0) {
        assert!(std::time::Instant::now() < deadline, "the waiting process's step was not recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    let runs = journal.runs().unwrap();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let (done, unfinished) = (&runs[0], &runs[1]);
    assert_eq!((done.root, done.method.as_str(), &done.input[..]), (finished.pid(), "main", &[Payload::u64(1)][..]));
    assert_eq!(done.result, wasmproc_tests::normal(Payload::text("done")));
    assert_eq!((done.processes(), done.records()), (1, 4), "spawn, two steps, exit");
    assert_eq!(
        (unfinished.root, &unfinished.input[..], unfinished.result.clone()),
        (waiting.pid(), &[Payload::u64(2)][..], None)
    );
    assert_eq!(unfinished.caps, Capabilities::default().allow("effect").allow("peek"));
    scheduler.stop(Duration::from_secs(1));
    journal.forget_run(unfinished).unwrap();
    let left: Vec<_> = journal.runs().unwrap().iter().map(|run| run.root).collect();
    assert_eq!(left, [finished.pid()]);
    journal.forget_run(done).unwrap();
    assert_eq!(store.process_records(), 0, "every process's records are gone");
}

/// A durable Wasm process's log lines: those of the steps replayed on resume reach the
/// sink marked `replayed` (they were logged when the steps first ran), those of the steps
/// that run anew do not.
#[test]
fn the_log_lines_of_replayed_steps_reach_the_sink_marked_replayed() {
    use wasmproc::wasm::{Config, LogRecord, LogSource, Runtime};
    let lines: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let kept = lines.clone();
    let config = Config::default().cache_dir(env!("CARGO_TARGET_TMPDIR")).log_sink(move |r: &LogRecord<'_>| {
        if let LogSource::Log(_) = r.source {
            kept.lock().push((r.message.to_owned(), r.replayed));
        }
    });
    let component = Runtime::new(config).unwrap().load(env!("GUEST_DURABLE")).unwrap();
    let build = |store: Arc<TestStore>| {
        Scheduler::builder()
            .workers(2)
            .journal(Journal::with_store(store).settings(keep_finished()))
            .kind("durable", component.clone())
            .build()
            .unwrap()
    };
    let logged = |line: &str| lines.lock().iter().any(|(message, _)| message == line);
    // One worker, three rounds. Round 2 begins once round 1's message was delivered,
    // which its step's commit came before: round 1 is in the journal then.
    let options = SpawnOptions::new("main").input(vec![Payload::json(&(1, 3)).unwrap()]);
    let store = Arc::new(TestStore::default());
    let first = build(store.clone());
    first.handle().spawn(wasmproc::scheduler::Spawnable::kind("durable"), options).unwrap();
    let deadline = std::time::Instant::now() + HANG;
    while !logged("round 2 of 3") {
        assert!(std::time::Instant::now() < deadline, "round 2 was not logged: {:?}", lines.lock());
        std::thread::sleep(Duration::from_millis(1));
    }
    store.hold();
    let crashed = Arc::new(store.copy());
    store.release();
    first.stop(Duration::from_secs(1));
    lines.lock().clear();
    let resumed = build(crashed);
    let roots = resumed.resumed();
    // One worker: 1 + 4 + 9 answered, and 3 answers.
    assert_eq!(roots[0].join_timeout(HANG).unwrap(), Ok(Payload::json(&17).unwrap()));
    resumed.stop(Duration::from_secs(1));
    let lines = lines.lock().clone();
    assert!(lines.contains(&("round 1 of 3".to_owned(), true)), "{lines:?}");
    assert!(lines.contains(&("round 3 of 3".to_owned(), false)), "{lines:?}");
    assert!(!lines.contains(&("round 1 of 3".to_owned(), false)), "{lines:?}");
}

#[test]
fn a_terminated_process_has_its_exit_recorded_with_the_reason_its_watchers_get() {
    let store = Arc::new(TestStore::default());
    let (scheduler, _) = durable(&store);
    let (idle, probe) = Scripted::new(|t| {
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let process = scheduler.handle().spawn(idle, "main").unwrap();
    let deadline = std::time::Instant::now() + HANG;
    while probe.steps() == 0 {
        assert!(std::time::Instant::now() < deadline, "it never stepped");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(scheduler.handle().terminate_all(wasmproc::ExitReason::Killed), 1);
    assert_eq!(process.join_timeout(HANG), Some(Err(wasmproc::ExitReason::Killed)));
    let history = Journal::with_store(store.clone()).history().unwrap();
    let killed = Some(wasmproc::Exited::new(wasmproc::ExitReason::Killed));
    assert_eq!(history[0].result, killed, "{:#?}", history[0].records);
    scheduler.stop(Duration::from_secs(1));
}

/// A sleep shorter than a microsecond (or not a whole number of them) is recorded in
/// whole microseconds; a replay of the step compares it at that precision, so the
/// process resumes instead of failing as non-deterministic.
#[test]
fn a_sleep_of_a_fraction_of_a_microsecond_replays() {
    let store = Arc::new(MemoryStore::new());
    let kind = || {
        let (process, _) = Scripted::new(|t| {
            match t.step {
                0 => t.out.yield_command(1, Command::Sleep(Duration::from_nanos(1_500))),
                _ => t.out.set_status(Status::Idle),
            }
            Ok(())
        });
        Ok(Box::new(process) as Box<dyn wasmproc::Process>)
    };
    let first = Scheduler::builder()
        .workers(1)
        .journal(Journal::with_store(store.clone()))
        .kind("sleeper", kind)
        .build()
        .unwrap();
    first.handle().spawn(wasmproc::scheduler::Spawnable::kind("sleeper"), "main").unwrap();
    let slept = || Journal::with_store(store.clone()).history().unwrap().first().is_some_and(|h| h.steps >= 2);
    let begun = std::time::Instant::now();
    while !slept() {
        assert!(begun.elapsed() < wasmproc_tests::HANG, "the sleeper never slept");
        std::thread::sleep(Duration::from_millis(5));
    }
    first.stop(Duration::from_secs(1));
    let verdicts =
        Scheduler::builder().journal(Journal::with_store(store)).kind("sleeper", kind).verify_journal().unwrap();
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert!(matches!(verdicts[0].1, Ok(steps) if steps >= 2), "{verdicts:?}");
}
