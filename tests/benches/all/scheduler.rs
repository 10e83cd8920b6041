//! The scheduler alone against tokio doing the same work, with native processes: what
//! the scheduler costs before any Wasm. Both use `WORKERS` worker threads.
//!
//! - `skynet`: a tree of processes, each spawning 10 children, 1,000,000 leaves
//!   (1,111,111 processes); each parent sums its children's results. wasmproc: `spawn`
//!   commands with `monitor`, results from the exit events. tokio: `tokio::spawn` and
//!   awaiting the join handles.
//! - `ping-pong`: two processes pass a counter back and forth 1,000,000 times. wasmproc:
//!   `send` commands and messages. tokio: two tasks and two bounded mpsc channels.
//! - `yield`: 10,000 processes each yield 100 times and are resumed. wasmproc: a custom
//!   command whose handler completes at once. tokio: `yield_now().await`.
//!
//! Quick mode divides the counts by 10.

use std::time::{Duration, Instant};

use wasmproc::handler::Request;
use wasmproc::{
    Capabilities, Command, Event, Events, Payload, Pid, Port, Process, Scheduler, SpawnRequest, Status, StepOutput,
};
use wasmproc_tests::Yielder;
use wasmproc_tests::bench::{Condition, Options, Record, Report, measure_pair};

use crate::{WARMUP, short};
use wasmproc::scheduler::{SpawnOptions, Spawnable};

/// The workloads' sizes.
struct Sizes {
    skynet_leaves: u64,
    ping_pong_messages: u64,
    yield_processes: u64,
    yields_each: u64,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        let scale = if quick { 10 } else { 1 };
        Sizes {
            skynet_leaves: 1_000_000 / scale,
            ping_pong_messages: 1_000_000 / scale,
            yield_processes: 10_000 / scale,
            yields_each: 100,
        }
    }
}

/// Measures the selected workloads into `report`, each against tokio.
pub fn run(options: &Options, report: &mut Report) {
    let sizes = Sizes::new(options.quick);
    let names = [
        format!("scheduler/skynet-{}", short(sizes.skynet_leaves)),
        format!("scheduler/ping-pong-{}", short(sizes.ping_pong_messages)),
        format!("scheduler/yield-{}x{}", short(sizes.yield_processes), sizes.yields_each),
    ];
    if !names.iter().any(|n| options.selected(n)) {
        return;
    }
    let workers = options.workers;
    let scheduler = Scheduler::builder()
        .workers(workers)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", |r: Request<'_>| r.complete(Ok(Payload::empty())))
        .kind("skynet", || Ok(Box::new(Skynet::default()) as Box<dyn Process>))
        .max_processes(2_000_000)
        .build()
        .expect("the scheduler starts");
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).build().expect("tokio starts");

    type Bench<'a> = (&'a str, Condition, Box<dyn Fn() -> Duration + 'a>, Box<dyn Fn() -> Duration + 'a>);
    let benches: Vec<Bench<'_>> = vec![
        (
            names[0].as_str(),
            Condition::ratio_at_most(1.0),
            Box::new(|| skynet_wasmproc(&scheduler, sizes.skynet_leaves)),
            Box::new(|| skynet_tokio(&tokio, sizes.skynet_leaves)),
        ),
        (
            names[1].as_str(),
            Condition::ratio_at_most(1.0),
            Box::new(|| ping_pong_wasmproc(&scheduler, sizes.ping_pong_messages)),
            Box::new(|| ping_pong_tokio(&tokio, sizes.ping_pong_messages)),
        ),
        (
            names[2].as_str(),
            Condition::ratio_at_most(1.0),
            Box::new(|| yields_wasmproc(&scheduler, &sizes)),
            Box::new(|| yields_tokio(&tokio, &sizes)),
        ),
    ];
    for (name, goal, ours, theirs) in benches {
        if !options.selected(name) {
            continue;
        }
        let (ours, theirs) = measure_pair(options.runs, WARMUP, &mut || ours(), &mut || theirs());
        report.push(Record::time(name, &ours, Some(&theirs)).goal(goal));
    }
    scheduler.stop(Duration::from_secs(1));
}

// --- skynet --------------------------------------------------------------------------

/// A skynet node: a leaf returns its number; a parent spawns 10 children (monitored)
/// and sums their exit results.
#[derive(Default)]
struct Skynet {
    num: u64,
    size: u64,
    sum: u64,
    exits: u32,
}

fn pair(a: u64, b: u64) -> Payload {
    let mut data = Vec::with_capacity(16);
    data.extend_from_slice(&a.to_le_bytes());
    data.extend_from_slice(&b.to_le_bytes());
    Payload::bytes(data)
}

impl Process for Skynet {
    fn init(&mut self, _: Port, _: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        let data = &input.first().ok_or_else(|| anyhow::anyhow!("skynet needs (num, size)"))?.data;
        anyhow::ensure!(data.len() == 16, "skynet input must be two u64");
        self.num = u64::from_le_bytes(data[..8].try_into()?);
        self.size = u64::from_le_bytes(data[8..].try_into()?);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if self.size == 1 {
            out.complete(Ok(Payload::u64(self.num)));
            return Ok(());
        }
        let mut first = true;
        for event in events {
            first = false;
            if let Event::Exit { reason, .. } = event {
                self.sum += reason.into_result()?.to_u64().unwrap_or(0);
                self.exits += 1;
            }
        }
        if first && self.exits == 0 && self.sum == 0 {
            let child = self.size / 10;
            for i in 0..10 {
                let request = SpawnRequest {
                    kind: None,
                    method: "main".into(),
                    input: vec![pair(self.num + i * child, child)],
                    monitor: true,
                    link: false,
                };
                out.yield_command(i, Command::Spawn(request));
            }
        }
        if self.exits == 10 {
            out.complete(Ok(Payload::u64(self.sum)));
        } else {
            out.set_status(Status::Idle);
        }
        Ok(())
    }
}

