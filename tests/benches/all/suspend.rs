//! Suspended durable processes (`Builder::suspend_after`): what one costs while it waits
//! out of memory, and how long its next event takes to bring it back.
//!
//! Each count runs in a child process of the bench (a fresh address space, as `idle`'s):
//! a durable scheduler on a journal on disk (`LogStore`, buffered commits: the memory is
//! the measurement, not the disk), processes suspended after 1 ms of waiting, the
//! durable example's `gather` with `1` (an SDK guest waiting in `ctx.recv()`) spawned in
//! batches of [`BATCH`], each batch left to be suspended before the next. The child
//! reads RSS and page tables before the first spawn and once every process is
//! suspended: `suspend/rss-per-suspended-*` is their growth divided by the count, which
//! holds what a suspended process keeps (its cell, its registry entry, its records in the
//! journal's index, the embedder's exit slot) and what the allocator kept of the
//! batches' instances. The goal, from issue 35: at most 1 KiB. The child stops spawning
//! when the machine has less than 4 GiB available (`suspend/reached-*` says how many).
//!
//! Then `suspend/wake-*`: [`WAKES`] suspended processes, one at a time, each sent a
//! message and waited for until its result: the message's record committed, the process
//! brought back (made again, its history replayed from the journal), its step, its exit
//! committed. Baseline: the same on a scheduler that never suspends, in the same child.
//!
//! Quick mode measures 10k; the full run 100k and 1M.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmproc::Payload;
use wasmproc::Scheduler;
use wasmproc::journal::{Durability, Journal, JournalSettings};
use wasmproc::scheduler::{ProcessHandle, SpawnOptions, Spawnable};
use wasmproc::wasm::{Config, Runtime};
use wasmproc_tests::bench::{Condition, Options, Record, Report, Sample};

use crate::idle::run_child_for;
use crate::short;

/// The guest: the durable example, whose `gather` waits for messages.
const GUEST: &str = env!("GUEST_DURABLE");
/// Processes spawned before the child waits for them to be suspended.
const BATCH: u32 = 5_000;
/// Suspended processes woken one at a time for the wake latency.
const WAKES: usize = 500;
/// The longest a child may take before it is killed: only catches a hang.
const CHILD_TIMEOUT: Duration = Duration::from_secs(900);
/// The longest a batch may take to be suspended: a bound on a failure.
const WAIT_CAP: Duration = Duration::from_secs(120);
/// A child stops spawning when the machine has less memory available than this.
const MIN_AVAILABLE_KIB: u64 = 4 * 1024 * 1024;
/// What a suspended durable process may cost (issue 35).
const GOAL_KIB: f64 = 1.0;

/// Runs the selected counts, each in a child, into `report`.
pub fn run(options: &Options, report: &mut Report) {
    let counts: &[u64] = if options.quick { &[10_000] } else { &[100_000, 1_000_000] };
    let name = |what: &str, count: u64| format!("suspend/{what}-{}", short(count));
    for &count in counts {
        if !options.selected(&name("rss-per-suspended", count)) {
            continue;
        }
        let Some(result) = run_child(&format!("suspended {count} {}", options.workers)) else {
            report.push(Record::single(name("reached", count), "processes", 0.0));
            continue;
        };
        let figure = |field: &str| result[field].as_f64().unwrap_or(f64::NAN);
        report.push(Record::single(name("reached", count), "processes", figure("suspended")));
        report.push(Record::single(name("rss-per-suspended", count), "KiB", figure("rss_kib_per")));
        report.push(Record::single(name("page-tables-per-suspended", count), "KiB", figure("pte_kib_per")));
        let marginal = figure("rss_kib_marginal") + figure("pte_kib_marginal");
        report.push(
            Record::single(name("memory-per-suspended-beyond-first-batch", count), "KiB", marginal)
                .goal(Condition::median_at_most(GOAL_KIB)),
        );
        for label in ["p50", "p99"] {
            if !figure(&format!("wake_{label}_us")).is_finite() || !figure(&format!("live_{label}_us")).is_finite() {
                continue;
            }
            let ours = Sample::of(vec![Duration::from_secs_f64(figure(&format!("wake_{label}_us")) / 1e6)]);
            let theirs = Sample::of(vec![Duration::from_secs_f64(figure(&format!("live_{label}_us")) / 1e6)]);
            report.push(Record::micros(format!("{}/{label}", name("wake", count)), &ours, &theirs));
        }
    }
}

