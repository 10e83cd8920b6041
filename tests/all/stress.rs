//! Thousands of processes, each pairing up with a partner and mixing every kind of
//! yield: synchronous completions, the timer, completions from a foreign thread, and
//! messages. Nothing may be lost: every process completes with the right result,
//! every process is closed exactly once, and the registry ends empty.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use wasmproc::handler::Completer;
use wasmproc::{Capabilities, Command, Event, Payload, Pid, Scheduler, Status};
use wasmproc_tests::{HANG, Probe, Scripted, complete_now, custom};

const PAIRS: u64 = 5_000;

/// The pinger: sends its number to the ponger, then expects it back doubled, while
/// waiting on three other yields.
fn pinger(n: u64, partner: Pid) -> (Scripted, Arc<Probe>) {
    let mut pending = 4;
    let mut reply = None;
    Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(1, custom("now"));
            t.out.yield_command(2, Command::Sleep(Duration::from_micros(n % 500)));
            t.out.yield_command(3, custom("later"));
            t.out.yield_command(4, Command::Send { to: partner, topic: "n".into(), body: Payload::u64(n) });
        }
        for event in &t.events {
            match event {
                Event::Completion { result: Ok(_), .. } => pending -= 1,
                Event::Completion { tag, result: Err(e) } => anyhow::bail!("yield {tag} failed: {e}"),
                Event::Message { body, .. } => reply = body.to_u64(),
                other => anyhow::bail!("unexpected {other:?}"),
            }
        }
        match reply {
            Some(r) if pending == 0 => t.out.complete(Ok(Payload::u64(r))),
            // Waiting for completions and for the reply alike: either wakes it.
            _ => t.out.set_status(if pending > 0 { Status::Blocked } else { Status::Idle }),
        }
        Ok(())
    })
}

/// The ponger: waits for a number and sends it back doubled.
fn ponger() -> (Scripted, Arc<Probe>) {
    Scripted::new(|t| {
        for event in &t.events {
            match event {
                Event::Message { sender, body, .. } => {
                    let n = body.to_u64().unwrap();
                    t.out.yield_command(1, Command::Send { to: *sender, topic: "n".into(), body: Payload::u64(2 * n) });
                }
                Event::Completion { result: Ok(_), .. } => {
                    t.out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                other => anyhow::bail!("unexpected {other:?}"),
            }
        }
        t.out.set_status(Status::Idle);
        Ok(())
    })
}

fn run(workers: usize) {
    // "later" completes from a foreign thread, in batches, out of order.
    let (later_tx, later_rx) = mpsc::channel::<Completer>();
    let completer_thread = std::thread::spawn(move || {
        let mut batch = Vec::new();
        while let Ok(done) = later_rx.recv() {
            batch.push(done);
            batch.extend(later_rx.try_iter());
            while let Some(done) = batch.pop() {
                done.complete(Ok(Payload::empty()));
            }
        }
    });
    let later_tx = parking_lot::Mutex::new(later_tx);
    let s = Scheduler::builder()
        .workers(workers)
        .capabilities(Capabilities::default().allow("now").allow("later"))
        .handler("now", complete_now)
        .handler("later", move |r: wasmproc::handler::Request| {
            let (_, done) = r.into_parts();
            later_tx.lock().send(done).unwrap();
        })
        .build()
        .unwrap();

    let mut probes = Vec::new();
    let mut pingers = Vec::new();
    let mut pongers = Vec::new();
    for n in 0..PAIRS {
        let (pong, pong_probe) = ponger();
        let pong = s.handle().spawn(pong, "main").unwrap();
        let (ping, ping_probe) = pinger(n, pong.pid());
        pingers.push((n, s.handle().spawn(ping, "main").unwrap()));
        pongers.push(pong);
        probes.extend([pong_probe, ping_probe]);
    }
    for (n, h) in &pingers {
        assert_eq!(h.join_timeout(HANG), Some(Ok(Payload::u64(2 * n))), "pinger {n}");
    }
    for h in &pongers {
        assert_eq!(h.join_timeout(HANG), Some(Ok(Payload::empty())));
    }
    assert!(s.handle().wait_idle(Some(HANG)));
    assert!(probes.iter().all(|p| p.closes() == 1), "every process closed exactly once");
    assert_eq!(s.handle().registered(), 0);
    let stats = s.handle().stats();
    assert_eq!((stats.spawned, stats.completed, stats.live), (2 * PAIRS, 2 * PAIRS, 0));
    assert_eq!(stats.messages, 2 * PAIRS);
    assert_eq!(stats.undelivered, 0);
    assert_eq!(stats.workers.len(), workers);
    assert!(stats.workers.iter().map(|w| w.executed).sum::<u64>() >= 4 * PAIRS);
    s.stop(Duration::ZERO);
    drop(s);
    completer_thread.join().unwrap();
}

#[test]
fn ten_thousand_processes_on_one_worker() {
    run(1);
}

#[test]
fn ten_thousand_processes_on_several_workers() {
    run(4);
}
