//! `run --supervise FILE` and `run --restart POLICY`: supervision trees described in a
//! file (JSON or TOML) and a restart policy for one entry process, run end to end with
//! the example guests; and the bad files and flag combinations a user will try.

use std::time::{Duration, Instant};

use wasmproc_tests::HANG;
use wasmproc_tests::guests::{FETCHER, HELLO, SDK_TOUR};

use super::hardening::start_running;
use super::{run, scratch};

/// A spec file in a scratch directory of its own.
fn spec_file(test: &str, name: &str, text: &str) -> String {
    let path = scratch(test).join(name);
    std::fs::write(&path, text).expect("write the spec");
    path.to_str().expect("utf-8").to_owned()
}

#[test]
fn a_supervision_tree_from_toml_restarts_a_trapping_child_until_its_intensity() {
    // The SDK tour's `element` panics past the end of its three elements.
    let file = spec_file(
        "supervise-toml",
        "tree.toml",
        &format!(
            "strategy = \"one_for_one\"\nintensity = 2\nperiod = \"1h\"\n\n[[children]]\nid = \"element\"\n\
             kind = \"{SDK_TOUR}\"\nmethod = \"element\"\ninput = [7]\n"
        ),
    );
    let ran = run(&["run", "--supervise", &file]).expect(1);
    let ran =
        ran.error_says("restart intensity reached: 3 restarts within 1h (`intensity` 2), the last of child `element`");
    assert!(ran.stderr.contains("index out of bounds"), "{}", ran.stderr);
}

#[test]
fn a_supervision_tree_from_json_ends_with_its_significant_childs_result() {
    let spec = serde_json::json!({
        "strategy": "one_for_all",
        "auto_shutdown": "any_significant",
        "children": [
            {"id": "greeter", "kind": HELLO, "method": "greet", "input": ["tree"], "restart": "temporary"},
            {"id": "element", "kind": "tour.wasm", "method": "element", "input": [1], "restart": "transient",
             "significant": true},
        ],
    });
    let file = spec_file("supervise-json", "tree.json", &spec.to_string());
    // A relative kind is the path from the spec's directory, wherever the run starts.
    let dir = std::path::Path::new(&file).parent().expect("a directory");
    std::fs::copy(SDK_TOUR, dir.join("tour.wasm")).expect("copy the guest");
    let ran = run(&["run", "--supervise", &file, "--json"]).expect(0);
    assert_eq!(ran.json(), serde_json::json!({"ok": 2}));
}

#[test]
fn restart_gives_the_entry_process_a_restart_policy() {
    let overflow = ["run", HELLO, "--method", "add", "--input", "[9223372036854775807, 1]", "--restart", "transient"];
    run(&[&overflow[..], &["--restart-intensity", "2", "--restart-period", "1h", "--restart-backoff", "1ms"]].concat())
        .expect(1)
        .error_says("3 restarts within 1h (`intensity` 2), the last of child `hello`");
    let ran = run(&["run", HELLO, "--method", "add", "--input", "[40, 2]", "--restart", "transient"]).expect(0);
    assert_eq!(ran.stdout.trim(), "42");
    let ran =
        run(&["run", HELLO, "--method", "add", "--input", "[40, 2]", "--restart", "temporary", "--json"]).expect(0);
    assert_eq!(ran.json(), serde_json::json!({"ok": 42}));
}

