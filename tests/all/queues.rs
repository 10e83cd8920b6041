use std::sync::Arc;

use parking_lot::Mutex;
use wasmproc::{Capabilities, Command, Event, Payload, Scheduler, SpawnRequest, Status};
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

/// A ping-pong pair on the only worker, each woken by the other's message, lets a third
/// process run within a bounded number of its turns: whichever way the messages go (sent
/// through the port during the step, or yielded), and whether the third comes from
/// outside (the global queue) or is spawned by one of the pair (the worker's own queue,
/// beneath the pair's wake-ups). A process woken by a message from the running step does
/// not keep the worker from everyone else.
#[test]
fn a_ping_pong_pair_does_not_starve_a_third_process_on_one_worker() {
    /// The pair's steps allowed before the third has run: the worker polls the global
    /// queue every 61 picks; ten times that leaves room for the pair's own batches and
    /// for the test thread's delay between reading the count and spawning.
    const BOUND: usize = 610;
    // The pair's steps so far, and that count when the third ran.
    let rally = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ran_at = Arc::new(Mutex::new(None));
    let s = Scheduler::builder()
        .workers(1)
        .kind("third", {
            let (rally, ran_at) = (rally.clone(), ran_at.clone());
            move || {
                let (rally, ran_at) = (rally.clone(), ran_at.clone());
                let (third, _) = Scripted::new(move |t| {
                    *ran_at.lock() = Some(rally.load(std::sync::atomic::Ordering::SeqCst));
                    t.out.complete(Ok(Payload::empty()));
                    Ok(())
                });
                Ok(Box::new(third) as Box<dyn wasmproc::Process>)
            }
        })
        .build()
        .unwrap();
    let spawned_at = Arc::new(Mutex::new(None));
    for (through_port, from_the_pair) in [(true, false), (false, false), (true, true), (false, true)] {
        rally.store(0, std::sync::atomic::Ordering::SeqCst);
        *ran_at.lock() = None;
        *spawned_at.lock() = None;
        // Each answers every `ball` with one to its sender, serves to the pid a `serve`
        // names, spawns the third at `spawn`, and ends at `stop`.
        let player = {
            let (rally, spawned_at) = (rally.clone(), spawned_at.clone());
            move |t: &mut wasmproc_tests::Turn<'_>| {
                let count = rally.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                for event in std::mem::take(&mut t.events) {
                    let Event::Message { sender, topic, body } = event else { continue };
                    let to = match topic.as_str() {
                        "stop" => {
                            t.out.complete(Ok(Payload::empty()));
                            return Ok(());
                        }
                        "spawn" => {
                            *spawned_at.lock() = Some(count);
                            let third = SpawnRequest {
                                kind: Some("third".into()),
                                method: "main".into(),
                                ..Default::default()
                            };
                            t.out.yield_command(1, Command::Spawn(third));
                            continue;
                        }
                        "serve" => wasmproc::Pid::from_u64(body.to_u64().expect("a pid")),
                        _ => sender,
                    };
                    // A send to a player that has stopped fails; the rally is over then.
                    if through_port {
                        let _ = t.port.send(to, "ball", Payload::empty());
                    } else {
                        t.out.yield_command(0, Command::Send { to, topic: "ball".into(), body: Payload::empty() });
                    }
                }
                t.out.set_status(Status::Idle);
                Ok(())
            }
        };
        let (ping, _) = Scripted::new(player.clone());
        let (pong, _) = Scripted::new(player);
        let ping = s.handle().spawn(ping, "main").unwrap();
        let pong = s.handle().spawn(pong, "main").unwrap();
        s.handle().send(ping.pid(), "serve", Payload::u64(pong.pid().as_u64())).unwrap();
        let case = format!("port sends: {through_port}, spawned by the pair: {from_the_pair}");
        let deadline = std::time::Instant::now() + HANG;
        let rallied = || rally.load(std::sync::atomic::Ordering::SeqCst);
        // The rally is under way before the third process arrives.
        while rallied() < 100 {
            assert!(std::time::Instant::now() < deadline, "the rally never started ({case})");
            std::thread::yield_now();
        }
        if from_the_pair {
            s.handle().send(ping.pid(), "spawn", Payload::empty()).unwrap();
        } else {
            *spawned_at.lock() = Some(rallied());
            s.handle().spawn(wasmproc::scheduler::Spawnable::kind("third"), "main").unwrap();
        }
        let ran = loop {
            if let Some(ran) = *ran_at.lock() {
                break ran;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the third never ran ({case}): the pair took {} steps",
                rallied()
            );
            std::thread::yield_now();
        };
        let during = ran - spawned_at.lock().expect("spawned");
        assert!(during <= BOUND, "the pair took {during} steps before the third ran ({case})");
        for pid in [ping.pid(), pong.pid()] {
            s.handle().send(pid, "stop", Payload::empty()).unwrap();
        }
        ping.join_timeout(HANG).unwrap().unwrap();
        pong.join_timeout(HANG).unwrap().unwrap();
    }
}

/// A process woken by a step goes into its worker's LIFO slot, to run next on the same
/// core; but when that step goes on for long, a worker that runs out of work takes it
/// before it parks: the woken process runs, and answers, while the step that woke it is
/// still running. (A worker already parked is not woken for a slot: the test gives the
/// other worker a process to run once the slot is full, so it looks.)
#[test]
fn a_process_woken_by_a_long_step_runs_on_another_worker_meanwhile() {
    let s = Scheduler::builder().workers(2).build().unwrap();
    let (answered_tx, answered_rx) = std::sync::mpsc::channel::<()>();
    let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
    let answered_tx = Mutex::new(answered_tx);
    let (woken, woken_probe) = Scripted::new(move |t| {
        if t.events.iter().any(|e| matches!(e, Event::Message { .. })) {
            // The long step may have given up waiting (the test then fails on its result).
            let _ = answered_tx.lock().send(());
            t.out.complete(Ok(Payload::empty()));
        } else {
            t.out.set_status(Status::Idle);
        }
        Ok(())
    });
    let woken = s.handle().spawn(woken, "main").unwrap();
    let to = woken.pid();
    // Until the woken process waits, a message would find it queued or running, not
    // waking it; a moment after its first step it waits.
    while woken_probe.steps() < 1 {
        std::thread::yield_now();
    }
    std::thread::sleep(std::time::Duration::from_millis(10));
    let sent_tx = Mutex::new(sent_tx);
    let (long, _) = Scripted::new(move |t| {
        t.port.send(to, "wake", Payload::empty()).expect("the woken process is alive");
        sent_tx.lock().send(()).expect("the test is listening");
        // The step goes on until the process it woke has run: the woken one is in this
        // worker's slot, which only another worker can take meanwhile.
        let ran = answered_rx.recv_timeout(HANG).is_ok();
        t.out.complete(if ran { Ok(Payload::empty()) } else { Err("the woken process waited".into()) });
        Ok(())
    });
    let long = s.handle().spawn(long, "main").unwrap();
    sent_rx.recv_timeout(HANG).expect("the long step sent");
    let nudge = s.handle().spawn(complete_at_once(), "main").unwrap();
    assert_eq!(nudge.join_timeout(HANG), Some(Ok(Payload::empty())));
    assert_eq!(long.join_timeout(HANG), Some(Ok(Payload::empty())));
    assert_eq!(woken.join_timeout(HANG), Some(Ok(Payload::empty())));
}

fn complete_at_once() -> Scripted {
    Scripted::new(|t| {
        t.out.complete(Ok(Payload::empty()));
        Ok(())
    })
    .0
}
