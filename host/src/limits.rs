//! Limits on what one process may do: those the scheduler checks for every process
//! ([`Limits`]), those a kind that sandboxes its processes runs them under and hands down
//! its tree ([`KindLimits`]), those a run carries to other nodes ([`RunLimits`]), and the
//! live counts of a process tree (and of a run on this node) that `max_children`,
//! `max_descendants` (and a run's `max_processes`) are checked against ([`Lineage`]).
//! Plain values and counters: nothing here names the scheduler, which checks them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::step::{CommandKind, Yield};

/// The per-process limits of a kind that sandboxes its processes (a Wasm component's):
/// what a process runs under, and so what bounds every process it spawns, on this node
/// or another, to any depth: a child runs under the tighter of these and its own kind's
/// limits, limit by limit ([`KindLimits::min`]), never looser than its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct KindLimits {
    /// Each process's memory cap, in bytes.
    pub max_memory: usize,
    /// How long a process runs before it is interrupted and the worker taken back.
    pub time_slice: std::time::Duration,
    /// Each process's whole-life fuel budget; `None`: no budget.
    pub fuel: Option<u64>,
    /// Each process's whole-life CPU time budget; `None`: no budget.
    pub cpu_budget: Option<std::time::Duration>,
}

impl KindLimits {
    /// A memory cap and a time slice, with no fuel or CPU budget.
    pub fn new(max_memory: usize, time_slice: std::time::Duration) -> Self {
        KindLimits { max_memory, time_slice, fuel: None, cpu_budget: None }
    }

    /// With a whole-life fuel budget of `units`. By default none.
    #[must_use]
    pub fn fuel(mut self, units: u64) -> Self {
        self.fuel = Some(units);
        self
    }

    /// With a whole-life CPU time budget. By default none.
    #[must_use]
    pub fn cpu_budget(mut self, budget: std::time::Duration) -> Self {
        self.cpu_budget = Some(budget);
        self
    }

    /// The tighter of `self` and `other`, limit by limit; a budget that one side lacks
    /// is the other's.
    #[must_use]
    pub fn min(self, other: KindLimits) -> KindLimits {
        fn budget<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        KindLimits {
            max_memory: self.max_memory.min(other.max_memory),
            time_slice: self.time_slice.min(other.time_slice),
            fuel: budget(self.fuel, other.fuel),
            cpu_budget: budget(self.cpu_budget, other.cpu_budget),
        }
    }

    /// The tighter of two optional limits: `None` bounds nothing.
    pub(crate) fn tighter(a: Option<KindLimits>, b: Option<KindLimits>) -> Option<KindLimits> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Limits a run sets for its processes, tighter than a node's own (its
/// [`Builder`](crate::scheduler::Builder)'s), that travel with the spawns of its process trees to
/// other nodes: each node runs the spawned process, and everything it spawns there,
/// under the tighter of each of these and its own, and its spawns to further nodes carry
/// what it runs under. Each unset: the node's own. By default none is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunLimits {
    pub(crate) max_children: Option<usize>,
    pub(crate) max_yields_per_step: Option<usize>,
    pub(crate) max_payload_size: Option<usize>,
    pub(crate) max_output_per_step: Option<usize>,
    pub(crate) mailbox_capacity: Option<usize>,
    pub(crate) mailbox_bytes: Option<usize>,
    pub(crate) max_links: Option<usize>,
    pub(crate) max_processes: Option<usize>,
}

impl RunLimits {
    /// None set: the nodes' own.
    pub fn new() -> Self {
        Self::default()
    }

    /// As [`Builder::max_children`](crate::scheduler::Builder::max_children).
    pub fn max_children(mut self, children: usize) -> Self {
        self.max_children = Some(children);
        self
    }

    /// As [`Builder::max_yields_per_step`](crate::scheduler::Builder::max_yields_per_step).
    pub fn max_yields_per_step(mut self, yields: usize) -> Self {
        self.max_yields_per_step = Some(yields);
        self
    }

