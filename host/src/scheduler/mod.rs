//! The work-stealing process scheduler.
//!
//! - `state.rs`: the per-process state word and the wakeup protocol (read it first);
//! - `events.rs`: the per-process inbox (MPSC event queue, mailbox bound, watchers);
//! - `cell.rs`: one process as the scheduler holds it, and the worker's turn;
//! - `worker.rs`: the worker loop (local deque, global injector, stealing);
//! - `idle.rs`: searching and parked workers;
//! - `registry.rs`: pid → process routing;
//! - this file: the public API and the process lifecycle (spawn, send, terminate,
//!   finalize, stop).
//!
//! # Shutdown
//!
//! [`Scheduler::stop`]:
//! 1. marks the scheduler stopping: every later spawn fails with [`SpawnError::Stopping`];
//! 2. sends [`Event::Cancel`] to every live process;
//! 3. waits until no process is left, or the grace period ends;
//! 4. then terminates whatever is left (repeating for processes whose spawn raced step 1)
//!    and waits for them: a process in the middle of a step ends when the step returns;
//! 5. shuts the workers and the timer down and joins their threads.
//!
//! So when `stop` returns no step is running, every process has been closed, and every
//! thread the scheduler started has exited.

pub(crate) mod cell;
mod events;
pub(crate) mod handle;
mod idle;
mod registry;
pub(crate) mod state;
pub(crate) mod worker;

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use crossbeam_deque::{Injector, Stealer, Worker};
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;

use self::cell::{ProcessCell, Spec, Watcher};
use self::handle::ExitSlot;
pub use self::handle::ProcessHandle;
use self::idle::Idle;
use self::registry::Registry;
use self::state::Wake;
use self::worker::Task;
use crate::caps::{BUILTIN_COMMANDS, Capabilities};
use crate::dispatch::timer::Timer;
use crate::dispatch::{Factory, Handler};
use crate::error::{SendError, SpawnError};
use crate::process::{Command, Event, Outcome, Payload, Pid, Process, Yield};

/// Distinguishes schedulers in one OS process, so a worker thread of one never pushes
/// work into another's deque.
static NEXT_SCHEDULER_ID: AtomicUsize = AtomicUsize::new(1);

/// The hibernation list's length below which it is never pruned, so that a scheduler
/// with few live processes does not prune at every listing. Picked out of thin air: 16
/// KiB of pids.
const HIBERNATION_LIST_FLOOR: usize = 2048;

pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) max_processes: usize,
    pub(crate) mailbox_capacity: usize,
    pub(crate) turn_budget: u32,
    pub(crate) capabilities: Arc<Capabilities>,
    pub(crate) limits: Limits,
}

/// Limits on what one process may do, checked by the scheduler for every process
/// (native or Wasm). A process past one of them ends with an error naming it (DESIGN §6):
/// the limits exist to stop misbehaving processes, not to be negotiated with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_yields_per_step: usize,
    pub(crate) max_payload_size: usize,
    pub(crate) max_children: usize,
    pub(crate) max_descendants: usize,
}

/// The bytes a message counts against `max_payload_size`, whether yielded as a `send`
/// command or sent with the `send` host function: its topic travels with the body into
/// the receiver's mailbox.
pub(crate) fn message_size(topic: &str, body: &Payload) -> usize {
    topic.len() + body.data.len()
}

impl Limits {
    /// Checks one step's yields, from a process that has `children` live children in a
    /// tree of `tree` live descendants: the error ends the process, and none of the
    /// yields is carried out.
    pub(crate) fn check(&self, yields: &[Yield], children: usize, tree: usize) -> Result<(), String> {
        if yields.len() > self.max_yields_per_step {
            return Err(format!(
                "yield limit exceeded: one step yielded {} commands, more than `max_yields_per_step` ({})",
                yields.len(),
                self.max_yields_per_step
            ));
        }
        let mut spawns = 0;
        for y in yields {
            let size = match &y.command {
                Command::Send { topic, body, .. } => message_size(topic, body),
                Command::Spawn(request) => {
                    spawns += 1;
                    request.input.iter().map(|p| p.data.len()).sum()
                }
                Command::Custom { payload, .. } => payload.data.len(),
                Command::Sleep(_) | Command::Monitor(_) | Command::Terminate(_) => 0,
            };
            self.check_payload(size, y.command.name())?;
        }
        if children + spawns > self.max_children {
            return Err(format!(
                "child limit exceeded: {spawns} more spawns with {children} children alive would pass \
                 `max_children` ({})",
                self.max_children
            ));
        }
        if tree + spawns > self.max_descendants {
            return Err(format!(
                "process tree limit exceeded: {spawns} more spawns with {tree} processes alive in this process's \
                 tree would pass `max_descendants` ({})",
                self.max_descendants
            ));
        }
        Ok(())
    }

