//! Links and exit signals between processes of different nodes, on a real `nats-server`
//! (see `cluster.rs`): what propagates across nodes and what does not, trapped exits and
//! their order after the messages sent before them, the untrappable `kill`, `noproc` for
//! a link to a process that is gone, the grants a link or an exit signal needs and the
//! own-child rule, `max_links`, spawn with `link` to another node, and `noconnection` to
//! the partners of a node's processes when the node is killed or a client's run ends.
//! Most nodes are schedulers in this test process, so each side's processes are native
//! and watched directly; the killed node is a `wasmproc node` running a Wasm guest.
//!
//! Every wait is bounded; nothing asserts on timing.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{sha256, wasmproc};
use wasmproc::cluster::{Client, ClusterConfig, Placement};
use wasmproc::scheduler::{ProcessHandle, SpawnOptions};
use wasmproc::{
    Capabilities, Command, Event, ExitReason, ExitSignal, Exited, Payload, Pid, Scheduler, SpawnRequest, Status,
};
use wasmproc_tests::Killed;
use wasmproc_tests::nats::{Node, Server, kind};
use wasmproc_tests::{Probe, Scripted, completion};

const SECRET: &str = "test-secret";
/// The bound of every wait in these tests.
const PATIENCE: Duration = Duration::from_secs(60);

/// Node `name` in this process, with the kinds `waiter` (a [`waiter`] that neither traps
/// nor links) and `fails` (ends at once with the error `the child failed`); `config` and
/// `tune` set the rest of its membership and its scheduler.
fn node(
    server: &Server,
    name: &str,
    config: impl FnOnce(ClusterConfig) -> ClusterConfig,
    tune: impl FnOnce(wasmproc::scheduler::Builder) -> wasmproc::scheduler::Builder,
) -> Node {
    let config = config(ClusterConfig::new(server.url()).name(name).secret(SECRET).placement(Placement::Local));
    let fails = || {
        Scripted::new(|t| {
            t.out.complete(Err("the child failed".into()));
            Ok(())
        })
        .0
    };
    let builder =
        Scheduler::builder().workers(2).kind("waiter", kind(|| waiter(false, None).0)).kind("fails", kind(fails));
    Node::join(config, tune(builder))
}

/// Two nodes, `a` and `b`, that see each other and spawn where they are told.
fn two_nodes(server: &Server) -> (Node, Node) {
    let a = node(server, "a", |c| c, |b| b);
    let b = node(server, "b", |c| c, |b| b);
    a.wait_for(2);
    b.wait_for(2);
    (a, b)
}

/// Waits for the next events; ends at a cancel.
fn idle_until_cancelled(t: &mut wasmproc_tests::Turn<'_>) {
    if t.events.iter().any(|e| matches!(e, Event::Cancel { .. })) {
        t.out.complete(Ok(Payload::empty()));
    } else {
        t.out.set_status(Status::Idle);
    }
}

/// A process that traps exits if `trap` (tag 0), links to `link` if given (tag 1), and
/// then waits until it is ended or cancelled; its probe sees every event.
fn waiter(trap: bool, link: Option<Pid>) -> (Scripted, Arc<Probe>) {
    Scripted::new(move |t| {
        if t.step == 0 {
            if trap {
                t.out.yield_command(0, Command::TrapExits(true));
            }
            if let Some(partner) = link {
                t.out.yield_command(1, Command::Link(partner));
            }
        }
        idle_until_cancelled(t);
        Ok(())
    })
}

/// A [`waiter`] on `node`, trapping exits and linked (as asked) once this returns.
fn started(node: &Node, trap: bool, link: Option<Pid>) -> (ProcessHandle, Arc<Probe>) {
    let (process, probe) = waiter(trap, link);
    let handle = node.scheduler.handle().spawn(process, "main").expect("spawns");
    if trap {
        wait_for_event(&probe, |e| completion(e, 0).is_some());
    }
    if link.is_some() {
        let linked = wait_for_event(&probe, |e| completion(e, 1).is_some());
        assert_eq!(completion(&linked, 1), Some(&Ok(Payload::empty())), "the link is made");
    }
    (handle, probe)
}