    /// As [`Builder::max_payload_size`](crate::scheduler::Builder::max_payload_size).
    pub fn max_payload_size(mut self, bytes: usize) -> Self {
        self.max_payload_size = Some(bytes);
        self
    }

    /// As [`Builder::max_output_per_step`](crate::scheduler::Builder::max_output_per_step).
    pub fn max_output_per_step(mut self, bytes: usize) -> Self {
        self.max_output_per_step = Some(bytes);
        self
    }

    /// As [`Builder::mailbox_capacity`](crate::scheduler::Builder::mailbox_capacity).
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = Some(capacity);
        self
    }

    /// As [`Builder::mailbox_bytes`](crate::scheduler::Builder::mailbox_bytes).
    pub fn mailbox_bytes(mut self, bytes: usize) -> Self {
        self.mailbox_bytes = Some(bytes);
        self
    }

    /// As [`Builder::max_links`](crate::scheduler::Builder::max_links).
    pub fn max_links(mut self, links: usize) -> Self {
        self.max_links = Some(links);
        self
    }

    /// The most processes of the run alive at once on each node, the entry included: a
    /// spawn on a node that already runs as many of the run's processes fails. Each node
    /// counts only the run's processes it runs itself (there is no count across nodes),
    /// under the tighter of this and its own
    /// [`Builder::max_processes`](crate::scheduler::Builder::max_processes).
    pub fn max_processes(mut self, processes: usize) -> Self {
        self.max_processes = Some(processes);
        self
    }
}

/// Limits on what one process may do, checked by the scheduler for every process
/// (native or Wasm). A process past one of them ends with an error naming it (DESIGN §6):
/// the limits exist to stop misbehaving processes, not to be negotiated with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_yields_per_step: usize,
    pub(crate) max_payload_size: usize,
    /// The bytes all of one step's commands carry together (see `Builder::max_output_per_step`).
    pub(crate) max_output_per_step: usize,
    pub(crate) max_children: usize,
    pub(crate) max_descendants: usize,
    /// The most processes one process may be linked to at once (`link` past it fails).
    pub(crate) max_links: usize,
}

impl Limits {
    /// Checks one step's yields, from a process with the live children and tree of
    /// `lineage`: the error ends the process, and none of the yields is carried out.
    pub(crate) fn check(&self, yields: &[Yield], lineage: &Lineage) -> Result<(), String> {
        if yields.len() > self.max_yields_per_step {
            return Err(yield_limit_exceeded(yields.len(), self.max_yields_per_step));
        }
        let mut spawns = 0;
        let mut output = 0usize;
        for y in yields {
            if y.command.kind() == CommandKind::Spawn {
                spawns += 1;
            }
            let size = y.command.payload_size();
            self.check_payload(size, y.command.name())?;
            output = output.saturating_add(size);
        }
        if output > self.max_output_per_step {
            return Err(output_limit_exceeded(output, self.max_output_per_step));
        }
        // A step that spawns nothing adds to no count: the counts of its tree, shared
        // with every process in it and so often on another core, are not read.
        if spawns == 0 {
            return Ok(());
        }
        let children = lineage.children();
        if children + spawns > self.max_children {
            return Err(format!(
                "child limit exceeded: {spawns} more spawns with {children} children alive would pass \
                 `max_children` ({})",
                self.max_children
            ));
        }
        let tree = lineage.tree_size();
        if tree + spawns > self.max_descendants {
            return Err(format!(
                "process tree limit exceeded: {spawns} more spawns with {tree} processes alive in this process's \
                 tree would pass `max_descendants` ({})",
                self.max_descendants
            ));
        }
        if let Some(run) = lineage.run_processes() {
            let live = run.live.load(Ordering::Relaxed);
            if live + spawns > run.max {
                return Err(run_process_limit_exceeded(spawns, live, run.max, run.owner.as_deref()));
            }
        }
        Ok(())
    }

    /// Checks a payload of `size` bytes that a process hands to `what`.
    pub(crate) fn check_payload(&self, size: usize, what: &str) -> Result<(), String> {
        if size > self.max_payload_size {
            return Err(payload_limit_exceeded(size, what, self.max_payload_size));
        }
        Ok(())
    }
}

