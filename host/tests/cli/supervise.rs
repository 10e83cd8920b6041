//! `run --supervise FILE` and `run --restart POLICY`: supervision trees described in a
//! file (JSON or TOML) and a restart policy for one entry process, run end to end with
//! the example guests; and the bad files and flag combinations a user will try.

use wasmproc_tests::guests::{HELLO, SDK_TOUR};

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
    run(&["run", "--supervise", &good, "--journal", journal.to_str().expect("utf-8")])
        .expect(2)
        .error_says("--supervise with --journal: a supervisor does not run in a durable run yet");
    run(&["run", HELLO, "--restart", "transient", "--journal", journal.to_str().expect("utf-8")])
        .expect(2)
        .error_says("--restart with --journal");
    run(&["run", "--supervise", &good, "--cluster", "nats://127.0.0.1:1"])
        .expect(2)
        .error_says("`--supervise` with --cluster: supervised runs do not run on a cluster yet");
    let ran = run(&["run", HELLO, "--restart-intensity", "3"]).expect(2);
    assert!(ran.stderr.contains("--restart"), "{}", ran.stderr);
    run(&["run"]).expect(2);
}