fn skynet_wasmproc(s: &Scheduler, leaves: u64) -> Duration {
    let start = Instant::now();
    let root =
        s.handle().spawn(Spawnable::kind("skynet"), SpawnOptions::new("main").input(vec![pair(0, leaves)])).unwrap();
    let sum = root.join().unwrap().to_u64().unwrap();
    let elapsed = start.elapsed();
    assert_eq!(sum, leaves * (leaves - 1) / 2);
    elapsed
}

fn skynet_tokio(rt: &tokio::runtime::Runtime, leaves: u64) -> Duration {
    fn node(num: u64, size: u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = u64> + Send>> {
        Box::pin(async move {
            if size == 1 {
                return num;
            }
            let child = size / 10;
            let handles: Vec<_> = (0..10).map(|i| tokio::spawn(node(num + i * child, child))).collect();
            let mut sum = 0;
            for h in handles {
                sum += h.await.unwrap();
            }
            sum
        })
    }
    let start = Instant::now();
    let sum = rt.block_on(async { tokio::spawn(node(0, leaves)).await.unwrap() });
    let elapsed = start.elapsed();
    assert_eq!(sum, leaves * (leaves - 1) / 2);
    elapsed
}

// --- ping-pong -----------------------------------------------------------------------

/// Waits for a counter and sends it back incremented until it reaches the limit. The
/// client knows its peer from init and starts the exchange; the server learns its peer
/// from the first message.
struct PingPong {
    peer: Option<Pid>,
    started: bool,
    sent_last: bool,
    limit: u64,
}

impl Process for PingPong {
    fn init(&mut self, _: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        if method == "client" {
            self.peer = Some(Pid::from_u64(input[0].to_u64().unwrap()));
        }
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let mut next = None;
        if !self.started {
            self.started = true;
            next = self.peer.map(|_| 0);
        }
        for event in events {
            match event {
                Event::Message { sender, body, .. } => {
                    let n = body.to_u64().unwrap();
                    if n >= self.limit {
                        out.complete(Ok(Payload::u64(n)));
                        return Ok(());
                    }
                    self.peer = Some(sender);
                    next = Some(n + 1);
                }
                Event::Completion { result: Err(e), .. } => anyhow::bail!("send failed: {e}"),
                // The send of the final count went through: done.
                Event::Completion { .. } if self.sent_last => {
                    out.complete(Ok(Payload::u64(self.limit)));
                    return Ok(());
                }
                _ => {}
            }
        }
        if let Some(n) = next {
            let to = self.peer.unwrap();
            out.yield_command(0, Command::Send { to, topic: String::new(), body: Payload::u64(n) });
            self.sent_last = n >= self.limit;
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

fn ping_pong_wasmproc(s: &Scheduler, limit: u64) -> Duration {
    let start = Instant::now();
    let server = s.handle().spawn(PingPong { peer: None, started: false, sent_last: false, limit }, "serve").unwrap();
    let client = PingPong { peer: None, started: false, sent_last: false, limit };
    let client =
        s.handle().spawn(client, SpawnOptions::new("client").input(vec![Payload::u64(server.pid().as_u64())])).unwrap();
    let (a, b) = (server.join(), client.join());
    let elapsed = start.elapsed();
    assert_eq!((a.unwrap().to_u64(), b.unwrap().to_u64()), (Some(limit), Some(limit)));
    elapsed
}

fn ping_pong_tokio(rt: &tokio::runtime::Runtime, limit: u64) -> Duration {
    let start = Instant::now();
    rt.block_on(async {
        let (to_b, mut b_rx) = tokio::sync::mpsc::channel::<u64>(16);
        let (to_a, mut a_rx) = tokio::sync::mpsc::channel::<u64>(16);
        let b = tokio::spawn(async move {
            while let Some(n) = b_rx.recv().await {
                if n + 1 >= limit || to_a.send(n + 1).await.is_err() {
                    return n + 1;
                }
            }
            0
        });
        let a = tokio::spawn(async move {
            to_b.send(0).await.unwrap();
            while let Some(n) = a_rx.recv().await {
                if n + 1 >= limit || to_b.send(n + 1).await.is_err() {
                    return n + 1;
                }
            }
            0
        });
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!(a.max(b), limit);
    });
    start.elapsed()
}

// --- yield cycles --------------------------------------------------------------------

fn yields_wasmproc(s: &Scheduler, sizes: &Sizes) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..sizes.yield_processes)
        .map(|_| s.handle().spawn(Yielder { left: sizes.yields_each }, "main").unwrap())
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

fn yields_tokio(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Duration {
    let yields_each = sizes.yields_each;
    let start = Instant::now();
    rt.block_on(async {
        let handles: Vec<_> = (0..sizes.yield_processes)
            .map(|_| {
                tokio::spawn(async move {
                    for _ in 0..yields_each {
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    });
    start.elapsed()
}
