use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use wasmproc::handler::Request;
use wasmproc::provider::clock::{Random, Time};
use wasmproc::provider::env::Env;
use wasmproc::provider::fs::{FILE_THREADS, Files, FilesSettings, Grant};
use wasmproc::provider::{Provider, Served};
use wasmproc::scheduler::SpawnOptions;
use wasmproc::{Capabilities, Command, Event, Outcome, Payload, Scheduler, Status};
use wasmproc_tests::{HANG, Scripted};

/// Runs one process that yields `name` with `input` and returns its completion.
fn call(s: &Scheduler, caps: Option<Capabilities>, name: &str, input: Payload) -> Outcome {
    wasmproc_tests::outcome_of(s.handle(), caps, Command::Custom { name: name.to_owned().into(), payload: input })
}

fn json(value: serde_json::Value) -> Payload {
    Payload::json(&value).unwrap()
}

fn parse(outcome: Outcome) -> serde_json::Value {
    outcome.expect("the command succeeds").parse_json().expect("the answer is JSON")
}

fn scratch(name: &str) -> PathBuf {
    // The same for every run (emptied first), under cargo's scratch space: runs do not pile up.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("providers-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn files_scheduler(read: &Path, write: &Path) -> Scheduler {
    let grants = vec![
        Grant { host: read.to_path_buf(), guest: "/data".into(), writable: false },
        Grant { host: write.to_path_buf(), guest: "/data/out".into(), writable: true },
    ];
    Scheduler::builder()
        .workers(1)
        .provider(Files::new(grants, FilesSettings { max_read: 64 }).unwrap())
        .capabilities(Capabilities::default().allow("fs.*"))
        .build()
        .unwrap()
}

