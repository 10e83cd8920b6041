use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wasmproc::error::SpawnError;
use wasmproc::{Event, Payload, Scheduler, Status};
use wasmproc_tests::{HANG, Scripted};

fn idle() -> Scripted {
    Scripted::new(|t| {
        t.out.set_status(Status::Idle);
        Ok(())
    })
    .0
}

#[test]
fn max_processes_is_a_clear_spawn_error() {
    let s = Scheduler::builder().workers(1).max_processes(2).build().unwrap();
    let a = s.handle().spawn(idle(), "main").unwrap();
    s.handle().spawn(idle(), "main").unwrap();
    let err = s.handle().spawn(idle(), "main").unwrap_err();
    assert!(matches!(err, SpawnError::LimitExceeded { limit: 2 }));
    assert!(err.to_string().contains("process limit reached: 2"), "{err}");
    s.handle().terminate(a.pid()).unwrap();
    a.join_timeout(HANG).unwrap().unwrap_err();
    s.handle().spawn(idle(), "main").expect("room again after an exit");
}

#[test]
fn spawn_after_stop_is_refused_with_stopping() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let handle = s.handle().clone();
    s.stop(Duration::from_millis(10));
    let err = handle.spawn(idle(), "main").unwrap_err();
    assert!(matches!(err, SpawnError::Stopping), "{err}");
    assert!(handle.is_stopping());
}

fn worker_threads(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// DESIGN 14: cancel reaches every process; those that handle it exit with their own
/// result, those that ignore it are terminated at the deadline; then every thread exits.
#[test]
fn stop_cancels_then_forces_at_the_deadline() {
    let s = Scheduler::builder().workers(2).thread_name("stoptest").build().unwrap();
    // Threads name themselves once they run: wait for all three (two workers, the timer).
    let deadline = Instant::now() + HANG;
    while worker_threads("stoptest") < 3 {
        assert!(Instant::now() < deadline, "scheduler threads did not start");
        std::thread::yield_now();
    }
    let mut polite = Vec::new();
    let mut stubborn = Vec::new();
    for _ in 0..5 {
        let (p, _) = Scripted::new(|t| {
            match t.events.iter().find(|e| matches!(e, Event::Cancel { .. })) {
                Some(Event::Cancel { reason }) => t.out.complete(Ok(Payload::text(format!("cleaned up: {reason}")))),
                _ => t.out.set_status(Status::Idle),
            }
            Ok(())
        });
        polite.push(s.handle().spawn(p, "main").unwrap());
        stubborn.push(s.handle().spawn(idle(), "main").unwrap());
    }
    let start = Instant::now();
    let report = s.stop(Duration::from_millis(200));
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "stopped before the deadline: {elapsed:?}");
    assert!(elapsed < Duration::from_millis(500), "stop(200ms) took {elapsed:?}");
    assert_eq!((report.cancelled, report.forced), (10, 5));
    for h in &polite {
        assert_eq!(h.try_result(), Some(Ok(Payload::text("cleaned up: shutdown"))));
    }
    for h in &stubborn {
        assert_eq!(h.try_result(), Some(Err(wasmproc::ExitReason::Killed)));
    }
    assert_eq!(s.handle().live(), 0);
    assert_eq!(s.handle().registered(), 0);
    assert_eq!(worker_threads("stoptest"), 0, "every scheduler thread has exited");
    assert_eq!(s.stop(Duration::ZERO), wasmproc::scheduler::StopReport::default(), "a second stop is a no-op");
}

