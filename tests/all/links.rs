//! Links and exit signals on native processes: what propagates, what traps, the order of
//! messages and exits, `unlink`, `demonitor`, `max_links`, spawn with `link`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmproc::scheduler::ProcessHandle;
use wasmproc::{Command, Event, ExitReason, ExitSignal, Payload, Pid, Scheduler, SpawnRequest, Status};
use wasmproc_tests::{HANG, Probe, Scripted, completion};

/// Waits for the next events; ends at the host's cancel (so a test's `stop` is quick).
fn idle_until_cancelled(t: &mut wasmproc_tests::Turn<'_>) {
    if t.events.iter().any(|e| matches!(e, Event::Cancel { .. })) {
        t.out.complete(Ok(Payload::empty()));
    } else {
        t.out.set_status(Status::Idle);
    }
}

/// A process that waits (for anything: exit events included) until it is ended, and
/// traps exits if `trap`, reporting what it received through its probe.
fn waiter(trap: bool) -> (Scripted, Arc<Probe>) {
    Scripted::new(move |t| {
        if t.step == 0 && trap {
            t.out.yield_command(0, Command::TrapExits(true));
        }
        idle_until_cancelled(t);
        Ok(())
    })
}

/// A process that links to `partner` and, once linked, ends with `result`.
fn links_then_ends(partner: Pid, result: Result<Payload, String>) -> Scripted {
    let mut result = Some(result);
    Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(0, Command::Link(partner));
        } else if let Some(linked) = t.events.iter().find_map(|e| completion(e, 0)) {
            assert_eq!(linked, &Ok(Payload::empty()), "the link is made");
            t.out.complete(result.take().expect("ends once"));
        }
        Ok(())
    })
    .0
}