/// Links to `partner` (tag 0), then sends it `messages` messages (topic `m`, bodies 0,
/// 1, …) and ends with `result`; a link refused ends it with the refusal as its error.
fn links_then_ends(partner: Pid, messages: u64, result: Result<Payload, String>) -> Scripted {
    let mut result = Some(result);
    Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(0, Command::Link(partner));
            return Ok(());
        }
        match t.events.iter().find_map(|e| completion(e, 0)) {
            Some(Ok(_)) => {
                for n in 0..messages {
                    t.port.send(partner, "m", Payload::u64(n)).expect("queued for the other node");
                }
                t.out.complete(result.take().expect("ends once"));
            }
            Some(Err(refused)) => t.out.complete(Err(refused.clone())),
            None => t.out.set_status(Status::Blocked),
        }
        Ok(())
    })
    .0
}

/// Yields one command a step, each once the one before has completed, as `next` picks
/// it from the results so far (its tag: its place); then completes with every result as
/// text (`ok` or the error), or, if `fails`, ends with the error `the sequence fails`.
/// Exit events (of monitors, or trapped) go to its probe only.
fn sequence(
    fails: bool,
    mut next: impl FnMut(&[wasmproc::Outcome]) -> Option<Command> + Send + 'static,
) -> (Scripted, Arc<Probe>) {
    let mut results: Vec<wasmproc::Outcome> = Vec::new();
    let mut waiting = false;
    Scripted::new(move |t| {
        for event in &t.events {
            if let Event::Completion { tag, result } = event {
                assert_eq!(*tag as usize, results.len(), "one command at a time");
                results.push(result.clone());
                waiting = false;
            }
        }
        if waiting {
            t.out.set_status(Status::Blocked);
            return Ok(());
        }
        match next(&results) {
            Some(command) => {
                t.out.yield_command(results.len() as u64, command);
                waiting = true;
            }
            None if fails => t.out.complete(Err("the sequence fails".into())),
            None => {
                let texts: Vec<String> = results.iter().map(text).collect();
                t.out.complete(Ok(Payload::json(&texts).expect("text")));
            }
        }
        Ok(())
    })
}

/// `ok`, or the error.
fn text(result: &wasmproc::Outcome) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(error) => error.clone(),
    }
}

/// A [`sequence`] of `commands`, spawned on `node`: what each completed with.
fn results_of(node: &Node, commands: Vec<Command>) -> (Pid, Vec<String>) {
    let mut commands = commands.into_iter();
    let process = node.scheduler.handle().spawn(sequence(false, move |_| commands.next()).0, "main").unwrap();
    let results = process.join_timeout(PATIENCE).expect("it ends").expect("it succeeds");
    (process.pid(), results.decode().expect("a list"))
}

