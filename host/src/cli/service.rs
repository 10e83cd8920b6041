//! `wasmproc serve`, the long-lived service, and the client commands that speak its API:
//! `deploy`, `undeploy`, `start`, `status`, `result`, `signal`, `request`, `logs`,
//! `cancel`, `terminate`, `ps`, `forget` and `tenant`.
//!
//! A client command prints what the server answered: a line or a table by default, the
//! API's JSON with `--json`. Its exit code is `run`'s: 0 for a workflow that completed
//! (or a request carried out), 1 for one that failed, 2 for a request the server refused
//! as wrong (unknown id, bad input…), 4 when `result --wait` gave up, 5 when the server
//! cannot be reached or fails.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use wasmproc::serve::wire::{
    ComponentAnswer, ErrorBody, History, Outcome, State, TenantPolicy, TenantToken, Tenants, Waiting, Workflow,
    WorkflowAnswer, WorkflowPage,
};
use wasmproc::serve::{Grants, Limits, Policy, PolicyFields, Service, ServiceConfig, StartRequest};

use super::output::{Say, say_now};
use super::{Exit, Failure, units};

/// `dirs` as absolute paths (against the current directory), each an existing directory.
fn absolute(flag: &str, dirs: &[PathBuf]) -> Result<Vec<String>, Failure> {
    dirs.iter()
        .map(|dir| {
            let absolute = std::path::absolute(dir)
                .ok()
                .filter(|path| path.is_dir())
                .ok_or_else(|| Failure::new(Exit::Usage, format!("{flag} `{}`: no such directory", dir.display())))?;
            absolute
                .into_os_string()
                .into_string()
                .map_err(|_| Failure::new(Exit::Usage, format!("{flag} `{}`: not a UTF-8 path", dir.display())))
        })
        .collect()
}

/// Where the service keeps its data when `--data` is not given.
fn default_data() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".local/share"),
    };
    Some(base.join("wasmproc"))
}

/// Run the service: workflows of many tenants, kept in a data directory and resumed
/// after any restart, controlled through an HTTP API (README, "The service").
#[derive(Args, Debug)]
pub(crate) struct Serve {
    /// The data directory: journal, registry, components and the admin token
    /// (`DIR/admin.token`, made on the first start). Default: `$XDG_DATA_HOME/wasmproc`,
    /// else `~/.local/share/wasmproc`.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// The address to listen on; port 0 picks a free one (the line on stderr says which).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Worker threads of the scheduler.
    #[arg(long, value_name = "N", default_value_t = 2)]
    workers: usize,
    /// How long a cancelled workflow has to end in its own code before it is terminated.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = super::units::duration)]
    grace: Duration,
    /// The largest component upload.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = super::units::nonzero_size)]
    max_upload: usize,
    /// How long an ended workflow (its record, result and history) is kept before it is
    /// forgotten; `0s` keeps it until `forget`.
    #[arg(long, value_name = "DURATION", default_value = "7days", value_parser = super::units::duration)]
    retention: Duration,
    /// The linear memory cap of any process, e.g. 64MiB or 1GiB: the most a tenant's
    /// policy may give (each process's share of address space), and a new tenant's.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(wasmproc::wasm::DEFAULT_MAX_MEMORY), value_parser = units::memory)]
    memory: usize,
    /// The default policy of new tenants (`tenant add` may give each its own;
    /// `tenant policy` changes it): the most workflows a tenant may have running at
    /// once; past it a start is refused (429).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = super::units::positive)]
    max_running: usize,
    /// The default policy: the most processes a tenant's workflows may have alive at
    /// once, their children to any depth included; past it a start is refused (429) and
    /// a spawn fails.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = super::units::positive)]
    max_processes: usize,
    /// The default policy: requests a second a tenant may make (bursts of a second's
    /// worth pass); past it requests are refused (429).
    #[arg(long, value_name = "N", default_value_t = 1_000)]
    rate: u32,
    /// The default policy: the bytes a tenant's components and key-value data may take
    /// together, e.g. 1GiB; past it uploads (413) and key-value writes are refused.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = units::size)]
    storage: usize,
    /// The default policy: a tenant's workflows may be granted its key-value store
    /// (`start --kv`), `DATA/kv/TENANT`, shared by all of its workflows.
    #[arg(long)]
    kv: bool,
    /// The default policy: a tenant's workflows may be granted COMMAND over other
    /// processes than their own children (`start --allow COMMAND`): terminate, exit or
    /// link. Repeatable.
    #[arg(long = "allow", value_name = "COMMAND")]
    allow: Vec<String>,
    /// The default policy: a tenant's workflows may be granted HTTP requests to hosts
    /// within PATTERN (`start --allow-host`), a pattern as `run --allow-host` takes it.
    /// Repeatable. [default: no host]
    #[arg(long = "allow-host", value_name = "PATTERN")]
    allow_host: Vec<String>,
    /// The default policy: a tenant's workflows may be granted to read the directory
    /// DIR of this machine and everything beneath it (`start --dir`). Repeatable.
    /// [default: none]
    #[arg(long = "dir", value_name = "DIR")]
    dir: Vec<PathBuf>,
    /// The default policy: as --dir, to read and write (`start --dir-rw`). Repeatable.
    #[arg(long = "dir-rw", value_name = "DIR")]
    dir_rw: Vec<PathBuf>,
    /// Print the API's OpenAPI document (what `GET /v1/openapi.json` serves, and
    /// `docs/openapi.json` in the repository) and exit, without serving.
    #[arg(long, exclusive = true)]
    openapi: bool,
    /// The most requests one workflow may have unanswered (recorded and not yet
    /// answered); past it a request is refused (429).
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = super::units::positive)]
    max_pending_requests: usize,
    /// The most log kept for one workflow (its processes' lines); past it the oldest
    /// lines are dropped, and a read of the log says how many.
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = super::units::nonzero_size)]
    max_log_bytes: usize,
    /// How long a workflow's process may wait (for a timer, a signal, a child) before it
    /// leaves memory altogether: only its entry in the scheduler stays, and its next
    /// event brings it back, replayed from the journal. `never` (or 0) keeps every
    /// waiting process in memory. `/metrics` counts the suspended ones.
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(wasmproc::scheduler::DEFAULT_SUSPEND_AFTER), value_parser = units::threshold)]
    suspend_after: units::Threshold,
    /// How long a workflow's process may wait before a worker with nothing else to run
    /// hibernates it: it gives back its whole instance, keeping only the pages of its
    /// memory that differ from its component's initial image, and its next event makes
    /// it again (tens of microseconds). `/metrics` counts the hibernated ones.
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(wasmproc::scheduler::DEFAULT_HIBERNATE_AFTER), value_parser = super::units::duration)]
    hibernate_after: std::time::Duration,
    /// A hibernating process gives back only its fiber stack's pages and keeps its
    /// instance.
    #[arg(long)]
    no_hibernate_instances: bool,
}