/// The error of `spawns` more spawns of a run that has `live` processes alive on this
/// node, over its `max`.
pub(crate) fn run_process_limit_exceeded(spawns: usize, live: usize, max: usize, owner: Option<&str>) -> String {
    match owner {
        Some(owner) => format!(
            "process limit exceeded: {spawns} more spawns with {live} processes of {owner} alive would pass its \
             process quota ({max})"
        ),
        None => format!(
            "process limit exceeded: {spawns} more spawns with {live} processes of this run alive on this node \
             would pass the run's `max_processes` ({max})"
        ),
    }
}

/// The error that ends a process whose step yielded `yielded` commands, over `max`.
pub(crate) fn yield_limit_exceeded(yielded: usize, max: usize) -> String {
    format!("yield limit exceeded: one step yielded {yielded} commands, more than `max_yields_per_step` ({max})")
}

/// The error that ends a process that handed `what` a payload of `size` bytes, over `max`.
pub(crate) fn payload_limit_exceeded(size: usize, what: &str, max: usize) -> String {
    format!("payload limit exceeded: a {size}-byte payload for `{what}` is over `max_payload_size` ({max} bytes)")
}

/// The error that ends a process whose step's commands (and result) carried `bytes`
/// together, over `max`.
pub(crate) fn output_limit_exceeded(bytes: usize, max: usize) -> String {
    format!(
        "step output limit exceeded: one step's commands and result carry {bytes} bytes, more than \
         `max_output_per_step` ({max} bytes)"
    )
}

/// The run a process belongs to, inherited down its tree and carried with its spawns to
/// other nodes: when the run is over (its node or client leaves or is lost, or stops
/// it) its processes end on every node, and only its tree may spawn by hash the
/// components it brought (see `cluster/`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RunId {
    /// The node whose run it is: the node whose embedder started the tree, or that holds
    /// the session of the client that did. 0: none (outside a cluster); in a spawn for
    /// another node, the spawning node's own run.
    pub(crate) node: u16,
    /// The client's run on that node, drawn for its session; 0 for a node's own run.
    pub(crate) client: u64,
}

/// The limits a process tree runs under when its run set its own: a remote spawn's
/// [`RunLimits`], each clamped to this scheduler's. Shared by the whole tree here (a
/// child takes its parent's), and carried on with the tree's spawns to other nodes.
#[derive(Debug)]
pub(crate) struct RunBound {
    pub(crate) limits: Limits,
    pub(crate) mailbox_capacity: usize,
    pub(crate) mailbox_bytes: usize,
    /// The run's live processes here, if the run bounds them.
    pub(crate) processes: Option<RunProcesses>,
}

/// The processes of one run alive on this scheduler, against the run's `max_processes`
/// (the tighter of the run's and the scheduler's): one count for every tree of the run
/// here, however many remote spawns started them.
#[derive(Debug)]
pub(crate) struct RunProcesses {
    pub(crate) max: usize,
    /// Counted from each process's registration to its retirement ([`Lineage::enter`],
    /// [`Lineage::leave`]), roots included. `Relaxed`: it orders nothing, it only bounds
    /// a number; two trees of the run spawning at once may pass it by their spawns, as
    /// the tree's count may.
    pub(crate) live: Arc<AtomicUsize>,
    /// Whose count it is when an embedder's [`ProcessQuota`] made it, for the error past
    /// it; `None` for a run's.
    pub(crate) owner: Option<Arc<str>>,
}

/// A bound on the live processes of every process tree spawned under it (see
/// [`SpawnOptions::quota`](crate::scheduler::SpawnOptions::quota)): each root and all of
/// its descendants count, from their spawn to their end, on this scheduler. For an
/// embedder that gives a group of roots one bound (the service gives each tenant one).
/// Cheap to clone; clones share one count.
///
/// The count is checked at each spawn and is not a lock: roots or children spawned at
/// the same moment may pass it by those spawns, once.
#[derive(Clone, Debug)]
pub struct ProcessQuota {
    live: Arc<AtomicUsize>,
    max: usize,
    owner: Arc<str>,
}

