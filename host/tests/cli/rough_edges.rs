//! Rough edges of the CLI a new user meets: logging flags, the cold-compile
//! notice, failures nobody waited on, WASI exit codes, `--json` with a WASI command,
//! `.wat` files, the `wasmproc APP.wasm` shorthand, `wasmproc cache`, the release profile.

use std::os::unix::fs::PermissionsExt as _;

use super::*;

/// `wasmproc` with `args`, its cache and key in `home` (so what is cached is known).
fn in_home(home: &Path, args: &[&str]) -> Command {
    let mut command = wasmproc(args);
    command
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

/// Runs [`in_home`] with `env` set.
fn run_in(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut command = in_home(home, args);
    for (name, value) in env {
        command.env(name, value);
    }
    finish(command.output().expect("wasmproc runs"))
}

const GREET: [&str; 6] = ["run", HELLO, "--method", "greet", "--input", "\"logs\""];

// --- 1. logging ---------------------------------------------------------------------------

#[test]
fn logs_follow_rust_log_verbose_quiet_and_json() {
    let home = scratch("rough-logs");
    // The cache directory open to others: every run warns that it is not used.
    let open = home.join("cache").join("wasmproc");
    std::fs::create_dir_all(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let warning = "not using the compiled-code cache";

    let plain = run_in(&home, &GREET, &[]).expect(0);
    assert_eq!(plain.stdout, "\"hello, logs\"\n");
    assert!(plain.stderr.contains(warning), "warnings by default: {}", plain.stderr);
    assert!(!plain.stderr.contains("loaded the program"), "no debug by default: {}", plain.stderr);

    let verbose = run_in(&home, &[&["-v"][..], &GREET].concat(), &[]).expect(0);
    assert!(verbose.stderr.contains("loaded the program"), "-v shows debug: {}", verbose.stderr);
    let from_env = run_in(&home, &GREET, &[("RUST_LOG", "wasmproc=debug")]).expect(0);
    assert!(from_env.stderr.contains("loaded the program"), "RUST_LOG is honoured: {}", from_env.stderr);

    let quiet = run_in(&home, &[&GREET[..], &["-q"]].concat(), &[("RUST_LOG", "debug")]).expect(0);
    assert_eq!(quiet.stdout, "\"hello, logs\"\n", "-q leaves the result alone");
    assert!(quiet.stderr.is_empty(), "-q: errors only: {}", quiet.stderr);
    let overflow = ["-q", "run", HELLO, "--method", "add", "--input", "[9223372036854775807, 1]"];
    let failed = run_in(&home, &overflow, &[]).expect(1);
    failed.error_says(" returned an error: ");

    let json = run_in(&home, &["--log-format", "json", "-v", "run", HELLO, "--method", "nope"], &[]).expect(2);
    let lines: Vec<Value> = json
        .stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not one JSON object a line ({e}): {line}")))
        .collect();
    let said = |level: &str, text: &str| {
        lines.iter().any(|l| l["level"] == level && l["message"].as_str().is_some_and(|m| m.contains(text)))
    };
    assert!(said("warn", warning), "the library's warning as JSON: {}", json.stderr);
    assert!(said("error", "no entry method `nope`"), "the error as JSON: {}", json.stderr);
    assert!(lines.iter().all(|l| l["time"].is_f64() && l["target"].is_string()), "{}", json.stderr);

    run(&["-v", "-q", "run", HELLO]).expect(2);
    run(&["--log-format", "yaml", "run", HELLO]).expect(2);
}

// --- 2. a cold compile is not silent ------------------------------------------------------

/// A WASI preview 1 command of many small functions: seconds to compile in a debug build
/// of wasmproc, and nothing to run.
fn slow_to_compile(dir: &Path) -> PathBuf {
    let body = "local.get 0 i32.const 7 i32.mul i32.const 3 i32.xor local.set 0 ".repeat(8);
    let funcs: String =
        (0..4_000).map(|i| format!("(func $f{i} (param i32) (result i32) {body} local.get 0)\n")).collect();
    let wat = format!("(module (memory (export \"memory\") 1)\n{funcs}(func (export \"_start\")))");
    let path = dir.join("slow.wasm");
    std::fs::write(&path, wat::parse_str(&wat).expect("valid WAT")).expect("write");
    path
}

#[test]
fn a_cold_compile_says_so_while_compiling_and_a_cached_load_does_not() {
    let home = scratch("rough-compile");
    let app = slow_to_compile(&home);
    let app = app.to_str().expect("utf-8");
    let notice = "wasmproc: compiling slow.wasm (first run; later runs use the cache)…";

    let start = Instant::now();
    let mut child =
        in_home(&home, &["run", app]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("wasmproc runs");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    stderr.read_line(&mut first).expect("read stderr");
    let said_at = start.elapsed();
    let status = child.wait().expect("wasmproc ends");
    let ended_at = start.elapsed();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).expect("read stderr");
    assert_eq!(status.code(), Some(0), "stderr: {first}{rest}");
    // The load is nearly all of the run: it compiled for about `ended_at`.
    if ended_at > Duration::from_millis(1500) {
        assert_eq!(first.trim_end(), notice, "said once, first");
        assert!(!rest.contains("compiling"), "said once: {rest}");
        assert!(
            said_at < ended_at - Duration::from_millis(300),
            "said while compiling: at {said_at:?} of {ended_at:?}"
        );
    } else if ended_at < Duration::from_millis(900) {
        assert!(first.is_empty(), "a load under a second is silent: {first}");
    }

    let cached = finish(in_home(&home, &["run", app]).output().expect("runs")).expect(0);
    assert!(!cached.stderr.contains("compiling"), "a cache hit is silent: {}", cached.stderr);
    let quiet = finish(in_home(&home, &["-q", "run", "--no-cache", app]).output().expect("runs")).expect(0);
    assert!(quiet.stderr.is_empty(), "-q is silent: {}", quiet.stderr);
}

/// With `--progress` on a terminal (a pseudo-terminal from util-linux's `script`), the
/// compile is a line redrawn in place from its start and erased at its end; without a
/// terminal, `--progress` draws nothing.
#[test]
fn progress_on_a_terminal_redraws_a_compile_line_and_erases_it() {
    let home = scratch("rough-progress");
    let app = slow_to_compile(&home);
    let app = app.to_str().expect("utf-8");
    let command = format!("{BINARY} run --progress --no-cache {app}");
    let mut script = Command::new("script");
    script.args(["-qec", &command, "/dev/null"]);
    for (key, value) in in_home(&home, &[]).get_envs() {
        match value {
            Some(value) => script.env(key, value),
            None => script.env_remove(key),
        };
    }
    let ran = finish(script.stdin(Stdio::null()).output().expect("`script` (util-linux) runs")).expect(0);
    let line = "\r\x1b[Kwasmproc: compiling slow.wasm (--no-cache: every run compiles): ";
    assert!(ran.stdout.contains(line), "a live compile line: {:?}", ran.stdout);
    let erased = ran.stdout.rfind(line).map(|at| &ran.stdout[at + line.len()..]).expect("drawn");
    assert!(erased.contains("\r\x1b[K"), "erased after its last redraw: {erased:?}");

    let piped = finish(in_home(&home, &["run", "--progress", "--no-cache", app]).output().expect("runs")).expect(0);
    assert!(!piped.stderr.contains('\x1b'), "nothing redrawn without a terminal: {:?}", piped.stderr);
}

// --- 3. failed processes nobody waited on ---------------------------------------------------

/// `orphan` spawns a looping child without monitoring it and completes: the child's CPU
/// budget ends it after the entry process has gone, with nobody told.
#[test]
fn failures_nobody_waited_on_are_summed_up_at_the_end() {
    let orphan = ["run", HOSTILE, "--method", "orphan", "--cpu-budget", "100ms", "--time-slice", "5"];
    let ran = run(&orphan).expect(0);
    assert_eq!(ran.stdout, "\"orphaned\"\n");
    let lines: Vec<&str> = ran.stderr.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "wasmproc: 1 process failed with nobody waiting (no monitor, no waiting parent):")
        .unwrap_or_else(|| panic!("the summary is given: {}", ran.stderr));
    let detail = lines.get(at + 1).copied().unwrap_or_default();
    assert!(detail.starts_with("  process ") && detail.contains(": CPU budget exceeded"), "{}", ran.stderr);
    let json = run(&[&orphan[..], &["--json", "--stats"]].concat()).expect(0).json();
    assert_eq!(json["stats"]["unobserved_failures"], 1, "{json}");

    // Failures that were waited for are their waiter's to report; a stopped run's
    // processes failed because it was stopped.
    let waited = run(&["run", FAN_OUT, "--input", "3"]).expect(0);
    assert!(!waited.stderr.contains("nobody waiting"), "{}", waited.stderr);
    let stopped = run(&["run", HOSTILE, "--method", "orphan", "--timeout", "300ms"]).expect(4);
    assert!(!stopped.stderr.contains("nobody waiting"), "{}", stopped.stderr);
    assert!(run(&[&["-q"][..], &orphan].concat()).expect(0).stderr.is_empty(), "-q: errors only");
}

// --- 4. WASI exit codes -----------------------------------------------------------------------

/// A WASI 0.2 program's `exit-with-code` is wasmproc's exit code, preempted or not, as
/// preview 1's `proc_exit` is (`preview_1_modules_run_with_their_exit_code`). `std`'s own
/// `exit` carries success or failure only, so a Rust program's `exit(7)` is 1: the code is
/// lost in the guest, before the host sees it.
#[test]
fn a_wasi_0_2_exit_code_becomes_wasmprocs() {
    for flags in [&[][..], &["--no-preemption"][..]] {
        let ran = run(&[&["run", WASI_CLI][..], flags, &["--", "--exit-with-code", "2"]].concat()).expect(2);
        assert!(ran.stderr.contains("wasi-cli: exit-with-code 2"), "{}", ran.stderr);
        run(&[&["run", WASI_CLI][..], flags, &["--", "--exit-with-code", "0"]].concat()).expect(0);
        run(&[&["run", WASI_CLI][..], flags, &["--", "--exit-with-code", "255"]].concat()).expect(255);
    }
    run(&["run", WASI_CLI, "--", "--exit", "7"]).expect(1);
}

// --- 5. --json and a WASI program's own stdout ----------------------------------------------

/// `--help` of `args`, its words joined by single spaces (so wrapping does not matter).
fn help(args: &[&str]) -> String {
    run(args).expect(0).stdout.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A WASI command's stdout is the program's: `--json` is refused rather than appending an
/// object to it.
#[test]
fn json_is_refused_for_a_wasi_command_whose_stdout_is_its_own() {
    let ran = run(&["run", WASI_CLI, "--json", "--", "hello"])
        .expect(2)
        .error_says("is a WASI command, whose stdout is its own output: --json would mix an object into it");
    assert!(ran.stdout.is_empty(), "nothing is run: {}", ran.stdout);
    let help = help(&["run", "--help"]);
    assert!(help.contains("Process components only: a WASI command's stdout is the program's own"), "{help}");
    assert_eq!(run(&["run", HELLO, "-m", "add", "-i", "[1, 2]", "--json"]).expect(0).json()["ok"], 3);
}

// --- 6. .wat files ----------------------------------------------------------------------------

/// A WASI preview 1 command in the text format: prints a line and exits 3.
const HELLO_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello from text\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 16))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $proc_exit (i32.const 3))))
"#;

