//! [`Builder`]: the scheduler's settings, their defaults and their checks, and starting
//! the threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use crossbeam_deque::{Injector, Worker};
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;

use wasmproc_types::Pid;

use super::caps::Capabilities;
use super::cell::ProcessCell;
use super::commands::Registered;
use super::durable::Durable;
use super::handle::Handle;
use super::hibernation::Hibernating;
use super::idle::Idle;
use super::kinds::Kinds;
use super::recovery::Plan;
use super::registry::{self, Registry};
use super::remote::Remote;
use super::requests::Requests;
use super::retry::Retry;
use super::shared::{DenialHint, Settings, Shared};
use super::shutdown::{Scheduler, Threads};
use super::suspension::{DEFAULT_SUSPEND_AFTER, Suspending};
use super::timer::Timer;
use super::worker;
use crate::handler::{Factory, Handler, KindSource, Provider, Request};
use crate::journal::Journal;
use crate::limits::Limits;

/// Distinguishes schedulers in one OS process, so a worker thread of one never pushes
/// work into another's deque.
static NEXT_SCHEDULER_ID: AtomicUsize = AtomicUsize::new(1);

/// The default of [`Builder::max_processes`]: 1,000,000.
pub const DEFAULT_MAX_PROCESSES: usize = 1_000_000;
/// The default of [`Builder::mailbox_capacity`]: 1024 messages.
pub const DEFAULT_MAILBOX_CAPACITY: usize = 1024;
/// The default of [`Builder::mailbox_bytes`]: 64 MiB.
pub const DEFAULT_MAILBOX_BYTES: usize = 64 << 20;
/// The default of [`Builder::max_yields_per_step`]: 1024 commands.
pub const DEFAULT_MAX_YIELDS_PER_STEP: usize = 1024;
/// The default of [`Builder::max_payload_size`]: 16 MiB.
pub const DEFAULT_MAX_PAYLOAD_SIZE: usize = 16 << 20;
/// The default of [`Builder::max_output_per_step`], as a multiple of
/// [`Builder::max_payload_size`]: four.
pub const DEFAULT_OUTPUT_PER_PAYLOAD: usize = 4;
/// The default of [`Builder::max_children`]: 10,000.
pub const DEFAULT_MAX_CHILDREN: usize = 10_000;
/// The default of [`Builder::max_descendants`]: 100,000.
pub const DEFAULT_MAX_DESCENDANTS: usize = 100_000;
/// The default of [`Builder::max_links`]: 10,000, as many as a process may have
/// children, so a process can link to each of its children.
pub const DEFAULT_MAX_LINKS: usize = 10_000;

/// Configures and starts a [`Scheduler`].
pub struct Builder {
    workers: Option<usize>,
    max_processes: usize,
    mailbox_capacity: usize,
    mailbox_bytes: usize,
    turn_budget: u32,
    limits: Limits,
    /// `None`: four times `max_payload_size`, as it is when the scheduler is built.
    max_output_per_step: Option<usize>,
    capabilities: Capabilities,
    thread_name: String,
    handlers: FxHashMap<String, Arc<dyn Handler>>,
    kinds: Kinds,
    journal: Option<Journal>,
    /// What resumed processes' recorded grants are narrowed to (`Builder::resume_within`).
    resume_within: Option<Capabilities>,
    denial_hint: Option<DenialHint>,
    /// Build only to replay the journal's unfinished processes (see `verify_journal`).
    verifying: bool,
    /// The node in a cluster and where work for other nodes goes (`Builder::cluster`).
    node: u16,
    remote: Option<Arc<dyn Remote>>,
    /// `remote` takes a shard's messages to other shards (`Builder::shard_remote`), which
    /// a durable scheduler may have.
    remote_shards: bool,
    /// How its durable roots' traps are retried (`Builder::retry`).
    retry: Option<Retry>,
    /// When a waiting durable process is suspended (`Builder::suspend_after`).
    suspend_after: Option<Duration>,
    /// How long a waiting process waits before it hibernates (`Builder::hibernate_after`).
    hibernate_after: Duration,
    /// Steps between two snapshots of a durable process (`Builder::snapshot_every`).
    snapshot_every: Option<u64>,
}

