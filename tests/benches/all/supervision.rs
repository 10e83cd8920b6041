//! Supervision, with native processes: how long a supervised child is gone.
//!
//! - `supervisor/restart-2k/p50` and `/p99`: a `one_for_one` supervisor (no backoff)
//!   keeps one permanent child; the child fails when told to, 2,000 times a run. Each
//!   latency runs from the instant the child returns its error to the instant its
//!   replacement's first step begins: the exit's way to the supervisor, the supervisor's
//!   step and its spawn, and the new child's start. Baseline, in the same run and
//!   alternated: a plain spawn's latency, from the instant a process yields a `spawn`
//!   to the instant the child's first step begins. Goal: at most 1.5× at p50 and p99.
//! - `…/vs-by-hand`: the same restarts against a process that does the least a restart
//!   does (traps exits, keeps one linked worker, spawns another when it ends): what the
//!   supervisor's own work adds. No goal.
//!
//! Each run gives its p50 and p99; a record is the median of those over the runs.
//! Quick mode divides the count by 10.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use wasmproc::scheduler::{ProcessHandle, Spawnable};
use wasmproc::supervisor::{ChildSpec, Restart, Shutdown, Strategy, SupervisorSpec};
use wasmproc::{Command, Event, Events, Payload, Pid, Port, Process, Scheduler, SpawnRequest, Status, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample};

use crate::{WARMUP, short};

/// Measures the selected workloads into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let count: usize = if options.quick { 200 } else { 2_000 };
    let name = format!("supervisor/restart-{}", short(count as u64));
    if !options.selected(&name) {
        return;
    }
    let probe = Arc::new(Probe::default());
    let worker_probe = Arc::clone(&probe);
    let scheduler = Scheduler::builder()
        .workers(options.workers)
        .kind("worker", move || {
            Ok(Box::new(Worker { probe: Arc::clone(&worker_probe), port: None }) as Box<dyn Process>)
        })
        .build()
        .expect("the scheduler starts");
    let by_hand = |s: &Scheduler| s.handle().spawn(Restarter::default(), "main").expect("the restarter starts");
    let spawner = Spawner { probe: Arc::clone(&probe), next_tag: 0 };
    let spawner = scheduler.handle().spawn(spawner, "main").expect("the spawner starts");
    let [mut restarts, mut spawns, mut hand] = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..WARMUP + options.runs {
        let restart = restart_latencies(&scheduler, &probe, count, supervisor);
        let spawn = spawn_latencies(&scheduler, &probe, spawner.pid(), count);
        let by_hand = restart_latencies(&scheduler, &probe, count, by_hand);
        if round >= WARMUP {
            restarts.push(restart);
            spawns.push(spawn);
            hand.push(by_hand);
        }
    }
    scheduler.handle().send(spawner.pid(), "stop", Payload::empty()).expect("the spawner takes `stop`");
    spawner.join().expect("the spawner ends");
    scheduler.stop(Duration::from_secs(1));

    for (q, label) in [(0.50, "p50"), (0.99, "p99")] {
        let ours = Sample::quantile(&restarts, q);
        let spawn = Sample::quantile(&spawns, q);
        report.push(
            Record::micros(format!("{name}/{label}/vs-spawn"), &ours, &spawn).goal(Condition::ratio_at_most(1.5)),
        );
        // What the supervisor adds to the least a restart does: no goal.
        let by_hand = Sample::quantile(&hand, q);
        report.push(Record::micros(format!("{name}/{label}/vs-by-hand"), &ours, &by_hand));
    }
}

/// What the processes tell the driver: the newest worker's pid and when its first step
/// began, and when the last failure or spawn was set off.
#[derive(Default)]
struct Probe {
    state: Mutex<Seen>,
    changed: Condvar,
}

#[derive(Default)]
struct Seen {
    /// Workers that have begun their first step so far.
    started: u64,
    /// The newest of them.
    pid: Option<Pid>,
    /// When its first step began.
    started_at: Option<Instant>,
    /// When the last failure (restart side) or spawn (baseline) was set off.
    set_off_at: Option<Instant>,
}

impl Probe {
    fn set_off(&self) {
        self.state.lock().expect("the probe's lock").set_off_at = Some(Instant::now());
    }

    fn started(&self, pid: Pid) {
        let now = Instant::now();
        let mut seen = self.state.lock().expect("the probe's lock");
        seen.started += 1;
        seen.pid = Some(pid);
        seen.started_at = Some(now);
        self.changed.notify_all();
    }

