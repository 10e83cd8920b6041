//! What a scheduler does for a cluster (see `remote.rs`, the seam between the two): hand
//! a spawn that its placement sends elsewhere to the cluster, and, on behalf of another
//! node, deliver an exit to a local watcher, watch or terminate a local process, make or
//! remove a local process's half of a link to one of that node, deliver its exit
//! signals, spawn one for a remote parent, and find or end the processes of a run,
//! through `pub(crate)` methods of [`Handle`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use wasmproc_types::{ExitReason, Pid};

use super::caps::Capabilities;
use super::cell::{ProcessCell, Watcher};
use super::handle::Handle;
use super::inbox::{LinkRefused, Signal};
use super::lifecycle::SpawnArgs;
use super::links::link_limit;
use super::remote::{Notify, RemoteSignal, RemoteSpawn, Verdict};
use super::shared::Shared;
use super::state::Wake;
use crate::error::{SendError, SpawnError};
use crate::handler::{Completer, Factory, make_under};
use crate::limits::{KindLimits, Lineage, RunBound, RunId};
use crate::step::{Event, SpawnRequest};

impl Shared {
    /// The count of `run`'s live processes here, shared by every tree of the run.
    fn run_processes(&self, run: RunId) -> Arc<AtomicUsize> {
        let mut runs = self.run_processes.lock();
        if let Some(live) = runs.get(&run).and_then(Weak::upgrade) {
            return live;
        }
        runs.retain(|_, live| live.strong_count() > 0);
        let live = Arc::new(AtomicUsize::new(0));
        runs.insert(run, Arc::downgrade(&live));
        live
    }

    /// Hands `request` to the cluster when its placement picks another node; gives it
    /// back otherwise.
    pub(super) fn spawn_elsewhere(
        &self,
        parent: &Arc<ProcessCell>,
        request: SpawnRequest,
        done: impl FnOnce() -> Completer,
    ) -> Result<(), SpawnRequest> {
        let Some(remote) = &self.remote else { return Err(request) };
        let Some(node) = remote.place() else { return Err(request) };
        let kind = request.kind.clone().or_else(|| parent.spec.kind.as_deref().map(str::to_owned));
        let factory = kind.as_deref().and_then(|kind| match self.kinds.factory(kind) {
            Some(factory) => Some(factory),
            None => remote.factory(kind, parent.lineage.run()),
        });
        let (identity, own) = factory.map_or((None, None), |factory| (factory.identity(), factory.limits()));
        let limits = KindLimits::tighter(self.sandbox_of(parent), own);
        let spawn = RemoteSpawn {
            parent: parent.pid(),
            kind,
            identity,
            method: request.method,
            input: request.input,
            caps: (*parent.spec.caps).clone(),
            mailbox_capacity: parent.spec.mailbox_capacity,
            limits,
            run_limits: parent.lineage.run_bound().map(|bound| Box::new(bound.carried())),
            monitor: request.monitor,
            link: request.link,
            run: parent.lineage.run(),
        };
        remote.spawn(node, spawn, done());
        Ok(())
    }
}

#[cfg_attr(
    not(feature = "cluster"),
    expect(dead_code, reason = "only a cluster (feature `cluster`) reaches processes of other nodes")
)]
impl Handle {
    /// This scheduler's node (0 outside a cluster).
    pub fn node(&self) -> u16 {
        self.shared.node
    }

    /// Counts a monitor that local process `watcher` holds on `target` (a child it
    /// spawned on another node, monitored), so that the exit [`Handle::exit_to`] later
    /// delivers for it is taken (see `Inbox::push_monitor_exit`).
    pub(crate) fn count_monitor(&self, watcher: Pid, target: Pid) {
        if let Some(cell) = self.shared.registry.get(watcher) {
            cell.inbox.add_monitor(target);
        }
    }

