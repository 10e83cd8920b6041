//! `wasmproc node` (a host that joins a cluster) and `wasmproc cluster` (`ls`, and `run`,
//! which is `run --cluster`: see `on_cluster.rs`).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use wasmproc::cluster::{Cluster, Placement};
use wasmproc::handler::Factory;
use wasmproc::wasm::{Escaped, LogRecord};
use wasmproc::{Capabilities, Scheduler};

use super::providers::{FAMILIES, ProviderArgs, Providers, dir_grants, env_vars};
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
    /// Grant the processes this node runs a command it grants by default only over their
    /// own children (repeatable): terminate, exit, link. A remote spawn gets the grants it
    /// asks for intersected with these.
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
        let mut granted = Capabilities::over_self();
        for name in &self.allow {
            if !Capabilities::OVER_OTHERS.contains(&name.as_str()) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "--allow `{name}`: a node grants its processes every built-in command, `terminate`, `exit` \
                         and `link` over their own children only, and the provider families it serves; only \
                         `terminate`, `exit` and `link` can be allowed"
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
        // The CLI's grants: the built-ins but those over other processes (unless allowed), and
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
