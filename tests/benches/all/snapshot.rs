//! Snapshots in the journal: how long a host takes to resume a workflow of 1,000,000
//! steps (100,000 when quick) whose journal holds a snapshot every 1,000 steps, against
//! the same workflow whose journal holds every step (its limit of records raised for
//! it). Both on this machine's disk ([`LogStore`], through `Journal::open`), written
//! buffered: what is measured is the resume, from opening the journal to the process
//! resumed, not the writing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use wasmproc::journal::{Durability, Journal, JournalSettings};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::{Events, Payload, Port, Process, Scheduler, Status, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report};

/// Steps between two snapshots.
const EVERY: u64 = 1_000;

/// A workflow that counts its steps (`Continue`) up to its input, then waits for a
/// message and completes with its count; its snapshot is the count.
struct Counter {
    target: u64,
    steps: u64,
    reached: Arc<AtomicU64>,
}

impl Process for Counter {
    fn init(&mut self, _: Port, _: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.target = input.first().and_then(Payload::to_u64).unwrap_or(0);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        self.steps += 1;
        self.reached.store(self.steps, Ordering::Relaxed);
        if events.count() > 0 {
            out.complete(Ok(Payload::u64(self.steps)));
        } else if self.steps < self.target {
            out.set_status(Status::Continue);
        } else {
            out.set_status(Status::Idle);
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Option<Vec<u8>> {
        Some([self.target.to_le_bytes(), self.steps.to_le_bytes()].concat())
    }

    fn restore(&mut self, _: Port, state: &[u8]) -> anyhow::Result<()> {
        anyhow::ensure!(state.len() == 16, "a counter's snapshot is 16 bytes, not {}", state.len());
        self.target = u64::from_le_bytes(state[..8].try_into()?);
        self.steps = u64::from_le_bytes(state[8..].try_into()?);
        Ok(())
    }
}

fn scheduler(journal: Journal, every: Option<u64>, reached: &Arc<AtomicU64>) -> Scheduler {
    let mut settings = JournalSettings::default();
    settings.durability = Durability::Buffered;
    settings.max_records_per_process = 2_000_000;
    let journal = journal.settings(settings);
    let reached = reached.clone();
    let make = move || -> anyhow::Result<Box<dyn Process>> {
        Ok(Box::new(Counter { target: 0, steps: 0, reached: reached.clone() }))
    };
    Scheduler::builder()
        .workers(1)
        .journal(journal)
        .snapshot_every(every)
        .suspend_after(None)
        .kind("counter", make)
        .build()
        .expect("the scheduler starts")
}

/// Writes a journal of a workflow of `steps` steps (snapshots every `every`), then
/// resumes it: the seconds from opening the journal to the workflow resumed.
fn resume(name: &str, steps: u64, every: Option<u64>) -> f64 {
    let dir = crate::target_dir().join("bench").join(format!("journal-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    let reached = Arc::new(AtomicU64::new(0));
    let first = scheduler(Journal::open(&dir).expect("the journal opens"), every, &reached);
    let options = SpawnOptions::new("main").input(vec![Payload::u64(steps)]);
    let pid = first.handle().spawn(Spawnable::kind("counter"), options).expect("starts").pid();
    while reached.load(Ordering::Relaxed) < steps {
        std::thread::sleep(Duration::from_millis(5));
    }
    // A durable scheduler's stop suspends: the workflow stays in the journal.
    first.stop(Duration::from_secs(10));
    drop(first);
    let start = Instant::now();
    let opened = Journal::open(&dir).expect("the journal opens");
    let open = start.elapsed();
    let second = scheduler(opened, every, &reached);
    let resumed = second.resumed();
    let elapsed = start.elapsed();
    println!(
        "  {name}: the journal opened in {:.1} ms, the workflow resumed {:.1} ms later",
        open.as_secs_f64() * 1e3,
        (elapsed - open).as_secs_f64() * 1e3
    );
    assert_eq!(resumed.len(), 1, "the workflow is resumed");
    second.handle().send(pid, "report", Payload::empty()).expect("it is there");
    assert_eq!(resumed[0].join(), Ok(Payload::u64(steps + 1)), "with every step it took");
    second.stop(Duration::ZERO);
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
    elapsed.as_secs_f64()
}

pub fn run(options: &Options, report: &mut Report) {
    let name = "durable/resume-1m-steps-snapshot";
    if !options.selected(name) {
        return;
    }
    let steps = if options.quick { 100_000 } else { 1_000_000 };
    let snapshot = resume("snapshot", steps, Some(EVERY));
    let whole = resume("whole", steps, None);
    println!(
        "  a workflow of {steps} steps resumed in {:.1} ms from its snapshot, {:.1} ms from every step",
        snapshot * 1e3,
        whole * 1e3
    );
    report.push(
        Record::single(name, "ms", snapshot * 1e3)
            .with_baseline(whole * 1e3, snapshot / whole)
            .goal(Condition::median_at_most(50.0)),
    );
}
