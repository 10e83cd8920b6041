//! `wasmproc run` on the Python and JavaScript example guests (built by the tests crate's
//! build script with componentize-py and componentize-js), with the default limits and
//! past the per-process instance limits, whose flags the errors name.

use wasmproc_tests::guests::{JS_SQUARES, PY_SQUARES};

use super::*;

/// The guest runs with the defaults and prints its result; with `--max-core-instances`
/// below what it needs it fails to load, naming the flag; with it raised it runs.
///
/// The init time limit is raised: instantiating the Python guest (14 core modules) and
/// CPython's start, in the unoptimised test build with other tests on the same cores, can
/// take longer than the default 100 ms.
fn runs_and_names_the_limit(guest: &str, needs: u32) {
    let run = |args: &[&str]| run(&[args, &["--init-time-limit", "10s"]].concat());
    let ran = run(&["run", guest, "--input", "6"]).expect(0);
    assert_eq!(ran.stdout.trim(), "[0,1,4,9,16,25]", "stderr: {}", ran.stderr);
    assert!(ran.stderr.contains("info: spawning 6 children"), "the guest's log: {}", ran.stderr);

    let fewer = (needs - 1).to_string();
    run(&["run", guest, "--input", "2", "--max-core-instances", &fewer])
        .expect(3)
        .error_says(&format!("more than the {fewer} core instances a process may have, its `max_core_instances`"))
        .error_says("raise it with `--max-core-instances`");
    let enough = needs.to_string();
    let ran = run(&["run", guest, "--input", "2", "--max-core-instances", &enough]).expect(0);
    assert_eq!(ran.stdout.trim(), "[0,1]");

    run(&["run", guest, "--input", "2", "--max-tables", "1"]).expect(3).error_says("raise it with `--max-tables`");
    run(&["run", guest, "--input", "2", "--max-table-elements", "1000"])
        .expect(3)
        .error_says("past its `max_table_elements` of 1000; raise it with `--max-table-elements`");
    run(&["run", guest, "--method", "cube", "--input", "2"])
        .expect(2)
        .error_says("has no entry method `cube`: pass --method with one of: main, square, idle");
}

#[test]
fn a_python_guest_runs_and_names_the_limits_it_passes() {
    runs_and_names_the_limit(PY_SQUARES, 14);
}

#[test]
fn a_javascript_guest_runs_and_names_the_limits_it_passes() {
    runs_and_names_the_limit(JS_SQUARES, 4);
}
