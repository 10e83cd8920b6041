//! Shards of durable processes spread over the nodes of a cluster: [`ShardHost`], one
//! node's part.
//!
//! Durable processes live in a fixed number of shards. Each shard has a journal on
//! JetStream ([`JetStreamStore`]) and is run by one node at a time, the holder of its
//! lease ([`Leases`]), with a durable scheduler of its own on that journal. A host:
//!
//! - announces itself in the lease bucket (the key `node.NAME`, with the leases' time to
//!   live), so hosts know how many share the shards;
//! - renews the leases it holds a few times a time to live; one it finds lost, or cannot
//!   renew for a whole time to live by its own clock, it stops at once (its scheduler
//!   stops stepping; the journal's fence refuses whatever a stopped step would still
//!   commit);
//! - takes free shards up to its fair share (the shards divided among the hosts
//!   announced), opening each one's journal (which fences the previous owner there) and
//!   resuming its processes;
//! - gives back one shard at a time while it holds more than its fair share and another
//!   host holds less, suspending it first (a planned move: nothing is replayed that was
//!   not journaled, and the next owner need not wait for a lease to expire).
//!
//! [`ShardHost::drain`] gives back every shard and leaves.
//!
//! With [`ShardOptions::workflows`], a host also runs the cluster's durable workflows
//! ([`Workflows`]): it starts the pending ones of its shards (at a poke, and on a look
//! over its shards' records every few rounds), settles each one's record when its root
//! ends, and on taking a shard goes over its records (see `workflows.rs`).
//!
//! A shard's journal keeps a finished workflow's run until its record holds the end:
//! the host forgets the run only then, on its next look over the shard. A node that
//! stops (drained, or killed) between a root's end and the write of its record leaves
//! the end in the journal, where the next owner reads it and settles the record; it
//! never starts the workflow again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmproc_types::{ExitReason, Format, Payload};

use super::config::ClusterConfig;
use super::inbox::{InboxOptions, Mail, Reading, ShardRemote};
use super::journal::{JetStreamOptions, JetStreamStore};
use super::lease::{Lease, LeaseOptions, Leases, Renewal, Shares};
use super::workflows::{ShardWorkflow, WorkflowState, Workflows};
use crate::Pid;
use crate::error::SpawnError;
use crate::journal::{HeldRun, Journal, JournalSettings};
use crate::scheduler::{Builder, Handle, ProcessHandle, Scheduler, SpawnOptions, Spawnable};
use crate::step::{Exited, WORKFLOW_ID_FORMAT};

/// Builds the durable scheduler of a shard from a builder already given the shard's
/// journal and pids: the kinds, workers and grants the node runs its processes with.
pub type BuildShard = dyn Fn(u32, Builder) -> anyhow::Result<Scheduler> + Send + Sync;

/// The most shards a cluster may have.
pub const MAX_SHARDS: u32 = 1024;
/// The first of the pid node ids that name shards (shard `s` is `Pid::MAX_NODE - 1 - s`);
/// nodes draw their ids below it.
pub const FIRST_SHARD_NODE: u16 = Pid::MAX_NODE - MAX_SHARDS as u16;

/// Writes `exited` into workflow `record` as its end, if its revision is still
/// `revision`; whether it was written (not if the record changed meanwhile, or the
/// server failed).
fn settle(workflows: &Workflows, mut record: ShardWorkflow, revision: u64, exited: &Exited) -> bool {
    match &exited.reason {
        ExitReason::Normal(payload) => {
            record.state = WorkflowState::Completed;
            record.result = Some(payload.to_json_value());
        }
        reason => {
            record.state = WorkflowState::Failed;
            record.error = Some(reason.to_string());
        }
    }
    match workflows.update(&record, revision) {
        Ok(written) => written.is_some(),
        Err(error) => {
            tracing::warn!(id = %record.id, "cannot write a workflow's end: {error:#}");
            false
        }
    }
}

/// The node id the pids of shard `shard` carry: a durable pid names its shard, not the
/// node that runs it, so it stays valid when the shard moves.
pub fn shard_node(shard: u32) -> u16 {
    Pid::MAX_NODE - 1 - shard as u16
}