    /// Delivers the exit of `pid` (a process of another node) that a monitor of the local
    /// `watcher` reports. False if the watcher has ended, or no longer monitors `pid`.
    pub(crate) fn exit_to(&self, watcher: Pid, pid: Pid, reason: ExitReason) -> bool {
        let Some(cell) = self.shared.registry.get(watcher) else { return false };
        match cell.deliver_monitor_exit(pid, reason) {
            Ok(wake) => {
                if wake == Some(Wake::Schedule) {
                    self.shared.schedule(cell);
                }
                wake.is_some()
            }
            Err(_) => false,
        }
    }

    /// Calls `notify` with `target`'s result when it ends. Hands `notify` back if there
    /// is no such process, or it is already ending.
    pub(crate) fn watch(&self, target: Pid, notify: Notify) -> Result<(), Notify> {
        let Some(cell) = self.shared.registry.get(target) else { return Err(notify) };
        cell.inbox.watch(Watcher::Notify(notify)).map_err(|watcher| match watcher {
            Watcher::Notify(notify) => notify,
            _ => unreachable!("`watch` hands back the watcher it was given"),
        })
    }

    /// Terminates `target` on behalf of another node, calling `notify` once it has
    /// ended. Hands `notify` back with the reason if it cannot.
    pub(crate) fn terminate_watched(&self, target: Pid, notify: Notify) -> Result<(), (SendError, Notify)> {
        self.shared.terminate(target, Some(Watcher::Notify(notify))).map_err(|(error, watcher)| match watcher {
            Some(Watcher::Notify(notify)) => (error, notify),
            _ => unreachable!("`terminate` hands back the watcher it was given"),
        })
    }

    /// Spawns a process for a parent on another node, with the grants and mailbox the
    /// request carried (never wider than this scheduler's defaults allow: the caller
    /// intersects them) and under the tighter of the carried limits and `factory`'s own
    /// ([`Factory::make_within`]), as the root of a process tree here whose spawns are
    /// bounded by those limits in turn. `notify` hears its result; `spawned` is called
    /// with its pid before it is queued, so whatever it sends goes before anything the
    /// process does.
    pub(crate) fn spawn_for_remote(
        &self,
        factory: &dyn Factory,
        kind: Arc<str>,
        spawn: RemoteSpawn,
        notify: Option<Notify>,
        spawned: impl FnOnce(Pid),
    ) -> Result<Pid, SpawnError> {
        let run = match spawn.run.node {
            0 => RunId { node: spawn.parent.node(), ..spawn.run },
            _ => spawn.run,
        };
        let settings = &self.shared.settings;
        let bound = spawn.run_limits.map(|asked| {
            let processes = asked.max_processes.map(|_| (self.shared.run_processes(run), settings.max_processes));
            Arc::new(RunBound::clamp(
                &asked,
                &settings.limits,
                settings.mailbox_capacity,
                settings.mailbox_bytes,
                processes,
            ))
        });
        if let Some(run) = bound.as_ref().and_then(|bound| bound.processes.as_ref())
            && run.live.load(Ordering::Relaxed) >= run.max
        {
            return Err(SpawnError::RunLimitExceeded { limit: run.max });
        }
        let (process, sandbox) = make_under(factory, spawn.limits)
            .map_err(|source| SpawnError::Factory { kind: kind.to_string(), source })?;
        let args = SpawnArgs {
            parent: spawn.parent,
            origin: None,
            kind: Some(kind),
            method: spawn.method,
            input: spawn.input,
            caps: Arc::new(spawn.caps),
            // Whatever the wire says, no larger than this scheduler's own bound, nor the
            // run's.
            mailbox_capacity: match spawn.mailbox_capacity {
                0 => settings.mailbox_capacity,
                capacity => capacity.min(settings.mailbox_capacity),
            }
            .min(bound.as_ref().map_or(usize::MAX, |bound| bound.mailbox_capacity)),
            watcher: notify.map(Watcher::Notify),
            linked_to: None,
            lineage: Lineage::default().within(sandbox).in_run(run).bounded(bound),
            note: None,
            identity: self.shared.identity_of(factory),
            recorder: None,
        };
        let cell = self.shared.spawn_unqueued(process, args)?;
        let pid = cell.pid();
        // Before it first runs, and before its pid is told to anyone who could end it:
        // its inbox is open. Its parent's half is made when the parent's node hears of
        // the spawn.
        if spawn.link && !spawn.parent.is_host() {
            let linked = cell.inbox.add_link(spawn.parent, usize::MAX);
            debug_assert!(linked.is_ok(), "a process spawned and not yet queued has an open inbox");
        }
        spawned(pid);
        self.shared.schedule(cell);
        Ok(pid)
    }

