//! Durable processes: the same Wasm workloads with and without a journal (on this
//! machine's disk, every group commit synced), what the journal writes, how long a commit
//! makes a command wait, and how long a host takes to resume 10,000 processes of 100 steps
//! each. The limit to compare with: each store's own synced, batched write rate on records
//! of the size a step writes.
//!
//! The stores: `log` ([`LogStore`], what `Journal::open` makes), `fjall`
//! ([`FjallStore`]) and `jetstream` ([`JetStreamStore`], on a `nats-server -js` on
//! loopback started for the run, when there is one). `DURABLE_STORE=log`, `=fjall` or
//! `=jetstream` measures one of them; by default all, the cycles and the store's rate on
//! each, the recovery on `log` and `jetstream`, the other benchmarks on the first.
//! `JETSTREAM_PIPELINE=N` sets how many commits the JetStream store keeps in flight
//! (`JetStreamOptions::pipeline`; its default otherwise), to compare depths in one run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmproc::cluster::{ClusterConfig, JetStreamOptions, JetStreamStore};
use wasmproc::handler::{Completer, ReadOnly, Request};
use wasmproc::journal::{Batch, FjallStore, Journal, JournalSettings, Key, LogStore, Store};
use wasmproc::scheduler::{SpawnOptions, Spawnable};
use wasmproc::wasm::{Component, Config, Runtime};
use wasmproc::{Capabilities, Command, Events, Payload, Port, Process, Scheduler, Status, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, measure_pair};
use wasmproc_tests::nats::Server;

use crate::wasm::{GUEST, INIT_TIME_LIMIT};
use crate::{WARMUP, short};

const RECOVERY_PROCESSES: u64 = 10_000;
const RECOVERY_STEPS: u64 = 100;

/// A fresh journal directory under the target directory.
fn journal_dir(name: &str) -> PathBuf {
    let dir = crate::target_dir().join("bench").join(format!("journal-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The bench guest, compiled once.
fn component(bytes: &[u8]) -> Component {
    let config = Config::default().max_instances(16_384).init_time_limit(INIT_TIME_LIMIT).no_disk_cache();
    let runtime = Runtime::new(config).expect("the runtime starts");
    runtime.load_bytes(bytes).expect("the bench guest loads")
}

/// How a scheduler's `now` is registered: as a command with an effect, which a durable
/// step carries out after its commit, or as one that only reads, carried out at once.
#[derive(Clone, Copy, PartialEq)]
enum Now {
    Effect,
    Read,
}

/// Bench-guest schedulers: `now` completes at once, unless `held` keeps the `now` of
/// processes past their allowance (see `recovery`).
fn scheduler(
    component: &Component,
    workers: usize,
    journal: Option<Journal>,
    held: Option<Arc<Held>>,
    registered: Now,
) -> Scheduler {
    let component = component.clone();
    let now = move |r: Request<'_>| match &held {
        Some(held) => held.now(r),
        None => r.complete(Ok(Payload::empty())),
    };
    let mut builder = Scheduler::builder()
        .workers(workers)
        .capabilities(Capabilities::default().allow("now"))
        .kind("bench", component);
    builder = match registered {
        Now::Effect => builder.handler("now", now),
        Now::Read => builder.handler("now", ReadOnly(now)),
    };
    if let Some(journal) = journal {
        builder = builder.journal(journal);
    }
    builder.build().expect("the scheduler starts")
}

/// Answers every `now` but each process's last, which it keeps: the processes stay
/// blocked, with their steps in the journal, until the host stops.
#[derive(Default)]
struct Held {
    kept: Mutex<Vec<Completer>>,
    counts: Mutex<std::collections::HashMap<u64, u64>>,
}

impl Held {
    fn now(&self, request: Request<'_>) {
        let caller = request.caller().as_u64();
        let count = {
            let mut counts = self.counts.lock();
            let count = counts.entry(caller).or_default();
            *count += 1;
            *count
        };
        if count < RECOVERY_STEPS {
            request.complete(Ok(Payload::empty()));
        } else {
            self.kept.lock().push(request.into_parts().1);
        }
    }
}

fn cycles(s: &Scheduler, processes: u64, each: u64) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..processes)
        .map(|_| {
            let options = SpawnOptions::new("cycles").input(vec![Payload::u64(each)]);
            s.handle().spawn(Spawnable::kind("bench"), options).expect("`cycles` starts")
        })
        .collect();
    for h in handles {
        assert_eq!(h.join(), Ok(Payload::u64(each)));
    }
    start.elapsed()
}