    /// Checks a payload of `size` bytes that a process hands to `what`.
    pub(crate) fn check_payload(&self, size: usize, what: &str) -> Result<(), String> {
        if size > self.max_payload_size {
            return Err(format!(
                "payload limit exceeded: a {size}-byte payload for `{what}` is over `max_payload_size` ({} bytes)",
                self.max_payload_size
            ));
        }
        Ok(())
    }
}

/// Configures and starts a [`Scheduler`].
pub struct Builder {
    workers: Option<usize>,
    max_processes: usize,
    mailbox_capacity: usize,
    turn_budget: u32,
    limits: Limits,
    capabilities: Capabilities,
    thread_name: String,
    handlers: FxHashMap<String, Arc<dyn Handler>>,
    kinds: FxHashMap<Arc<str>, Arc<dyn Factory>>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            workers: None,
            max_processes: 1_000_000,
            mailbox_capacity: 1024,
            turn_budget: 16,
            limits: Limits {
                max_yields_per_step: 1024,
                max_payload_size: 16 << 20,
                max_children: 10_000,
                max_descendants: 100_000,
            },
            capabilities: Capabilities::default(),
            thread_name: "wasmproc".to_owned(),
            handlers: FxHashMap::default(),
            kinds: FxHashMap::default(),
        }
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
    /// [`SpawnError::LimitExceeded`]. By default 1,000,000.
    pub fn max_processes(mut self, max: usize) -> Self {
        self.max_processes = max;
        self
    }

    /// Undelivered messages a process's mailbox holds before sends to it fail with
    /// [`SendError::MailboxFull`]. By default 1024: at about 100 bytes an entry plus the
    /// bodies, a flooded process holds ~100 KiB of backlog, not unbounded memory.
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = capacity;
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

    /// The most live children a process may have at once; a `spawn` past it ends the
    /// spawning process with an error naming this limit (the host-wide
    /// [`Builder::max_processes`] still bounds every process tree together). By default
    /// 10,000.
    pub fn max_children(mut self, children: usize) -> Self {
        self.limits.max_children = children;
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

    /// What processes spawned by the embedder may yield, unless their
    /// [`SpawnOptions`] say otherwise. By default [`Capabilities::default`]: built-ins
    /// granted, custom commands denied.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Prefix of the scheduler's thread names. By default `wasmproc`.
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Registers `handler` for the custom command `name`.
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(name.into(), Arc::new(handler));
        self
    }

    /// Registers a process kind: `spawn` commands and [`Handle::spawn_kind`] name it.
    pub fn kind(mut self, name: impl Into<String>, factory: impl Factory) -> Self {
        self.kinds.insert(name.into().into(), Arc::new(factory));
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
        ensure!(self.turn_budget > 0, "`turn_budget` must be at least 1");
        for name in self.handlers.keys() {
            if name.is_empty() || BUILTIN_COMMANDS.contains(&name.as_str()) {
                bail!("cannot register a handler named `{name}`: the name is empty or a built-in command");
            }
        }

        let queues: Vec<Worker<Task>> = (0..workers).map(|_| Worker::new_lifo()).collect();
        let (timer, timer_thread) = Timer::start(&self.thread_name).context("failed to start the timer thread")?;
        let shared = Arc::new(Shared {
            id: NEXT_SCHEDULER_ID.fetch_add(1, Ordering::Relaxed),
            injector: Injector::new(),
            stealers: queues.iter().map(Worker::stealer).collect(),
            idle: Idle::new(),
            // One shard per worker and one for every other thread.
            registry: Registry::new(workers + 1),
            counters: (0..=workers).map(|_| CachePadded::default()).collect(),
            live: AtomicUsize::new(0),
            retiring: AtomicUsize::new(0),
            hibernating: Mutex::new(Vec::new()),
            peak_live: AtomicUsize::new(0),
            config: Config {
                workers,
                max_processes: self.max_processes,
                mailbox_capacity: self.mailbox_capacity,
                turn_budget: self.turn_budget,
                limits: self.limits,
                capabilities: Arc::new(self.capabilities),
            },
            handlers: self.handlers,
            kinds: self.kinds,
            timer,
            stopping: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            drained_lock: Mutex::new(()),
            drained: Condvar::new(),
        });
        let scheduler = Scheduler {
            handle: Handle { shared: shared.clone() },
            threads: Mutex::new(Some(Threads { workers: Vec::with_capacity(workers), timer: timer_thread })),
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
        Ok(scheduler)
    }
}

/// The scheduler: owns the worker threads. Dropping it stops it with no grace period
/// (see [`Scheduler::stop`]).
///
/// It dereferences to its [`Handle`], which has the API to spawn and message processes;
/// clone the handle to use it from elsewhere.
pub struct Scheduler {
    handle: Handle,
    threads: Mutex<Option<Threads>>,
}

struct Threads {
    workers: Vec<JoinHandle<()>>,
    timer: JoinHandle<()>,
}

