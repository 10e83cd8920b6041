//! Providers from the command line: the `workflow` example with its inventory service as
//! a provider component, the `fetcher` example against a real HTTP server with its
//! state in `--kv`, the `notes` example with `--dir-rw` and `--env`, and the denials a
//! missing flag gets; what `inspect` says the examples declare they use.

use wasmproc_tests::guests::{FETCHER, HELLO, INVENTORY, NOTES, WORKFLOW};
use wasmproc_tests::site::Site;

use super::{run, scratch};

const ORDER: &str = r#"{"item": "apples", "quantity": 2}"#;

#[test]
fn the_workflow_runs_with_its_inventory_as_a_provider_component() {
    let provider = format!("inventory={INVENTORY}");
    let ran = run(&["run", WORKFLOW, "--provider", &provider, "--input", ORDER]).expect(0);
    assert_eq!(
        ran.json(),
        serde_json::json!({"item": "apples", "quantity": 2, "reservation": "R-1001", "attempts": 1})
    );
    // The provider's own answer reaches the workflow: past the stock, every try fails,
    // and the workflow gives up after its three.
    let ran =
        run(&["run", WORKFLOW, "--provider", &provider, "--input", r#"{"item": "pears", "quantity": 11}"#]).expect(1);
    assert!(ran.stderr.contains("gave up reserving `pears` after 3 tries"), "{}", ran.stderr);
    assert!(ran.stderr.contains("out of stock: 10 of `pears` left"), "{}", ran.stderr);
}

#[test]
fn a_provider_flag_that_names_no_server_is_refused_clearly() {
    let scratch = scratch("bad-provider");
    let missing = scratch.join("missing.wasm");
    let spec = format!("inventory={}", missing.display());
    run(&["run", WORKFLOW, "--provider", &spec, "--input", ORDER]).expect(2).error_says("cannot read");
    // A component without a `serve` entry is not a provider.
    let spec = format!("inventory={WORKFLOW}");
    run(&["run", WORKFLOW, "--provider", &spec, "--input", ORDER]).expect(3).error_says("has no entry `serve`");
    // Without the provider, nothing serves the family.
    let ran = run(&["run", WORKFLOW, "--input", ORDER]).expect(1);
    assert!(ran.stderr.contains("unknown command `inventory.reserve`"), "{}", ran.stderr);
    // Reads are declared of a provider's commands only.
    let ran = run(&["run", WORKFLOW, "--reads", "inventory.reserve", "--input", ORDER]).expect(2);
    assert!(ran.stderr.contains("required arguments were not provided:\n  --provider <NAME=FILE>"), "{}", ran.stderr);
    let provider = format!("inventory={INVENTORY}");
    let with = |read: &str| run(&["run", WORKFLOW, "--provider", &provider, "--reads", read, "--input", ORDER]);
    with("stock.count").expect(2).error_says("--reads `stock.count`: no --provider serves `stock.*`");
    with("inventory").expect(2).error_says("--reads `inventory`: write NAME.COMMAND");
    with("inventory.").expect(2).error_says("--reads `inventory.`: write NAME.COMMAND");
}

#[test]
fn a_durable_run_with_a_provider_command_declared_a_read_ends_as_one_without() {
    let dir = scratch("provider-reads");
    let provider = format!("inventory={INVENTORY}");
    let journal = dir.join("journal");
    let journal = journal.to_str().unwrap();
    let flags = ["run", WORKFLOW, "--provider", &provider, "--input", ORDER, "--journal", journal];
    let plain = run(&flags).expect(0);
    let read = run(&[&flags[..], &["--reads", "inventory.reserve"]].concat()).expect(0);
    assert_eq!(read.json(), plain.json());
    assert_eq!(read.json()["reservation"], "R-1001");
}

#[test]
fn the_fetcher_fetches_from_a_local_server_and_keeps_counts_in_kv_across_runs() {
    let dir = scratch("fetcher");
    let site = dir.join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("index.html"), "hello from the server").unwrap();
    let server = Site::start(&site);
    let state = dir.join("state");
    let host = format!("127.0.0.1:{}", server.port());
    let url = format!("http://{host}/index.html");
    let input = serde_json::json!({ "url": url }).to_string();
    let state_arg = state.to_str().unwrap();
    for fetches in 1..=2 {
        let ran = run(&["run", FETCHER, "--allow-host", &host, "--kv", state_arg, "--input", &input]).expect(0);
        assert_eq!(ran.json(), serde_json::json!({"status": 200, "bytes": 21, "fetches": fetches}));
        assert!(!ran.stderr.contains("does not grant"), "everything it declares is granted: {}", ran.stderr);
    }

    // Every denial names the flag that grants it.
    let ran = run(&["run", FETCHER, "--kv", state_arg, "--input", &input]).expect(1);
    assert!(
        ran.stderr.contains("denied: `http.request` needs an allowed host: run with --allow-host"),
        "{}",
        ran.stderr
    );
    let ran = run(&["run", FETCHER, "--allow-host", &host, "--input", &input]).expect(1);
    assert!(ran.stderr.contains("denied: `kv.get` needs the key-value store: run with --kv DIR"), "{}", ran.stderr);
    // What the component declares (`uses!`) and the run does not grant is named before it runs.
    assert!(
        ran.stderr.contains("declares commands this run does not grant to `main`: `kv.cas`, `kv.get` (--kv DIR)\n"),
        "{}",
        ran.stderr
    );
    let other = format!("127.0.0.1:{}", server.port().wrapping_add(1).max(1));
    let ran = run(&["run", FETCHER, "--allow-host", &other, "--kv", state_arg, "--input", &input]).expect(1);
    assert!(ran.stderr.contains("denied: ") && ran.stderr.contains("--allow-host"), "{}", ran.stderr);
    let ran =
        run(&["run", FETCHER, "--allow-host", &host, "--kv", state_arg, "--deny", "kv.*", "--input", &input]).expect(1);
    assert!(ran.stderr.contains("permission denied: kv.get (grant it with --allow kv.get)"), "{}", ran.stderr);
}

#[test]
fn notes_are_kept_in_a_granted_directory_under_a_granted_title() {
    let dir = scratch("notes");
    let grant = format!("{}::/notes", dir.display());
    for (text, count) in [("apples", 1), ("pears", 2)] {
        let input = serde_json::json!(text).to_string();
        let ran = run(&["run", NOTES, "--dir-rw", &grant, "--method", "add", "--input", &input]).expect(0);
        assert_eq!(ran.json(), serde_json::json!(count));
    }
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "apples\npears\n");
    let ran = run(&["run", NOTES, "--dir", &grant, "--env", "NOTES_TITLE=Groceries", "--method", "list"]).expect(0);
    assert_eq!(ran.json(), serde_json::json!("Groceries\n1. apples\n2. pears"));
    // Read-only, the same directory refuses a write, naming the flag that allows it.
    let ran = run(&["run", NOTES, "--dir", &grant, "--method", "add", "--input", "\"figs\""]).expect(1);
    assert!(ran.stderr.contains("granted read-only (grant it with --dir-rw"), "{}", ran.stderr);
    // Without a directory, the notes are out of reach.
    let ran = run(&["run", NOTES, "--method", "list"]).expect(1);
    assert!(ran.stderr.contains("denied: `env.get` needs environment variables: run with --env"), "{}", ran.stderr);
    let ran = run(&["run", NOTES, "--env", "NOTES_TITLE=x", "--method", "list"]).expect(1);
    assert!(ran.stderr.contains("denied: `fs.read` needs a directory: run with --dir HOST::GUEST"), "{}", ran.stderr);
}