/// Waits until `probe` has seen an event that `wanted` picks, and returns it.
fn wait_for_event(probe: &Probe, wanted: impl Fn(&Event) -> bool) -> Event {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(event) = probe.events().into_iter().find(|e| wanted(e)) {
            return event;
        }
        assert!(Instant::now() < deadline, "no such event in {:?}", probe.events());
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn ended(handle: &ProcessHandle) -> Exited {
    handle.wait_timeout(PATIENCE).expect("the process ends")
}

/// The exit events `probe` has seen, in order.
fn exits(probe: &Probe) -> Vec<Event> {
    probe.events().into_iter().filter(|e| matches!(e, Event::Exit { .. })).collect()
}

/// An abnormal exit on one node ends the linked process on the other with its reason,
/// naming the process whose signal ended it; a normal exit ends nothing: a message sent
/// after it, on the same ordered link between the nodes, finds its partner running.
#[test]
fn an_abnormal_exit_ends_a_partner_on_another_node_and_a_normal_one_does_not() {
    let server = Server::start().expect("a nats-server on loopback");
    let (a, b) = two_nodes(&server);

    let (partner, partner_probe) = started(&b, false, None);
    let dying = a.scheduler.handle().spawn(links_then_ends(partner.pid(), 0, Err("boom".into())), "main").unwrap();
    assert_eq!(ended(&dying).reason, ExitReason::Error("boom".into()));
    let exited = ended(&partner);
    assert_eq!(exited.reason, ExitReason::Error("boom".into()));
    assert_eq!(exited.signal_from, Some(dying.pid()), "its end names the process of node `a` that ended it");
    assert_eq!(exited.to_string(), format!("exited because linked process {} returned an error: boom", dying.pid()));
    assert!(exits(&partner_probe).is_empty(), "it does not trap exits");

    let (partner, partner_probe) = started(&b, false, None);
    let fine =
        a.scheduler.handle().spawn(links_then_ends(partner.pid(), 0, Ok(Payload::text("fine"))), "main").unwrap();
    assert_eq!(fine.join_timeout(PATIENCE), Some(Ok(Payload::text("fine"))));
    // Nothing else runs on `a`: once it is idle, the exit signal has been queued for `b`,
    // before the message below.
    assert!(a.scheduler.handle().wait_idle(Some(PATIENCE)), "node `a` is idle");
    a.scheduler.handle().send(partner.pid(), "still", Payload::empty()).expect("queued for node `b`");
    wait_for_event(&partner_probe, |e| matches!(e, Event::Message { topic, .. } if topic == "still"));
    assert!(exits(&partner_probe).is_empty(), "{:?}", partner_probe.events());
    b.scheduler.handle().terminate(partner.pid()).unwrap();
    assert_eq!(ended(&partner).reason, ExitReason::Terminated);
}

/// A process that traps exits gets the exits of its partners on another node as events,
/// normal ones too, each after the messages its partner sent before it ended.
#[test]
fn trapped_exits_from_another_node_come_as_events_after_the_messages_sent_before_them() {
    let server = Server::start().expect("a nats-server on loopback");
    let (a, b) = two_nodes(&server);

    let (trapping, probe) = started(&a, true, None);
    let failing = b.scheduler.handle().spawn(links_then_ends(trapping.pid(), 3, Err("boom".into())), "main").unwrap();
    let fine =
        b.scheduler.handle().spawn(links_then_ends(trapping.pid(), 0, Ok(Payload::text("fine"))), "main").unwrap();
    let exit_of = |pid: Pid| wait_for_event(&probe, move |e| matches!(e, Event::Exit { pid: p, .. } if *p == pid));
    assert_eq!(
        exit_of(failing.pid()),
        Event::Exit { pid: failing.pid(), reason: ExitReason::Error("boom".into()), linked: true }
    );
    assert_eq!(
        exit_of(fine.pid()),
        Event::Exit { pid: fine.pid(), reason: ExitReason::Normal(Payload::text("fine")), linked: true }
    );
    let from_failing: Vec<Event> = probe
        .events()
        .into_iter()
        .filter(|e| match e {
            Event::Message { sender, .. } | Event::Exit { pid: sender, .. } => *sender == failing.pid(),
            _ => false,
        })
        .collect();
    let message = |n| Event::Message { sender: failing.pid(), topic: "m".into(), body: Payload::u64(n) };
    assert_eq!(
        from_failing,
        [
            message(0),
            message(1),
            message(2),
            Event::Exit { pid: failing.pid(), reason: ExitReason::Error("boom".into()), linked: true }
        ],
        "the messages, then the exit"
    );
    assert!(trapping.wait_timeout(Duration::ZERO).is_none(), "the trapping process still runs");
    a.scheduler.handle().terminate(trapping.pid()).unwrap();
    ended(&trapping);
}

/// An exit signal to a process of another node: trapped as an event when it traps exits,
/// but `kill` ends it all the same, with `killed`, which its partner on the first node
/// then gets (and may trap).
#[test]
fn kill_cannot_be_trapped_across_nodes_and_its_partners_get_killed() {
    let server = Server::start().expect("a nats-server on loopback");
    let (a, b) = two_nodes(&server);

    let (target, target_probe) = started(&b, true, None);
    let (partner, partner_probe) = started(&a, true, Some(target.pid()));
    let exit = |reason, kill| Command::Exit(ExitSignal { to: target.pid(), reason, kill });
    let (signaller, results) = results_of(&a, vec![exit(ExitReason::Shutdown, false)]);
    assert_eq!(results, ["ok"]);
    assert_eq!(
        wait_for_event(&target_probe, |e| matches!(e, Event::Exit { pid, .. } if *pid == signaller)),
        Event::Exit { pid: signaller, reason: ExitReason::Shutdown, linked: true },
        "a trappable signal is an event"
    );

    let (killer, results) = results_of(&a, vec![exit(ExitReason::Normal(Payload::empty()), true)]);
    assert_eq!(results, ["ok"]);
    let exited = ended(&target);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Killed, Some(killer)), "kill is not trapped");
    assert_eq!(
        wait_for_event(&partner_probe, |e| matches!(e, Event::Exit { pid, .. } if *pid == target.pid())),
        Event::Exit { pid: target.pid(), reason: ExitReason::Killed, linked: true },
        "the partner of a killed process gets `killed`, and may trap it"
    );
    assert!(partner.wait_timeout(Duration::ZERO).is_none(), "the trapping partner still runs");
    a.scheduler.handle().terminate(partner.pid()).unwrap();
    ended(&partner);
}

