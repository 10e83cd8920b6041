use std::time::Duration;

use wasmproc::{Capabilities, Command, Event, Payload, Scheduler, Status};
use wasmproc_tests::{HANG, Scripted, complete_now, completion, custom, gate, with_stash};

/// DESIGN 3: outstanding yields complete in completion order, each with its own tag.
#[test]
fn concurrent_yields_resume_in_completion_order() {
    let s = Scheduler::builder().workers(2).build().unwrap();
    let (p, probe) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(1, Command::Sleep(Duration::from_millis(100)));
            t.out.yield_command(2, Command::Sleep(Duration::from_millis(10)));
        } else if probe_count(&t.events) > 0 && t.step >= 2 {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    s.handle().spawn(p, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
    assert_eq!(probe.completion_tags(), vec![2, 1]);
}

fn probe_count(events: &[Event]) -> usize {
    events.iter().filter(|e| matches!(e, Event::Completion { .. })).count()
}

/// DESIGN 5: a completion that lands while the process is running (here: from another
/// thread, during step 2) sets the wakeup flag, and the worker runs the process again
/// instead of parking it with the completion unread.
#[test]
fn completion_during_a_step_reruns_the_process() {
    let (builder, stashed) = with_stash(1);
    let s = builder
        .capabilities(Capabilities::default().allow("stash").allow("now"))
        .handler("now", complete_now)
        .build()
        .unwrap();
    let (gate, stop) = gate();
    let (p, probe) = Scripted::new(move |t| {
        match t.step {
            0 => {
                t.out.yield_command(1, custom("stash"));
                t.out.yield_command(2, custom("now"));
            }
            1 => {
                // Completion 2 arrived; completion 1 will arrive while this step runs.
                stop.wait();
            }
            _ => t.out.complete(Ok(Payload::empty())),
        }
        Ok(())
    });
    let handle = s.handle().spawn(p, "main").unwrap();
    let late = stashed.recv_timeout(HANG).unwrap();
    gate.wait_reached();
    late.complete(Ok(Payload::text("late")));
    gate.open();
    assert_eq!(handle.join_timeout(HANG), Some(Ok(Payload::empty())));
    assert_eq!(probe.completion_tags(), vec![2, 1]);
    assert_eq!(probe.steps(), 3);
}

/// DESIGN 7: a message reaches (and wakes) an idle process and a blocked one.
#[test]
fn send_wakes_idle_and_blocked_processes() {
    let (builder, _stashed) = with_stash(2);
    let s = builder.build().unwrap();
    let receiver = |status: Status| {
        Scripted::new(move |t| {
            match t.events.iter().find(|e| matches!(e, Event::Message { .. })) {
                Some(Event::Message { body, .. }) => t.out.complete(Ok(body.clone())),
                _ => {
                    if t.step == 0 {
                        // Never completed: the blocked process can only be woken by the message.
                        t.out.yield_command(1, custom("stash"));
                    }
                    t.out.set_status(status.clone());
                }
            }
            Ok(())
        })
    };
    let (idle, _) = receiver(Status::Idle);
    let (blocked, _) = receiver(Status::Blocked);
    let idle = s.handle().spawn(idle, "main").unwrap();
    let blocked = s.handle().spawn(blocked, "main").unwrap();
    for h in [&idle, &blocked] {
        s.handle().send(h.pid(), "wake", Payload::text("up")).unwrap();
    }
    assert_eq!(idle.join_timeout(HANG), Some(Ok(Payload::text("up"))));
    assert_eq!(blocked.join_timeout(HANG), Some(Ok(Payload::text("up"))));
}

/// DESIGN 7: a completion wakes a process that went idle while waiting for it (the Go
/// original misses this one).
#[test]
fn completion_wakes_an_idle_process() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let (p, _) = Scripted::new(|t| {
        if t.step == 0 {
            t.out.yield_command(9, Command::Sleep(Duration::from_millis(5)));
            t.out.set_status(Status::Idle);
        } else {
            let result = t.events.iter().find_map(|e| completion(e, 9)).cloned();
            t.out.complete(result.unwrap_or(Err("woken without the completion".into())));
        }
        Ok(())
    });
    assert_eq!(s.handle().spawn(p, "main").unwrap().join_timeout(HANG), Some(Ok(Payload::empty())));
}

/// DESIGN 8: completing a yield of a finished process, after its registry slot has
/// been reused, reaches nobody.
#[test]
fn stale_completion_is_a_no_op() {
    let (builder, stashed) = with_stash(1);
    let s = builder.build().unwrap();
    let (first, _) = Scripted::new(|t| {
        t.out.yield_command(5, custom("stash"));
        t.out.set_status(Status::Continue);
        if t.step == 1 {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    let first = s.handle().spawn(first, "main").unwrap();
    first.join_timeout(HANG).unwrap().unwrap();
    let stale = stashed.recv_timeout(HANG).unwrap();
    assert!(s.handle().wait_idle(Some(HANG)));

    let (second, second_probe) = Scripted::new(|t| {
        match t.events.first() {
            Some(Event::Message { .. }) => t.out.complete(Ok(Payload::u64(t.events.len() as u64))),
            _ => t.out.set_status(Status::Idle),
        }
        Ok(())
    });
    let second = s.handle().spawn(second, "main").unwrap();
    let mask = (1u64 << 32) - 1;
    assert_eq!(first.pid().as_u64() & mask, second.pid().as_u64() & mask, "the slot was reused");
    assert_ne!(first.pid(), second.pid());
    stale.complete(Ok(Payload::text("stale")));
    assert_eq!(
        s.handle().send(first.pid(), "hi", Payload::empty()),
        Err(wasmproc::error::SendError::NotFound(first.pid()))
    );
    s.handle().send(second.pid(), "hi", Payload::empty()).unwrap();
    assert_eq!(second.join_timeout(HANG), Some(Ok(Payload::u64(1))));
    assert!(second_probe.completion_tags().is_empty(), "the stale completion reached the new tenant");
}
