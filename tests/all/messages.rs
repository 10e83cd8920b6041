use std::sync::mpsc;

use wasmproc::error::{MailboxLimit, SendError};
use wasmproc::scheduler::SpawnOptions;
use wasmproc::{Command, Event, Events, Payload, Pid, Port, Process, Scheduler, SpawnRequest, Status, StepOutput};
use wasmproc_tests::{HANG, Scripted, completion, custom, gate, holder, with_stash};

fn idle_until_message() -> (Scripted, std::sync::Arc<wasmproc_tests::Probe>) {
    Scripted::new(|t| {
        match t.events.iter().find(|e| matches!(e, Event::Message { .. })) {
            Some(Event::Message { body, .. }) => t.out.complete(Ok(body.clone())),
            _ => t.out.set_status(Status::Idle),
        }
        Ok(())
    })
}

#[test]
fn send_to_unknown_or_finished_pid_is_not_found() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let nobody = Pid::from_u64(12345 << 32);
    assert_eq!(s.handle().send(nobody, "t", Payload::empty()), Err(SendError::NotFound(nobody)));
    assert_eq!(s.handle().send(Pid::HOST, "t", Payload::empty()), Err(SendError::NotFound(Pid::HOST)));
    let (p, _) = idle_until_message();
    let h = s.handle().spawn(p, "main").unwrap();
    s.handle().send(h.pid(), "t", Payload::empty()).unwrap();
    h.join_timeout(HANG).unwrap().unwrap();
    assert!(s.handle().wait_idle(Some(HANG)));
    assert_eq!(s.handle().send(h.pid(), "t", Payload::empty()), Err(SendError::NotFound(h.pid())));
}

/// A process whose `close` waits for the test: it is exiting but not yet gone.
struct SlowClose {
    closing: mpsc::Sender<()>,
    release: mpsc::Receiver<()>,
}

impl Process for SlowClose {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        out.complete(Ok(Payload::empty()));
        Ok(())
    }

    fn close(&mut self) {
        self.closing.send(()).unwrap();
        self.release.recv().unwrap();
    }
}

#[test]
fn send_to_an_exiting_process_is_closed() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let (closing_tx, closing) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let h = s.handle().spawn(SlowClose { closing: closing_tx, release: release_rx }, "main").unwrap();
    closing.recv_timeout(HANG).unwrap();
    assert_eq!(s.handle().send(h.pid(), "t", Payload::empty()), Err(SendError::Closed(h.pid())));
    assert_eq!(s.handle().terminate(h.pid()), Err(SendError::Closed(h.pid())));
    release.send(()).unwrap();
    assert_eq!(h.join_timeout(HANG), Some(Ok(Payload::empty())));
}

