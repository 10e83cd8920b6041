//! What a new user tripped over and what a hostile guest could print: guest text that
//! forges host lines, a panic's message, input of the wrong shape, limits named by their
//! flags, the ungranted-commands warning, the shorthand with a process component, what
//! `journal ls` says a waiting parent waits for, and the file a cache entry was compiled
//! from.

use wasmproc_tests::guests::{NOTES, SDK_TOUR};

use super::*;

/// Text that forges lines on a terminal: a host `error:` line, a `[pid 1]` line after a
/// carriage return, a colour escape, a one-byte CSI and a right-to-left override.
const FORGED: &str = "ok\nerror: the host was hacked\r[pid 1] info: \u{1b}[31mred\u{9b}2J\u{202e}txt";

/// What a guest logs, prints or fails with stays on its lines, its
/// control characters escaped, in text and in JSON.
#[test]
fn a_guest_cannot_forge_host_lines_or_act_on_the_terminal() {
    let input = serde_json::to_string(FORGED).expect("a JSON string");
    let ran = run(&["run", SDK_TOUR, "--method", "echo", "--input", &input]).expect(1);
    assert!(!ran.stderr.contains(['\u{1b}', '\r', '\u{9b}', '\u{202e}']), "{:?}", ran.stderr);
    let errors: Vec<&str> = ran.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "the guest's `error:` is no line of its own: {}", ran.stderr);
    assert!(errors[0].starts_with("error: process "), "{}", errors[0]);
    assert!(errors[0].contains(" returned an error: ok\\nerror: the host was hacked\\r"), "{}", errors[0]);
    assert!(!ran.stderr.lines().any(|l| l.starts_with("[pid 1]")), "{}", ran.stderr);
    let escaped = "error: the host was hacked\\r[pid 1] info: \\u{1b}[31mred\\u{9b}2J\\u{202e}txt";
    let has_line = |tail: String| assert!(ran.stderr.lines().any(|l| l.ends_with(&tail)), "{tail:?}: {}", ran.stderr);
    // A log call is one line whatever it holds; stdout and stderr lines end at newlines.
    has_line(format!("] info: ok\\n{escaped}"));
    for source in ["stdout", "stderr"] {
        has_line(format!("] {source}: ok"));
        has_line(format!("] {source}: {escaped}"));
    }

    let json = run(&["--log-format", "json", "run", SDK_TOUR, "--method", "echo", "--input", &input]).expect(1);
    assert!(!json.stderr.contains(['\u{1b}', '\r', '\u{9b}', '\u{202e}']), "{:?}", json.stderr);
    let lines: Vec<Value> = json
        .stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not one JSON object a line ({e}): {line}")))
        .collect();
    let logged = lines.iter().find(|l| l["source"] == "info").expect("the log line");
    assert_eq!(logged["message"], FORGED, "JSON keeps the text, escaped as JSON");
    let error = lines.iter().find(|l| l["level"] == "error").expect("the error");
    let message = error["message"].as_str().expect("a message");
    assert!(
        message.starts_with("process ") && message.ends_with(&format!(" returned an error: {FORGED}")),
        "{message}"
    );
}