/// Runs the child measurement `task`; its `@result` line, or `None` if it failed.
fn run_child(task: &str) -> Option<Value> {
    let stdout = run_child_for(task, CHILD_TIMEOUT)?;
    stdout.lines().find_map(|line| serde_json::from_str(line.strip_prefix("@result ")?).ok())
}

/// The measurement `task` of a child process: `suspended COUNT WORKERS`.
pub fn child(task: &str) {
    let words: Vec<&str> = task.split(' ').collect();
    let ["suspended", count, workers] = words.as_slice() else { panic!("unknown child task `{task}`") };
    suspended(count.parse().expect("a count"), workers.parse().expect("workers"));
}

/// A `/proc/self/status` or `/proc/meminfo` field in KiB.
fn proc_kib(path: &str, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path} is not readable: {e}"))
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':')?.trim().strip_suffix(" kB")?.parse().ok())
        .unwrap_or_else(|| panic!("no `{field}` in {path}"))
}

/// A durable scheduler on a fresh journal in `dir`, with the guest as kind `durable`.
fn scheduler(dir: &std::path::Path, workers: usize, suspend: Option<Duration>) -> Scheduler {
    // A generous `init` limit: under other builds' load an `init` can pass the default's
    // 100 ms, and a refused spawn ends the count.
    let config = Config::default().max_instances(2 * BATCH).no_disk_cache().init_time_limit(Duration::from_secs(10));
    let component = Runtime::new(config).expect("a runtime").load(GUEST).expect("the guest loads");
    let mut settings = JournalSettings::default();
    settings.durability = Durability::Buffered;
    let journal = Journal::open(dir).expect("a journal").settings(settings);
    Scheduler::builder()
        .workers(workers)
        .journal(journal)
        .kind("durable", component)
        .suspend_after(suspend)
        .build()
        .expect("a scheduler")
}

fn spawn(scheduler: &Scheduler) -> Option<ProcessHandle> {
    let options = SpawnOptions::new("gather").input(vec![Payload::json(&1).expect("JSON")]);
    scheduler.handle().spawn(Spawnable::kind("durable"), options).map_err(|e| println!("a spawn failed: {e:#}")).ok()
}

/// Waits until `done` holds, for at most [`WAIT_CAP`]; whether it did.
fn until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT_CAP;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Wakes `handles`' processes one at a time with a message; each one's time from the
/// send to its result.
fn wakes(scheduler: &Scheduler, handles: &[ProcessHandle]) -> Vec<Duration> {
    let mut times = Vec::with_capacity(handles.len());
    for handle in handles {
        let begun = Instant::now();
        scheduler
            .handle()
            .send(handle.pid(), "m", Payload::json(&7).expect("JSON"))
            .expect("a suspended process takes a message");
        let result = handle.join_timeout(WAIT_CAP).expect("woken within the cap");
        times.push(begun.elapsed());
        assert_eq!(result, Ok(Payload::json(&[("m", 7)]).expect("JSON")));
    }
    times
}

fn quantile_us(times: &[Duration], q: f64) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort();
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(index).map_or(f64::NAN, |t| t.as_secs_f64() * 1e6)
}