impl ProcessQuota {
    /// A quota of `max` live processes, called `owner` in the error of a spawn past it
    /// (``tenant `acme` ``).
    pub fn new(owner: impl Into<Arc<str>>, max: usize) -> Self {
        ProcessQuota { live: Arc::default(), max, owner: owner.into() }
    }

    /// The same count under another bound: the processes counted so far stay counted,
    /// and those spawned under either quota count against both.
    pub fn with_max(&self, max: usize) -> Self {
        ProcessQuota { live: self.live.clone(), max, owner: self.owner.clone() }
    }

    /// The processes alive now under this quota's count.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The most it allows.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Who it is for, as its errors name it.
    pub fn owner(&self) -> &str {
        &self.owner
    }
}

impl RunBound {
    /// What `asked` leaves of this scheduler's own `limits` and mailbox bounds: the
    /// tighter of each, never wider than this scheduler's. `processes`: the run's count
    /// here and the scheduler's own `max_processes`, when the run bounds its processes.
    pub(crate) fn clamp(
        asked: &RunLimits,
        limits: &Limits,
        mailbox_capacity: usize,
        mailbox_bytes: usize,
        processes: Option<(Arc<AtomicUsize>, usize)>,
    ) -> Self {
        let tighter = |asked: Option<usize>, own: usize| asked.map_or(own, |asked| asked.min(own));
        RunBound {
            limits: Limits {
                max_yields_per_step: tighter(asked.max_yields_per_step, limits.max_yields_per_step),
                max_payload_size: tighter(asked.max_payload_size, limits.max_payload_size),
                max_output_per_step: tighter(asked.max_output_per_step, limits.max_output_per_step),
                max_children: tighter(asked.max_children, limits.max_children),
                max_descendants: limits.max_descendants,
                max_links: tighter(asked.max_links, limits.max_links),
            },
            mailbox_capacity: tighter(asked.mailbox_capacity, mailbox_capacity).max(1),
            mailbox_bytes: tighter(asked.mailbox_bytes, mailbox_bytes).max(1),
            processes: asked.max_processes.zip(processes).map(|(asked, (live, own))| RunProcesses {
                max: asked.min(own),
                live,
                owner: None,
            }),
        }
    }

    /// The bound of a tree spawned under `quota`: this scheduler's own limits and
    /// mailbox bounds, and the quota's count.
    pub(crate) fn quota(quota: &ProcessQuota, limits: &Limits, mailbox_capacity: usize, mailbox_bytes: usize) -> Self {
        RunBound {
            limits: *limits,
            mailbox_capacity,
            mailbox_bytes,
            processes: Some(RunProcesses {
                max: quota.max,
                live: quota.live.clone(),
                owner: Some(quota.owner.clone()),
            }),
        }
    }

    /// The limits a spawn of this tree carries to another node.
    pub(crate) fn carried(&self) -> RunLimits {
        RunLimits {
            max_children: Some(self.limits.max_children),
            max_yields_per_step: Some(self.limits.max_yields_per_step),
            max_payload_size: Some(self.limits.max_payload_size),
            max_output_per_step: Some(self.limits.max_output_per_step),
            mailbox_capacity: Some(self.mailbox_capacity),
            mailbox_bytes: Some(self.mailbox_bytes),
            max_links: Some(self.limits.max_links),
            max_processes: self.processes.as_ref().map(|processes| processes.max),
        }
    }
}

