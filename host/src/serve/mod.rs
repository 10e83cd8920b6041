//! The long-lived service (`wasmproc serve`): one data directory, many tenants, workflows
//! that outlive the server process, and an HTTP API over them ([`Service::router`], an
//! axum router an embedder may mount in a server of its own, described by the OpenAPI
//! document [`openapi`] makes, with its bodies' types in [`wire`]).
//!
//! A workflow is a root process of one durable scheduler, started through the API with
//! an id unique within its tenant. Everything a workflow does goes to the journal in
//! `DATA/journal` before it takes effect, so a `kill -9` of the server loses nothing:
//! the next server on the data directory resumes every unfinished workflow where its
//! journal left it, timers included. What the API keeps beside the journal (tenants,
//! components, workflow ids and results) is in `DATA/registry`, synced before each
//! answer but for workflows' ends, which the journal holds.
//!
//! The data directory:
//!
//! | path | what |
//! | --- | --- |
//! | `journal/` | every workflow's history (kept after it ends, until it is forgotten) |
//! | `registry/` | tenants (token hashes, policies), components, names, workflows and results |
//! | `components/<hex>.wasm` | uploaded components, by the SHA-256 of their bytes |
//! | `logs/TENANT/ID.log` | each workflow's log lines, bounded (see `logs.rs`) |
//! | `kv/<tenant>/` | each tenant's key-value store (see `stores.rs`) |
//! | `admin.token` | the admin's bearer token (mode 0600), made on the first start |

mod api;
mod code;
mod describe;
mod logs;
mod metrics;
mod noted;
mod outside;
mod overview;
mod policy;
mod registry;
mod requests;
mod stores;
#[cfg(test)]
mod tests;
pub mod wire;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use parking_lot::{Mutex, RwLock};
use wasmproc_types::{ExitReason, Format, Payload, Pid};

pub use self::api::openapi;
use self::code::{Code, Kinds, sha256_hex};
pub use self::overview::CountFilter;
pub use self::policy::{Grants, Limits, Policy, PolicyFields};
use self::policy::{Outside, Profile, Profiles, Quotas};
pub use self::registry::{ComponentRecord, State, Tenant, WorkflowRecord};
use self::registry::{MOST_EXAMINED, Registry};
pub use self::requests::{ANSWER, Answered, Ask, Submitted, TOPIC_PREFIX};
use self::stores::{Stores, TenantKv};
use crate::caps::Capabilities;
use crate::journal::{HeldRun, Journal, JournalSettings};
use crate::provider::clock::{Random, Time};
use crate::scheduler::{Handle, ProcessHandle, Recorded, Scheduler, SpawnOptions, Spawnable};
use crate::step::Exited;
use crate::wasm::{Config, Runtime};

pub use crate::step::WORKFLOW_ID_FORMAT;

/// How a [`Service`] runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The data directory (see the module's docs).
    pub data: PathBuf,
    /// Worker threads of the scheduler.
    pub workers: usize,
    /// The largest component upload, in bytes.
    pub max_upload: usize,
    /// The largest other request body, in bytes.
    pub max_body: usize,
    /// The longest a `result` request waits for a workflow to end.
    pub max_wait: Duration,
    /// How long a cancelled workflow has to end in its own code before it is terminated.
    pub grace: Duration,
    /// How long an ended workflow's record, result and history are kept before they are
    /// forgotten; `None` keeps them until `forget`.
    pub retention: Option<Duration>,
    /// The most requests one workflow may have unanswered; past it a request is
    /// refused (429).
    pub max_pending_requests: usize,
    /// The most bytes of log kept for one workflow; past it its oldest lines are dropped.
    pub max_log_bytes: u64,
    /// The most linear memory any process may have, in bytes: the bound of every
    /// tenant's policy (the runtime's [`Config::max_memory`]).
    pub max_memory: usize,
    /// The policy a new tenant gets when it is added without one of its own, and that a
    /// tenant kept from before policies has.
    pub policy: Policy,
    /// How long a workflow's process may wait before it leaves memory until its next
    /// event (`Builder::suspend_after`); `None` never.
    pub suspend_after: Option<Duration>,
    /// How long a process may wait before a worker with nothing else to run hibernates
    /// it (`Builder::hibernate_after`).
    pub hibernate_after: Duration,
    /// Whether hibernation gives back a Wasm process's whole instance
    /// ([`Config::hibernate_instances`]) or only its fiber stack.
    pub hibernate_instances: bool,
}

impl ServiceConfig {
    /// The defaults for `data`: 2 workers, uploads up to 64 MiB, other bodies up to
    /// 1 MiB, waits up to 60 s, a 5 s grace, ended workflows kept 7 days, processes of
    /// up to 64 MiB, [`Policy::new`] for new tenants, 1,000 unanswered requests, 1 MiB
    /// of log a workflow, and processes suspended after waiting
    /// [`DEFAULT_SUSPEND_AFTER`](crate::scheduler::DEFAULT_SUSPEND_AFTER).
    pub fn new(data: impl Into<PathBuf>) -> ServiceConfig {
        ServiceConfig {
            data: data.into(),
            workers: 2,
            max_upload: 64 << 20,
            max_body: 1 << 20,
            max_wait: Duration::from_secs(60),
            grace: Duration::from_secs(5),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            max_pending_requests: 1_000,
            max_log_bytes: 1 << 20,
            max_memory: crate::wasm::DEFAULT_MAX_MEMORY,
            policy: Policy::new(crate::wasm::DEFAULT_MAX_MEMORY as u64),
            suspend_after: Some(crate::scheduler::DEFAULT_SUSPEND_AFTER),
            hibernate_after: crate::scheduler::DEFAULT_HIBERNATE_AFTER,
            hibernate_instances: true,
        }
    }
}

/// Why a request to the service was refused: what the API answers with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: u16,
    /// A stable code (`not_found`, `conflict`, `invalid`, …).
    pub code: &'static str,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
}

impl Refusal {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal { status, code, message: message.into() }
    }

    fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(400, "invalid", message)
    }

    fn not_found(what: impl std::fmt::Display) -> Refusal {
        Refusal::new(404, "not_found", format!("no {what}"))
    }

    fn internal(error: &anyhow::Error) -> Refusal {
        tracing::error!("the service failed a request: {error:#}");
        Refusal::new(500, "internal", format!("the server failed: {error:#}"))
    }
}

impl From<anyhow::Error> for Refusal {
    fn from(error: anyhow::Error) -> Refusal {
        Refusal::internal(&error)
    }
}

/// What starting a workflow asks for.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The workflow's id (1 to 64 letters, digits, `-`, `_` or `.`); drawn at random
    /// when absent. Starting again with the same id and the same request answers with
    /// the existing workflow; with another request it is a conflict.
    #[serde(default)]
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    pub id: Option<String>,
    /// The component: `sha256:<hex>`, or a name given at upload (`NAME` or `NAME:TAG`).
    pub component: String,
    /// The entry method; `main` when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// The input, as one JSON value; none when absent.
    #[serde(default)]
    pub input: Option<serde_json::Value>,
    /// What the workflow is granted beyond every workflow's defaults, within its
    /// tenant's policy.
    #[serde(default)]
    pub grants: Grants,
    /// The limits its processes run under, within its tenant's policy.
    #[serde(default)]
    pub limits: Limits,
}

/// A workflow that is running, or whose end is not yet in its record: its handle, its
/// record as the registry holds it while it runs, its end once it has one, and a flag
/// raised then, for those waiting on its result.
struct Live {
    handle: ProcessHandle,
    /// The registry's record of it, running: what a description or a result answers
    /// with (and its end, once it has one) while it is here, without reading the
    /// registry. It changes only when its end is recorded, which takes it out of `live`.
    record: WorkflowRecord,
    /// Tells those waiting for its end; made by the first to wait (most workflows end
    /// unwaited for, or are waited for through `end`).
    ended: Option<tokio::sync::watch::Sender<bool>>,
    /// How it ended, and when: set once the journal has its exit record (committed before
    /// `on_exit` fires), so a result is answered from here while its record is being
    /// written. A kill -9 in between loses nothing: the next server finds the end in the
    /// journal (see [`Service::reattach`]).
    end: Option<(Exited, u64)>,
}

impl Live {
    /// Wakes those waiting for its end.
    fn wake_waiters(&self) {
        if let Some(ended) = &self.ended {
            ended.send_replace(true);
        }
    }

