//! Durable processes on a cluster's JetStream, beside what `durable/` measures on it:
//!
//! - `jetstream/publish-raw`: JetStream's own acknowledged publish rate, as the journal's
//!   store publishes (one message a group commit, as many awaiting their
//!   acknowledgements at once as the store allows), with the record
//!   size and group size the durable cycles on JetStream had: the limit of durable steps
//!   on this server. `durable/cycles-…-jetstream` is held to at least half of it.
//! - `jetstream/failover-p50`, `-p99`: two shard hosts in this process share four shards
//!   of durable processes that step every 10 ms; one stops taking part (as a node killed
//!   or frozen looks to the others: no renewal, no give-back), and the time is taken from
//!   that moment until every process of its shards has stepped on the other host.
//!   Leases of 1 s. Goal: at most the lease plus one second.
//! - `jetstream/xshard-latency-p50`, `-p99`: a message from a durable process of one shard
//!   to one of another (both shards held by one host, so every message goes through the
//!   inbox stream and both journals): half the round trip of a ping answered by a pong,
//!   against one acknowledged JetStream publish of the same size, same run.
//! - `jetstream/xshard-msgs`: one process sends another, of another shard, messages of 8
//!   bytes 1,000 a step, until the receiver has taken them all; against publishing as
//!   many messages of the same size to a stream, 256 at a time with their
//!   acknowledgements awaited together (as the inboxes' publisher does), same run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmproc::cluster::{
    ClusterConfig, InboxOptions, JetStreamOptions, LeaseOptions, ShardHost, ShardOptions, shard_node,
};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::{Command, Event, Events, Payload, Pid, Port, Process, Status, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample};
use wasmproc_tests::nats::Server;

/// The shards of the failover benchmark, and the processes in each.
const SHARDS: u32 = 4;
const PER_SHARD: usize = 8;
/// The leases' time to live there.
const LEASE: Duration = Duration::from_secs(1);
/// The longest any wait of the failover benchmark may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// JetStream's acknowledged publish rate, in records a second: `commits` messages of
/// `per_commit` records of `record_bytes` each, up to `in_flight` of them awaiting their
/// acknowledgements at once, as `JetStreamStore` commits.
pub(crate) fn raw_publish_rate(
    server: &Server,
    record_bytes: usize,
    per_commit: usize,
    commits: u64,
    in_flight: usize,
) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let url = server.url();
    runtime.block_on(async move {
        let client = async_nats::connect(url.as_str()).await.expect("the bench connects");
        let context = async_nats::jetstream::new(client);
        let name = format!("BENCH_RAW_{}", std::process::id());
        let _ = context.delete_stream(&name).await;
        context
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("bench.raw.{}", std::process::id())],
                ..Default::default()
            })
            .await
            .expect("the stream is made");
        let subject = format!("bench.raw.{}", std::process::id());
        let payload = bytes::Bytes::from(vec![0x5a; record_bytes * per_commit.max(1)]);
        let start = Instant::now();
        let mut acks = std::collections::VecDeque::new();
        for _ in 0..commits {
            if acks.len() >= in_flight.max(1) {
                let ack: async_nats::jetstream::context::PublishAckFuture = acks.pop_front().expect("an ack");
                ack.await.expect("acknowledged");
            }
            acks.push_back(context.publish(subject.clone(), payload.clone()).await.expect("published"));
        }
        for ack in acks {
            ack.await.expect("acknowledged");
        }
        let elapsed = start.elapsed();
        let _ = context.delete_stream(&name).await;
        (commits * per_commit.max(1) as u64) as f64 / elapsed.as_secs_f64()
    })
}

/// When each process last stepped, on the host that keeps the map.
type Steps = Arc<Mutex<HashMap<Pid, Instant>>>;

/// A durable process that sleeps 10 ms a step, for ever, and notes each step.
struct Ticker {
    pid: Pid,
    steps: Steps,
    sleeps: u64,
}

impl Process for Ticker {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.pid = port.pid();
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        self.steps.lock().insert(self.pid, Instant::now());
        self.sleeps += 1;
        out.yield_command(self.sleeps, Command::Sleep(Duration::from_millis(10)));
        Ok(())
    }
}

