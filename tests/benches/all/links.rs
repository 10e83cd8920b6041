//! Links, with native processes: what a link costs a spawn, and how fast a failure
//! crosses a ring of linked processes.
//!
//! - `links/spawn-link-100k`: a parent spawns 100,000 children that end at once, and
//!   counts their exits. wasmproc with `link` (the parent traps exits and counts the
//!   linked exit events) against the same with `monitor` (the exit events of monitors),
//!   in the same run: what linking costs over monitoring. Goal: at most 1.1×.
//! - `links/ring-100k`: Erlang's ring of linked processes: each spawns the next linked,
//!   the last links to the first and fails, and the failure ends every process through
//!   the links. The time from the last one's failure until every process has ended (no
//!   baseline).
//!
//! Quick mode divides the counts by 10.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::{Command, Event, Events, Payload, Pid, Port, Process, Scheduler, SpawnRequest, Status, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, measure, measure_pair};

use crate::{WARMUP, short};

/// Measures the selected workloads into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let scale = if options.quick { 10 } else { 1 };
    let (children, ring) = (100_000 / scale, 100_000 / scale);
    let spawn_name = format!("links/spawn-link-{}", short(children));
    let ring_name = format!("links/ring-{}", short(ring));
    if !options.selected(&spawn_name) && !options.selected(&ring_name) {
        return;
    }
    let scheduler = Scheduler::builder()
        .workers(options.workers)
        .kind("child", || Ok(Box::new(EndsAtOnce) as Box<dyn Process>))
        .kind("ring", || Ok(Box::new(RingMember::default()) as Box<dyn Process>))
        .max_children(children as usize)
        .max_links(children as usize)
        .max_descendants(2 * ring as usize)
        .build()
        .expect("the scheduler starts");
    if options.selected(&spawn_name) {
        let (linked, monitored) =
            measure_pair(options.runs, WARMUP, &mut || fan_out(&scheduler, children, true), &mut || {
                fan_out(&scheduler, children, false)
            });
        report.push(Record::time(&spawn_name, &linked, Some(&monitored)).goal(Condition::ratio_at_most(1.1)));
    }
    if options.selected(&ring_name) {
        let sample = measure(options.runs, WARMUP, &mut || collapse(&scheduler, ring));
        report.push(Record::time(&ring_name, &sample, None));
    }
    scheduler.stop(Duration::from_secs(1));
}

/// Ends at its first step.
struct EndsAtOnce;

impl Process for EndsAtOnce {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.complete(Ok(Payload::empty()));
        Ok(())
    }
}

/// Spawns `children` (its input) children of kind `child`, linked (trapping exits) or
/// monitored, a step's worth at a time, and ends once every exit has arrived.
struct FanOut {
    children: u64,
    link: bool,
    spawned: u64,
    exits: u64,
}

/// Spawns a step yields at most: below the default limit of 1,024 commands.
const SPAWNS_A_STEP: u64 = 1000;

impl Process for FanOut {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if self.link && self.spawned == 0 {
            out.yield_command(u64::MAX, Command::TrapExits(true));
        }
        let mut spawned_now = 0;
        for event in events {
            match event {
                Event::Exit { .. } => self.exits += 1,
                Event::Completion { result: Err(error), .. } => anyhow::bail!("a command failed: {error}"),
                Event::Completion { .. } => spawned_now += 1,
                _ => {}
            }
        }
        if self.exits == self.children {
            out.complete(Ok(Payload::empty()));
            return Ok(());
        }
        // The first batch at once, the next ones as spawns complete.
        if self.spawned < self.children && (self.spawned == 0 || spawned_now > 0) {
            let batch = SPAWNS_A_STEP.min(self.children - self.spawned);
            for i in 0..batch {
                let request = SpawnRequest {
                    kind: Some("child".into()),
                    method: "main".into(),
                    input: Vec::new(),
                    monitor: !self.link,
                    link: self.link,
                };
                out.yield_command(self.spawned + i, Command::Spawn(request));
            }
            self.spawned += batch;
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

fn fan_out(s: &Scheduler, children: u64, link: bool) -> Duration {
    let start = Instant::now();
    let parent = s.handle().spawn(FanOut { children, link, spawned: 0, exits: 0 }, "main").expect("spawns");
    parent.join().expect("the fan-out ends");
    start.elapsed()
}

/// When the ring's last member failed, in nanoseconds since [`epoch`].
static FAILED_AT: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A member of the ring: its input is how many members come after it and the first
/// member's pid. It spawns the next linked; the last links to the first and fails.
#[derive(Default)]
struct RingMember {
    after: u64,
    first: Option<Pid>,
    started: bool,
}

impl Process for RingMember {
    fn init(&mut self, port: Port, _: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.after = input.first().and_then(Payload::to_u64).ok_or_else(|| anyhow::anyhow!("a count"))?;
        self.first = Some(input.get(1).and_then(Payload::to_u64).map_or(port.pid(), Pid::from_u64));
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let first = self.first.expect("set at init");
        if std::mem::replace(&mut self.started, true) {
            for event in events {
                if let Event::Completion { tag: 1, .. } = event {
                    FAILED_AT.store(epoch().elapsed().as_nanos() as u64, Ordering::SeqCst);
                    out.complete(Err("the ring breaks".into()));
                    return Ok(());
                }
            }
        } else if self.after == 0 {
            out.yield_command(1, Command::Link(first));
        } else {
            let input = vec![Payload::u64(self.after - 1), Payload::u64(first.as_u64())];
            let request = SpawnRequest { kind: None, method: "main".into(), input, monitor: false, link: true };
            out.yield_command(0, Command::Spawn(request));
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// Builds a ring of `members` and returns the time from its break to the end of all.
fn collapse(s: &Scheduler, members: u64) -> Duration {
    let first = s
        .handle()
        .spawn(Spawnable::kind("ring"), SpawnOptions::new("main").input(vec![Payload::u64(members - 1)]))
        .expect("spawns");
    let exited = first.wait();
    assert_eq!(exited.reason, wasmproc::ExitReason::Error("the ring breaks".into()));
    assert!(s.handle().wait_idle(Some(Duration::from_secs(600))), "the ring ends");
    let ended = epoch().elapsed();
    ended.saturating_sub(Duration::from_nanos(FAILED_AT.load(Ordering::SeqCst)))
}
