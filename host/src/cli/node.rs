//! `wasmproc node` (a host that joins a cluster) and `wasmproc cluster` (`ls`, and `run`,
//! which is `run --cluster`: see `on_cluster.rs`).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use wasmproc::cluster::{
    Cluster, ClusterConfig, InboxOptions, JetStreamOptions, LeaseOptions, Loader, Placement, ShardHost, ShardOptions,
    SharedKv, SharedKvOptions, WorkflowKinds, WorkflowOptions, Workflows,
};
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
    /// Run the cluster's durable workflows too (`cluster start`): they live in N shards,
    /// each journaled to JetStream and run by one node at a time, the holder of its
    /// lease; this node takes its fair share, takes over part of a lost node's shards
    /// once their leases expire, and hands its own over when stopped (SIGTERM or Ctrl-C).
    /// Every node gives the same N, fixed when the first one starts (1 to 1024). Needs
    /// JetStream on the NATS servers (2.11 or later). Each shard runs on --workers
    /// threads (default 1), its processes granted what the node grants its runs: the
    /// built-in commands, and the HTTP hosts, directories and variables of its flags
    /// (give every node the same), but not --kv, a store of this machine's (see
    /// --shared-kv).
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
    /// Give the shards' processes `kv.*` on the key-value store the cluster's nodes share:
    /// the JetStream bucket WASMPROC_KV (created with --replicas replicas), so a workflow
    /// finds its keys on whichever node runs its shard. Compare-and-swap is the server's,
    /// across every node; a durable process's write carried out again after a crash is
    /// written once. Give every node the flag.
    #[arg(long, requires = "shards")]
    shared_kv: bool,
    /// The most bytes the shared store holds (for every node together, set when the
    /// bucket is created), e.g. 256MiB.
    #[arg(long, value_name = "SIZE", default_value = super::units::size_text(wasmproc::provider::kv::KvSettings::default().max_bytes as usize), value_parser = super::units::size, requires = "shared_kv")]
    shared_kv_max_bytes: usize,
    /// How long a shard's lease lasts unless renewed, in whole seconds: a lost node's
    /// shards pass to the others this long after its last renewal.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = super::units::duration, requires = "shards")]
    lease: Duration,
    /// The replicas of the shards' journals, leases, workflow records and components when
    /// this node creates them: 3 on a NATS cluster of three servers or more, so that
    /// the loss of a server loses nothing.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "shards")]
    replicas: usize,
    /// How many group commits of a shard's journal may await JetStream's acknowledgement
    /// at once (1 to 64). More overlaps the round trips to the servers, which helps when
    /// they are far (milliseconds away) and have cores to spare; with the servers on
    /// this machine, one at a time commits larger groups and was measured faster.
    #[arg(long, value_name = "N", default_value_t = wasmproc::cluster::DEFAULT_PIPELINE, requires = "shards")]
    journal_pipeline: usize,
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
        let shards_config = config.clone();
        let cluster = Cluster::join(config.grace(self.grace)).map_err(host_failure)?;
        let _ = joined.set(cluster.clone());
        let providers = providers.on_node(cluster.name());
        // The CLI's grants: the built-ins but those over other processes (unless allowed), and
        // every provider family, served or standing in with a denial that names this
        // node's flag. A run's own grants narrow these, never widen them.
        let caps = FAMILIES.iter().fold(granted, |caps, family| caps.allow(&format!("{family}.*")));
        let shard_caps = caps.clone();
        let node = cluster.name().to_owned();
        let mut builder = providers
            .register(Scheduler::builder().cluster(&cluster).capabilities(caps))
            .denial_hint(move |name| format!("grant it with `run --allow {name}`, where node `{node}` grants it too"));
        builder = self.limits.scheduler(builder);
        if let Some(workers) = self.workers {
            builder = builder.workers(workers);
        }
        let scheduler = builder.build().map_err(host_failure)?;
        let loading = runtime.clone();
        let loader: Loader = Arc::new(move |bytes: &[u8]| {
            loading.load_bytes(bytes).map(|component| Arc::new(component) as Arc<dyn Factory>)
        });
        cluster.set_loader(loader.clone());
        cluster.serve(scheduler.handle().clone());
        let shards = match self.shards {
            Some(count) => Some(self.host_shards(
                count,
                &shards_config,
                cluster.name(),
                loader,
                (shard_caps, providers.clone()),
            )?),
            None => None,
        };
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
        if let Some(shards) = shards {
            eprintln!("wasmproc: handing this node's shards over");
            shards.drain();
        }
        cluster.leave();
        scheduler.stop(Duration::from_millis(500));
        Ok(Exit::Success.into())
    }
}