/// What [`Scheduler::stop`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StopReport {
    /// Processes that were sent a cancel.
    pub cancelled: usize,
    /// Processes still alive at the deadline, terminated.
    pub forced: usize,
    /// How long the stop took.
    pub elapsed: Duration,
}

impl Scheduler {
    /// A builder with default settings.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// A handle to spawn and message processes from anywhere.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the scheduler: cancels every process, gives them `grace` to finish,
    /// terminates the rest, and joins every thread. See the module docs, "Shutdown".
    /// A second call returns at once with an empty report.
    ///
    /// A native process whose step never returns keeps `stop` from returning: steps are
    /// not preemptible from outside (Wasm steps are: terminating a preempted one drops it).
    ///
    /// # Panics
    ///
    /// If called from one of this scheduler's own worker threads (it would wait for
    /// itself).
    pub fn stop(&self, grace: Duration) -> StopReport {
        let shared = &self.handle.shared;
        assert!(
            worker::current_index(shared.id).is_none(),
            "`Scheduler::stop` called from one of its own worker threads"
        );
        let mut threads = self.threads.lock();
        let Some(taken) = threads.take() else { return StopReport::default() };
        let start = Instant::now();
        shared.stopping.store(true, Ordering::SeqCst);

        let cancelled = self.handle.cancel_all("shutdown");
        let mut forced = 0;
        if !shared.wait_drained(Some(start + grace)) {
            // Spawns that passed the stopping check before it was set may still be
            // registering: sweep until nothing is left.
            loop {
                forced += self.handle.terminate_all("terminated: shutdown deadline exceeded");
                if shared.wait_drained(Some(Instant::now() + Duration::from_millis(50))) {
                    break;
                }
            }
        }

        shared.shut_down.store(true, Ordering::SeqCst);
        shared.idle.shutdown();
        shared.timer.shutdown();
        for thread in taken.workers {
            // A worker only panics on a broken scheduler invariant; the panic message has
            // been printed by then and there is nothing left to clean up here.
            let _ = thread.join();
        }
        let _ = taken.timer.join();
        StopReport { cancelled, forced, elapsed: start.elapsed() }
    }
}

impl std::ops::Deref for Scheduler {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if !std::thread::panicking() || worker::current_index(self.handle.shared.id).is_none() {
            self.stop(Duration::ZERO);
        }
    }
}

/// How to spawn a process from the embedder.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    method: String,
    input: Vec<Payload>,
    capabilities: Option<Capabilities>,
    mailbox_capacity: Option<usize>,
}

impl SpawnOptions {
    /// Runs entry `method`, with no input, the scheduler's default capabilities and
    /// mailbox capacity.
    pub fn new(method: impl Into<String>) -> Self {
        SpawnOptions { method: method.into(), ..Self::default() }
    }

    /// The entry method's input.
    pub fn input(mut self, input: Vec<Payload>) -> Self {
        self.input = input;
        self
    }

    /// What the process (and, at most, its children) may yield.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = Some(capabilities);
        self
    }

    /// This process's mailbox bound.
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = Some(capacity);
        self
    }
}