/// A link to a process of another node that has ended gives `noproc` at once: an event
/// to a process that traps exits, the end of one that does not. A link to a pid of a
/// node that is not in the cluster gives `noconnection`, naming the node by its id.
#[test]
fn a_link_to_a_process_gone_from_another_node_gives_noproc_at_once() {
    let server = Server::start().expect("a nats-server on loopback");
    let (a, b) = two_nodes(&server);
    let (gone, _) = results_of(&b, vec![]);

    let (trapping, probe) = started(&a, true, Some(gone));
    assert_eq!(
        wait_for_event(&probe, |e| matches!(e, Event::Exit { .. })),
        Event::Exit { pid: gone, reason: ExitReason::Noproc, linked: true }
    );
    let plain = a.scheduler.handle().spawn(waiter(false, Some(gone)).0, "main").unwrap();
    let exited = ended(&plain);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Noproc, Some(gone)));

    let absent = 77;
    assert!(a.cluster.nodes().iter().all(|n| n.id != absent), "node {absent} is not in the cluster");
    let nowhere = Pid::from_u64(5).with_node(absent);
    let plain = a.scheduler.handle().spawn(waiter(false, Some(nowhere)).0, "main").unwrap();
    let exited = ended(&plain);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Noconnection(absent.to_string()), Some(nowhere)));
    a.scheduler.handle().terminate(trapping.pid()).unwrap();
    ended(&trapping);
}

/// The completions `probe` has seen, as text, in the order they came.
fn completions(probe: &Probe) -> Vec<String> {
    probe
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Completion { result, .. } => Some(text(result)),
            _ => None,
        })
        .collect()
}