impl Serve {
    pub(crate) fn execute(self) -> Result<ExitCode, Failure> {
        if self.openapi {
            let document = wasmproc::serve::openapi()
                .to_pretty_json()
                .map_err(|e| Failure::new(Exit::Host, format!("cannot write the OpenAPI document: {e}")))?;
            print(document)?;
            return Ok(Exit::Success.into());
        }
        let data = self.data.or_else(default_data).ok_or_else(|| {
            Failure::new(Exit::Usage, "no data directory: give `--data DIR` (neither XDG_DATA_HOME nor HOME is set)")
        })?;
        let mut config = ServiceConfig::new(&data);
        config.workers = self.workers;
        config.grace = self.grace;
        config.max_upload = self.max_upload;
        config.retention = (!self.retention.is_zero()).then_some(self.retention);
        config.max_pending_requests = self.max_pending_requests;
        config.max_log_bytes = self.max_log_bytes as u64;
        config.suspend_after = self.suspend_after.0;
        config.hibernate_after = self.hibernate_after;
        config.hibernate_instances = !self.no_hibernate_instances;
        if self.rate == 0 {
            return Err(Failure::new(Exit::Usage, "--rate must be at least 1 request a second"));
        }
        for name in &self.allow {
            if !wasmproc::Capabilities::OVER_OTHERS.contains(&name.as_str()) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "--allow `{name}`: a tenant's policy allows commands over other processes ({}); the others \
                         are every workflow's",
                        wasmproc::Capabilities::OVER_OTHERS.join(", ")
                    ),
                ));
            }
        }
        config.max_memory = self.memory;
        config.policy = Policy {
            allow: self.allow,
            kv: self.kv,
            hosts: self.allow_host,
            dirs: absolute("--dir", &self.dir)?,
            dirs_rw: absolute("--dir-rw", &self.dir_rw)?,
            max_running: self.max_running,
            max_processes: self.max_processes,
            memory: self.memory as u64,
            storage: self.storage as u64,
            rate: self.rate,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("wasmproc-http")
            .enable_all()
            .build()
            .map_err(|e| Failure::new(Exit::Host, format!("cannot start the HTTP server's threads: {e}")))?;
        let service = Service::open(config).map_err(|e| Failure::from_error(Exit::Host, &e))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(self.listen))
            .map_err(|e| Failure::new(Exit::Host, format!("cannot listen on {}: {e}", self.listen)))?;
        let bound = listener.local_addr().map_err(|e| Failure::new(Exit::Host, format!("no local address: {e}")))?;
        say_now(
            Say::Notice,
            &format!(
                "listening on http://{bound} (data in {}; {} workflows resumed; admin token in {})",
                data.display(),
                service.running(),
                data.join("admin.token").display()
            ),
        );
        let app = service.router();
        let closing = service.clone();
        let served = runtime.block_on(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    // Followers of logs would hold the stop up until their workflows end.
                    shutdown_signal().await;
                    closing.end_streams();
                })
                .await
        });
        say_now(Say::Notice, "stopping: running workflows are suspended, and resume with the next `serve`");
        service.stop();
        served.map_err(|e| Failure::new(Exit::Host, format!("the HTTP server failed: {e}")))?;
        Ok(Exit::Success.into())
    }
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        say_now(Say::Warning, "cannot watch for SIGTERM and SIGINT: stop the server with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Where the server is and who is asking.
#[derive(Args, Debug, Clone)]
pub(crate) struct ClientArgs {
    /// The server's URL.
    #[arg(long, value_name = "URL", env = "WASMPROC_SERVER", default_value = "http://127.0.0.1:7700")]
    server: String,
    /// The bearer token: a tenant's (or, for `tenant`, the admin's, from `DATA/admin.token`).
    #[arg(long, value_name = "TOKEN", env = "WASMPROC_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the server's JSON answer instead of text.
    #[arg(long)]
    json: bool,
}

/// A client command: what to ask the server, with where it is and who asks.
#[derive(Args, Debug)]
pub(crate) struct Call<T: Args> {
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    what: T,
}

/// The client commands.
#[derive(Subcommand, Debug)]
pub(crate) enum ClientCommand {
    /// Upload a component to the server, optionally named (and tagged).
    Deploy(Call<DeployArgs>),
    /// Remove a component (a name, `NAME:TAG` or `sha256:…`) and its names; refused
    /// while a running workflow was started from it.
    Undeploy(Call<UndeployArgs>),
    /// Start a workflow of a deployed component (a name, `NAME:TAG` or `sha256:…`).
    Start(Call<StartArgs>),
    /// Show a workflow: its state, component, times and result.
    Status(Call<StatusArgs>),
    /// Print a workflow's result (exit code 1 if it failed); `--wait` waits for it.
    Result(Call<ResultArgs>),
    /// Show a workflow's history: each of its processes, its journal's records, and what
    /// it waits for.
    History(Call<HistoryArgs>),
    /// Send a workflow a message on TOPIC, with a JSON body.
    Signal(Call<SignalArgs>),
    /// Send a workflow a request on TOPIC, with a JSON body, and print its answer (exit
    /// code 1 if it answered with an error or ended without answering, 4 if no answer
    /// came in time).
    Request(Call<RequestArgs>),
    /// Print a workflow's log: the lines each of its processes logged or printed, oldest
    /// first; `-f` then prints new lines as they come, until the workflow ends.
    Logs(Call<LogsArgs>),
    /// Cancel a workflow: a cancel event, then termination after the server's grace.
    Cancel(Call<CancelArgs>),
    /// Terminate a workflow at once.
    Terminate(Call<TerminateArgs>),
    /// List workflows, by id.
    Ps(Call<PsArgs>),
    /// Forget an ended workflow: its record and its history.
    Forget(Call<ForgetArgs>),
    /// Manage tenants, with the admin token: `add NAME [POLICY]` (prints its token),
    /// `ls` (with their policies), `policy NAME [POLICY]` (shows it, or changes what the
    /// flags give), `token NAME` (a new token), `rm NAME`.
    Tenant(Call<TenantArgs>),
}

/// The arguments of `undeploy`.
#[derive(Args, Debug)]
pub(crate) struct UndeployArgs {
    /// The component.
    pub(crate) component: String,
}

/// The arguments of `deploy`.
#[derive(Args, Debug)]
pub(crate) struct DeployArgs {
    /// The component.
    pub(crate) app: PathBuf,
    /// A name to start it by (`start NAME`).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// A tag for the name (`start NAME:TAG`).
    #[arg(long)]
    pub(crate) tag: Option<String>,
}

/// The arguments of `start`.
#[derive(Args, Debug)]
pub(crate) struct StartArgs {
    /// The component.
    pub(crate) component: String,
    /// The workflow's id: starting again with the same id and request returns the
    /// same workflow; with another request it is refused. Drawn at random if absent.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// The entry method.
    #[arg(long, default_value = "main")]
    pub(crate) method: String,
    /// The input, as JSON.
    #[arg(long, value_name = "JSON")]
    pub(crate) input: Option<String>,
    /// Grant COMMAND over other processes than the workflow's own children (terminate,
    /// exit, link), if the tenant's policy allows it. Repeatable.
    #[arg(long = "allow", value_name = "COMMAND")]
    pub(crate) allow: Vec<String>,
    /// Withdraw a command granted by default, e.g. --deny spawn. Repeatable.
    #[arg(long = "deny", value_name = "COMMAND")]
    pub(crate) deny: Vec<String>,
    /// Grant the tenant's key-value store (`kv.*`), which all its workflows share, if
    /// its policy allows it.
    #[arg(long)]
    pub(crate) kv: bool,
    /// Let its processes make HTTP requests (`http.request`) to hosts that match
    /// PATTERN, as `run --allow-host` takes it, within the tenant's policy. Repeatable.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    pub(crate) allow_host: Vec<String>,
    /// Let its processes read the server's directory HOST, seen as GUEST (`HOST::GUEST`;
    /// HOST alone: the same path), as `run --dir` takes it, within the tenant's policy.
    /// HOST is absolute: a path on the server. Repeatable.
    #[arg(long = "dir", value_name = "HOST[::GUEST]")]
    pub(crate) dir: Vec<String>,
    /// As --dir, to read and write. Repeatable.
    #[arg(long = "dir-rw", value_name = "HOST[::GUEST]")]
    pub(crate) dir_rw: Vec<String>,
    /// Linear memory cap of each process of the workflow, e.g. 16MiB; at most the
    /// tenant's policy's, which it is when not given.
    #[arg(long, value_name = "SIZE", value_parser = units::memory)]
    pub(crate) memory: Option<usize>,
    /// Total CPU time each process of the workflow may use over its life (e.g. 2s); a
    /// process past it fails. [default: unlimited]
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    pub(crate) cpu_budget: Option<Duration>,
}

/// The arguments of `status`.
#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// The workflow's id.
    pub(crate) id: String,
}