/// Spawns, messages and inspects processes. Cheap to clone; usable from any thread,
/// including from command handlers.
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    /// Initialises `process` with entry `method` and `input` and queues it.
    ///
    /// # Errors
    ///
    /// See [`SpawnError`]: init failures (unknown method…), the process limit, stopping.
    pub fn spawn(&self, process: impl Process, method: &str, input: Vec<Payload>) -> Result<ProcessHandle, SpawnError> {
        self.spawn_with(Box::new(process), SpawnOptions::new(method).input(input))
    }

    /// Spawns a process of the registered `kind`.
    ///
    /// # Errors
    ///
    /// As [`Handle::spawn`], and [`SpawnError::UnknownKind`] / [`SpawnError::Factory`].
    pub fn spawn_kind(&self, kind: &str, method: &str, input: Vec<Payload>) -> Result<ProcessHandle, SpawnError> {
        self.spawn_kind_with(kind, SpawnOptions::new(method).input(input))
    }

    /// Spawns a process of the registered `kind` with explicit options (its capabilities,
    /// which bound its children's, or its mailbox).
    ///
    /// # Errors
    ///
    /// As [`Handle::spawn_kind`].
    pub fn spawn_kind_with(&self, kind: &str, options: SpawnOptions) -> Result<ProcessHandle, SpawnError> {
        let (name, factory) =
            self.shared.kinds.get_key_value(kind).ok_or_else(|| SpawnError::UnknownKind(kind.to_owned()))?;
        let process = factory.make().map_err(|source| SpawnError::Factory { kind: kind.to_owned(), source })?;
        self.spawn_inner(process, Some(name.clone()), options)
    }

    /// Spawns `process` with explicit options.
    ///
    /// # Errors
    ///
    /// As [`Handle::spawn`].
    pub fn spawn_with(&self, process: Box<dyn Process>, options: SpawnOptions) -> Result<ProcessHandle, SpawnError> {
        self.spawn_inner(process, None, options)
    }

    fn spawn_inner(
        &self,
        process: Box<dyn Process>,
        kind: Option<Arc<str>>,
        options: SpawnOptions,
    ) -> Result<ProcessHandle, SpawnError> {
        let shared = &self.shared;
        let slot = Arc::new(ExitSlot::default());
        let args = SpawnArgs {
            kind,
            method: options.method,
            input: options.input,
            caps: options.capabilities.map_or_else(|| shared.config.capabilities.clone(), Arc::new),
            mailbox_capacity: options.mailbox_capacity.unwrap_or(shared.config.mailbox_capacity).max(1),
            watcher: Some(Watcher::Handle(slot.clone())),
            parent: None,
        };
        let cell = shared.spawn_unqueued(process, args)?;
        let handle = ProcessHandle::new(cell.pid(), slot);
        shared.schedule(cell);
        Ok(handle)
    }

    /// Puts a message from the embedder (sender [`Pid::HOST`]) in `to`'s mailbox.
    ///
    /// # Errors
    ///
    /// See [`SendError`]: unknown or finished process, exiting process, full mailbox.
    pub fn send(&self, to: Pid, topic: impl Into<String>, body: Payload) -> Result<(), SendError> {
        self.shared.send(Pid::HOST, to, topic.into(), body)
    }

    /// Ends `pid` with the result `Err("terminated")`. Returns once termination is
    /// requested; the process ends when its current step (if any) returns, which its
    /// [`ProcessHandle`] and its monitors observe.
    ///
    /// # Errors
    ///
    /// [`SendError::NotFound`] or [`SendError::Closed`] if it has ended or is ending.
    pub fn terminate(&self, pid: Pid) -> Result<(), SendError> {
        let cell = self.shared.registry.get(pid).ok_or(SendError::NotFound(pid))?;
        self.shared.terminate_cell(&cell, "terminated")
    }

    /// Delivers a cancel event with `reason` to every live process (what [`Scheduler::stop`]
    /// does first), and returns how many it reached. Processes decide what to do: the
    /// guest SDK ends the process unless it handles cancellation.
    pub fn cancel_all(&self, reason: &str) -> usize {
        let mut reached = 0;
        for cell in self.shared.registry.snapshot() {
            if let Ok(wake) = cell.deliver(Event::Cancel { reason: reason.to_owned() }) {
                reached += 1;
                if let Wake::Schedule = wake {
                    self.shared.schedule(cell);
                }
            }
        }
        reached
    }

    /// Ends every live process at once with the error `reason` (as [`Handle::terminate`]
    /// does one), and returns how many it ended. A process in the middle of a step ends
    /// when the step returns.
    pub fn terminate_all(&self, reason: &'static str) -> usize {
        let cells = self.shared.registry.snapshot();
        cells.iter().filter(|cell| self.shared.terminate_cell(cell, reason).is_ok()).count()
    }

    /// Processes alive now.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Processes in the registry now (equal to [`Handle::live`] whenever no spawn or
    /// exit is in flight).
    pub fn registered(&self) -> usize {
        self.shared.registry.len()
    }

    /// Blocks until no process is alive, or `timeout` passes: true if none is.
    pub fn wait_idle(&self, timeout: Option<Duration>) -> bool {
        self.shared.wait_drained(timeout.map(|t| Instant::now() + t))
    }

    /// Whether [`Scheduler::stop`] has begun.
    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// Counters, read without stopping anything (so slightly inconsistent with each other
    /// while processes run).
    pub fn stats(&self) -> Stats {
        let shared = &self.shared;
        let workers = shared.counters[..shared.config.workers]
            .iter()
            .map(|c| WorkerStats {
                executed: c.steps.load(Ordering::Relaxed),
                steals: c.steals.load(Ordering::Relaxed),
                stolen: c.stolen.load(Ordering::Relaxed),
            })
            .collect();
        let sum = |f: fn(&Counters) -> &AtomicU64| -> u64 {
            shared.counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
        };
        let counted = |i: usize| -> u64 { shared.counters.iter().map(|c| c.yields[i].load(Ordering::Relaxed)).sum() };
        Stats {
            workers,
            global_queue: shared.injector.len(),
            live: self.live(),
            peak_live: shared.peak_live.load(Ordering::Relaxed),
            spawned: sum(|c| &c.spawned),
            completed: sum(|c| &c.completed),
            yields: YIELD_KINDS.iter().enumerate().map(|(i, _)| counted(i)).sum(),
            yields_by_command: std::array::from_fn(|i| (YIELD_KINDS[i], counted(i))),
            messages: sum(|c| &c.messages),
            undelivered: sum(|c| &c.undelivered),
            hibernated: sum(|c| &c.hibernated),
        }
    }
}