/// A provider as the handler of its family.
struct ProviderHandler<P>(P);

impl<P: Provider> Handler for ProviderHandler<P> {
    fn handle(&self, request: Request<'_>) {
        self.0.handle(request);
    }

    fn reads_only(&self, name: &str) -> bool {
        self.0.reads_only(name)
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            workers: None,
            max_processes: DEFAULT_MAX_PROCESSES,
            mailbox_capacity: DEFAULT_MAILBOX_CAPACITY,
            mailbox_bytes: DEFAULT_MAILBOX_BYTES,
            turn_budget: 16,
            limits: Limits {
                max_yields_per_step: DEFAULT_MAX_YIELDS_PER_STEP,
                max_payload_size: DEFAULT_MAX_PAYLOAD_SIZE,
                max_output_per_step: 0,
                max_children: DEFAULT_MAX_CHILDREN,
                max_descendants: DEFAULT_MAX_DESCENDANTS,
                max_links: DEFAULT_MAX_LINKS,
            },
            max_output_per_step: None,
            capabilities: Capabilities::default(),
            thread_name: "wasmproc".to_owned(),
            handlers: FxHashMap::default(),
            kinds: Kinds::default(),
            journal: None,
            resume_within: None,
            denial_hint: None,
            verifying: false,
            node: 0,
            remote: None,
            remote_shards: false,
            retry: None,
            suspend_after: Some(DEFAULT_SUSPEND_AFTER),
            hibernate_after: super::DEFAULT_HIBERNATE_AFTER,
            snapshot_every: None,
        }
    }
}

impl Scheduler {
    /// A builder with default settings.
    pub fn builder() -> Builder {
        Builder::new()
    }
}

impl Builder {
    /// A builder with the defaults below.
    pub fn new() -> Self {
        Self::default()
    }

    /// Worker threads. By default, the machine's available parallelism.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Processes alive at once; a spawn past it fails with
    /// [`SpawnError::LimitExceeded`](crate::error::SpawnError::LimitExceeded). By default 1,000,000.
    pub fn max_processes(mut self, max: usize) -> Self {
        self.max_processes = max;
        self
    }