#[test]
fn bad_spec_files_and_conflicting_flags_are_refused_saying_why() {
    let toml =
        spec_file("supervise-bad", "bad.toml", "strategy = \"one_for_one\"\n\n[[children]]\nid = \"a\"\nkind = 7\n");
    let ran = run(&["run", "--supervise", &toml]).expect(2);
    let ran = ran.error_says("cannot read the supervisor spec");
    assert!(ran.stderr.contains("bad.toml") && ran.stderr.contains("line 5"), "{}", ran.stderr);
    let dup = spec_file(
        "supervise-dup",
        "dup.json",
        r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": "x.wasm"}, {"id": "a", "kind": "y.wasm"}]}"#,
    );
    run(&["run", "--supervise", &dup])
        .expect(2)
        .error_says("`children[1].id`: the id `a` is already the id of `children[0]`");
    let missing = spec_file(
        "supervise-missing",
        "missing.json",
        r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": "nowhere.wasm"}]}"#,
    );
    run(&["run", "--supervise", &missing]).expect(2).error_says("the child kind `nowhere.wasm`");
    let good = spec_file(
        "supervise-flags",
        "good.json",
        &serde_json::json!({"strategy": "one_for_one", "children": [{"id": "h", "kind": HELLO, "method": "greet", "input": ["x"]}]}).to_string(),
    );
    run(&["run", HELLO, "--supervise", &good]).expect(2).error_says("drop `");
    run(&["run", "--supervise", &good, "--input", "1"]).expect(2).error_says("--input with --supervise");
    run(&["run", "--supervise", &good, "--restart", "permanent"]).expect(2).error_says("--restart with --supervise");
    let journal = scratch("supervise-journal");
    run(&["run", HELLO, "--restart", "permanent", "--journal", journal.to_str().expect("utf-8")])
        .expect(2)
        .error_says("--restart permanent with --journal: a durable process that ends has finished its run");
    run(&["run", "--supervise", &good, "--cluster", "nats://127.0.0.1:1"]).expect(2).error_says(
        "`--supervise` with --cluster: supervised runs do not run on a cluster yet: the supervisor would run",
    );
    run(&["run", HELLO, "--restart", "transient", "--cluster", "nats://127.0.0.1:1"])
        .expect(2)
        .error_says("a run on a cluster brings only its one program to the nodes");
    let ran = run(&["run", HELLO, "--restart-intensity", "3"]).expect(2);
    assert!(ran.stderr.contains("--restart"), "{}", ran.stderr);
    run(&["run"]).expect(2);
}

/// A durable supervision tree: a `steady` child that runs until stopped and a `crasher`
/// that fails 600 ms after each start, restarted after a backoff of 300 ms, then 600 ms,
/// each less up to half at random, until the third failure passes the intensity (2 in an
/// hour). Its journal keeps every record.
fn durable_tree(test: &str) -> (String, String) {
    let spec = serde_json::json!({
        "strategy": "one_for_one",
        "intensity": 2,
        "period": "1h",
        "backoff": {"initial": "300ms", "max": "10s", "multiplier": 2, "jitter": 0.5},
        "children": [
            {"id": "steady", "kind": SDK_TOUR, "method": "deaf", "shutdown": "brutal"},
            {"id": "crasher", "kind": SDK_TOUR, "method": "fails_after", "input": [600], "shutdown": "brutal"},
        ],
    });
    let file = spec_file(test, "tree.json", &spec.to_string());
    let journal = std::path::Path::new(&file).with_file_name("journal");
    (file, journal.to_str().expect("utf-8").to_owned())
}

/// The escalation every run of [`durable_tree`] ends with.
const ESCALATION: &str = "restart intensity reached: 3 restarts within 1h (`intensity` 2), the last of child \
                          `crasher`, which returned an error: the linked child failed after 600 ms";

/// `journal ls`'s rows as (method, state), pids left out, in the order listed.
fn processes(journal: &str) -> Vec<(String, String)> {
    let listed = run(&["journal", "ls", journal]).expect(0);
    listed
        .stdout
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty() && !line.starts_with("The "))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let state = fields[4..].join(" ");
            (fields[2].to_owned(), state.split(':').next().unwrap_or_default().to_owned())
        })
        .collect()
}

/// How many of `rows` ran `method`.
fn ran(rows: &[(String, String)], method: &str) -> usize {
    rows.iter().filter(|(m, _)| m == method).count()
}