/// Waits until `probe` has seen an event that `wanted` picks, and returns it.
fn wait_for_event(probe: &Probe, wanted: impl Fn(&Event) -> bool) -> Event {
    let deadline = Instant::now() + HANG;
    loop {
        if let Some(event) = probe.events().into_iter().find(|e| wanted(e)) {
            return event;
        }
        assert!(Instant::now() < deadline, "no such event in {:?}", probe.events());
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn scheduler() -> Scheduler {
    Scheduler::builder().workers(2).build().unwrap()
}

fn ended(handle: &ProcessHandle) -> wasmproc::Exited {
    handle.wait_timeout(HANG).expect("the process ends")
}

#[test]
fn an_abnormal_exit_ends_linked_processes_with_its_reason() {
    let s = scheduler();
    let (partner, _) = waiter(false);
    let partner = s.handle().spawn(partner, "main").unwrap();
    let dying = s.handle().spawn(links_then_ends(partner.pid(), Err("boom".into())), "main").unwrap();
    assert_eq!(ended(&dying).reason, ExitReason::Error("boom".into()));
    let exited = ended(&partner);
    assert_eq!(exited.reason, ExitReason::Error("boom".into()));
    assert_eq!(exited.signal_from, Some(dying.pid()), "its end names the process whose signal ended it");
    assert_eq!(exited.to_string(), format!("exited because linked process {} returned an error: boom", dying.pid()));
    s.stop(HANG);
}

#[test]
fn a_normal_exit_ends_no_linked_process() {
    let s = scheduler();
    let (partner, probe) = waiter(false);
    let partner = s.handle().spawn(partner, "main").unwrap();
    let done = s.handle().spawn(links_then_ends(partner.pid(), Ok(Payload::text("fine"))), "main").unwrap();
    assert_eq!(done.join_timeout(HANG), Some(Ok(Payload::text("fine"))));
    // A message after the exit: the partner still runs, and saw no exit event.
    s.handle().send(partner.pid(), "still", Payload::empty()).unwrap();
    wait_for_event(&probe, |e| matches!(e, Event::Message { .. }));
    assert!(!probe.events().iter().any(|e| matches!(e, Event::Exit { .. })), "{:?}", probe.events());
    s.handle().terminate(partner.pid()).unwrap();
    assert_eq!(ended(&partner).reason, ExitReason::Terminated);
    s.stop(HANG);
}

#[test]
fn a_process_that_traps_exits_gets_them_as_events() {
    let s = scheduler();
    let (partner, probe) = waiter(true);
    let partner = s.handle().spawn(partner, "main").unwrap();
    wait_for_event(&probe, |e| completion(e, 0).is_some());
    let normal = s.handle().spawn(links_then_ends(partner.pid(), Ok(Payload::text("fine"))), "main").unwrap();
    let failed = s.handle().spawn(links_then_ends(partner.pid(), Err("boom".into())), "main").unwrap();
    let exit_of = |pid: Pid| wait_for_event(&probe, move |e| matches!(e, Event::Exit { pid: p, .. } if *p == pid));
    assert_eq!(
        exit_of(normal.pid()),
        Event::Exit { pid: normal.pid(), reason: ExitReason::Normal(Payload::text("fine")), linked: true }
    );
    assert_eq!(
        exit_of(failed.pid()),
        Event::Exit { pid: failed.pid(), reason: ExitReason::Error("boom".into()), linked: true }
    );
    assert!(partner.wait_timeout(Duration::from_millis(1)).is_none(), "the trapping partner still runs");
    s.handle().terminate(partner.pid()).unwrap();
    ended(&partner);
    s.stop(HANG);
}

/// Sends `signal` to `to` and ends.
fn signaller(to: Pid, reason: ExitReason, kill: bool) -> Scripted {
    let mut signal = Some(ExitSignal { to, reason, kill });
    Scripted::new(move |t| {
        match signal.take() {
            Some(signal) => t.out.yield_command(0, Command::Exit(signal)),
            None => t.out.complete(Ok(Payload::empty())),
        }
        Ok(())
    })
    .0
}

#[test]
fn exit_signals_follow_the_trapping_rules_and_kill_cannot_be_trapped() {
    let s = scheduler();
    // Normal to a process that does not trap: ignored.
    let (plain, plain_probe) = waiter(false);
    let plain = s.handle().spawn(plain, "main").unwrap();
    let sender = s.handle().spawn(signaller(plain.pid(), ExitReason::Normal(Payload::empty()), false), "main").unwrap();
    sender.join_timeout(HANG).unwrap().unwrap();
    // Abnormal to it: it ends with the reason.
    let sender = s.handle().spawn(signaller(plain.pid(), ExitReason::Shutdown, false), "main").unwrap();
    let exited = ended(&plain);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Shutdown, Some(sender.pid())));
    assert!(!plain_probe.events().iter().any(|e| matches!(e, Event::Exit { .. })));

    // To a process that traps: an event, abnormal or not.
    let (trapping, probe) = waiter(true);
    let trapping = s.handle().spawn(trapping, "main").unwrap();
    wait_for_event(&probe, |e| completion(e, 0).is_some());
    let sender = s.handle().spawn(signaller(trapping.pid(), ExitReason::Shutdown, false), "main").unwrap();
    let event = wait_for_event(&probe, |e| matches!(e, Event::Exit { .. }));
    assert_eq!(event, Event::Exit { pid: sender.pid(), reason: ExitReason::Shutdown, linked: true });
    // `kill` ends it all the same.
    let killer = s.handle().spawn(signaller(trapping.pid(), ExitReason::Shutdown, true), "main").unwrap();
    let exited = ended(&trapping);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Killed, Some(killer.pid())));
    s.stop(HANG);
}

