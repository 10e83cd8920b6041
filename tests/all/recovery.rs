//! Recovery at the commit points a group commit rarely separates.

use std::io;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use wasmproc::handler::{Factory, KindLimits};
use wasmproc::journal::{Batch, Journal, JournalSettings, Key, MemoryStore, Store};
use wasmproc::scheduler::Spawnable;
use wasmproc::{Payload, Scheduler, Status};
use wasmproc_tests::{HANG, Scripted};

/// The second byte of a record is its kind (after the format version); 3 is an exit.
const EXIT: u8 = 3;

/// A store in memory that, while `drop_exits` is set, drops every exit record it is
/// given: the host dying after a process's last step was committed and before its exit
/// was.
#[derive(Default)]
struct LosesExits {
    records: MemoryStore,
    drop_exits: AtomicBool,
}

impl Store for LosesExits {
    fn commit(&self, batch: &Batch, sync: bool) -> io::Result<()> {
        let mut kept = Batch { puts: batch.puts.clone(), removals: batch.removals.clone() };
        if self.drop_exits.load(Ordering::SeqCst) {
            kept.puts.retain(|(_, value)| value.get(1) != Some(&EXIT));
        }
        self.records.commit(&kept, sync)
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        self.records.scan(from, visit)
    }
}

/// A process that completes at its second step, and fails if it is ever stepped again.
fn two_steps() -> anyhow::Result<Box<dyn wasmproc::Process>> {
    let (p, _) = Scripted::new(|t| {
        match t.step {
            0 => t.out.set_status(Status::Continue),
            1 => t.out.complete(Ok(Payload::text("done"))),
            _ => t.out.complete(Err("stepped past its end".to_owned())),
        }
        Ok(())
    });
    Ok(Box::new(p))
}

/// A durable scheduler on `store` that keeps finished processes' records (as the
/// command line does until it has reported the result).
fn scheduler(store: &Arc<LosesExits>) -> Scheduler {
    let mut settings = JournalSettings::default();
    settings.keep_finished = true;
    let journal = Journal::with_store(store.clone()).settings(settings);
    Scheduler::builder().workers(1).journal(journal).kind("two", two_steps).build().unwrap()
}

/// A process whose completing step was committed but whose exit was not ends, on the
/// next start, with the result its replay gives, and is not stepped past its end.
#[test]
fn a_process_whose_exit_was_lost_ends_with_its_result_on_resume() {
    let store = Arc::new(LosesExits::default());
    store.drop_exits.store(true, Ordering::SeqCst);
    let first = scheduler(&store);
    let process = first.handle().spawn(Spawnable::kind("two"), "main").unwrap();
    assert_eq!(process.join_timeout(HANG).unwrap(), Ok(Payload::text("done")));
    first.stop(HANG);
    drop(first);

    store.drop_exits.store(false, Ordering::SeqCst);
    let second = scheduler(&store);
    let resumed = second.resumed();
    assert_eq!(resumed.len(), 1, "the process has no exit recorded, so it resumes");
    assert_eq!(resumed[0].join_timeout(HANG).unwrap(), Ok(Payload::text("done")));
    second.stop(HANG);
    let finished = Journal::with_store(store.clone()).finished_runs().unwrap();
    assert_eq!(finished.len(), 1);
    assert_eq!(
        Some(finished[0].result.clone()),
        wasmproc_tests::normal(Payload::text("done")),
        "its exit is recorded now"
    );
}

/// A kind of native processes that reports an 8 MiB memory cap: what a process of it
/// spawns runs under that cap at most.
struct Capped(fn() -> Scripted);

const CAP: usize = 8 << 20;

impl wasmproc::handler::Factory for Capped {
    fn make(&self) -> anyhow::Result<Box<dyn wasmproc::Process>> {
        Ok(Box::new((self.0)()))
    }

    fn limits(&self) -> Option<wasmproc::handler::KindLimits> {
        Some(wasmproc::handler::KindLimits::new(CAP, std::time::Duration::from_millis(10)))
    }

    fn make_within(&self, _: wasmproc::handler::KindLimits) -> anyhow::Result<Box<dyn wasmproc::Process>> {
        self.make()
    }
}