#[test]
fn text_format_programs_run_inspect_and_compile() {
    let dir = scratch("rough-wat");
    let path = |name: &str| dir.join(name).to_str().expect("utf-8").to_owned();
    std::fs::write(dir.join("hello.wat"), HELLO_WAT).expect("write");
    // Known by its content whatever its name.
    std::fs::write(dir.join("hello.txt"), format!("\n  {HELLO_WAT}")).expect("write");
    for file in ["hello.wat", "hello.txt"] {
        let ran = run(&["run", &path(file)]).expect(3);
        assert_eq!(ran.stdout, "hello from text\n", "{file}: {}", ran.stderr);
    }
    let inspected = run(&["inspect", &path("hello.wat")]).expect(0);
    assert!(inspected.stdout.contains("WASI preview 1 command module"), "{}", inspected.stdout);
    run(&["compile", &path("hello.wat"), "-o", &path("hello.cwasm")]).expect(0);
    assert_eq!(run(&["run", &path("hello.cwasm")]).expect(3).stdout, "hello from text\n");

    // Components too: this one is valid text but no program.
    std::fs::write(dir.join("empty.wat"), "(component)").expect("write");
    run(&["run", &path("empty.wat")]).expect(3).error_says("does not fit the `wasmproc:process/process@0.2.1` world");
    // One built for the contract before exit reasons were typed: refused naming both
    // versions, and what to do.
    std::fs::write(dir.join("old.wat"), r#"(component (import "wasmproc:process/host@0.1.0" (instance)))"#)
        .expect("write");
    run(&["run", &path("old.wat")])
        .expect(3)
        .error_says("built for `wasmproc:process@0.1.0`, but this host runs `wasmproc:process@0.2.1`")
        .error_says("rebuild it with the current SDK");

    // An error in the text names its line, on one line.
    std::fs::write(dir.join("broken.wat"), "(module\n  (func\n    (i32.bogus)))\n").expect("write");
    run(&["run", &path("broken.wat")]).expect(3).error_says("the text is not valid: ").error_says("(line 3, column");
    run(&["inspect", &path("broken.wat")]).expect(3).error_says("(line 3, column");
    std::fs::write(dir.join("binary.wat"), [0xff, 0xfe, 0x00]).expect("write");
    run(&["run", &path("binary.wat")]).expect(3).error_says("the text is not valid");
}

// --- 7. `wasmproc APP.wasm [ARGS...]` ----------------------------------------------------------

/// The shorthand cargo uses as a runner: `wasmproc APP.wasm ARGS...`, every argument the
/// program's, flags included.
#[test]
fn the_shorthand_runs_a_program_with_all_the_rest_as_its_arguments() {
    let ran = run(&[WASI_CLI, "hello", "--env", "HOME"]).expect(0);
    assert_eq!(ran.stdout, "HOME=<unset>\nhello\n", "{}", ran.stderr);
    run(&["-q", WASI_CLI, "--exit-with-code", "2"]).expect(2);
    run(&["--log-format", "json", WASI_CLI, "--exit-with-code", "3"]).expect(3);
    // A process component takes no arguments: the error says what to write instead.
    run(&[HELLO, "x"])
        .expect(2)
        .error_says("takes no program arguments")
        .error_says(&format!("wasmproc run {HELLO} --input '\"x\"'"));
    run(&["./no/such/app.wasm"]).expect(2).error_says("cannot read `./no/such/app.wasm`");
    let help = help(&["--help"]);
    assert!(help.contains("`wasmproc APP.wasm [ARGS...]` is short for `wasmproc run APP.wasm -- ARGS...`"), "{help}");
    assert!(help.contains("CARGO_TARGET_WASM32_WASIP2_RUNNER=wasmproc"), "{help}");
}

// --- 8. wasmproc cache ------------------------------------------------------------------------

/// `cache ls` lists the entries least recently used first, `clean` removes them (all, or
/// to a size), and a write keeps the cache to its cap by evicting the least recently used.
#[test]
fn the_cache_is_listed_cleaned_and_kept_to_its_cap_least_recently_used_first() {
    let home = scratch("rough-cache");
    let wasmproc_in = |args: &[&str]| finish(in_home(&home, args).output().expect("wasmproc runs"));
    let ls = || wasmproc_in(&["cache", "ls", "--json"]).expect(0).json();
    let files = || -> Vec<String> {
        ls()["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| e["file"].as_str().expect("file").to_owned())
            .collect()
    };
    let entry_of = |app: &str| -> String {
        let found = wasmproc_in(&["inspect", app, "--json"]).expect(0).json();
        let path = PathBuf::from(found["cache_entry"].as_str().expect("cached"));
        path.file_name().expect("a file").to_str().expect("utf-8").to_owned()
    };
    assert!(files().is_empty(), "a cache not made yet is empty");
    let (hello, fan_out, wasi) = (entry_of(HELLO), entry_of(FAN_OUT), entry_of(WASI_CLI));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(entry_of(HELLO), hello, "a use of HELLO's entry");
    assert_eq!(files(), [fan_out.clone(), wasi.clone(), hello.clone()], "least recently used first");
    let text = wasmproc_in(&["cache", "ls"]).expect(0).stdout;
    assert!(text.contains("3 entries, ") && text.contains(" of at most 1.0 GiB"), "{text}");
    assert!(text.lines().any(|l| l.ends_with(&hello) && l.contains(" ago")), "{text}");

    // A file that is no entry is never touched.
    let dir = home.join("cache").join("wasmproc");
    std::fs::write(dir.join("notes.txt"), "mine").expect("write");
    let hello_size = ls()["entries"][2]["size"].as_u64().expect("size").to_string();
    let cleaned = wasmproc_in(&["cache", "clean", "--max-size", &hello_size]).expect(0);
    assert!(cleaned.stdout.starts_with("removed 2 entries"), "{}", cleaned.stdout);
    assert_eq!(files(), std::slice::from_ref(&hello), "the most recently used stays");

    // A write evicts what is past the cap, never the entry it wrote.
    wasmproc_in(&["run", TIMERS, "--input", "[1]", "--cache-max-size", "1"]).expect(0);
    let timers = files();
    assert_eq!(timers.len(), 1, "only the new entry is left: {timers:?}");
    assert_ne!(timers[0], hello);
    let mut command = in_home(&home, &["inspect", HELLO]);
    finish(command.env("WASMPROC_CACHE_MAX_SIZE", "1").output().expect("runs")).expect(0);
    assert_eq!(files(), std::slice::from_ref(&hello), "$WASMPROC_CACHE_MAX_SIZE is the cap too");

    assert!(wasmproc_in(&["cache", "clean"]).expect(0).stdout.starts_with("removed 1 entry"));
    assert!(files().is_empty());
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).expect("kept"), "mine");

    // A directory others may write is neither listed nor cleaned.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    wasmproc_in(&["cache", "clean"]).expect(5).error_says("chmod go-w");
    wasmproc_in(&["cache", "ls"]).expect(5).error_says("not touching the compiled-code cache");
}