#[test]
fn partners_of_a_killed_process_get_killed_which_they_may_trap() {
    let s = scheduler();
    let (trapping, probe) = waiter(true);
    let trapping = s.handle().spawn(trapping, "main").unwrap();
    wait_for_event(&probe, |e| completion(e, 0).is_some());
    let (plain, _) = waiter(false);
    let plain = s.handle().spawn(plain, "main").unwrap();
    // Links to both, then waits to be killed.
    let partners = [trapping.pid(), plain.pid()];
    let (victim, victim_probe) = Scripted::new(move |t| {
        if t.step == 0 {
            for (tag, pid) in partners.into_iter().enumerate() {
                t.out.yield_command(tag as u64, Command::Link(pid));
            }
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let victim = s.handle().spawn(victim, "main").unwrap();
    wait_for_event(&victim_probe, |e| completion(e, 1).is_some());
    s.handle().spawn(signaller(victim.pid(), ExitReason::Normal(Payload::empty()), true), "main").unwrap();
    assert_eq!(ended(&victim).reason, ExitReason::Killed);
    let event = wait_for_event(&probe, |e| matches!(e, Event::Exit { .. }));
    assert_eq!(event, Event::Exit { pid: victim.pid(), reason: ExitReason::Killed, linked: true });
    let exited = ended(&plain);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Killed, Some(victim.pid())));
    s.stop(HANG);
}

#[test]
fn linking_to_a_process_that_is_gone_is_noproc_at_once() {
    let s = scheduler();
    let gone = s
        .handle()
        .spawn(
            Scripted::new(|t| {
                t.out.complete(Ok(Payload::empty()));
                Ok(())
            })
            .0,
            "main",
        )
        .unwrap();
    gone.join_timeout(HANG).unwrap().unwrap();
    assert!(s.handle().wait_idle(Some(HANG)));
    let nobody = Pid::from_u64(4242 << 32);

    // Not trapping: the linker ends with `noproc`, named as sent by the pid.
    let linker = s.handle().spawn(links_then_ends(gone.pid(), Ok(Payload::empty())), "main").unwrap();
    let exited = ended(&linker);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Noproc, Some(gone.pid())));

    // Trapping: an event, and the link completes.
    let (trapping, probe) = Scripted::new(move |t| {
        match t.step {
            0 => t.out.yield_command(0, Command::TrapExits(true)),
            1 => t.out.yield_command(1, Command::Link(nobody)),
            _ => {}
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let trapping = s.handle().spawn(trapping, "main").unwrap();
    let event = wait_for_event(&probe, |e| matches!(e, Event::Exit { .. }));
    assert_eq!(event, Event::Exit { pid: nobody, reason: ExitReason::Noproc, linked: true });
    assert_eq!(
        wait_for_event(&probe, |e| completion(e, 1).is_some()),
        Event::Completion { tag: 1, result: Ok(Payload::empty()) }
    );
    s.handle().terminate(trapping.pid()).unwrap();
    ended(&trapping);
    s.stop(HANG);
}

#[test]
fn an_exit_arrives_after_the_messages_sent_before_it() {
    let s = scheduler();
    let (partner, probe) = waiter(true);
    let partner = s.handle().spawn(partner, "main").unwrap();
    wait_for_event(&probe, |e| completion(e, 0).is_some());
    let to = partner.pid();
    // Links, then sends 50 messages (yielded and through its port), then fails.
    let (sender, _) = Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(0, Command::Link(to));
            return Ok(());
        }
        if t.step == 1 {
            for i in 0..25u64 {
                t.out.yield_command(1 + i, Command::Send { to, topic: "n".into(), body: Payload::u64(2 * i) });
                t.port.send(to, "n", Payload::u64(2 * i + 1)).unwrap();
            }
            t.out.set_status(Status::Blocked);
        } else {
            t.out.complete(Err("done".into()));
        }
        Ok(())
    });
    let sender = s.handle().spawn(sender, "main").unwrap();
    let exit = wait_for_event(&probe, |e| matches!(e, Event::Exit { .. }));
    assert_eq!(exit, Event::Exit { pid: sender.pid(), reason: ExitReason::Error("done".into()), linked: true });
    let events = probe.events();
    let exit_at = events.iter().position(|e| matches!(e, Event::Exit { .. })).unwrap();
    let messages = events.iter().filter(|e| matches!(e, Event::Message { .. })).count();
    assert!(messages >= 50, "{messages} messages before the exit");
    assert!(
        events[exit_at..].iter().all(|e| !matches!(e, Event::Message { .. })),
        "a message after the exit: {events:?}"
    );
    s.handle().terminate(partner.pid()).unwrap();
    ended(&partner);
    s.stop(HANG);
}