/// After `stop` returns, no step is running: a step in progress is waited for.
#[test]
fn stop_waits_for_a_running_step() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = std::sync::mpsc::channel();
    let flag = finished.clone();
    let (p, _) = Scripted::new(move |t| {
        started_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        flag.store(true, Ordering::SeqCst);
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let h = s.handle().spawn(p, "main").unwrap();
    started.recv_timeout(HANG).unwrap();
    s.stop(Duration::ZERO);
    assert!(finished.load(Ordering::SeqCst), "stop returned while a step was running");
    assert_eq!(h.try_result(), Some(Err(wasmproc::ExitReason::Killed)));
}

// --- per-process limits (DESIGN §6): each ends only the process that passes it ----------

/// A process that yields `n` sleeps in its first step and completes in its second.
fn sleeper(n: u64) -> Scripted {
    Scripted::new(move |t| {
        if t.step == 0 {
            for tag in 0..n {
                t.out.yield_command(tag, wasmproc::Command::Sleep(Duration::ZERO));
            }
        } else {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    })
    .0
}

#[test]
fn a_step_yielding_more_than_max_yields_per_step_ends_its_process() {
    let s = Scheduler::builder().workers(1).max_yields_per_step(4).build().unwrap();
    s.handle().spawn(sleeper(4), "main").unwrap().join_timeout(HANG).unwrap().expect("4 yields are within the limit");
    let error =
        wasmproc_tests::said(s.handle().spawn(sleeper(5), "main").unwrap().join_timeout(HANG).unwrap().unwrap_err());
    assert!(error.contains("yield limit exceeded: one step yielded 5 commands"), "{error}");
    assert!(error.contains("`max_yields_per_step` (4)"), "{error}");
    assert_eq!(s.handle().stats().yields, 4, "the refused step's yields were not carried out");
}

#[test]
fn payloads_over_max_payload_size_end_the_process_and_are_not_delivered() {
    let s = Scheduler::builder().workers(1).max_payload_size(100).build().unwrap();
    let (receiver, probe) = Scripted::new(|t| {
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let receiver = s.handle().spawn(receiver, "main").unwrap();
    let to = receiver.pid();
    // `size` bytes of message: the 1-byte topic and the body together.
    let sender = |size: usize| {
        Scripted::new(move |t| {
            if t.step == 0 {
                let body = Payload::bytes(vec![0; size - 1]);
                t.out.yield_command(0, wasmproc::Command::Send { to, topic: "t".into(), body });
            } else {
                t.out.complete(Ok(Payload::empty()));
            }
            Ok(())
        })
        .0
    };
    s.handle().spawn(sender(100), "main").unwrap().join_timeout(HANG).unwrap().expect("100 bytes are allowed");
    let error =
        wasmproc_tests::said(s.handle().spawn(sender(101), "main").unwrap().join_timeout(HANG).unwrap().unwrap_err());
    assert!(error.contains("payload limit exceeded: a 101-byte payload for `send`"), "{error}");
    assert!(s.handle().wait_idle(Some(Duration::from_millis(1))) || s.handle().live() == 1);
    let messages = probe.events().iter().filter(|e| matches!(e, Event::Message { .. })).count();
    assert_eq!(messages, 1, "only the allowed message arrived");

    let big_result = Scripted::new(|t| {
        t.out.complete(Ok(Payload::bytes(vec![1; 101])));
        Ok(())
    });
    let error =
        wasmproc_tests::said(s.handle().spawn(big_result.0, "main").unwrap().join_timeout(HANG).unwrap().unwrap_err());
    assert!(error.contains("for `the result`"), "{error}");
    s.handle().terminate(to).unwrap();
}

/// A step's commands are bounded together as well as each: `max_output_per_step`,
/// four times `max_payload_size` unless set. None of the refused step's is carried out.
#[test]
fn a_step_s_commands_past_max_output_per_step_end_its_process() {
    let s = Scheduler::builder().workers(1).max_payload_size(100).build().unwrap();
    let customs = |n: usize| {
        Scripted::new(move |t| {
            if t.step == 0 {
                for tag in 0..n as u64 {
                    let payload = Payload::bytes(vec![0; 100]);
                    t.out.yield_command(tag, wasmproc::Command::Custom { name: "nothing".into(), payload });
                }
            } else {
                t.out.complete(Ok(Payload::empty()));
            }
            Ok(())
        })
        .0
    };
    s.handle().spawn(customs(4), "main").unwrap().join_timeout(HANG).unwrap().expect("400 bytes are allowed");
    let yields = s.handle().stats().yields;
    let error =
        wasmproc_tests::said(s.handle().spawn(customs(5), "main").unwrap().join_timeout(HANG).unwrap().unwrap_err());
    assert_eq!(
        error,
        "step output limit exceeded: one step's commands and result carry 500 bytes, more than \
         `max_output_per_step` (400 bytes)"
    );
    assert_eq!(s.handle().stats().yields, yields, "the refused step's yields were not carried out");
    let err = |b: wasmproc::scheduler::Builder| b.build().err().unwrap().to_string();
    assert_eq!(
        err(Scheduler::builder().max_payload_size(100).max_output_per_step(99)),
        "`max_output_per_step` (99 bytes) must be at least `max_payload_size` (100 bytes)"
    );
}

#[test]
fn spawning_past_max_children_ends_the_parent() {
    let idle_kind = || -> anyhow::Result<Box<dyn wasmproc::Process>> { Ok(Box::new(idle())) };
    let s = Scheduler::builder().workers(2).max_children(2).kind("idle", idle_kind).build().unwrap();
    let spawn = |tag| {
        let request = wasmproc::SpawnRequest { kind: Some("idle".into()), method: "main".into(), ..Default::default() };
        (tag, wasmproc::Command::Spawn(request))
    };
    // Step 0: two children (at the limit). Step 1, once both spawns completed: one more.
    let (parent, probe) = Scripted::new(move |t| {
        let spawns: &[u64] = match t.step {
            0 => &[0, 1],
            _ if t.events.len() == 2 || t.step > 1 => &[2],
            _ => &[],
        };
        for &tag in spawns {
            let (tag, command) = spawn(tag);
            t.out.yield_command(tag, command);
        }
        Ok(())
    });
    let parent = s.handle().spawn(parent, "main").unwrap();
    let error = wasmproc_tests::said(parent.join_timeout(HANG).unwrap().unwrap_err());
    assert!(error.contains("child limit exceeded: 1 more spawns with 2 children alive"), "{error}");
    assert!(error.contains("`max_children` (2)"), "{error}");
    let children: Vec<_> = probe
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Completion { result: Ok(pid), .. } => pid.to_u64(),
            _ => None,
        })
        .collect();
    assert_eq!(children.len(), 2, "the first two spawns succeeded: {:?}", probe.events());
    // The children live on without their parent (which is counted out just after its
    // result is published).
    let deadline = Instant::now() + HANG;
    while s.handle().live() != 2 {
        assert!(Instant::now() < deadline, "{} processes alive, not the two children", s.handle().live());
        std::thread::yield_now();
    }
}

#[test]
fn children_that_end_give_their_room_back() {
    let quick = || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        Ok(Box::new(
            Scripted::new(|t| {
                t.out.complete(Ok(Payload::empty()));
                Ok(())
            })
            .0,
        ))
    };
    let s = Scheduler::builder().workers(2).max_children(2).kind("quick", quick).build().unwrap();
    let spawn = |t: &mut wasmproc_tests::Turn<'_>, tag| {
        let request = wasmproc::SpawnRequest {
            kind: Some("quick".into()),
            method: "main".into(),
            input: vec![],
            monitor: true,
            link: false,
        };
        t.out.yield_command(tag, wasmproc::Command::Spawn(request));
    };
    // Two children at the limit; once both have exited, two more; then done.
    let mut exits = 0;
    let (parent, _) = Scripted::new(move |t| {
        let before = exits;
        exits += t.events.iter().filter(|e| matches!(e, Event::Exit { .. })).count();
        match (t.step, before, exits) {
            (0, _, _) => (0..2).for_each(|tag| spawn(t, tag)),
            (_, 0 | 1, 2) => (2..4).for_each(|tag| spawn(t, tag)),
            (_, _, 4) => t.out.complete(Ok(Payload::empty())),
            _ => {}
        }
        Ok(())
    });
    s.handle().spawn(parent, "main").unwrap().join_timeout(HANG).unwrap().expect("four children, two at a time");
}