// --- 9. the release profile and the install line ------------------------------------------

/// The lines of `[section]` in the workspace manifest, comments dropped.
fn manifest_section(manifest: &str, section: &str) -> Vec<String> {
    let header = format!("[{section}]");
    manifest
        .lines()
        .skip_while(|line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .map(|line| line.split('#').next().unwrap_or_default().replace(' ', ""))
        .filter(|line| !line.is_empty())
        .collect()
}

/// The installed binary carries no line tables (159 MiB with them, 40 MiB without); a
/// profile with them is there for profilers; the README installs with the lock file and
/// names the toolchain wasmtime needs.
#[test]
fn release_builds_without_line_tables_and_the_readme_installs_locked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let release = manifest_section(&manifest, "profile.release");
    assert!(
        release.iter().any(|l| l == "debug=false" || l.starts_with("strip=")),
        "[profile.release] without debug info: {release:?}"
    );
    assert!(!release.iter().any(|l| l.starts_with("debug=\"line")), "{release:?}");
    let profiling = manifest_section(&manifest, "profile.profiling");
    assert!(profiling.contains(&"inherits=\"release\"".to_owned()), "{profiling:?}");
    assert!(profiling.contains(&"debug=\"line-tables-only\"".to_owned()), "{profiling:?}");
    assert!(manifest_section(&manifest, "workspace.package").contains(&"rust-version=\"1.95\"".to_owned()));

    let readme = std::fs::read_to_string(root.join("README.md")).expect("the README");
    assert!(readme.contains("`cargo install --locked --path host`"), "the README installs with --locked");
    assert!(!readme.contains("`cargo install --path host`"));
    assert!(readme.contains("The binary is 40 MiB"), "the README gives the binary's size");
}
