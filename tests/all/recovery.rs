//! Recovery at the commit points a group commit rarely separates.

use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    assert_eq!(finished[0].result, Ok(Payload::text("done")), "its exit is recorded now");
}