    /// Links local `target` to `from` (a process of another node, whose side of the link
    /// its node made), unless `child_only` and `target` is no child of `from`.
    pub(crate) fn link_from_remote(&self, from: Pid, target: Pid, child_only: bool) -> Verdict {
        let cell = match self.shared.registry.get(target) {
            Some(cell) if !child_only || cell.spec.parent == from => cell,
            _ if child_only => return Verdict::NotChild,
            _ => return Verdict::Noproc,
        };
        match cell.inbox.add_link(from, self.shared.limits_of(&cell).max_links) {
            Ok(()) => Verdict::Done,
            Err(LinkRefused::Full { limit }) => Verdict::Failed(link_limit(target, limit)),
            Err(LinkRefused::Closed) => Verdict::Noproc,
        }
    }

    /// Removes local process `local`'s half of its link to `partner` (of another node).
    pub(crate) fn unlink_local(&self, local: Pid, partner: Pid) {
        if let Some(cell) = self.shared.registry.get(local) {
            cell.inbox.remove_link(partner);
        }
    }

    /// Delivers an exit signal from `from` (a process of another node) to local
    /// `target`, unless `child_only` and `target` is no child of `from`. A
    /// [`Signal::Link`] signal acts only if `target` holds a link to `from`.
    pub(crate) fn signal_from_remote(&self, from: Pid, target: Pid, signal: RemoteSignal, child_only: bool) -> Verdict {
        match self.shared.registry.get(target) {
            Some(cell) if !child_only || cell.spec.parent == from => {
                self.shared.signal_cell(&cell, from, &signal.reason, signal.how);
                Verdict::Done
            }
            _ if child_only => Verdict::NotChild,
            _ => Verdict::Noproc,
        }
    }

    /// Makes `parent`'s half of its link to `child`, which it spawned with `link` on
    /// another node (whose half is made). False if `parent` has ended meanwhile.
    pub(crate) fn link_child(&self, parent: Pid, child: Pid) -> bool {
        // One past `max_links` at most: the spawn was checked against it.
        self.shared.registry.get(parent).is_some_and(|cell| cell.inbox.add_link(child, usize::MAX).is_ok())
    }

    /// Whether local `target` is a child of `parent`.
    pub(crate) fn is_child_of(&self, target: Pid, parent: Pid) -> bool {
        self.shared.registry.get(target).is_some_and(|cell| cell.spec.parent == parent)
    }

    /// Sends every local process linked to a process of node `node` a [`Signal::Link`]
    /// signal from that process with `reason`: what a node does when `node` is lost.
    /// Returns how many links it ended.
    pub(crate) fn signal_links_to_node(&self, node: u16, reason: &ExitReason) -> usize {
        let mut ended = 0;
        for cell in self.shared.registry.snapshot() {
            for partner in cell.inbox.links_on(node) {
                self.shared.signal_cell(&cell, partner, reason, Signal::Link);
                ended += 1;
            }
        }
        ended
    }

    /// Delivers a cancel with `reason` to every process of a run node `node` owns, or
    /// spawned by a process of that node: what a node does when `node` leaves, is lost,
    /// or asks its run to stop. Returns how many it reached.
    pub(crate) fn cancel_owned_by(&self, node: u16, reason: &str) -> usize {
        self.cancel_cells(self.owned_by(node), reason)
    }

    /// Delivers a cancel with `reason` to every process of the client's run `client`
    /// ([`RunId::client`]): what a node does when that client leaves, goes silent or
    /// stops its run. Returns how many it reached.
    pub(crate) fn cancel_client_run(&self, client: u64, reason: &str) -> usize {
        self.cancel_cells(self.in_client_run(client), reason)
    }