/// A panic's message is the process's error; the Wasm backtrace is
/// shown with `-v` only.
#[test]
fn a_panic_is_reported_by_its_message_and_the_backtrace_only_with_verbose() {
    let out_of_bounds = "index out of bounds: the len is 3 but the index is 5";
    let ran = run(&["run", SDK_TOUR, "--method", "element", "--input", "5"]).expect(1);
    let ran = ran.error_says(&format!(" trapped: panic: {out_of_bounds} (at ")).error_says("error: process ");
    assert!(!ran.stderr.contains("backtrace:"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("unreachable"), "{}", ran.stderr);
    let ran = run(&["run", SDK_TOUR, "--method", "element", "--input", "5", "--json"]).expect(1);
    let json = ran.json();
    assert!(json["error"].as_str().is_some_and(|e| e.contains(out_of_bounds)), "{}", ran.stdout);
    assert_eq!(
        (json["exit"]["reason"].as_str(), json["exit"]["trap"]["kind"].as_str()),
        (Some("trap"), Some("panic")),
        "{json}"
    );
    let message = json["exit"]["trap"]["message"].as_str().expect("the trap's message");
    assert!(message.starts_with(out_of_bounds), "{json}");
    assert!(json["exit"]["pid"].as_u64().is_some(), "{json}");
    let verbose = run(&["-v", "run", SDK_TOUR, "--method", "element", "--input", "5"]).expect(1);
    assert!(verbose.stderr.contains("wasm backtrace:"), "{}", verbose.stderr);
    // A guest without the SDK: std's hook on its stderr all the same.
    run(&["run", HOSTILE, "--method", "panic"])
        .expect(1)
        .error_says("trapped: panic: ")
        .error_says("panics on purpose");
}

/// Input the entry cannot take is a usage error (exit 2), and the
/// place the guest names is in the text the user wrote.
#[test]
fn input_of_the_wrong_shape_exits_2_pointing_into_the_users_text() {
    run(&["run", HELLO, "--method", "add", "--input", "[1,     \"two\"]"])
        .expect(2)
        .error_says("the entry method `add` refused its input")
        .error_says("line 1 column 13");
    let dir = scratch("new-user-input");
    let file = dir.join("input.json");
    std::fs::write(&file, "[\n  1,\n    \"two\"\n]\n").expect("write the input");
    let file = file.to_str().expect("utf-8");
    run(&["run", HELLO, "--method", "add", "--input-file", file]).expect(2).error_says("line 3 column 9");
    let ran = run(&["run", HELLO, "--method", "add", "--input-file", file, "--json"]).expect(2);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    // The same text of the right shape runs as it was written.
    std::fs::write(dir.join("input.json"), "[\n  40,\n    2\n]\n").expect("write the input");
    assert_eq!(run(&["run", HELLO, "--method", "add", "--input-file", file]).expect(0).stdout, "42\n");
}

/// A limit's error names the flag that sets it.
#[test]
fn limit_errors_name_the_flags() {
    let ran = run(&["run", FAN_OUT, "--input", "5", "--max-children", "2"]).expect(1);
    let ran = ran.error_says("child limit exceeded").error_says("`--max-children` (2)");
    assert!(!ran.stderr.contains("max_children"), "{}", ran.stderr);
    let ran = run(&["run", HOSTILE, "--method", "memory-bomb", "--memory", "4MiB"]).expect(1);
    let ran = ran.error_says("memory limit exceeded").error_says("past its `--memory` of 4194304 bytes");
    assert!(!ran.stderr.contains("max_memory"), "{}", ran.stderr);
    let ran = run(&["run", FAN_OUT, "--input", "5", "--max-children", "2", "--json"]).expect(1);
    assert!(ran.json()["error"].as_str().is_some_and(|e| e.contains("`--max-children` (2)")), "{}", ran.stdout);
}

/// The commands a component declares for the entry method run and the
/// run does not grant are one line, given only once the command line has passed its
/// checks.
#[test]
fn the_ungranted_commands_warning_is_one_line_after_the_usage_checks() {
    let dir = scratch("new-user-notes");
    let grant = format!("{}::/notes", dir.display());
    // `list` declares `fs.read` and `env.get`, `add` `fs.read` and `fs.write`
    // (`uses!(list: …)`): each run is warned of what its own entry method lacks.
    let warning = |args: &[&str]| {
        let ran = run(args).expect(1);
        let warnings: Vec<String> =
            ran.stderr.lines().filter(|l| l.contains("declares commands")).map(str::to_owned).collect();
        assert_eq!(warnings.len(), 1, "{}", ran.stderr);
        warnings[0].clone()
    };
    let list = warning(&["run", NOTES, "--dir", &grant, "--method", "list"]);
    assert!(
        list.ends_with("declares commands this run does not grant to `list`: `env.get` (--env NAME[=VALUE])"),
        "{list}"
    );
    let add = warning(&["run", NOTES, "--method", "add", "--input", "\"figs\""]);
    assert!(
        add.ends_with("does not grant to `add`: `fs.read` (--dir HOST::GUEST); `fs.write` (--dir-rw HOST::GUEST)"),
        "{add}"
    );
    for usage in [
        &["run", NOTES, "--method", "nope"][..],
        &["run", NOTES, "--method", "list", "--dir", "/no/such/dir"],
        &["run", NOTES, "--method", "list", "--", "x"],
        &["run", NOTES, "--method", "list", "--input", "1", "--input", "{"],
    ] {
        let ran = run(usage).expect(2);
        assert_eq!(ran.stderr.lines().count(), 1, "{usage:?}: the usage error only: {}", ran.stderr);
    }
}

/// `wasmproc APP.wasm --input 5` with a process component says what
/// the shorthand did and what to write, not a `--` the user never typed.
#[test]
fn the_shorthand_with_a_process_component_says_what_to_write() {
    let ran = run(&[HELLO, "--method", "greet", "--input", "\"you\""]).expect(2);
    let ran = ran
        .error_says("is a process component, so it takes no program arguments")
        .error_says(&format!("write `wasmproc run {HELLO} --method greet --input '\"you\"'`"));
    assert!(!ran.stderr.contains("after `--`"), "{}", ran.stderr);
    // A bare word is the input meant; several, input to write.
    run(&[HELLO, "5"]).expect(2).error_says(&format!("write `wasmproc run {HELLO} --input 5`"));
    run(&[HELLO, "5", "6"]).expect(2).error_says(&format!("write `wasmproc run {HELLO} --input JSON`"));
    // Typed out, `--` is what the error names.
    run(&["run", HELLO, "--method", "greet", "--", "x"]).expect(2).error_says("arguments after `--`");
}

/// `journal ls` says that a parent waiting for its child's exit waits
/// for it.
#[test]
fn journal_ls_says_a_parent_waits_for_its_childs_exit() {
    let dir = scratch("new-user-journal");
    let journal = dir.join("journal");
    let journal = journal.to_str().expect("utf-8");
    let child = super::hardening::start_running(&["run", SDK_TOUR, "--method", "parent_of_deaf", "--journal", journal]);
    let start = Instant::now();
    let listed = loop {
        let listed = run(&["journal", "ls", journal]).expect(0);
        let parent = listed.stdout.lines().find(|l| l.contains("parent_of_deaf")).map(str::to_owned);
        if parent.is_some_and(|line| line.contains("idle")) && listed.stdout.contains(" deaf ") {
            break listed;
        }
        assert!(start.elapsed() < HANG, "the parent never waited: {}", listed.stdout);
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = Command::new("kill").args(["-KILL", &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    child.wait_with_output().expect("wasmproc ends");
    let deaf = listed.stdout.lines().find(|l| l.contains(" deaf ")).expect("the child");
    let deaf = deaf.split_whitespace().next().expect("its pid");
    let parent = listed.stdout.lines().find(|l| l.contains("parent_of_deaf")).expect("the parent");
    assert!(
        parent.ends_with(&format!("unfinished: idle, waits for the exit of its child {deaf} or a message")),
        "{parent}"
    );
}

/// `cache ls` shows the file each entry was compiled from beside its
/// hash.
#[test]
fn cache_ls_shows_the_file_an_entry_was_compiled_from() {
    let home = scratch("new-user-cache");
    let in_home = |args: &[&str]| {
        finish(
            wasmproc(args)
                .env("XDG_CACHE_HOME", home.join("cache"))
                .env("XDG_CONFIG_HOME", home.join("config"))
                .stdin(Stdio::null())
                .output()
                .expect("wasmproc runs"),
        )
    };
    in_home(&["inspect", HELLO]).expect(0);
    in_home(&["run", FAN_OUT, "--input", "2"]).expect(0);
    let listed = in_home(&["cache", "ls", "--json"]).expect(0).json();
    let sources: Vec<&str> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["source"].as_str().expect("a source"))
        .collect();
    assert_eq!(sources, [HELLO, FAN_OUT], "{listed}");
    let text = in_home(&["cache", "ls"]).expect(0).stdout;
    assert!(text.lines().next().is_some_and(|header| header.contains("SOURCE") && header.ends_with("FILE")), "{text}");
    for (source, entry) in sources.iter().zip(listed["entries"].as_array().expect("entries")) {
        let file = entry["file"].as_str().expect("a file");
        assert!(text.lines().any(|l| l.contains(&format!(" {source} ")) && l.ends_with(file)), "{text}");
    }
}