/// Scheduler counters; see [`Handle::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Per worker, in worker order.
    pub workers: Vec<WorkerStats>,
    /// Processes in the global queue now.
    pub global_queue: usize,
    /// Processes alive now.
    pub live: usize,
    /// The most processes alive at once so far.
    pub peak_live: usize,
    /// Processes spawned (init succeeded).
    pub spawned: u64,
    /// Processes that ended, by themselves or terminated.
    pub completed: u64,
    /// Yields dispatched (granted and known).
    pub yields: u64,
    /// The same, by command: the built-ins by name, then every custom command as
    /// `custom`.
    pub yields_by_command: [(&'static str, u64); 6],
    /// Messages delivered to mailboxes.
    pub messages: u64,
    /// Messages that were in a mailbox when its process ended, never read.
    pub undelivered: u64,
    /// Times a process about to wait gave memory back because its worker had nothing
    /// else to run (see `Process::hibernate`; for a Wasm process, its fiber stack's
    /// resident pages).
    pub hibernated: u64,
}

/// One worker's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Steps run.
    pub executed: u64,
    /// Successful steals from other workers.
    pub steals: u64,
    /// Processes taken by those steals.
    pub stolen: u64,
}

/// Counters of one worker (or, in the last slot, of every other thread). Relaxed: they
/// order nothing and are only summed for [`Stats`]. A worker's own slot has one writer,
/// so it is bumped with a plain load and store instead of a locked read-modify-write;
/// the shared last slot uses `fetch_add`.
#[derive(Default)]
pub(crate) struct Counters {
    steps: AtomicU64,
    steals: AtomicU64,
    stolen: AtomicU64,
    spawned: AtomicU64,
    completed: AtomicU64,
    /// Indexed by `YieldKind`.
    yields: [AtomicU64; 6],
    messages: AtomicU64,
    undelivered: AtomicU64,
    hibernated: AtomicU64,
}

impl Counters {
    /// Called by the worker that owns this slot.
    pub(crate) fn record_hibernation(&self) {
        bump(&self.hibernated, 1, true);
    }

    /// Called by the worker that owns this slot.
    pub(crate) fn record_step(&self) {
        bump(&self.steps, 1, true);
    }

    /// Called by the worker that owns this slot.
    pub(crate) fn record_steal(&self, stolen: u64) {
        bump(&self.steals, 1, true);
        bump(&self.stolen, stolen, true);
    }
}

