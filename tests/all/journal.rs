use std::collections::BTreeMap;
use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use wasmproc::journal::{Batch, Durability, Journal, JournalSettings, Key, Store};
use wasmproc::scheduler::SpawnOptions;
use wasmproc::{Capabilities, Command, Event, Payload, Scheduler, Status};
use wasmproc_tests::Scripted;

const HANG: Duration = Duration::from_secs(20);

/// A store in memory that can hold every commit until let go, or fail them all.
#[derive(Default)]
struct TestStore {
    records: Mutex<BTreeMap<Key, Vec<u8>>>,
    held: Mutex<bool>,
    released: Condvar,
    fail: AtomicBool,
    commits: AtomicUsize,
}

impl TestStore {
    fn hold(&self) {
        *self.held.lock() = true;
    }

    fn release(&self) {
        *self.held.lock() = false;
        self.released.notify_all();
    }
}

impl Store for TestStore {
    fn commit(&self, batch: &Batch, _sync: bool) -> io::Result<()> {
        let mut held = self.held.lock();
        while *held {
            self.released.wait(&mut held);
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected sync failure"));
        }
        self.commits.fetch_add(1, Ordering::SeqCst);
        let mut records = self.records.lock();
        records.retain(|key, _| !batch.removals.contains(&key.process));
        records.extend(batch.puts.iter().cloned());
        Ok(())
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        for (key, value) in self.records.lock().range(from..) {
            if visit(*key, value).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// A scheduler on `store` with a custom command `effect` that counts its calls.
fn durable(store: &Arc<TestStore>) -> (Scheduler, Arc<AtomicUsize>) {
    let effects = Arc::new(AtomicUsize::new(0));
    let counted = effects.clone();
    let scheduler = Scheduler::builder()
        .workers(2)
        .journal(Journal::with_store(store.clone()))
        .capabilities(Capabilities::default().allow("effect"))
        .handler("effect", move |request: wasmproc::handler::Request| {
            counted.fetch_add(1, Ordering::SeqCst);
            request.complete(Ok(Payload::text("done")));
        })
        .build()
        .unwrap();
    (scheduler, effects)
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
    assert_eq!(process.result, Some(Ok(Payload::text("done"))));
    assert_eq!(process.records.len(), 4, "spawn, two steps, exit: {:#?}", process.records);
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
    assert!(sent.records.iter().any(|r| r.contains("sends: [(") && r.contains("\"hello\"")), "{:#?}", sent.records);
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn a_failed_sync_runs_no_effect_ends_the_process_and_refuses_later_spawns() {
    let store = Arc::new(TestStore::default());
    let (scheduler, effects) = durable(&store);
    store.fail.store(true, Ordering::SeqCst);
    let process = scheduler.handle().spawn(effect_once(), "main").unwrap();
    let result = process.join_timeout(HANG).unwrap();
    let error = result.unwrap_err();
    assert!(error.contains("journal failed: injected sync failure"), "{error}");
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    let refused = scheduler.handle().spawn(effect_once(), "main").unwrap_err();
    assert!(refused.to_string().contains("injected sync failure"), "{refused}");
    assert_eq!(store.commits.load(Ordering::SeqCst), 0);
    scheduler.stop(Duration::from_secs(1));
}

#[test]
fn the_default_store_keeps_the_history_across_a_reopen() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pid = {
        let mut settings = JournalSettings::default();
        settings.durability = Durability::Sync;
        let journal = Journal::open(&dir).unwrap().settings(settings);
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
        assert!(stats.records >= 4 && stats.commits >= 1, "{stats:?}");
        scheduler.stop(Duration::from_secs(1));
        process.pid()
    };
    let history = Journal::open(&dir).unwrap().history().unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].pid, pid);
    assert_eq!(history[0].result, Some(Ok(Payload::u64(1))));
    assert!(history[0].records[0].contains("Text") || history[0].records[0].contains("in"), "{:?}", history[0].records);
    assert!(history[0].records[1].contains("Sleep(5ms)"), "{:?}", history[0].records);
    std::fs::remove_dir_all(&dir).unwrap();
}