/// How a [`ShardHost`] shares the shards.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    shards: u32,
    journal: JetStreamOptions,
    leases: LeaseOptions,
    inbox: InboxOptions,
    workflows: Option<Arc<Workflows>>,
}

impl ShardOptions {
    /// `shards` shards, with the journal's and the leases' defaults.
    pub fn new(shards: u32) -> Self {
        ShardOptions {
            shards,
            journal: JetStreamOptions::new(),
            leases: LeaseOptions::new(),
            inbox: InboxOptions::new(),
            workflows: None,
        }
    }

    /// Runs the cluster's durable workflows kept in `workflows` (see the module's docs).
    pub fn workflows(mut self, workflows: Arc<Workflows>) -> Self {
        self.workflows = Some(workflows);
        self
    }

    /// Where the shards' journals live (the shard number is set per shard).
    pub fn journal(mut self, journal: JetStreamOptions) -> Self {
        self.journal = journal;
        self
    }

    /// Where messages between shards wait for their receiver's shard (see `inbox.rs`).
    pub fn inbox(mut self, inbox: InboxOptions) -> Self {
        self.inbox = inbox;
        self
    }

    /// The leases' bucket and time to live.
    pub fn leases(mut self, leases: LeaseOptions) -> Self {
        self.leases = leases;
        self
    }
}

/// One node's part of the shards: see the module's docs.
pub struct ShardHost {
    inner: Arc<Inner>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

struct Inner {
    cluster: ClusterConfig,
    node: String,
    options: ShardOptions,
    leases: Leases,
    /// Messages between this node's shards and the others.
    mail: Arc<Mail>,
    build: Box<BuildShard>,
    held: Mutex<BTreeMap<u32, Held>>,
    /// The leases of the shards being taken, and when each was last renewed.
    taking: Mutex<BTreeMap<u32, (Lease, Instant)>>,
    /// Set to stop the host's thread: `drain` gives the shards back, `abandon` does not.
    stopping: AtomicBool,
    draining: AtomicBool,
    /// Set by the shards' thread once it gave back what it was to give back.
    released: AtomicBool,
    /// What the host's thread hears of besides its rounds.
    events: Sender<Event>,
}

struct Held {
    lease: Lease,
    scheduler: Scheduler,
    journal: Journal,
    /// When the lease was last renewed, by this host's clock.
    renewed: Instant,
    /// The workflows of the shard whose root this host watches.
    watched: HashSet<String>,
    /// The processes the journal resumed that no workflow record has claimed yet.
    resumed: HashMap<Pid, ProcessHandle>,
    /// The shard's inbox, read into its scheduler.
    reading: Reading,
    /// Whether the journal may hold finished runs whose records hold their ends: set on
    /// taking the shard and at each end settled here, cleared by the look over the shard
    /// that forgets those runs.
    to_sweep: bool,
}

/// What a host's thread hears of between its rounds.
enum Event {
    /// A workflow was asked for in a shard.
    Poke(u32),
    /// The root of a workflow of a shard held here ended.
    Ended { shard: u32, id: String, pid: Pid, exited: Exited },
}

/// Every how many rounds a host looks over all its shards' workflow records.
const LOOK_EVERY: u32 = 8;

impl ShardHost {
    /// Joins the shards as node `node`: opens the lease bucket and starts the host's
    /// thread, which takes this node's share of the shards and runs each on the scheduler
    /// `build` makes from a builder given the shard's journal and pids.
    ///
    /// # Errors
    ///
    /// No shards, or the lease bucket cannot be opened.
    pub fn start(
        cluster: &ClusterConfig,
        node: &str,
        options: ShardOptions,
        build: impl Fn(u32, Builder) -> anyhow::Result<Scheduler> + Send + Sync + 'static,
    ) -> anyhow::Result<ShardHost> {
        anyhow::ensure!(
            (1..=MAX_SHARDS).contains(&options.shards),
            "a cluster has 1 to {MAX_SHARDS} shards, not {}",
            options.shards
        );
        let leases = Leases::open(cluster, node, &options.leases)?;
        let mail = Mail::open(cluster, options.shards, &options.inbox)?;
        let (events, heard) = std::sync::mpsc::channel();
        if let Some(workflows) = &options.workflows {
            let pokes = events.clone();
            workflows.pokes(move |shard| pokes.send(Event::Poke(shard)).is_ok())?;
        }
        let inner = Arc::new(Inner {
            cluster: cluster.clone(),
            node: node.to_owned(),
            options,
            leases,
            mail,
            build: Box::new(build),
            held: Mutex::new(BTreeMap::new()),
            taking: Mutex::new(BTreeMap::new()),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            released: AtomicBool::new(false),
            events,
        });
        let worker = inner.clone();
        let leasing = std::thread::Builder::new()
            .name("wasmproc-shards".to_owned())
            .spawn(move || worker.run())
            .map_err(|e| anyhow::anyhow!("cannot start the shards' thread: {e}"))?;
        let renewer = inner.clone();
        let renewing = std::thread::Builder::new()
            .name("wasmproc-leases".to_owned())
            .spawn(move || renewer.keep_leases())
            .map_err(|e| anyhow::anyhow!("cannot start the leases' thread: {e}"))?;
        let host = ShardHost { inner: inner.clone(), threads: Mutex::new(vec![leasing, renewing]) };
        if host.inner.options.workflows.is_some() {
            let starting = std::thread::Builder::new()
                .name("wasmproc-workflows".to_owned())
                .spawn(move || inner.serve_workflows(&heard))
                .map_err(|e| anyhow::anyhow!("cannot start the workflows' thread: {e}"))?;
            host.threads.lock().push(starting);
        }
        Ok(host)
    }