#[test]
fn inspect_tells_a_provider_component_from_a_process_component() {
    let ran = run(&["inspect", INVENTORY]).expect(0);
    assert!(ran.stdout.contains("kind:      provider component"), "{}", ran.stdout);
    assert!(ran.stdout.contains("--provider NAME=FILE"), "{}", ran.stdout);
    let ran = run(&["inspect", FETCHER, "--json"]).expect(0);
    assert_eq!(ran.json()["provider"], serde_json::json!(false));
    assert_eq!(ran.json()["kind"], serde_json::json!("process component (wasmproc:process world)"));
}

#[test]
fn inspect_lists_the_commands_a_component_declares_with_their_grants() {
    let ran = run(&["inspect", FETCHER]).expect(0);
    let expected = "commands:  http.request  --allow-host HOST[:PORT]\n           kv.cas        --kv DIR\n           \
                    kv.get        --kv DIR\n";
    assert!(ran.stdout.contains(expected), "{}", ran.stdout);
    let ran = run(&["inspect", WORKFLOW, "--json"]).expect(0);
    assert_eq!(
        ran.json()["commands"],
        serde_json::json!({
            "declared": true,
            "commands": [
                {"name": "inventory.reserve", "grant": "--provider inventory=FILE", "entries": null},
                {"name": "sleep", "grant": "granted by default", "entries": null},
            ],
            "note": null,
        })
    );
    let notes = run(&["inspect", NOTES, "--json"]).expect(0).json();
    let names: Vec<&str> =
        notes["commands"]["commands"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["env.get", "fs.read", "fs.write"]);
    // Each declared by the entry methods that use it (`uses!(list: …)`).
    let entries: Vec<&serde_json::Value> =
        notes["commands"]["commands"].as_array().unwrap().iter().map(|c| &c["entries"]).collect();
    assert_eq!(
        entries,
        [&serde_json::json!(["list"]), &serde_json::json!(["add", "list"]), &serde_json::json!(["add"])]
    );
    let ran = run(&["inspect", NOTES]).expect(0);
    assert!(ran.stdout.contains("fs.write  --dir-rw HOST::GUEST (by add)\n"), "{}", ran.stdout);
    // The provider declares, with an empty declaration, that it yields nothing.
    let ran = run(&["inspect", INVENTORY]).expect(0);
    assert!(
        ran.stdout.contains("commands:  none (the component declares that it yields no commands)"),
        "{}",
        ran.stdout
    );
}

