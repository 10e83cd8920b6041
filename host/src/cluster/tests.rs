//! Nodes joined through a real `nats-server` on loopback (`wasmproc_tests::nats`), for
//! what only the crate can reach: the cluster thread's queue and its bound, and frames
//! sealed with the cluster's own key.
//!
//! Every wait is bounded; nothing asserts on timing.

use std::sync::Arc;

use parking_lot::Mutex;
use wasmproc_tests::nats::Server;

use super::shared::Cmd;
use super::wire::{self, Announce, Body, Key, Peer};
use super::{Cluster, ClusterConfig};
use crate::testing::{Idle, PATIENCE, wait_until};
use crate::{Command, Event, Events, ExitReason, Outcome, Payload, Pid, Port, Process, Scheduler, Status, StepOutput};

const SECRET: &str = "test-secret";

/// Monitors each of its targets in its first step; every exit it gets goes to `seen` as
/// it comes, and it completes once it has one of each target.
struct Watcher {
    targets: Vec<Pid>,
    started: bool,
    seen: Arc<Mutex<Vec<(Pid, ExitReason)>>>,
}

impl Process for Watcher {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if !std::mem::replace(&mut self.started, true) {
            for (tag, &target) in self.targets.iter().enumerate() {
                out.yield_command(tag as u64, Command::Monitor(target));
            }
        }
        let mut seen = self.seen.lock();
        for event in events {
            if let Event::Exit { pid, reason, .. } = event {
                seen.push((pid, reason));
            }
        }
        if seen.len() == self.targets.len() {
            out.complete(Ok(Payload::empty()));
        } else {
            out.set_status(Status::Blocked);
        }
        Ok(())
    }
}

/// Monitors of processes on other nodes wait in the cluster thread's queue; with the
/// thread held up (here: blocked on a lock its next announcement takes), the queue takes
/// its bound and the monitors past it get their exit at once, with why; those queued are
/// all carried out once the thread goes on (as monitors of a node that is no member,
/// they end in its `noconnection`). Nothing is lost, and nothing waits without bound.
#[test]
fn monitors_past_the_queue_bound_are_refused_and_those_queued_carried_out() {
    const BOUND: usize = 4;
    const PAST: usize = 2;
    let server = Server::start().expect("a nats-server on loopback");
    let config = ClusterConfig::new(server.url()).name("a").secret(SECRET).max_queued(BOUND);
    let cluster = Cluster::join(config).expect("joins");
    let scheduler = Scheduler::builder().workers(1).cluster(&cluster).build().expect("starts");
    cluster.serve(scheduler.handle().clone());

    // The thread takes commands in order: from this announcement on, it takes none until
    // the lock is let go.
    let held = cluster.inner.code.bytes.write();
    assert!(cluster.inner.commands.send(Cmd::Serve).is_ok());
    let absent = 77;
    let targets: Vec<Pid> = (1..=(BOUND + PAST) as u64).map(|n| Pid::from_u64(n).with_node(absent)).collect();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = Watcher { targets: targets.clone(), started: false, seen: seen.clone() };
    let watcher = scheduler.handle().spawn(watcher, "main").expect("spawns");

    wait_until("the monitors past the bound are refused", || seen.lock().len() >= PAST);
    // Refused or carried out, the node is unreachable: its id, as it has no name.
    let lost = ExitReason::Noconnection(absent.to_string());
    let expected: Vec<(Pid, ExitReason)> = targets[BOUND..].iter().map(|&pid| (pid, lost.clone())).collect();
    assert_eq!(*seen.lock(), expected, "only those past the bound end while the thread is held up");

    drop(held);
    assert_eq!(watcher.join_timeout(PATIENCE), Some(Ok(Payload::empty())), "every monitor got its exit");
    let carried_out = lost;
    let seen = seen.lock();
    assert_eq!(seen.len(), BOUND + PAST, "{seen:?}");
    let mut queued: Vec<&(Pid, ExitReason)> = seen[PAST..].iter().collect();
    queued.sort_by_key(|(pid, _)| *pid);
    for ((pid, result), target) in queued.into_iter().zip(&targets[..BOUND]) {
        assert_eq!((pid, result), (target, &carried_out));
    }
}

/// Yields `commands` in its first step, tagged by their place; every completion goes to
/// `seen` as it comes, and it completes once it has one for each.
struct Yielder {
    commands: Vec<Command>,
    started: bool,
    seen: Arc<Mutex<Vec<(u64, Outcome)>>>,
}

impl Process for Yielder {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if !std::mem::replace(&mut self.started, true) {
            for (tag, command) in self.commands.iter().enumerate() {
                out.yield_command(tag as u64, command.clone());
            }
        }
        let mut seen = self.seen.lock();
        for event in events {
            if let Event::Completion { tag, result } = event {
                seen.push((tag, result.clone()));
            }
        }
        if seen.len() == self.commands.len() {
            out.complete(Ok(Payload::empty()));
        } else {
            out.set_status(Status::Blocked);
        }
        Ok(())
    }
}