fn lifecycles(s: &Scheduler, total: u64) -> Duration {
    let start = Instant::now();
    let mut handles = Vec::with_capacity(512);
    for _ in 0..total {
        handles.push(s.handle().spawn(Spawnable::kind("bench"), "echo").expect("`echo` starts"));
        if handles.len() == 512 {
            handles.drain(..).for_each(|h| assert!(h.join().is_ok()));
        }
    }
    handles.drain(..).for_each(|h| assert!(h.join().is_ok()));
    start.elapsed()
}

/// A native process that yields `now` (registered as a command with an effect) `n` times,
/// one after another, and returns how long each took to complete, in nanoseconds: in a
/// durable scheduler, the wait for the step's group commit.
struct Waits {
    left: u64,
    last: Option<Instant>,
    waits: Vec<u64>,
}

impl Process for Waits {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        if let Some(last) = self.last {
            self.waits.push(last.elapsed().as_nanos() as u64);
        }
        if self.left == 0 {
            self.waits.sort_unstable();
            let at = |q: f64| self.waits[((self.waits.len() - 1) as f64 * q) as usize];
            out.set_status(Status::Complete(Payload::json(&[at(0.5), at(0.99)]).map_err(|e| e.to_string())));
            return Ok(());
        }
        self.left -= 1;
        self.last = Some(Instant::now());
        out.yield_command(self.left, Command::Custom { name: "now".into(), payload: Payload::empty() });
        Ok(())
    }
}

/// The store alone: `records` records of `size` bytes in synced batches of `group`.
fn store_rate(store: &dyn Store, records: u64, size: usize, group: u64) -> Duration {
    let value = vec![0x5a; size];
    let start = Instant::now();
    let mut seq = 0;
    while seq < records {
        let mut batch = Batch::default();
        for _ in 0..group {
            batch.puts.push((Key { process: 1 + seq % 256, seq }, value.clone()));
            seq += 1;
        }
        store.commit(&batch, true).expect("the commit succeeds");
    }
    start.elapsed()
}

/// The stores to measure (`DURABLE_STORE`): the first is the one of every benchmark,
/// the others are measured on the cycles and on their own rate. `jetstream` only with a
/// server to run it on.
fn stores() -> Vec<&'static str> {
    let all = match std::env::var("DURABLE_STORE").as_deref() {
        Ok("log") => vec!["log"],
        Ok("fjall") => vec!["fjall"],
        Ok("jetstream") => vec!["jetstream"],
        Ok(other) if !other.is_empty() => panic!("`DURABLE_STORE={other}`: expected `log`, `fjall` or `jetstream`"),
        _ => vec!["log", "fjall", "jetstream"],
    };
    all.into_iter()
        .filter(|store| match (*store, jetstream()) {
            ("jetstream", Err(why)) => {
                println!("durable/ on jetstream: skipped: {why}");
                false
            }
            _ => true,
        })
        .collect()
}

/// How many commits the JetStream store keeps in flight: `JETSTREAM_PIPELINE`, or the
/// store's default.
pub(crate) fn pipeline() -> usize {
    std::env::var("JETSTREAM_PIPELINE")
        .ok()
        .and_then(|depth| depth.parse().ok())
        .unwrap_or(wasmproc::cluster::DEFAULT_PIPELINE)
}