    /// Undelivered messages a process's mailbox holds before sends to it fail with
    /// [`SendError::MailboxFull`](crate::error::SendError::MailboxFull). By default 1024: at about 100 bytes an entry plus the
    /// bodies (which [`Builder::mailbox_bytes`] bounds), a flooded process holds ~100 KiB
    /// of backlog, not unbounded memory.
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = capacity;
        self
    }

    /// The bytes of undelivered messages (topics and bodies) a process's mailbox holds
    /// before sends to it fail with
    /// [`SendError::MailboxFull`](crate::error::SendError::MailboxFull), whatever their
    /// count: a receiver that does not read costs its senders at most this much memory.
    /// An empty mailbox takes any one message (up to the payload limit), so a message
    /// larger than this waits until the receiver has read the rest. By default 64 MiB.
    pub fn mailbox_bytes(mut self, bytes: usize) -> Self {
        self.mailbox_bytes = bytes;
        self
    }

    /// The most commands one step may yield; a step that yields more ends its process
    /// with an error naming this limit. By default 1024.
    pub fn max_yields_per_step(mut self, yields: usize) -> Self {
        self.limits.max_yields_per_step = yields;
        self
    }

    /// The largest payload, in bytes, a process may put in a command (a message's topic
    /// and body together, a spawn's input, a custom command's payload) or return as its
    /// result; a process that tries to ends with an error naming this limit. By default
    /// 16 MiB.
    pub fn max_payload_size(mut self, bytes: usize) -> Self {
        self.limits.max_payload_size = bytes;
        self
    }

    /// The most bytes one step's commands carry together (as [`Builder::max_payload_size`]
    /// counts each: messages, spawn inputs, custom payloads), and the result of a step
    /// that completes; a step past it ends its process with an error naming this limit.
    /// Each command is bounded by `max_payload_size`, but a step may yield
    /// `max_yields_per_step` of them: without this bound, 1,024 × 16 MiB copied out of one
    /// step before anything is dispatched. A Wasm process's output is looked at as it is
    /// lifted: the commands past the bound are not copied into the host. At least
    /// `max_payload_size`; by default four times it (64 MiB).
    pub fn max_output_per_step(mut self, bytes: usize) -> Self {
        self.max_output_per_step = Some(bytes);
        self
    }

    /// The most live children a process may have at once; a `spawn` past it ends the
    /// spawning process with an error naming this limit (the host-wide
    /// [`Builder::max_processes`] still bounds every process tree together). By default
    /// 10,000.
    pub fn max_children(mut self, children: usize) -> Self {
        self.limits.max_children = children;
        self
    }

    /// The most processes one process may be linked to at once: a `link` (or a spawn
    /// with `link`) past it fails with an error naming this limit, so that a process
    /// cannot make another hold links without bound. A link ends when either process
    /// does, or with `unlink`. By default 10,000.
    pub fn max_links(mut self, links: usize) -> Self {
        self.limits.max_links = links;
        self
    }

    /// The most live processes one process tree may hold: everything a process spawned
    /// from the embedder (a root) spawned, and what those spawned, at any depth. A
    /// `spawn` past it ends the spawning process with an error naming this limit, so a
    /// spawn bomb uses up its own quota instead of `max_processes`, which every tree
    /// shares. Checked per step against a count that spawns on other workers update
    /// concurrently: it may be passed by the spawns of steps running at that moment. By
    /// default 100,000.
    pub fn max_descendants(mut self, processes: usize) -> Self {
        self.limits.max_descendants = processes;
        self
    }

    /// Steps a process may take back to back while completions keep arriving during its
    /// steps, before it goes to the back of the global queue. By default 16: enough that
    /// a process whose commands complete synchronously runs a burst without touching a
    /// shared queue, few enough that it cannot hold a worker for long. Picked by
    /// measurement on the yield-cycle benchmark; not sensitive between 8 and 64.
    pub fn turn_budget(mut self, steps: u32) -> Self {
        self.turn_budget = steps;
        self
    }

    /// How long a process must have waited (for a message, a timer, a command's
    /// completion) before a worker with nothing else to run hibernates it: a Wasm process
    /// then gives back its whole instance, keeping only what differs from its component's
    /// initial image, or where it cannot, its fiber stack's pages (see
    /// [`Config::hibernate_instances`](crate::wasm::Config::hibernate_instances)). Its
    /// next event makes it again before its step. By default 10 ms: past a journal's commit
    /// or a round trip between workers (well under a millisecond), so that a process only
    /// hibernates when it waits for something slow; its next step then costs it a new
    /// instance (tens of microseconds for a Rust guest) against a wait a hundred times
    /// that. [`DEFAULT_HIBERNATE_AFTER`](super::DEFAULT_HIBERNATE_AFTER).
    pub fn hibernate_after(mut self, after: Duration) -> Self {
        self.hibernate_after = after;
        self
    }

    /// What processes spawned by the embedder may yield, unless their
    /// [`SpawnOptions`](super::SpawnOptions) say otherwise. By default [`Capabilities::default`]: built-ins
    /// granted, custom commands denied.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Narrows the grants of the processes resumed from the journal to what `bound`
    /// grants: each resumes with its recorded grants intersected with `bound`
    /// ([`Capabilities::intersect`]), so a resume can take grants away (a command denied
    /// since) but never add one the process was not spawned with. By default a resumed
    /// process keeps its recorded grants, whatever [`Builder::capabilities`] says now.
    pub fn resume_within(mut self, bound: Capabilities) -> Self {
        self.resume_within = Some(bound);
        self
    }

    /// Prefix of the scheduler's thread names. By default `wasmproc`.
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Registers `handler` for the custom command `name`; a name `family.*` registers it
    /// for every command `family.<anything>` without a handler of its own.
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(name.into(), Arc::new(handler));
        self
    }

    /// Registers `provider` for its family of commands (`kv.*` for the key-value
    /// store). Processes still need the commands granted: `Capabilities::allow("kv.*")`
    /// grants the family.
    pub fn provider(self, provider: impl Provider) -> Self {
        let name = format!("{}.*", provider.family());
        self.handler(name, ProviderHandler(provider))
    }

    /// How to grant a command, added to the error of a process denied it:
    /// `permission denied: terminate (HINT)`. The command line says which flag grants it.
    pub fn denial_hint(mut self, hint: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        self.denial_hint = Some(Box::new(hint));
        self
    }

    /// Registers a process kind: `spawn` commands and [`Spawnable::kind`](super::Spawnable::kind) name it.
    /// Every scheduler has the built-in kind `supervisor` ([`crate::supervisor`]) unless
    /// one is registered under that name.
    pub fn kind(mut self, name: impl Into<String>, factory: impl Factory) -> Self {
        self.kinds.insert(name.into().into(), Arc::new(factory));
        self
    }

    /// Resolves the kinds no [`Builder::kind`] registered when a spawn (or a resume)
    /// first asks for them: see [`KindSource`].
    pub fn kind_source(mut self, source: impl KindSource) -> Self {
        self.kinds.set_source(Arc::new(source));
        self
    }

    /// Makes every process durable: its history goes to `journal`, and nothing of a step
    /// takes effect outside its process before the step's record is committed (what only
    /// reads goes on at once). See [`crate::journal`].
    pub fn journal(mut self, journal: Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// How long a durable process (one of a scheduler with a [`Builder::journal`], made
    /// by a registered kind) may wait before it is **suspended**: its process (a Wasm
    /// process's instance, store and fiber) is dropped, and only its entry in the
    /// registry stays (its mailbox, monitors, links and timers). Its next event (a
    /// message, a timer, an exit, a command's completion, a cancel) brings it back: it is
    /// made again by its kind and replayed from its journal, then given the event.
    /// Nothing is written to the journal for it, so a crash while processes are suspended
    /// recovers as any other. `None` never suspends. Default:
    /// [`DEFAULT_SUSPEND_AFTER`] (10 s). A scheduler without a journal never suspends.
    ///
    /// A worker suspends processes only when it has nothing else to run, and at most
    /// one wait of the threshold after the process last stepped (it may wait up to
    /// twice the threshold). A process whose history can no longer be replayed (its
    /// component changed, its replay diverges) ends with an error naming why when it is
    /// woken.
    pub fn suspend_after(mut self, after: Option<Duration>) -> Self {
        self.suspend_after = after;
        self
    }

    /// Takes a **snapshot** of a durable process (one of a scheduler with a
    /// [`Builder::journal`]) every `steps` steps: its state ([`Process::snapshot`]) and
    /// what its records tell a recovery (what is under way, whom it watches, which
    /// messages it took and which it sent that may not have been taken), written to the
    /// journal in one batch with the removal of every record before it. A recovery, or a
    /// suspended process's return, then starts from the snapshot
    /// ([`Process::restore`]) and replays only the steps after it, and a process that
    /// steps for ever holds at most about `steps` records (plus one message for each it
    /// sent to a live process that has not taken it, and each it was sent and has not
    /// taken). A process that cannot be captured ([`Process::snapshot`] says `None`: a
    /// Wasm process of a component that hibernation cannot capture, or one waiting
    /// inside a step) keeps its records, and is asked again `steps` steps later.
    /// `None` (the default) takes none. A scheduler without a journal takes none.
    ///
    /// [`Process::snapshot`]: crate::Process::snapshot
    /// [`Process::restore`]: crate::Process::restore
    pub fn snapshot_every(mut self, steps: Option<u64>) -> Self {
        self.snapshot_every = steps;
        self
    }

    /// Retries a durable root (a process the embedder spawned) that traps from its last
    /// journaled step, as `retry`'s policy admits: the scheduler suspends as a crash at
    /// the trap would, and the embedder builds a scheduler on the journal again after the
    /// retry's delay ([`Retry::take`]); past the policy the trap is the root's end. Needs
    /// a journal. See [`Retry`]. By default a trap ends the process.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Makes this scheduler node `node`, handing what names a process of another node to
    /// `remote` (see `remote.rs`); the public face is `Builder::cluster`, in the cluster
    /// module, which the scheduler does not depend on.
    #[cfg_attr(not(feature = "cluster"), expect(dead_code, reason = "only a cluster hands work to other nodes"))]
    pub(crate) fn remote(mut self, node: u16, remote: Arc<dyn Remote>) -> Self {
        self.node = node;
        self.remote = Some(remote);
        self
    }

    /// Makes this scheduler shard `node`'s durable scheduler (see `cluster/shards.rs`),
    /// handing what names a process of another shard to `remote`: its messages, which
    /// `remote` delivers exactly once, recorded in the receiver's journal.
    #[cfg_attr(not(feature = "cluster"), expect(dead_code, reason = "only a cluster has shards"))]
    pub(crate) fn shard_remote(mut self, node: u16, remote: Arc<dyn Remote>) -> Self {
        self.node = node;
        self.remote = Some(remote);
        self.remote_shards = true;
        self
    }

    /// Starts the worker threads and the timer thread.
    ///
    /// # Errors
    ///
    /// An out-of-range setting (zero or too many workers, zero mailbox capacity or
    /// process limit, a handler named like a built-in command), or a thread that could
    /// not be started.
    pub fn build(self) -> anyhow::Result<Scheduler> {
        let workers = match self.workers {
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let max_workers = registry::MAX_SHARDS - 1;
        ensure!((1..=max_workers).contains(&workers), "`workers` must be between 1 and {max_workers}, got {workers}");
        ensure!(self.max_processes > 0, "`max_processes` must be at least 1");
        ensure!(self.mailbox_capacity > 0, "`mailbox_capacity` must be at least 1");
        ensure!(self.mailbox_bytes > 0, "`mailbox_bytes` must be at least 1");
        ensure!(self.turn_budget > 0, "`turn_budget` must be at least 1");
        let mut limits = self.limits;
        limits.max_output_per_step = match self.max_output_per_step {
            Some(bytes) => {
                ensure!(
                    bytes >= limits.max_payload_size,
                    "`max_output_per_step` ({bytes} bytes) must be at least `max_payload_size` ({} bytes)",
                    limits.max_payload_size
                );
                bytes
            }
            None => limits.max_payload_size.saturating_mul(DEFAULT_OUTPUT_PER_PAYLOAD),
        };
        ensure!(
            self.retry.is_none() || self.journal.is_some(),
            "`retry` retries a durable process from its last journaled step, and this scheduler has no journal"
        );
        ensure!(
            self.remote.is_none() || self.journal.is_none() || self.remote_shards,
            "a scheduler cannot be both durable (a journal) and a cluster node: durable processes do not cross nodes yet"
        );
        let mut handlers = FxHashMap::default();
        let mut families = FxHashMap::default();
        let mut commands = Vec::with_capacity(self.handlers.len());
        for (name, handler) in self.handlers {
            if name.is_empty() || Capabilities::BUILTIN.contains(&name.as_str()) {
                bail!("cannot register a handler named `{name}`: the name is empty or a built-in command");
            }
            match name.strip_suffix(".*") {
                Some(family) => {
                    ensure!(
                        !family.is_empty() && !family.contains(['.', '*']),
                        "cannot register a handler named `{name}`: a family is one word before `.*`"
                    );
                    families.insert(family.to_owned(), commands.len());
                    commands.push(Registered { name, handler });
                }
                None => {
                    ensure!(
                        !name.contains('*'),
                        "cannot register a handler named `{name}`: `*` only ends a family name"
                    );
                    handlers.insert(name.clone(), commands.len());
                    commands.push(Registered { name, handler });
                }
            }
        }

        let mut kinds = self.kinds;
        kinds.insert_if_absent(crate::supervisor::KIND, || Arc::new(crate::supervisor::SupervisorKind));

        let queues: Vec<Worker<Arc<ProcessCell>>> = (0..workers).map(|_| Worker::new_lifo()).collect();
        let (timer, timer_thread) = Timer::start(&self.thread_name).context("failed to start the timer thread")?;
        let (durable, plan) = match &self.journal {
            Some(journal) => {
                let plan = Plan::read(journal)?;
                plan.check(&kinds)?;
                let durable = Durable::start(&self.thread_name, journal, self.snapshot_every)
                    .context("failed to start the journal's thread")?;
                (Some(durable), Some(plan))
            }
            None => (None, None),
        };
        // One shard per worker and one for every other thread, and as many as the pids
        // of the journal's processes name.
        let shards = (workers + 1).max(plan.as_ref().map_or(0, Plan::shards));
        let shared = Arc::new(Shared {
            id: NEXT_SCHEDULER_ID.fetch_add(1, Ordering::Relaxed),
            injector: Injector::new(),
            stealers: queues.iter().map(Worker::stealer).collect(),
            slots: queues.iter().map(|_| CachePadded::default()).collect(),
            idle: Idle::new(),
            registry: Registry::new(shards, self.node),
            counters: (0..=workers).map(|_| CachePadded::default()).collect(),
            live: AtomicUsize::new(0),
            retiring: AtomicUsize::new(0),
            hibernating: Mutex::new(Hibernating::new(self.hibernate_after)),
            to_suspend: Mutex::new(Suspending::default()),
            suspended: AtomicUsize::new(0),
            peak_live: AtomicUsize::new(0),
            settings: Settings {
                workers,
                max_processes: self.max_processes,
                mailbox_capacity: self.mailbox_capacity,
                mailbox_bytes: self.mailbox_bytes,
                turn_budget: self.turn_budget,
                suspend_after: self.suspend_after.filter(|_| self.journal.is_some()),
                limits,
                capabilities: Arc::new(self.capabilities),
                denial_hint: self.denial_hint,
            },
            handlers,
            families,
            commands,
            kinds,
            requests: Requests::default(),
            timer,
            durable,
            node: self.node,
            remote: self.remote,
            run_processes: Mutex::default(),
            retry: self.retry,
            suspending: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            drained_lock: Mutex::new(()),
            drained: Condvar::new(),
        });
        let scheduler = Scheduler {
            handle: Handle { shared: shared.clone() },
            threads: Mutex::new(Some(Threads { workers: Vec::with_capacity(workers), timer: timer_thread })),
            resumed: Mutex::new(Vec::new()),
            verdicts: Mutex::new(Vec::new()),
        };
        for (index, queue) in queues.into_iter().enumerate() {
            let shared = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{}-worker-{index}", self.thread_name))
                .spawn(move || worker::run(shared, index, queue))
                .with_context(|| format!("failed to start worker thread {index}"))?;
            if let Some(threads) = scheduler.threads.lock().as_mut() {
                threads.workers.push(thread);
            }
        }
        if let Some(plan) = plan {
            if self.verifying {
                *scheduler.verdicts.lock() = plan.verify(&shared, self.resume_within.as_ref());
            } else {
                *scheduler.resumed.lock() = plan.restore(&shared, self.resume_within.as_ref());
            }
        }
        Ok(scheduler)
    }

    /// Replays every unfinished process of the journal given to [`Builder::journal`]
    /// against its records, without resuming anything or running any command: what
    /// resuming would find. One verdict a process, in pid order: the number of steps
    /// replayed, or why the replay failed (a non-determinism error names the step and
    /// both versions). Nothing is written to the journal.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`], and no journal was given.
    pub fn verify_journal(mut self) -> anyhow::Result<Vec<(Pid, Result<usize, String>)>> {
        ensure!(self.journal.is_some(), "`verify_journal` needs a journal (`Builder::journal`)");
        self.verifying = true;
        let scheduler = self.build()?;
        let verdicts = std::mem::take(&mut *scheduler.verdicts.lock());
        scheduler.stop(std::time::Duration::ZERO);
        Ok(verdicts)
    }
}