/// A tree resumes no looser than it ran: a native `relay`, spawned by a root whose kind
/// caps memory at 8 MiB, is restored from the journal under that cap, so the memory bomb
/// it spawns after the resume (of a kind whose own cap is 64 MiB) is stopped at 8 MiB.
#[test]
fn a_restored_child_runs_under_its_restored_parents_limits() {
    static RELAY: Mutex<Option<u64>> = Mutex::new(None);
    static BOMB: Mutex<Option<String>> = Mutex::new(None);
    fn root() -> Scripted {
        Scripted::new(|t| {
            if t.step == 0 {
                let relay =
                    wasmproc::SpawnRequest { kind: Some("relay".into()), method: "main".into(), ..Default::default() };
                t.out.yield_command(0, wasmproc::Command::Spawn(relay));
            } else if let Some(Ok(pid)) = t.events.iter().find_map(|e| wasmproc_tests::completion(e, 0)) {
                *RELAY.lock().unwrap() = pid.to_u64();
            }
            t.out.set_status(Status::Idle);
            Ok(())
        })
        .0
    }
    fn relay() -> Scripted {
        Scripted::new(|t| {
            for event in &t.events {
                match event {
                    wasmproc::Event::Message { .. } => {
                        let bomb = wasmproc::SpawnRequest {
                            kind: Some("hostile".into()),
                            method: "memory-bomb".into(),
                            monitor: true,
                            ..Default::default()
                        };
                        t.out.yield_command(1, wasmproc::Command::Spawn(bomb));
                    }
                    wasmproc::Event::Exit { reason, .. } if !reason.is_normal() => {
                        *BOMB.lock().unwrap() = Some(wasmproc_tests::said(reason.clone()))
                    }
                    _ => {}
                }
            }
            t.out.set_status(Status::Idle);
            Ok(())
        })
        .0
    }
    let store = Arc::new(MemoryStore::default());
    let runtime = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).unwrap();
    let hostile = runtime.load(wasmproc_tests::guests::HOSTILE).unwrap();
    let start = || {
        Scheduler::builder()
            .workers(1)
            .journal(Journal::with_store(store.clone()))
            .kind("root", Capped(root))
            .kind("relay", || Ok(Box::new(relay()) as Box<dyn wasmproc::Process>))
            .kind("hostile", hostile.clone())
            .build()
            .unwrap()
    };
    let first = start();
    first.handle().spawn(Spawnable::kind("root"), "main").unwrap();
    let deadline = std::time::Instant::now() + HANG;
    let relay = loop {
        if let Some(pid) = *RELAY.lock().unwrap() {
            break wasmproc::Pid::from_u64(pid);
        }
        assert!(std::time::Instant::now() < deadline, "the root spawned no relay");
        std::thread::yield_now();
    };
    // A durable scheduler's stop suspends its processes, to resume on the next start.
    first.stop(std::time::Duration::from_secs(1));

    let second = start();
    second.handle().send(relay, "go", Payload::empty()).expect("the relay was restored");
    let error = loop {
        if let Some(error) = BOMB.lock().unwrap().clone() {
            break error;
        }
        assert!(std::time::Instant::now() < deadline, "the bomb's exit never reached the relay");
        std::thread::yield_now();
    };
    assert!(error.contains(&format!("past its `max_memory` of {CAP} bytes")), "{error}");
}

/// A kind without limits of its own that notes the memory cap each of its processes is
/// made within (`None`: made without a bound); its processes note that they stepped,
/// then wait.
struct Noting {
    made_within: &'static Mutex<Vec<Option<usize>>>,
    stepped: &'static AtomicBool,
}

impl Noting {
    fn made(&self, cap: Option<usize>) -> anyhow::Result<Box<dyn wasmproc::Process>> {
        self.made_within.lock().unwrap().push(cap);
        let stepped = self.stepped;
        let (process, _) = Scripted::new(move |t| {
            stepped.store(true, Ordering::SeqCst);
            t.out.set_status(Status::Idle);
            Ok(())
        });
        Ok(Box::new(process))
    }

    /// Waits until a process of the kind has stepped: its spawn was recorded before that.
    fn wait_for_a_step(&self) {
        let deadline = std::time::Instant::now() + HANG;
        while !self.stepped.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "no process of the kind stepped");
            std::thread::yield_now();
        }
    }
}