/// The run's JetStream server, started at first use.
pub(crate) fn jetstream() -> Result<&'static Server, &'static str> {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    SERVER.get_or_init(Server::start_jetstream).as_ref().map_err(String::as_str)
}

/// A journal on the run's JetStream server (which is the run's alone), one shard of the
/// journals' stream per `name`: the same whenever a name is opened again in the run.
fn jetstream_journal(name: &str) -> Journal {
    static SHARDS: OnceLock<Mutex<std::collections::HashMap<String, u32>>> = OnceLock::new();
    let server = jetstream().expect("the run's JetStream server");
    let shard = {
        let mut shards = SHARDS.get_or_init(Mutex::default).lock();
        let next = shards.len() as u32;
        *shards.entry(name.to_owned()).or_insert(next)
    };
    let options = JetStreamOptions::new().shard(shard).pipeline(pipeline());
    let store = JetStreamStore::open(&ClusterConfig::new(server.url()), &options).expect("the store opens");
    Journal::with_store(store)
}

/// Durable against in-memory step cycles of `processes` × `each`, with what the journal
/// wrote meanwhile.
fn measure_cycles(
    options: &Options,
    report: &mut Report,
    name: &str,
    store: &str,
    durable: &Scheduler,
    memory: &Scheduler,
    (processes, each): (u64, u64),
) -> (u64, f64, f64) {
    let before = durable.handle().journal_stats().expect("durable");
    let (ours, theirs) = measure_pair(options.runs, WARMUP, &mut || cycles(durable, processes, each), &mut || {
        cycles(memory, processes, each)
    });
    let after = durable.handle().journal_stats().expect("durable");
    let steps = processes * each;
    let record = Record::rate(name, "steps/s", steps, &ours, Some(&theirs));
    report.push(record.goal(Condition::ratio_at_most(2.0)));
    let runs = (options.runs + WARMUP) as u64;
    let (records, bytes, commits) =
        (after.records - before.records, after.bytes - before.bytes, after.commits - before.commits);
    println!(
        "  {name} on {store}: {} bytes a record, {:.0} records a commit, {} synced commits/s, {} records/s",
        bytes / records.max(1),
        records as f64 / commits.max(1) as f64,
        short((commits as f64 / (ours.median.as_secs_f64() * runs as f64)) as u64),
        short((records as f64 / (ours.median.as_secs_f64() * runs as f64)) as u64),
    );
    (bytes / records.max(1), records as f64 / commits.max(1) as f64, steps as f64 / ours.median.as_secs_f64())
}

/// A journal on the store of kind `store` in `dir`.
fn open_journal(store: &str, dir: &Path) -> Journal {
    match store {
        "fjall" => Journal::with_store(FjallStore::open(dir).expect("the store opens")),
        "jetstream" => jetstream_journal(&dir.file_name().map(|name| name.to_string_lossy()).unwrap_or_default()),
        _ => Journal::with_store(LogStore::open(dir).expect("the store opens")),
    }
}

