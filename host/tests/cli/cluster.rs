//! `run --cluster` and `cluster run` as a user types them: one way to run on a cluster,
//! and every flag that sets up this host refused by name before anything connects (the
//! cluster's URL here reaches no server: a flag that got past the checks would fail on
//! the connection instead, with another message and exit code).

use super::*;

/// A cluster URL no server listens on.
const NOWHERE: &str = "nats://127.0.0.1:1";

/// Each flag that sets up this host rather than the run, with --cluster: exit 2, one
/// error line naming the flag and why (the journal's: durable processes do not run on
/// a cluster yet; a provider's: the node's own flag).
#[test]
fn run_with_cluster_refuses_each_flag_of_this_host_by_name() {
    let dir = scratch("cluster-refusals");
    let dir = dir.to_str().unwrap();
    let refused: &[(&[&str], &str)] = &[
        (&["--journal", dir], "`--journal` with --cluster: a durable run on a cluster is a workflow on its shards"),
        (&["--keep-finished", "--journal", dir], "`wasmproc cluster start APP --id ID"),
        (
            &["--allow-host", "127.0.0.1:8080"],
            "`--allow-host` with --cluster: on a cluster, providers are the nodes' own: start the nodes with `wasmproc node --allow-host …`",
        ),
        (&["--kv", dir], "`wasmproc node --kv …`"),
        (&["--dir", dir], "`wasmproc node --dir …`"),
        (&["--env", "A=1"], "`wasmproc node --env …`"),
        (
            &["--provider", "inventory=x.wasm"],
            "`--provider` with --cluster: provider components do not run on a cluster yet",
        ),
        (&["--workers", "2"], "`--workers` with --cluster: it sets up this host's scheduler"),
        (&["--max-tables", "3"], "`--max-tables` with --cluster: it sets up this host's scheduler"),
        (&["--init-time-limit", "1s"], "`--init-time-limit` with --cluster"),
        (&["--no-cache"], "`--no-cache` with --cluster: the node compiles the program"),
        (&["--progress"], "`--progress` with --cluster"),
    ];
    for (flags, says) in refused {
        for command in [&["run", FAN_OUT][..], &["cluster", "run", FAN_OUT]] {
            let args: Vec<&str> = command.iter().chain(*flags).chain(&["--cluster", NOWHERE]).copied().collect();
            run(&args).expect(2).error_says(says);
        }
    }
    run(&["run", FAN_OUT, "--cluster", NOWHERE, "--", "x"])
        .expect(2)
        .error_says("arguments after `--` with --cluster: WASI commands do not run on a cluster");
}

/// `cluster run` takes `run`'s flags (here --input-file and --timeout, which it had
/// not, and the scheduler limits a run carries to its nodes) and needs --cluster; with
/// it, both get as far as the connection.
#[test]
fn cluster_run_takes_the_flags_of_run_and_needs_a_cluster() {
    let dir = scratch("cluster-run-flags");
    let input = dir.join("input.json");
    std::fs::write(&input, "3").unwrap();
    let input = input.to_str().unwrap();
    run(&["cluster", "run", FAN_OUT, "--input-file", input, "--timeout", "5s"])
        .expect(2)
        .error_says("`cluster run` needs --cluster URL");
    for command in [&["run", FAN_OUT][..], &["cluster", "run", FAN_OUT]] {
        let args: Vec<&str> = command
            .iter()
            .chain(&[
                "--input-file",
                input,
                "--timeout",
                "5s",
                "--json",
                "--stats",
                "--memory",
                "8MiB",
                "--max-children",
                "3",
                "--max-yields",
                "8",
                "--max-payload",
                "1MiB",
                "--max-step-output",
                "2MiB",
                "--mailbox",
                "3",
                "--mailbox-bytes",
                "1MiB",
                "--max-links",
                "4",
                "--max-processes",
                "5",
                "--cluster",
                NOWHERE,
            ])
            .copied()
            .collect();
        run(&args).expect(5).error_says("nats://127.0.0.1:1");
    }
}

/// `run` and `node` share their groups of flags, under the same headings of `--help`:
/// the limits (a node's own, which a run's are clamped to), the files and environment,
/// the providers, the engine and the cluster; a node checks its limits as `run` does,
/// before it connects.
#[test]
fn run_and_node_share_their_groups_of_flags() {
    for command in ["run", "node"] {
        let help = run(&[command, "--help"]).expect(0).stdout;
        for text in [
            "Limits:",
            "Files and environment:",
            "Providers:",
            "Engine and compiled code:",
            "Cluster:",
            "--max-children <N>",
            "--mailbox-bytes <SIZE>",
            "--dir <HOST[::GUEST]>",
            "--env <NAME[=VALUE]>",
        ] {
            assert!(help.contains(text), "`{command} --help` should have {text:?}");
        }
    }
    run(&["node", "--cluster", NOWHERE, "--insecure", "--max-step-output", "1MiB"])
        .expect(2)
        .error_says("--max-step-output (1048576 bytes) must be at least --max-payload (16777216 bytes)");
}