/// A supervision tree in a durable run, the host killed with SIGKILL once the supervisor
/// has restarted its crasher, and resumed by the same command: the resume is a replay,
/// not a restart. No child is started because of the crash (`steady` ran once, the
/// crasher three times, as in the uninterrupted run), the restart count carries over
/// (the third failure in all escalates, not a third after the resume), the replayed
/// supervisor draws the same jitter (a draw of its own would differ from its record, a
/// non-determinism error), and the run ends as the uninterrupted one did.
#[test]
fn a_durable_supervision_tree_resumes_by_replay_when_the_killed_host_restarts() {
    let (file, clean) = durable_tree("supervise-durable-clean");
    let whole = run(&["run", "--supervise", &file, "--journal", &clean, "--keep-finished"]).expect(1);
    let whole = whole.error_says(ESCALATION);
    let uninterrupted = processes(&clean);
    assert_eq!((ran(&uninterrupted, "deaf"), ran(&uninterrupted, "fails_after")), (1, 3), "{uninterrupted:?}");

    let (file, journal) = durable_tree("supervise-durable-killed");
    let args = ["run", "--supervise", &file, "--journal", &journal, "--keep-finished", "--timeout", "60s"];
    let mut host = start_running(&args);
    // Killed once the first restart is under way: the second crasher is in the journal.
    let deadline = Instant::now() + HANG;
    while ran(&processes(&journal), "fails_after") < 2 {
        assert!(Instant::now() < deadline, "the crasher was never restarted: {:?}", processes(&journal));
        std::thread::sleep(Duration::from_millis(20));
    }
    host.kill().expect("the host is killed");
    host.wait().expect("the host ends");

    let resumed = run(&args).expect(1);
    assert!(resumed.stderr.contains("resuming process"), "{}", resumed.stderr);
    let resumed = resumed.error_says(ESCALATION);
    let after = processes(&journal);
    assert_eq!(after, uninterrupted, "the same processes, ending the same way, as without the crash");
    let error = |ran: &super::Ran| ran.stderr.lines().find(|l| l.starts_with("error: ")).map(str::to_owned);
    assert_eq!(error(&resumed), error(&whole));
}

/// The backoff as the journal saw it: the supervisor's record that took a child's exit
/// yielded a `sleep` of the backoff's computed delay (300 ms, then 600 ms, less at most
/// half: the jitter), and the record that restarted the child came at least that long
/// after it, and not ten times as long. Times are the journal's, each record's shown to
/// three or four significant figures after the one before, so their sum is allowed 1 ms
/// for the rounding.
#[test]
fn backoff_delays_are_observed_in_the_journal_within_bounds() {
    let (file, journal) = durable_tree("supervise-durable-backoff");
    run(&["run", "--supervise", &file, "--journal", &journal, "--keep-finished"]).expect(1).error_says(ESCALATION);
    let listed = run(&["journal", "ls", &journal]).expect(0);
    let supervisor = listed.stdout.lines().nth(1).and_then(|l| l.split_whitespace().next()).expect("a row");
    let shown = run(&["journal", "show", &journal, supervisor]).expect(0);
    let records: Vec<(Duration, &str)> = shown
        .stdout
        .lines()
        .filter(|line| line.contains(" step "))
        .map(|line| {
            let after = line.split_once(" step ").expect("a step").1.trim_start();
            let (offset, rest) = after.split_at(after.find(|c: char| c.is_ascii_alphabetic() || c == 'µ').unwrap());
            let unit = rest.split_whitespace().next().unwrap();
            let value: f64 = offset.trim().trim_start_matches('+').parse().unwrap_or_else(|e| panic!("{line}: {e}"));
            let seconds = match unit {
                "µs" => value / 1e6,
                "ms" => value / 1e3,
                "s" => value,
                other => panic!("a unit of time, got {other:?} in {line}"),
            };
            (Duration::from_secs_f64(seconds), line)
        })
        .collect();
    let mut delays = Vec::new();
    for (at, (_, line)) in records.iter().enumerate() {
        let Some(sleep) = line.split_once(": sleep ").map(|(_, rest)| rest.split_whitespace().next().unwrap()) else {
            continue;
        };
        assert!(line.contains("exit of "), "a backoff follows a child's exit: {line}");
        let restart = (at + 1..records.len())
            .find(|&i| records[i].1.contains(": spawn fails_after"))
            .unwrap_or_else(|| panic!("the child is restarted after {line}"));
        let observed: Duration = records[at + 1..=restart].iter().map(|(offset, _)| *offset).sum();
        delays.push((sleep.to_owned(), observed));
    }
    assert_eq!(delays.len(), 2, "a backoff before each of the two restarts: {}", shown.stdout);
    for ((sleep, observed), base) in delays.iter().zip([300, 600]) {
        let sleep = debug_duration(sleep);
        let base = Duration::from_millis(base);
        assert!(
            sleep >= base / 2 && sleep <= base,
            "a backoff of {sleep:?} for {base:?}, jitter 0.5: {}",
            shown.stdout
        );
        assert!(
            *observed + Duration::from_millis(1) >= sleep,
            "restarted {observed:?} after the exit, within its {sleep:?} backoff"
        );
        assert!(*observed < sleep * 10, "{observed:?} for a backoff of {sleep:?}: {}", shown.stdout);
    }
}

