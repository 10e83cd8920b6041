use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use wasmproc::error::SpawnError;
use wasmproc::{
    Capabilities, Command, Event, Events, Payload, Port, Process, Scheduler, SpawnRequest, Status, StepOutput,
};
use wasmproc_tests::{HANG, Scripted, complete_now, completion, custom};

fn done(turn: &mut wasmproc_tests::Turn<'_>) -> anyhow::Result<()> {
    turn.out.complete(Ok(Payload::empty()));
    Ok(())
}

#[test]
fn unknown_method_error_names_it_and_lists_entries() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let (p, probe) = Scripted::with_entries(&["main", "square"], done);
    let err = s.handle().spawn(p, "nope").unwrap_err();
    assert!(matches!(err, SpawnError::Init { ref method, .. } if method == "nope"));
    let msg = err.to_string();
    assert!(msg.contains("`nope`") && msg.contains("main, square"), "{msg}");
    assert_eq!((probe.steps(), probe.closes()), (0, 1), "never stepped, closed once");
    assert_eq!((s.handle().live(), s.handle().registered(), s.handle().stats().spawned), (0, 0, 0));
}

struct PanicsInInit;

impl Process for PanicsInInit {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        panic!("init exploded")
    }

    fn step(&mut self, _: Events<'_>, _: &mut StepOutput) -> anyhow::Result<()> {
        unreachable!("a process whose init failed is never stepped")
    }
}

#[test]
fn init_panic_is_an_init_error_and_the_host_lives_on() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let err = s.handle().spawn(PanicsInInit, "main").unwrap_err();
    assert!(err.to_string().contains("init panicked: init exploded"), "{err}");
    let (p, _) = Scripted::new(done);
    assert_eq!(s.handle().spawn(p, "main").unwrap().join_timeout(HANG), Some(Ok(Payload::empty())));
}

#[test]
fn spawn_command_reports_a_child_init_error_to_the_parent() {
    let s = Scheduler::builder()
        .workers(1)
        .kind("child", || Ok(Box::new(Scripted::with_entries(&["square"], done).0) as Box<dyn Process>))
        .build()
        .unwrap();
    let (parent, probe) = Scripted::new(|t| {
        if t.step == 0 {
            let request = SpawnRequest { kind: Some("child".into()), method: "cube".into(), ..SpawnRequest::default() };
            t.out.yield_command(1, Command::Spawn(request));
        } else {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    s.handle().spawn(parent, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
    let events = probe.events();
    let error = completion(&events[0], 1).unwrap().as_ref().unwrap_err();
    assert!(error.contains("`cube`") && error.contains("square"), "{error}");
    assert_eq!(s.handle().stats().spawned, 1, "only the parent started");
}

#[test]
fn yields_written_with_complete_are_discarded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let s = Scheduler::builder()
        .workers(1)
        .capabilities(Capabilities::default().allow("count"))
        .handler("count", move |r: wasmproc::handler::Request| {
            counted.fetch_add(1, Ordering::SeqCst);
            r.complete(Ok(Payload::empty()));
        })
        .build()
        .unwrap();
    let (p, _) = Scripted::new(|t| {
        t.out.yield_command(1, custom("count"));
        t.out.complete(Ok(Payload::text("finished")));
        Ok(())
    });
    assert_eq!(s.handle().spawn(p, "main").unwrap().join_timeout(HANG), Some(Ok(Payload::text("finished"))));
    // The same yield without `Complete` is dispatched: the handler is reachable.
    let (p, _) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(1, custom("count"));
        } else {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    s.handle().spawn(p, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn continue_without_yields_runs_again() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let (p, probe) = Scripted::new(|t| {
        assert!(t.events.is_empty(), "nothing was sent");
        if t.step < 3 {
            t.out.set_status(Status::Continue);
        } else {
            t.out.complete(Ok(Payload::u64(t.step as u64)));
        }
        Ok(())
    });
    assert_eq!(s.handle().spawn(p, "main").unwrap().join_timeout(HANG), Some(Ok(Payload::u64(3))));
    assert_eq!(probe.steps(), 4);
}

#[test]
fn every_status_dispatches_its_yields() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    for status in [Status::Idle, Status::Continue, Status::Blocked] {
        let (p, probe) = Scripted::new(move |t| {
            if t.step == 0 {
                t.out.yield_command(7, Command::Sleep(Duration::ZERO));
                t.out.set_status(status.clone());
            } else if t.events.iter().any(|e| completion(e, 7).is_some()) {
                t.out.complete(Ok(Payload::empty()));
            } else {
                t.out.set_status(Status::Blocked);
            }
            Ok(())
        });
        s.handle().spawn(p, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
        assert_eq!(probe.completion_tags(), vec![7]);
    }
}

/// DESIGN 4, with a handler that completes inside dispatch and with the timer thread
/// completing from outside: no spurious steps either way.
#[test]
fn five_yields_then_complete_take_exactly_six_steps() {
    let s = Scheduler::builder()
        .workers(1)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", complete_now)
        .build()
        .unwrap();
    for command in [custom("now"), Command::Sleep(Duration::from_millis(1))] {
        let (p, probe) = Scripted::new(move |t| {
            if t.step < 5 {
                t.out.yield_command(t.step as u64, command.clone());
            } else {
                t.out.complete(Ok(Payload::empty()));
            }
            Ok(())
        });
        s.handle().spawn(p, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
        assert_eq!(probe.steps(), 6);
        assert_eq!(probe.completion_tags(), vec![0, 1, 2, 3, 4]);
    }
}

#[test]
fn step_error_or_panic_ends_only_that_process() {
    let s = Scheduler::builder().workers(2).build().unwrap();
    let (failing, failing_probe) = Scripted::new(|_| anyhow::bail!("ledger is unbalanced"));
    let (panicking, panicking_probe) = Scripted::new(|_| panic!("boom"));
    let (good, good_probe) = Scripted::new(|t| {
        match t.events.first() {
            Some(Event::Message { body, .. }) => t.out.complete(Ok(body.clone())),
            _ => t.out.set_status(Status::Idle),
        }
        Ok(())
    });
    let good = s.handle().spawn(good, "main").unwrap();
    let failing = s.handle().spawn(failing, "main").unwrap();
    let panicking = s.handle().spawn(panicking, "main").unwrap();
    assert_eq!(failing.join_timeout(HANG), Some(Err(wasmproc::ExitReason::Error("ledger is unbalanced".to_owned()))));
    let panicked = wasmproc::ExitReason::trap(wasmproc::TrapKind::Panic, "process panicked: boom");
    assert_eq!(panicking.join_timeout(HANG), Some(Err(panicked)));
    s.handle().send(good.pid(), "ping", Payload::text("still here")).unwrap();
    assert_eq!(good.join_timeout(HANG), Some(Ok(Payload::text("still here"))));
    for probe in [failing_probe, panicking_probe, good_probe] {
        assert_eq!(probe.closes(), 1);
    }
    assert!(s.handle().wait_idle(Some(HANG)));
    assert_eq!(s.handle().registered(), 0);
}