/// The arguments of `result`.
#[derive(Args, Debug)]
pub(crate) struct ResultArgs {
    /// The workflow's id.
    pub(crate) id: String,
    /// Wait at most this long for it to end (the server bounds a wait at 60 s; a
    /// longer wait asks again); exit code 4 if it is still running then.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "1h", value_parser = super::units::duration)]
    pub(crate) wait: Option<Duration>,
}

/// The arguments of `history`.
#[derive(Args, Debug)]
pub(crate) struct HistoryArgs {
    /// The workflow's id.
    pub(crate) id: String,
}

/// The arguments of `signal`.
#[derive(Args, Debug)]
pub(crate) struct SignalArgs {
    /// The workflow's id.
    pub(crate) id: String,
    /// The message's topic.
    pub(crate) topic: String,
    /// The body, as JSON (`null` if absent).
    pub(crate) body: Option<String>,
}

/// The arguments of `request`.
#[derive(Args, Debug)]
pub(crate) struct RequestArgs {
    /// The workflow's id.
    pub(crate) id: String,
    /// The request's topic.
    pub(crate) topic: String,
    /// The body, as JSON (`null` if absent).
    pub(crate) body: Option<String>,
    /// The request's id: asking again with the same id never delivers the request twice,
    /// and gets its answer once there is one (after a restart of the server too). Drawn
    /// at random if absent (the server's answer names it).
    #[arg(long, value_name = "ID")]
    pub(crate) request_id: Option<String>,
    /// Wait at most this long for the answer (the server bounds one wait at its
    /// `--max-wait`, 60 s; a longer wait asks again with the same id); exit code 4 if
    /// none came.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::units::duration)]
    pub(crate) timeout: Duration,
}

