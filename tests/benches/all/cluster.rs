//! The cluster: two nodes joined through a real `nats-server` on loopback, both in this
//! process (two schedulers of one worker each, each node with its own NATS connection on
//! a thread of its own, as `wasmproc node` runs one), against the same work between two
//! processes on one node, and against raw NATS with the same client crate (async-nats)
//! between two connections: the limit a node could reach through this server.
//!
//! - `cluster/rtt-*`: a process on node A sends `ping` to one on node B, which answers
//!   `pong`; one round trip at a time, each timed; a run's p50 and p99. Baselines: both
//!   processes on node A; raw NATS request/reply (the responder on a thread of its own).
//! - `cluster/msgs-*`: messages from a process on A to one on B in windows of [`WINDOW`]:
//!   the receiver answers `ack` after each window and the sender sends the next one then,
//!   so no mailbox bound is ever hit. Baselines: the same on one node; the same protocol
//!   in raw NATS (publish a window, wait for the subscriber's ack).
//! - `cluster/spawns-*`: a process on A spawns children that end at once, every one placed
//!   on B (A takes no spawns), [`IN_FLIGHT`] spawns outstanding. Baselines: the same
//!   spawner on B, whose spawns stay there; raw NATS requests, as many outstanding.
//!
//! The sides alternate run by run, as [`measure_pair`](wasmproc_tests::bench::measure_pair)
//! does, so the server, the machine's other load and its frequency weigh on all alike.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use wasmproc::cluster::{ClusterConfig, Placement};
use wasmproc::{
    Command as Yielded, Event, Events, Payload, Pid, Port, Process, Scheduler, SpawnRequest, Status, StepOutput,
};
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample};
use wasmproc_tests::nats::{Node, Server, kind};

use crate::{WARMUP, short};

