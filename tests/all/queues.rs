use std::sync::Arc;

use parking_lot::Mutex;
use wasmproc::{Capabilities, Command, Event, Payload, Scheduler, Status};
use wasmproc_tests::{HANG, Scripted, complete_now, custom, holder};

/// Processes spawned from outside go through the global FIFO queue; a worker takes
/// them in batches into its LIFO deque without reversing them: first spawned, first run.
/// (Fewer than 61 of them: every 61st pick the worker polls the global queue ahead of
/// its deque for fairness, which lets a later process overtake by design.)
#[test]
fn processes_spawned_from_outside_run_in_spawn_order_on_one_worker() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let (holder, gate) = holder();
    s.handle().spawn(holder, "main").unwrap();
    gate.wait_reached();
    let order = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..50u64)
        .map(|i| {
            let order = order.clone();
            let (p, _) = Scripted::new(move |t| {
                order.lock().push(i);
                t.out.complete(Ok(Payload::empty()));
                Ok(())
            });
            s.handle().spawn(p, "main").unwrap()
        })
        .collect();
    gate.open();
    for h in handles {
        h.join_timeout(HANG).unwrap().unwrap();
    }
    assert_eq!(*order.lock(), (0..50).collect::<Vec<_>>());
}

/// A process that never stops asking to continue, or whose commands always complete
/// at once, still lets the only worker run everyone else.
#[test]
fn busy_processes_do_not_starve_others_on_one_worker() {
    let s = Scheduler::builder()
        .workers(1)
        .capabilities(Capabilities::default().allow("now"))
        .handler("now", complete_now)
        .build()
        .unwrap();
    for spin_with_yields in [false, true] {
        let (busy, busy_probe) = Scripted::new(move |t| {
            if t.events.iter().any(|e| matches!(e, Event::Message { .. })) {
                t.out.complete(Ok(Payload::u64(t.step as u64)));
            } else if spin_with_yields {
                t.out.yield_command(t.step as u64, custom("now"));
            } else {
                t.out.set_status(Status::Continue);
            }
            Ok(())
        });
        let busy = s.handle().spawn(busy, "main").unwrap();
        let to = busy.pid();
        let (stopper, _) = Scripted::new(move |t| {
            if t.step == 0 {
                t.out.yield_command(0, Command::Send { to, topic: "stop".into(), body: Payload::empty() });
            } else {
                t.out.complete(Ok(Payload::empty()));
            }
            Ok(())
        });
        s.handle().spawn(stopper, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
        busy.join_timeout(HANG).unwrap().unwrap();
        assert!(busy_probe.steps() >= 2);
    }
}
