//! Durable runs through the real binary: killed with SIGKILL at random moments (with
//! processes suspended and coming back, in every other run, and a snapshot written at
//! every step, in every other pair of runs) and resumed by the same
//! command line, stopped by a signal and resumed, read back with
//! `journal ls` and `show`.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use wasmproc_tests::HANG;
use wasmproc_tests::guests::{DURABLE, LEDGER, SDK_TOUR, TIMERS, WASI_CLI};

use super::hardening::start_running;
use super::{run, scratch, wasmproc};

/// The durable example's result at its default input: four workers answer n² for n in
/// 1..=5 (4 × 55) and each reports its 5 answers. A message lost would hang the run; one
/// delivered twice would change a worker's count.
const EXPECTED: &str = "240";

/// Crashes per run of the suite; `WASMPROC_FUZZ_SCALE` multiplies them.
const CRASHES: u64 = 8;

fn start(journal: &str) -> Child {
    start_with(journal, &[])
}

/// A durable run of the example with `more` flags, its output piped.
fn start_with(journal: &str, more: &[&str]) -> Child {
    wasmproc(&[&["run", DURABLE, "--journal", journal], more].concat())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wasmproc runs")
}

/// A small generator for the kill moments: the seed is printed with any failure.
struct Moments(u64);

impl Moments {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

#[test]
fn a_run_killed_at_random_moments_resumes_to_the_uncrashed_result() {
    let scale: u64 = std::env::var("WASMPROC_FUZZ_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let dir = scratch("durable-kill");
    // An uncrashed run: its result and how long it takes.
    let journal = dir.join("clean");
    let started = Instant::now();
    let ran = run(&["run", DURABLE, "--journal", journal.to_str().unwrap()]).expect(0);
    assert_eq!(ran.stdout.trim(), EXPECTED);
    let whole = started.elapsed().as_millis() as u64;

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut moments = Moments(seed);
    let mut all_kills = 0;
    for crash in 0..CRASHES * scale {
        let journal = dir.join(format!("crash-{crash}"));
        let journal = journal.to_str().unwrap();
        // One to three kills in a row, each at a random moment of a run's length, then a
        // run left to finish.
        let kills = 1 + moments.below(3);
        // Every other run suspends its processes at nearly every wait, so kills fall
        // while processes are suspended and while they come back; every other pair
        // writes a snapshot at every step, so kills fall while one is written, and a
        // resume or a return starts from the last.
        let mut suspend: Vec<&str> = Vec::new();
        if crash % 2 == 1 {
            suspend.extend(["--suspend-after", "1ms"]);
        }
        if crash % 4 >= 2 {
            suspend.extend(["--snapshot-every", "1"]);
        }
        let suspend = suspend.as_slice();
        let mut killed = 0;
        for _ in 0..kills {
            let mut child = start_with(journal, suspend);
            std::thread::sleep(Duration::from_millis(moments.below(whole)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap();
                killed += 1;
            }
            child.wait().unwrap();
        }
        all_kills += killed;
        let ran = run(&[&["run", DURABLE, "--journal", journal], suspend].concat());
        assert_eq!(
            (ran.code, ran.stdout.trim()),
            (0, EXPECTED),
            "seed {seed}, crash {crash} after {killed} kills, with {suspend:?}; stderr: {}",
            ran.stderr
        );
    }
    eprintln!("{all_kills} kills in {} runs, every one resumed to {EXPECTED}", CRASHES * scale);
}

/// The command line of a durable run of the `ledgered` entry, its ledger in `out`.
fn ledgered(journal: &str, out: &str) -> Vec<String> {
    let provider = format!("ledger={LEDGER}");
    let grant = format!("{out}::/ledger");
    ["run", DURABLE, "--method", "ledgered", "--journal", journal, "--provider", &provider, "--dir-rw", &grant]
        .map(str::to_owned)
        .to_vec()
}

/// The ledger's lines, `KEY VALUE`, as how many times each key was recorded and its
/// value (which every record of a key must agree on).
fn ledger_counts(out: &std::path::Path) -> HashMap<String, (u64, String)> {
    let text = std::fs::read_to_string(out.join("records.txt")).unwrap_or_default();
    let mut counts: HashMap<String, (u64, String)> = HashMap::new();
    for line in text.lines() {
        let (key, value) = line.split_once(' ').unwrap_or_else(|| panic!("a ledger line is `KEY VALUE`: {line:?}"));
        let entry = counts.entry(key.to_owned()).or_insert((0, value.to_owned()));
        assert_eq!(entry.1, value, "the command {key} was carried out again with another input");
        entry.0 += 1;
    }
    counts
}

/// A side effect outside the journal, through a provider component: every `ledger.record`
/// a worker yields is appended to a file with its idempotency key before it is answered.
/// However often the host is killed, each of the 20 commands is in the file, every record
/// of one command has its key and input, and a command is carried out again only if it
/// was in flight at a kill: never more often than the kills, never more than the four
/// that can be in flight at once per kill (a command whose completion was journaled is
/// never carried out again).
#[test]
fn commands_with_effects_are_repeated_only_when_in_flight_at_a_crash_with_the_same_key() {
    let scale: u64 = std::env::var("WASMPROC_FUZZ_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let dir = scratch("durable-ledger");
    let (journal, out) = (dir.join("clean"), dir.join("clean-out"));
    std::fs::create_dir_all(&out).unwrap();
    let args = ledgered(journal.to_str().unwrap(), out.to_str().unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let ran = run(&args).expect(0);
    assert_eq!(ran.stdout.trim(), EXPECTED);
    let whole = started.elapsed().as_millis() as u64;
    let clean = ledger_counts(&out);
    assert_eq!(clean.len(), 20, "four workers, five answers each: {clean:?}");
    assert!(clean.values().all(|(count, _)| *count == 1), "{clean:?}");

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut moments = Moments(seed);
    let mut repeats = 0;
    for crash in 0..CRASHES * scale {
        let (journal, out) = (dir.join(format!("crash-{crash}")), dir.join(format!("crash-{crash}-out")));
        std::fs::create_dir_all(&out).unwrap();
        let args = ledgered(journal.to_str().unwrap(), out.to_str().unwrap());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut killed = 0;
        let mut finished = None;
        for _ in 0..1 + moments.below(3) {
            let mut child =
                wasmproc(&args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            std::thread::sleep(Duration::from_millis(moments.below(whole)));
            let exited = child.try_wait().unwrap().is_some();
            if !exited {
                child.kill().unwrap();
            }
            let output = child.wait_with_output().unwrap();
            // A run that printed its result has reported it and removed its records, even
            // if the kill came before it exited: another start would begin a new run.
            if exited {
                finished = Some(super::finish(output));
                break;
            }
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            if stdout.trim() == EXPECTED {
                let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                finished = Some(super::Ran { code: 0, stdout, stderr });
                break;
            }
            killed += 1;
        }
        let ran = finished.unwrap_or_else(|| run(&args));
        let context = format!("seed {seed}, crash {crash} after {killed} kills");
        assert_eq!((ran.code, ran.stdout.trim()), (0, EXPECTED), "{context}; stderr: {}", ran.stderr);
        let counts = ledger_counts(&out);
        assert_eq!(counts.len(), 20, "{context}: every command carried out: {counts:?}");
        let extra: u64 = counts.values().map(|(count, _)| count - 1).sum();
        assert!(counts.values().all(|(count, _)| *count <= 1 + killed), "{context}: {counts:?}");
        assert!(extra <= 4 * killed, "{context}: {extra} repeats: {counts:?}");
        repeats += extra;
    }
    eprintln!("{} runs, {repeats} commands carried out again, each in flight at a kill", CRASHES * scale);
}

#[test]
fn a_signal_suspends_a_durable_run_and_the_same_command_resumes_it() {
    let dir = scratch("durable-signal");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    // Input (2, 30): long enough (30 rounds with 20 ms sleeps) to be stopped midway.
    let child = start_running(&["run", DURABLE, "--journal", journal, "--keep-finished", "--input", "[2, 30]"]);
    std::thread::sleep(Duration::from_millis(300));
    // The journal in use is read as it is now, without its lock.
    let live = run(&["journal", "ls", journal]).expect(0);
    assert!(live.stderr.contains("a host is running this journal: what follows is as of now"), "{}", live.stderr);
    assert!(live.stdout.contains("unfinished: "), "{}", live.stdout);
    assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("suspending"), "{stderr}");

    let listed = run(&["journal", "ls", journal]).expect(0);
    assert!(listed.stdout.contains("unfinished"), "{}", listed.stdout);
    assert!(!listed.stdout.contains("failed"), "suspended, not ended: {}", listed.stdout);
    // Each says what it waits for: the workers a message or their sleep, the root its
    // answers (or its workers' exits) or its sleep between rounds.
    let waits = [
        "unfinished: idle, waits for a message",
        "unfinished: idle, waits for the exits of its children ",
        "unfinished: waits for ",
        "unfinished: blocked",
    ];
    for line in listed.stdout.lines().filter(|line| line.contains("unfinished:")) {
        assert!(waits.iter().any(|w| line.contains(w)), "{}", listed.stdout);
    }
    assert!(listed.stdout.contains("\nThe unfinished processes resume on the next run with this journal"));

    let ran = run(&["run", DURABLE, "--journal", journal, "--keep-finished", "--input", "[2, 30]"]).expect(0);
    assert!(ran.stderr.contains("resuming process"), "{}", ran.stderr);
    // Two workers, n² for n in 1..=30 (2 × 9455), and 30 answers each.
    assert_eq!(ran.stdout.trim(), "18970");
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert_eq!(listed.stdout.lines().filter(|l| l.contains("finished: ok")).count(), 3, "{}", listed.stdout);
    let root = listed.stdout.lines().nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    let shown = run(&["journal", "show", journal, &root]).expect(0);
    assert!(shown.stdout.starts_with("   0  spawn  "), "{}", shown.stdout);
    assert!(shown.stdout.contains("main([2, 30]) by the host"), "{}", shown.stdout);
    assert!(shown.stdout.contains("spawn worker(null), monitored → blocked"), "{}", shown.stdout);
    assert!(shown.stdout.contains("exit   normal 18970"), "{}", shown.stdout);
    let records = shown.stdout.lines().count();
    let last = run(&["journal", "show", journal, &root, "--last", "2"]).expect(0);
    let expected: Vec<&str> = shown.stdout.lines().skip(records - 2).collect();
    assert_eq!(last.stdout.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn a_buffered_journal_survives_a_kill_of_the_host() {
    let dir = scratch("durable-buffered");
    let alone = run(&["run", DURABLE, "--durability", "buffered"]).expect(2);
    assert!(alone.stderr.contains("required arguments were not provided:\n  --journal <DIR>"), "{}", alone.stderr);
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let buffered = ["--durability", "buffered"];
    let mut child = start_with(journal, &buffered);
    std::thread::sleep(Duration::from_millis(150));
    let killed = child.try_wait().unwrap().is_none();
    if killed {
        child.kill().unwrap();
    }
    child.wait().unwrap();
    // What the killed host handed to the operating system is in the files.
    let ran = run(&[&["run", DURABLE, "--journal", journal], &buffered[..]].concat()).expect(0);
    assert_eq!(ran.stdout.trim(), EXPECTED, "killed: {killed}");
}

#[test]
fn the_stats_of_a_durable_run_say_what_its_journal_wrote() {
    let dir = scratch("durable-stats");
    let journal = dir.join("journal");
    let ran = run(&["run", DURABLE, "--journal", journal.to_str().unwrap(), "--stats", "--json"]).expect(0);
    let out = ran.json();
    let (stats, written) = (&out["stats"], &out["stats"]["journal"]);
    let number = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a number: {out}"));
    let (processes, records, commits) =
        (number(&stats["processes"]), number(&written["records"]), number(&written["commits"]));
    // Each process's spawn, at least one step, and its exit.
    assert!(records >= 3 * processes, "{out}");
    assert!((1..=records).contains(&commits), "{out}");
    assert!(number(&written["bytes"]) > records, "{out}");
    let text = run(&["run", DURABLE, "--journal", journal.to_str().unwrap(), "--stats"]).expect(0);
    assert!(text.stderr.lines().any(|l| l.starts_with("journal ") && l.contains(" commits")), "{}", text.stderr);
    let memory = run(&["run", DURABLE, "--stats", "--json"]).expect(0).json();
    assert!(memory["stats"]["journal"].is_null(), "{memory}");
}

/// `--suspend-after` suspends a durable run's waiting processes (its --stats count them,
/// the result is the same); `never` keeps them in memory; a value without a unit is
/// refused naming both ways to write it.
#[test]
fn suspend_after_suspends_waiting_processes_and_the_stats_count_them() {
    let dir = scratch("durable-suspend");
    let stats_of = |journal: &str, after: &str| {
        let ran = run(&["run", DURABLE, "--journal", journal, "--suspend-after", after, "--stats", "--json"]).expect(0);
        let out = ran.json();
        assert_eq!(out["ok"], serde_json::json!(240), "{out}");
        out["stats"].clone()
    };
    let suspending = stats_of(dir.join("soon").to_str().unwrap(), "1ms");
    let count = |stats: &serde_json::Value, name: &str| stats[name].as_u64().unwrap_or_else(|| panic!("{stats}"));
    assert!(count(&suspending, "suspensions") > 0 && count(&suspending, "brought_back") > 0, "{suspending}");
    assert_eq!(count(&suspending, "suspended_now"), 0, "{suspending}");
    let never = stats_of(dir.join("never").to_str().unwrap(), "never");
    assert_eq!((count(&never, "suspensions"), count(&never, "brought_back")), (0, 0), "{never}");
    let text =
        run(&["run", DURABLE, "--journal", dir.join("text").to_str().unwrap(), "--suspend-after", "1ms", "--stats"])
            .expect(0);
    assert!(text.stderr.lines().any(|l| l.starts_with("suspended ") && l.contains("brought back")), "{}", text.stderr);
    let refused = run(&["run", DURABLE, "--journal", dir.join("bad").to_str().unwrap(), "--suspend-after", "5"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("`5` needs a unit") && refused.stderr.contains("`never`"), "{}", refused.stderr);
}

#[test]
fn a_process_past_the_journal_limit_fails_naming_the_flag_that_raises_it() {
    let dir = scratch("durable-limit");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let alone = run(&["run", TIMERS, "--journal-limit", "2"]).expect(2);
    assert!(alone.stderr.contains("required arguments were not provided:\n  --journal <DIR>"), "{}", alone.stderr);
    run(&["run", TIMERS, "--journal", journal, "--journal-limit", "1"]).expect(2).error_says("not in 2..");
    // Its spawn and the step that starts the sleeps; the next, after a sleep, is refused.
    run(&["run", TIMERS, "--journal", journal, "--journal-limit", "2"])
        .expect(1)
        .error_says("has 2 records, its journal's `max_records_per_process` (raise it with `--journal-limit`)");
    // The failed run was reported and its records removed: the next starts afresh.
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert_eq!(listed.stdout.lines().count(), 1, "only the header: {}", listed.stdout);
    let ran = run(&["run", TIMERS, "--journal", journal, "--journal-limit", "5"]).expect(0);
    assert_eq!(ran.stdout.trim(), "[10,20,30]");
}

#[test]
fn journal_refuses_what_it_cannot_do() {
    let dir = scratch("durable-refusals");
    let journal = dir.join("journal");
    run(&["run", WASI_CLI, "--journal", journal.to_str().unwrap()]).expect(2).error_says("cannot make it durable");
    run(&["journal", "ls", dir.join("missing").to_str().unwrap()]).expect(2).error_says("not a directory");
    run(&["run", DURABLE, "--journal", journal.to_str().unwrap()]).expect(0);
    run(&["journal", "show", journal.to_str().unwrap(), "12345"]).expect(2).error_says("holds no process 12345");
}

#[test]
fn a_journal_is_private_and_one_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("durable-private");
    let journal = dir.join("journal");
    run(&["run", DURABLE, "--journal", journal.to_str().unwrap()]).expect(0);
    assert_eq!(std::fs::metadata(&journal).unwrap().permissions().mode() & 0o777, 0o700);
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o777)).unwrap();
    run(&["run", DURABLE, "--journal", journal.to_str().unwrap()]).expect(5).error_says("other users can write to it");
    run(&["journal", "ls", journal.to_str().unwrap()]).expect(5).error_says("other users can write to it");
}

#[test]
fn a_finished_run_leaves_an_empty_journal_unless_asked_to_keep_it() {
    let dir = scratch("durable-growth");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    run(&["run", DURABLE, "--journal", journal]).expect(0);
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert_eq!(listed.stdout.lines().count(), 1, "only the header: {}", listed.stdout);
    run(&["run", DURABLE, "--journal", journal, "--keep-finished"]).expect(0);
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert_eq!(listed.stdout.lines().filter(|l| l.contains("finished: ok")).count(), 5, "{}", listed.stdout);
}

/// Every file of `dir`, recursively.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all.extend(files(&path));
        } else {
            all.push(path);
        }
    }
    all.sort();
    all
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_torn_or_damaged_journal_resumes_from_its_last_intact_commit_or_is_refused() {
    let dir = scratch("durable-damage");
    // A journal of a run killed midway: what a crash leaves.
    let original = dir.join("original");
    let mut child = start(original.to_str().unwrap());
    super::hardening::wait_until_running(&child);
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut moments = Moments(seed);
    let (mut resumed, mut refused) = (0, 0);
    for case in 0..12 {
        let damaged = dir.join(format!("damaged-{case}"));
        copy_dir(&original, &damaged);
        let targets: Vec<_> = files(&damaged).into_iter().filter(|f| std::fs::metadata(f).unwrap().len() > 0).collect();
        let file = &targets[moments.below(targets.len() as u64) as usize];
        let mut bytes = std::fs::read(file).unwrap();
        let len = bytes.len() as u64;
        if case % 2 == 0 {
            // Torn: the file cut at a random offset.
            bytes.truncate(moments.below(len) as usize);
        } else {
            // Damaged: bytes flipped in the file's last quarter.
            for _ in 0..4 {
                let at = (len - len / 4 + moments.below(len / 4 + 1)).min(len - 1) as usize;
                bytes[at] ^= 0x5a;
            }
        }
        std::fs::write(file, &bytes).unwrap();
        let ran = run(&["run", DURABLE, "--journal", damaged.to_str().unwrap(), "--timeout", "20s"]);
        let what = format!(
            "seed {seed}, case {case}, {}: code {}, stdout {}, stderr {}",
            file.display(),
            ran.code,
            ran.stdout,
            ran.stderr
        );
        match ran.code {
            // Resumed, or started afresh from a journal whose records were all lost:
            // either way the right result.
            0 => {
                assert_eq!(ran.stdout.trim(), EXPECTED, "{what}");
                resumed += 1;
            }
            // Refused, saying why.
            5 => {
                assert!(ran.stderr.contains("error: ") && ran.stderr.contains("journal"), "{what}");
                refused += 1;
            }
            // A replay that no longer matches ends the process with a non-determinism
            // error: a wrong result is never printed.
            1 => assert!(ran.stderr.contains("non-determinism") || ran.stderr.contains("cannot be resumed"), "{what}"),
            _ => panic!("neither resumed nor refused: {what}"),
        }
    }
    eprintln!("damaged journals: {resumed} resumed, {refused} refused");
    assert!(resumed + refused > 0);
}

#[test]
fn a_journal_is_not_resumed_with_another_program() {
    let dir = scratch("durable-identity");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let mut child = start(journal);
    super::hardening::wait_until_running(&child);
    child.kill().unwrap();
    child.wait().unwrap();
    let listed = run(&["journal", "ls", journal]).expect(0);
    if !listed.stdout.contains("unfinished") {
        // Killed before its first commit: nothing to resume, nothing to refuse.
        return;
    }
    // Verified offline with the program that wrote it: every replay matches.
    let verified = run(&["journal", "verify", journal, DURABLE]).expect(0);
    assert!(verified.stdout.contains("replay as recorded") && !verified.stdout.contains("non-determinism"));
    let refused = run(&["journal", "verify", journal, wasmproc_tests::guests::FAN_OUT]).expect(5);
    assert!(refused.stderr.contains("sha256:"), "{}", refused.stderr);
    let ran = run(&["run", wasmproc_tests::guests::FAN_OUT, "--journal", journal]).expect(2);
    let error = ran.stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_default().to_owned();
    assert_eq!(error.matches("sha256:").count(), 2, "both hashes named: {error}");
    assert!(error.contains(&format!("`wasmproc journal forget {journal}`")), "{error}");
    // The journal is left as it was: the right program still resumes it.
    let ran = run(&["run", DURABLE, "--journal", journal]).expect(0);
    assert_eq!(ran.stdout.trim(), EXPECTED);
}

/// Starts a durable run of the example with `flags`, waits until its root logs its third
/// round, and suspends it with SIGTERM: its journal then holds the unfinished run. The
/// run's stderr.
fn suspended(journal: &str, flags: &[&str]) -> String {
    let mut child = start_with(journal, flags);
    let stderr = child.stderr.take().expect("piped");
    let (third, reached) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("round 3 of") {
                let _ = third.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if reached.recv_timeout(HANG).is_err() {
        child.kill().unwrap();
        panic!("the run did not reach its third round: {}", reader.join().unwrap());
    }
    assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert_eq!(status.code(), Some(143), "{stderr}");
    stderr
}

/// The first `error:` line of `stderr`.
fn error_line(stderr: &str) -> String {
    stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_default().to_owned()
}

#[test]
fn a_journal_refuses_a_run_that_asks_for_another_input_or_method_naming_both() {
    let dir = scratch("durable-another-run");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    suspended(journal, &["--input", "[2, 30]"]);
    // The new user's order B, from a file, after order A was stopped midway: refused,
    // not answered with order A's result.
    let order_b = dir.join("order-b.json");
    std::fs::write(&order_b, "[3, 2]\n").unwrap();
    let refused = run(&["run", DURABLE, "--journal", journal, "--input-file", order_b.to_str().unwrap()]).expect(2);
    assert!(refused.stdout.is_empty(), "no result: {}", refused.stdout);
    let error = error_line(&refused.stderr);
    assert!(error.contains("holds an unfinished run (process "), "{error}");
    // Each input as it was written.
    assert!(error.contains("of `main([2, 30])`, and this command asks for `main([3, 2])`"), "{error}");
    assert!(error.contains(&format!("start afresh: `wasmproc journal forget {journal}`")), "{error}");
    // Another method, and no input where the run had one: refused too.
    let error = error_line(&run(&["run", DURABLE, "--journal", journal, "--method", "ledgered"]).expect(2).stderr);
    assert!(error.contains("asks for `ledgered()`"), "{error}");
    let error = error_line(&run(&["run", DURABLE, "--journal", journal]).expect(2).stderr);
    assert!(error.contains("asks for `main()`"), "{error}");
    // The same input, however spaced, is the same run: it resumes.
    let ran = run(&["run", DURABLE, "--journal", journal, "--keep-finished", "--input", "[2,30]"]).expect(0);
    assert_eq!(ran.stdout.trim(), "18970");
    // Kept: the same command reports it again; another input is refused, not answered
    // with the kept result.
    let again = run(&["run", DURABLE, "--journal", journal, "--keep-finished", "--input", "[2, 30]"]).expect(0);
    assert_eq!(again.stdout.trim(), "18970");
    assert!(again.stderr.contains("had finished"), "{}", again.stderr);
    let error = error_line(
        &run(&["run", DURABLE, "--journal", journal, "--keep-finished", "--input", "[3, 2]"]).expect(2).stderr,
    );
    assert!(error.contains("holds a finished run"), "{error}");
}

#[test]
fn journal_forget_drops_a_run_so_the_next_starts_afresh() {
    let dir = scratch("durable-forget");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let empty = run(&["journal", "forget", journal]).expect(2);
    assert!(empty.stderr.contains("not a directory"), "{}", empty.stderr);
    suspended(journal, &["--input", "[2, 30]"]);
    let forgot = run(&["journal", "forget", journal]).expect(0);
    let line = forgot.stdout.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("forgot the run of process ") && line.contains("(`main([2, 30])`), unfinished: 3 processes")
    );
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert_eq!(listed.stdout.lines().count(), 1, "only the header: {}", listed.stdout);
    let again = run(&["journal", "forget", journal]).expect(0);
    assert!(again.stdout.contains("holds no run: nothing to forget"), "{}", again.stdout);
    // Three workers, two rounds: 3 × (1 + 4) answers and 2 answered each.
    let ran = run(&["run", DURABLE, "--journal", journal, "--input", "[3, 2]"]).expect(0);
    assert_eq!(ran.stdout.trim(), "21");
    assert!(!ran.stderr.contains("resuming"), "{}", ran.stderr);
}

#[test]
fn journal_cancel_ends_a_run_in_its_own_code_and_the_next_run_says_so() {
    let dir = scratch("durable-cancel");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let nothing = run(&["journal", "cancel", dir.to_str().unwrap(), DURABLE]).expect(2);
    assert!(nothing.stderr.contains("holds no unfinished run: nothing to cancel"), "{}", nothing.stderr);
    suspended(journal, &["--input", "[2, 30]"]);
    let refused = run(&["journal", "cancel", journal, wasmproc_tests::guests::FAN_OUT]).expect(2);
    assert_eq!(error_line(&refused.stderr).matches("sha256:").count(), 2, "{}", refused.stderr);
    let cancelled = run(&["journal", "cancel", journal, DURABLE, "--grace", "5s"]).expect(0);
    // The root and its two workers each ended in their own code, on the cancel.
    assert!(
        cancelled.stdout.starts_with("cancelled 3 processes; 0 terminated after --grace 5s\n"),
        "{}",
        cancelled.stdout
    );
    assert!(cancelled.stdout.contains(": error cancelled: by `wasmproc journal cancel`\n"), "{}", cancelled.stdout);
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert!(!listed.stdout.contains("unfinished"), "{}", listed.stdout);
    assert!(listed.stdout.contains("failed: cancelled: by `wasmproc journal cancel`"), "{}", listed.stdout);
    // The same command reports the cancelled run instead of resuming it, once.
    let reported = run(&["run", DURABLE, "--journal", journal, "--input", "[2, 30]"]).expect(1);
    assert!(reported.stderr.contains("had finished"), "{}", reported.stderr);
    assert!(error_line(&reported.stderr).contains("cancelled: by `wasmproc journal cancel`"), "{}", reported.stderr);
    let ran = run(&["run", DURABLE, "--journal", journal, "--input", "[3, 2]"]).expect(0);
    assert_eq!(ran.stdout.trim(), "21");
}

#[test]
fn journal_cancel_terminates_what_ignores_its_cancel_once_the_grace_has_passed() {
    let dir = scratch("durable-cancel-stubborn");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let child = start_with(journal, &["--method", "stubborn"]);
    super::hardening::wait_until_running(&child);
    let deadline = Instant::now() + HANG;
    while !run(&["journal", "ls", journal]).expect(0).stdout.contains("unfinished: waits for ") {
        assert!(Instant::now() < deadline, "no step of the run was recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(143));
    let cancelled = run(&["journal", "cancel", journal, DURABLE, "--grace", "200ms"]).expect(0);
    assert!(
        cancelled.stdout.starts_with("cancelled 1 process; 1 terminated after --grace 200ms\n"),
        "{}",
        cancelled.stdout
    );
    // Killed: it did not end within the grace of its cancel.
    assert!(cancelled.stdout.contains(": was killed\n"), "{}", cancelled.stdout);
    let reported = run(&["run", DURABLE, "--journal", journal, "--method", "stubborn"]).expect(1);
    assert!(error_line(&reported.stderr).contains(" was killed"), "{}", reported.stderr);
}

#[test]
fn journal_cancel_and_forget_refuse_a_journal_a_host_is_running() {
    let dir = scratch("durable-busy");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let child = start_with(journal, &["--input", "[2, 200]"]);
    super::hardening::wait_until_running(&child);
    let cancel = run(&["journal", "cancel", journal, DURABLE]);
    let forget = run(&["journal", "forget", journal]);
    assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(143), "{}", String::from_utf8_lossy(&output.stderr));
    for (verb, ran) in [("cancel", cancel), ("forget", forget)] {
        let ran = ran.expect(2);
        let expected = format!("a host is running the journal in `{journal}`: stop it first");
        assert!(ran.error_says(&expected).stderr.contains(&format!("then `journal {verb}` it")));
    }
    // The run is still there to resume.
    assert!(run(&["journal", "ls", journal]).expect(0).stdout.contains("unfinished"));
}

#[test]
fn a_resumed_run_keeps_its_grants_narrowed_by_the_command_line_never_widened_and_says_so() {
    let dir = scratch("durable-grants");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    suspended(journal, &["--input", "[2, 30]", "--keep-finished"]);
    // `sleep` withdrawn: whichever process sleeps next is refused it, and the run cannot
    // finish; `terminate`, which the run was started without, is not granted.
    let flags = ["--input", "[2, 30]", "--keep-finished", "--deny", "sleep", "--allow", "terminate", "--timeout", "3s"];
    let resumed = run(&[&["run", DURABLE, "--journal", journal], &flags[..]].concat());
    let notices: Vec<&str> = resumed.stderr.lines().filter(|l| l.contains("resumes with the grants")).collect();
    assert_eq!(notices.len(), 1, "one line: {}", resumed.stderr);
    assert!(notices[0].contains("narrowed by this command line: `sleep` withdrawn; `terminate` not added"));
    assert_ne!(resumed.code, 0, "{}", resumed.stderr);
    let listed = run(&["journal", "ls", journal]).expect(0);
    assert!(listed.stdout.contains("failed: permission denied: sleep"), "{}\n{}", listed.stdout, resumed.stderr);
}

#[test]
fn replayed_steps_log_nothing_again_unless_asked_and_then_marked() {
    let dir = scratch("durable-replayed-logs");
    let (first, second) = (dir.join("first"), dir.join("second"));
    let (first, second) = (first.to_str().unwrap(), second.to_str().unwrap());
    let before = suspended(first, &["--input", "[2, 30]"]);
    assert!(before.contains("] info: round 1 of 30"), "{before}");
    let resumed = run(&["run", DURABLE, "--journal", first, "--input", "[2, 30]"]).expect(0);
    assert!(!resumed.stderr.contains("round 1 of 30"), "a replayed line printed again: {}", resumed.stderr);
    assert!(resumed.stderr.contains("] info: round 30 of 30"), "the new steps' lines: {}", resumed.stderr);

    suspended(second, &["--input", "[2, 30]"]);
    let alone = run(&["run", DURABLE, "--replayed-logs"]).expect(2);
    assert!(alone.stderr.contains("--journal <DIR>"), "{}", alone.stderr);
    let flags = ["--input", "[2, 30]", "--replayed-logs", "--log-format", "json"];
    let shown = run(&[&["run", DURABLE, "--journal", second], &flags[..]].concat()).expect(0);
    let lines: Vec<serde_json::Value> = shown.stderr.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let round = |n: &str| lines.iter().find(|l| l["message"] == format!("round {n} of 30")).cloned();
    let replayed = round("1").unwrap_or_else(|| panic!("{}", shown.stderr));
    assert_eq!(replayed["replayed"], true, "{replayed}");
    let new = round("30").unwrap_or_else(|| panic!("{}", shown.stderr));
    assert!(new.get("replayed").is_none(), "{new}");
}

/// A linked pair in a durable run, the host killed with SIGKILL once both run, and the
/// run resumed by the same command: the link is restored from the journal, so the
/// child's failure after the resume still ends its parent, which names it.
#[test]
fn a_linked_pair_keeps_its_link_when_the_killed_host_resumes() {
    let dir = scratch("durable-linked");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let args =
        ["run", SDK_TOUR, "--method", "linked_pair", "--input", "1500", "--journal", journal, "--timeout", "60s"];
    let mut child = start_running(&args);
    // Both processes are in the journal: the parent's spawn (with its link) is recorded.
    let deadline = Instant::now() + HANG;
    loop {
        let listed = run(&["journal", "ls", journal]).expect(0);
        if listed.stdout.matches("unfinished:").count() >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the child never started: {}", listed.stdout);
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let ran = run(&args);
    assert_ne!(ran.code, 0, "the parent ends with its child's error; stderr: {}", ran.stderr);
    assert!(ran.stderr.contains("resuming process"), "{}", ran.stderr);
    assert!(ran.stderr.contains("exited because linked process"), "{}", ran.stderr);
    assert!(ran.stderr.contains("the linked child failed after 1500 ms"), "{}", ran.stderr);
}

/// A durable process's HTTP requests carry their commands' idempotency keys, a key each;
/// a process that is not durable sends none.
#[test]
fn a_durable_process_posts_with_its_commands_idempotency_keys() {
    let recorder = wasmproc_tests::recorder::Recorder::start();
    let host = recorder.host();
    let journal = scratch("durable-posted").join("journal");
    let expected = run(&["run", DURABLE, "--input", "[2, 3]"]).expect(0).stdout;
    for (path, journal) in [("/durable", Some(journal.to_str().unwrap())), ("/plain", None)] {
        let input = serde_json::json!([2, 3, recorder.url(path)]).to_string();
        let mut args = vec!["run", DURABLE, "--method", "posted", "--allow-host", &host, "--input", &input];
        args.extend(journal.map(|journal| ["--journal", journal]).into_iter().flatten());
        assert_eq!(run(&args).expect(0).stdout, expected, "{path}");
    }
    let received = recorder.received();
    let durable: Vec<_> = received.iter().filter(|post| post.path == "/durable").collect();
    let keys: std::collections::HashSet<_> =
        durable.iter().map(|post| post.key.clone().unwrap_or_else(|| panic!("no key: {post:?}"))).collect();
    assert_eq!((durable.len(), keys.len()), (6, 6), "2 workers post 3 answers each, a key each: {durable:?}");
    let plain: Vec<_> = received.iter().filter(|post| post.path == "/plain").collect();
    assert_eq!(plain.len(), 6, "{plain:?}");
    assert!(plain.iter().all(|post| post.key.is_none()), "{plain:?}");
}