    /// What tells a waiter of its end (`true` once it has one).
    fn waiter(&mut self) -> tokio::sync::watch::Receiver<bool> {
        let ended = self.end.is_some();
        self.ended.get_or_insert_with(|| tokio::sync::watch::channel(ended).0).subscribe()
    }
}

/// The workflows in `live`, by tenant and id, and how many each tenant has there and
/// running (with no end yet): a start checks its tenant's count, and the metrics and the
/// console read theirs, without looking at every workflow held. Read through `Deref`;
/// changed only through its own methods, which keep the counts.
#[derive(Default)]
struct Watched {
    by_id: HashMap<(String, String), Box<Live>>,
    per_tenant: HashMap<String, usize>,
    running: HashMap<String, usize>,
}

/// Adds one to `tenant`'s count in `counts`.
fn count_up(counts: &mut HashMap<String, usize>, tenant: &str) {
    match counts.get_mut(tenant) {
        Some(count) => *count += 1,
        None => {
            counts.insert(tenant.to_owned(), 1);
        }
    }
}

/// Takes one from `tenant`'s count in `counts`, which goes at zero.
fn count_down(counts: &mut HashMap<String, usize>, tenant: &str) {
    if let Some(count) = counts.get_mut(tenant) {
        *count -= 1;
        if *count == 0 {
            counts.remove(tenant);
        }
    }
}

impl Watched {
    fn insert(&mut self, key: (String, String), live: Box<Live>) {
        let tenant = key.0.clone();
        let running = live.end.is_none();
        if let Some(before) = self.by_id.insert(key, live) {
            if before.end.is_none() {
                count_down(&mut self.running, &tenant);
            }
        } else {
            count_up(&mut self.per_tenant, &tenant);
        }
        if running {
            count_up(&mut self.running, &tenant);
        }
    }

    fn remove(&mut self, key: &(String, String)) -> Option<Box<Live>> {
        let removed = self.by_id.remove(key)?;
        count_down(&mut self.per_tenant, &key.0);
        if removed.end.is_none() {
            count_down(&mut self.running, &key.0);
        }
        Some(removed)
    }

    /// Gives the workflow of `key` its end, unless it has one; the workflow, to wake
    /// those waiting for it, if it is here.
    fn end(&mut self, key: &(String, String), end: (Exited, u64)) -> Option<&mut Live> {
        let live = self.by_id.get_mut(key)?;
        if live.end.is_none() {
            live.end = Some(end);
            count_down(&mut self.running, &key.0);
        }
        Some(&mut **live)
    }

    /// How many workflows run, of every tenant.
    fn running(&self) -> usize {
        self.running.values().sum()
    }

    /// How many of `tenant`'s workflows run.
    fn running_of(&self, tenant: &str) -> usize {
        self.running.get(tenant).copied().unwrap_or(0)
    }

    fn get_mut(&mut self, key: &(String, String)) -> Option<&mut Live> {
        self.by_id.get_mut(key).map(|live| &mut **live)
    }

    /// How many of `tenant`'s workflows are here (running, or ended and not yet recorded).
    fn of_tenant(&self, tenant: &str) -> usize {
        self.per_tenant.get(tenant).copied().unwrap_or(0)
    }
}

impl std::ops::Deref for Watched {
    type Target = HashMap<(String, String), Box<Live>>;

    fn deref(&self) -> &Self::Target {
        &self.by_id
    }
}

/// The service: see the module's docs.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    config: ServiceConfig,
    registry: Arc<Registry>,
    code: Arc<Code>,
    journal: Journal,
    scheduler: Mutex<Option<Scheduler>>,
    handle: Handle,
    /// Running workflows by tenant and id, and those whose end is not yet recorded.
    live: Mutex<Watched>,
    /// Signalled when ends are recorded and their workflows leave `live`.
    settled: parking_lot::Condvar,
    /// The ends in `live` (see [`Unrecorded`]). Taken after `live` when both are.
    unrecorded: Mutex<Unrecorded>,
    /// Signalled when a [`settle`] is done with `unrecorded`.
    recorded: parking_lot::Condvar,
    /// Tenants by the hash of their token.
    tokens: RwLock<HashMap<String, String>>,
    /// Each tenant's policy, as the registry has it.
    policies: RwLock<HashMap<String, Policy>>,
    /// What each workflow that may have processes was started with.
    profiles: Arc<Profiles>,
    /// The providers each workflow's hosts and directories are served from.
    outside: Arc<Outside>,
    /// Each tenant's process quota.
    quotas: Arc<Quotas>,
    /// The tenants' key-value stores.
    stores: Arc<Stores>,
    admin_token_sha256: String,
    /// The workflows being started now, by tenant and id. Taken to check an id and claim
    /// it, and by what must not interleave with that (forget, tenants).
    starting: Mutex<HashSet<(String, String)>>,
    /// Signalled when a start ends, for a start of the same id waiting on it.
    started: parking_lot::Condvar,
    /// Starts through the API doing their checks and spawn at once ([`STARTS_AT_ONCE`]).
    start_slots: tokio::sync::Semaphore,
    /// Set once the service stops: ends seen from then on are suspensions, not ends.
    stopping: AtomicBool,
    metrics: metrics::Metrics,
    /// Each tenant's request allowance: tokens left and when they were counted.
    buckets: Mutex<HashMap<String, (f64, std::time::Instant)>>,
    /// Work for the chores' thread ([`chores`]).
    chores: std::sync::mpsc::Sender<Chore>,
    /// Requests to workflows (`requests.rs`).
    requests: Arc<requests::Requests>,
    /// Workflows' logs (`logs.rs`).
    logs: Arc<logs::Logs>,
    /// Held by a test to keep ends from being recorded.
    #[cfg(test)]
    hold_ends: Mutex<()>,
}

/// The ends the journal holds and the registry's records do not yet (those in `live`),
/// counted by tenant, so that the registry's counts by state plus these are the counts
/// a description of each workflow would give.
///
/// The two agree but while a [`settle`] has written records and not yet taken their
/// ends from here; `settling` counts those, and a count waits until none is: a settle
/// raises it before writing and lowers it after taking its ends out, both under this
/// lock, so a reader that holds it with `settling` at 0 sees no end in both places or
/// in neither.
#[derive(Default)]
struct Unrecorded {
    /// By tenant: how many completed, how many failed.
    ends: HashMap<String, [u64; 2]>,
    settling: usize,
}

impl Unrecorded {
    fn count(&mut self, tenant: &str, exited: &Exited, up: bool) {
        let ends = self.ends.entry(tenant.to_owned()).or_default();
        let count = &mut ends[usize::from(!matches!(exited.reason, ExitReason::Normal(_)))];
        *count = if up { *count + 1 } else { count.saturating_sub(1) };
        if *ends == [0, 0] {
            self.ends.remove(tenant);
        }
    }
}

/// What the chores' thread does off the workers and the API's threads.
enum Chore {
    /// Record a workflow's end, which came at `at_ms`.
    Ended { tenant: String, id: String, exited: Exited, at_ms: u64 },
    /// Terminate a cancelled workflow still running at `until`.
    Grace { handle: ProcessHandle, until: std::time::Instant },
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A new secret: 32 random bytes as hex, after `prefix`.
fn secret(prefix: &str) -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for a token: {e}"))?;
    Ok(format!("{prefix}{}", crate::codec::hex(&bytes)))
}

/// Creates `dir` (mode 0700) if it is missing.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).with_context(|| format!("cannot create `{}`", dir.display()))
}

/// The admin token of `data`: read from `admin.token`, or made and written there.
fn admin_token(data: &Path) -> anyhow::Result<String> {
    let path = data.join("admin.token");
    match std::fs::read_to_string(&path) {
        Ok(token) => Ok(token.trim().to_owned()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let token = secret("wpa_")?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&path).with_context(|| format!("cannot create `{}`", path.display()))?;
            std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())?;
            file.sync_all()?;
            tracing::info!("made the admin token, in {}", path.display());
            Ok(token)
        }
        Err(error) => Err(error).with_context(|| format!("cannot read `{}`", path.display())),
    }
}

/// A workflow's result as its record keeps it.
fn result_json(exited: &Exited) -> serde_json::Value {
    match &exited.reason {
        ExitReason::Normal(payload) => serde_json::json!({ "ok": payload.to_json_value() }),
        reason => serde_json::json!({ "error": { "reason": reason.name(), "message": reason.to_string() } }),
    }
}