#[test]
fn unlink_removes_the_link_both_ways() {
    let s = scheduler();
    let (partner, _) = waiter(false);
    let partner = s.handle().spawn(partner, "main").unwrap();
    let to = partner.pid();
    let (unlinker, _) = Scripted::new(move |t| {
        match t.step {
            0 => t.out.yield_command(0, Command::Link(to)),
            1 => t.out.yield_command(1, Command::Unlink(to)),
            _ => t.out.complete(Err("failed after unlinking".into())),
        }
        Ok(())
    });
    let unlinker = s.handle().spawn(unlinker, "main").unwrap();
    assert_eq!(ended(&unlinker).reason, ExitReason::Error("failed after unlinking".into()));
    assert!(s.handle().send(partner.pid(), "alive?", Payload::empty()).is_ok(), "the partner still runs");

    // And from the other side: a linked process unlinked by its partner is not ended
    // by the partner's failure.
    let (linked, linked_probe) = waiter(false);
    let linked = s.handle().spawn(linked, "main").unwrap();
    let target = linked.pid();
    let (other, _) = Scripted::new(move |t| {
        match t.step {
            0 => t.out.yield_command(0, Command::Link(target)),
            1 => t.out.yield_command(1, Command::Unlink(target)),
            _ => t.out.complete(Err("boom".into())),
        }
        Ok(())
    });
    let other = s.handle().spawn(other, "main").unwrap();
    ended(&other);
    s.handle().send(linked.pid(), "alive?", Payload::empty()).unwrap();
    wait_for_event(&linked_probe, |e| matches!(e, Event::Message { .. }));
    assert!(linked.wait_timeout(Duration::from_millis(1)).is_none());
    s.stop(HANG);
}