    /// The shards this node runs now.
    pub fn held(&self) -> Vec<u32> {
        self.inner.held.lock().keys().copied().collect()
    }

    /// The handle of shard `shard`'s scheduler, if this node runs it.
    pub fn handle(&self, shard: u32) -> Option<Handle> {
        self.inner.held.lock().get(&shard).map(|held| held.scheduler.handle().clone())
    }

    /// Every shard's holder, as the lease bucket says now.
    ///
    /// # Errors
    ///
    /// The server did not answer.
    pub fn owners(&self) -> anyhow::Result<BTreeMap<u32, String>> {
        self.inner.leases.owners()
    }

    /// Gives every shard back (each suspended first, so its next owner resumes it without
    /// waiting for the lease to expire) and leaves; returns once done.
    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::Release);
        self.join();
    }

    /// Stops taking part without giving anything back or stopping anything: what a node
    /// that froze looks like to the others. Its schedulers keep running until their
    /// journals are taken from them; for tests of exactly that.
    pub fn abandon(&self) {
        self.join();
    }

    fn join(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        for thread in std::mem::take(&mut *self.threads.lock()) {
            let _ = thread.join();
        }
    }
}

impl Drop for ShardHost {
    fn drop(&mut self) {
        self.drain();
    }
}

impl Inner {
    /// The workflows' thread: starts and settles workflows as it hears of them, and looks
    /// over every shard held every few rounds. Apart from the leases' thread, so that
    /// loading a component or a slow start never holds up a renewal.
    fn serve_workflows(&self, heard: &Receiver<Event>) {
        let every = self.leases.ttl() / 4 * LOOK_EVERY;
        let mut next_look = Instant::now() + every;
        while !self.stopping.load(Ordering::Acquire) {
            match heard
                .recv_timeout(next_look.saturating_duration_since(Instant::now()).min(Duration::from_millis(200)))
            {
                Ok(Event::Poke(shard)) => self.look_over(shard),
                Ok(Event::Ended { shard, id, pid, exited }) => self.ended(shard, &id, pid, &exited),
                Err(RecvTimeoutError::Timeout) => {}
                // Never: `self.events` is a sender.
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if Instant::now() >= next_look {
                let shards: Vec<u32> = self.held.lock().keys().copied().collect();
                for shard in shards {
                    self.look_over(shard);
                }
                next_look = Instant::now() + every;
            }
        }
    }

    /// The leases' thread: announces this node and renews its leases, and nothing else,
    /// so that no take of a shard (a journal to replay) or give-back holds a renewal up.
    fn keep_leases(&self) {
        let tick = self.leases.ttl() / 4;
        // Until the shards' thread is done: a drain keeps its leases while it suspends.
        while !self.released.load(Ordering::Acquire) {
            if let Err(error) = self.leases.announce() {
                tracing::warn!(node = %self.node, "cannot announce this node to the shards: {error:#}");
            }
            self.renew();
            std::thread::sleep(tick);
        }
    }

    /// The shards' thread: takes and gives back shards every round, and gives every one
    /// back on a drain.
    fn run(&self) {
        let tick = self.leases.ttl() / 4;
        while !self.stopping.load(Ordering::Acquire) {
            if let Err(error) = self.balance() {
                tracing::warn!(node = %self.node, "cannot take or give back shards: {error:#}");
            }
            std::thread::sleep(tick);
        }
        if self.draining.load(Ordering::Acquire) {
            let held = std::mem::take(&mut *self.held.lock());
            for (shard, held) in held {
                self.give_back(shard, held);
            }
            // Their next owners send again what did not leave, so this is not needed for
            // any message to arrive once; it only spares them the wait.
            let deadline = Instant::now() + Duration::from_secs(2);
            while !self.mail.flushed() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            self.released.store(true, Ordering::Release);
            if let Err(error) = self.leases.leave() {
                tracing::warn!(node = %self.node, "cannot say this node left the shards: {error:#}");
            }
        }
        self.released.store(true, Ordering::Release);
    }

    /// Renews every lease held, or being taken; stops the shards whose lease is lost, or
    /// was not renewed for a whole time to live, and drops such a lease being taken (its
    /// take then stops what it built). The renewals go to the server without `held`
    /// locked, so [`ShardHost::handle`] never waits on the network.
    fn renew(&self) {
        let mut leases: Vec<(u32, Lease, Instant)> =
            self.held.lock().iter().map(|(shard, one)| (*shard, one.lease.clone(), one.renewed)).collect();
        leases.extend(self.taking.lock().iter().map(|(shard, (lease, since))| (*shard, lease.clone(), *since)));
        let mut renewed = Vec::new();
        let mut lost = Vec::new();
        for (shard, mut lease, since) in leases {
            match self.leases.renew(&mut lease) {
                Ok(Renewal::Held) => renewed.push((shard, lease)),
                Ok(Renewal::Lost) => lost.push((shard, "its lease passed to another node")),
                Err(error) if since.elapsed() >= self.leases.ttl() => {
                    tracing::warn!(node = %self.node, shard, "cannot renew a shard's lease: {error:#}");
                    lost.push((shard, "its lease could not be renewed within its time to live"));
                }
                Err(error) => tracing::warn!(node = %self.node, shard, "cannot renew a shard's lease: {error:#}"),
            }
        }
        {
            let mut taking = self.taking.lock();
            for (shard, lease) in &renewed {
                if let Some(one) = taking.get_mut(shard) {
                    *one = (lease.clone(), Instant::now());
                }
            }
            for (shard, why) in &lost {
                if taking.remove(shard).is_some() {
                    tracing::warn!(node = %self.node, shard, "giving up shard {shard} as it is taken: {why}");
                }
            }
        }
        let stopped: Vec<(u32, &str, Held)> = {
            let mut held = self.held.lock();
            for (shard, lease) in renewed {
                if let Some(one) = held.get_mut(&shard) {
                    one.lease = lease;
                    one.renewed = Instant::now();
                }
            }
            lost.into_iter().filter_map(|(shard, why)| Some((shard, why, held.remove(&shard)?))).collect()
        };
        for (shard, why, one) in stopped {
            tracing::warn!(node = %self.node, shard, "stopping shard {shard}: {why}");
            drop(one.reading);
            // Its journal is another's now (or soon): nothing it would write counts, so
            // its processes are stopped without waiting for them.
            one.scheduler.stop(Duration::ZERO);
        }
    }

    /// Takes free shards up to this node's fair share, or gives one back if it holds
    /// more than that while another node holds less.
    fn balance(&self) -> anyhow::Result<()> {
        let Shares { owners, nodes } = self.leases.shares()?;
        let nodes = nodes.max(1);
        let fair = self.options.shards.div_ceil(nodes as u32) as usize;
        let held = self.held.lock().len();
        if held < fair {
            let free = (0..self.options.shards).filter(|shard| !owners.contains_key(shard));
            for shard in free.take(fair - held) {
                self.take(shard)?;
            }
        } else if held > fair {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for owner in owners.values() {
                *counts.entry(owner.as_str()).or_default() += 1;
            }
            let someone_has_less = counts.len() < nodes || counts.values().any(|&count| count + 1 < held);
            if someone_has_less {
                let last = self.held.lock().pop_last();
                if let Some((shard, one)) = last {
                    self.give_back(shard, one);
                }
            }
        }
        Ok(())
    }

    /// Takes shard `shard` if it is still free: its lease, then its journal, then a
    /// scheduler on it, which resumes its processes.
    fn take(&self, shard: u32) -> anyhow::Result<()> {
        let Some(lease) = self.leases.acquire(shard)? else { return Ok(()) };
        // The leases' thread renews it while the shard's journal is replayed.
        self.taking.lock().insert(shard, (lease, Instant::now()));
        // Its recovery sends its messages to other shards again, each the first of its
        // chain (see `inbox.rs`).
        self.mail.restart_chains(shard);
        let remote = ShardRemote::new(self.mail.clone(), shard);
        let opened =
            JetStreamStore::open(&self.cluster, &self.options.journal.clone().shard(shard)).and_then(|store| {
                // With workflows, finished runs stay until their records hold their ends
                // (see the module docs): `look_over` forgets them.
                let keep_finished = self.options.workflows.is_some();
                let settings = JournalSettings { keep_finished, ..JournalSettings::default() };
                let journal = Journal::with_store(store).settings(settings);
                let builder =
                    Scheduler::builder().journal(journal.clone()).shard_remote(shard_node(shard), remote.clone());
                Ok(((self.build)(shard, builder)?, journal))
            });
        let opened = opened.and_then(|(scheduler, journal)| {
            remote.serve(scheduler.handle().clone());
            match self.mail.read(shard, scheduler.handle().clone()) {
                Ok(reading) => Ok((scheduler, journal, reading)),
                Err(error) => {
                    scheduler.stop(Duration::ZERO);
                    Err(error)
                }
            }
        });
        let taken = self.taking.lock().remove(&shard);
        let Some((lease, renewed)) = taken else {
            // Lost as it was taken: what was built must not run on.
            if let Ok((scheduler, _, reading)) = opened {
                drop(reading);
                scheduler.stop(Duration::ZERO);
            }
            return Ok(());
        };
        match opened {
            Ok((scheduler, journal, reading)) => {
                tracing::info!(node = %self.node, shard, "took shard {shard}");
                let resumed = scheduler.resumed().into_iter().map(|handle| (handle.pid(), handle)).collect();
                let held = Held {
                    lease,
                    scheduler,
                    journal,
                    renewed,
                    watched: HashSet::new(),
                    resumed,
                    reading,
                    to_sweep: true,
                };
                self.held.lock().insert(shard, held);
                let _ = self.events.send(Event::Poke(shard));
                Ok(())
            }
            Err(error) => {
                let _ = self.leases.release(lease);
                Err(error.context(format!("cannot run shard {shard}")))
            }
        }
    }

    /// Goes over shard `shard`'s workflow records, if it is held here: starts the pending
    /// ones, watches those the journal resumed, settles those whose end the journal holds,
    /// and starts again those whose spawn never reached it.
    fn look_over(&self, shard: u32) {
        let Some(workflows) = &self.options.workflows else { return };
        if !self.held.lock().contains_key(&shard) {
            return;
        }
        let records = match workflows.of_shard(shard) {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(node = %self.node, shard, "cannot read shard {shard}'s workflows: {error:#}");
                return;
            }
        };
        // Taken before the journal is read below, so an end settled after the read sets
        // it again, for the next look.
        let to_sweep = match self.held.lock().get_mut(&shard) {
            Some(held) => std::mem::take(&mut held.to_sweep),
            None => return,
        };
        let mut runs = None;
        // The roots whose records hold their ends: their finished runs can go.
        let mut settled = HashSet::new();
        for (record, revision) in records {
            match record.state {
                WorkflowState::Pending => self.start_workflow(workflows, record, revision),
                WorkflowState::Running => {
                    let pid = Pid::from_u64(record.pid);
                    let (watched, resumed, journal) = {
                        let mut held = self.held.lock();
                        let Some(held) = held.get_mut(&shard) else { return };
                        (held.watched.contains(&record.id), held.resumed.remove(&pid), held.journal.clone())
                    };
                    if watched {
                        continue;
                    }
                    if let Some(handle) = resumed {
                        self.watch(shard, &record.id, &handle);
                        continue;
                    }
                    let runs = match &runs {
                        Some(runs) => runs,
                        None => match journal.runs() {
                            Ok(read) => runs.insert(read),
                            Err(error) => {
                                tracing::warn!(node = %self.node, shard, "cannot read shard {shard}'s journal: {error}");
                                if to_sweep {
                                    self.sweep_later(shard);
                                }
                                return;
                            }
                        },
                    };
                    match HeldRun::end_of(runs, pid) {
                        Some(exited) => {
                            if settle(workflows, record, revision, &exited) {
                                settled.insert(pid);
                            }
                        }
                        // Its pid was written and its spawn never reached the journal:
                        // nothing of it ran for good, so it starts now.
                        None => {
                            tracing::info!(
                                node = %self.node, shard, id = %record.id, %pid,
                                "workflow {}'s process is not in shard {shard}'s journal: it starts again",
                                record.id
                            );
                            self.start_workflow(workflows, record, revision);
                        }
                    }
                }
                WorkflowState::Completed | WorkflowState::Failed => {
                    settled.insert(Pid::from_u64(record.pid));
                }
            }
        }
        if to_sweep {
            self.sweep(shard, &settled, runs);
        }
    }