/// Over a process of another node, `link`, `exit` and `terminate` need their grants, as
/// on one node, and a process holds all three over its own children without them: the
/// child's node checks whose child it is. A refused link leaves no half behind: the
/// process that asked for it fails, and its would-be partner runs on.
#[test]
fn links_exits_and_terminations_across_nodes_need_their_grants_but_over_own_children() {
    let server = Server::start().expect("a nats-server on loopback");
    // Node `a` takes no spawns: its processes' children run on `b`.
    let a = node(
        &server,
        "a",
        |c| c.placement(Placement::LeastLoaded).accepts_spawns(false),
        |b| b.denial_hint(|name| format!("grant `{name}`")),
    );
    let b = node(&server, "b", |c| c, |b| b);
    a.wait_for_accepting(1);
    b.wait_for(2);
    let (stranger, stranger_probe) = started(&b, false, None);
    let stranger = stranger.pid();

    let spawn = || {
        Command::Spawn(SpawnRequest {
            kind: Some("waiter".into()),
            method: "main".into(),
            monitor: true,
            ..Default::default()
        })
    };
    let child = |result: &wasmproc::Outcome| Pid::from_u64(result.as_ref().expect("spawned").to_u64().expect("a pid"));
    let (parent, probe) = sequence(true, move |done| {
        Some(match done.len() {
            0 | 1 => spawn(),
            2 => Command::Link(child(&done[0])),
            3 => Command::Unlink(child(&done[0])),
            4 => Command::Link(stranger),
            5 => Command::Exit(ExitSignal { to: stranger, reason: ExitReason::Shutdown, kill: false }),
            6 => Command::Terminate(stranger),
            7 => Command::Exit(ExitSignal { to: child(&done[0]), reason: ExitReason::Shutdown, kill: true }),
            8 => Command::Terminate(child(&done[1])),
            _ => return None,
        })
    });
    let options = SpawnOptions::new("main").capabilities(Capabilities::over_self());
    let parent = a.scheduler.handle().spawn(parent, options).unwrap();
    assert_eq!(ended(&parent).reason, ExitReason::Error("the sequence fails".into()));
    let results = completions(&probe);
    assert_eq!(
        results[2..],
        [
            "ok",
            "ok",
            "permission denied: link (grant `link`)",
            "permission denied: exit (grant `exit`)",
            "permission denied: terminate (grant `terminate`)",
            "ok",
            "ok",
        ]
    );
    let events = probe.events();
    let children: Vec<Pid> =
        (0..2).map(|tag| child(events.iter().find_map(|e| completion(e, tag)).expect("spawned"))).collect();
    assert!(children.iter().all(|c| c.node() == b.cluster.node()), "the children run on `b`: {children:?}");
    let mut exits: Vec<(Pid, ExitReason, bool)> = exits(&probe)
        .into_iter()
        .filter_map(|e| match e {
            Event::Exit { pid, reason, linked } => Some((pid, reason, linked)),
            _ => None,
        })
        .collect();
    exits.sort_by_key(|(pid, ..)| *pid);
    let mut expected = vec![(children[0], ExitReason::Killed, false), (children[1], ExitReason::Terminated, false)];
    expected.sort_by_key(|(pid, ..)| *pid);
    assert_eq!(exits, expected, "each child's end, as its monitor says");

    // The refused link was taken back: the parent's failure ended no one on `b`.
    assert!(a.scheduler.handle().wait_idle(Some(PATIENCE)), "node `a` is idle");
    a.scheduler.handle().send(stranger, "still", Payload::empty()).expect("queued for node `b`");
    wait_for_event(&stranger_probe, |e| matches!(e, Event::Message { topic, .. } if topic == "still"));
}

/// `max_links` counts links to processes of other nodes, on both sides: a link past the
/// linker's bound fails at once naming the linker, one past its target's bound fails
/// naming the target (and is taken back on the linker's side), and a spawn with `link`
/// past the bound fails before anything starts.
#[test]
fn max_links_counts_links_to_processes_of_other_nodes() {
    let server = Server::start().expect("a nats-server on loopback");
    let a = node(&server, "a", |c| c.placement(Placement::LeastLoaded).accepts_spawns(false), |b| b.max_links(2));
    let b = node(&server, "b", |c| c, |b| b.max_links(1));
    a.wait_for_accepting(1);
    b.wait_for(2);
    let (full, _) = started(&b, false, None);
    let _holder = started(&b, false, Some(full.pid()));
    let targets: Vec<Pid> = (0..3).map(|_| started(&b, false, None).0.pid()).collect();

    let (linker, results) = results_of(
        &a,
        vec![
            Command::Link(full.pid()),
            Command::Link(targets[0]),
            Command::Link(targets[0]),
            Command::Link(targets[1]),
            Command::Link(targets[2]),
            Command::Spawn(SpawnRequest {
                kind: Some("waiter".into()),
                method: "main".into(),
                link: true,
                ..Default::default()
            }),
        ],
    );
    let limit = |pid: Pid, limit: usize| {
        format!("link limit exceeded: process {pid} has {limit} links already, as many as `max_links` ({limit}) allows")
    };
    assert_eq!(
        results,
        [
            limit(full.pid(), 1),
            "ok".to_owned(),
            "ok".to_owned(),
            "ok".to_owned(),
            limit(linker, 2),
            format!("spawn failed: {}", limit(linker, 2)),
        ],
        "the first refused by its target's node, its half taken back, so that two more fit"
    );
}