    /// Ends at once, with `reason`, every process of the client's run `client`.
    pub(crate) fn terminate_client_run(&self, client: u64, reason: ExitReason) -> usize {
        let cells = self.in_client_run(client);
        cells.iter().filter(|cell| self.shared.terminate_cell(cell, reason.clone()).is_ok()).count()
    }

    /// The live processes of the client's run `client` (never 0: that is every node's
    /// own).
    fn in_client_run(&self, client: u64) -> Vec<Arc<ProcessCell>> {
        let mut cells = self.shared.registry.snapshot();
        cells.retain(|cell| client != 0 && cell.lineage.run().client == client);
        cells
    }

    fn cancel_cells(&self, cells: Vec<Arc<ProcessCell>>, reason: &str) -> usize {
        let mut reached = 0;
        for cell in cells {
            if let Ok(wake) = cell.deliver(Event::Cancel { reason: reason.to_owned() }) {
                reached += 1;
                if wake == Wake::Schedule {
                    self.shared.schedule(cell);
                }
            }
        }
        reached
    }

    /// Ends at once, with `reason`, every process [`Handle::cancel_owned_by`]
    /// reaches for `node`; returns how many.
    pub(crate) fn terminate_owned_by(&self, node: u16, reason: ExitReason) -> usize {
        let cells = self.owned_by(node);
        cells.iter().filter(|cell| self.shared.terminate_cell(cell, reason.clone()).is_ok()).count()
    }

    /// The live processes that belong to node `node`'s run or whose parent runs there.
    fn owned_by(&self, node: u16) -> Vec<Arc<ProcessCell>> {
        let mut cells = self.shared.registry.snapshot();
        cells.retain(|cell| {
            cell.lineage.run().node == node || (cell.spec.parent.node() == node && node != self.shared.node)
        });
        cells
    }

    /// The run process `pid` belongs to, if it is alive and belongs to one.
    pub(crate) fn run_of(&self, pid: Pid) -> Option<RunId> {
        self.shared.registry.get(pid).map(|cell| cell.lineage.run()).filter(|run| run.node != 0)
    }

    /// The factory of the registered kind `kind`, with its name as the registry holds it.
    pub(crate) fn registered_kind(&self, kind: &str) -> Option<(Arc<str>, Arc<dyn Factory>)> {
        self.shared.kinds.find(kind, None)
    }

    /// The registered kinds with their identities.
    pub(crate) fn kinds(&self) -> Vec<(String, Option<String>)> {
        self.shared.kinds.registered().map(|(name, factory)| (name.to_string(), factory.identity())).collect()
    }

