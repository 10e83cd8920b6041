//! What `run --cluster` (and `cluster run`) does instead of running locally: which of
//! `run`'s flags apply to a run on a cluster and which are refused, and the run itself,
//! as a client of the cluster.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmproc::cluster::{Client, RemoteSpawnOptions};
use wasmproc::wasm::{Level, LogRecord, LogSource};

use super::output::{Output, Say};
use super::report::{Ended, Report, Summary};
use super::stop::{Signals, Stop};
use super::{ClusterArgs, Exit, Failure, Given};

/// Why a flag of `run` does not apply to a run on a cluster.
#[derive(Clone, Copy)]
pub(super) enum HereOnly {
    /// It sets up this host's scheduler or sandbox, which the run does not use.
    Scheduler,
    /// It sets how this host compiles the program; the node compiles it.
    Compiler,
    /// It gives processes a provider; a node's providers are the node's own flags.
    Provider,
    /// It tunes a provider of this host.
    ProviderSetting,
    /// Provider components run beside the run on this host.
    ProviderComponent,
    /// A durable run on a cluster is a workflow on its shards (`cluster start`).
    Journal,
    /// It shows this host's scheduler.
    Progress,
    /// WASI commands run in one process on one host.
    Command,
    /// A supervisor runs on the host that runs the run.
    Supervision,
}

/// The flags of `run` (by clap id, the field's name) that set up this host, and why
/// each does not apply to a run on a cluster. Every other flag of `run` works with
/// `--cluster` (the test `every_run_flag_works_on_a_cluster_or_is_refused` holds the
/// two lists to the whole of `run`).
pub(super) const HERE_ONLY: &[(&str, HereOnly)] = &[
    ("workers", HereOnly::Scheduler),
    ("no_preemption", HereOnly::Scheduler),
    ("hibernate_after", HereOnly::Scheduler),
    ("no_hibernate_instances", HereOnly::Scheduler),
    ("init_time_limit", HereOnly::Scheduler),
    ("max_core_instances", HereOnly::Scheduler),
    ("max_tables", HereOnly::Scheduler),
    ("max_table_elements", HereOnly::Scheduler),
    ("max_memories", HereOnly::Scheduler),
    ("no_cache", HereOnly::Compiler),
    ("max_functions", HereOnly::Compiler),
    ("max_function_size", HereOnly::Compiler),
    ("cache_max_size", HereOnly::Compiler),
    ("trust_precompiled", HereOnly::Compiler),
    ("allow_host", HereOnly::Provider),
    ("kv", HereOnly::Provider),
    ("dir", HereOnly::Provider),
    ("dir_rw", HereOnly::Provider),
    ("env", HereOnly::Provider),
    ("http_timeout", HereOnly::ProviderSetting),
    ("max_response", HereOnly::ProviderSetting),
    ("kv_max_keys", HereOnly::ProviderSetting),
    ("kv_max_bytes", HereOnly::ProviderSetting),
    ("providers", HereOnly::ProviderComponent),
    ("reads", HereOnly::ProviderComponent),
    ("journal", HereOnly::Journal),
    ("keep_finished", HereOnly::Journal),
    ("durability", HereOnly::Journal),
    ("journal_limit", HereOnly::Journal),
    ("replayed_logs", HereOnly::Journal),
    ("suspend_after", HereOnly::Journal),
    ("snapshot_every", HereOnly::Journal),
    ("progress", HereOnly::Progress),
    ("args", HereOnly::Command),
    ("supervise", HereOnly::Supervision),
    ("restart", HereOnly::Supervision),
    ("restart_intensity", HereOnly::Supervision),
    ("restart_period", HereOnly::Supervision),
    ("restart_backoff", HereOnly::Supervision),
];

/// The flags of `run` that work with `--cluster` (besides those of [`ClusterArgs`]).
#[cfg(test)]
pub(super) const ON_CLUSTER: &[&str] = &[
    "app",
    "method",
    "inputs",
    "input_file",
    "memory",
    "fuel",
    "cpu_budget",
    "time_slice",
    "max_module_size",
    "timeout",
    "grace",
    // Carried to the nodes with the run's spawns (`RunLimits`), clamped to each node's.
    "max_children",
    "max_yields",
    "max_payload",
    "max_step_output",
    "mailbox",
    "mailbox_bytes",
    "max_links",
    // The run's processes alive on each node, counted by each node apart.
    "max_processes",
    "allow",
    "deny",
    "stats",
    "json",
    // Only how a usage error words itself (the shorthand's expansion).
    "shorthand",
];