/// A duration as `{:?}` writes it: `300ms`, `227.5123ms`, `1.5s`, `15µs`, `100ns`.
fn debug_duration(text: &str) -> Duration {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (value, unit) = text.split_at(split);
    let value: f64 = value.parse().unwrap_or_else(|e| panic!("a duration, got {text:?}: {e}"));
    let scale = match unit {
        "ns" => 1e-9,
        "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        other => panic!("a unit of time, got {other:?} in {text:?}"),
    };
    Duration::from_secs_f64(value * scale)
}

/// An HTTP server on loopback that counts the requests for each path: `/attempt` answers
/// 503 to its first `failures` requests and 200 `ok` after; any other path 200.
struct Flaky {
    port: u16,
    counts: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
}

impl Flaky {
    fn start(failures: u32) -> Flaky {
        use std::io::{BufRead as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let counts = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let counted = counts.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = std::io::BufReader::new(stream.try_clone().expect("a clone"));
                let mut head = String::new();
                let _ = reader.read_line(&mut head);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let n = {
                    let mut counts = counted.lock().unwrap();
                    let n = counts.entry(path.clone()).or_insert(0);
                    *n += 1;
                    *n
                };
                let (status, body) =
                    if path == "/attempt" && n <= failures { ("503 Unavailable", "no") } else { ("200 OK", "ok") };
                let response =
                    format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = stream.write_all(response.as_bytes());
            }
        });
        Flaky { port, counts }
    }

    fn count(&self, path: &str) -> u32 {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// `run --journal --restart transient` of the fetcher's `flaky` entry, against `server`,
/// with `intensity` retries.
fn flaky_run(test: &str, server: &Flaky, intensity: &str) -> super::Ran {
    let journal = scratch(test).join("journal");
    let host = format!("127.0.0.1:{}", server.port);
    let input = serde_json::json!({"before": format!("http://{host}/before"), "url": format!("http://{host}/attempt")});
    let input = input.to_string();
    let journal = journal.to_str().expect("utf-8");
    run(&[
        "run",
        FETCHER,
        "--method",
        "flaky",
        "--input",
        &input,
        "--allow-host",
        &host,
        "--journal",
        journal,
        "--restart",
        "transient",
        "--restart-intensity",
        intensity,
        "--restart-period",
        "1h",
        "--restart-backoff",
        "20ms",
        "--timeout",
        "60s",
    ])
}

/// A durable process that traps is retried from its last journaled step, after a
/// backoff, up to the policy's intensity (as Golem retries a failed worker). The
/// fetcher's `flaky` fetches `/before`, then `/attempt`, and panics unless `/attempt`
/// answers 200; the server fails `/attempt` twice. Each retry is a fresh instance
/// replayed to the last journaled step, the fetch of `/attempt` (whose answer the journal
/// never took) made again: the run ends with `ok` after two retries, and `/before`, the
/// effect of the steps before the trap, was fetched once, not once an attempt.
#[test]
fn a_durable_process_that_traps_is_retried_from_its_last_journaled_step() {
    let server = Flaky::start(2);
    let ran = flaky_run("retry-durable", &server, "3").expect(0);
    assert_eq!(ran.stdout.trim(), "\"ok\"", "{}", ran.stderr);
    assert_eq!((server.count("/before"), server.count("/attempt")), (1, 3), "{}", ran.stderr);
    let notices: Vec<&str> =
        ran.stderr.lines().filter(|l| l.contains("retrying it from its last journaled step")).collect();
    assert_eq!(notices.len(), 2, "{}", ran.stderr);
    assert!(notices[0].contains("trapped: panic: the server answered 503"), "{}", notices[0]);
    assert!(notices[0].contains("(retry 1 of at most 3 within 1h)"), "{}", notices[0]);
    assert!(notices[1].contains("(retry 2 of at most 3 within 1h)"), "{}", notices[1]);
}

/// Past the policy's intensity the trap is the process's end: the run fails with it.
#[test]
fn a_durable_process_that_keeps_trapping_fails_with_its_trap_past_the_intensity() {
    let server = Flaky::start(10);
    let ran = flaky_run("retry-durable-fails", &server, "2").expect(1);
    let ran = ran.error_says("trapped: panic: the server answered 503");
    assert_eq!((server.count("/before"), server.count("/attempt")), (1, 3), "two retries: {}", ran.stderr);
}