/// Messages the sender sends before it waits for the receiver's `ack`: well under the
/// default mailbox bound (1024). Picked out of thin air.
const WINDOW: u64 = 100;
/// Spawns (and raw requests) outstanding at once.
const IN_FLIGHT: u64 = 64;
/// How long the raw-NATS responder may take to be ready.
const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) fn run(options: &Options, report: &mut Report) {
    let scale = if options.quick { 10 } else { 1 };
    let (trips, messages, spawns) = (2_000 / scale, 100_000 / scale, 10_000 / scale);
    let rtt = format!("cluster/rtt-{}", short(trips));
    let msgs = format!("cluster/msgs-{}", short(messages));
    let spawn = format!("cluster/spawns-{}", short(spawns));
    let selected = |name: &str| options.selected(&format!("{name}/vs-nats")) || options.selected(&format!("{name}/"));
    let (do_rtt, do_msgs, do_spawns) = (selected(&rtt), selected(&msgs), selected(&spawn));
    if !(do_rtt || do_msgs || do_spawns) {
        return;
    }
    let server = match Server::start() {
        Ok(server) => server,
        Err(why) => {
            println!("cluster/: skipped: no `nats-server` on loopback: {why}");
            return;
        }
    };
    let a = join(&server, "bench-a", Placement::LeastLoaded, false);
    let b = join(&server, "bench-b", Placement::Local, true);
    a.wait_for_accepting(1);
    b.wait_for(2);
    let raw = Raw::connect(&server);
    println!(
        "cluster/: nats-server {} on loopback; nodes A and B in this process, 1 worker each; raw NATS: two \
         async-nats connections",
        Server::version()
    );

    if do_rtt {
        let ponger = a.spawn_on(&b, "ponger");
        let runs = alternate(
            options.runs,
            &mut || round_trips(&a, ponger, trips),
            &mut || {
                let local = a.scheduler.handle().spawn(wasmproc::scheduler::Spawnable::kind("ponger"), "main");
                let local = local.expect("a ponger starts");
                let times = round_trips(&a, local.pid(), trips);
                a.scheduler.handle().send(local.pid(), "stop", Payload::empty()).expect("the ponger takes `stop`");
                local.join().expect("the ponger stops");
                times
            },
            &mut || raw.round_trips(trips),
        );
        a.scheduler.handle().send(ponger, "stop", Payload::empty()).expect("queued for node B");
        let [cross, one, nats] = runs.map(|runs| (Sample::quantile(&runs, 0.50), Sample::quantile(&runs, 0.99)));
        // A cross-node round trip is the two NATS messages of a request/reply plus, on
        // each node, a hand-off from a worker to the cluster's thread and back: 1.5× the
        // raw exchange allows for those four wake-ups at p50, 2× at p99.
        report
            .push(Record::micros(format!("{rtt}/p50/vs-nats"), &cross.0, &nats.0).goal(Condition::ratio_at_most(1.5)));
        report
            .push(Record::micros(format!("{rtt}/p99/vs-nats"), &cross.1, &nats.1).goal(Condition::ratio_at_most(2.0)));
        // Two processes on one node exchange in-memory: this ratio is the network's price,
        // reported without a goal.
        report.push(Record::micros(format!("{rtt}/p50/vs-1-node"), &cross.0, &one.0));
        report.push(Record::micros(format!("{rtt}/p99/vs-1-node"), &cross.1, &one.1));
    }

    if do_msgs {
        let sink = a.spawn_on(&b, "sink");
        let [cross, one, nats] = alternate(
            options.runs,
            &mut || stream(&a, sink, messages),
            &mut || {
                let local = a.scheduler.handle().spawn(wasmproc::scheduler::Spawnable::kind("sink"), "main");
                let local = local.expect("a sink starts");
                let time = stream(&a, local.pid(), messages);
                a.scheduler.handle().send(local.pid(), "stop", Payload::empty()).expect("the sink takes `stop`");
                local.join().expect("the sink stops");
                time
            },
            &mut || raw.stream(messages),
        )
        .map(Sample::of);
        a.scheduler.handle().send(sink, "stop", Payload::empty()).expect("queued for node B");
        // The links batch what is queued into one frame, where raw NATS publishes each
        // message alone; what the processes add is a step a message and a wake-up a
        // window on each node: 1.5× the raw protocol.
        report.push(
            Record::rate(format!("{msgs}/vs-nats"), "messages/s", messages, &cross, Some(&nats))
                .goal(Condition::ratio_at_most(1.5)),
        );
        report.push(Record::rate(format!("{msgs}/vs-1-node"), "messages/s", messages, &cross, Some(&one)));
    }

    if do_spawns {
        let [cross, one, nats] = alternate(
            options.runs,
            &mut || spawn_children(&a, &b, spawns),
            &mut || spawn_children(&b, &b, spawns),
            &mut || raw.concurrent_requests(spawns),
        )
        .map(Sample::of);
        // A remote spawn is one request/reply on the link (the spawn, its pid back) plus
        // the child's start and end on B: 2× raw requests as many at once.
        report.push(
            Record::rate(format!("{spawn}/vs-nats"), "spawns/s", spawns, &cross, Some(&nats))
                .goal(Condition::ratio_at_most(2.0)),
        );
        report.push(Record::rate(format!("{spawn}/vs-1-node"), "spawns/s", spawns, &cross, Some(&one)));
    }
    a.cluster.leave();
    b.cluster.leave();
    a.scheduler.stop(Duration::from_secs(1));
    b.scheduler.stop(Duration::from_secs(1));
}

/// Runs the three sides once each to warm up, then alternates them `runs` times.
fn alternate<T>(
    runs: usize,
    cross: &mut dyn FnMut() -> T,
    one: &mut dyn FnMut() -> T,
    nats: &mut dyn FnMut() -> T,
) -> [Vec<T>; 3] {
    for _ in 0..WARMUP {
        cross();
        one();
        nats();
    }
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..runs {
        out[0].push(cross());
        out[1].push(one());
        out[2].push(nats());
    }
    out
}

/// Node `name` in this process: a scheduler of one worker with the kinds the benchmarks
/// spawn, in a cluster of its own on `server`.
fn join(server: &Server, name: &str, placement: Placement, accepts: bool) -> Node {
    let config = ClusterConfig::new(server.url())
        .name(name)
        .secret("bench")
        .prefix(format!("bench{}", std::process::id()))
        .placement(placement)
        .accepts_spawns(accepts);
    let scheduler = Scheduler::builder()
        .workers(1)
        .kind("ponger", kind(|| Ponger(None)))
        .kind("sink", kind(|| Sink { port: None, count: 0 }))
        .kind("brief", kind(|| Brief));
    Node::join(config, scheduler)
}

/// Answers each `ping` with a `pong` of the same body, until `stop`.
struct Ponger(Option<Port>);