/// Refuses, naming it, the first flag `given` that sets up this host rather than the
/// run: with `--cluster` nothing on this host would apply it.
pub(super) fn refuse_here_only(given: Given<'_>, command: &clap::Command) -> Result<(), Failure> {
    let Some((id, why)) = HERE_ONLY.iter().find(|(id, _)| given.has(id)) else { return Ok(()) };
    let long = command.get_arguments().find(|arg| arg.get_id() == *id).and_then(|arg| arg.get_long());
    let flag = long.map_or_else(|| format!("--{}", id.replace('_', "-")), |long| format!("--{long}"));
    let named = if long.is_some() { format!("`{flag}`") } else { "arguments after `--`".to_owned() };
    let why = match why {
        HereOnly::Scheduler => format!(
            "it sets up this host's scheduler, and a run on a cluster runs on a node's, under the node's own \
             settings: drop {flag}"
        ),
        HereOnly::Compiler => format!("the node compiles the program, under its own settings: drop {flag}"),
        HereOnly::Provider => format!(
            "on a cluster, providers are the nodes' own: start the nodes with `wasmproc node {flag} …` \
             (a run gets what its node serves unless --deny withdraws it)"
        ),
        HereOnly::ProviderSetting => {
            format!("on a cluster, providers are the nodes' own: start the nodes with `wasmproc node {flag} …`")
        }
        HereOnly::ProviderComponent => "provider components do not run on a cluster yet".to_owned(),
        HereOnly::Journal => "a durable run on a cluster is a workflow on its shards, journaled on JetStream and \
                              not in a directory of this host: `wasmproc cluster start APP --id ID --input JSON \
                              --wait DURATION`, with nodes started with --shards"
            .to_owned(),
        HereOnly::Progress => "it draws this host's scheduler, which a run on a cluster does not use".to_owned(),
        HereOnly::Command => "WASI commands do not run on a cluster: it runs process components".to_owned(),
        HereOnly::Supervision => "supervised runs do not run on a cluster yet: the supervisor would run on a \
                                  node and start its children there, and a spec names each child by a component \
                                  path on this host, while a run on a cluster brings only its one program to the \
                                  nodes; run the tree on one host, without --cluster"
            .to_owned(),
    };
    Err(Failure::new(Exit::Usage, format!("{named} with --cluster: {why}")))
}

/// A run on a cluster, as `run`'s flags set it.
pub(super) struct ClusterRun<'a> {
    pub(super) cluster: &'a ClusterArgs,
    pub(super) app: &'a Path,
    /// The entry's method, input, grants and sandbox limits.
    pub(super) options: RemoteSpawnOptions,
    pub(super) max_module_size: usize,
    pub(super) timeout: Option<Duration>,
    pub(super) grace: Duration,
    pub(super) json: bool,
    pub(super) stats: bool,
}

/// How long past `--grace` a stopped run on a cluster waits for its entry's result: the
/// node's termination and the exit's trip back. Picked out of thin air: a few
/// retransmissions on a loaded server.
const RESULT_AFTER_GRACE: Duration = Duration::from_secs(3);

/// `run APP --cluster URL`: joins as a client that takes no spawns, offers the program
/// to the cluster by its hash, spawns the entry on the least loaded node with the run's
/// options, prints the lines its processes write (tagged as a local run's), and reports
/// its result as a local run does.
///
/// A run stopped early (`--timeout`, a signal) asks every node to end the processes of
/// this run (cancel, `--grace`, terminate), waits for the entry's result, and leaves.
/// Whatever ends the client, its leaving (or, killed, its missed heartbeats) makes
/// every node end what is left of the run: nothing keeps running for a client that is
/// gone.
pub(super) fn run_on_cluster(
    run: ClusterRun<'_>,
    out: &Output,
    signals: &Signals,
    start: Instant,
) -> Result<ExitCode, Failure> {
    let bytes = super::input::read_app(run.app, run.max_module_size as u64)?;
    let hash = wasmproc::cluster::hash_of(&bytes);
    // A client, not a node: it holds no node id, and a server can hold it to a client's
    // rights (README, "A secured cluster on one machine").
    let cluster = Client::connect(run.cluster.config()?).map_err(|e| Failure::from_error(Exit::Host, &e))?;
    let lines = out.clone();
    cluster.set_line_sink(Arc::new(move |pid, source, message| {
        lines.guest_line(&LogRecord { pid, source: log_source(source), message, replayed: false });
    }));
    let name = run.app.file_name().map_or_else(|| run.app.display().to_string(), |n| n.to_string_lossy().into_owned());
    cluster.offer_named(hash.clone(), name, bytes);
    let process =
        cluster.spawn(None, None, Some(hash), run.options).map_err(|e| Failure::from_error(Exit::Host, &e))?;
    signals.started();
    let joining = process.clone();
    signals.forward_result(move || {
        let result = joining.join();
        Ended::from_result(joining.pid(), result)
    });
    let deadline = run.timeout.and_then(|timeout| start.checked_add(timeout));
    let (root, stop) = match signals.wait_for_entry(deadline, run.timeout) {
        Ok(outcome) => (Some(outcome), None),
        Err(stop) => {
            let what = match stop {
                Stop::Timeout(_) => stop.reason(),
                Stop::Signal(_) => format!("{} (again to force)", stop.reason()),
            };
            out.say(Say::Notice, format!("{what}: stopping the run on the cluster"));
            cluster.stop_run(&stop.reason(), run.grace);
            let until = Instant::now() + run.grace.saturating_add(RESULT_AFTER_GRACE);
            (signals.entry_result_by(until), Some(stop))
        }
    };
    let summary = run.stats.then(|| {
        let id = process.pid().map_or(0, |pid| pid.node());
        let node = cluster.nodes().into_iter().find(|n| n.id == id).map_or_else(|| format!("node {id}"), |n| n.name);
        Summary::cluster(node, id, cluster.stats(), start.elapsed(), out.dropped())
    });
    cluster.leave();
    let flush_by = stop.map(|_| Instant::now() + super::stop::FLUSH_AFTER_STOP);
    Ok(Report::new(run.json, out, false).with_summary(summary).finish(root, stop, flush_by))
}

/// The source of a line another node forwarded, from its name.
fn log_source(name: &str) -> LogSource {
    match name {
        "stdout" => LogSource::Stdout,
        "trace" => LogSource::Log(Level::Trace),
        "debug" => LogSource::Log(Level::Debug),
        "info" => LogSource::Log(Level::Info),
        "warn" => LogSource::Log(Level::Warn),
        "error" => LogSource::Log(Level::Error),
        // Another node's stderr, or a source this version does not know: shown as the
        // guest's stderr, the least trusted.
        _ => LogSource::Stderr,
    }
}
