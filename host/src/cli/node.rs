//! `wasmproc node` (a host that joins a cluster), `wasmproc cluster ls`, and what
//! `run --cluster` does instead of running locally.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use wasmproc::cluster::{Client, Cluster, Placement, RemoteSpawnOptions};
use wasmproc::handler::Factory;
use wasmproc::wasm::{Escaped, Level, LogRecord, LogSource};
use wasmproc::{Capabilities, Scheduler};

use super::output::{Output, Say};
use super::providers::{FAMILIES, ProviderArgs, Providers, dir_grants, env_vars};
use super::report::{Report, Summary};
use super::stop::{Signals, Stop};
use super::{ClusterArgs, EngineArgs, Exit, Failure, Given, GrantArgs, LimitArgs, runtime};

/// Where a node's processes spawn theirs.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum PlacementArg {
    /// On the node with the fewest live processes.
    LeastLoaded,
    /// On the spawning node.
    Local,
}

/// `wasmproc node`: joins a cluster and runs what it is given until stopped.
#[derive(Args, Debug)]
pub(super) struct Node {
    /// This node's name, unique in the cluster. [default: HOSTNAME-PID]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Where spawns of this node's processes go.
    #[arg(long, value_enum, default_value = "least-loaded")]
    placement: PlacementArg,
    /// Worker threads. [default: one per core]
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// How long the processes of a run have to end once cancelled, when the host that
    /// started the run (a `run --cluster` client, or another node) leaves the cluster or
    /// is lost, before they are terminated. A client that stops its run early sends its
    /// own `--grace`.
    #[arg(long, value_name = "DURATION", default_value = super::units::duration_text(wasmproc::cluster::GRACE), value_parser = super::units::duration)]
    grace: Duration,
    /// Grant the processes this node runs a command it does not grant by default
    /// (repeatable): terminate. A remote spawn gets the grants it asks for intersected
    /// with these.
    #[arg(long = "allow", value_name = "COMMAND")]
    allow: Vec<String>,
    /// Join even with no authentication at all (no NATS credentials, TLS client
    /// certificate or --cluster-secret), so that anyone who reaches the NATS server can
    /// run code here. Without it, such a node refuses to start.
    #[arg(long)]
    insecure: bool,
    /// Let any run spawn by hash the components other runs brought here. Without it, a
    /// component fetched for one run (process tree) is spawnable by hash only within it.
    #[arg(long)]
    share_components: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    grants: GrantArgs,
    /// The providers this node serves to every run's processes: a run gets each one it
    /// does not withdraw with its own --deny. (--provider and --reads are refused: provider
    /// components do not run on a node yet.)
    #[command(flatten)]
    providers: ProviderArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

impl Node {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let placement = match self.placement {
            PlacementArg::LeastLoaded => Placement::LeastLoaded,
            PlacementArg::Local => Placement::Local,
        };
        let mut config =
            self.cluster.config()?.placement(placement).insecure(self.insecure).share_components(self.share_components);
        if let Some(name) = &self.name {
            config = config.name(name.clone());
        }
        if !config.authenticates() {
            if !self.insecure {
                return Err(Failure::new(
                    Exit::Usage,
                    "this node would join with no authentication at all, so that anyone who reaches the NATS \
                     server could run code on it: give NATS credentials (--cluster-creds, --cluster-nkey, \
                     --cluster-token, or a user in the URL), a TLS client certificate (--cluster-cert and \
                     --cluster-key), or a --cluster-secret; or --insecure to run it open",
                ));
            }
            eprintln!(
                "wasmproc: WARNING: --insecure: this node authenticates nothing; anyone who reaches the NATS \
                 server can run code on it"
            );
        }
        let mut granted = Capabilities::default().deny("terminate");
        for name in &self.allow {
            if name != "terminate" {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "--allow `{name}`: a node grants its processes every built-in command but `terminate`, and \
                         the provider families it serves; only `terminate` can be allowed"
                    ),
                ));
            }
            granted = granted.allow(name);
        }
        if let Some(flag) = ["--provider", "--reads"]
            .into_iter()
            .zip([!self.providers.providers.is_empty(), !self.providers.reads.is_empty()])
            .find_map(|(flag, given)| given.then_some(flag))
        {
            return Err(Failure::new(Exit::Usage, format!("`{flag}`: provider components do not run on a node yet")));
        }
        self.limits.check()?;
        let providers = Providers::start(
            &self.providers,
            dir_grants(&self.grants.dir, &self.grants.dir_rw)?,
            env_vars(&self.grants.env)?,
        )?;
        // A line of a process that belongs to another host's run goes to that host; the
        // cluster is joined after the runtime is made, so the sink finds it here.
        let joined: Arc<OnceLock<Cluster>> = Arc::default();
        let forward = joined.clone();
        let config_engine = self.limits.runtime(self.engine.config()?).log_sink(move |record: &LogRecord<'_>| {
            let source = record.source.to_string();
            if !forward.get().is_some_and(|cluster| cluster.forward_line(record.pid, &source, record.message)) {
                tracing::info!(target: "wasmproc::guest", pid = %record.pid, source, "{}", Escaped(record.message));
            }
        });
        let runtime = runtime(config_engine)?;
        let cluster = Cluster::join(config.grace(self.grace)).map_err(|e| Failure::from_error(Exit::Host, &e))?;
        let _ = joined.set(cluster.clone());
        let providers = providers.on_node(cluster.name());
        // The CLI's grants: the built-ins but `terminate` (unless --allow terminate), and
        // every provider family, served or standing in with a denial that names this
        // node's flag. A run's own grants narrow these, never widen them.
        let caps = FAMILIES.iter().fold(granted, |caps, family| caps.allow(&format!("{family}.*")));
        let node = cluster.name().to_owned();
        let mut builder = providers
            .register(Scheduler::builder().cluster(&cluster).capabilities(caps))
            .denial_hint(move |name| format!("grant it with `run --allow {name}`, where node `{node}` grants it too"));
        builder = self.limits.scheduler(builder);
        if let Some(workers) = self.workers {
            builder = builder.workers(workers);
        }
        let scheduler = builder.build().map_err(|e| Failure::from_error(Exit::Host, &e))?;
        let loader = runtime.clone();
        cluster.set_loader(Arc::new(move |bytes: &[u8]| {
            loader.load_bytes(bytes).map(|component| Arc::new(component) as Arc<dyn Factory>)
        }));
        cluster.serve(scheduler.handle().clone());
        tracing::info!(node = cluster.node(), name = cluster.name(), "joined the cluster");
        eprintln!("wasmproc: node {} (`{}`) joined the cluster; Ctrl-C leaves it", cluster.node(), cluster.name());

        let stop = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
            signal_hook::flag::register(signal, stop.clone())
                .map_err(|e| Failure::new(Exit::Host, format!("cannot listen for signals: {e}")))?;
        }
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster.leave();
        scheduler.stop(Duration::from_millis(500));
        Ok(Exit::Success.into())
    }
}