    /// Forgets the finished runs of shard `shard`'s journal whose roots are among
    /// `settled` (their records hold their ends): among `runs` if the look read them,
    /// else read now. For a look that found an end settled since the last sweep, or the
    /// shard just taken.
    fn sweep(&self, shard: u32, settled: &HashSet<Pid>, runs: Option<Vec<HeldRun>>) {
        let Some(journal) = self.held.lock().get(&shard).map(|held| held.journal.clone()) else { return };
        let runs = match runs.map_or_else(|| journal.runs(), Ok) {
            Ok(runs) => runs,
            Err(error) => {
                tracing::warn!(node = %self.node, shard, "cannot read shard {shard}'s finished runs: {error}");
                self.sweep_later(shard);
                return;
            }
        };
        for run in runs.iter().filter(|run| run.result.is_some() && settled.contains(&run.root)) {
            if let Err(error) = journal.forget_run(run) {
                tracing::warn!(node = %self.node, shard, root = %run.root, "cannot forget a finished run: {error}");
                self.sweep_later(shard);
            }
        }
    }

    /// Has the next look over shard `shard` sweep its journal.
    fn sweep_later(&self, shard: u32) {
        if let Some(held) = self.held.lock().get_mut(&shard) {
            held.to_sweep = true;
        }
    }