/// The arguments of `logs`.
#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    /// The workflow's id.
    pub(crate) id: String,
    /// Print new lines as they come, until the workflow ends.
    #[arg(short, long)]
    pub(crate) follow: bool,
}

/// The arguments of `cancel`.
#[derive(Args, Debug)]
pub(crate) struct CancelArgs {
    /// The workflow's id.
    pub(crate) id: String,
}

/// The arguments of `terminate`.
#[derive(Args, Debug)]
pub(crate) struct TerminateArgs {
    /// The workflow's id.
    pub(crate) id: String,
}

/// The arguments of `ps`.
#[derive(Args, Debug)]
pub(crate) struct PsArgs {
    /// Only those in this state: `running`, `completed`, `failed`.
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// Only those of this component.
    #[arg(long)]
    pub(crate) component: Option<String>,
    /// Only those whose id starts with this.
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// Only those started within this long before now (e.g. 10m, 2h, 7d).
    #[arg(long, value_name = "DURATION", value_parser = super::units::duration)]
    pub(crate) since: Option<std::time::Duration>,
    /// Only those whose id comes after this one: the next page after a listing that
    /// ended with it.
    #[arg(long, value_name = "ID")]
    pub(crate) after: Option<String>,
    /// At most this many (1 to 1,000).
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
}

/// The arguments of `forget`.
#[derive(Args, Debug)]
pub(crate) struct ForgetArgs {
    /// The workflow's id.
    pub(crate) id: String,
}

/// The arguments of `tenant`.
#[derive(Args, Debug)]
pub(crate) struct TenantArgs {
    /// `add`, `ls`, `policy`, `token` or `rm`.
    pub(crate) action: String,
    /// The tenant (all but `ls`).
    pub(crate) name: Option<String>,
    #[command(flatten)]
    pub(crate) policy: PolicyArgs,
}

/// A tenant's policy as `tenant add` and `tenant policy` change it: each flag given
/// changes what it names; the rest is the server's default (`add`) or stays (`policy`).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Policy (tenant add, tenant policy)")]
pub(crate) struct PolicyArgs {
    /// Let the tenant's workflows be granted COMMAND over other processes than their own
    /// children (`start --allow`): terminate, exit or link. Repeatable.
    #[arg(long = "allow", value_name = "COMMAND")]
    pub(crate) allow: Vec<String>,
    /// No longer let its workflows be granted COMMAND (of those --allow names). Repeatable.
    #[arg(long = "deny", value_name = "COMMAND")]
    pub(crate) deny: Vec<String>,
    /// Let its workflows be granted its key-value store (`start --kv`).
    #[arg(long, conflicts_with = "no_kv")]
    pub(crate) kv: bool,
    /// No longer let its workflows be granted its key-value store (those running keep it).
    #[arg(long)]
    pub(crate) no_kv: bool,
    /// Let its workflows be granted HTTP requests to hosts within PATTERN (`start
    /// --allow-host`), as `run --allow-host` takes it. Repeatable.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    pub(crate) allow_host: Vec<String>,
    /// No longer let its workflows be granted PATTERN (of those --allow-host named).
    /// Repeatable.
    #[arg(long = "deny-host", value_name = "PATTERN")]
    pub(crate) deny_host: Vec<String>,
    /// Let its workflows be granted to read the server's directory DIR (absolute) and
    /// everything beneath it (`start --dir`). Repeatable.
    #[arg(long = "dir", value_name = "DIR")]
    pub(crate) dir: Vec<String>,
    /// As --dir, to read and write (`start --dir-rw`). Repeatable.
    #[arg(long = "dir-rw", value_name = "DIR")]
    pub(crate) dir_rw: Vec<String>,
    /// No longer let its workflows be granted DIR (of those --dir or --dir-rw named).
    /// Repeatable.
    #[arg(long = "no-dir", value_name = "DIR")]
    pub(crate) no_dir: Vec<String>,
    /// The most workflows it may have running at once.
    #[arg(long, value_name = "N")]
    pub(crate) max_running: Option<usize>,
    /// The most processes its workflows may have alive at once, their children to any
    /// depth included.
    #[arg(long, value_name = "N")]
    pub(crate) max_processes: Option<usize>,
    /// The most linear memory each process of its workflows may have, e.g. 32MiB: at
    /// most the server's --memory.
    #[arg(long, value_name = "SIZE", value_parser = units::memory)]
    pub(crate) memory: Option<usize>,
    /// The bytes its components and key-value data may take together, e.g. 1GiB.
    #[arg(long, value_name = "SIZE", value_parser = units::size)]
    pub(crate) storage: Option<usize>,
    /// The requests a second it may make (bursts of a second's worth pass).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rate: Option<u32>,
}

