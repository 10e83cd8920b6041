//! The `kv` provider: a `kv.get` round trip from native processes (each yields a get,
//! waits for its completion, and yields the next), against the store's own read rate:
//! the same reads of the same keys, on as many threads as the scheduler has workers,
//! straight from the host ([`Kv::read`]). The gap is what a process pays for a read: its
//! step, the dispatch and the completion's wake-up.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wasmproc::provider::kv::{Kv, KvSettings};
use wasmproc::{Capabilities, Command, Event, Events, Payload, Port, Process, Scheduler, StepOutput};
use wasmproc_tests::bench::{Condition, Options, Record, Report, measure_pair};

use crate::{WARMUP, short};

/// Keys in the store, each with a value of [`VALUE_SIZE`] bytes of JSON.
const KEYS: usize = 1_000;
const VALUE_SIZE: usize = 100;

/// A store in a fresh directory under the target directory.
fn store_dir() -> PathBuf {
    let dir = crate::target_dir().join("bench").join("kv");
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Yields `kv.get` `left` times, one after another, walking the keys from `next`.
struct Reader {
    keys: Arc<Vec<Payload>>,
    left: u64,
    next: usize,
}

impl Process for Reader {
    fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
        Ok(())
    }

    fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
        for event in events {
            if let Event::Completion { result: Err(error), .. } = event {
                anyhow::bail!("`kv.get` failed: {error}");
            }
        }
        if self.left == 0 {
            out.complete(Ok(Payload::empty()));
            return Ok(());
        }
        self.left -= 1;
        self.next = (self.next + 1) % self.keys.len();
        let payload = self.keys[self.next].clone();
        out.yield_command(self.left, Command::Custom { name: "kv.get".into(), payload });
        Ok(())
    }
}

fn round_trips(s: &Scheduler, keys: &Arc<Vec<Payload>>, processes: u64, each: u64) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..processes)
        .map(|i| {
            let reader = Reader { keys: keys.clone(), left: each, next: i as usize * 7 };
            s.handle().spawn(reader, "main").expect("a reader starts")
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join(), Ok(Payload::empty()));
    }
    start.elapsed()
}

/// The same reads as `round_trips`, shared among `threads` threads.
fn direct(kv: &Kv, names: &Arc<Vec<String>>, threads: usize, processes: u64, each: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads as u64 {
            let names = names.clone();
            scope.spawn(move || {
                for i in (thread..processes).step_by(threads) {
                    let mut next = i as usize * 7;
                    for _ in 0..each {
                        next = (next + 1) % names.len();
                        assert!(kv.read(&names[next]).expect("the read succeeds").is_some());
                    }
                }
            });
        }
    });
    start.elapsed()
}

pub(crate) fn run(options: &Options, report: &mut Report) {
    let scale = if options.quick { 10 } else { 1 };
    let (processes, each) = (100, 2_000 / scale);
    let name = format!("kv/get-round-trip-{}x{}-w{}", short(processes), short(each), options.workers);
    if !options.selected(&name) {
        return;
    }
    let kv = Kv::open(&store_dir(), KvSettings::default()).expect("the store opens");
    let s = Scheduler::builder()
        .workers(options.workers)
        .capabilities(Capabilities::default().allow("kv.*"))
        .provider(kv.clone())
        .build()
        .expect("the scheduler starts");
    let names: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("key-{i:04}")).collect());
    let keys: Arc<Vec<Payload>> =
        Arc::new(names.iter().map(|key| Payload::json(&json!({ "key": key })).expect("JSON")).collect());
    fill(&s, &names);
    let (ours, theirs) =
        measure_pair(options.runs, WARMUP, &mut || round_trips(&s, &keys, processes, each), &mut || {
            direct(&kv, &names, options.workers, processes, each)
        });
    // The round trip adds a yield, a completion and a step to each read: the goal is
    // that the host's part stays under half the store's own cost.
    report.push(
        Record::rate(&name, "gets/s", processes * each, &ours, Some(&theirs)).goal(Condition::ratio_at_most(1.5)),
    );
    s.stop(Duration::from_secs(1));
}

/// Writes every key, all yielded in one step, so that they are committed in few groups.
fn fill(s: &Scheduler, names: &[String]) {
    let value = "v".repeat(VALUE_SIZE - 2);
    let puts: Vec<Command> = names
        .iter()
        .map(|key| Command::Custom {
            name: "kv.put".into(),
            payload: Payload::json(&json!({ "key": key, "value": value })).expect("JSON"),
        })
        .collect();
    let mut left = puts.len();
    let (writer, _) = wasmproc_tests::Scripted::new(move |t| {
        if t.step == 0 {
            for (tag, put) in puts.iter().enumerate() {
                t.out.yield_command(tag as u64, put.clone());
            }
            return Ok(());
        }
        for event in &t.events {
            if let Event::Completion { result, .. } = event {
                result.as_ref().map_err(|error| anyhow::anyhow!("a put failed: {error}"))?;
                left -= 1;
            }
        }
        if left == 0 {
            t.out.complete(Ok(Payload::empty()));
        }
        Ok(())
    });
    let filled = s.handle().spawn(writer, "main").expect("the writer starts").join();
    assert_eq!(filled, Ok(Payload::empty()), "every key is written");
}