    /// Starts workflow `record` (of revision `revision`) in its shard, writing its pid
    /// into its record before its spawn is journaled.
    fn start_workflow(&self, workflows: &Workflows, mut record: ShardWorkflow, mut revision: u64) {
        let shard = record.shard;
        let Some(handle) = self.held.lock().get(&shard).map(|held| held.scheduler.handle().clone()) else { return };
        let input = match Payload::json(&record.input) {
            Ok(input) => input,
            Err(error) => {
                let exited = Exited::new(ExitReason::Error(format!("the workflow did not start: its input: {error}")));
                settle(workflows, record, revision, &exited);
                return;
            }
        };
        let id = Payload { format: Format::Other(WORKFLOW_ID_FORMAT.into()), data: record.id.clone().into_bytes() };
        let options = SpawnOptions::new(&record.entry).input(vec![input, id]);
        let mut changed = false;
        let spawned = handle.spawn_admitted(Spawnable::kind(record.component.clone()), options, |pid| {
            let mut running = record.clone();
            running.state = WorkflowState::Running;
            running.pid = pid.as_u64();
            match workflows.update(&running, revision) {
                Ok(Some(written)) => {
                    revision = written;
                    record = running;
                    Ok(())
                }
                Ok(None) => {
                    changed = true;
                    Err("its record changed meanwhile".to_owned())
                }
                Err(error) => Err(format!("{error:#}")),
            }
        });
        match spawned {
            Ok(process) => {
                tracing::debug!(node = %self.node, shard, id = %record.id, pid = %process.pid(), "started a workflow");
                self.watch(shard, &record.id, &process);
            }
            // Its own fault (an entry its component lacks, an `init` that refused its
            // input): it ends so.
            Err(error @ (SpawnError::Init { .. } | SpawnError::Factory { .. })) if !changed => {
                let exited = Exited::new(ExitReason::Error(format!("the workflow did not start: {error}")));
                settle(workflows, record, revision, &exited);
            }
            // Another wrote the record first (a stale owner before its fence), or the
            // host's (a shard stopping, its journal or the server failing, a component
            // not fetched): the next look over the shard tries again.
            Err(error) => {
                tracing::warn!(node = %self.node, shard, id = %record.id, "a workflow did not start yet: {error}");
            }
        }
    }