/// `count` `gather` processes suspended, then [`WAKES`] of them woken; the same wakes on
/// live processes of a scheduler that does not suspend.
fn suspended(count: u64, workers: usize) {
    let dir = std::env::temp_dir().join(format!("wasmproc-bench-suspend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let scheduler = scheduler(&dir.join("suspending"), workers, Some(Duration::from_millis(1)));
    // Sampled processes, spread over the count: the ones woken afterwards.
    let every = (count / WAKES as u64).max(1);
    let mut sampled = Vec::with_capacity(WAKES);
    let (rss_before, pte_before) = (proc_kib("/proc/self/status", "VmRSS"), proc_kib("/proc/self/status", "VmPTE"));
    // After the first batch: the instance pool's slots and the allocator's arenas that
    // the batches reuse are in, so what grows from here is what suspended processes keep.
    let mut first_batch = None;
    let begun = Instant::now();
    let mut spawned = 0u64;
    'spawning: while spawned < count {
        let batch = u64::from(BATCH).min(count - spawned);
        for _ in 0..batch {
            let Some(handle) = spawn(&scheduler) else { break 'spawning };
            if spawned.is_multiple_of(every) && sampled.len() < WAKES {
                sampled.push(handle);
            }
            spawned += 1;
        }
        if !until(|| scheduler.handle().stats().suspended as u64 == spawned) {
            println!("suspended x{count}: {spawned} spawned, not all suspended within {WAIT_CAP:?}");
            break;
        }
        if first_batch.is_none() {
            first_batch =
                Some((spawned, proc_kib("/proc/self/status", "VmRSS"), proc_kib("/proc/self/status", "VmPTE")));
        }
        if proc_kib("/proc/meminfo", "MemAvailable") < MIN_AVAILABLE_KIB {
            println!("suspended x{count}: stopped at {spawned}, under 4 GiB available");
            break;
        }
    }
    let stats = scheduler.handle().stats();
    // Let the journal's background work (compaction) settle.
    thread::sleep(Duration::from_secs(2));
    let (rss_after, pte_after) = (proc_kib("/proc/self/status", "VmRSS"), proc_kib("/proc/self/status", "VmPTE"));
    let suspended = stats.suspended as u64;
    let per = |after: u64, before: u64| after.saturating_sub(before) as f64 / suspended.max(1) as f64;
    let (first, rss_first, pte_first) = first_batch.unwrap_or((0, rss_before, pte_before));
    let beyond = suspended.saturating_sub(first).max(1) as f64;
    let (rss_marginal, pte_marginal) =
        (rss_after.saturating_sub(rss_first) as f64 / beyond, pte_after.saturating_sub(pte_first) as f64 / beyond);
    println!(
        "suspended x{count}: beyond the first batch of {first} ({:.0} MiB with it): RSS {:.3} KiB, page tables {:.3} KiB \
         a process",
        rss_first.saturating_sub(rss_before) as f64 / 1024.0,
        rss_marginal,
        pte_marginal
    );
    println!(
        "suspended x{count}: {spawned} spawned and {suspended} suspended in {:.1} s; RSS +{:.0} MiB = {:.3} KiB a process, \
         page tables {:.3} KiB",
        begun.elapsed().as_secs_f64(),
        rss_after.saturating_sub(rss_before) as f64 / 1024.0,
        per(rss_after, rss_before),
        per(pte_after, pte_before)
    );
    let woken = wakes(&scheduler, &sampled);
    drop(sampled);
    scheduler.stop(Duration::ZERO);
    drop(scheduler);

    let live = scheduler_live(&dir, workers);
    let _ = std::fs::remove_dir_all(&dir);
    let result = json!({
        "spawned": spawned,
        "suspended": suspended,
        "rss_kib_per": per(rss_after, rss_before),
        "pte_kib_per": per(pte_after, pte_before),
        "rss_kib_marginal": rss_marginal,
        "pte_kib_marginal": pte_marginal,
        "wake_p50_us": quantile_us(&woken, 0.5),
        "wake_p99_us": quantile_us(&woken, 0.99),
        "live_p50_us": quantile_us(&live, 0.5),
        "live_p99_us": quantile_us(&live, 0.99),
    });
    println!(
        "wake of a suspended process: p50 {:.0} µs, p99 {:.0} µs; of a live one: p50 {:.0} µs, p99 {:.0} µs",
        quantile_us(&woken, 0.5),
        quantile_us(&woken, 0.99),
        quantile_us(&live, 0.5),
        quantile_us(&live, 0.99)
    );
    println!("@result {result}");
}

/// The wakes of [`WAKES`] live (never suspended) processes.
fn scheduler_live(dir: &std::path::Path, workers: usize) -> Vec<Duration> {
    let scheduler = scheduler(&dir.join("live"), workers, None);
    let handles: Vec<ProcessHandle> = (0..WAKES).filter_map(|_| spawn(&scheduler)).collect();
    // Their first steps have run (each waits in `recv`).
    until(|| scheduler.handle().stats().workers.iter().map(|w| w.executed).sum::<u64>() >= WAKES as u64);
    thread::sleep(Duration::from_millis(200));
    let times = wakes(&scheduler, &handles);
    scheduler.stop(Duration::ZERO);
    times
}
