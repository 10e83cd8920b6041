//! The runs a journal holds: each process the embedder spawned (its root) with every
//! process spawned under it, read from their spawn and exit records; and removing them.

use std::collections::BTreeMap;

use wasmproc_types::{Payload, Pid};

use super::read::{Decode, Recorded};
use super::{Batch, Journal};
use crate::caps::Capabilities;
use crate::step::Exited;

/// A run the journal holds whose every process has ended: a process the embedder spawned
/// (its root) and everything spawned under it.
#[derive(Debug, Clone)]
pub struct FinishedRun {
    /// The process the embedder spawned.
    pub root: Pid,
    /// Its recorded result.
    pub result: Exited,
    /// Every process of the run, with how many records it has.
    members: Vec<(Pid, u64)>,
}

/// A run the journal holds, finished or not: a process the embedder spawned (its root),
/// how it was spawned, and everything spawned under it. See [`Journal::runs`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HeldRun {
    /// The process the embedder spawned.
    pub root: Pid,
    /// The registered kind the root was made from.
    pub kind: Option<String>,
    /// What the root's kind made it from (a Wasm component's `sha256:` hash).
    pub identity: Option<String>,
    /// The root's entry method.
    pub method: String,
    /// The root's input.
    pub input: Vec<Payload>,
    /// The root's grants, as it was spawned with them.
    pub caps: Capabilities,
    /// The root's result once every process of the run has ended; `None` while one is
    /// unfinished (it resumes when a scheduler is built on the journal).
    pub result: Option<Exited>,
    /// What the embedder noted with the root's spawn
    /// ([`SpawnOptions::note`](crate::scheduler::SpawnOptions::note)).
    pub note: Option<Vec<u8>>,
    /// Every process of the run, with how many records it has.
    members: Vec<(Pid, u64)>,
}

impl HeldRun {
    /// The run of `root`, whose records are `recorded`: its result only if `ended` (every
    /// one of its `members` has ended).
    fn of(root: Pid, recorded: &Recorded, ended: bool, members: Vec<(Pid, u64)>) -> HeldRun {
        let Recorded { spawn, exit, .. } = recorded;
        HeldRun {
            root,
            kind: spawn.kind.clone(),
            identity: spawn.identity.clone(),
            method: spawn.method.clone(),
            input: spawn.input.clone(),
            caps: spawn.caps.clone(),
            result: if ended { exit.clone() } else { None },
            note: spawn.note.clone(),
            members,
        }
    }

    /// How many processes of the run the journal holds.
    pub fn processes(&self) -> usize {
        self.members.len()
    }

    /// How many records the run has in the journal.
    pub fn records(&self) -> u64 {
        self.members.iter().map(|(_, records)| records).sum()
    }

    /// The end of the run of root `root` among `runs`, for a host that finds a record
    /// saying the run is going but no process of it resumed: its result, or a loss if the
    /// journal holds the run without an end. `None` if the journal holds no such run
    /// (its spawn never reached the journal, so nothing of it ran for good).
    pub fn end_of(runs: &[HeldRun], root: Pid) -> Option<Exited> {
        let run = runs.iter().find(|run| run.root == root)?;
        Some(run.result.clone().unwrap_or_else(|| {
            Exited::new(crate::ExitReason::Error("lost: the journal holds no end of it".to_owned()))
        }))
    }
}

impl Journal {
    /// Every run the journal holds, finished or not, by root pid: each process the
    /// embedder spawned, with its tree. A tree whose chain of parents leaves the journal
    /// (its root's records are gone) is no run. Reads every key but decodes only the
    /// spawn and exit records.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn runs(&self) -> std::io::Result<Vec<HeldRun>> {
        let seen = self.read_range(1, None, Decode::SpawnsAndExits)?;
        // The root of each process: up its chain of parents to one the embedder spawned.
        // Only a journal written by something else makes parents a cycle: a chain stops
        // once it is longer than the journal's processes.
        let root_of = |mut pid: Pid| {
            for _ in 0..seen.len() {
                match seen.get(&pid).map(|r| r.spawn.parent) {
                    Some(parent) if parent != Pid::HOST && seen.contains_key(&parent) => pid = parent,
                    _ => break,
                }
            }
            pid
        };
        let mut trees: BTreeMap<Pid, (bool, Vec<(Pid, u64)>)> = BTreeMap::new();
        for (pid, recorded) in &seen {
            let root = root_of(*pid);
            if seen[&root].spawn.parent == Pid::HOST {
                let tree = trees.entry(root).or_insert((true, Vec::new()));
                tree.0 &= recorded.exit.is_some();
                tree.1.push((*pid, recorded.next_seq));
            }
        }
        Ok(trees.into_iter().map(|(root, (ended, members))| HeldRun::of(root, &seen[&root], ended, members)).collect())
    }

    /// The run of root `root`, as [`Journal::runs`] would list it, reading only its own
    /// processes' spawn and exit records (and the spawner of every other); `None` if the
    /// journal holds no run of that root.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn run_of(&self, root: Pid) -> std::io::Result<Option<HeldRun>> {
        let mut seen = BTreeMap::new();
        for pid in self.tree_of(root)? {
            let process = pid.as_u64();
            seen.extend(self.read_range(process, process.checked_add(1), Decode::SpawnsAndExits)?);
        }
        let Some(recorded) = seen.get(&root).filter(|recorded| recorded.spawn.parent == Pid::HOST) else {
            return Ok(None);
        };
        let ended = seen.values().all(|recorded| recorded.exit.is_some());
        let members = seen.iter().map(|(pid, recorded)| (*pid, recorded.next_seq)).collect();
        Ok(Some(HeldRun::of(root, recorded, ended, members)))
    }

    /// The runs whose every process has ended and whose records are still held (a host
    /// with [`JournalSettings::keep_finished`](super::JournalSettings), or one
    /// that stopped before it removed them). A host that reports results reads a run
    /// here that finished before it could report it, rather than running it again.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged record (named by its key).
    pub fn finished_runs(&self) -> std::io::Result<Vec<FinishedRun>> {
        Ok(self
            .runs()?
            .into_iter()
            .filter_map(|run| Some(FinishedRun { root: run.root, result: run.result?, members: run.members }))
            .collect())
    }

    /// Removes the records of `run`, synced: once this returns, a start with this
    /// journal no longer finds it.
    ///
    /// # Errors
    ///
    /// The store's write error; the run's records are then still there.
    pub fn forget(&self, run: &FinishedRun) -> std::io::Result<()> {
        self.remove(&run.members)
    }

    /// Removes the records of `run`, finished or not, synced: once this returns, a start
    /// with this journal neither resumes nor reports it. Only while no scheduler runs on
    /// the journal: one would go on writing the run's records.
    ///
    /// # Errors
    ///
    /// The store's write error; the run's records are then still there.
    pub fn forget_run(&self, run: &HeldRun) -> std::io::Result<()> {
        self.remove(&run.members)
    }

    fn remove(&self, members: &[(Pid, u64)]) -> std::io::Result<()> {
        let removals = members.iter().map(|(pid, records)| (pid.as_u64(), *records)).collect();
        self.removing(members.iter().map(|(pid, _)| *pid), |floor| {
            self.store.commit(&Batch { puts: floor.into_iter().collect(), removals }, true)
        })?
    }
}