pub fn run(options: &Options, report: &mut Report) {
    let scale = if options.quick { 10 } else { 1 };
    let (processes, each) = (200 / scale, 500);
    let lifecycle_count = 20_000 / scale;
    let cycles_name =
        |store: &str| format!("durable/cycles-{}x{}-w{}-{store}", short(processes), short(each), options.workers);
    let read_cycles_name =
        |store: &str| format!("durable/read-cycles-{}x{}-w{}-{store}", short(processes), short(each), options.workers);
    let store_name = |store: &str| format!("durable/store-synced-records-{store}");
    let lifecycle_name = format!("durable/lifecycle-{}-w{}", short(lifecycle_count), options.workers);
    let latency_name = "durable/commit-wait-p50".to_owned();
    let recovery_name = format!("durable/recovery-{}x{}", short(RECOVERY_PROCESSES), RECOVERY_STEPS);
    let mut names =
        vec![lifecycle_name.clone(), latency_name.clone(), recovery_name.clone(), format!("{recovery_name}-jetstream")];
    names.extend(
        ["log", "fjall", "jetstream"]
            .iter()
            .flat_map(|store| [cycles_name(store), read_cycles_name(store), store_name(store)]),
    );
    if !names.iter().any(|name| options.selected(name)) {
        return;
    }
    let stores = stores();
    let bytes = std::fs::read(GUEST).unwrap_or_else(|e| panic!("failed to read `{GUEST}`: {e}"));
    let bytes = component(&bytes);
    let memory = scheduler(&bytes, options.workers, None, None, Now::Effect);
    let mut settings = JournalSettings::default();
    if let Some(us) = std::env::var("DURABLE_WINDOW_US").ok().and_then(|v| v.parse().ok()) {
        settings.group_window = Duration::from_micros(us);
    }

    for (i, store) in stores.iter().enumerate() {
        let first = i == 0;
        let cycles_name = cycles_name(store);
        let wanted = options.selected(&cycles_name)
            || options.selected(&read_cycles_name(store))
            || first && (options.selected(&lifecycle_name) || options.selected(&latency_name));
        if !wanted {
            continue;
        }
        let journal = open_journal(store, &journal_dir(&format!("runs-{store}"))).settings(settings.clone());
        let durable = scheduler(&bytes, options.workers, Some(journal), None, Now::Effect);
        if options.selected(&cycles_name) {
            let (record_bytes, per_commit, steps_rate) =
                measure_cycles(options, report, &cycles_name, store, &durable, &memory, (processes, each));
            if *store == "jetstream" && options.selected("jetstream/publish-raw") {
                // The limit: the server's own acknowledged publishes, one at a time as the
                // store makes them, of the size the cycles' commits had.
                let server = jetstream().expect("the run's JetStream server");
                let per_commit = per_commit.round().max(1.0) as usize;
                let commits = (processes * each) / per_commit as u64;
                let raw = crate::jetstream::raw_publish_rate(
                    server,
                    record_bytes as usize,
                    per_commit,
                    commits.max(100),
                    pipeline(),
                );
                println!(
                    "  JetStream alone, acknowledged publishes of {per_commit} records of {record_bytes} bytes, {} in flight: {} records/s; the durable steps reach {:.0}% of it",
                    pipeline(),
                    short(raw as u64),
                    steps_rate / raw * 100.0
                );
                report.push(Record::single("jetstream/publish-raw", "records/s", raw));
                let ratio = Record::single(format!("{cycles_name}-vs-publish"), "steps/s", steps_rate)
                    .with_baseline(raw, raw / steps_rate);
                report.push(ratio.goal(Condition::ratio_at_most(2.0)));
            }
        }
        let read_cycles_name = read_cycles_name(store);
        if options.selected(&read_cycles_name) {
            let journal = open_journal(store, &journal_dir(&format!("reads-{store}"))).settings(settings.clone());
            let reading = scheduler(&bytes, options.workers, Some(journal), None, Now::Read);
            measure_cycles(options, report, &read_cycles_name, store, &reading, &memory, (processes, each));
            reading.stop(Duration::from_secs(1));
        }
        if first && options.selected(&lifecycle_name) {
            let (ours, theirs) =
                measure_pair(options.runs, WARMUP, &mut || lifecycles(&durable, lifecycle_count), &mut || {
                    lifecycles(&memory, lifecycle_count)
                });
            let record = Record::rate(&lifecycle_name, "lifecycles/s", lifecycle_count, &ours, Some(&theirs));
            report.push(record.goal(Condition::ratio_at_most(2.0)));
        }
        if first && options.selected(&latency_name) {
            let waits = Waits { left: 2_000 / scale, last: None, waits: Vec::new() };
            let result = durable.handle().spawn(waits, "main").expect("starts").join().expect("ends");
            let [p50, p99]: [u64; 2] = result.parse_json().expect("two figures");
            println!(
                "  commit wait of a command on {store}: p50 {:.3} ms, p99 {:.3} ms",
                p50 as f64 / 1e6,
                p99 as f64 / 1e6
            );
            report.push(Record::single(&latency_name, "ms", p50 as f64 / 1e6));
            report.push(Record::single("durable/commit-wait-p99", "ms", p99 as f64 / 1e6));
        }
        durable.stop(Duration::from_secs(1));
    }
    memory.stop(Duration::from_secs(1));

    // Records of a cycle step's size, in groups of the size the cycles made; the stores
    // alternate, three runs each, so that the disk's drift affects them alike.
    let rated: Vec<&str> = stores.iter().copied().filter(|store| options.selected(&store_name(store))).collect();
    let records = 200_000 / scale;
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); rated.len()];
    for run in 0..3 {
        for (store, rates) in rated.iter().zip(&mut rates) {
            let opened = open_journal(store, &journal_dir(&format!("store-{store}-{run}")));
            let elapsed = store_rate(&**opened.store(), records, 200, 64);
            rates.push(records as f64 / elapsed.as_secs_f64());
        }
    }
    for (store, mut rates) in rated.iter().zip(rates) {
        rates.sort_by(f64::total_cmp);
        println!("  {store} alone, synced batches of 64 records of 200 bytes: {:.0?} records/s", rates);
        report.push(Record::single(store_name(store), "records/s", rates[rates.len() / 2]));
    }

    let recovered: Vec<&str> = stores
        .iter()
        .copied()
        .enumerate()
        .filter(|&(i, store)| i == 0 || store == "jetstream")
        .map(|(_, store)| store)
        .collect();
    for store in recovered {
        let recovery_name = if store == stores[0] { recovery_name.clone() } else { format!("{recovery_name}-{store}") };
        if !options.selected(&recovery_name) {
            continue;
        }
        let dir = journal_dir(&format!("recovery-{store}"));
        let held = Arc::new(Held::default());
        let s = scheduler(&bytes, options.workers, Some(open_journal(store, &dir)), Some(held.clone()), Now::Effect);
        for _ in 0..RECOVERY_PROCESSES / scale {
            let options = SpawnOptions::new("cycles").input(vec![Payload::u64(RECOVERY_STEPS + 1)]);
            s.handle().spawn(Spawnable::kind("bench"), options).expect("starts");
        }
        while held.kept.lock().len() < (RECOVERY_PROCESSES / scale) as usize {
            std::thread::sleep(Duration::from_millis(10));
        }
        // A durable scheduler's stop suspends: every process stays in the journal. The
        // kept completers hold the processes, and through them the journal: let go.
        s.stop(Duration::ZERO);
        drop(s);
        held.kept.lock().clear();
        // From opening the journal to every process resumed: reading every record,
        // making every process again, replaying every step, rewiring what was under way.
        let start = Instant::now();
        let journal = open_journal(store, &dir);
        let opened = start.elapsed();
        let resumed = scheduler(&bytes, options.workers, Some(journal), None, Now::Effect);
        let elapsed = start.elapsed();
        println!(
            "  resume on {store}: the journal opened in {} ms, every process resumed {} ms later",
            opened.as_millis(),
            (elapsed - opened).as_millis()
        );
        let handles = resumed.resumed();
        assert_eq!(handles.len() as u64, RECOVERY_PROCESSES / scale, "every process is resumed");
        for handle in handles {
            assert_eq!(handle.join(), Ok(Payload::u64(RECOVERY_STEPS + 1)), "and ends as it would have");
        }
        report.push(Record::single(&recovery_name, "s", elapsed.as_secs_f64()).goal(Condition::median_at_most(2.0)));
        resumed.stop(Duration::ZERO);
    }
}