impl Factory for Noting {
    fn make(&self) -> anyhow::Result<Box<dyn wasmproc::Process>> {
        self.made(None)
    }

    fn make_within(&self, bound: KindLimits) -> anyhow::Result<Box<dyn wasmproc::Process>> {
        self.made(Some(bound.max_memory))
    }
}

/// A root of the 8 MiB kind that spawns a `child`; with `ends`, it ends once the spawn
/// completes, otherwise it waits.
fn spawns_a_child(ends: bool) -> Scripted {
    Scripted::new(move |t| {
        if t.step == 0 {
            let child =
                wasmproc::SpawnRequest { kind: Some("child".into()), method: "main".into(), ..Default::default() };
            t.out.yield_command(0, wasmproc::Command::Spawn(child));
            t.out.set_status(Status::Blocked);
        } else if ends {
            t.out.complete(Ok(Payload::empty()));
        } else {
            t.out.set_status(Status::Idle);
        }
        Ok(())
    })
    .0
}

/// A durable scheduler on `store` with a `root` kind capped at 8 MiB and a `child` kind.
fn capped_tree(store: &Arc<MemoryStore>, root: fn() -> Scripted, child: Noting) -> wasmproc::scheduler::Builder {
    Scheduler::builder()
        .workers(1)
        .journal(Journal::with_store(store.clone()))
        .kind("root", Capped(root))
        .kind("child", child)
}

/// Runs the tree on `store` until its child has stepped, with `ends` until its root has
/// ended too, and stops it; checks that the child was spawned within the root's cap, and
/// forgets the caps noted so far.
fn run_until_the_child_stepped(store: &Arc<MemoryStore>, ends: bool, child: impl Fn() -> Noting) {
    let root: fn() -> Scripted = if ends { || spawns_a_child(true) } else { || spawns_a_child(false) };
    let first = capped_tree(store, root, child()).build().unwrap();
    let root = first.handle().spawn(Spawnable::kind("root"), "main").unwrap();
    if ends {
        assert_eq!(root.join_timeout(HANG).unwrap(), Ok(Payload::empty()));
    }
    child().wait_for_a_step();
    first.stop(std::time::Duration::from_secs(1));
    drop(first);
    let made_within = child().made_within;
    assert_eq!(*made_within.lock().unwrap(), [Some(CAP)], "spawned within the root's cap");
    made_within.lock().unwrap().clear();
}

/// `journal verify` replays a process under the limits a resume makes it under: a child
/// of a kind without limits, spawned by a root whose kind caps memory at 8 MiB, is made
/// within that cap by the verification too.
#[test]
fn verification_makes_a_child_under_its_parents_limits() {
    static MADE_WITHIN: Mutex<Vec<Option<usize>>> = Mutex::new(Vec::new());
    static STEPPED: AtomicBool = AtomicBool::new(false);
    let child = || Noting { made_within: &MADE_WITHIN, stepped: &STEPPED };
    let store = Arc::new(MemoryStore::default());
    run_until_the_child_stepped(&store, false, child);
    let verdicts = capped_tree(&store, || spawns_a_child(false), child()).verify_journal().unwrap();
    assert_eq!(verdicts.len(), 2, "{verdicts:?}");
    assert!(verdicts.iter().all(|(_, verdict)| verdict.is_ok()), "{verdicts:?}");
    assert_eq!(*MADE_WITHIN.lock().unwrap(), [Some(CAP)], "verified within the root's cap too");
}

/// A child outlives its parent and still resumes under the parent's limits: they come
/// from the recorded spawns, not from a parent restored beside it.
#[test]
fn a_child_resumes_under_the_limits_of_a_parent_that_has_ended() {
    static MADE_WITHIN: Mutex<Vec<Option<usize>>> = Mutex::new(Vec::new());
    static STEPPED: AtomicBool = AtomicBool::new(false);
    let child = || Noting { made_within: &MADE_WITHIN, stepped: &STEPPED };
    let store = Arc::new(MemoryStore::default());
    run_until_the_child_stepped(&store, true, child);
    let second = capped_tree(&store, || spawns_a_child(true), child()).build().unwrap();
    assert_eq!(*MADE_WITHIN.lock().unwrap(), [Some(CAP)], "resumed within the ended root's cap");
    second.stop(std::time::Duration::from_secs(1));
}
