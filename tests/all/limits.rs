use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wasmproc::{Event, Payload, Scheduler, SpawnError, Status};
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
    let a = s.spawn(idle(), "main", vec![]).unwrap();
    s.spawn(idle(), "main", vec![]).unwrap();
    let err = s.spawn(idle(), "main", vec![]).unwrap_err();
    assert!(matches!(err, SpawnError::LimitExceeded { limit: 2 }));
    assert!(err.to_string().contains("process limit reached: 2"), "{err}");
    s.terminate(a.pid()).unwrap();
    a.join_timeout(HANG).unwrap().unwrap_err();
    s.spawn(idle(), "main", vec![]).expect("room again after an exit");
}

#[test]
fn spawn_after_stop_is_refused_with_stopping() {
    let s = Scheduler::builder().workers(1).build().unwrap();
    let handle = s.handle().clone();
    s.stop(Duration::from_millis(10));
    let err = handle.spawn(idle(), "main", vec![]).unwrap_err();
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
        polite.push(s.spawn(p, "main", vec![]).unwrap());
        stubborn.push(s.spawn(idle(), "main", vec![]).unwrap());
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
        assert_eq!(h.try_result(), Some(Err("terminated: shutdown deadline exceeded".to_owned())));
    }
    assert_eq!(s.live(), 0);
    assert_eq!(s.registered(), 0);
    assert_eq!(worker_threads("stoptest"), 0, "every scheduler thread has exited");
    assert_eq!(s.stop(Duration::ZERO), wasmproc::StopReport::default(), "a second stop is a no-op");
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
    let h = s.spawn(p, "main", vec![]).unwrap();
    started.recv_timeout(HANG).unwrap();
    s.stop(Duration::ZERO);
    assert!(finished.load(Ordering::SeqCst), "stop returned while a step was running");
    assert_eq!(h.try_result(), Some(Err("terminated: shutdown deadline exceeded".to_owned())));
}