    /// What this scheduler's processes may do unless told otherwise: a bound on what a
    /// remote spawn may grant.
    pub(crate) fn default_capabilities(&self) -> &Capabilities {
        &self.shared.settings.capabilities
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::RunLimits;
    use crate::testing::Idle;
    use crate::{Process, Scheduler};

    /// A spawn of the `main` method from node 3's host, asking for nothing.
    fn remote_spawn() -> RemoteSpawn {
        RemoteSpawn {
            parent: Pid::node_host(3),
            kind: None,
            identity: None,
            method: "main".into(),
            input: vec![],
            caps: Capabilities::default(),
            mailbox_capacity: 0,
            limits: None,
            run_limits: None,
            monitor: false,
            link: false,
            run: RunId::default(),
        }
    }

    /// A remote spawn's mailbox bound, whatever the wire says, is no larger
    /// than the receiving scheduler's own; 0 asks for that.
    #[test]
    fn a_remote_spawns_mailbox_bound_is_clamped_to_the_schedulers() {
        let scheduler = Scheduler::builder().workers(1).mailbox_capacity(8).build().expect("builds");
        let handle = scheduler.handle();
        let factory = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Idle)) };
        for (asked, got) in [(1 << 40, 8), (0, 8), (3, 3)] {
            let spawn = RemoteSpawn { mailbox_capacity: asked, ..remote_spawn() };
            let pid = handle.spawn_for_remote(&factory, "idle".into(), spawn, None, |_| {}).expect("spawns");
            let cell = handle.shared.registry.get(pid).expect("alive");
            assert_eq!(cell.spec.mailbox_capacity, got, "asked for {asked}");
        }
        scheduler.stop(std::time::Duration::ZERO);
    }

    /// A remote spawn's run limits, whatever the wire says, are no wider than the
    /// receiving scheduler's own: each is the tighter of the two, one not asked for is
    /// the scheduler's, and the process's limits (and its mailbox) are those; its
    /// spawns to other nodes carry them on.
    #[test]
    fn a_remote_spawns_run_limits_are_clamped_to_the_schedulers() {
        let scheduler = Scheduler::builder()
            .workers(1)
            .max_children(10)
            .max_yields_per_step(20)
            .max_payload_size(1000)
            .mailbox_capacity(8)
            .mailbox_bytes(4096)
            .max_links(6)
            .max_processes(50)
            .build()
            .expect("builds");
        let handle = scheduler.handle();
        let factory = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Idle)) };
        let asked = RunLimits::new()
            .max_children(1 << 40)
            .max_yields_per_step(5)
            .max_payload_size(usize::MAX)
            .mailbox_capacity(3)
            .mailbox_bytes(1 << 40)
            .max_links(1 << 40)
            .max_processes(1 << 40);
        let spawn = RemoteSpawn { run_limits: Some(Box::new(asked)), ..remote_spawn() };
        let pid = handle.spawn_for_remote(&factory, "idle".into(), spawn, None, |_| {}).expect("spawns");
        let cell = handle.shared.registry.get(pid).expect("alive");
        let limits = handle.shared.limits_of(&cell);
        assert_eq!(
            (limits.max_children, limits.max_yields_per_step, limits.max_payload_size, limits.max_output_per_step),
            (10, 5, 1000, 4000)
        );
        assert_eq!(limits.max_links, 6);
        assert_eq!(cell.lineage.run_processes().map(|run| run.max), Some(50));
        assert_eq!((cell.spec.mailbox_capacity, cell.spec.mailbox_bytes), (3, 4096));
        let carried = cell.lineage.run_bound().expect("bounded").carried();
        assert_eq!(
            carried,
            RunLimits::new()
                .max_children(10)
                .max_yields_per_step(5)
                .max_payload_size(1000)
                .max_output_per_step(4000)
                .mailbox_capacity(3)
                .mailbox_bytes(4096)
                .max_links(6)
                .max_processes(50)
        );
        scheduler.stop(std::time::Duration::ZERO);
    }

    /// A run's `max_processes` counts the run's processes on this node, whichever remote
    /// spawn started their tree: a spawn of the run past it is refused naming the limit,
    /// another run's is not, and a process that ends gives its place back.
    #[test]
    fn a_runs_processes_here_are_counted_across_its_spawns() {
        let scheduler = Scheduler::builder().workers(1).build().expect("builds");
        let handle = scheduler.handle();
        let factory = || -> anyhow::Result<Box<dyn Process>> { Ok(Box::new(Idle)) };
        let spawn = |client: u64| {
            let spawn = RemoteSpawn {
                run_limits: Some(Box::new(RunLimits::new().max_processes(2))),
                run: RunId { node: 3, client },
                ..remote_spawn()
            };
            handle.spawn_for_remote(&factory, "idle".into(), spawn, None, |_| {})
        };
        let first = spawn(1).expect("the run's first process");
        spawn(1).expect("the run's second process");
        let error = spawn(1).expect_err("a third process of the run");
        assert!(matches!(error, SpawnError::RunLimitExceeded { limit: 2 }), "{error:?}");
        assert!(error.to_string().contains("the run's `max_processes` (2)"), "{error}");
        spawn(2).expect("another run's process");

        handle.terminate(first).expect("terminates");
        crate::testing::wait_until("the run's spawn takes the place the ended process gave back", || spawn(1).is_ok());
        scheduler.stop(std::time::Duration::ZERO);
    }
}