impl Node {
    /// Joins the shards of durable workflows as `name`: see `--shards`.
    fn host_shards(
        &self,
        count: u32,
        config: &ClusterConfig,
        name: &str,
        loader: Loader,
        (granted, providers): (Capabilities, Providers),
    ) -> Result<ShardHost, Failure> {
        let options = WorkflowOptions::new().shards(count).replicas(self.replicas);
        let workflows = Arc::new(patiently(|| Workflows::open(config, &options)).map_err(host_failure)?);
        let shared_kv = if self.shared_kv {
            let options = SharedKvOptions::new().replicas(self.replicas).max_bytes(self.shared_kv_max_bytes as u64);
            Some(patiently(|| SharedKv::open(config, &options)).map_err(host_failure)?)
        } else {
            None
        };
        let providers = providers.for_shards(shared_kv);
        let holder = holder(name);
        let options = ShardOptions::new(count)
            .journal(JetStreamOptions::new().replicas(self.replicas).pipeline(self.journal_pipeline))
            .inbox(InboxOptions::new().replicas(self.replicas))
            .leases(LeaseOptions::new().ttl(self.lease).replicas(self.replicas))
            .workflows(workflows.clone());
        let (limits, workers) = (self.limits.clone(), self.workers.unwrap_or(1));
        let build = move |_: u32, builder: wasmproc::scheduler::Builder| {
            let builder = builder
                .workers(workers)
                .thread_name("wasmproc-shard")
                .capabilities(granted.clone())
                .kind_source(WorkflowKinds::new(workflows.clone(), loader.clone()));
            limits.scheduler(providers.register(builder)).build()
        };
        let build = Arc::new(build);
        let host = patiently(|| {
            let build = build.clone();
            ShardHost::start(config, &holder, options.clone(), move |shard, builder| build(shard, builder))
        })
        .map_err(host_failure)?;
        eprintln!("wasmproc: node `{holder}` takes its share of {count} shards of durable workflows");
        Ok(host)
    }
}