/// A spawn with `link` placed on another node links parent and child both ways before
/// the child runs: a child that fails at once ends its parent (naming the child on the
/// other node) or, if the parent traps exits, is an event; a parent that fails ends its
/// child there.
#[test]
fn a_child_spawned_with_link_on_another_node_is_linked_both_ways() {
    let server = Server::start().expect("a nats-server on loopback");
    let a = node(&server, "a", |c| c.placement(Placement::LeastLoaded).accepts_spawns(false), |b| b);
    let b = node(&server, "b", |c| c, |b| b);
    a.wait_for_accepting(1);
    b.wait_for(2);
    let spawn_link = |kind: &str| {
        Command::Spawn(SpawnRequest {
            kind: Some(kind.into()),
            method: "main".into(),
            link: true,
            ..Default::default()
        })
    };

    let mut asked = false;
    let request = spawn_link("fails");
    let (parent, _) = Scripted::new(move |t| {
        if !std::mem::replace(&mut asked, true) {
            t.out.yield_command(0, request.clone());
        }
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let parent = a.scheduler.handle().spawn(parent, "main").unwrap();
    let exited = ended(&parent);
    assert_eq!(exited.reason, ExitReason::Error("the child failed".into()));
    let child = exited.signal_from.expect("ended by its child's signal");
    assert_eq!(child.node(), b.cluster.node(), "the child ran on `b`");

    let mut trapped = false;
    let request = spawn_link("fails");
    let (trapping, probe) = Scripted::new(move |t| {
        if !std::mem::replace(&mut trapped, true) {
            t.out.yield_command(0, Command::TrapExits(true));
            t.out.yield_command(1, request.clone());
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let trapping = a.scheduler.handle().spawn(trapping, "main").unwrap();
    let spawned = wait_for_event(&probe, |e| completion(e, 1).is_some());
    let child = Pid::from_u64(completion(&spawned, 1).unwrap().as_ref().expect("spawned").to_u64().unwrap());
    assert_eq!(
        wait_for_event(&probe, |e| matches!(e, Event::Exit { .. })),
        Event::Exit { pid: child, reason: ExitReason::Error("the child failed".into()), linked: true }
    );
    let spawned_at = probe.events().iter().position(|e| completion(e, 1).is_some());
    let exit_at = probe.events().iter().position(|e| matches!(e, Event::Exit { .. }));
    assert!(spawned_at < exit_at, "the spawn's completion, then its child's exit: {:?}", probe.events());
    a.scheduler.handle().terminate(trapping.pid()).unwrap();
    ended(&trapping);

    // The parent ends abnormally: its child on `b`, which would wait for ever, ends.
    assert!(b.scheduler.handle().wait_idle(Some(PATIENCE)), "node `b` is idle before");
    let mut spawned = None;
    let request = spawn_link("waiter");
    let (parent, _) = Scripted::new(move |t| {
        if spawned.is_none() {
            t.out.yield_command(0, request.clone());
            spawned = Some(());
        }
        match t.events.iter().find_map(|e| completion(e, 0)) {
            Some(Ok(_)) => t.out.complete(Err("the parent failed".into())),
            Some(Err(error)) => t.out.complete(Err(format!("no child: {error}"))),
            None => t.out.set_status(Status::Blocked),
        }
        Ok(())
    });
    let parent = a.scheduler.handle().spawn(parent, "main").unwrap();
    assert_eq!(ended(&parent).reason, ExitReason::Error("the parent failed".into()));
    assert!(b.scheduler.handle().wait_idle(Some(PATIENCE)), "the linked child on `b` ended with its parent");
}

/// A `wasmproc node` killed with SIGKILL: the processes of the surviving node linked to
/// its processes (a Wasm guest, fetched by hash) get `noconnection` with the lost node's
/// name, as an event where they trap exits and as their end where they do not.
#[test]
fn a_killed_node_gives_noconnection_to_the_processes_linked_to_its_processes() {
    let server = Server::start().expect("a nats-server on loopback");
    let mut victim = Killed(
        wasmproc()
            .args([
                "node",
                "--cluster",
                &server.url(),
                "--name",
                "victim",
                "--cluster-secret",
                SECRET,
                "--workers",
                "1",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("wasmproc node starts"),
    );
    let survivor = node(&server, "survivor", |c| c, |b| b);
    survivor.wait_for(2);

    let bytes = std::fs::read(wasmproc_tests::guests::SDK_TOUR).expect("the guest");
    let hash = sha256(&bytes);
    survivor.cluster.offer(hash.clone(), bytes);
    let options = SpawnOptions::new("deaf").input(vec![Payload::json(&()).unwrap()]);
    let deaf = survivor.cluster.spawn(Some("victim"), None, Some(hash), options).expect("spawns");
    let deadline = Instant::now() + PATIENCE;
    let deaf_pid = loop {
        if let Some(pid) = deaf.pid() {
            break pid;
        }
        assert!(Instant::now() < deadline, "`deaf` did not start: {:?}", deaf.join_timeout(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(5));
    };
    let (trapping, probe) = started(&survivor, true, Some(deaf_pid));
    let (plain, _) = started(&survivor, false, Some(deaf_pid));

    victim.0.kill().expect("SIGKILL");
    let _ = victim.0.wait();

    let lost = ExitReason::Noconnection("victim".into());
    assert_eq!(
        wait_for_event(&probe, |e| matches!(e, Event::Exit { .. })),
        Event::Exit { pid: deaf_pid, reason: lost.clone(), linked: true }
    );
    let exited = ended(&plain);
    assert_eq!((exited.reason, exited.signal_from), (lost.clone(), Some(deaf_pid)));
    assert_eq!(deaf.join_timeout(PATIENCE), Some(Err(lost)), "its spawner hears the same");
    survivor.scheduler.handle().terminate(trapping.pid()).unwrap();
    ended(&trapping);
}

/// A client that leaves ends its run's processes (cancelled, then killed after the
/// grace): their partners on other nodes hear that end through their links, as from any
/// other process.
#[test]
fn processes_linked_to_a_client_runs_process_hear_its_end_when_the_client_leaves() {
    let server = Server::start().expect("a nats-server on loopback");
    let runtime = wasmproc::wasm::Runtime::new(wasmproc::wasm::Config::default()).expect("a runtime");
    let host_config = ClusterConfig::new(server.url()).name("host").secret(SECRET).grace(Duration::from_millis(100));
    let host = Node::join_loading(host_config, Scheduler::builder().workers(1), &runtime);
    let partners = node(&server, "partners", |c| c.accepts_spawns(false), |b| b);
    host.wait_for(2);
    partners.wait_for(2);

    let client = Client::connect(ClusterConfig::new(server.url()).secret(SECRET)).expect("connects");
    let bytes = std::fs::read(wasmproc_tests::guests::HOSTILE).expect("the guest");
    let hash = sha256(&bytes);
    client.offer(hash.clone(), bytes);
    let spin = client.spawn(Some("host"), None, Some(hash), SpawnOptions::new("spin")).expect("spawns");
    let deadline = Instant::now() + PATIENCE;
    let spin = loop {
        if let Some(pid) = spin.pid() {
            break pid;
        }
        assert!(Instant::now() < deadline, "`spin` did not start: {:?}", spin.join_timeout(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(5));
    };
    let (trapping, probe) = started(&partners, true, Some(spin));
    let (plain, _) = started(&partners, false, Some(spin));

    client.leave();
    // `spin` never reads its cancel: it is killed after the grace.
    assert_eq!(
        wait_for_event(&probe, |e| matches!(e, Event::Exit { .. })),
        Event::Exit { pid: spin, reason: ExitReason::Killed, linked: true }
    );
    let exited = ended(&plain);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Killed, Some(spin)));
    partners.scheduler.handle().terminate(trapping.pid()).unwrap();
    ended(&trapping);
}

/// A Rust guest on two `wasmproc node`s, run by a client (`run --cluster --allow link`,
/// on nodes started with `--allow link`): the sdk-tour's `trapping` entry traps exits,
/// spawns a linked child that fails (placed by load on the other node, as its own node
/// runs the entry) and links to a pid of the other node that names no process; both
/// exits come to it as events, the child's error and `noproc`.
#[test]
fn a_rust_guest_traps_the_exits_of_its_linked_child_and_of_a_dead_pid_on_another_node() {
    let server = Server::start().expect("a nats-server on loopback");
    let _nodes: Vec<Killed> = ["wa", "wb"]
        .iter()
        .map(|name| {
            let child = wasmproc()
                .args(["node", "--cluster", &server.url(), "--name", name, "--cluster-secret", SECRET])
                .args(["--workers", "1", "--allow", "link"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("wasmproc node starts");
            Killed(child)
        })
        .collect();
    let deadline = Instant::now() + PATIENCE;
    let ids: Vec<u16> = loop {
        let out = wasmproc()
            .args(["cluster", "ls", "--json", "--cluster", &server.url(), "--cluster-secret", SECRET])
            .output()
            .expect("cluster ls runs");
        let accepting: Vec<u16> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|node| node["accepts"] == true)
            .filter_map(|node| node["id"].as_u64().and_then(|id| u16::try_from(id).ok()))
            .collect();
        if accepting.len() == 2 {
            break accepting;
        }
        assert!(Instant::now() < deadline, "only {accepting:?} take spawns");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The client places the entry on the less loaded node, the lower id of two idle ones:
    // its child goes to the other, and so does the dead pid.
    let other = *ids.iter().max().expect("two nodes");
    let nobody = Pid::from_u64(999_999).with_node(other);
    let out = wasmproc()
        .args(["run", wasmproc_tests::guests::SDK_TOUR, "--method", "trapping", "--input", &nobody.to_string()])
        .args(["--allow", "link", "--cluster", &server.url(), "--cluster-secret", SECRET])
        .output()
        .expect("run --cluster runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (child, exits): (u64, Vec<(u64, String)>) = serde_json::from_slice(&out.stdout).expect("the entry's result");
    let child = Pid::from_u64(child);
    assert_eq!(child.node(), other, "the linked child ran on the other node");
    let mut expected = vec![(child.as_u64(), "error".to_owned()), (nobody.as_u64(), "noproc".to_owned())];
    expected.sort();
    assert_eq!(exits, expected);
}

/// A link refused for want of its grant takes back only what it made: a process of
/// another node that linked to the refused process first stays linked, and the refused
/// process's failure ends it.
#[test]
fn a_refused_link_leaves_a_link_the_other_side_made_before() {
    let server = Server::start().expect("a nats-server on loopback");
    let (a, b) = two_nodes(&server);
    let (linker, probe) = Scripted::new(|t| {
        let target = t.events.iter().find_map(|e| match e {
            Event::Message { body, .. } => body.to_u64(),
            _ => None,
        });
        if let Some(target) = target {
            t.out.yield_command(0, Command::Link(Pid::from_u64(target)));
        }
        if t.events.iter().any(|e| completion(e, 0).is_some()) {
            t.out.complete(Err("the linker fails".into()));
        } else {
            t.out.set_status(Status::Idle);
        }
        Ok(())
    });
    let options = SpawnOptions::new("main").capabilities(Capabilities::over_self());
    let linker = a.scheduler.handle().spawn(linker, options).unwrap();
    let (partner, _) = started(&b, false, Some(linker.pid()));

    a.scheduler.handle().send(linker.pid(), "link", Payload::u64(partner.pid().as_u64())).unwrap();
    assert_eq!(ended(&linker).reason, ExitReason::Error("the linker fails".into()));
    let refused = probe.events().iter().find_map(|e| completion(e, 0).cloned()).expect("the link completed");
    assert!(refused.as_ref().is_err_and(|e| e.starts_with("permission denied: link")), "{refused:?}");
    let exited = ended(&partner);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Error("the linker fails".into()), Some(linker.pid())));
}
