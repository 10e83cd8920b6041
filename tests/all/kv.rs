//! The `kv` provider: persistence across opens, quotas, compare-and-swap under concurrency.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use wasmproc::cluster::{ClusterConfig, SharedKv, SharedKvOptions};
use wasmproc::journal::{Journal, MemoryStore};
use wasmproc::provider::Provider;
use wasmproc::provider::kv::{Kv, KvSettings};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::{Capabilities, Command, Payload, Scheduler, Status};
use wasmproc_tests::nats::Server;
use wasmproc_tests::{GateStop, HANG, Scripted, completion, gate};

/// A fresh directory for a store (it does not exist yet), removed when dropped: declare
/// it before the store, so that the store is closed first.
struct Scratch(PathBuf);

fn scratch(name: &str) -> Scratch {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("kv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Scratch(dir)
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scheduler(kv: &(impl Provider + Clone + 'static)) -> Scheduler {
    Scheduler::builder()
        .workers(2)
        .capabilities(Capabilities::default().allow("kv.*"))
        .provider(kv.clone())
        .build()
        .unwrap()
}

fn command(name: &str, input: Value) -> Command {
    Command::Custom { name: name.to_owned().into(), payload: Payload::json(&input).unwrap() }
}

/// Runs `commands` one after another in one process: each answer as JSON, or the error.
fn run(s: &Scheduler, commands: &[(&str, Value)]) -> Vec<Result<Value, String>> {
    let commands: Vec<Command> = commands.iter().map(|(name, input)| command(name, input.clone())).collect();
    let count = commands.len();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let seen = answers.clone();
    let (process, _) = Scripted::new(move |t| {
        if let Some(result) = t.events.iter().find_map(|e| completion(e, t.step as u64)) {
            seen.lock().push(result.as_ref().map(|p| p.parse_json::<Value>().unwrap()).map_err(Clone::clone));
        }
        match commands.get(t.step) {
            Some(next) => t.out.yield_command(t.step as u64 + 1, next.clone()),
            None => t.out.complete(Ok(Payload::empty())),
        }
        Ok(())
    });
    s.handle().spawn(process, "main").unwrap().join_timeout(HANG).expect("the process ends").unwrap();
    let answers = answers.lock().clone();
    assert_eq!(answers.len(), count, "an answer for each command");
    answers
}

/// One command's answer.
fn one(s: &Scheduler, name: &str, input: Value) -> Result<Value, String> {
    run(s, &[(name, input)]).remove(0)
}

#[test]
fn each_command_answers_as_documented() {
    let dir = scratch("commands");
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let s = scheduler(&kv);
    let answers = run(
        &s,
        &[
            ("kv.get", json!({"key": "a"})),
            ("kv.put", json!({"key": "a", "value": {"n": [1, 2]}})),
            ("kv.get", json!({"key": "a"})),
            ("kv.put", json!({"key": "a", "value": null})),
            ("kv.get", json!({"key": "a"})),
            ("kv.put", json!({"key": "b/1", "value": 1})),
            ("kv.put", json!({"key": "b/2", "value": "two"})),
            ("kv.put", json!({"key": "c", "value": true})),
            ("kv.delete", json!({"key": "c"})),
            ("kv.delete", json!({"key": "c"})),
        ],
    );
    assert_eq!(
        answers,
        [
            Ok(Value::Null),
            Ok(json!({"version": 1})),
            Ok(json!({"value": {"n": [1, 2]}, "version": 1})),
            Ok(json!({"version": 2})),
            Ok(json!({"value": null, "version": 2})),
            Ok(json!({"version": 3})),
            Ok(json!({"version": 4})),
            Ok(json!({"version": 5})),
            Ok(json!({"deleted": true})),
            Ok(json!({"deleted": false})),
        ]
    );
    let lists = run(
        &s,
        &[
            ("kv.list", json!({})),
            ("kv.list", json!({"prefix": "b/"})),
            ("kv.list", json!({"prefix": "b/", "limit": 1})),
            ("kv.list", json!({"prefix": "b/", "after": "b/1"})),
            ("kv.list", json!({"after": "a", "limit": 1})),
            ("kv.list", json!({"prefix": "z"})),
        ],
    );
    assert_eq!(
        lists,
        [
            Ok(json!({"keys": ["a", "b/1", "b/2"], "more": false})),
            Ok(json!({"keys": ["b/1", "b/2"], "more": false})),
            Ok(json!({"keys": ["b/1"], "more": true})),
            Ok(json!({"keys": ["b/2"], "more": false})),
            Ok(json!({"keys": ["b/1"], "more": true})),
            Ok(json!({"keys": [], "more": false})),
        ]
    );
    assert_eq!(kv.read("b/2").unwrap(), Some(("\"two\"".to_owned(), 4)), "the host reads what processes wrote");
    s.stop(Duration::from_secs(1));
}

#[test]
fn bad_input_and_unknown_commands_are_invalid() {
    let dir = scratch("invalid");
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let s = scheduler(&kv);
    let errors: Vec<String> = run(
        &s,
        &[
            ("kv.teleport", json!({})),
            ("kv.get", json!("a")),
            ("kv.get", json!({"key": ""})),
            ("kv.put", json!({"key": "a"})),
            ("kv.put", json!({"key": "a", "value": 1, "ttl": 5})),
            ("kv.list", json!({"limit": 1001})),
        ],
    )
    .into_iter()
    .map(|answer| answer.unwrap_err())
    .collect();
    assert!(
        errors[0].starts_with("invalid: unknown command `kv.teleport`; the kv commands are kv.get"),
        "{}",
        errors[0]
    );
    assert!(errors[1].starts_with("invalid: `kv.get` takes JSON input"), "{}", errors[1]);
    assert_eq!(errors[2], "invalid: a key is a non-empty string");
    assert!(errors[3].contains("missing field `value`"), "{}", errors[3]);
    assert!(errors[4].contains("unknown field `ttl`"), "{}", errors[4]);
    assert_eq!(errors[5], "invalid: `limit` 1001 is over the store's `list_limit` (1000)");
    s.stop(Duration::from_secs(1));
}

#[test]
fn values_and_versions_survive_a_close_and_reopen() {
    let dir = scratch("reopen");
    {
        let kv = Kv::open(&dir, KvSettings::default()).unwrap();
        let s = scheduler(&kv);
        let answers = run(
            &s,
            &[
                ("kv.put", json!({"key": "a", "value": [1]})),
                ("kv.put", json!({"key": "b", "value": "b"})),
                ("kv.delete", json!({"key": "b"})),
                ("kv.put", json!({"key": "c", "value": 3})),
            ],
        );
        assert_eq!(answers[3], Ok(json!({"version": 3})));
        s.stop(Duration::from_secs(1));
        drop(s);
        drop(kv);
    }
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let s = scheduler(&kv);
    let answers = run(
        &s,
        &[
            ("kv.get", json!({"key": "a"})),
            ("kv.get", json!({"key": "b"})),
            ("kv.list", json!({})),
            // The counter went on from where it was: `b` gets a version it never had.
            ("kv.put", json!({"key": "b", "value": "again"})),
        ],
    );
    assert_eq!(
        answers,
        [
            Ok(json!({"value": [1], "version": 1})),
            Ok(Value::Null),
            Ok(json!({"keys": ["a", "c"], "more": false})),
            Ok(json!({"version": 4})),
        ]
    );
    s.stop(Duration::from_secs(1));
}

/// Quotas small enough to reach.
fn small() -> KvSettings {
    KvSettings { max_keys: 2, max_bytes: 10, max_key_size: 4, max_value_size: 8, ..KvSettings::default() }
}

#[test]
fn each_quota_is_refused_with_limit_and_the_store_stays_usable() {
    let dir = scratch("quotas");
    let kv = Kv::open(&dir, small()).unwrap();
    let s = scheduler(&kv);
    let answers = run(
        &s,
        &[
            ("kv.put", json!({"key": "toolong", "value": 1})),
            ("kv.put", json!({"key": "a", "value": "123456789"})),
            ("kv.put", json!({"key": "a", "value": 1})),
            ("kv.put", json!({"key": "b", "value": 2})),
            // A third key.
            ("kv.put", json!({"key": "c", "value": 3})),
            // `a` and `1`, `b` and `"123456"`: 11 bytes, past 10.
            ("kv.put", json!({"key": "b", "value": "123456"})),
            ("kv.delete", json!({"key": "a"})),
            ("kv.put", json!({"key": "c", "value": 3})),
            // Rewriting a key in place is no new key.
            ("kv.put", json!({"key": "b", "value": 22})),
        ],
    );
    let error = |i: usize| answers[i].clone().unwrap_err();
    assert_eq!(error(0), "limit: the key `toolong` is 7 bytes, over `max_key_size` (4)");
    assert_eq!(error(1), "limit: the value of `a` is 11 bytes of JSON, over `max_value_size` (8)");
    assert_eq!(answers[2..4], [Ok(json!({"version": 1})), Ok(json!({"version": 2}))]);
    assert_eq!(
        error(4),
        "limit: the store holds 2 keys, the most `max_keys` (--kv-max-keys) of 2 allows: delete one to add `c`"
    );
    assert_eq!(
        error(5),
        "limit: writing `b` would make the store 11 bytes of keys and values, over `max_bytes` (--kv-max-bytes) of 10"
    );
    assert_eq!(answers[6..], [Ok(json!({"deleted": true})), Ok(json!({"version": 3})), Ok(json!({"version": 4}))]);
    s.stop(Duration::from_secs(1));
    drop(s);
    drop(kv);
    // The totals were kept with the writes: a reopened store is as full as it was.
    let kv = Kv::open(&dir, small()).unwrap();
    let s = scheduler(&kv);
    assert!(
        one(&s, "kv.put", json!({"key": "d", "value": 4})).unwrap_err().starts_with("limit: the store holds 2 keys")
    );
    s.stop(Duration::from_secs(1));
}

/// A store whose disk stalls (its file system frozen: the store's thread blocks in the
/// kernel in the middle of a write, as on a stalled disk) holds writes for it only up to
/// `max_queued_bytes`: past it, a write fails `limit` at once, naming the setting, while
/// reads go on; once the disk answers again, every write it took is carried out. Without
/// the bound every write would wait in memory, however many came.
#[test]
fn a_stalled_store_takes_writes_only_up_to_its_queue_bound() {
    const VALUE: usize = 64 << 10;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv-stalled");
    let Some(mount) = wasmproc_tests::frozen::Mount::new(&dir) else { return };
    // The write on the stalled disk and three more fit; a fifth would not.
    let settings = KvSettings { max_queued_bytes: 4 * VALUE + VALUE / 2, ..KvSettings::default() };
    let kv = Kv::open(&mount.dir().join("store"), settings).unwrap();
    let s = scheduler(&kv);
    assert_eq!(one(&s, "kv.put", json!({"key": "before", "value": 1})), Ok(json!({"version": 1})));
    // Thawed before the scheduler and the store are dropped (locals drop in reverse).
    let frozen = mount.freeze();

    let (answers, answered) = std::sync::mpsc::channel();
    let put = |n: usize| {
        let (handle, answers) = (s.handle().clone(), answers.clone());
        let put = command("kv.put", json!({"key": format!("k{n}"), "value": "x".repeat(VALUE)}));
        std::thread::spawn(move || {
            let _ = answers.send((n, wasmproc_tests::outcome_of(&handle, None, put)));
        })
    };
    let mut writers = vec![put(0)];
    assert!(
        wasmproc_tests::frozen::wait_for_thread_blocked("wasmproc-kv", HANG),
        "the store's thread did not block writing to the frozen file system"
    );
    writers.extend((1..10).map(put));

    let mut refused = Vec::new();
    while refused.len() < 6 {
        let (n, outcome) = answered.recv_timeout(HANG).expect("writes past the bound are refused at once");
        let error = outcome.expect_err("only a refusal is answered while the disk stalls");
        assert!(error.starts_with("limit: the key-value store's queue holds "), "{error}");
        assert!(error.contains(&format!("would pass `max_queued_bytes` ({})", 4 * VALUE + VALUE / 2)), "{error}");
        refused.push(n);
    }
    assert!(!refused.contains(&0), "{refused:?}");
    let read = one(&s, "kv.get", json!({"key": "before"})).expect("a read while the disk stalls");
    assert_eq!(read["value"], json!(1));
    assert!(answered.try_recv().is_err(), "a write taken was answered while the disk stalled");

    drop(frozen);
    let mut written: Vec<usize> = (0..4)
        .map(|_| {
            let (n, outcome) =
                answered.recv_timeout(HANG).expect("the writes taken are answered once the disk is back");
            assert!(outcome.is_ok(), "k{n}: {outcome:?}");
            n
        })
        .collect();
    written.sort_unstable();
    refused.sort_unstable();
    let mut all: Vec<usize> = written.iter().chain(&refused).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..10).collect::<Vec<_>>(), "each write answered once");
    for writer in writers {
        writer.join().unwrap();
    }
    for n in written {
        let stored = one(&s, "kv.get", json!({"key": format!("k{n}")})).unwrap();
        assert_eq!(stored["value"].as_str().map(str::len), Some(VALUE), "k{n}");
    }
    s.stop(Duration::from_secs(1));
}

#[test]
fn cas_writes_only_at_the_version_it_names() {
    let dir = scratch("cas");
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let s = scheduler(&kv);
    let answers = run(
        &s,
        &[
            ("kv.cas", json!({"key": "k", "version": 3, "value": "x"})),
            ("kv.cas", json!({"key": "k", "version": 0, "value": "first"})),
            ("kv.cas", json!({"key": "k", "version": 0, "value": "again"})),
            ("kv.cas", json!({"key": "k", "version": 1, "value": "second"})),
            ("kv.delete", json!({"key": "k"})),
            ("kv.cas", json!({"key": "k", "version": 2, "value": "stale"})),
            ("kv.cas", json!({"key": "k", "version": 0, "value": "new"})),
            ("kv.get", json!({"key": "k"})),
        ],
    );
    assert_eq!(
        answers,
        [
            Err("conflict: `k` is at version 0, not 3".to_owned()),
            Ok(json!({"version": 1})),
            Err("conflict: `k` is at version 1, not 0".to_owned()),
            Ok(json!({"version": 2})),
            Ok(json!({"deleted": true})),
            // Deleted and written again, it never has version 2 again (no ABA).
            Err("conflict: `k` is at version 0, not 2".to_owned()),
            Ok(json!({"version": 3})),
            Ok(json!({"value": "new", "version": 3})),
        ]
    );
    s.stop(Duration::from_secs(1));
}

/// Increments the JSON number under `counter` `times` times, each by a get and a
/// compare-and-swap retried until it succeeds; counts the conflicts it met.
fn incrementer(times: u64, conflicts: Arc<AtomicU64>) -> Scripted {
    let mut done = 0;
    let mut tag = 0;
    let mut reading = true;
    Scripted::new(move |t| {
        let result = t.events.iter().find_map(|e| completion(e, tag).cloned());
        let next = match (t.step, result) {
            (0, _) => command("kv.get", json!({"key": "counter"})),
            (_, None) => panic!("step {} has no completion of tag {tag}", t.step),
            (_, Some(Ok(read))) if reading => {
                let read: Value = read.parse_json().unwrap();
                let (value, version) = (read["value"].as_u64().unwrap_or(0), read["version"].as_u64().unwrap_or(0));
                reading = false;
                command("kv.cas", json!({"key": "counter", "version": version, "value": value + 1}))
            }
            (_, Some(Ok(_))) => {
                done += 1;
                if done == times {
                    t.out.complete(Ok(Payload::empty()));
                    return Ok(());
                }
                reading = true;
                command("kv.get", json!({"key": "counter"}))
            }
            (_, Some(Err(error))) => {
                assert!(!reading && error.starts_with("conflict: "), "{error}");
                conflicts.fetch_add(1, Ordering::Relaxed);
                reading = true;
                command("kv.get", json!({"key": "counter"}))
            }
        };
        tag += 1;
        t.out.yield_command(tag, next);
        Ok(())
    })
    .0
}

#[test]
fn cas_from_a_thousand_processes_counts_every_increment_once() {
    const PROCESSES: u64 = 1_000;
    const TIMES: u64 = 2;
    let dir = scratch("contended");
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let s = scheduler(&kv);
    let conflicts = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> =
        (0..PROCESSES).map(|_| s.handle().spawn(incrementer(TIMES, conflicts.clone()), "main").unwrap()).collect();
    for handle in handles {
        handle.join_timeout(HANG).expect("the process ends").unwrap();
    }
    let (text, _) = kv.read("counter").unwrap().unwrap();
    assert_eq!(text, (PROCESSES * TIMES).to_string());
    assert!(conflicts.load(Ordering::Relaxed) > 0, "the processes raced");
    s.stop(Duration::from_secs(1));
}

#[test]
fn a_second_open_of_an_open_store_fails_naming_the_directory() {
    let dir = scratch("locked");
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let error = format!("{:#}", Kv::open(&dir, KvSettings::default()).unwrap_err());
    assert!(error.contains(&format!("cannot open the key-value store in {}", dir.display())), "{error}");
    assert!(error.contains("it is in use by another wasmproc"), "{error}");
    drop(kv);
    Kv::open(&dir, KvSettings::default()).expect("free again once the first is closed");
}

#[test]
fn a_store_is_private_and_a_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("private");
    drop(Kv::open(&dir, KvSettings::default()).unwrap());
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let error = Kv::open(&dir, KvSettings::default()).unwrap_err().to_string();
    assert!(error.starts_with(&format!("refusing the key-value store in {}", dir.display())), "{error}");
    assert!(error.contains("other users can write to it (mode 777)"), "{error}");
}

