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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::config::ClusterConfig;
use super::journal::{JetStreamOptions, JetStreamStore};
use super::lease::{Lease, LeaseOptions, Leases, Renewal, Shares};
use crate::Pid;
use crate::journal::Journal;
use crate::scheduler::{Builder, Handle, Scheduler};

/// Builds the durable scheduler of a shard from a builder already given the shard's
/// journal and pids: the kinds, workers and grants the node runs its processes with.
pub type BuildShard = dyn Fn(u32, Builder) -> anyhow::Result<Scheduler> + Send + Sync;

/// The most shards a cluster may have.
pub const MAX_SHARDS: u32 = 1024;
/// The first of the pid node ids that name shards (shard `s` is `Pid::MAX_NODE - 1 - s`);
/// nodes draw their ids below it.
pub const FIRST_SHARD_NODE: u16 = Pid::MAX_NODE - MAX_SHARDS as u16;

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
}

impl ShardOptions {
    /// `shards` shards, with the journal's and the leases' defaults.
    pub fn new(shards: u32) -> Self {
        ShardOptions { shards, journal: JetStreamOptions::new(), leases: LeaseOptions::new() }
    }

    /// Where the shards' journals live (the shard number is set per shard).
    pub fn journal(mut self, journal: JetStreamOptions) -> Self {
        self.journal = journal;
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
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Inner {
    cluster: ClusterConfig,
    node: String,
    options: ShardOptions,
    leases: Leases,
    build: Box<BuildShard>,
    held: Mutex<BTreeMap<u32, Held>>,
    /// Set to stop the host's thread: `drain` gives the shards back, `abandon` does not.
    stopping: AtomicBool,
    draining: AtomicBool,
}

struct Held {
    lease: Lease,
    scheduler: Scheduler,
    /// When the lease was last renewed, by this host's clock.
    renewed: Instant,
}

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
        let inner = Arc::new(Inner {
            cluster: cluster.clone(),
            node: node.to_owned(),
            options,
            leases,
            build: Box::new(build),
            held: Mutex::new(BTreeMap::new()),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("wasmproc-shards".to_owned())
            .spawn(move || worker.run())
            .map_err(|e| anyhow::anyhow!("cannot start the shards' thread: {e}"))?;
        Ok(ShardHost { inner, thread: Mutex::new(Some(thread)) })
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
        if let Some(thread) = self.thread.lock().take() {
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
    fn run(&self) {
        let tick = self.leases.ttl() / 4;
        let mut next_announce = Instant::now();
        while !self.stopping.load(Ordering::Acquire) {
            if Instant::now() >= next_announce {
                if let Err(error) = self.leases.announce() {
                    tracing::warn!(node = %self.node, "cannot announce this node to the shards: {error:#}");
                }
                next_announce = Instant::now() + tick * 2;
            }
            self.renew();
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
            if let Err(error) = self.leases.leave() {
                tracing::warn!(node = %self.node, "cannot say this node left the shards: {error:#}");
            }
        }
    }

    /// Renews every lease held; stops the shards whose lease is lost, or was not renewed
    /// for a whole time to live. The renewals go to the server without `held` locked, so
    /// [`ShardHost::handle`] never waits on the network; only this thread changes `held`.
    fn renew(&self) {
        let leases: Vec<(u32, Lease, Instant)> =
            self.held.lock().iter().map(|(shard, one)| (*shard, one.lease.clone(), one.renewed)).collect();
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
        let opened =
            JetStreamStore::open(&self.cluster, &self.options.journal.clone().shard(shard)).and_then(|store| {
                let builder = Scheduler::builder().journal(Journal::with_store(store)).pid_node(shard_node(shard));
                (self.build)(shard, builder)
            });
        match opened {
            Ok(scheduler) => {
                tracing::info!(node = %self.node, shard, "took shard {shard}");
                self.held.lock().insert(shard, Held { lease, scheduler, renewed: Instant::now() });
                Ok(())
            }
            Err(error) => {
                let _ = self.leases.release(lease);
                Err(error.context(format!("cannot run shard {shard}")))
            }
        }
    }

    /// Suspends shard `shard`'s processes into its journal, then gives its lease back.
    fn give_back(&self, shard: u32, held: Held) {
        held.scheduler.stop(Duration::from_secs(1));
        drop(held.scheduler);
        if let Err(error) = self.leases.release(held.lease) {
            tracing::warn!(node = %self.node, shard, "cannot give back shard {shard}'s lease: {error:#}");
        }
        tracing::info!(node = %self.node, shard, "gave back shard {shard}");
    }
}