impl PolicyArgs {
    fn given(&self) -> bool {
        !self.allow.is_empty()
            || !self.deny.is_empty()
            || self.kv
            || self.no_kv
            || !self.allow_host.is_empty()
            || !self.deny_host.is_empty()
            || !self.dir.is_empty()
            || !self.dir_rw.is_empty()
            || !self.no_dir.is_empty()
            || self.max_running.is_some()
            || self.max_processes.is_some()
            || self.memory.is_some()
            || self.storage.is_some()
            || self.rate.is_some()
    }

    /// The fields these flags set over `base` (a tenant's policy; none for the server's
    /// default).
    fn fields(&self, base: Option<&Policy>) -> PolicyFields {
        let mut allow: Vec<String> = base.map(|policy| policy.allow.clone()).unwrap_or_default();
        allow.extend(self.allow.iter().cloned());
        allow.retain(|name| !self.deny.contains(name));
        let kv = if self.kv {
            Some(true)
        } else if self.no_kv {
            Some(false)
        } else {
            None
        };
        let listed = |base: Option<&Vec<String>>, added: &[String], removed: &[String]| {
            let mut names: Vec<String> = base.cloned().unwrap_or_default();
            names.extend(added.iter().cloned());
            names.retain(|name| !removed.contains(name));
            (base.is_some() || !names.is_empty()).then_some(names)
        };
        PolicyFields {
            allow: (base.is_some() || !allow.is_empty()).then_some(allow),
            kv: kv.or(base.map(|policy| policy.kv)),
            hosts: listed(base.map(|policy| &policy.hosts), &self.allow_host, &self.deny_host),
            dirs: listed(base.map(|policy| &policy.dirs), &self.dir, &self.no_dir),
            dirs_rw: listed(base.map(|policy| &policy.dirs_rw), &self.dir_rw, &self.no_dir),
            max_running: self.max_running.or(base.map(|policy| policy.max_running)),
            max_processes: self.max_processes.or(base.map(|policy| policy.max_processes)),
            memory: self.memory.map(|m| m as u64).or(base.map(|policy| policy.memory)),
            storage: self.storage.map(|s| s as u64).or(base.map(|policy| policy.storage)),
            rate: self.rate.or(base.map(|policy| policy.rate)),
        }
    }
}

/// A tenant's policy as a line; hosts and directories only when it allows any.
fn policy_line(TenantPolicy { name, policy }: &TenantPolicy) -> String {
    let mut line = format!(
        "{name}  allow={}  kv={}  max-running={}  memory={}  storage={}  rate={}/s  max-processes={}",
        if policy.allow.is_empty() { "-".to_owned() } else { policy.allow.join(",") },
        if policy.kv { "yes" } else { "no" },
        policy.max_running,
        units::size_text(policy.memory as usize),
        units::size_text(policy.storage as usize),
        policy.rate,
        policy.max_processes
    );
    for (label, listed) in [("hosts", &policy.hosts), ("dirs", &policy.dirs), ("dirs-rw", &policy.dirs_rw)] {
        if !listed.is_empty() {
            line.push_str(&format!("  {label}={}", listed.join(",")));
        }
    }
    line
}

/// What the server answered: its status and JSON body.
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    /// The answer, or the failure its error says: 2 for a request the server refused as
    /// wrong, 5 for a failing server.
    fn ok(self) -> Result<Value, Failure> {
        if self.status < 300 {
            return Ok(self.body);
        }
        let message = ErrorBody::deserialize(&self.body)
            .map_or_else(|_| "the server gave no reason".to_owned(), |refused| refused.error.message);
        let exit = if self.status >= 500 { Exit::Host } else { Exit::Usage };
        Err(Failure::new(exit, format!("the server refused ({}): {message}", self.status)))
    }

    /// The answer as `T` (see [`Answer::ok`]), beside its JSON as the server sent it.
    fn read<T: DeserializeOwned>(self) -> Result<(T, Value), Failure> {
        let body = self.ok()?;
        let typed = T::deserialize(&body).map_err(|e| {
            Failure::new(Exit::Host, format!("the server's answer is not what this client understands ({e}): {body}"))
        })?;
        Ok((typed, body))
    }
}

/// The client's connection.
struct Http {
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    args: ClientArgs,
}