    /// Tells the host's thread when `process`, the root of workflow `id`, ends.
    fn watch(&self, shard: u32, id: &str, process: &ProcessHandle) {
        if let Some(held) = self.held.lock().get_mut(&shard) {
            held.watched.insert(id.to_owned());
        }
        let (events, id, pid) = (self.events.clone(), id.to_owned(), process.pid());
        process.on_exit(move |exited| {
            let _ = events.send(Event::Ended { shard, id, pid, exited: exited.clone() });
        });
    }

    /// Writes the end of workflow `id`'s root into its record, if the journal holds it.
    fn ended(&self, shard: u32, id: &str, pid: Pid, exited: &Exited) {
        let Some(workflows) = &self.options.workflows else { return };
        if let Some(held) = self.held.lock().get_mut(&shard) {
            held.watched.remove(id);
        }
        // Suspended, or refused by its journal: the next owner finds its true state there.
        if crate::scheduler::unrecorded(&exited.reason) {
            return;
        }
        // Its end is in the journal: written into its record even if the shard has moved
        // on since (a drain), whose next owner then forgets the run.
        match workflows.get(id) {
            Ok(Some((record, revision))) if record.state == WorkflowState::Running && record.pid == pid.as_u64() => {
                if settle(workflows, record, revision, exited) {
                    self.sweep_later(shard);
                }
            }
            Ok(_) => {}
            Err(error) => {
                // The next look over the shard settles it from the journal.
                tracing::warn!(node = %self.node, shard, id, "cannot read a workflow's record: {error:#}");
            }
        }
    }

    /// Suspends shard `shard`'s processes into its journal, then gives its lease back.
    fn give_back(&self, shard: u32, held: Held) {
        drop(held.reading);
        held.scheduler.stop(Duration::from_secs(1));
        drop(held.scheduler);
        if let Err(error) = self.leases.release(held.lease) {
            tracing::warn!(node = %self.node, shard, "cannot give back shard {shard}'s lease: {error:#}");
        }
        tracing::info!(node = %self.node, shard, "gave back shard {shard}");
    }
}