impl Process for Ponger {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.0 = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.0.as_ref().expect("init keeps the port");
        for event in events {
            if let Event::Message { sender, topic, body } = event {
                match topic.as_str() {
                    "ping" => port.send(sender, "pong", body)?,
                    "stop" => {
                        out.complete(Ok(Payload::empty()));
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// Sends `ping` to `to` and, on each `pong`, notes the round trip and sends the next;
/// completes after `left` of them.
struct Pinger {
    port: Option<Port>,
    to: Pid,
    left: u64,
    started: bool,
    sent: Instant,
    times: Arc<Mutex<Vec<Duration>>>,
}

impl Process for Pinger {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.port = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.port.as_ref().expect("init keeps the port");
        let mut send = !std::mem::replace(&mut self.started, true);
        for event in events {
            if let Event::Message { topic, .. } = event
                && topic == "pong"
            {
                self.times.lock().expect("not poisoned").push(self.sent.elapsed());
                self.left -= 1;
                send = true;
            }
        }
        if self.left == 0 {
            out.complete(Ok(Payload::empty()));
            return Ok(());
        }
        if send {
            self.sent = Instant::now();
            port.send(self.to, "ping", Payload::u64(self.left))?;
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// `trips` round trips from a new pinger on `from` to the ponger `to`, each timed.
fn round_trips(from: &Node, to: Pid, trips: u64) -> Vec<Duration> {
    let times = Arc::new(Mutex::new(Vec::with_capacity(trips as usize)));
    let pinger = Pinger { port: None, to, left: trips, started: false, sent: Instant::now(), times: times.clone() };
    let pinger = from.scheduler.handle().spawn(pinger, "main").expect("a pinger starts");
    pinger.join().expect("the round trips complete");
    std::mem::take(&mut *times.lock().expect("not poisoned"))
}

/// Counts messages and answers `ack` to their sender after each [`WINDOW`], until `stop`.
struct Sink {
    port: Option<Port>,
    count: u64,
}

impl Process for Sink {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.port = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.port.as_ref().expect("init keeps the port");
        for event in events {
            if let Event::Message { sender, topic, .. } = event {
                if topic == "stop" {
                    out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                self.count += 1;
                if self.count.is_multiple_of(WINDOW) {
                    port.send(sender, "ack", Payload::empty())?;
                }
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// Sends `left` messages to `to`, a [`WINDOW`] at a time, each window after the `ack`
/// of the one before; completes on the last window's `ack`.
struct Source {
    port: Option<Port>,
    to: Pid,
    left: u64,
    started: bool,
}

impl Process for Source {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.port = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.port.as_ref().expect("init keeps the port");
        let acks = events.filter(|e| matches!(e, Event::Message { topic, .. } if topic == "ack")).count();
        if std::mem::replace(&mut self.started, true) && acks == 0 {
            out.set_status(Status::Idle);
            return Ok(());
        }
        if self.left == 0 {
            out.complete(Ok(Payload::empty()));
            return Ok(());
        }
        for _ in 0..WINDOW {
            self.left -= 1;
            port.send(self.to, "m", Payload::u64(self.left))?;
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// The time `messages` take from a new source on `from` to the sink `to`.
fn stream(from: &Node, to: Pid, messages: u64) -> Duration {
    let start = Instant::now();
    let source = Source { port: None, to, left: messages, started: false };
    from.scheduler.handle().spawn(source, "main").expect("a source starts").join().expect("the stream completes");
    start.elapsed()
}

/// Ends at once.
struct Brief;

impl Process for Brief {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.complete(Ok(Payload::empty()));
        Ok(())
    }
}

/// Spawns `left` children of kind `brief`, [`IN_FLIGHT`] outstanding; completes when
/// every spawn has completed, or fails if a child started on another node than `on`.
struct Spawner {
    on: u16,
    left: u64,
    in_flight: u64,
}

impl Process for Spawner {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            if let Event::Completion { result, .. } = event {
                let child = result.map_err(|error| anyhow::anyhow!("a spawn failed: {error}"))?;
                let child = Pid::from_u64(child.to_u64().context("a spawn completes with a pid")?);
                anyhow::ensure!(
                    child.node() == self.on,
                    "child {child} started on node {}, not {}",
                    child.node(),
                    self.on
                );
                self.in_flight -= 1;
            }
        }
        while self.in_flight < IN_FLIGHT && self.left > 0 {
            self.left -= 1;
            self.in_flight += 1;
            let request = SpawnRequest {
                kind: Some("brief".into()),
                method: "main".into(),
                input: Vec::new(),
                monitor: false,
                link: false,
            };
            out.yield_command(self.left, Yielded::Spawn(request));
        }
        if self.in_flight == 0 {
            out.complete(Ok(Payload::empty()));
        } else {
            out.set_status(Status::Blocked);
        }
        Ok(())
    }
}

/// The time a spawner on `from` takes for `spawns` children, which its placement must
/// put on `on`.
fn spawn_children(from: &Node, on: &Node, spawns: u64) -> Duration {
    let start = Instant::now();
    let spawner = Spawner { on: on.cluster.node(), left: spawns, in_flight: 0 };
    from.scheduler.handle().spawn(spawner, "main").expect("a spawner starts").join().expect("every spawn completes");
    start.elapsed()
}

/// The raw-NATS side: a requesting connection driven from the benchmark's thread, and a
/// responding one on a thread of its own that echoes requests and acknowledges windows.
struct Raw {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
    acks: Mutex<async_nats::Subscriber>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    responder: Option<std::thread::JoinHandle<()>>,
}

impl Raw {
    const ECHO: &str = "bench.raw.echo";
    const SINK: &str = "bench.raw.sink";
    const ACK: &str = "bench.raw.ack";

    fn connect(server: &Server) -> Raw {
        let url = server.url();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let responder = std::thread::Builder::new()
            .name("bench-raw-nats".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                runtime.block_on(async move {
                    let client = async_nats::connect(url).await.expect("the responder connects");
                    let mut echo = client.subscribe(Raw::ECHO).await.expect("subscribes");
                    let mut sink = client.subscribe(Raw::SINK).await.expect("subscribes");
                    client.flush().await.expect("the subscriptions reach the server");
                    ready_tx.send(()).expect("the benchmark waits");
                    let mut count = 0u64;
                    let mut stopped = stopped;
                    loop {
                        tokio::select! {
                            Some(request) = echo.next() => {
                                let reply = request.reply.expect("a request has a reply subject");
                                client.publish(reply, request.payload).await.expect("the reply is queued");
                            }
                            Some(_) = sink.next() => {
                                count += 1;
                                if count.is_multiple_of(WINDOW) {
                                    client.publish(Raw::ACK, bytes::Bytes::new()).await.expect("the ack is queued");
                                }
                            }
                            _ = &mut stopped => break,
                        }
                    }
                });
            })
            .expect("the responder's thread starts");
        ready_rx.recv_timeout(PATIENCE).expect("the responder is ready");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let (client, acks) = runtime.block_on(async {
            let client = async_nats::connect(server.url()).await.expect("the requester connects");
            let acks = client.subscribe(Raw::ACK).await.expect("subscribes");
            client.flush().await.expect("the subscription reaches the server");
            (client, acks)
        });
        Raw { runtime, client, acks: Mutex::new(acks), stop: Some(stop), responder: Some(responder) }
    }

    fn round_trips(&self, trips: u64) -> Vec<Duration> {
        self.runtime.block_on(async {
            let mut times = Vec::with_capacity(trips as usize);
            for i in 0..trips {
                let sent = Instant::now();
                let body = bytes::Bytes::copy_from_slice(&i.to_le_bytes());
                self.client.request(Raw::ECHO, body).await.expect("the responder answers");
                times.push(sent.elapsed());
            }
            times
        })
    }

    fn stream(&self, messages: u64) -> Duration {
        let mut acks = self.acks.lock().expect("not poisoned");
        let start = Instant::now();
        self.runtime.block_on(async {
            for window in 0..messages / WINDOW {
                for i in 0..WINDOW {
                    let body = bytes::Bytes::copy_from_slice(&(window * WINDOW + i).to_le_bytes());
                    self.client.publish(Raw::SINK, body).await.expect("the message is queued");
                }
                acks.next().await.expect("the window is acknowledged");
            }
        });
        start.elapsed()
    }

    fn concurrent_requests(&self, requests: u64) -> Duration {
        let start = Instant::now();
        self.runtime.block_on(async {
            let tasks: Vec<_> = (0..IN_FLIGHT)
                .map(|task| {
                    let client = self.client.clone();
                    tokio::spawn(async move {
                        for i in (task..requests).step_by(IN_FLIGHT as usize) {
                            let body = bytes::Bytes::copy_from_slice(&i.to_le_bytes());
                            client.request(Raw::ECHO, body).await.expect("the responder answers");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("a task finishes");
            }
        });
        start.elapsed()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(responder) = self.responder.take() {
            let _ = responder.join();
        }
    }
}