fn host(config: &ClusterConfig, node: &str, round: usize, steps: &Steps) -> ShardHost {
    let tag = format!("{}_{round}", std::process::id());
    // A stream of its own needs subjects of its own: another prefix.
    let config = config.clone().prefix(format!("failover{tag}"));
    let config = &config;
    let options = ShardOptions::new(SHARDS)
        .journal(JetStreamOptions::new().stream(format!("FAILOVER_{tag}")))
        .leases(LeaseOptions::new().bucket(format!("FAILOVER_{tag}")).ttl(LEASE))
        .inbox(InboxOptions::new().stream(format!("FAILOVER_INBOX_{tag}")));
    let steps = steps.clone();
    ShardHost::start(config, node, options, move |_, builder| {
        let steps = steps.clone();
        builder
            .workers(1)
            .kind("ticker", move || {
                Ok(Box::new(Ticker { pid: Pid::HOST, steps: steps.clone(), sleeps: 0 }) as Box<dyn Process>)
            })
            .build()
    })
    .expect("a shard host starts")
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One failover: the time from the moment host `a` stops taking part until every
/// process of the shards it held has stepped on host `b`.
fn failover(config: &ClusterConfig, round: usize) -> Duration {
    let (on_a, on_b): (Steps, Steps) = (Arc::default(), Arc::default());
    let a = host(config, "a", round, &on_a);
    wait_until("host a taking every shard", || a.held().len() == SHARDS as usize);
    for shard in 0..SHARDS {
        let handle = a.handle(shard).expect("a holds it");
        for _ in 0..PER_SHARD {
            handle.spawn(Spawnable::kind("ticker"), "main").expect("a ticker starts");
        }
    }
    let b = host(config, "b", round, &on_b);
    wait_until("the shards being shared", || a.held().len() == (SHARDS / 2) as usize && b.held().len() == 2);
    let lost: Vec<u16> = a.held().into_iter().map(shard_node).collect();
    let lost_pids: Vec<Pid> = on_a.lock().keys().copied().filter(|pid| lost.contains(&pid.node())).collect();
    assert_eq!(lost_pids.len(), (SHARDS / 2) as usize * PER_SHARD, "every process of a's shards stepped on a");
    let stopped = Instant::now();
    a.abandon();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let stepped = {
            let on_b = on_b.lock();
            lost_pids.iter().filter(|pid| on_b.get(pid).is_some_and(|&at| at > stopped)).count()
        };
        if stepped == lost_pids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{stepped} of the {} lost processes stepped on b within {PATIENCE:?}; b holds {:?}",
            lost_pids.len(),
            b.held()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = stopped.elapsed();
    b.drain();
    drop(a);
    elapsed
}

/// What the processes of the cross-shard benchmarks note.
#[derive(Default)]
struct Marks {
    /// The round trips of the pinger's pings.
    round_trips: Vec<Duration>,
    /// The messages `n` the echo took, and when it took the last.
    taken: u64,
    last: Option<Instant>,
}

type SharedMarks = Arc<Mutex<Marks>>;

/// Answers each `ping` with a `pong` to its sender, and counts the messages `n`.
struct Echo {
    port: Option<Port>,
    marks: SharedMarks,
}

impl Process for Echo {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        self.port = Some(port);
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.port.as_ref().expect("set at init");
        let mut taken = 0;
        for event in events {
            if let Event::Message { sender, topic, body } = event {
                if topic == "ping" {
                    port.send(sender, "pong", body)?;
                } else {
                    taken += 1;
                }
            }
        }
        if taken > 0 {
            let mut marks = self.marks.lock();
            marks.taken += taken;
            marks.last = Some(Instant::now());
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// With the input `[peer, count]`: pings `peer` `count` times, one at a time, noting each
/// round trip (`ping`), or sends it `count` messages `n`, 1,000 a step (`blast`).
struct Sender {
    port: Option<Port>,
    marks: SharedMarks,
    peer: Pid,
    left: u64,
    blast: bool,
    sent: Option<Instant>,
}

impl Process for Sender {
    fn init(&mut self, port: Port, method: &str, input: Vec<Payload>) -> anyhow::Result<()> {
        self.port = Some(port);
        self.blast = method == "blast";
        let number = |i: usize| input.get(i).and_then(Payload::to_u64).ok_or_else(|| anyhow::anyhow!("input {i}"));
        self.peer = Pid::from_u64(number(0)?);
        self.left = number(1)?;
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let port = self.port.as_ref().expect("set at init");
        if self.blast {
            for _ in 0..self.left.min(1000) {
                port.send(self.peer, "n", Payload::u64(self.left))?;
                self.left -= 1;
            }
            out.set_status(if self.left == 0 { Status::Complete(Ok(Payload::empty())) } else { Status::Continue });
            return Ok(());
        }
        let ponged = events.filter(|event| matches!(event, Event::Message { .. })).count();
        if let (Some(sent), true) = (self.sent, ponged > 0) {
            self.marks.lock().round_trips.push(sent.elapsed());
        }
        if self.sent.is_some() && ponged == 0 {
            out.set_status(Status::Idle);
            return Ok(());
        }
        if self.left == 0 {
            out.set_status(Status::Complete(Ok(Payload::empty())));
            return Ok(());
        }
        self.left -= 1;
        self.sent = Some(Instant::now());
        port.send(self.peer, "ping", Payload::u64(self.left))?;
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// A host of two shards on `config` (its own subjects, streams and buckets) whose
/// processes note `marks`, once it holds both.
fn xshard_host(config: &ClusterConfig, marks: &SharedMarks) -> ShardHost {
    let tag = format!("{}", std::process::id());
    let config = config.clone().prefix(format!("xshard{tag}"));
    let options = ShardOptions::new(2)
        .journal(JetStreamOptions::new().stream(format!("XSHARD_{tag}")))
        .leases(LeaseOptions::new().bucket(format!("XSHARD_{tag}")))
        .inbox(InboxOptions::new().stream(format!("XSHARD_INBOX_{tag}")));
    let marks = marks.clone();
    let host = ShardHost::start(&config, "x", options, move |_, builder| {
        let (echo, sender) = (marks.clone(), marks.clone());
        builder
            .workers(1)
            .kind("echo", move || Ok(Box::new(Echo { port: None, marks: echo.clone() }) as Box<dyn Process>))
            .kind("sender", move || {
                let marks = sender.clone();
                Ok(Box::new(Sender { port: None, marks, peer: Pid::HOST, left: 0, blast: false, sent: None })
                    as Box<dyn Process>)
            })
            .build()
    })
    .expect("a shard host starts");
    wait_until("the host taking both shards", || host.held().len() == 2);
    host
}

/// Spawns a `sender` in shard 0 that runs `method` against an `echo` in shard 1, and
/// waits for it to end.
fn exchange(host: &ShardHost, method: &str, count: u64) -> wasmproc::scheduler::ProcessHandle {
    let echo = host.handle(1).expect("held").spawn(Spawnable::kind("echo"), "main").expect("an echo starts");
    let input = vec![Payload::u64(echo.pid().as_u64()), Payload::u64(count)];
    host.handle(0)
        .expect("held")
        .spawn(Spawnable::kind("sender"), SpawnOptions::new(method).input(input))
        .expect("a sender starts")
}

/// JetStream alone, on a stream of its own: the times of `rounds` acknowledged publishes
/// of `size` bytes one at a time, and the time to publish `count` more 256 at a time.
fn raw_publishes(server: &Server, size: usize, rounds: usize, count: u64) -> (Vec<Duration>, Duration) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let url = server.url();
    runtime.block_on(async move {
        let client = async_nats::connect(url.as_str()).await.expect("the bench connects");
        let context = async_nats::jetstream::new(client);
        let name = format!("BENCH_XSHARD_RAW_{}", std::process::id());
        let subject = format!("bench.xshard.{}", std::process::id());
        let _ = context.delete_stream(&name).await;
        context
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            })
            .await
            .expect("the stream is made");
        let payload = bytes::Bytes::from(vec![0x5a; size]);
        let mut one = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            context.publish(subject.clone(), payload.clone()).await.expect("published").await.expect("acknowledged");
            one.push(start.elapsed());
        }
        let start = Instant::now();
        let mut left = count;
        while left > 0 {
            let window = left.min(256);
            let mut acks = Vec::with_capacity(window as usize);
            for _ in 0..window {
                acks.push(context.publish(subject.clone(), payload.clone()).await.expect("published"));
            }
            for ack in acks {
                ack.await.expect("acknowledged");
            }
            left -= window;
        }
        let many = start.elapsed();
        let _ = context.delete_stream(&name).await;
        (one, many)
    })
}

/// The cross-shard benchmarks: see the module's docs.
fn xshard(server: &Server, options: &Options, report: &mut Report) {
    let names = XSHARD;
    let (rounds, count) = if options.quick { (100, 2_000) } else { (1_000, 20_000) };
    let marks = SharedMarks::default();
    let host = xshard_host(&ClusterConfig::new(server.url()), &marks);
    exchange(&host, "ping", rounds as u64);
    wait_until("every ping answered", || marks.lock().round_trips.len() == rounds);
    let start = Instant::now();
    exchange(&host, "blast", count);
    wait_until("every message taken", || marks.lock().taken == count);
    let blasted = marks.lock().last.expect("taken") - start;
    host.drain();
    // A message's envelope: its topic and body, and four numbers (see `inbox.rs`).
    let (one, many) = raw_publishes(server, 40, rounds, count);
    let halves: Vec<Duration> = marks.lock().round_trips.iter().map(|rtt| *rtt / 2).collect();
    let ours = Sample::of(halves.clone());
    let theirs = Sample::of(one.clone());
    let quantile = |times: &[Duration], q: f64| {
        let mut times = times.to_vec();
        times.sort();
        times[((times.len() - 1) as f64 * q).round() as usize]
    };
    for (name, q) in [(names[0], 0.5), (names[1], 0.99)] {
        let (ours, theirs) = (quantile(&halves, q), quantile(&one, q));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        report.push(
            Record::single(name, "µs", us(ours)).with_baseline(us(theirs), ours.as_secs_f64() / theirs.as_secs_f64()),
        );
    }
    println!(
        "  xshard: one-way p50 {:?} (ping-pong of {rounds}), raw acknowledged publish p50 {:?}; {count} messages in {blasted:?}, raw in {many:?}",
        ours.median, theirs.median
    );
    let rate = count as f64 / blasted.as_secs_f64();
    let raw = count as f64 / many.as_secs_f64();
    report.push(Record::single(names[2], "msgs/s", rate).with_baseline(raw, raw / rate));
}

/// The cross-shard benchmarks' names.
const XSHARD: [&str; 3] = ["jetstream/xshard-latency-p50", "jetstream/xshard-latency-p99", "jetstream/xshard-msgs"];

pub(crate) fn run(options: &Options, report: &mut Report) {
    let (p50_name, p99_name) = ("jetstream/failover-p50", "jetstream/failover-p99");
    let failovers = options.selected(p50_name) || options.selected(p99_name);
    let crossings = XSHARD.iter().any(|name| options.selected(name));
    if !failovers && !crossings {
        return;
    }
    let server = match crate::durable::jetstream() {
        Ok(server) => server,
        Err(why) => {
            println!("jetstream/: skipped: {why}");
            return;
        }
    };
    if crossings {
        xshard(server, options, report);
    }
    if !failovers {
        return;
    }
    let config = ClusterConfig::new(server.url());
    let rounds = if options.quick { 3 } else { 12 };
    let mut times: Vec<Duration> = (0..rounds).map(|round| failover(&config, round)).collect();
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "  failover over {rounds} rounds, leases of {LEASE:?}: {:?}",
        times.iter().map(|t| t.as_millis()).collect::<Vec<_>>()
    );
    let goal = (LEASE + Duration::from_secs(1)).as_secs_f64() * 1e3;
    for (name, value) in [(p50_name, at(0.5)), (p99_name, at(0.99))] {
        report.push(Record::single(name, "ms", value.as_secs_f64() * 1e3).goal(Condition::median_at_most(goal)));
    }
}