/// The modes of `dir` and of everything in it that is not private to this user.
fn shared_entries(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut shared = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
        }
        if mode & 0o077 != 0 {
            shared.push((path, mode));
        }
    }
    shared
}

/// A store in a directory others can read (one made with a plain `mkdir`, mode 755) is
/// made private as it opens: the directory 0700, its files 0600, the values in them
/// never readable by another user.
#[test]
fn a_store_others_can_read_is_made_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("readable");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    let s = Scheduler::builder()
        .workers(1)
        .provider(kv)
        .capabilities(Capabilities::default().allow("kv.*"))
        .build()
        .unwrap();
    let put = command("kv.put", json!({"key": "secret", "value": "the value"}));
    let (process, _) = Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(1, put.clone());
        } else {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    s.handle().spawn(process, "main").unwrap().join_timeout(HANG).unwrap().unwrap();
    s.stop(Duration::from_secs(1));
    drop(s);
    // Opened again as a later run would: what the first wrote is made private too.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    drop(Kv::open(&dir, KvSettings::default()).unwrap());
    assert_eq!(shared_entries(&dir), vec![]);
    assert_eq!(std::fs::metadata(&*dir).unwrap().permissions().mode() & 0o777, 0o700);
}

/// The durable process of the idempotency test: a compare-and-swap, then (in the run
/// that crashes) a wait at `stop` before it ends with the swap's answer.
fn swapper(stop: Option<GateStop>) -> Scripted {
    Scripted::new(move |t| {
        if t.step == 0 {
            t.out.yield_command(1, command("kv.cas", json!({"key": "once", "version": 0, "value": "done"})));
            return Ok(());
        }
        if let Some(stop) = &stop {
            stop.wait();
        }
        let result = t.events.iter().find_map(|e| completion(e, 1).cloned()).expect("the swap's completion");
        t.out.set_status(Status::Complete(result));
        Ok(())
    })
    .0
}