/// `wasmproc cluster`: look at a cluster.
#[derive(Args, Debug)]
pub(super) struct ClusterCommand {
    #[command(subcommand)]
    action: ClusterAction,
}

#[derive(Subcommand, Debug)]
enum ClusterAction {
    /// List the nodes: id, name, live processes, whether they take spawns, and the
    /// components each holds, by the file name a run loaded it from and its hash.
    Ls {
        /// One JSON object per node, one per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: Box<ClusterArgs>,
    },
    /// Run a program's entry process on the cluster's least loaded node and print its
    /// result: the same as `wasmproc run APP --cluster URL`, with the same flags.
    #[command(after_help = RUN_AFTER_HELP)]
    Run(Box<super::run::Run>),
}

const RUN_AFTER_HELP: &str = "\
Examples:
  wasmproc cluster run app.wasm --cluster nats://127.0.0.1:4222 --input '{\"n\": 10}'
  wasmproc run app.wasm --cluster nats://127.0.0.1:4222 --input-file job.json --json

The entry process runs on a node (`wasmproc node`), which fetches the program by its
hash. The flags of a run apply as on one host, except those that set up this host (its
scheduler, compiler, providers or journal): given with --cluster, each is refused, naming
the node's own setting where there is one.";

impl ClusterCommand {
    pub(super) fn execute(self, given: Given<'_>) -> Result<ExitCode, Failure> {
        let (cluster, json) = match self.action {
            ClusterAction::Ls { cluster, json } => (cluster, json),
            ClusterAction::Run(run) => {
                if run.cluster.url.is_none() {
                    return Err(Failure::new(
                        Exit::Usage,
                        "`cluster run` needs --cluster URL, the cluster's NATS server (e.g. nats://127.0.0.1:4222)",
                    ));
                }
                return run.execute(given);
            }
        };
        let nodes = wasmproc::cluster::list(cluster.config()?).map_err(|e| Failure::from_error(Exit::Host, &e))?;
        let mut out = String::new();
        if !json {
            out.push_str("ID    NAME                  LOAD  SPAWNS  COMPONENTS\n");
        }
        for node in &nodes {
            if json {
                let names: serde_json::Map<String, serde_json::Value> =
                    node.component_names.iter().map(|(hash, name)| (hash.clone(), name.clone().into())).collect();
                let line = serde_json::json!({
                    "id": node.id, "name": node.name, "load": node.load,
                    "accepts": node.accepts, "components": node.components, "component_names": names,
                });
                out.push_str(&format!("{line}\n"));
            } else {
                let components = if node.components.is_empty() {
                    "-".to_owned()
                } else {
                    let named = |hash: &String| match node.component_name(hash) {
                        Some(name) => format!("{name} ({hash})"),
                        None => hash.clone(),
                    };
                    node.components.iter().map(named).collect::<Vec<_>>().join(", ")
                };
                let accepts = if node.accepts { "yes" } else { "no" };
                out.push_str(&format!(
                    "{:<5} {:<21} {:<5} {:<7} {components}\n",
                    node.id, node.name, node.load, accepts
                ));
            }
        }
        if nodes.is_empty() && !json {
            out.push_str("(no node answered)\n");
        }
        print!("{out}");
        Ok(Exit::Success.into())
    }
}