fn bump(counter: &AtomicU64, n: u64, single_writer: bool) {
    if single_writer {
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    } else {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The commands [`Stats::yields_by_command`] counts apart, in its order.
#[derive(Clone, Copy)]
pub(crate) enum YieldKind {
    Sleep,
    Spawn,
    Send,
    Monitor,
    Terminate,
    Custom,
}

const YIELD_KINDS: [&str; 6] = ["sleep", "spawn", "send", "monitor", "terminate", "custom"];

/// Everything a spawn needs besides the process.
pub(crate) struct SpawnArgs {
    pub(crate) kind: Option<Arc<str>>,
    pub(crate) method: String,
    pub(crate) input: Vec<Payload>,
    pub(crate) caps: Arc<Capabilities>,
    pub(crate) mailbox_capacity: usize,
    pub(crate) watcher: Option<Watcher>,
    /// The spawning process, for `max_children`; `None` when the embedder spawns.
    pub(crate) parent: Option<Weak<ProcessCell>>,
}

/// State shared by the workers, the timer, handles and completers.
pub(crate) struct Shared {
    pub(crate) id: usize,
    pub(crate) injector: Injector<Task>,
    pub(crate) stealers: Box<[Stealer<Task>]>,
    pub(crate) idle: Idle,
    registry: Registry,
    pub(crate) counters: Box<[CachePadded<Counters>]>,
    live: AtomicUsize,
    /// Processes that gave their place in `live` back but are still retiring (their
    /// watchers not yet told): "no process left" waits for them too.
    retiring: AtomicUsize,
    /// Waiting processes that asked to hibernate (`Process::wants_hibernation`), for the
    /// next worker that runs out of work (`worker::WorkerLoop::hibernate_waiting`). A
    /// process is listed at most once until it hibernates, so this holds at most one
    /// entry a live process, plus those of ended processes until they are pruned (see
    /// [`Shared::list_for_hibernation`]); the lock is taken once a listing, not once a
    /// step.
    pub(crate) hibernating: Mutex<Vec<Pid>>,
    peak_live: AtomicUsize,
    pub(crate) config: Config,
    pub(crate) handlers: FxHashMap<String, Arc<dyn Handler>>,
    pub(crate) kinds: FxHashMap<Arc<str>, Arc<dyn Factory>>,
    pub(crate) timer: Timer,
    stopping: AtomicBool,
    shut_down: AtomicBool,
    drained_lock: Mutex<()>,
    drained: Condvar,
}

impl Shared {
    /// Queues a `Ready` process: on this worker's own deque when called from one of our
    /// workers (the process it just woke or spawned is likely to share its cache),
    /// otherwise on the global queue.
    ///
    /// A process pushed onto an empty local deque wakes no other worker: this worker
    /// takes it as soon as its current turn ends, and waking a sleeper to steal it would
    /// cost a futex call and move the process (and, in a request-reply pair, both
    /// processes) to another core. This is tokio's "LIFO slot" policy; like it, the
    /// process waits at most one turn.
    pub(crate) fn schedule(&self, cell: Task) {
        match worker::push_local(self.id, cell) {
            Ok(worker::Pushed::Alone) => {}
            Ok(worker::Pushed::Behind) => self.idle.notify_one(),
            Err(cell) => {
                self.injector.push(cell);
                self.idle.notify_one();
            }
        }
    }

    /// Queues a `Ready` process behind everything already waiting.
    pub(crate) fn schedule_global(&self, cell: Task) {
        self.injector.push(cell);
        self.idle.notify_one();
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub(crate) fn has_queued_work(&self) -> bool {
        !self.injector.is_empty() || self.stealers.iter().any(|s| !s.is_empty())
    }

    /// Adds `n` to one of this thread's counters: its worker's, or the shared slot for
    /// other threads.
    fn count(&self, counter: fn(&Counters) -> &AtomicU64, n: u64) {
        match worker::current_index(self.id) {
            Some(index) => bump(counter(&self.counters[index]), n, true),
            None => bump(counter(&self.counters[self.config.workers]), n, false),
        }
    }

    pub(crate) fn count_yield(&self, kind: YieldKind) {
        match worker::current_index(self.id) {
            Some(index) => bump(&self.counters[index].yields[kind as usize], 1, true),
            None => bump(&self.counters[self.config.workers].yields[kind as usize], 1, false),
        }
    }

    /// Registers and initialises a process and moves it to `Ready`; the caller queues it.
    pub(crate) fn spawn_unqueued(
        self: &Arc<Self>,
        process: Box<dyn Process>,
        args: SpawnArgs,
    ) -> Result<Task, SpawnError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(SpawnError::Stopping);
        }
        let limit = self.config.max_processes;
        let before = self.live.fetch_add(1, Ordering::AcqRel);
        if before >= limit {
            self.release_live();
            return Err(SpawnError::LimitExceeded { limit });
        }
        self.peak_live.fetch_max(before + 1, Ordering::Relaxed);

        let shard = worker::current_index(self.id).unwrap_or(self.config.workers);
        let tree = args
            .parent
            .as_ref()
            .and_then(Weak::upgrade)
            .map(|parent| OnceLock::from(parent.spec.tree.get_or_init(Arc::default).clone()))
            .unwrap_or_default();
        let spec = Spec {
            scheduler: Some(self.clone()),
            kind: args.kind,
            caps: args.caps,
            mailbox_capacity: args.mailbox_capacity,
            parent: args.parent,
            children: AtomicUsize::new(0),
            tree,
        };
        let cell = match self.registry.insert(shard, process, spec) {
            Ok(cell) => cell,
            Err(mut process) => {
                self.release_live();
                close_quietly(&mut *process);
                return Err(SpawnError::LimitExceeded { limit: registry::MAX_PER_SHARD });
            }
        };
        // Counted from registration, so that `retire` (which every registered process
        // reaches, even one whose init fails) can always take it back.
        if let Some(parent) = cell.spec.parent.as_ref().and_then(Weak::upgrade) {
            parent.spec.children.fetch_add(1, Ordering::Relaxed);
        }
        // A child's tree was set above; a root's is not counted.
        if cell.spec.parent.is_some()
            && let Some(tree) = cell.spec.tree.get()
        {
            tree.fetch_add(1, Ordering::Relaxed);
        }
        let pid = cell.pid();
        let method = args.method;
        // SAFETY: the process is in `Init`: registered but in no queue, so this spawner
        // is its only owner.
        let init =
            unsafe { cell.with_process(|p| catch_unwind(AssertUnwindSafe(|| p.init(pid, &method, args.input)))) }
                .expect("a process in `Init` is not closed");
        let init = match init {
            Ok(result) => result,
            Err(panic) => Err(anyhow::anyhow!("init panicked: {}", worker::panic_message(&*panic))),
        };
        if let Err(source) = init {
            self.retire(&cell, Some(Err(format!("{source:#}"))));
            return Err(SpawnError::Init { method, source });
        }
        if let Some(watcher) = args.watcher
            && cell.inbox.watch(watcher).is_err()
        {
            unreachable!("inbox of process {pid} closed during its init");
        }
        cell.state.transition_to_ready_from_init();
        self.count(|c| &c.spawned, 1);
        Ok(cell)
    }

    pub(crate) fn send(&self, from: Pid, to: Pid, topic: String, body: Payload) -> Result<(), SendError> {
        let cell = self.registry.get(to).ok_or(SendError::NotFound(to))?;
        match cell.deliver(Event::Message { sender: from, topic, body }) {
            Ok(wake) => {
                self.count(|c| &c.messages, 1);
                if wake == Wake::Schedule {
                    self.schedule(cell);
                }
                Ok(())
            }
            Err(events::Refused::Closed) => Err(SendError::Closed(to)),
            Err(events::Refused::Full { capacity }) => Err(SendError::MailboxFull { pid: to, capacity }),
        }
    }

    /// `watcher` gets an [`Event::Exit`] when `target` ends; at once (`Err("noproc")`)
    /// if it already has.
    pub(crate) fn monitor(&self, watcher: &Task, target: Pid) {
        let refused = match self.registry.get(target) {
            Some(cell) => cell.inbox.watch(Watcher::Process(watcher.clone())).is_err(),
            None => true,
        };
        if refused
            && let Ok(Wake::Schedule) = watcher.deliver(Event::Exit { pid: target, result: Err("noproc".to_owned()) })
        {
            self.schedule(watcher.clone());
        }
    }

    /// Requests termination of `target`, telling `watcher` once it has ended. On error
    /// the watcher is handed back.
    pub(crate) fn terminate(&self, target: Pid, watcher: Option<Watcher>) -> Result<(), (SendError, Option<Watcher>)> {
        let Some(cell) = self.registry.get(target) else {
            return Err((SendError::NotFound(target), watcher));
        };
        if let Some(watcher) = watcher
            && let Err(watcher) = cell.inbox.watch(watcher)
        {
            return Err((SendError::Closed(target), Some(watcher)));
        }
        // Once the watcher is registered the exit notifies it, even if the process
        // finishes by itself before the request lands.
        let _ = self.terminate_cell(&cell, "terminated");
        Ok(())
    }

    pub(crate) fn terminate_cell(&self, cell: &Task, reason: &'static str) -> Result<(), SendError> {
        if !cell.inbox.set_terminate_reason(Cow::Borrowed(reason)) {
            return Err(SendError::Closed(cell.pid()));
        }
        if cell.state.request_terminate() == Wake::Schedule {
            self.schedule(cell.clone());
        }
        Ok(())
    }

    /// Ends a process that was running (or was dequeued with a terminate request).
    /// `None` means terminated: the result is the termination reason.
    pub(crate) fn finalize(&self, cell: &Task, result: Option<Outcome>) {
        // Counted first, so that whoever sees the scheduler drained sees it counted.
        self.count(|c| &c.completed, 1);
        self.retire(cell, result);
    }

    /// The end of every process, in this order: close the inbox (later events are
    /// refused with `Closed`), mark it complete, close the process (exactly once: it is
    /// taken out of its cell), remove its pid (later sends get `NotFound`), give back its
    /// place under `max_processes`, tell the watchers, and only then count it out of
    /// `retiring`, so a waiter for "no process left" also sees every exit delivered.
    fn retire(&self, cell: &Task, result: Option<Outcome>) {
        let closed = cell.inbox.close();
        let result = result
            .unwrap_or_else(|| Err(closed.terminate_reason.map_or_else(|| "terminated".to_owned(), Cow::into_owned)));
        cell.state.transition_to_complete();
        // Closed before the pid leaves the registry: while `close` runs (dropping a Wasm
        // store takes a while), senders get `Closed`, not `NotFound`.
        // SAFETY: the caller owns the process (it is retiring it: the worker that ran it
        // or the spawner whose init failed), and the inbox is closed.
        if let Some(mut process) = unsafe { cell.take_process() } {
            close_quietly(&mut *process);
        }
        self.registry.remove(cell.pid());
        if let Some(parent) = cell.spec.parent.as_ref().and_then(Weak::upgrade) {
            parent.spec.children.fetch_sub(1, Ordering::Relaxed);
        }
        if cell.spec.parent.is_some()
            && let Some(tree) = cell.spec.tree.get()
        {
            tree.fetch_sub(1, Ordering::Relaxed);
        }
        // Before the watchers hear of the exit: one that spawns on hearing it must find
        // the room this process held under `max_processes`. `retiring` goes up first, so
        // that `live` and `retiring` are never both zero before the watchers are told.
        self.retiring.fetch_add(1, Ordering::AcqRel);
        self.release_live();
        let undelivered = closed.undelivered.iter().filter(|e| matches!(e, Event::Message { .. })).count();
        if undelivered > 0 {
            self.count(|c| &c.undelivered, undelivered as u64);
        }
        for watcher in closed.watchers {
            match watcher {
                Watcher::Process(watching) => {
                    if let Ok(Wake::Schedule) =
                        watching.deliver(Event::Exit { pid: cell.pid(), result: result.clone() })
                    {
                        self.schedule(watching);
                    }
                }
                Watcher::Yield(done) => done.complete(Ok(Payload::empty())),
                Watcher::Handle(slot) => slot.set(result.clone()),
            }
        }
        if self.retiring.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.notify_drained();
        }
    }

    /// Lists `pid` in [`Shared::hibernating`].
    ///
    /// Entries of processes that ended are dropped only by a worker that runs out of
    /// work, which a scheduler under steady load may never do: so a listing that finds
    /// the list at twice the live processes (each live one is listed at most once)
    /// first drops the ended ones. The list then holds at most `live` entries, and the
    /// next pruning is `live` listings away: amortised O(1) a listing, and a list that
    /// stays within 2 × live (or [`HIBERNATION_LIST_FLOOR`]) whatever the load.
    pub(crate) fn list_for_hibernation(&self, pid: Pid) {
        let mut listed = self.hibernating.lock();
        if listed.len() >= HIBERNATION_LIST_FLOOR.max(2 * self.live.load(Ordering::Relaxed)) {
            listed.retain(|&pid| self.registry.contains(pid));
        }
        listed.push(pid);
    }

    fn release_live(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.notify_drained();
        }
    }

    /// Wakes the waiters of [`Shared::wait_drained`] to check again.
    fn notify_drained(&self) {
        // Taking the lock orders this notify after a waiter's check (made under the
        // lock), so the waiter is either still to check or already waiting.
        let _guard = self.drained_lock.lock();
        self.drained.notify_all();
    }

    /// No process alive and none retiring. `live` is read first: `retire` raises
    /// `retiring` before it lowers `live`, so a zero read from `live` (acquiring that
    /// decrement) is followed by a read of `retiring` that sees the raise, or its end.
    fn drained(&self) -> bool {
        self.live.load(Ordering::Acquire) == 0 && self.retiring.load(Ordering::Acquire) == 0
    }

    /// Waits until no process is alive; false if `deadline` passed first.
    pub(crate) fn wait_drained(&self, deadline: Option<Instant>) -> bool {
        let mut guard = self.drained_lock.lock();
        while !self.drained() {
            match deadline {
                Some(deadline) => {
                    if self.drained.wait_until(&mut guard, deadline).timed_out() {
                        return self.drained();
                    }
                }
                None => self.drained.wait(&mut guard),
            }
        }
        true
    }
}