#[test]
fn inspect_says_when_a_component_declares_nothing() {
    let ran = run(&["inspect", HELLO]).expect(0);
    assert!(
        ran.stdout.contains("commands:  not declared (the component has no `wasmproc:commands` section"),
        "{}",
        ran.stdout
    );
    let ran = run(&["inspect", HELLO, "--json"]).expect(0);
    let commands = &ran.json()["commands"];
    assert_eq!(commands["declared"], serde_json::json!(false));
    assert!(commands["commands"].is_null(), "not declared is not \"uses nothing\": {commands}");
    // A precompiled file is the engine's code: the declaration is not in it.
    let compiled = scratch("inspect-precompiled").join("fetcher.cwasm");
    let compiled = compiled.to_str().unwrap();
    run(&["compile", FETCHER, "-o", compiled]).expect(0);
    let ran = run(&["inspect", compiled]).expect(0);
    assert!(ran.stdout.contains("commands:  unknown: a precompiled file keeps no declaration"), "{}", ran.stdout);
}

/// A `--kv` directory others can read (made with a plain `mkdir`) is made private, and
/// the run says so; one others can write is refused.
#[test]
fn a_kv_directory_others_can_read_is_made_private_saying_so() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("kv-readable").join("state");
    std::fs::create_dir(&dir).expect("the directory can be made");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let state = dir.to_str().expect("UTF-8");
    let ran = run(&["run", HELLO, "--method", "greet", "--input", "\"x\"", "--kv", state]).expect(0);
    let expected = format!("other users could read the key-value store in {state} (mode 755): made it private");
    assert!(ran.stderr.contains(&expected), "{}", ran.stderr);
    let mode = std::fs::metadata(&dir).expect("the directory is there").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    run(&["run", HELLO, "--method", "greet", "--input", "\"x\"", "--kv", state])
        .expect(5)
        .error_says("other users can write to it (mode 777)");
}