/// Per-sender order: a process yields 100 sends in one step, the host sends 100 more.
#[test]
fn per_sender_order_is_kept() {
    let s = Scheduler::builder().workers(2).build().unwrap();
    let (receiver, probe) = Scripted::new(|t| {
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let receiver = s.handle().spawn(receiver, "main").unwrap();
    let to = receiver.pid();
    let mut sent = 0;
    let (sender, _) = Scripted::new(move |t| {
        if t.step == 0 {
            for i in 0..100 {
                t.out.yield_command(i, Command::Send { to, topic: "n".into(), body: Payload::u64(i) });
            }
        }
        sent += count_completions(&t.events);
        if sent == 100 {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    let sender = s.handle().spawn(sender, "main").unwrap();
    for i in 0..100 {
        s.handle().send(to, "n", Payload::u64(1000 + i)).unwrap();
    }
    // Wait until all 200 arrived: the receiver stays idle, so poll its probe.
    let deadline = std::time::Instant::now() + HANG;
    while messages_of(&probe.events()).len() < 200 {
        assert!(std::time::Instant::now() < deadline, "messages lost");
        std::thread::yield_now();
    }
    let all = messages_of(&probe.events());
    let from_process: Vec<u64> = all.iter().filter(|(s, _)| *s == sender.pid()).map(|(_, n)| *n).collect();
    let from_host: Vec<u64> = all.iter().filter(|(s, _)| *s == Pid::HOST).map(|(_, n)| *n).collect();
    assert_eq!(from_process, (0..100).collect::<Vec<_>>());
    assert_eq!(from_host, (1000..1100).collect::<Vec<_>>());
    assert_eq!(sender.join_timeout(HANG), Some(Ok(Payload::empty())), "every send completed");
}

fn probe_messages(events: &[Event]) -> usize {
    events.iter().filter(|e| matches!(e, Event::Message { .. })).count()
}

fn count_completions(events: &[Event]) -> usize {
    events.iter().filter(|e| matches!(e, Event::Completion { .. })).count()
}

fn messages_of(events: &[Event]) -> Vec<(Pid, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message { sender, body, .. } => Some((*sender, body.to_u64().unwrap())),
            _ => None,
        })
        .collect()
}

/// A full mailbox is an error to the sender, never unbounded growth; draining frees it.
#[test]
fn full_mailbox_is_an_error_to_the_sender() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let (gate, stop) = gate();
    let (p, probe) = Scripted::new(move |t| {
        if t.step == 0 {
            // Hold the worker so nothing drains the mailbox while the test fills it.
            stop.wait();
            t.out.set_status(Status::Idle);
        } else if probe_messages(&t.events) == 2 {
            t.out.complete(Ok(Payload::empty()));
        } else {
            t.out.complete(Err(format!("expected 2 messages, got {:?}", t.events)));
        }
        Ok(())
    });
    let h = s.handle().spawn(p, SpawnOptions::new("main").mailbox_capacity(2)).unwrap();
    gate.wait_reached();
    s.handle().send(h.pid(), "a", Payload::empty()).unwrap();
    s.handle().send(h.pid(), "b", Payload::empty()).unwrap();
    let err = s.handle().send(h.pid(), "c", Payload::empty()).unwrap_err();
    assert_eq!(err, SendError::MailboxFull { pid: h.pid(), limit: MailboxLimit::Messages(2) });
    assert!(err.to_string().contains("mailbox of process") && err.to_string().contains("full"), "{err}");
    gate.open();
    assert_eq!(h.join_timeout(HANG), Some(Ok(Payload::empty())));
    assert_eq!(probe.steps(), 2);
}

/// A mailbox is bounded in bytes too: a message that would take its undelivered messages
/// past `mailbox_bytes` is refused with the same error as a full mailbox, naming the
/// bound; an empty mailbox takes any one message; reading frees the bytes.
#[test]
fn a_mailbox_full_in_bytes_is_an_error_to_the_sender() {
    let s = Scheduler::builder().workers(1).mailbox_bytes(1000).build().unwrap();
    let (gate, stop) = gate();
    // Steps 0 and 1 hold the worker at the gate while the test sends; step 1 has read
    // the two messages taken during step 0, step 2 the one taken during step 1.
    let (p, probe) = Scripted::new(move |t| {
        match t.step {
            0 | 1 => {
                stop.wait();
                t.out.set_status(Status::Idle);
            }
            _ => t.out.complete(Ok(Payload::empty())),
        }
        Ok(())
    });
    let h = s.handle().spawn(p, "main").unwrap();
    gate.wait_reached();
    let body = |len| Payload::bytes(vec![0; len]);
    s.handle().send(h.pid(), "a", body(599)).unwrap();
    s.handle().send(h.pid(), "b", body(399)).unwrap();
    let err = s.handle().send(h.pid(), "c", Payload::empty()).unwrap_err();
    assert_eq!(err, SendError::MailboxFull { pid: h.pid(), limit: MailboxLimit::Bytes(1000) });
    let text = err.to_string();
    assert!(text.starts_with("mailbox of process") && text.contains("1000 bytes") && text.contains("`mailbox_bytes`"));
    gate.open();
    // Step 1 read both: the mailbox is empty again, and takes one message larger than
    // its whole bound.
    gate.wait_reached();
    s.handle().send(h.pid(), "d", body(5000)).unwrap();
    let err = s.handle().send(h.pid(), "e", Payload::empty()).unwrap_err();
    assert_eq!(err, SendError::MailboxFull { pid: h.pid(), limit: MailboxLimit::Bytes(1000) });
    gate.open();
    assert_eq!(h.join_timeout(HANG), Some(Ok(Payload::empty())));
    assert_eq!(probe.steps(), 3);
}

/// DESIGN 10: terminate works on idle, blocked and ready processes; the result is
/// "terminated", the pid is gone, monitors hear of it.
#[test]
fn terminate_idle_blocked_and_ready_processes() {
    let (builder, _stashed) = with_stash(1);
    let s = builder.build().unwrap();
    let (idle, idle_probe) = idle_until_message();
    let (blocked, blocked_probe) = Scripted::new(|t| {
        t.out.yield_command(1, custom("stash"));
        Ok(())
    });
    let idle = s.handle().spawn(idle, "main").unwrap();
    let blocked = s.handle().spawn(blocked, "main").unwrap();

    // A process that monitors both and reports the exits it saw.
    let targets = [idle.pid(), blocked.pid()];
    let (monitor, _) = Scripted::new(move |t| {
        if t.step == 0 {
            for (i, pid) in targets.into_iter().enumerate() {
                t.out.yield_command(i as u64, Command::Monitor(pid));
            }
        }
        let exits: Vec<_> = t.events.iter().filter(|e| matches!(e, Event::Exit { .. })).cloned().collect();
        if !exits.is_empty() {
            t.out.complete(Ok(Payload::json(&format!("{exits:?}")).unwrap()));
        }
        Ok(())
    });
    // Wait until both targets have parked, so the terminations below hit idle and
    // blocked processes, not ready ones.
    let deadline = std::time::Instant::now() + HANG;
    while idle_probe.steps() == 0 || blocked_probe.steps() == 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    let monitor = s.handle().spawn(monitor, "main").unwrap();

    // Ready: with the only worker held by a step, a fresh process stays queued.
    let (holder, gate) = holder();
    let holder = s.handle().spawn(holder, "main").unwrap();
    gate.wait_reached();
    let (ready, ready_probe) = idle_until_message();
    let ready = s.handle().spawn(ready, "main").unwrap();
    s.handle().terminate(ready.pid()).unwrap();
    s.handle().terminate(idle.pid()).unwrap();
    s.handle().terminate(blocked.pid()).unwrap();
    gate.open();

    for h in [&ready, &idle, &blocked] {
        assert_eq!(h.join_timeout(HANG), Some(Err(wasmproc::ExitReason::Terminated)));
    }
    assert_eq!(ready_probe.steps(), 0, "terminated before it ever ran");
    holder.join_timeout(HANG).unwrap().unwrap();
    let report = monitor.join_timeout(HANG).unwrap().unwrap();
    let report: String = report.parse_json().unwrap();
    assert!(report.contains("reason: Terminated"), "{report}");
    for h in [&ready, &idle, &blocked] {
        assert_eq!(s.handle().send(h.pid(), "t", Payload::empty()), Err(SendError::NotFound(h.pid())));
        assert_eq!(s.handle().terminate(h.pid()), Err(SendError::NotFound(h.pid())));
    }
    assert_eq!(idle_probe.closes() + blocked_probe.closes() + ready_probe.closes(), 3);
}

/// The `terminate` command completes once the target has ended: a send right after it
/// finds nothing.
#[test]
fn terminate_command_completes_after_the_target_is_gone() {
    let s = Scheduler::builder().workers(2).build().unwrap();
    let (target, _) = idle_until_message();
    let target = s.handle().spawn(target, "main").unwrap();
    let pid = target.pid();
    let (killer, probe) = Scripted::new(move |t| {
        match t.step {
            0 => t.out.yield_command(1, Command::Terminate(pid)),
            1 => t.out.yield_command(2, Command::Send { to: pid, topic: "t".into(), body: Payload::empty() }),
            _ => t.out.complete(Ok(Payload::empty())),
        }
        Ok(())
    });
    s.handle().spawn(killer, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
    assert_eq!(target.join_timeout(HANG), Some(Err(wasmproc::ExitReason::Terminated)));
    let events = probe.events();
    assert_eq!(completion(&events[0], 1), Some(&Ok(Payload::empty())));
    let error = completion(&events[1], 2).unwrap().as_ref().unwrap_err();
    assert!(error.starts_with(&format!("no process {pid}")), "{error}");
}

/// `spawn` with `monitor` and the `monitor` command both deliver the child's result;
/// monitoring a pid that does not exist reports `noproc` at once.
#[test]
fn monitors_receive_exits_with_results() {
    let s = Scheduler::builder()
        .workers(2)
        .kind("square", || {
            let (p, _) = Scripted::with_entries(&["square"], |t| {
                let n = 7u64;
                t.out.complete(Ok(Payload::u64(n * n)));
                Ok(())
            });
            Ok(Box::new(p) as Box<dyn Process>)
        })
        .build()
        .unwrap();
    let nobody = Pid::from_u64(99 << 40);
    let (parent, probe) = Scripted::new(move |t| {
        if t.step == 0 {
            let request = SpawnRequest {
                kind: Some("square".into()),
                method: "square".into(),
                monitor: true,
                input: vec![],
                link: false,
            };
            t.out.yield_command(1, Command::Spawn(request));
            t.out.yield_command(2, Command::Monitor(nobody));
        }
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let parent_pid = s.handle().spawn(parent, "main").unwrap().pid();
    let deadline = std::time::Instant::now() + HANG;
    loop {
        let events = probe.events();
        let exits: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Exit { pid, reason, .. } => Some((*pid, reason.clone())),
                _ => None,
            })
            .collect();
        if exits.len() == 2 {
            let child = events
                .iter()
                .find_map(|e| completion(e, 1))
                .and_then(|r| r.as_ref().ok())
                .and_then(Payload::to_u64)
                .map(Pid::from_u64)
                .unwrap();
            assert!(exits.contains(&(child, wasmproc::ExitReason::Normal(Payload::u64(49)))), "{exits:?}");
            assert!(exits.contains(&(nobody, wasmproc::ExitReason::Noproc)), "{exits:?}");
            // The spawn completion always precedes the child's exit.
            let spawn_at = events.iter().position(|e| completion(e, 1).is_some()).unwrap();
            let exit_at = events.iter().position(|e| matches!(e, Event::Exit { pid, .. } if *pid == child)).unwrap();
            assert!(spawn_at < exit_at);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "exits missing: {events:?}");
        std::thread::yield_now();
    }
    s.handle().terminate(parent_pid).unwrap();
}

/// A native process sends as itself through its port in the middle of a step: the
/// message arrives with its pid as the sender, before the step has ended. The checks are
/// those of a yielded `send`: without the capability the port refuses, and a port kept
/// past its process's end says so.
#[test]
fn a_native_process_sends_as_itself_through_its_port() {
    let s = Scheduler::builder().workers(2).build().unwrap();
    let (receiver, _) = idle_until_message();
    let receiver = s.handle().spawn(receiver, "main").unwrap();
    let to = receiver.pid();
    let (kept_tx, kept_rx) = mpsc::channel::<Port>();
    let (sender, _) = Scripted::new(move |t| {
        t.port.send(to, "hello", Payload::text(format!("from {}", t.pid)))?;
        kept_tx.send(t.port.clone()).expect("the test waits for the port");
        t.out.complete(Ok(Payload::empty()));
        Ok(())
    });
    let sender = s.handle().spawn(sender, "main").unwrap();
    let body = receiver.join_timeout(HANG).unwrap().unwrap();
    assert_eq!(body.as_str(), Some(format!("from {}", sender.pid()).as_str()));
    sender.join_timeout(HANG).unwrap().unwrap();
    let kept = kept_rx.recv_timeout(HANG).unwrap();
    assert_eq!(kept.pid(), sender.pid());
    assert!(s.handle().wait_idle(Some(HANG)));
    assert_eq!(kept.send(to, "late", Payload::empty()), Err(wasmproc::error::PortError::Ended(sender.pid())));
    assert!(kept.is_terminating(), "an ended process's port says so");

    let (denied, _) = Scripted::new(|t| {
        let refused = t.port.send(t.pid, "self", Payload::empty());
        t.out.complete(Ok(Payload::text(refused.map_err(|e| e.to_string()).err().unwrap_or_default())));
        Ok(())
    });
    let options = SpawnOptions::new("main").capabilities(wasmproc::Capabilities::default().deny("send"));
    let denied = s.handle().spawn(denied, options).unwrap();
    assert_eq!(denied.join_timeout(HANG).unwrap().unwrap().as_str(), Some("permission denied: send"));
    s.stop(std::time::Duration::from_secs(1));
}
