//! `wasmproc node` (a host that joins a cluster), `wasmproc cluster ls`, and what
//! `run --cluster` does instead of running locally.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use wasmproc::Capabilities;
use wasmproc::Scheduler;
use wasmproc::cluster::{Cluster, ClusterConfig, Placement, RemoteSpawnOptions};
use wasmproc::handler::{Factory, KindLimits};
use wasmproc::scheduler::SpawnOptions;

use super::{EngineArgs, Exit, Failure, runtime};

/// The variable that sets `--cluster-secret` when the flag is not given.
const SECRET_VAR: &str = "WASMPROC_CLUSTER_SECRET";
/// The variable that sets `--cluster-token` when the flag is not given.
const TOKEN_VAR: &str = "WASMPROC_CLUSTER_TOKEN";

/// How to reach a cluster.
#[derive(Args, Debug, Clone)]
pub(super) struct ClusterArgs {
    /// The NATS server of the cluster, e.g. nats://127.0.0.1:4222 (with a user and
    /// password: nats://USER:PASSWORD@HOST:PORT).
    #[arg(long = "cluster", value_name = "URL")]
    pub(super) url: Option<String>,
    /// The secret every node of the cluster shares: each message between nodes is
    /// authenticated with it (HMAC-SHA256), and a node drops what does not verify. Also
    /// read from $WASMPROC_CLUSTER_SECRET. [default: none, which authenticates nothing]
    #[arg(long, value_name = "SECRET")]
    cluster_secret: Option<String>,
    /// A NATS authentication token. Also read from $WASMPROC_CLUSTER_TOKEN.
    #[arg(long, value_name = "TOKEN")]
    cluster_token: Option<String>,
}

impl ClusterArgs {
    fn config(&self) -> Result<ClusterConfig, Failure> {
        let url = self.url.clone().ok_or_else(|| Failure::new(Exit::Usage, "--cluster URL is required"))?;
        let mut config = ClusterConfig::new(url);
        if let Some(secret) = self.cluster_secret.clone().or_else(|| std::env::var(SECRET_VAR).ok()) {
            config = config.secret(secret);
        }
        if let Some(token) = self.cluster_token.clone().or_else(|| std::env::var(TOKEN_VAR).ok()) {
            config = config.token(token);
        }
        Ok(config)
    }
}

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
    #[command(flatten)]
    cluster: ClusterArgs,
    /// This node's name, unique in the cluster. [default: HOSTNAME-PID]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Where spawns of this node's processes go.
    #[arg(long, value_enum, default_value = "least-loaded")]
    placement: PlacementArg,
    /// Worker threads. [default: one per core]
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    #[command(flatten)]
    engine: EngineArgs,
}

impl Node {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let placement = match self.placement {
            PlacementArg::LeastLoaded => Placement::LeastLoaded,
            PlacementArg::Local => Placement::Local,
        };
        let mut config = self.cluster.config()?.placement(placement);
        if let Some(name) = &self.name {
            config = config.name(name.clone());
        }
        let runtime = runtime(self.engine.config()?)?;
        let cluster = Cluster::join(config).map_err(|e| Failure::from_error(Exit::Host, &e))?;
        let mut builder = Scheduler::builder().cluster(&cluster);
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
    /// List the nodes: id, name, live processes, whether they take spawns, components.
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// One JSON object per node, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Run a program's entry process on the cluster's least loaded node and print its
    /// result (what `run APP --cluster URL` does).
    Run {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The program: a component of the `wasmproc:process` world.
        app: std::path::PathBuf,
        /// The entry method.
        #[arg(long, default_value = "main")]
        method: String,
        /// The entry's input, JSON; repeat for more.
        #[arg(long = "input", value_name = "JSON")]
        inputs: Vec<String>,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

impl ClusterCommand {
    pub(super) fn execute(self) -> Result<ExitCode, Failure> {
        let (cluster, json) = match self.action {
            ClusterAction::Ls { cluster, json } => (cluster, json),
            ClusterAction::Run { cluster, app, method, inputs, engine } => {
                let inputs = super::input::payloads(&inputs, None, 16 << 20)?;
                // No time slice of its own: the node's bounds it.
                let mut limits = KindLimits::new(engine.memory, Duration::MAX);
                if let Some(fuel) = engine.fuel {
                    limits = limits.fuel(fuel);
                }
                let options = SpawnOptions::new(method).input(inputs).capabilities(Capabilities::default());
                return run_on_cluster(
                    &cluster,
                    &app,
                    RemoteSpawnOptions::new(options).limits(limits),
                    engine.max_module_size,
                );
            }
        };
        let nodes = wasmproc::cluster::list(cluster.config()?).map_err(|e| Failure::from_error(Exit::Host, &e))?;
        let mut out = String::new();
        if !json {
            out.push_str("ID    NAME                  LOAD  SPAWNS  COMPONENTS\n");
        }
        for node in &nodes {
            if json {
                let line = serde_json::json!({
                    "id": node.id, "name": node.name, "load": node.load,
                    "accepts": node.accepts, "components": node.components,
                });
                out.push_str(&format!("{line}\n"));
            } else {
                let components = if node.components.is_empty() { "-".to_owned() } else { node.components.join(",") };
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

/// `run APP --cluster URL`: joins as a client that takes no spawns, offers the program
/// to the cluster by its hash, spawns the entry on the least loaded node with `options`
/// (the run's entry, grants and sandbox limits), and prints its result.
pub(super) fn run_on_cluster(
    cluster: &ClusterArgs,
    app: &Path,
    options: RemoteSpawnOptions,
    max_module_size: usize,
) -> Result<ExitCode, Failure> {
    let bytes = super::input::read_app(app, max_module_size as u64)?;
    let hash = hash(&bytes);
    let config = cluster.config()?.accepts_spawns(false).name(format!("run-{}", std::process::id()));
    let cluster = Cluster::join(config).map_err(|e| Failure::from_error(Exit::Host, &e))?;
    cluster.offer(hash.clone(), bytes);
    let process = cluster.spawn(None, None, Some(hash), options).map_err(|e| Failure::from_error(Exit::Host, &e))?;
    let result = process.join();
    cluster.leave();
    match result {
        Ok(payload) => {
            println!("{}", String::from_utf8_lossy(&payload.data));
            Ok(Exit::Success.into())
        }
        Err(error) => Err(Failure::new(Exit::ProcessFailed, error)),
    }
}

/// `sha256:<hex>` of `bytes`: a component's identity across the cluster.
fn hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