/// Closes and drops a process, containing any panic: a broken `close` must not take a
/// worker down with it.
fn close_quietly(process: &mut dyn Process) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| process.close())) {
        tracing::error!(panic = worker::panic_message(&*panic), "a process's `close` panicked");
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::{Command, Events, Payload, Pid, Process, Scheduler, Status, StepOutput};

    /// Waits once, for a sleep of a millisecond (one of no time completes during the
    /// dispatch, and the process runs on without waiting), asking to hibernate
    /// meanwhile, then ends.
    struct WaitsOnce(bool);

    impl Process for WaitsOnce {
        fn init(&mut self, _: Pid, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            if std::mem::replace(&mut self.0, true) {
                out.complete(Ok(Payload::empty()));
            } else {
                out.yield_command(0, Command::Sleep(Duration::from_millis(1)));
                out.set_status(Status::Blocked);
            }
            Ok(())
        }

        fn wants_hibernation(&mut self) -> bool {
            true
        }
    }

    /// Runs again at once until told to stop, so its worker never runs out of work.
    struct Busy(Arc<AtomicBool>);

    impl Process for Busy {
        fn init(&mut self, _: Pid, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, _: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            if self.0.load(Ordering::Relaxed) {
                out.complete(Ok(Payload::empty()));
            } else {
                out.set_status(Status::Continue);
            }
            Ok(())
        }
    }

    /// A worker that never runs out of work never prunes the hibernation list of the
    /// processes that ended: listing prunes it, so it stays bounded by the live
    /// processes (here 2 at most, so by the floor), not by every process that ever waited.
    #[test]
    fn the_hibernation_list_stays_bounded_on_a_busy_worker() {
        let scheduler = Scheduler::builder().workers(1).build().expect("the scheduler starts");
        let stop = Arc::new(AtomicBool::new(false));
        let busy = scheduler.spawn(Busy(stop.clone()), "main", vec![]).expect("spawn");
        // In batches, so that few are live at once and each batch's sleeps overlap.
        let (batches, batch) = (96, 64);
        let processes = batches * batch;
        assert!(processes > 2 * super::HIBERNATION_LIST_FLOOR);
        for _ in 0..batches {
            let waiters: Vec<_> =
                (0..batch).map(|_| scheduler.spawn(WaitsOnce(false), "main", vec![]).expect("spawn")).collect();
            for waiter in waiters {
                waiter.join_timeout(Duration::from_secs(20)).expect("the waiter ends").expect("ok");
            }
        }
        let listed = scheduler.handle().shared.hibernating.lock().len();
        stop.store(true, Ordering::Relaxed);
        busy.join_timeout(Duration::from_secs(20)).expect("the busy one ends").expect("ok");
        assert!(listed > 0, "no waiter was listed: the test shows nothing");
        assert!(listed <= super::HIBERNATION_LIST_FLOOR, "{listed} entries listed after {processes} waiters");
        scheduler.stop(Duration::from_secs(1));
    }
}