#[test]
fn demonitor_stops_the_exit_event() {
    let s = scheduler();
    let (target, _) = waiter(false);
    let target = s.handle().spawn(target, "main").unwrap();
    let watched = target.pid();
    // Monitors, demonitors, then asks the test to end the target and waits for a
    // message (the test's) that comes after the target's end.
    let (watcher, probe) = Scripted::new(move |t| {
        match t.step {
            0 => t.out.yield_command(0, Command::Monitor(watched)),
            1 => t.out.yield_command(1, Command::Demonitor(watched)),
            _ => {}
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let watcher = s.handle().spawn(watcher, "main").unwrap();
    wait_for_event(&probe, |e| completion(e, 1).is_some());
    s.handle().terminate(target.pid()).unwrap();
    ended(&target);
    assert!(s.handle().send(watcher.pid(), "after", Payload::empty()).is_ok());
    wait_for_event(&probe, |e| matches!(e, Event::Message { .. }));
    assert!(!probe.events().iter().any(|e| matches!(e, Event::Exit { .. })), "{:?}", probe.events());

    s.stop(HANG);
}

#[test]
fn a_link_past_max_links_fails_naming_the_limit() {
    let s = Scheduler::builder().workers(2).max_links(2).kind("fails", fails_at_once).build().unwrap();
    let partners: Vec<_> = (0..3).map(|_| s.handle().spawn(waiter(false).0, "main").unwrap()).collect();
    let pids: Vec<Pid> = partners.iter().map(ProcessHandle::pid).collect();
    let (linker, probe) = Scripted::new(move |t| {
        if t.step == 0 {
            for (tag, pid) in pids.iter().enumerate() {
                t.out.yield_command(tag as u64, Command::Link(*pid));
            }
            let request =
                SpawnRequest { kind: Some("fails".into()), method: "main".into(), link: true, ..Default::default() };
            t.out.yield_command(3, Command::Spawn(request));
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let linker = s.handle().spawn(linker, "main").unwrap();
    let third = wait_for_event(&probe, |e| completion(e, 2).is_some());
    let Event::Completion { result: Err(error), .. } = third else { panic!("the third link succeeded: {third:?}") };
    assert_eq!(
        error,
        format!("link limit exceeded: process {} has 2 links already, as many as `max_links` (2) allows", linker.pid())
    );
    let spawn = wait_for_event(&probe, |e| completion(e, 3).is_some());
    let Event::Completion { result: Err(error), .. } = spawn else { panic!("the linked spawn succeeded: {spawn:?}") };
    assert!(error.contains("`max_links` (2)"), "{error}");
    let first = wait_for_event(&probe, |e| completion(e, 0).is_some());
    assert_eq!(first, Event::Completion { tag: 0, result: Ok(Payload::empty()) });
    s.stop(HANG);
}

/// A kind whose processes fail at their first step.
fn fails_at_once() -> anyhow::Result<Box<dyn wasmproc::Process>> {
    Ok(Box::new(
        Scripted::new(|t| {
            t.out.complete(Err("failed at once".into()));
            Ok(())
        })
        .0,
    ))
}

#[test]
fn a_spawn_with_link_links_before_the_child_runs() {
    let s = Scheduler::builder().workers(2).kind("fails", fails_at_once).build().unwrap();
    // The child fails at its first step, which may run before the parent sees the spawn
    // complete: the parent is still sure to get its exit.
    let (parent, probe) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(0, Command::TrapExits(true));
            t.out.yield_command(
                1,
                Command::Spawn(SpawnRequest {
                    kind: Some("fails".into()),
                    method: "main".into(),
                    link: true,
                    ..Default::default()
                }),
            );
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let parent = s.handle().spawn(parent, "main").unwrap();
    let exit = wait_for_event(&probe, |e| matches!(e, Event::Exit { .. }));
    let spawned = wait_for_event(&probe, |e| completion(e, 1).is_some());
    let Event::Completion { result: Ok(child), .. } = spawned else { panic!("{spawned:?}") };
    let child = Pid::from_u64(child.to_u64().unwrap());
    assert_eq!(exit, Event::Exit { pid: child, reason: ExitReason::Error("failed at once".into()), linked: true });
    s.handle().terminate(parent.pid()).unwrap();
    ended(&parent);

    // Not trapping: the parent ends with the child's reason.
    let (parent, _) = Scripted::new(|t| {
        if t.step == 0 {
            let request =
                SpawnRequest { kind: Some("fails".into()), method: "main".into(), link: true, ..Default::default() };
            t.out.yield_command(0, Command::Spawn(request));
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let parent = s.handle().spawn(parent, "main").unwrap();
    assert_eq!(ended(&parent).reason, ExitReason::Error("failed at once".into()));
    s.stop(HANG);
}

#[test]
fn linked_children_that_end_leave_no_link_behind() {
    let s = Scheduler::builder().workers(2).max_links(4).kind("fails", fails_at_once).build().unwrap();
    // Spawns 200 linked children, four at a time, each failing at once: the exits
    // unlink them, so the parent never holds more than four links, under a `max_links`
    // of four.
    let (parent, _) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(0, Command::TrapExits(true));
        }
        let exits = t.events.iter().filter(|e| matches!(e, Event::Exit { linked: true, .. })).count();
        let failed = t.events.iter().filter_map(|e| match e {
            Event::Completion { result: Err(error), .. } => Some(error.clone()),
            _ => None,
        });
        if let Some(error) = failed.into_iter().next() {
            t.out.complete(Err(error));
            return Ok(());
        }
        let spawns = if t.step == 0 { 4 } else { exits };
        for _ in 0..spawns {
            let request =
                SpawnRequest { kind: Some("fails".into()), method: "main".into(), link: true, ..Default::default() };
            t.out.yield_command(1, Command::Spawn(request));
        }
        idle_until_cancelled(t);
        Ok(())
    });
    let parent = s.handle().spawn(parent, "main").unwrap();
    let deadline = Instant::now() + HANG;
    while s.handle().stats().spawned < 201 {
        assert!(Instant::now() < deadline, "only {} spawned", s.handle().stats().spawned);
        assert!(parent.wait_timeout(Duration::ZERO).is_none(), "the parent ended: {:?}", parent.wait());
        std::thread::sleep(Duration::from_millis(1));
    }
    s.handle().terminate(parent.pid()).unwrap();
    assert_eq!(ended(&parent).reason, ExitReason::Terminated);
    s.stop(HANG);
}

/// Steps of `durable_linker` processes, counted across runs (replays included).
static LINKER_STEPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Waits, linked to nothing, until ended.
fn durable_partner() -> anyhow::Result<Box<dyn wasmproc::Process>> {
    Ok(Box::new(
        Scripted::new(|t| {
            t.out.set_status(Status::Idle);
            Ok(())
        })
        .0,
    ))
}

/// Links to the pid of its input, then waits; fails at a message `fail`.
fn durable_linker() -> anyhow::Result<Box<dyn wasmproc::Process>> {
    Ok(Box::new(
        Scripted::new(|t| {
            LINKER_STEPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if t.step == 0 {
                t.out.yield_command(0, Command::Link(Pid::from_u64(t.input[0].to_u64().unwrap())));
            }
            if t.events.iter().any(|e| matches!(e, Event::Message { topic, .. } if topic == "fail")) {
                t.out.complete(Err("boom".into()));
            } else {
                t.out.set_status(Status::Idle);
            }
            Ok(())
        })
        .0,
    ))
}

fn durable(store: &Arc<wasmproc::journal::MemoryStore>) -> Scheduler {
    Scheduler::builder()
        .workers(1)
        .journal(wasmproc::journal::Journal::with_store(store.clone()))
        .kind("partner", durable_partner)
        .kind("linker", durable_linker)
        .build()
        .unwrap()
}

/// A durable linked pair, stopped once the link is made and resumed from its journal:
/// the link is restored (it is no yield to carry out again: its completion was taken),
/// so the linker's failure after the resume still ends its partner.
#[test]
fn a_durable_linked_pair_keeps_its_link_when_resumed() {
    use wasmproc::scheduler::{SpawnOptions, Spawnable};
    let store = Arc::new(wasmproc::journal::MemoryStore::default());
    let first = durable(&store);
    let partner = first.handle().spawn(Spawnable::kind("partner"), "main").unwrap().pid();
    let options = SpawnOptions::new("main").input(vec![Payload::u64(partner.as_u64())]);
    let linker = first.handle().spawn(Spawnable::kind("linker"), options).unwrap().pid();
    // The step that took the link's completion has run (and was recorded).
    let deadline = Instant::now() + HANG;
    while LINKER_STEPS.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "the linker did not step twice");
        std::thread::sleep(Duration::from_millis(1));
    }
    first.stop(HANG);
    drop(first);

    let second = durable(&store);
    let resumed = second.resumed();
    assert_eq!(resumed.len(), 2, "both resume");
    second.handle().send(linker, "fail", Payload::empty()).unwrap();
    let partner = resumed.iter().find(|h| h.pid() == partner).expect("the partner resumed");
    let exited = ended(partner);
    assert_eq!((exited.reason, exited.signal_from), (ExitReason::Error("boom".into()), Some(linker)));
    second.stop(HANG);
}