/// Why a flag of `run` does not apply to a run on a cluster.
#[derive(Clone, Copy)]
enum HereOnly {
    /// It sets up this host's scheduler or sandbox, which the run does not use.
    Scheduler,
    /// It bounds the processes alive on one host.
    Processes,
    /// It sets how this host compiles the program; the node compiles it.
    Compiler,
    /// It gives processes a provider; a node's providers are the node's own flags.
    Provider,
    /// It tunes a provider of this host.
    ProviderSetting,
    /// Provider components run beside the run on this host.
    ProviderComponent,
    /// Durable runs need a journal on the host that runs them.
    Journal,
    /// It shows this host's scheduler.
    Progress,
    /// WASI commands run in one process on one host.
    Command,
}

/// The flags of `run` (by clap id, the field's name) that set up this host, and why
/// each does not apply to a run on a cluster. Every other flag of `run` works with
/// `--cluster` (the test `every_run_flag_works_on_a_cluster_or_is_refused` holds the
/// two lists to the whole of `run`).
const HERE_ONLY: &[(&str, HereOnly)] = &[
    ("workers", HereOnly::Scheduler),
    ("no_preemption", HereOnly::Scheduler),
    ("max_processes", HereOnly::Processes),
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
    ("progress", HereOnly::Progress),
    ("args", HereOnly::Command),
];

/// The flags of `run` that work with `--cluster` (besides those of [`ClusterArgs`]).
#[cfg(test)]
const ON_CLUSTER: &[&str] = &[
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
        HereOnly::Processes => format!(
            "it bounds the processes alive on this host, and a run on a cluster spreads over nodes that each \
             count only their own, with no count of the run's across them: drop {flag}, and bound the run with \
             --max-children (each process's live children), which its spawns carry to every node"
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
        HereOnly::Journal => "durable processes do not run on a cluster yet".to_owned(),
        HereOnly::Progress => "it draws this host's scheduler, which a run on a cluster does not use".to_owned(),
        HereOnly::Command => "WASI commands do not run on a cluster: it runs process components".to_owned(),
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
    let hash = hash(&bytes);
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
    signals.forward_result(move || joining.join());
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

/// `sha256:<hex>` of `bytes`: a component's identity across the cluster.
fn hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use clap::{Args as _, Command};

    use super::*;

    /// Each flag of `run` either works with `--cluster` or is refused with it, naming
    /// it: none is taken and then ignored, a new flag included (it fails this test until
    /// it is put in one of the two lists).
    #[test]
    fn every_run_flag_works_on_a_cluster_or_is_refused() {
        let run = super::super::run::Run::augment_args(Command::new("run"));
        let cluster = ClusterArgs::augment_args(Command::new("cluster"));
        let cluster_ids: Vec<&str> = cluster.get_arguments().map(|a| a.get_id().as_str()).collect();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            let refused = HERE_ONLY.iter().any(|(here, _)| *here == id);
            let works = ON_CLUSTER.contains(&id) || cluster_ids.contains(&id);
            assert!(
                refused != works,
                "`{id}` of `run` is {} with --cluster",
                if works { "both allowed and refused" } else { "neither allowed nor refused" }
            );
        }
        for id in HERE_ONLY.iter().map(|(id, _)| *id).chain(ON_CLUSTER.iter().copied()) {
            assert!(run.get_arguments().any(|a| a.get_id() == id), "`run` has no flag `{id}`");
        }
    }
}