fn durable(kv: &(impl Provider + Clone + 'static), journal: Journal, stop: Option<GateStop>) -> Scheduler {
    let stop = Mutex::new(stop);
    Scheduler::builder()
        .workers(2)
        .journal(journal)
        .capabilities(Capabilities::default().allow("kv.*"))
        .provider(kv.clone())
        .kind("swapper", move || -> anyhow::Result<Box<dyn wasmproc::Process>> {
            Ok(Box::new(swapper(stop.lock().take())))
        })
        .build()
        .unwrap()
}

#[test]
fn a_durable_cas_carried_out_again_after_a_crash_answers_as_before() {
    let dir = scratch("idempotent");
    let kv = Kv::open(&dir, KvSettings::default()).unwrap();
    cas_again_answers_as_before(&kv);
    assert_eq!(kv.read("once").unwrap(), Some(("\"done\"".to_owned(), 1)), "written once");
}

/// A durable process's swap through `kv`, carried out again after a crash (with the
/// same idempotency key), answers as the first time and writes nothing more.
fn cas_again_answers_as_before(kv: &(impl Provider + Clone + 'static)) {
    let records = Arc::new(MemoryStore::new());
    let (gate, stop) = gate();
    let first = durable(kv, Journal::with_store(records.clone()), Some(stop));
    let process = first.handle().spawn(Spawnable::kind("swapper"), SpawnOptions::new("main")).unwrap();
    // The swap has completed and its completion is in the step that waits: the journal
    // holds the step that yielded the swap, not the one that saw it complete. A crash
    // now leaves this on the disk.
    gate.wait_reached();
    let disk = records.snapshot();
    gate.open();
    let answer = process.join_timeout(HANG).expect("the process ends");
    assert_eq!(answer.clone().unwrap().parse_json::<Value>().unwrap(), json!({"version": 1}));
    first.stop(Duration::from_secs(1));
    drop(first);

    let resumed = durable(kv, Journal::with_store(disk), None);
    let processes = resumed.resumed();
    assert_eq!(processes.len(), 1, "the process is resumed");
    // The swap is carried out again with the same idempotency key: the kept answer, not
    // a conflict with its own first write.
    assert_eq!(processes[0].join_timeout(HANG).expect("the process ends"), answer);
    resumed.stop(Duration::from_secs(1));
    // Nothing was written again: the next version is the second one ever given.
    let plain = scheduler(kv);
    assert_eq!(one(&plain, "kv.get", json!({"key": "once"})), Ok(json!({"value": "done", "version": 1})));
    assert_eq!(one(&plain, "kv.put", json!({"key": "next", "value": 0})), Ok(json!({"version": 2})));
    plain.stop(Duration::from_secs(1));
}

/// The store a cluster's nodes share, on a JetStream bucket of `server`'s.
fn shared(server: &Server, bucket: &str) -> SharedKv {
    SharedKv::open(&ClusterConfig::new(server.url()), &SharedKvOptions::new().bucket(bucket)).unwrap()
}

/// The shared store answers every command as the local one does; its versions are the
/// bucket's revisions, which a delete's marker takes one of.
#[test]
fn the_shared_store_answers_each_command_as_documented() {
    let server = Server::start_jetstream().unwrap();
    let kv = shared(&server, "COMMANDS");
    let s = scheduler(&kv);
    let answers = run(
        &s,
        &[
            ("kv.get", json!({"key": "a"})),
            ("kv.put", json!({"key": "a", "value": {"n": [1, 2]}})),
            ("kv.get", json!({"key": "a"})),
            ("kv.put", json!({"key": "a", "value": null})),
            ("kv.put", json!({"key": "b/1", "value": 1})),
            ("kv.put", json!({"key": "b/2 ü", "value": "two"})),
            ("kv.delete", json!({"key": "b/1"})),
            ("kv.delete", json!({"key": "b/1"})),
            ("kv.put", json!({"key": "b/1", "value": 3})),
            ("kv.cas", json!({"key": "k", "version": 3, "value": "x"})),
            ("kv.cas", json!({"key": "k", "version": 0, "value": "first"})),
            ("kv.cas", json!({"key": "k", "version": 0, "value": "again"})),
            ("kv.cas", json!({"key": "k", "version": 7, "value": "second"})),
            ("kv.delete", json!({"key": "k"})),
            ("kv.cas", json!({"key": "k", "version": 8, "value": "stale"})),
            ("kv.cas", json!({"key": "k", "version": 0, "value": "new"})),
            ("kv.get", json!({"key": "k"})),
            ("kv.get", json!({"key": ""})),
        ],
    );
    assert_eq!(
        answers,
        [
            Ok(Value::Null),
            Ok(json!({"version": 1})),
            Ok(json!({"value": {"n": [1, 2]}, "version": 1})),
            Ok(json!({"version": 2})),
            Ok(json!({"version": 3})),
            Ok(json!({"version": 4})),
            Ok(json!({"deleted": true})),
            Ok(json!({"deleted": false})),
            Ok(json!({"version": 6})),
            Err("conflict: `k` is at version 0, not 3".to_owned()),
            Ok(json!({"version": 7})),
            Err("conflict: `k` is at version 7, not 0".to_owned()),
            Ok(json!({"version": 8})),
            Ok(json!({"deleted": true})),
            // Deleted and written again, it never has version 8 again (no ABA).
            Err("conflict: `k` is at version 0, not 8".to_owned()),
            Ok(json!({"version": 10})),
            Ok(json!({"value": "new", "version": 10})),
            Err("invalid: a key is a non-empty string".to_owned()),
        ]
    );
    let lists = run(
        &s,
        &[
            ("kv.list", json!({})),
            ("kv.list", json!({"prefix": "b/"})),
            ("kv.list", json!({"prefix": "b/", "limit": 1})),
            ("kv.list", json!({"prefix": "b/", "after": "b/1"})),
            ("kv.list", json!({"prefix": "z"})),
            ("kv.list", json!({"limit": 1_000_000})),
        ],
    );
    assert_eq!(
        lists,
        [
            Ok(json!({"keys": ["a", "b/1", "b/2 ü", "k"], "more": false})),
            Ok(json!({"keys": ["b/1", "b/2 ü"], "more": false})),
            Ok(json!({"keys": ["b/1"], "more": true})),
            Ok(json!({"keys": ["b/2 ü"], "more": false})),
            Ok(json!({"keys": [], "more": false})),
            Err("invalid: `limit` 1000000 is over the store's `list_limit` (1000)".to_owned()),
        ]
    );
    s.stop(Duration::from_secs(1));
}

/// Processes of two hosts, each with its own connection to the bucket, increment one
/// counter by compare-and-swap: every increment counts once.
#[test]
fn the_shared_store_counts_every_increment_of_two_hosts_once() {
    const PROCESSES: u64 = 50;
    const TIMES: u64 = 2;
    let server = Server::start_jetstream().unwrap();
    let hosts = [shared(&server, "CONTENDED"), shared(&server, "CONTENDED")];
    let schedulers: Vec<Scheduler> = hosts.iter().map(scheduler).collect();
    let conflicts = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..PROCESSES)
        .map(|n| {
            let s = &schedulers[n as usize % 2];
            s.handle().spawn(incrementer(TIMES, conflicts.clone()), "main").unwrap()
        })
        .collect();
    for handle in handles {
        handle.join_timeout(HANG).expect("the process ends").unwrap();
    }
    let counter = one(&schedulers[0], "kv.get", json!({"key": "counter"})).unwrap();
    assert_eq!(counter["value"], json!(PROCESSES * TIMES), "{counter}");
    assert!(conflicts.load(Ordering::Relaxed) > 0, "the processes raced");
    for s in schedulers {
        s.stop(Duration::from_secs(1));
    }
}

/// A durable process's swap carried out again on the shared store (after a crash, on
/// this host or another) is recognised by its message id: answered as before, written
/// once.
#[test]
fn a_durable_cas_carried_out_again_on_the_shared_store_answers_as_before() {
    let server = Server::start_jetstream().unwrap();
    cas_again_answers_as_before(&shared(&server, "IDEMPOTENT"));
}