    /// Waits until more than `started` workers have started; the newest one's pid and the
    /// time from the last set-off to its first step.
    fn wait_past(&self, started: u64) -> (Pid, Duration) {
        let seen = self.state.lock().expect("the probe's lock");
        let (seen, timeout) = self
            .changed
            .wait_timeout_while(seen, Duration::from_secs(60), |seen| seen.started <= started)
            .expect("the probe's lock");
        assert!(!timeout.timed_out(), "no worker started within 60 s");
        let latency = match (seen.set_off_at, seen.started_at) {
            (Some(off), Some(at)) => at.saturating_duration_since(off),
            _ => Duration::ZERO,
        };
        (seen.pid.expect("a worker started"), latency)
    }

    fn count(&self) -> u64 {
        self.state.lock().expect("the probe's lock").started
    }
}

/// Reports its first step to the probe, then fails on `fail` (setting off the
/// supervisor's restart) or ends on `stop`.
struct Worker {
    probe: Arc<Probe>,
    port: Option<Port>,
}

impl Process for Worker {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.port = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if let Some(port) = self.port.take() {
            self.probe.started(port.pid());
        }
        for event in events {
            if let Event::Message { topic, .. } = event {
                if topic == "fail" {
                    self.probe.set_off();
                    out.complete(Err("told to fail".into()));
                } else {
                    out.complete(Ok(Payload::empty()));
                }
                return Ok(());
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// A `one_for_one` supervisor of one permanent worker, without backoff, whose
/// intensity is never reached.
fn supervisor(s: &Scheduler) -> ProcessHandle {
    let mut spec = SupervisorSpec::new(Strategy::OneForOne);
    spec.intensity = u32::MAX;
    spec.period = Duration::from_secs(1);
    let mut child = ChildSpec::new("worker", "worker", "main");
    (child.restart, child.shutdown) = (Restart::Permanent, Shutdown::Brutal);
    spec.children.push(child);
    let options = spec.spawn_options().expect("the spec is valid");
    s.handle().spawn(Spawnable::kind("supervisor"), options).expect("the supervisor starts")
}

/// `count` restarts of the worker `keeper` keeps; each one's latency.
fn restart_latencies(
    s: &Scheduler,
    probe: &Probe,
    count: usize,
    keeper: fn(&Scheduler) -> ProcessHandle,
) -> Vec<Duration> {
    let before = probe.count();
    let keeper = keeper(s);
    let (mut pid, _) = probe.wait_past(before);
    let mut latencies = Vec::with_capacity(count);
    for i in 0..count as u64 {
        s.handle().send(pid, "fail", Payload::empty()).expect("the worker takes `fail`");
        let (next, latency) = probe.wait_past(before + 1 + i);
        latencies.push(latency);
        pid = next;
    }
    s.handle().terminate(keeper.pid()).expect("the keeper is terminated");
    assert!(keeper.join().is_err(), "a terminated keeper ends abnormally");
    latencies
}

/// A restart written by hand, the least a restart can do: traps exits, keeps one linked
/// worker, and spawns a new one whenever the last one ends.
#[derive(Default)]
struct Restarter {
    started: bool,
}

impl Process for Restarter {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let mut ended = u64::from(!self.started);
        if !self.started {
            self.started = true;
            out.yield_command(0, Command::TrapExits(true));
        }
        for event in events {
            match event {
                Event::Exit { .. } => ended += 1,
                Event::Completion { result: Err(error), .. } => anyhow::bail!("a command failed: {error}"),
                _ => {}
            }
        }
        for _ in 0..ended {
            let request = SpawnRequest {
                kind: Some("worker".into()),
                method: "main".into(),
                input: Vec::new(),
                monitor: false,
                link: true,
            };
            out.yield_command(1, Command::Spawn(request));
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// Yields a `spawn` of a worker for each `spawn` message, and ends on `stop`.
struct Spawner {
    probe: Arc<Probe>,
    next_tag: u64,
}

impl Process for Spawner {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            match event {
                Event::Message { topic, .. } if topic == "stop" => {
                    out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                Event::Message { .. } => {
                    let request = SpawnRequest {
                        kind: Some("worker".into()),
                        method: "main".into(),
                        input: Vec::new(),
                        monitor: false,
                        link: false,
                    };
                    self.probe.set_off();
                    out.yield_command(self.next_tag, Command::Spawn(request));
                    self.next_tag += 1;
                }
                Event::Completion { result: Err(error), .. } => anyhow::bail!("a spawn failed: {error}"),
                _ => {}
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// `count` plain spawns of a worker by the spawner; each one's latency.
fn spawn_latencies(s: &Scheduler, probe: &Probe, spawner: Pid, count: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let before = probe.count();
        s.handle().send(spawner, "spawn", Payload::empty()).expect("the spawner takes `spawn`");
        let (worker, latency) = probe.wait_past(before);
        latencies.push(latency);
        s.handle().send(worker, "stop", Payload::empty()).expect("the worker takes `stop`");
    }
    latencies
}