/// Writes into `record` its end, `exited` at `at_ms`.
fn end_record(record: &mut WorkflowRecord, exited: &Exited, at_ms: u64) {
    record.state = if matches!(exited.reason, ExitReason::Normal(_)) { State::Completed } else { State::Failed };
    record.ended_ms = Some(at_ms);
    record.result = Some(result_json(exited));
}

impl Service {
    /// Opens the data directory and starts the scheduler on its journal: every
    /// unfinished workflow resumes.
    ///
    /// # Errors
    ///
    /// The directory cannot be made or read, another server has it open, or the journal
    /// cannot be resumed.
    pub fn open(config: ServiceConfig) -> anyhow::Result<Service> {
        let data = &config.data;
        private_dir(data)?;
        for dir in ["journal", "registry", "components", "logs", "kv"] {
            private_dir(&data.join(dir))?;
        }
        let admin = admin_token(data)?;
        let registry = Arc::new(Registry::open(&data.join("registry"))?);
        config
            .policy
            .check(config.max_memory as u64)
            .map_err(|refusal| anyhow::anyhow!("the default policy for new tenants: {}", refusal.message))?;
        let logs = Arc::new(logs::Logs::new(data.join("logs"), config.max_log_bytes));
        let runtime_config = Config::default()
            .cache_dir(data.join("cache"))
            .max_memory(config.max_memory)
            .hibernate_instances(config.hibernate_instances)
            .log_sink(logs.sink());
        let runtime = Runtime::new(runtime_config).context("cannot start the Wasm runtime")?;
        let code = Arc::new(Code::new(data.join("components"), runtime, registry.clone()));
        let tenants = registry.tenants()?;
        let policies: HashMap<String, Policy> = tenants
            .iter()
            .map(|t| (t.name.clone(), t.policy.clone().unwrap_or_else(|| config.policy.clone())))
            .collect();
        let journal = Journal::open(data.join("journal"))
            .with_context(|| format!("cannot open the journal in `{}`", data.join("journal").display()))?;
        // The HTTP runtime's threads share the cores with the scheduler's.
        let settings = JournalSettings { keep_finished: true, shared_cores: true, ..JournalSettings::default() };
        let journal = journal.settings(settings);
        // Before anything reads the registry's workflows: the records a machine's crash
        // lost, from the journal's notes.
        let runs = journal.runs().context("cannot read the journal's runs")?;
        noted::restore(&registry, &runs)?;
        // Every workflow that may have processes to resume: what it was started with.
        let profiles = Arc::new(Profiles::default());
        let outside = Arc::new(Outside::default());
        // Before the scheduler resumes the workflows: each root counts against its
        // tenant's quota from then on.
        let quotas = Arc::new(Quotas::default());
        for (tenant, policy) in &policies {
            quotas.set(tenant, policy.max_processes);
        }
        let mut granted_kv = std::collections::HashSet::new();
        for (tenant, record) in registry.all_workflows()? {
            if record.state != State::Running {
                continue;
            }
            let policy = policies.get(&tenant).unwrap_or(&config.policy);
            let profile = Profile::recorded(policy, &record.grants, &record.limits, &outside);
            if profile.kv {
                granted_kv.insert(tenant.clone());
            }
            profiles.insert(&tenant, &record.id, profile);
        }
        let stores = Arc::new(Stores::new(data.join("kv")));
        for (tenant, policy) in &policies {
            if policy.kv || granted_kv.contains(tenant) {
                let components = registry.components(tenant)?.iter().map(|c| c.size).sum();
                stores
                    .open(tenant, policy.storage, components)
                    .with_context(|| format!("cannot open tenant `{tenant}`'s key-value store"))?;
            }
        }
        let requests = Arc::new(requests::Requests::new(config.max_pending_requests));
        let scheduler = Scheduler::builder()
            .workers(config.workers.max(1))
            .thread_name("wasmproc-serve")
            .journal(journal.clone())
            .suspend_after(config.suspend_after)
            .hibernate_after(config.hibernate_after)
            .capabilities(policy::ALWAYS.into_iter().fold(Capabilities::over_self(), Capabilities::allow))
            .provider(requests::AnswerProvider(requests.clone()))
            .kind_source(Kinds { code: code.clone(), profiles: profiles.clone(), quotas: quotas.clone() })
            .provider(TenantKv(stores.clone()))
            .provider(outside::WorkflowHttp(profiles.clone()))
            .provider(outside::WorkflowFiles(profiles.clone()))
            .provider(Time)
            .provider(Random)
            .build()
            .context("cannot start the scheduler on the journal")?;
        logs.attach(scheduler.handle().clone());
        logs::start(&logs)?;
        let tokens = tenants.into_iter().map(|t| (t.token_sha256, t.name)).collect();
        let (chores_to, chores_from) = std::sync::mpsc::channel();
        let inner = Arc::new(Inner {
            handle: scheduler.handle().clone(),
            scheduler: Mutex::new(Some(scheduler)),
            admin_token_sha256: sha256_hex(admin.as_bytes()),
            config,
            registry,
            code,
            journal,
            live: Mutex::new(Watched::default()),
            start_slots: tokio::sync::Semaphore::new(STARTS_AT_ONCE),
            settled: parking_lot::Condvar::new(),
            unrecorded: Mutex::new(Unrecorded::default()),
            recorded: parking_lot::Condvar::new(),
            tokens: RwLock::new(tokens),
            policies: RwLock::new(policies),
            profiles,
            outside,
            quotas,
            stores,
            starting: Mutex::new(HashSet::new()),
            started: parking_lot::Condvar::new(),
            stopping: AtomicBool::new(false),
            metrics: metrics::Metrics::new(),
            buckets: Mutex::new(HashMap::new()),
            chores: chores_to,
            requests,
            logs,
            #[cfg(test)]
            hold_ends: Mutex::new(()),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("wasmproc-serve-chores".to_owned())
            .spawn(move || chores(&weak, &chores_from))
            .context("cannot start the service's chores' thread")?;
        let service = Service { inner };
        service.reattach(&runs)?;
        requests::start(&service.inner)?;
        if let Some(retention) = service.inner.config.retention {
            let weak = Arc::downgrade(&service.inner);
            std::thread::Builder::new()
                .name("wasmproc-serve-purge".to_owned())
                .spawn(move || purge_every(&weak, retention))
                .context("cannot start the thread that purges ended workflows")?;
        }
        Ok(service)
    }

    /// Forgets every workflow that ended more than `retention` ago; how many.
    ///
    /// # Errors
    ///
    /// The registry or the journal cannot be read or written.
    pub fn purge(&self, retention: Duration) -> anyhow::Result<usize> {
        let cutoff = now_ms().saturating_sub(retention.as_millis() as u64);
        let expired: Vec<_> = self
            .inner
            .registry
            .all_workflows()?
            .into_iter()
            .filter(|(_, record)| record.ended_ms.is_some_and(|ended| ended <= cutoff))
            .collect();
        if expired.is_empty() {
            return Ok(0);
        }
        // Read once for all of them: the runs of workflows that ended before the cutoff
        // do not change meanwhile.
        let runs: HashMap<u64, HeldRun> =
            self.inner.journal.runs()?.into_iter().map(|run| (run.root.as_u64(), run)).collect();
        let mut purged = 0;
        for (tenant, record) in expired {
            match self.forget_among(&tenant, &record.id, Some(&runs)) {
                Ok(()) => purged += 1,
                Err(refusal) => tracing::warn!("cannot purge workflow `{}`: {}", record.id, refusal.message),
            }
        }
        Ok(purged)
    }

    /// Watches again the workflows the journal resumed, settles those that ended while no
    /// server ran (their end is in the journal), and starts those whose record was
    /// written but whose spawn never reached the journal.
    ///
    /// `runs` are the journal's as the service opened it, before anything was resumed:
    /// a run not resumed is as it was then.
    fn reattach(&self, runs: &[HeldRun]) -> anyhow::Result<()> {
        let inner = &self.inner;
        let resumed: HashMap<Pid, ProcessHandle> = {
            let scheduler = inner.scheduler.lock();
            let scheduler = scheduler.as_ref().expect("the scheduler runs while the service is open");
            scheduler.resumed().into_iter().map(|handle| (handle.pid(), handle)).collect()
        };
        for (tenant, record) in inner.registry.all_workflows()? {
            if record.state != State::Running {
                continue;
            }
            let pid = Pid::from_u64(record.pid);
            if let Some(handle) = resumed.get(&pid) {
                self.watch(&tenant, &record, handle.clone());
                continue;
            }
            match HeldRun::end_of(runs, pid) {
                Some(exited) => settle(inner, &[(tenant, record.id, exited, now_ms())], Ends::Journaled)?,
                // Its record was written and its spawn never reached the journal (the
                // server stopped between the two): nothing of it ran for good, so it
                // starts now, as it was asked to.
                None => {
                    let id = record.id.clone();
                    match self.spawn_workflow(&tenant, record) {
                        Ok((record, handle, _)) => self.watch(&tenant, &record, handle),
                        Err(refusal) => {
                            tracing::error!("workflow `{id}` of tenant `{tenant}` did not start: {}", refusal.message);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Records `handle`'s end when it comes, and wakes those waiting for it.
    fn watch(&self, tenant: &str, record: &WorkflowRecord, handle: ProcessHandle) {
        // What is kept of a workflow lasts as long as it does, asleep or not.
        crate::heap::lasting(|| self.watch_inner(tenant, record, handle));
    }

    fn watch_inner(&self, tenant: &str, record: &WorkflowRecord, handle: ProcessHandle) {
        let (id, record) = (record.id.as_str(), record.clone());
        let key = (tenant.to_owned(), id.to_owned());
        let live = Box::new(Live { handle: handle.clone(), record, ended: None, end: None });
        self.inner.live.lock().insert(key.clone(), live);
        self.inner.requests.track(handle.pid(), tenant, id);
        self.inner.logs.track(handle.pid(), tenant, id);
        let inner = Arc::downgrade(&self.inner);
        handle.on_exit(move |exited| {
            let Some(inner) = inner.upgrade() else { return };
            if inner.stopping.load(Ordering::Acquire) {
                // A stop suspends: the next server resumes it, or finds its end in the
                // journal if it did end.
                return;
            }
            // The journal has the exit: those waiting for the result have it now.
            let at_ms = now_ms();
            let mut live = inner.live.lock();
            if let Some(live) = live.end(&key, (exited.clone(), at_ms)) {
                live.wake_waiters();
                inner.unrecorded.lock().count(&key.0, exited, true);
            }
            drop(live);
            // Recording is a synced write: off the worker that ended the process, on the
            // chores' thread, which writes the ends that come together in one batch.
            let ended = Chore::Ended { tenant: key.0, id: key.1, exited: exited.clone(), at_ms };
            if inner.chores.send(ended).is_err() {
                tracing::error!(
                    "the service's chores' thread is gone: a workflow's end goes unrecorded until a restart"
                );
            }
        });
    }

    /// The tenant whose token is `token`, or `None`.
    pub fn tenant_of(&self, token: &str) -> Option<String> {
        self.inner.tokens.read().get(&sha256_hex(token.as_bytes())).cloned()
    }

    /// Takes one request from `tenant`'s allowance; `false` past its rate.
    pub fn admit(&self, tenant: &str) -> bool {
        let rate = self.inner.policies.read().get(tenant).map_or(self.inner.config.policy.rate, |p| p.rate);
        let rate = f64::from(rate.max(1));
        let now = std::time::Instant::now();
        let take = |(tokens, at): &mut (f64, std::time::Instant)| {
            *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * rate).min(rate);
            *at = now;
            let admitted = *tokens >= 1.0;
            if admitted {
                *tokens -= 1.0;
            }
            admitted
        };
        let mut buckets = self.inner.buckets.lock();
        // Looked up before a key is made: a request of a known tenant allocates nothing.
        match buckets.get_mut(tenant) {
            Some(bucket) => take(bucket),
            None => take(buckets.entry(tenant.to_owned()).or_insert((rate, now))),
        }
    }

    /// Whether `token` is the admin's.
    pub fn is_admin(&self, token: &str) -> bool {
        sha256_hex(token.as_bytes()) == self.inner.admin_token_sha256
    }

    /// Adds tenant `name`, with the server's default policy but for the fields `policy`
    /// gives; its token, which is kept only hashed.
    ///
    /// # Errors
    ///
    /// An invalid name, one taken, or a policy the server cannot hold.
    pub fn add_tenant(&self, name: &str, policy: PolicyFields) -> Result<String, Refusal> {
        if !code::valid_name(name) {
            return Err(Refusal::invalid(format!(
                "invalid tenant name `{name}`: 1 to 64 letters, digits, `-`, `_` or `.`"
            )));
        }
        let policy = policy.over(&self.inner.config.policy);
        policy.check(self.inner.config.max_memory as u64)?;
        let _one_at_a_time = self.inner.starting.lock();
        if self.inner.registry.tenants()?.iter().any(|t| t.name == name) {
            return Err(Refusal::new(409, "conflict", format!("tenant `{name}` exists already")));
        }
        self.apply_policy(name, &policy)?;
        self.issue_token(name, policy)
    }

    /// `tenant`'s policy as the service holds it (the default for a tenant it does not
    /// know, which no request reaches: a request's tenant is one its token names).
    fn policy_of(&self, tenant: &str) -> Policy {
        self.inner.policies.read().get(tenant).cloned().unwrap_or_else(|| self.inner.config.policy.clone())
    }

    /// Tenant `name`'s policy.
    ///
    /// # Errors
    ///
    /// No such tenant.
    pub fn policy(&self, name: &str) -> Result<Policy, Refusal> {
        self.inner.policies.read().get(name).cloned().ok_or_else(|| Refusal::not_found(format_args!("tenant `{name}`")))
    }

    /// Sets tenant `name`'s policy: the server's default but for the fields `policy`
    /// gives. Workflows started before keep what they were started with.
    ///
    /// # Errors
    ///
    /// No such tenant, or a policy the server cannot hold.
    pub fn set_policy(&self, name: &str, policy: PolicyFields) -> Result<Policy, Refusal> {
        let policy = policy.over(&self.inner.config.policy);
        policy.check(self.inner.config.max_memory as u64)?;
        let _one_at_a_time = self.inner.starting.lock();
        let Some(mut tenant) = self.inner.registry.tenants()?.into_iter().find(|t| t.name == name) else {
            return Err(Refusal::not_found(format_args!("tenant `{name}`")));
        };
        self.apply_policy(name, &policy)?;
        tenant.policy = Some(policy.clone());
        self.inner.registry.put_tenant(&tenant)?;
        self.inner.policies.write().insert(name.to_owned(), policy.clone());
        Ok(policy)
    }

    /// Opens or bounds tenant `name`'s key-value store, and sets its process quota, as
    /// `policy` says.
    fn apply_policy(&self, name: &str, policy: &Policy) -> Result<(), Refusal> {
        self.inner.quotas.set(name, policy.max_processes);
        let components = self.components_bytes(name)?;
        if policy.kv {
            self.inner
                .stores
                .open(name, policy.storage, components)
                .with_context(|| format!("cannot open tenant `{name}`'s key-value store"))?;
        } else {
            self.inner.stores.bound(name, policy.storage, components);
        }
        Ok(())
    }

    /// The bytes of `tenant`'s components.
    fn components_bytes(&self, tenant: &str) -> Result<u64, Refusal> {
        Ok(self.inner.registry.components(tenant)?.iter().map(|c| c.size).sum())
    }

    /// A new token for tenant `name`; the old one stops working.
    ///
    /// # Errors
    ///
    /// No such tenant.
    pub fn new_token(&self, name: &str) -> Result<String, Refusal> {
        let _one_at_a_time = self.inner.starting.lock();
        let Some(tenant) = self.inner.registry.tenants()?.into_iter().find(|t| t.name == name) else {
            return Err(Refusal::not_found(format_args!("tenant `{name}`")));
        };
        let policy = tenant.policy.unwrap_or_else(|| self.inner.config.policy.clone());
        self.issue_token(name, policy)
    }

    fn issue_token(&self, name: &str, policy: Policy) -> Result<String, Refusal> {
        let token = secret("wpt_")?;
        let tenant =
            Tenant { name: name.to_owned(), token_sha256: sha256_hex(token.as_bytes()), policy: Some(policy.clone()) };
        self.inner.registry.put_tenant(&tenant)?;
        self.inner.policies.write().insert(name.to_owned(), policy);
        let mut tokens = self.inner.tokens.write();
        tokens.retain(|_, tenant| tenant != name);
        tokens.insert(tenant.token_sha256, name.to_owned());
        Ok(token)
    }

    /// The tenants' names, with their policies.
    ///
    /// # Errors
    ///
    /// The registry cannot be read.
    pub fn tenants(&self) -> Result<Vec<(String, Policy)>, Refusal> {
        let policies = self.inner.policies.read();
        Ok(self
            .inner
            .registry
            .tenants()?
            .into_iter()
            .map(|t| {
                let policy = policies.get(&t.name).cloned().unwrap_or_else(|| self.inner.config.policy.clone());
                (t.name, policy)
            })
            .collect())
    }

    /// Removes tenant `name`, which must have no running workflow.
    ///
    /// # Errors
    ///
    /// No such tenant, or one with running workflows.
    pub fn remove_tenant(&self, name: &str) -> Result<(), Refusal> {
        let _one_at_a_time = self.inner.starting.lock();
        if !self.inner.registry.tenants()?.iter().any(|t| t.name == name) {
            return Err(Refusal::not_found(format_args!("tenant `{name}`")));
        }
        let running = self.inner.live.lock().of_tenant(name);
        if running > 0 {
            return Err(Refusal::new(
                409,
                "conflict",
                format!("tenant `{name}` has {running} running workflows; cancel them first"),
            ));
        }
        self.inner.registry.remove_tenant(name)?;
        self.inner.tokens.write().retain(|_, tenant| tenant != name);
        self.inner.policies.write().remove(name);
        self.inner.stores.remove(name)?;
        Ok(())
    }

    /// Adds a component for `tenant`, named `name` (and `name:tag`) if given; its record
    /// and whether it is new to the tenant.
    ///
    /// # Errors
    ///
    /// Bytes that are not a component of the `process` world, or an invalid name.
    pub fn deploy(
        &self,
        tenant: &str,
        bytes: &[u8],
        name: Option<&str>,
        tag: Option<&str>,
    ) -> Result<(ComponentRecord, bool), Refusal> {
        for (what, value) in [("name", name), ("tag", tag)] {
            if let Some(value) = value
                && !code::valid_name(value)
            {
                return Err(Refusal::invalid(format!(
                    "invalid {what} `{value}`: 1 to 64 letters, digits, `-`, `_` or `.`"
                )));
            }
        }
        if tag.is_some() && name.is_none() {
            return Err(Refusal::invalid("a tag needs a name: give `name` too"));
        }
        // Unlocked: two uploads at once may pass the quota by the smaller of them, once.
        let policy = self.policy_of(tenant);
        let hash = format!("sha256:{}", sha256_hex(bytes));
        let components = self.components_bytes(tenant)?;
        if self.inner.registry.component(tenant, &hash)?.is_none() {
            let data = self.inner.stores.used(tenant);
            let size = bytes.len() as u64;
            if components + data + size > policy.storage {
                return Err(Refusal::new(
                    413,
                    "quota",
                    format!(
                        "tenant `{tenant}` holds {components} bytes of components and {data} of key-value data: \
                         this component's {size} would pass its `storage` of {} bytes; remove components you no \
                         longer use (`wasmproc undeploy`), or have the admin run `wasmproc tenant policy {tenant} \
                         --storage SIZE`",
                        policy.storage
                    ),
                ));
            }
        }
        let (record, new) = self
            .inner
            .code
            .add(tenant, bytes, now_ms())
            .map_err(|e| Refusal::new(422, "invalid_component", format!("not a wasmproc component: {e:#}")))?;
        if let Some(name) = name {
            self.inner.registry.put_name(tenant, name, &record.hash)?;
            if let Some(tag) = tag {
                self.inner.registry.put_name(tenant, &format!("{name}:{tag}"), &record.hash)?;
            }
        }
        if new {
            self.inner.stores.bound(tenant, policy.storage, components + record.size);
        }
        Ok((record, new))
    }

    /// Removes `tenant`'s component `reference` (a hash or a name), and every name of
    /// it; its bytes go once no tenant has it.
    ///
    /// # Errors
    ///
    /// No such component for the tenant, or one that a running workflow of the tenant
    /// was started from (409, naming them).
    pub fn remove_component(&self, tenant: &str, reference: &str) -> Result<ComponentRecord, Refusal> {
        let _one_at_a_time = self.inner.starting.lock();
        let (record, _) = self.component(tenant, reference)?;
        // Every record of the tenant: a removal is rare, and must know of every user.
        let running: Vec<String> = self
            .inner
            .registry
            .scan_workflows(tenant, "", None, usize::MAX, usize::MAX, |w| {
                Ok(w.state == State::Running && w.component == record.hash)
            })?
            .found
            .into_iter()
            .map(|w| format!("`{}`", w.id))
            .collect();
        if !running.is_empty() {
            return Err(Refusal::new(
                409,
                "in_use",
                format!(
                    "component `{reference}` runs in workflows {}: cancel or terminate them first",
                    running.join(", ")
                ),
            ));
        }
        self.inner.registry.remove_component(tenant, &record.hash)?;
        if !self.inner.registry.anyone_has(&record.hash)? {
            self.inner.code.remove(&record.hash)?;
        }
        let policy = self.policy_of(tenant);
        self.inner.stores.bound(tenant, policy.storage, self.components_bytes(tenant)?);
        Ok(record)
    }

    /// `tenant`'s components, with the names that stand for each.
    ///
    /// # Errors
    ///
    /// The registry cannot be read.
    pub fn components(&self, tenant: &str) -> Result<Vec<(ComponentRecord, Vec<String>)>, Refusal> {
        let names = self.inner.registry.names(tenant)?;
        Ok(self
            .inner
            .registry
            .components(tenant)?
            .into_iter()
            .map(|record| {
                let named = names.iter().filter(|(_, hash)| *hash == record.hash).map(|(n, _)| n.clone()).collect();
                (record, named)
            })
            .collect())
    }

    /// `tenant`'s component `reference` (a hash or a name).
    ///
    /// # Errors
    ///
    /// No such component for the tenant.
    pub fn component(&self, tenant: &str, reference: &str) -> Result<(ComponentRecord, Vec<String>), Refusal> {
        let hash = self.inner.code.find(tenant, reference)?;
        let hash = hash.ok_or_else(|| Refusal::not_found(format_args!("component `{reference}`")))?;
        self.components(tenant)?
            .into_iter()
            .find(|(record, _)| record.hash == hash)
            .ok_or_else(|| Refusal::not_found(format_args!("component `{reference}`")))
    }

    /// Starts a workflow for `tenant`; its record, and whether it is new (`false`: the
    /// same request started it before).
    ///
    /// # Errors
    ///
    /// An unknown component or method, an id taken by another request (409), or a spawn
    /// the scheduler refuses.
    pub fn start(&self, tenant: &str, request: StartRequest) -> Result<(WorkflowRecord, bool), Refusal> {
        match self.begin_start(tenant, request)? {
            Begun::Existing(record) => Ok((record, false)),
            Begun::New(started) => {
                let recorded = started.recorded.wait();
                started.answer(recorded)
            }
        }
    }

    /// As [`Service::start`], awaiting the journal's commit of the start without holding
    /// a thread; the checks and the spawn (the root's `init`) still block.
    ///
    /// # Errors
    ///
    /// As [`Service::start`].
    pub async fn start_async(&self, tenant: &str, request: StartRequest) -> Result<(WorkflowRecord, bool), Refusal> {
        let (service, tenant) = (self.clone(), tenant.to_owned());
        // Never closed: an error would be a bug, answered as one.
        let slot = self
            .inner
            .start_slots
            .acquire()
            .await
            .map_err(|e| Refusal::internal(&anyhow::anyhow!("no slot for a start: {e}")))?;
        let begun = blocking(move || service.begin_start(&tenant, request)).await;
        drop(slot);
        match begun? {
            Begun::Existing(record) => Ok((record, false)),
            Begun::New(started) => {
                let recorded = started.recorded.recorded().await;
                started.answer(recorded)
            }
        }
    }

    /// A start up to the journal's commit of its spawn: the workflow running and watched,
    /// or the same request's workflow from before.
    fn begin_start(&self, tenant: &str, request: StartRequest) -> Result<Begun, Refusal> {
        let inner = &self.inner;
        let id = match request.id {
            Some(id) if code::valid_name(&id) => id,
            Some(id) => {
                return Err(Refusal::invalid(format!(
                    "invalid workflow id `{id}`: 1 to 64 letters, digits, `-`, `_` or `.`"
                )));
            }
            None => secret("")?[..20].to_owned(),
        };
        let hash = inner
            .code
            .find(tenant, &request.component)?
            .ok_or_else(|| Refusal::not_found(format_args!("component `{}`", request.component)))?;
        let method = request.method.unwrap_or_else(|| "main".to_owned());
        let grants = request.grants.normalised();
        let policy = self.policy_of(tenant);
        let (_, limits) = policy::resolve(tenant, &policy, &grants, &request.limits, &inner.outside)?;
        let component = inner.code.component(&hash)?;
        if !component.entries().contains(&method) {
            return Err(Refusal::invalid(format!(
                "component `{}` has no entry `{method}`; it has: {}",
                request.component,
                component.entries().join(", ")
            )));
        }
        let record = WorkflowRecord {
            id,
            component: hash,
            method,
            input: request.input,
            pid: 0,
            state: State::Running,
            started_ms: now_ms(),
            ended_ms: None,
            result: None,
            grants,
            limits,
        };
        let key = (tenant.to_owned(), record.id.clone());
        {
            let mut starting = inner.starting.lock();
            // A start of the same id in progress: its outcome decides this one's.
            while starting.contains(&key) {
                inner.started.wait(&mut starting);
            }
            if let Some(existing) = inner.registry.workflow(tenant, &record.id)? {
                return same_request(existing, &record).map(|(existing, _)| Begun::Existing(existing));
            }
            let busy = starting.iter().filter(|(of, _)| of == tenant).count();
            let running = busy + inner.live.lock().of_tenant(tenant);
            if running >= policy.max_running {
                return Err(Refusal::new(
                    429,
                    "quota",
                    format!(
                        "tenant `{tenant}` has {running} workflows running, the most its policy's `max_running` \
                         allows; wait for some to end, or have the admin run `wasmproc tenant policy {tenant} \
                         --max-running N`"
                    ),
                ));
            }
            let quota = inner.quotas.set(tenant, policy.max_processes);
            if quota.live() >= quota.max() {
                return Err(Refusal::new(
                    429,
                    "quota",
                    format!(
                        "tenant `{tenant}` has {} processes alive (its workflows and their children), the most its \
                         policy's `max_processes` allows; wait for some to end, or have the admin run `wasmproc \
                         tenant policy {tenant} --max-processes N`",
                        quota.live()
                    ),
                ));
            }
            starting.insert(key.clone());
        }
        // Until the start is answered (or given up): a same id's start waits for it.
        let starting = Starting { inner: self.inner.clone(), key };
        let (record, handle, recorded) = self.spawn_workflow(tenant, record)?;
        // Watched at once, as it runs; answered once the journal holds the start (the
        // record is in its spawn's note).
        self.watch(tenant, &record, handle);
        inner.metrics.started();
        Ok(Begun::New(Started { record, recorded, _starting: starting }))
    }

    /// Spawns `record`'s workflow, writing its record with the new pid before the spawn
    /// is journaled or the workflow runs ([`Handle::spawn_recorded`]), unsynced: the
    /// spawn's record holds it too, in its note (`noted.rs`). A crash of the host leaves
    /// the record with its process, or the record alone, which the next server starts
    /// again (see [`Service::reattach`]); one of the machine may leave the process
    /// alone, whose record the next server makes again from the note; never a process
    /// no record names. The record, the running workflow's handle, and what tells when
    /// its spawn is in the journal.
    ///
    /// What it keeps of the workflow lasts as long as the workflow, asleep or not; its
    /// root's instance and `init` do not ([`crate::heap::lasting`]).
    fn spawn_workflow(
        &self,
        tenant: &str,
        record: WorkflowRecord,
    ) -> Result<(WorkflowRecord, ProcessHandle, Recorded), Refusal> {
        crate::heap::lasting(|| self.spawn_workflow_lasting(tenant, record))
    }

    fn spawn_workflow_lasting(
        &self,
        tenant: &str,
        mut record: WorkflowRecord,
    ) -> Result<(WorkflowRecord, ProcessHandle, Recorded), Refusal> {
        let inner = &self.inner;
        let input = match &record.input {
            Some(value) => Payload::json(value).map_err(|e| Refusal::invalid(format!("input: {e}")))?,
            None => Payload::json(&serde_json::Value::Null).map_err(|e| Refusal::invalid(format!("input: {e}")))?,
        };
        // The workflow's id follows its input, as a payload of its own format, for the
        // SDK to read (`Ctx::workflow_id`); code that reads only its first input never
        // sees it.
        let id = Payload { format: Format::Other(WORKFLOW_ID_FORMAT.into()), data: record.id.clone().into_bytes() };
        let input = vec![input, id];
        let policy = self.policy_of(tenant);
        let profile = Profile::recorded(&policy, &record.grants, &record.limits, &inner.outside);
        let kind = noted::kind(tenant, &record);
        let options = SpawnOptions::new(&record.method)
            .input(input)
            .capabilities(profile.caps.clone())
            .quota(inner.quotas.set(tenant, policy.max_processes))
            .note(noted::note(&record));
        // Before the spawn: the kind and the providers find the workflow's limits and
        // grants here from its first process on.
        inner.profiles.insert(tenant, &record.id, profile);
        let mut written = false;
        let spawned = inner.handle.spawn_recorded(Spawnable::kind(kind), options, |pid| {
            record.pid = pid.as_u64();
            inner.registry.put_journaled(&[(tenant, record.clone())]).map_err(|e| format!("{e:#}"))?;
            written = true;
            Ok(())
        });
        match spawned {
            Ok((handle, recorded)) => Ok((record, handle, recorded)),
            Err(error) => {
                inner.profiles.remove(tenant, &record.id);
                let refusal = Refusal::new(422, "spawn_failed", format!("the workflow did not start: {error}"));
                if written {
                    // Its record is written, its process gone: the record says how it
                    // ended, so a retry of the same start finds it ended.
                    let exited = Exited::new(ExitReason::Error(format!("the workflow did not start: {error}")));
                    let ended = [(tenant.to_owned(), record.id.clone(), exited, now_ms())];
                    settle(inner, &ended, Ends::Unjournaled)?;
                }
                Err(refusal)
            }
        }
    }

    /// `tenant`'s workflow `id`.
    ///
    /// # Errors
    ///
    /// No such workflow for the tenant.
    pub fn workflow(&self, tenant: &str, id: &str) -> Result<WorkflowRecord, Refusal> {
        // `live` first, then the registry: an end leaves `live` only once its record is
        // written, so a workflow seen ended is never seen running after.
        let live =
            self.inner.live.lock().get(&(tenant.to_owned(), id.to_owned())).map(|l| (l.record.clone(), l.end.clone()));
        if let Some((mut record, end)) = live {
            if let Some((exited, at_ms)) = end {
                end_record(&mut record, &exited, at_ms);
            }
            return Ok(record);
        }
        self.inner.registry.workflow(tenant, id)?.ok_or_else(|| Refusal::not_found(format_args!("workflow `{id}`")))
    }

    /// A page of `tenant`'s workflows, in id order: those whose id starts with `prefix`,
    /// after `after`, in `state`, of `component` and started within the times if given,
    /// at most `limit`. It reads at most 10,000 records (`MOST_EXAMINED`), so a filter that
    /// few match may answer fewer than `limit` with a `next` to go on from.
    ///
    /// # Errors
    ///
    /// A `limit` out of its bounds, or a registry that cannot be read.
    pub fn workflows(&self, tenant: &str, filter: &Filter) -> Result<Listing, Refusal> {
        let limit = filter.page_size()?;
        let component = match &filter.component {
            Some(reference) => Some(self.inner.code.find(tenant, reference)?.unwrap_or_default()),
            None => None,
        };
        let prefix = filter.prefix.as_deref().unwrap_or("");
        let scanned =
            self.inner.registry.scan_workflows(tenant, prefix, filter.after.as_deref(), limit, MOST_EXAMINED, |w| {
                if !(component.as_deref().is_none_or(|hash| w.component == hash)
                    && filter.started_after.is_none_or(|after| w.started_ms >= after)
                    && filter.started_before.is_none_or(|before| w.started_ms < before))
                {
                    return Ok(false);
                }
                self.now(tenant, w)?;
                Ok(filter.state.is_none_or(|state| w.state == state))
            })?;
        Ok(Listing { workflows: scanned.found, examined: scanned.examined, next: scanned.next })
    }

    /// Brings `record`, as the registry had it, up to now: a running one may have an end
    /// not yet recorded, or have been settled since it was read.
    fn now(&self, tenant: &str, record: &mut WorkflowRecord) -> anyhow::Result<()> {
        if record.state != State::Running {
            return Ok(());
        }
        let end = self.inner.live.lock().get(&(tenant.to_owned(), record.id.clone())).map(|l| l.end.clone());
        match end {
            Some(Some((exited, at_ms))) => end_record(record, &exited, at_ms),
            Some(None) => {}
            // Out of `live`: settled since it was read (its record is written before it
            // leaves), or never watched (a workflow that could not start again).
            None => {
                if let Some(written) = self.inner.registry.workflow(tenant, &record.id)? {
                    *record = written;
                }
            }
        }
        Ok(())
    }

    /// Waits at most `wait` (bounded by the service's `max_wait`) for workflow `id` to
    /// end; its record then.
    ///
    /// # Errors
    ///
    /// No such workflow for the tenant.
    pub async fn wait(&self, tenant: &str, id: &str, wait: Duration) -> Result<WorkflowRecord, Refusal> {
        let record = self.workflow(tenant, id)?;
        if record.state != State::Running || wait.is_zero() {
            return Ok(record);
        }
        let receiver = self.inner.live.lock().get_mut(&(tenant.to_owned(), id.to_owned())).map(|l| l.waiter());
        if let Some(mut receiver) = receiver {
            let wait = wait.min(self.inner.config.max_wait);
            let _ = tokio::time::timeout(wait, receiver.wait_for(|ended| *ended)).await;
        }
        self.workflow(tenant, id)
    }

    /// Sends workflow `id` a message on `topic` with `body` (JSON), from the host.
    ///
    /// # Errors
    ///
    /// No such workflow, one that has ended, or a full mailbox.
    pub fn signal(&self, tenant: &str, id: &str, topic: &str, body: &serde_json::Value) -> Result<(), Refusal> {
        if topic.starts_with(requests::RESERVED) {
            return Err(Refusal::invalid(format!(
                "topic `{topic}`: topics beginning with `{}` are the service's own",
                requests::RESERVED
            )));
        }
        let pid = self.running_pid(tenant, id)?;
        let body = Payload::json(body).map_err(|e| Refusal::invalid(format!("body: {e}")))?;
        self.inner.handle.send(pid, topic, body).map_err(|e| Refusal::new(409, "not_running", e.to_string()))
    }

    /// Cancels workflow `id`: a cancel event now, and a termination if it has not ended
    /// when the grace has passed.
    ///
    /// # Errors
    ///
    /// No such workflow, or one that has ended.
    pub fn cancel(&self, tenant: &str, id: &str) -> Result<(), Refusal> {
        let pid = self.running_pid(tenant, id)?;
        self.inner
            .handle
            .cancel(pid, "cancelled through the API")
            .map_err(|e| Refusal::new(409, "not_running", e.to_string()))?;
        let handle = self.inner.live.lock().get(&(tenant.to_owned(), id.to_owned())).map(|l| l.handle.clone());
        if let Some(handle) = handle {
            let until = std::time::Instant::now() + self.inner.config.grace;
            self.inner
                .chores
                .send(Chore::Grace { handle, until })
                .map_err(|_| Refusal::internal(&anyhow::anyhow!("the service's chores' thread is gone")))?;
        }
        Ok(())
    }

    /// Terminates workflow `id` at once.
    ///
    /// # Errors
    ///
    /// No such workflow, or one that has ended.
    pub fn terminate(&self, tenant: &str, id: &str) -> Result<(), Refusal> {
        let pid = self.running_pid(tenant, id)?;
        self.inner.handle.terminate(pid).map_err(|e| Refusal::new(409, "not_running", e.to_string()))
    }

    /// Forgets workflow `id`, which has ended: its record and its history.
    ///
    /// # Errors
    ///
    /// No such workflow, or one still running.
    pub fn forget(&self, tenant: &str, id: &str) -> Result<(), Refusal> {
        self.forget_among(tenant, id, None)
    }

    /// As [`Service::forget`], finding the workflow's run in the journal among `runs`
    /// (by root pid) when given, instead of reading every run the journal holds.
    fn forget_among(&self, tenant: &str, id: &str, runs: Option<&HashMap<u64, HeldRun>>) -> Result<(), Refusal> {
        let _one_at_a_time = self.inner.starting.lock();
        let record = self.workflow(tenant, id)?;
        if record.state == State::Running {
            return Err(Refusal::new(409, "running", format!("workflow `{id}` is running; cancel it first")));
        }
        // An end not yet recorded would write the record again after it is removed.
        let key = (tenant.to_owned(), id.to_owned());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut live = self.inner.live.lock();
        while live.contains_key(&key) {
            if self.inner.settled.wait_until(&mut live, deadline).timed_out() {
                return Err(Refusal::internal(&anyhow::anyhow!(
                    "workflow `{id}`'s end is not yet recorded: try again later"
                )));
            }
        }
        drop(live);
        let read;
        let run = match runs {
            Some(runs) => runs.get(&record.pid),
            None => {
                let root = Pid::from_u64(record.pid);
                read = self.inner.journal.run_of(root).context("cannot read the workflow's run")?;
                read.as_ref()
            }
        };
        if let Some(run) = run {
            self.inner.journal.forget_run(run).context("cannot forget the workflow's history")?;
        }
        requests::forget(&self.inner.registry, &self.inner.requests, tenant, id)?;
        self.inner.logs.forget(tenant, id);
        self.inner.registry.remove_workflow(tenant, id)?;
        self.inner.profiles.remove(tenant, id);
        Ok(())
    }

    /// Workflow `id`'s history as its journal holds it: its root process and every
    /// process spawned under it, in pid order, each with its records as text lines
    /// and, while it runs, what it waits for.
    ///
    /// # Errors
    ///
    /// No such workflow, or a journal that cannot be read.
    pub fn history(&self, tenant: &str, id: &str) -> Result<Vec<crate::journal::History>, Refusal> {
        let record = self.workflow(tenant, id)?;
        let root = Pid::from_u64(record.pid);
        Ok(self.inner.journal.history_of(root).context("cannot read the journal")?)
    }

    fn running_pid(&self, tenant: &str, id: &str) -> Result<Pid, Refusal> {
        let record = self.workflow(tenant, id)?;
        if record.state != State::Running {
            return Err(Refusal::new(
                409,
                "not_running",
                format!("workflow `{id}` has ended ({})", record.state.as_str()),
            ));
        }
        Ok(Pid::from_u64(record.pid))
    }

    /// How many workflows run now.
    pub fn running(&self) -> usize {
        self.inner.live.lock().running()
    }

    /// The service's limits on requests.
    pub fn config(&self) -> &ServiceConfig {
        &self.inner.config
    }

    /// Stops the service: the scheduler suspends every running workflow, which the next
    /// service on the data directory resumes. Returns once the journal has what it needs.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        if let Some(scheduler) = self.inner.scheduler.lock().take() {
            scheduler.stop(Duration::from_secs(1));
        }
    }

    /// The HTTP API over this service (see `api.rs` and README's table).
    pub fn router(&self) -> axum::Router {
        api::router(self.clone())
    }
}

/// Which workflows [`Service::workflows`] lists.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct Filter {
    /// Only those in this state.
    pub state: Option<State>,
    /// Only those of this component (a hash or a name).
    pub component: Option<String>,
    /// Only those whose id starts with this.
    pub prefix: Option<String>,
    /// Only those whose id comes after this one (the last of the previous page).
    pub after: Option<String>,
    /// Only those started at or after this time, in milliseconds since the Unix epoch.
    pub started_after: Option<u64>,
    /// Only those started before this time, in milliseconds since the Unix epoch.
    pub started_before: Option<u64>,
    /// At most this many (1 to 1,000; 100 by default).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// With each one's `steps` and what it waits for (`waiting`), as its description has
    /// them: a read of each one's journal; `false` when absent.
    pub progress: Option<bool>,
}

/// Purges what `retention` lets go, a few times a retention (at most every minute, at
/// least every second), until the service is gone.
fn purge_every(service: &std::sync::Weak<Inner>, retention: Duration) {
    let every = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        std::thread::sleep(every);
        let Some(inner) = service.upgrade() else { return };
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        if let Err(error) = (Service { inner }).purge(retention) {
            tracing::error!("cannot purge ended workflows: {error:#}");
        }
    }
}

/// The chores' thread: records the ends that arrive together in one synced batch, and
/// terminates cancelled workflows whose grace has passed; ends with the service.
fn chores(service: &std::sync::Weak<Inner>, work: &std::sync::mpsc::Receiver<Chore>) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut graces: Vec<(std::time::Instant, ProcessHandle)> = Vec::new();
    loop {
        let next = graces.iter().map(|(until, _)| *until).min();
        let wait =
            next.map_or(Duration::from_secs(60), |until| until.saturating_duration_since(std::time::Instant::now()));
        let first = match work.recv_timeout(wait) {
            Ok(chore) => Some(chore),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut ended = Vec::new();
        for chore in first.into_iter().chain(work.try_iter()) {
            match chore {
                Chore::Ended { tenant, id, exited, at_ms } => ended.push((tenant, id, exited, at_ms)),
                Chore::Grace { handle, until } => graces.push((until, handle)),
            }
        }
        let Some(inner) = service.upgrade() else { return };
        #[cfg(test)]
        let _held = inner.hold_ends.lock();
        if !ended.is_empty()
            && let Err(error) = settle(&inner, &ended, Ends::Journaled)
        {
            tracing::error!("cannot record the end of {} workflows: {error:#}", ended.len());
        }
        let now = std::time::Instant::now();
        graces.retain(|(until, handle)| {
            if *until > now {
                return true;
            }
            if handle.try_exit().is_none() {
                let _ = inner.handle.terminate(handle.pid());
            }
            false
        });
    }
}

impl Filter {
    /// The most workflows a page holds.
    pub const MOST: usize = 1000;

    /// How many a page holds: `limit`, 100 when not given.
    ///
    /// # Errors
    ///
    /// A `limit` of 0 or over [`Filter::MOST`].
    pub fn page_size(&self) -> Result<usize, Refusal> {
        match self.limit {
            None => Ok(100),
            Some(limit @ 1..=Filter::MOST) => Ok(limit),
            Some(limit) => Err(Refusal::invalid(format!(
                "`limit` {limit}: a page holds 1 to {} workflows; ask for the next page with `after`",
                Filter::MOST
            ))),
        }
    }
}

/// A page of workflows, as [`Service::workflows`] lists them.
#[derive(Debug, Clone)]
pub struct Listing {
    /// Those the filter selects, in id order.
    pub workflows: Vec<WorkflowRecord>,
    /// How many records the listing read.
    pub examined: usize,
    /// The id of the last record read when more may follow: where the next page starts
    /// (`after`).
    pub next: Option<String>,
}

/// Runs `work` on a thread that may block (synced writes, compiling a component, a
/// process's `init`).
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, Refusal> + Send + 'static) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Refusal::internal(&anyhow::anyhow!("a request's work failed: {e}"))))
}

/// The starts through the API whose checks and spawn (the root's instance and `init`)
/// run at once, each on a thread of the blocking pool; the rest wait their turn, in
/// order, holding no thread. Many more at once only add threads taking turns on the
/// same cores. A slow `init` holds its slot at most for the `init` time limit.
const STARTS_AT_ONCE: usize = 8;

/// How [`Service::begin_start`] left a start.
enum Begun {
    /// The same request started this workflow before.
    Existing(WorkflowRecord),
    /// Started; answered once its spawn is in the journal.
    New(Started),
}

/// A workflow started and not yet answered for.
struct Started {
    record: WorkflowRecord,
    recorded: Recorded,
    _starting: Starting,
}

impl Started {
    /// The start's answer, once the journal's commit of its spawn has `recorded`.
    fn answer(self, recorded: Result<(), String>) -> Result<(WorkflowRecord, bool), Refusal> {
        match recorded {
            Ok(()) => Ok((self.record, true)),
            Err(error) => Err(Refusal::internal(&anyhow::anyhow!(
                "workflow `{}` started, but the journal did not record its start, which a crash may lose: {error}",
                self.record.id
            ))),
        }
    }
}

/// A start's id, held in `starting` from its checks until it is answered, or given up
/// (the request's task dropped while it awaited the journal).
struct Starting {
    inner: Arc<Inner>,
    key: (String, String),
}

impl Drop for Starting {
    fn drop(&mut self) {
        self.inner.starting.lock().remove(&self.key);
        self.inner.started.notify_all();
    }
}

/// The answer to a start of an id that has a workflow: that workflow if `asked` is the
/// same request, else a conflict.
fn same_request(existing: WorkflowRecord, asked: &WorkflowRecord) -> Result<(WorkflowRecord, bool), Refusal> {
    if existing.component == asked.component
        && existing.method == asked.method
        && existing.input == asked.input
        && existing.grants == asked.grants
        && existing.limits == asked.limits
    {
        return Ok((existing, false));
    }
    Err(Refusal::new(
        409,
        "conflict",
        format!(
            "workflow `{}` exists, started as `{}` of `{}` with another request; choose another id, or forget it \
             once it has ended",
            asked.id, existing.method, existing.component
        ),
    ))
}

/// Whether the journal holds the ends [`settle`] records.
#[derive(Clone, Copy, PartialEq)]
enum Ends {
    /// It does (an exit record, or a run of the journal): the registry's record of them
    /// need not be synced, since a server that finds a record running whose run has
    /// ended settles it again (see [`Service::reattach`]).
    Journaled,
    /// It does not (a spawn that failed): the record is all there is, synced.
    Unjournaled,
}

/// Records the workflows' ends in one batch, then wakes those waiting for them (those
/// who are not already: see [`Live::end`]).
fn settle(inner: &Inner, ended: &[(String, String, Exited, u64)], ends: Ends) -> anyhow::Result<()> {
    /// Lowers `settling` when the settle is done, whether it wrote or not.
    struct Settling<'a>(&'a Inner);
    impl Drop for Settling<'_> {
        fn drop(&mut self) {
            self.0.unrecorded.lock().settling -= 1;
            self.0.recorded.notify_all();
        }
    }
    inner.unrecorded.lock().settling += 1;
    let _settling = Settling(inner);
    let mut records = Vec::with_capacity(ended.len());
    for (tenant, id, exited, at_ms) in ended {
        // A workflow in `live` has its record there (and cannot have been forgotten:
        // `forget` waits for it to leave); one that is not is read.
        let watched = inner.live.lock().get(&(tenant.clone(), id.clone())).map(|l| l.record.clone());
        let record = match watched {
            Some(record) => Some(record),
            None => inner.registry.workflow(tenant, id)?,
        };
        if let Some(mut record) = record {
            end_record(&mut record, exited, *at_ms);
            records.push((tenant.as_str(), record));
        }
    }
    match ends {
        Ends::Journaled => inner.registry.put_journaled(&records)?,
        Ends::Unjournaled => inner.registry.put_workflows(&records)?,
    }
    let roots: HashMap<(&str, &str), Pid> =
        records.iter().map(|(tenant, record)| ((*tenant, record.id.as_str()), Pid::from_u64(record.pid))).collect();
    for (tenant, id, _, _) in ended {
        let root = roots.get(&(tenant.as_str(), id.as_str())).copied();
        inner.requests.ended(root, tenant, id);
        inner.logs.ended(root, tenant, id);
    }
    let mut live = inner.live.lock();
    let mut unrecorded = inner.unrecorded.lock();
    for (tenant, record) in &records {
        inner.metrics.ended(record.state.as_str());
        if let Some(live) = live.remove(&((*tenant).to_owned(), record.id.clone())) {
            live.wake_waiters();
            if let Some((exited, _)) = &live.end {
                unrecorded.count(tenant, exited, false);
            }
        }
    }
    // An end whose record was missing (forgotten meanwhile) still wakes its waiters.
    for (tenant, id, _, _) in ended {
        if let Some(live) = live.remove(&(tenant.clone(), id.clone())) {
            live.wake_waiters();
            if let Some((exited, _)) = &live.end {
                unrecorded.count(tenant, exited, false);
            }
        }
    }
    drop(unrecorded);
    inner.settled.notify_all();
    Ok(())
}