/// `open()`, tried again for a while when it fails as a cluster being made does: its
/// JetStream buckets answer once their replicas elect a leader, which a cluster whose
/// nodes start together, or that lost a server, takes seconds to do.
fn patiently<T>(mut open: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match open() {
            Ok(opened) => return Ok(opened),
            Err(error)
                if std::time::Instant::now() < deadline
                    && ["503", "timed out", "did not answer"]
                        .iter()
                        .any(|sign| format!("{error:#}").contains(sign)) =>
            {
                tracing::info!("the cluster's JetStream does not answer yet: {error:#}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => return Err(error),
        }
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
    /// List the nodes: id, name, live processes, whether they take spawns, the shards of
    /// durable workflows each holds, and the components each holds, by the file name a
    /// run loaded it from and its hash.
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
    /// Start a durable workflow on the cluster's shards (nodes started with --shards):
    /// keeps the component in the cluster, writes the workflow's record and prints it
    /// (JSON). It runs on whichever node holds its shard, and goes on on another if that
    /// node is lost. Starting an id again finds the first workflow (refused if it was
    /// started with another component, entry or input).
    #[command(after_help = START_AFTER_HELP)]
    Start(Box<Start>),
    /// Print a durable workflow's record (JSON: state, pid, result or error).
    Workflow {
        /// The workflow's id.
        id: String,
        /// Wait up to this long for it to end first (exit code 4 if it has not).
        #[arg(long, value_name = "DURATION", value_parser = super::units::duration)]
        wait: Option<Duration>,
        #[command(flatten)]
        cluster: Box<ClusterArgs>,
    },
    /// List the shards of durable workflows and the node holding each.
    Shards {
        #[command(flatten)]
        cluster: Box<ClusterArgs>,
    },
}

const START_AFTER_HELP: &str = "\
Examples:
  wasmproc cluster start durable.wasm --id order-17 --input '[4, 5]' --cluster nats://127.0.0.1:4222
  wasmproc cluster workflow order-17 --wait 60s --cluster nats://127.0.0.1:4222

Exit codes with --wait: 0 completed, 1 failed, 4 still running when the wait ended.";

/// `wasmproc cluster start`.
#[derive(Args, Debug)]
pub(super) struct Start {
    /// The component (.wasm) the workflow runs.
    component: std::path::PathBuf,
    /// The workflow's id, unique in the cluster: letters, digits, `-` and `_`.
    #[arg(long)]
    id: String,
    /// The entry its root process runs.
    #[arg(long, default_value = "main")]
    entry: String,
    /// Its input, as JSON. [default: null]
    #[arg(long, value_name = "JSON")]
    input: Option<String>,
    /// Wait up to this long for it to end, and print its record then (exit code 4 if it
    /// has not ended).
    #[arg(long, value_name = "DURATION", value_parser = super::units::duration)]
    wait: Option<Duration>,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Prints `record` and tells its state by the exit code.
fn report(record: &wasmproc::cluster::ShardWorkflow, waited: bool) -> Result<ExitCode, Failure> {
    let line = serde_json::to_string(record).map_err(|e| Failure::new(Exit::Host, e.to_string()))?;
    println!("{line}");
    Ok(match record.state {
        wasmproc::cluster::WorkflowState::Failed => Exit::ProcessFailed,
        state if waited && !state.ended() => Exit::Timeout,
        _ => Exit::Success,
    }
    .into())
}

/// How a lease names node `name` in a key: what a key cannot hold (a host name's dots)
/// made dashes.
fn holder(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect()
}

/// Shards as ranges: `0-3,7`; `-` for none.
fn shard_ranges(shards: &[u32]) -> String {
    let mut ranges: Vec<String> = Vec::new();
    let mut index = 0;
    while index < shards.len() {
        let first = shards[index];
        let mut last = first;
        while index + 1 < shards.len() && shards[index + 1] == last + 1 {
            index += 1;
            last = shards[index];
        }
        ranges.push(if first == last { first.to_string() } else { format!("{first}-{last}") });
        index += 1;
    }
    if ranges.is_empty() { "-".to_owned() } else { ranges.join(",") }
}

/// A failure of the cluster or the host, not of what the user asked.
fn host_failure(error: anyhow::Error) -> Failure {
    Failure::from_error(Exit::Host, &error)
}

fn open_workflows(cluster: &ClusterArgs) -> Result<Workflows, Failure> {
    let config = cluster.config()?;
    patiently(|| Workflows::open(&config, &WorkflowOptions::new())).map_err(host_failure)
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
            ClusterAction::Start(start) => {
                let bytes = std::fs::read(&start.component).map_err(|e| {
                    Failure::new(Exit::Usage, format!("cannot read `{}`: {e}", start.component.display()))
                })?;
                let input = match &start.input {
                    Some(text) => serde_json::from_str(text)
                        .map_err(|e| Failure::new(Exit::Usage, format!("--input is not JSON: {e}")))?,
                    None => serde_json::Value::Null,
                };
                wasmproc::cluster::check_id(&start.id).map_err(|e| Failure::from_error(Exit::Usage, &e))?;
                let workflows = open_workflows(&start.cluster)?;
                let hash = workflows.deploy(&bytes).map_err(host_failure)?;
                let (record, _) = workflows.start(&start.id, &hash, &start.entry, input).map_err(host_failure)?;
                return match start.wait {
                    Some(wait) => report(&workflows.wait(&start.id, wait).map_err(host_failure)?, true),
                    None => report(&record, false),
                };
            }
            ClusterAction::Workflow { id, wait, cluster } => {
                wasmproc::cluster::check_id(&id).map_err(|e| Failure::from_error(Exit::Usage, &e))?;
                let workflows = open_workflows(&cluster)?;
                return match wait {
                    Some(wait) => report(&workflows.wait(&id, wait).map_err(host_failure)?, true),
                    None => match workflows.get(&id).map_err(host_failure)? {
                        Some((record, _)) => report(&record, false),
                        None => Err(Failure::new(Exit::Usage, format!("no workflow `{id}` in the cluster"))),
                    },
                };
            }
            ClusterAction::Shards { cluster } => {
                let workflows = open_workflows(&cluster)?;
                let config = cluster.config()?;
                let owners = patiently(|| {
                    wasmproc::cluster::Leases::open(&config, "cluster-ls", &LeaseOptions::new())
                        .and_then(|leases| leases.owners())
                })
                .map_err(host_failure)?;
                let mut out = String::from("SHARD  OWNER\n");
                for shard in 0..workflows.shards() {
                    let owner = owners.get(&shard).map_or("-", String::as_str);
                    out.push_str(&format!("{shard:<6} {owner}\n"));
                }
                print!("{out}");
                return Ok(Exit::Success.into());
            }
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
        let config = cluster.config()?;
        let nodes = wasmproc::cluster::list(config.clone()).map_err(host_failure)?;
        // Without a lease bucket no node ever ran shards: none are held. Without an
        // answer (no JetStream on a cluster that runs no shards, or no right to read
        // the bucket) which node holds what is unknown, and shown so: `?`, `null`.
        let owners = wasmproc::cluster::Leases::existing(&config, "cluster-ls", &LeaseOptions::new())
            .and_then(|leases| leases.map(|leases| leases.owners()).transpose())
            .ok()
            .map(Option::unwrap_or_default);
        let mut held: std::collections::BTreeMap<&str, Vec<u32>> = std::collections::BTreeMap::new();
        for (shard, owner) in owners.iter().flatten() {
            held.entry(owner.as_str()).or_default().push(*shard);
        }
        let shards_of =
            |name: &str| owners.as_ref().map(|_| held.get(holder(name).as_str()).cloned().unwrap_or_default());
        let mut out = String::new();
        if !json {
            out.push_str("ID    NAME                  LOAD  SPAWNS  SHARDS      COMPONENTS\n");
        }
        for node in &nodes {
            if json {
                let names: serde_json::Map<String, serde_json::Value> =
                    node.component_names.iter().map(|(hash, name)| (hash.clone(), name.clone().into())).collect();
                let line = serde_json::json!({
                    "id": node.id, "name": node.name, "load": node.load,
                    "accepts": node.accepts, "shards": shards_of(&node.name),
                    "components": node.components, "component_names": names,
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
                let shards = shards_of(&node.name).map_or_else(|| "?".to_owned(), |shards| shard_ranges(&shards));
                out.push_str(&format!(
                    "{:<5} {:<21} {:<5} {:<7} {shards:<11} {components}\n",
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