impl Http {
    fn new(args: ClientArgs) -> Result<Http, Failure> {
        let host = |e: String| Failure::new(Exit::Host, e);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| host(format!("cannot configure TLS: {e}")))?;
        let tls = match rustls_platform_verifier::Verifier::new(provider) {
            Ok(verifier) => tls.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth(),
            Err(_) => tls.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth(),
        };
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .build()
            .map_err(|e| host(format!("cannot build the HTTP client: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| host(format!("cannot start the client's runtime: {e}")))?;
        Ok(Http { client, runtime, args })
    }

    /// A request with `body` of its content type, if any.
    fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(reqwest::Body, &'static str)>,
    ) -> Result<Answer, Failure> {
        let url = format!("{}{path}", self.args.server.trim_end_matches('/'));
        let mut request = self.client.request(method, &url).timeout(Duration::from_secs(90));
        if let Some(token) = &self.args.token {
            request = request.bearer_auth(token);
        }
        if let Some((body, kind)) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, kind).body(body);
        }
        self.runtime.block_on(async {
            let unreachable = |e: reqwest::Error| {
                Failure::new(Exit::Host, format!("cannot reach the server at {}: {e}", self.args.server))
            };
            let response = request.send().await.map_err(unreachable)?;
            let status = response.status().as_u16();
            let bytes = response.bytes().await.map_err(unreachable)?;
            let body =
                serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({"text": String::from_utf8_lossy(&bytes)}));
            Ok(Answer { status, body })
        })
    }

    /// GETs `path` and hands `each` every line of the body as it arrives, however long
    /// the answer lasts (a followed log).
    fn stream(&self, path: &str, mut each: impl FnMut(&str) -> Result<(), Failure>) -> Result<(), Failure> {
        let url = format!("{}{path}", self.args.server.trim_end_matches('/'));
        let mut request = self.client.get(&url);
        if let Some(token) = &self.args.token {
            request = request.bearer_auth(token);
        }
        self.runtime.block_on(async {
            let unreachable = |e: reqwest::Error| {
                Failure::new(Exit::Host, format!("cannot reach the server at {}: {e}", self.args.server))
            };
            let mut response = request.send().await.map_err(unreachable)?;
            let status = response.status().as_u16();
            if status >= 300 {
                let bytes = response.bytes().await.map_err(unreachable)?;
                let body =
                    serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({"text": String::from_utf8_lossy(&bytes)}));
                Answer { status, body }.ok()?;
                return Ok(());
            }
            let mut pending = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    each(String::from_utf8_lossy(&line[..end]).as_ref())?;
                }
            }
            Ok(())
        })
    }

    fn get(&self, path: &str) -> Result<Answer, Failure> {
        self.send(reqwest::Method::GET, path, None)
    }

    fn post(&self, path: &str, body: Value) -> Result<Answer, Failure> {
        self.send(reqwest::Method::POST, path, Some((body.to_string().into(), "application/json")))
    }
}

/// `text` as a path segment or query value.
fn escape(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn json_arg(what: &str, text: &str) -> Result<Value, Failure> {
    serde_json::from_str(text).map_err(|e| Failure::new(Exit::Usage, format!("{what} `{text}` is not valid JSON: {e}")))
}

fn print(line: impl std::fmt::Display) -> Result<(), Failure> {
    writeln!(std::io::stdout().lock(), "{line}").map_err(|_| Failure::new(Exit::StdoutClosed, "stdout was closed"))
}

/// One workflow as a line: id, state, and the result or error once ended.
fn workflow_line(w: &Workflow) -> String {
    let end = match &w.result {
        Some(Outcome::Ok(value)) => format!("  {value}"),
        Some(Outcome::Error(ended)) => format!("  {}", ended.message),
        None => String::new(),
    };
    let mut line = format!("{}  {}  {}  {}{end}", w.id, w.state.as_str(), w.method, w.component);
    if let Some(steps) = w.steps {
        line.push_str(&format!("  ({steps} steps)"));
    }
    for wait in w.waiting.iter().flatten() {
        line.push_str(&format!("\n  waits for {}", waiting_text(wait)));
    }
    line
}

/// What a workflow waits for, in words: `a timer, until 2026-11-27 10:31:02.114 UTC`.
fn waiting_text(wait: &Waiting) -> String {
    match wait.what.as_str() {
        "timer" => {
            let until = wait.until_ms.map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms));
            until.map_or_else(
                || "a timer".to_owned(),
                |at| format!("a timer, until {}", humantime::format_rfc3339_millis(at)),
            )
        }
        "message" => "a message (a signal, a request, or an exit it monitors)".to_owned(),
        "child" => format!("its children ({} running)", wait.children.unwrap_or(0)),
        "exit" => format!("the end of process {}", wait.pid.unwrap_or(0)),
        "command" => format!("the command `{}`", wait.command.as_deref().unwrap_or("?")),
        other => other.to_owned(),
    }
}

impl ClientCommand {
    fn client(&self) -> &ClientArgs {
        match self {
            ClientCommand::Deploy(call) => &call.client,
            ClientCommand::Undeploy(call) => &call.client,
            ClientCommand::Start(call) => &call.client,
            ClientCommand::Status(call) => &call.client,
            ClientCommand::Result(call) => &call.client,
            ClientCommand::History(call) => &call.client,
            ClientCommand::Signal(call) => &call.client,
            ClientCommand::Request(call) => &call.client,
            ClientCommand::Logs(call) => &call.client,
            ClientCommand::Cancel(call) => &call.client,
            ClientCommand::Terminate(call) => &call.client,
            ClientCommand::Ps(call) => &call.client,
            ClientCommand::Forget(call) => &call.client,
            ClientCommand::Tenant(call) => &call.client,
        }
    }