/// Terminations of processes on other nodes wait in the same queue: while the cluster's
/// thread is held up, one past the bound fails at once with an error that says why (its
/// `terminate` completes with it); a process that needs nothing of the cluster's thread
/// runs to its end meanwhile; and those queued are carried out once the thread goes on
/// (the node they name is no member: they end in its `noconnection`, not the bound's).
#[test]
fn a_termination_past_the_queue_bound_fails_saying_why_and_the_rest_runs() {
    const BOUND: usize = 2;
    let server = Server::start().expect("a nats-server on loopback");
    let config = ClusterConfig::new(server.url()).name("a").secret(SECRET).max_queued(BOUND);
    let cluster = Cluster::join(config).expect("joins");
    let scheduler = Scheduler::builder().workers(1).cluster(&cluster).build().expect("starts");
    cluster.serve(scheduler.handle().clone());

    let held = cluster.inner.code.bytes.write();
    assert!(cluster.inner.commands.send(Cmd::Serve).is_ok());
    let absent = 77;
    let targets: Vec<Command> =
        (1..=BOUND as u64 + 1).map(|n| Command::Terminate(Pid::from_u64(n).with_node(absent))).collect();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let terminator = Yielder { commands: targets, started: false, seen: seen.clone() };
    let terminator = scheduler.handle().spawn(terminator, "main").expect("spawns");

    wait_until("the termination past the bound fails", || !seen.lock().is_empty());
    let bound = format!("noconnection: {BOUND} commands already wait for the cluster's thread; retry later");
    assert_eq!(*seen.lock(), [(BOUND as u64, Err(bound.clone()))], "only the one past the bound ends while held up");

    let sleeper = Yielder {
        commands: vec![Command::Sleep(std::time::Duration::from_millis(1))],
        started: false,
        seen: Arc::default(),
    };
    let sleeper = scheduler.handle().spawn(sleeper, "main").expect("spawns");
    assert_eq!(sleeper.join_timeout(PATIENCE), Some(Ok(Payload::empty())), "a local process runs meanwhile");

    drop(held);
    assert_eq!(terminator.join_timeout(PATIENCE), Some(Ok(Payload::empty())), "every termination is answered");
    let seen = seen.lock();
    assert_eq!(seen.len(), BOUND + 1, "{seen:?}");
    for (tag, result) in &seen[1..] {
        let error = result.as_ref().expect_err("the node is no member");
        assert!((*tag as usize) < BOUND && error.starts_with("noconnection") && *error != bound, "{tag}: {error}");
    }
}

/// An announcement past the size a node reads on the announcements' subject is refused
/// by its size alone, never opened or decoded: one sealed with the cluster's secret (as
/// anyone holding it can) that says a member leaves is counted refused, and the member
/// stays; the same announcement under the size takes effect, so only its size refused
/// the first.
#[test]
fn an_oversize_announcement_is_refused_unread_and_evicts_no_one() {
    let server = Server::start().expect("a nats-server on loopback");
    let join = |name: &str| Cluster::join(ClusterConfig::new(server.url()).name(name).secret(SECRET)).expect("joins");
    let a = join("a");
    let b = join("b");
    wait_until("a sees b", || a.nodes().iter().any(|n| n.name == "b"));

    let subject = "wasmproc.announce";
    let b_leaves = |seq: u64, padding: usize| {
        let announce = Announce {
            name: "b".to_owned(),
            load: 0,
            accepts: false,
            components: vec!["x".repeat(padding)],
            names: Vec::new(),
            leaving: true,
            seq,
            echo: 0,
            link_start: 0,
        };
        let peer = Peer { node: b.node(), incarnation: b.inner.incarnation };
        Key::new(SECRET.as_bytes()).seal(subject, "", &wire::encode(peer, &Body::Announce(announce)))
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let nats = runtime.block_on(async_nats::connect(server.url())).expect("connects");
    let publish = |frame: Vec<u8>| {
        runtime.block_on(async {
            nats.publish(subject, frame.into()).await.expect("publishes");
            nats.flush().await.expect("flushes");
        });
    };

    // Far past the 64 KiB a node reads there, far under the server's 1 MiB.
    let oversize = b_leaves(1 << 40, 512 << 10);
    let before = a.stats();
    publish(oversize);
    wait_until("a refuses the frame, or takes it", || {
        let now = a.stats();
        now.frames_refused > before.frames_refused || now.nodes_lost > before.nodes_lost
    });
    let after = a.stats();
    assert_eq!(after.nodes_lost, before.nodes_lost, "an oversize announcement was read and taken: {after:?}");
    assert_eq!(after.frames_refused, before.frames_refused + 1, "{after:?}");
    assert!(a.nodes().iter().any(|n| n.name == "b"), "{:?}", a.nodes());

    publish(b_leaves((1 << 40) + 1, 0));
    wait_until("a takes the same announcement under the size", || a.stats().nodes_lost > before.nodes_lost);
}

/// A client is no process: a spawn it asks for with `link` (which its own `spawn` never
/// does, but a client that forges its requests could) is refused by the node, naming
/// why, and nothing starts.
#[test]
fn a_clients_spawn_with_link_is_refused() {
    let server = Server::start().expect("a nats-server on loopback");
    let cluster = Cluster::join(ClusterConfig::new(server.url()).name("a").secret(SECRET)).expect("joins");
    let factory = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Idle)) };
    let scheduler = Scheduler::builder().workers(1).kind("idle", factory).cluster(&cluster).build().expect("starts");
    cluster.serve(scheduler.handle().clone());
    let client = super::Client::connect(ClusterConfig::new(server.url()).secret(SECRET)).expect("connects");
    let spawn = crate::scheduler::remote::RemoteSpawn {
        parent: Pid::HOST,
        kind: Some("idle".into()),
        identity: None,
        method: "main".into(),
        input: vec![],
        caps: crate::Capabilities::default(),
        mailbox_capacity: 0,
        limits: None,
        run_limits: None,
        monitor: true,
        link: true,
        run: Default::default(),
    };
    let spawned = client.spawn_as_is(cluster.node(), spawn);
    assert_eq!(
        spawned.join_timeout(PATIENCE),
        Some(Err(ExitReason::Error("spawn failed: a client's spawn cannot link".into())))
    );
    assert_eq!(scheduler.handle().live(), 0, "nothing started");
}