#[test]
fn files_are_read_and_written_only_inside_their_grants() {
    let read = scratch("read");
    let write = scratch("write");
    std::fs::write(read.join("in.txt"), "hello").unwrap();
    std::fs::write(read.join("big.bin"), vec![7u8; 65]).unwrap();
    let s = files_scheduler(&read, &write);

    assert_eq!(
        call(&s, None, "fs.read", json(serde_json::json!({"path": "/data/in.txt"}))),
        Ok(Payload::bytes("hello"))
    );
    // The longest grant wins: /data/out is the writable one.
    let wrote = call(&s, None, "fs.write", json(serde_json::json!({"path": "/data/out/o.txt", "text": "x"})));
    assert_eq!(parse(wrote), serde_json::json!({"bytes": 1}));
    assert_eq!(std::fs::read_to_string(write.join("o.txt")).unwrap(), "x");
    let appended =
        call(&s, None, "fs.write", json(serde_json::json!({"path": "/data/out/o.txt", "data": [121], "append": true})));
    assert!(appended.is_ok(), "{appended:?}");
    assert_eq!(std::fs::read_to_string(write.join("o.txt")).unwrap(), "xy");

    let listed = parse(call(&s, None, "fs.list", json(serde_json::json!({"path": "/data"}))));
    let names: Vec<&str> = listed["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["big.bin", "in.txt"]);

    let denied = |path: &str, command: &str| {
        let input = serde_json::json!({"path": path, "text": ""});
        call(&s, None, command, json(input)).expect_err("refused")
    };
    let error = denied("/data/in.txt", "fs.write");
    assert!(error.starts_with("denied: ") && error.contains("read-only (grant it with --dir-rw"), "{error}");
    let error = denied("/etc/passwd", "fs.read");
    assert!(error.starts_with("denied: `/etc/passwd` is outside the granted directories"), "{error}");
    assert!(denied("/data/../etc/passwd", "fs.read").starts_with("invalid: "));
    assert!(denied("/data/missing", "fs.read").starts_with("not-found: "));
    let error = denied("/data/big.bin", "fs.read");
    assert!(error.starts_with("limit: ") && error.contains("64-byte read limit"), "{error}");
}

/// A FIFO in a grant is refused, for reading and for writing, without waiting for a
/// writer or a reader: it held the file thread until the run's timeout, and every other
/// process's file commands behind it.
#[test]
fn a_fifo_in_a_grant_is_refused_without_blocking() {
    let read = scratch("fifo-read");
    let write = scratch("fifo-write");
    std::fs::write(read.join("in.txt"), "hello").unwrap();
    std::fs::create_dir(read.join("sub")).unwrap();
    for dir in [&read, &write] {
        let made = std::process::Command::new("mkfifo").arg(dir.join("pipe")).status().expect("mkfifo runs");
        assert!(made.success());
    }
    let s = files_scheduler(&read, &write);
    let error = call(&s, None, "fs.read", json(serde_json::json!({"path": "/data/pipe"}))).expect_err("refused");
    assert_eq!(error, "invalid: `/data/pipe` is a FIFO, not a regular file: only regular files are read and written");
    let error = call(&s, None, "fs.write", json(serde_json::json!({"path": "/data/out/pipe", "text": "x"})))
        .expect_err("refused");
    assert_eq!(
        error,
        "invalid: `/data/out/pipe` is a FIFO, not a regular file: only regular files are read and written"
    );
    let error = call(&s, None, "fs.read", json(serde_json::json!({"path": "/data/sub"}))).expect_err("refused");
    assert!(error.contains("is a directory, not a regular file"), "{error}");
    assert_eq!(
        call(&s, None, "fs.read", json(serde_json::json!({"path": "/data/in.txt"}))),
        Ok(Payload::bytes("hello"))
    );
}

/// A write to a file whose file system stalls (frozen, as a snapshot tool freezes it:
/// the write blocks in the kernel, not in anything of ours) holds one file thread; every
/// other process's file commands, reads and writes of other files, are answered while it
/// waits, and the stalled write completes once the file system answers again. With one
/// file thread they would all wait behind it.
#[test]
fn one_stalled_file_does_not_hold_up_the_others() {
    let Some(mount) = wasmproc_tests::frozen::Mount::new(&scratch("stalled")) else { return };
    let fast = scratch("stalled-fast");
    std::fs::write(fast.join("in.txt"), "hello").unwrap();
    let grants = vec![
        Grant { host: mount.dir().to_path_buf(), guest: "/slow".into(), writable: true },
        Grant { host: fast.clone(), guest: "/fast".into(), writable: true },
    ];
    let s = Scheduler::builder()
        .workers(1)
        .provider(Files::new(grants, FilesSettings::default()).unwrap())
        .capabilities(Capabilities::default().allow("fs.*"))
        .build()
        .unwrap();
    // Thawed before the scheduler is dropped (locals drop in reverse), which joins the
    // file threads, one of them in the stalled write.
    let frozen = mount.freeze();

    let (stalled, answer) = std::sync::mpsc::channel();
    let handle = s.handle().clone();
    let writer = std::thread::spawn(move || {
        let input = json(serde_json::json!({"path": "/slow/stalled.txt", "text": "late"}));
        let command = Command::Custom { name: "fs.write".into(), payload: input };
        let _ = stalled.send(wasmproc_tests::outcome_of(&handle, None, command));
    });
    assert!(
        wasmproc_tests::frozen::wait_for_thread_blocked("wasmproc-fs", HANG),
        "no file thread blocked in the write to the frozen file system"
    );

    for n in 0..2 * FILE_THREADS {
        let path = format!("/fast/out-{n}.txt");
        let wrote = call(&s, None, "fs.write", json(serde_json::json!({"path": path, "text": "x"})));
        assert_eq!(parse(wrote), serde_json::json!({"bytes": 1}), "write {n}");
        let read = call(&s, None, "fs.read", json(serde_json::json!({"path": "/fast/in.txt"})));
        assert_eq!(read, Ok(Payload::bytes("hello")), "read {n}");
    }
    assert!(answer.try_recv().is_err(), "the write to the frozen file system was answered while it was frozen");

    drop(frozen);
    let late = answer.recv_timeout(HANG).expect("the stalled write is answered once the file system thaws");
    assert_eq!(parse(late), serde_json::json!({"bytes": 4}));
    assert_eq!(std::fs::read_to_string(mount.dir().join("stalled.txt")).unwrap(), "late");
    writer.join().unwrap();
}

#[test]
fn a_symbolic_link_out_of_a_grant_is_not_followed() {
    let read = scratch("link-read");
    let write = scratch("link-write");
    let secret = scratch("link-secret");
    std::fs::write(secret.join("key"), "secret").unwrap();
    std::os::unix::fs::symlink(secret.join("key"), read.join("escape")).unwrap();
    std::os::unix::fs::symlink(&secret, write.join("dir")).unwrap();
    let s = files_scheduler(&read, &write);
    let error = call(&s, None, "fs.read", json(serde_json::json!({"path": "/data/escape"}))).expect_err("escapes");
    assert!(error.starts_with("denied: `/data/escape`") || error.starts_with("unavailable: `/data/escape`"), "{error}");
    let write_through = json(serde_json::json!({"path": "/data/out/dir/planted", "text": "x"}));
    assert!(call(&s, None, "fs.write", write_through).is_err());
    assert!(!secret.join("planted").exists(), "a write followed a link out of its grant");
}

#[test]
fn env_answers_only_what_was_granted() {
    let s = Scheduler::builder()
        .workers(1)
        .provider(Env::new([("REGION".to_owned(), "eu".to_owned())]))
        .capabilities(Capabilities::default().allow("env.*"))
        .build()
        .unwrap();
    assert_eq!(parse(call(&s, None, "env.get", json(serde_json::json!({"name": "REGION"})))), "eu");
    assert_eq!(parse(call(&s, None, "env.get", json(serde_json::json!({"name": "HOME"})))), serde_json::Value::Null);
    assert_eq!(parse(call(&s, None, "env.vars", json(serde_json::json!({})))), serde_json::json!([["REGION", "eu"]]));
    let error = call(&s, None, "env.set", Payload::empty()).expect_err("no such command");
    assert_eq!(error, "invalid: unknown command `env.set`; the env commands are env.get, env.vars");
}

#[test]
fn time_and_random_are_commands_with_bounded_answers() {
    let s = Scheduler::builder()
        .workers(1)
        .provider(Time)
        .provider(Random)
        .capabilities(Capabilities::default().allow("time.*").allow("random.bytes"))
        .build()
        .unwrap();
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let now = parse(call(&s, None, "time.now", Payload::empty()))["unix_nanos"].as_u64().unwrap();
    assert!(now >= before && now - before < HANG.as_nanos() as u64, "{before} → {now}");
    let bytes = call(&s, None, "random.bytes", json(serde_json::json!({"count": 32}))).unwrap();
    assert_eq!(bytes.data.len(), 32);
    assert!(bytes.data.iter().any(|&b| b != 0));
    let error = call(&s, None, "random.bytes", json(serde_json::json!({"count": 1 << 20}))).expect_err("too many");
    assert!(error.starts_with("limit: "), "{error}");
    let error = call(&s, None, "random.bytes", json(serde_json::json!({"n": 1}))).expect_err("bad input");
    assert!(error.starts_with("invalid: `random.bytes` takes JSON input"), "{error}");
}

#[test]
fn a_family_is_granted_whole_or_command_by_command_and_denials_give_the_hint() {
    let s = Scheduler::builder()
        .workers(1)
        .provider(Time)
        .provider(Random)
        .denial_hint(|name| format!("grant it with --allow {name}"))
        .build()
        .unwrap();
    let only_time = Capabilities::default().allow("time.now");
    assert!(call(&s, Some(only_time.clone()), "time.now", Payload::empty()).is_ok());
    let error = call(&s, Some(only_time), "random.bytes", json(serde_json::json!({"count": 1}))).unwrap_err();
    assert_eq!(error, "permission denied: random.bytes (grant it with --allow random.bytes)");
    let error = call(&s, None, "time.now", Payload::empty()).unwrap_err();
    assert_eq!(error, "permission denied: time.now (grant it with --allow time.now)");
}

#[test]
fn a_family_name_must_be_one_word() {
    let err = |name: &str| {
        Scheduler::builder().handler(name, |r: Request<'_>| r.complete(Ok(Payload::empty()))).build().err().unwrap()
    };
    assert!(err("a.b.*").to_string().contains("a family is one word before `.*`"));
    assert!(err("*").to_string().contains("`*` only ends a family name"));
}

/// The requests a test server was sent: each command's name and caller.
pub(crate) type Seen = Arc<Mutex<Vec<(String, u64)>>>;

/// A serving process that keeps the requests it is sent and answers them in reverse
/// order once it holds `batch` of them, each with its input and its caller. Serves
/// durable callers too.
pub(crate) fn server(batch: usize) -> (Scripted, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let mut held: Vec<(u64, wasmproc::Pid, Payload)> = Vec::new();
    let (p, _) = Scripted::new(move |t| {
        for event in t.events.drain(..) {
            match event {
                Event::Message { sender, topic, body } => {
                    // `COMMAND#ID`, and `#KEY` after it from a durable caller.
                    let mut parts = topic.split('#');
                    let (command, id) = (parts.next().unwrap(), parts.next().expect("a request topic"));
                    let id: u64 = id.parse().expect("a request id");
                    log.lock().push((command.to_owned(), sender.as_u64()));
                    held.push((id, sender, body));
                }
                Event::Cancel { .. } => {
                    t.out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                _ => {}
            }
        }
        if held.len() >= batch {
            for (id, caller, body) in held.drain(..).rev() {
                let answer = format!("{}:{}", body.as_str().unwrap_or("?"), caller);
                t.port.respond(id, Ok(Payload::text(answer))).expect("the request waits");
            }
        }
        t.out.set_status(Status::Idle);
        Ok(())
    });
    (p, seen)
}

/// A scheduler of `workers` whose family `family` is served by process `server` of
/// `services`, and granted.
fn served_by(family: &str, services: &Scheduler, server: wasmproc::Pid, workers: usize) -> Scheduler {
    Scheduler::builder()
        .workers(workers)
        .provider(Served::new(family, services.handle().clone(), server))
        .capabilities(Capabilities::default().allow(&format!("{family}.*")))
        .build()
        .unwrap()
}

#[test]
fn a_process_serves_a_family_answering_later_and_out_of_order() {
    let services = Scheduler::builder().workers(1).build().unwrap();
    let (serve, seen) = server(3);
    let server_pid = services.handle().spawn(serve, "main").unwrap().pid();
    let s = served_by("inventory", &services, server_pid, 2);
    // Three callers at once: the server answers none before it holds all three.
    let callers: Vec<_> = (0..3)
        .map(|i| {
            let s = s.handle().clone();
            std::thread::spawn(move || {
                let command =
                    Command::Custom { name: "inventory.reserve".into(), payload: Payload::text(format!("n{i}")) };
                let (pid, answer) = wasmproc_tests::yield_one(&s, None, command);
                (i, pid, answer)
            })
        })
        .collect();
    for caller in callers {
        let (i, pid, answer) = caller.join().unwrap();
        assert_eq!(answer, Ok(Payload::text(format!("n{i}:{pid}"))), "each caller gets its own answer");
    }
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|(command, _)| command == "inventory.reserve"));
    s.stop(HANG);
    services.stop(HANG);
}

#[test]
fn requests_a_server_leaves_unanswered_fail_when_it_ends() {
    let services = Scheduler::builder().workers(1).build().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let (serve, _) = server(usize::MAX);
    let server = services.handle().spawn(serve, "main").unwrap();
    let s = served_by("svc", &services, server.pid(), 1);
    let waiting = {
        let s = s.handle().clone();
        let answered = answered.clone();
        std::thread::spawn(move || {
            let outcome = call_on(&s, "svc.hold");
            answered.fetch_add(1, Ordering::SeqCst);
            outcome
        })
    };
    while services.handle().stats().messages == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(answered.load(Ordering::SeqCst), 0, "held by the server");
    services.handle().terminate(server.pid()).unwrap();
    let error = waiting.join().unwrap().expect_err("the server ended");
    assert!(error.starts_with("unavailable: process ") && error.ends_with("ended before it answered"), "{error}");
    // Later requests find no server.
    assert!(call_on(s.handle(), "svc.hold").unwrap_err().starts_with("unavailable: "));
    s.stop(HANG);
    services.stop(HANG);
}

fn call_on(s: &wasmproc::Handle, name: &str) -> Outcome {
    wasmproc_tests::outcome_of(s, None, Command::Custom { name: name.to_owned().into(), payload: Payload::empty() })
}

#[test]
fn only_the_server_may_answer_and_only_once() {
    let services = Scheduler::builder().workers(1).build().unwrap();
    let ids = Arc::new(Mutex::new(Vec::new()));
    let kept = ids.clone();
    let (serve, _) = Scripted::new(move |t| {
        for event in t.events.drain(..) {
            match event {
                Event::Message { topic, .. } => {
                    let id: u64 = topic.split_once('#').unwrap().1.parse().unwrap();
                    t.port.respond(id, Ok(Payload::text("first"))).unwrap();
                    kept.lock().push((id, t.port.respond(id, Ok(Payload::text("second")))));
                }
                Event::Cancel { .. } => {
                    t.out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                _ => {}
            }
        }
        t.out.set_status(Status::Idle);
        Ok(())
    });
    let server = services.handle().spawn(serve, "main").unwrap();
    let s = served_by("svc", &services, server.pid(), 1);
    assert_eq!(call_on(s.handle(), "svc.x"), Ok(Payload::text("first")));
    let (id, second) = ids.lock().pop().unwrap();
    assert_eq!(second, Err(wasmproc::error::PortError::NoRequest(id)));
    s.stop(HANG);
    services.stop(HANG);
}

/// `Provider` is implementable outside the crate, for a family of the embedder's own.
struct Echo;

impl Provider for Echo {
    fn family(&self) -> &str {
        "echo"
    }

    fn handle(&self, request: Request<'_>) {
        let answer = format!("{} {}", request.name(), request.payload().as_str().unwrap_or(""));
        request.complete(Ok(Payload::text(answer)));
    }
}

#[test]
fn an_embedders_provider_serves_every_command_of_its_family() {
    let s = Scheduler::builder()
        .workers(1)
        .provider(Echo)
        .handler("echo.special", |r: Request<'_>| r.complete(Ok(Payload::text("own handler"))))
        .capabilities(Capabilities::default().allow("echo.*"))
        .build()
        .unwrap();
    assert_eq!(call(&s, None, "echo.a", Payload::text("x")), Ok(Payload::text("echo.a x")));
    assert_eq!(call(&s, None, "echo.b.c", Payload::text("y")), Ok(Payload::text("echo.b.c y")));
    assert_eq!(call(&s, None, "echo.special", Payload::empty()), Ok(Payload::text("own handler")));
    assert_eq!(call(&s, None, "echoes", Payload::empty()), Err("unknown command `echoes`".to_owned()));
}

/// Grants travel: a child gets its parent's provider grants and no more, whatever its
/// spawn asks for.
#[test]
fn a_child_gets_at_most_its_parents_provider_grants() {
    let child_outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let seen = child_outcomes.clone();
    let child = move || -> anyhow::Result<Box<dyn wasmproc::Process>> {
        let seen = seen.clone();
        let (p, _) = Scripted::new(move |t| {
            if t.step == 0 {
                for (tag, name) in [(1, "time.now"), (2, "random.bytes")] {
                    let payload = json(serde_json::json!({"count": 1}));
                    t.out.yield_command(tag, Command::Custom { name: name.into(), payload });
                }
                t.out.set_status(Status::Blocked);
            } else {
                for event in &t.events {
                    if let Event::Completion { result, .. } = event {
                        seen.lock().push(result.clone());
                    }
                }
                if seen.lock().len() == 2 {
                    t.out.complete(Ok(Payload::empty()));
                } else {
                    t.out.set_status(Status::Blocked);
                }
            }
            Ok(())
        });
        Ok(Box::new(p))
    };
    let s = Scheduler::builder().workers(1).provider(Time).provider(Random).kind("child", child).build().unwrap();
    let (parent, _) = Scripted::new(|t| {
        if t.step == 0 {
            let spawn = wasmproc::SpawnRequest {
                kind: Some("child".into()),
                method: "main".into(),
                monitor: true,
                ..Default::default()
            };
            t.out.yield_command(1, Command::Spawn(spawn));
            t.out.set_status(Status::Blocked);
        } else if t.events.iter().any(|e| matches!(e, Event::Exit { .. })) {
            t.out.complete(Ok(Payload::empty()));
        } else {
            t.out.set_status(Status::Blocked);
        }
        Ok(())
    });
    let parent_caps = Capabilities::default().allow("time.*");
    s.handle()
        .spawn(parent, SpawnOptions::new("main").capabilities(parent_caps))
        .unwrap()
        .join_timeout(HANG)
        .unwrap()
        .unwrap();
    let outcomes = child_outcomes.lock().clone();
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(outcomes.iter().any(|o| o.is_ok()), "time.now, granted to the parent: {outcomes:?}");
    assert!(outcomes.contains(&Err("permission denied: random.bytes".to_owned())), "{outcomes:?}");
}