    pub(crate) fn execute(self) -> Result<ExitCode, Failure> {
        let args = self.client().clone();
        let json_out = args.json;
        let http = Http::new(args)?;
        let shown =
            |value: &Value, text: String| -> Result<(), Failure> { if json_out { print(value) } else { print(text) } };
        match self {
            ClientCommand::Deploy(Call { what: DeployArgs { app, name, tag }, .. }) => {
                let bytes = std::fs::read(&app)
                    .map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{}`: {e}", app.display())))?;
                let mut query = Vec::new();
                if let Some(name) = &name {
                    query.push(format!("name={}", escape(name)));
                }
                if let Some(tag) = &tag {
                    query.push(format!("tag={}", escape(tag)));
                }
                let path = format!("/v1/components{}{}", if query.is_empty() { "" } else { "?" }, query.join("&"));
                let answer =
                    http.send(reqwest::Method::POST, &path, Some((bytes.into(), "application/octet-stream")))?;
                let status = answer.status;
                let (ComponentAnswer { component: c }, body) = answer.read()?;
                let verb = if status == 201 { "deployed" } else { "already deployed" };
                shown(&body, format!("{verb} {} ({} bytes; entries: {})", c.hash, c.size, c.entries.join(", ")))?;
            }
            ClientCommand::Undeploy(Call { what: UndeployArgs { component }, .. }) => {
                http.send(reqwest::Method::DELETE, &format!("/v1/components/{}", escape(&component)), None)?.ok()?;
                shown(&json!({"removed": component}), format!("removed {component}"))?;
            }
            ClientCommand::Start(Call {
                what:
                    StartArgs { component, id, method, input, allow, deny, kv, allow_host, dir, dir_rw, memory, cpu_budget },
                ..
            }) => {
                let input = input.map(|text| json_arg("--input", &text)).transpose()?;
                let grants = Grants { allow, deny, kv, hosts: allow_host, dirs: dir, dirs_rw: dir_rw };
                let limits = Limits {
                    memory: memory.map(|bytes| bytes as u64),
                    cpu_budget_ms: cpu_budget.map(|budget| budget.as_millis() as u64),
                };
                let request = StartRequest { id, component, method: Some(method), input, grants, limits };
                let (WorkflowAnswer { workflow: w }, body) = http.post("/v1/workflows", json!(request))?.read()?;
                shown(&body, format!("started {} (process {})", w.id, w.pid))?;
            }
            ClientCommand::Status(Call { what: StatusArgs { id }, .. }) => {
                let (WorkflowAnswer { workflow }, body) =
                    http.get(&format!("/v1/workflows/{}", escape(&id)))?.read()?;
                shown(&body, workflow_line(&workflow))?;
            }
            ClientCommand::Result(Call { what: ResultArgs { id, wait }, .. }) => {
                return result(&http, &id, wait, json_out);
            }
            ClientCommand::History(Call { what: HistoryArgs { id }, .. }) => {
                let (History { processes }, body) =
                    http.get(&format!("/v1/workflows/{}/history", escape(&id)))?.read()?;
                if json_out {
                    print(&body)?;
                }
                for p in processes.iter().filter(|_| !json_out) {
                    let ended = p.ended.as_ref().map_or("running", |ended| ended.message.as_str());
                    print(format_args!("process {} ({}, {} steps, {ended})", p.pid, p.method, p.steps))?;
                    for line in &p.records {
                        print(format_args!("  {line}"))?;
                    }
                    for line in &p.waiting_for {
                        print(format_args!("  waits for {line}"))?;
                    }
                }
            }
            ClientCommand::Signal(Call { what: SignalArgs { id, topic, body }, .. }) => {
                let body = body.map(|text| json_arg("the body", &text)).transpose()?.unwrap_or(Value::Null);
                let answer = http
                    .post(&format!("/v1/workflows/{}/signal", escape(&id)), json!({"topic": topic, "body": body}))?
                    .ok()?;
                shown(&answer, format!("sent `{topic}` to {id}"))?;
            }
            ClientCommand::Request(Call { what, .. }) => return request(&http, what),
            ClientCommand::Logs(Call { what: LogsArgs { id, follow }, .. }) => {
                return logs(&http, &id, follow, json_out);
            }
            ClientCommand::Cancel(Call { what: CancelArgs { id }, .. }) => {
                let answer = http.post(&format!("/v1/workflows/{}/cancel", escape(&id)), json!({}))?.ok()?;
                shown(&answer, format!("cancelling {id}"))?;
            }
            ClientCommand::Terminate(Call { what: TerminateArgs { id }, .. }) => {
                let answer = http.post(&format!("/v1/workflows/{}/terminate", escape(&id)), json!({}))?.ok()?;
                shown(&answer, format!("terminated {id}"))?;
            }
            ClientCommand::Ps(Call { what: PsArgs { state, component, prefix, since, after, limit }, .. }) => {
                let mut query = vec![format!("limit={limit}")];
                if let Some(since) = since {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    query.push(format!("started_after={}", now.saturating_sub(since.as_millis() as u64)));
                }
                for (name, value) in [("state", state), ("component", component), ("prefix", prefix), ("after", after)]
                {
                    if let Some(value) = value {
                        query.push(format!("{name}={}", escape(&value)));
                    }
                }
                let (WorkflowPage { workflows, next, examined, partial }, body) =
                    http.get(&format!("/v1/workflows?{}", query.join("&")))?.read()?;
                if json_out {
                    print(&body)?;
                } else {
                    for w in &workflows {
                        print(workflow_line(w))?;
                    }
                    // On stderr: the lines on stdout stay one a workflow.
                    match next {
                        Some(next) if partial => eprintln!(
                            "wasmproc: the server read {examined} workflows for this page, the most it reads at once; \
                             more may match: `--after {next}`"
                        ),
                        Some(next) => eprintln!("wasmproc: more follow: `--after {next}`"),
                        None => {}
                    }
                }
            }
            ClientCommand::Forget(Call { what: ForgetArgs { id }, .. }) => {
                http.send(reqwest::Method::DELETE, &format!("/v1/workflows/{}", escape(&id)), None)?.ok()?;
                shown(&json!({"forgotten": id}), format!("forgot {id}"))?;
            }
            ClientCommand::Tenant(Call { what: TenantArgs { action, name, policy }, .. }) => {
                let name = || {
                    name.clone()
                        .ok_or_else(|| Failure::new(Exit::Usage, format!("`tenant {action}` takes the tenant's name")))
                };
                if policy.given() && !matches!(action.as_str(), "add" | "policy") {
                    return Err(Failure::new(
                        Exit::Usage,
                        format!(
                            "`tenant {action}` takes no policy flags: those are for `tenant add` and `tenant policy`"
                        ),
                    ));
                }
                match action.as_str() {
                    "add" => {
                        let request = json!({"name": name()?, "policy": policy.fields(None)});
                        let (TenantToken { token, .. }, body) = http.post("/v1/tenants", request)?.read()?;
                        shown(&body, token)?;
                    }
                    "policy" => {
                        let path = format!("/v1/tenants/{}/policy", escape(&name()?));
                        let (mut current, mut body) = http.get(&path)?.read::<TenantPolicy>()?;
                        if policy.given() {
                            let fields = json!(policy.fields(Some(&current.policy))).to_string();
                            let answer =
                                http.send(reqwest::Method::PUT, &path, Some((fields.into(), "application/json")));
                            (current, body) = answer?.read()?;
                        }
                        shown(&body, policy_line(&current))?;
                    }
                    "token" => {
                        let (TenantToken { token, .. }, body) =
                            http.post(&format!("/v1/tenants/{}/token", escape(&name()?)), json!({}))?.read()?;
                        shown(&body, token)?;
                    }
                    "ls" => {
                        let (Tenants { tenants }, body) = http.get("/v1/tenants")?.read()?;
                        shown(&body, tenants.iter().map(policy_line).collect::<Vec<_>>().join("\n"))?;
                    }
                    "rm" => {
                        let name = name()?;
                        http.send(reqwest::Method::DELETE, &format!("/v1/tenants/{}", escape(&name)), None)?.ok()?;
                        shown(&json!({"removed": name}), format!("removed tenant {name}"))?;
                    }
                    other => {
                        return Err(Failure::new(
                            Exit::Usage,
                            format!("unknown `tenant` action `{other}`: add, ls, policy, token or rm"),
                        ));
                    }
                }
            }
        }
        Ok(Exit::Success.into())
    }
}

/// `result ID [--wait]`: the result on stdout (JSON), the error on stderr with exit code
/// 1, or exit code 4 if it is still running when the wait is over.
fn result(http: &Http, id: &str, wait: Option<Duration>, json_out: bool) -> Result<ExitCode, Failure> {
    let deadline = wait.map(|wait| std::time::Instant::now() + wait);
    loop {
        let left = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(std::time::Instant::now()));
        let asked = left.min(Duration::from_secs(60));
        let path = format!("/v1/workflows/{}/result?wait={}ms", escape(id), asked.as_millis());
        let answer = http.get(&path)?;
        let running = answer.status == 202;
        let (WorkflowAnswer { workflow: w }, body) = answer.read()?;
        if !running {
            match (&w.result, json_out) {
                (_, true) => print(&body)?,
                (Some(Outcome::Error(ended)), false) => {
                    say_now(Say::Error, &format!("workflow {id} failed: {}", ended.message));
                }
                (Some(Outcome::Ok(value)), false) => print(value)?,
                (None, false) => print(Value::Null)?,
            }
            let failed = w.state == State::Failed;
            return Ok(if failed { Exit::ProcessFailed } else { Exit::Success }.into());
        }
        if left <= asked {
            if json_out {
                print(&body)?;
            }
            return Err(Failure::new(Exit::Timeout, format!("workflow {id} is still running")));
        }
    }
}

/// `request ID TOPIC [JSON]`: the answer on stdout (JSON), an error answer on stderr with
/// exit code 1, or exit code 4 if no answer came before `--timeout`.
fn request(http: &Http, args: RequestArgs) -> Result<ExitCode, Failure> {
    let RequestArgs { id, topic, body, request_id, timeout } = args;
    let body = body.map(|text| json_arg("the body", &text)).transpose()?.unwrap_or(Value::Null);
    let deadline = std::time::Instant::now() + timeout;
    let mut request_id = request_id;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let asked = left.min(Duration::from_secs(60));
        let path = format!("/v1/workflows/{}/request?timeout={}ms", escape(&id), asked.as_millis());
        let answer = http.post(&path, json!({"id": request_id, "topic": topic, "body": body}))?;
        match answer.status {
            200 => {
                print(&answer.body)?;
                return Ok(Exit::Success.into());
            }
            410 | 422 => {
                let message = answer.body["error"]["message"].as_str().unwrap_or("the server gave no reason");
                say_now(Say::Error, message);
                return Ok(Exit::ProcessFailed.into());
            }
            202 => {
                let named = answer.body["request"]["id"].as_str().map(str::to_owned);
                request_id = request_id.or(named);
                if left <= asked {
                    return Err(Failure::new(
                        Exit::Timeout,
                        format!(
                            "workflow {id} has not answered request `{}` yet; ask again with `--request-id {0}`",
                            request_id.as_deref().unwrap_or("?")
                        ),
                    ));
                }
            }
            _ => {
                answer.ok()?;
            }
        }
    }
}

/// `logs ID [-f]`: each line as `[pid N] SOURCE: MESSAGE` (the message escaped, as the
/// host's own log shows a guest's lines), or as the server's JSON with `--json`.
fn logs(http: &Http, id: &str, follow: bool, json_out: bool) -> Result<ExitCode, Failure> {
    let path = format!("/v1/workflows/{}/logs?follow={follow}", escape(id));
    http.stream(&path, |line| {
        if json_out {
            return print(line);
        }
        let value: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        let message = value["message"].as_str().unwrap_or(line);
        match value["pid"].as_u64() {
            Some(pid) => print(format_args!(
                "[pid {pid}] {}: {}",
                value["source"].as_str().unwrap_or("?"),
                wasmproc::wasm::Escaped(message)
            )),
            // A marker: lines dropped or missed.
            None => {
                say_now(Say::Warning, message);
                Ok(())
            }
        }
    })?;
    Ok(Exit::Success.into())
}