/// A process's place in its process tree: the live counts that [`Limits::check`] bounds.
/// Every count is `Relaxed`: it orders nothing, it only bounds a number.
#[derive(Default)]
pub(crate) struct Lineage {
    /// The live-children count of the process that spawned this one, which counts this
    /// one until it retires; `None` for a root (spawned by the embedder). The count
    /// alone, not the parent: a child does not keep its parent alive.
    parent_children: Option<Arc<AtomicUsize>>,
    /// Live children, for `max_children`: made when the process first spawns, and shared
    /// with each child. Incremented only by this process's own dispatch (it is
    /// `Running`, so one thread), decremented by each child's retire on any thread.
    children: OnceLock<Arc<AtomicUsize>>,
    /// The live descendants of this process's root (the root itself not counted), for
    /// `max_descendants`: shared by the whole tree. A root makes it when it first
    /// spawns; a child gets its parent's at creation.
    tree: OnceLock<Arc<AtomicUsize>>,
    /// The sandbox limits the process runs under, inherited down its tree: each spawn it
    /// makes, here or on another node, is bounded by them. `None` when it runs under
    /// none, or was restored from a journal: its kind's own then (`Shared::sandbox_of`).
    sandbox: Option<KindLimits>,
    /// The run the process belongs to, shared by its whole tree, here and on other
    /// nodes: when the run is over the process is ended (see `cluster/node/`), so
    /// nothing keeps running for a run whose node or client is gone.
    run: RunId,
    /// The limits its run set, if it set any (a remote spawn's): they replace the
    /// scheduler's for this process and its tree. `None`: the scheduler's own.
    bound: Option<Arc<RunBound>>,
}

impl Lineage {
    /// The lineage of a new child of the process whose lineage is `parent`.
    pub(crate) fn child_of(parent: &Lineage) -> Self {
        Lineage {
            parent_children: Some(parent.children.get_or_init(Arc::default).clone()),
            children: OnceLock::new(),
            tree: OnceLock::from(parent.tree.get_or_init(Arc::default).clone()),
            sandbox: None,
            run: parent.run,
            bound: parent.bound.clone(),
        }
    }

    /// This lineage, for a process whose run set the limits `bound`.
    pub(crate) fn bounded(mut self, bound: Option<Arc<RunBound>>) -> Self {
        self.bound = bound;
        self
    }

    /// The limits the process's run set, if it set any.
    pub(crate) fn run_bound(&self) -> Option<&RunBound> {
        self.bound.as_deref()
    }

    /// The count of its run's processes here, if the run bounds them.
    pub(crate) fn run_processes(&self) -> Option<&RunProcesses> {
        self.bound.as_deref().and_then(|bound| bound.processes.as_ref())
    }

    /// This lineage, for a process of the run `run`.
    pub(crate) fn in_run(mut self, run: RunId) -> Self {
        self.run = run;
        self
    }

    /// The run the process belongs to.
    pub(crate) fn run(&self) -> RunId {
        self.run
    }

    /// This lineage, for a process that runs under `sandbox`.
    pub(crate) fn within(mut self, sandbox: Option<KindLimits>) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// The sandbox limits the process runs under, if it was spawned under any.
    pub(crate) fn sandbox(&self) -> Option<KindLimits> {
        self.sandbox
    }

    /// Counts the process in its parent's children and its tree, from its registration
    /// on, so that [`Lineage::leave`] (which every registered process reaches, even one
    /// whose init fails) can always take it back. A root is not counted in a tree; every
    /// process, roots included, counts in its run's count here when the run bounds it.
    pub(crate) fn enter(&self) {
        if let Some(run) = self.run_processes() {
            run.live.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(siblings) = &self.parent_children {
            siblings.fetch_add(1, Ordering::Relaxed);
            if let Some(tree) = self.tree.get() {
                tree.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes back what [`Lineage::enter`] counted, when the process retires.
    pub(crate) fn leave(&self) {
        if let Some(run) = self.run_processes() {
            run.live.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(siblings) = &self.parent_children {
            siblings.fetch_sub(1, Ordering::Relaxed);
            if let Some(tree) = self.tree.get() {
                tree.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Live children.
    pub(crate) fn children(&self) -> usize {
        self.children.get().map_or(0, |children| children.load(Ordering::Relaxed))
    }

    /// Live descendants of this process's root.
    pub(crate) fn tree_size(&self) -> usize {
        self.tree.get().map_or(0, |tree| tree.load(Ordering::Relaxed))
    }
}
