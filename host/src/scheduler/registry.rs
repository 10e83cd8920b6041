//! The PID registry: routes messages, monitors and terminations to live processes.
//!
//! Sharded slabs: one shard per worker plus one for threads outside the scheduler, each
//! a mutex over a [`slab::Slab`]. A worker inserts the processes it spawns into its own
//! shard, so the common case takes an uncontended lock; lookups and removals may touch
//! any shard.
//!
//! A [`Pid`] packs `generation word:32 | shard:8 | index:24`. Every insert takes the
//! shard's next generation (never 0, so no pid is [`Pid::HOST`]), and a lookup succeeds
//! only if the slot still holds that generation word: a pid of a finished process finds
//! nothing even after its slot has been reused, until the shard's generation has wrapped
//! and the same index comes round again.
//!
//! The generation word is the generation alone outside a cluster (node 0): 2^32 inserts
//! into a shard before a stale pid can name a new process, and the pids a journal
//! records are what they were before clusters existed (a scheduler is a journal's or a
//! cluster's, never both). On a cluster node the word's top [`Pid::NODE_BITS`] are the
//! node ([`Pid::node`]) and the generation has the other 20: 2^20 inserts into a shard
//! before a stale pid can alias. See [`Pid`] for why the node keeps 12 bits.
//!
//! The low 32 bits are fixed: journals record pids, and a restored pid must name the
//! same shard and index it did (so neither can give bits to the generation). The
//! shard's 8 bits bound the workers (255, plus the outside shard); the index's 24 bound
//! what one shard holds at once (16.7M; `max_processes` defaults to 1M, and the
//! embedder's or one busy worker's spawns may all land in one shard).

use std::sync::Arc;

use parking_lot::Mutex;
use slab::Slab;

use wasmproc_types::Pid;

const INDEX_BITS: u32 = 24;
const SHARD_BITS: u32 = 8;
/// The generation's bits on a cluster node: those of the word below the node's (see
/// [`Pid::NODE_BITS`]). Outside a cluster it has all 32.
const CLUSTER_GENERATION_BITS: u32 = 32 - Pid::NODE_BITS;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const SHARD_MASK: u64 = (1 << SHARD_BITS) - 1;

/// The most shards a registry can have (and so the most workers a scheduler can have,
/// less one).
pub(super) const MAX_SHARDS: usize = 1 << SHARD_BITS;
/// The most processes one shard can hold at once.
pub(super) const MAX_PER_SHARD: usize = 1 << INDEX_BITS;

/// The shard a pid names.
pub(super) fn shard_of(pid: Pid) -> usize {
    ((pid.as_u64() >> INDEX_BITS) & SHARD_MASK) as usize
}

/// What a registry holds: a process's cell, which knows its pid. A parameter rather than
/// the type, so that the registry names nothing of what it holds.
pub(super) trait Member: Send + Sync {
    /// The pid it was registered (or restored) under.
    fn pid(&self) -> Pid;
}

pub(super) struct Registry<C> {
    shards: Box<[Mutex<Shard<C>>]>,
    /// The node's bits of every pid this registry makes, in the generation word.
    node_bits: u32,
    /// The generation's bits of the word: all of them outside a cluster, the ones
    /// below the node's on a cluster node.
    generation_mask: u32,
}

struct Shard<C> {
    slots: Slab<Slot<C>>,
    next_generation: u32,
}

impl<C> Default for Shard<C> {
    fn default() -> Self {
        Shard { slots: Slab::new(), next_generation: 0 }
    }
}

struct Slot<C> {
    generation: u32,
    cell: Arc<C>,
}

impl<C: Member> Registry<C> {
    /// A registry of `shards` shards making the pids of node `node` (0 outside a cluster,
    /// where the generation has the whole word).
    pub(super) fn new(shards: usize, node: u16) -> Self {
        assert!((1..=MAX_SHARDS).contains(&shards), "registry needs 1..={MAX_SHARDS} shards, got {shards}");
        assert!(node <= Pid::MAX_NODE, "node id {node} past {}", Pid::MAX_NODE);
        let generation_mask = if node == 0 { u32::MAX } else { (1 << CLUSTER_GENERATION_BITS) - 1 };
        Registry {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            node_bits: if node == 0 { 0 } else { u32::from(node) << CLUSTER_GENERATION_BITS },
            generation_mask,
        }
    }

    /// Registers the cell `make` makes of `parts` under a fresh pid (its argument) in
    /// `shard` (taken modulo the shard count). Hands `parts` back if the shard is full.
    pub(super) fn insert<T>(&self, shard: usize, parts: T, make: impl FnOnce(Pid, T) -> C) -> Result<Arc<C>, T> {
        let shard_index = shard % self.shards.len();
        let mut shard = self.shards[shard_index].lock();
        let index = shard.slots.vacant_key();
        if index >= MAX_PER_SHARD {
            return Err(parts);
        }
        // Within the generation's bits and never 0; a restored journal's counter may be
        // past them, and continues from its low bits.
        let mask = self.generation_mask;
        let next = (shard.next_generation & mask).wrapping_add(1) & mask;
        shard.next_generation = next.max(1);
        let generation = self.node_bits | shard.next_generation;
        let pid = Pid::from_u64(
            (u64::from(generation) << (INDEX_BITS + SHARD_BITS)) | ((shard_index as u64) << INDEX_BITS) | index as u64,
        );
        // The cell lasts as long as its process, suspended or not: apart from the
        // instance memory its spawn allocates around it.
        let cell = crate::heap::lasting(|| Arc::new(make(pid, parts)));
        shard.slots.insert(Slot { generation, cell: cell.clone() });
        Ok(cell)
    }

    /// Registers restored processes under the pids they had (see `recovery.rs`), into an
    /// empty registry. A process whose pid names a shard this registry lacks is handed
    /// back.
    pub(super) fn restore(&self, cells: Vec<Arc<C>>) -> Vec<Arc<C>> {
        let mut by_shard: Vec<Vec<(usize, Slot<C>)>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        let mut refused = Vec::new();
        for cell in cells {
            match self.split(cell.pid()) {
                Some((shard, index, generation)) => by_shard[shard].push((index, Slot { generation, cell })),
                None => refused.push(cell),
            }
        }
        for (shard, slots) in self.shards.iter().zip(by_shard) {
            if slots.is_empty() {
                continue;
            }
            let mut shard = shard.lock();
            assert!(shard.slots.is_empty(), "processes are restored into an empty registry only");
            let newest = slots.iter().map(|(_, slot)| slot.generation).max().unwrap_or(0);
            shard.next_generation = shard.next_generation.max(newest);
            shard.slots = slots.into_iter().collect();
        }
        refused
    }

    /// Makes every later pid of a shard newer than the given ones: pids recorded in a
    /// journal are never given to another process.
    pub(super) fn reserve_generations(&self, pids: impl Iterator<Item = Pid>) {
        for pid in pids {
            if let Some((shard, _, generation)) = self.split(pid) {
                let mut shard = self.shards[shard].lock();
                shard.next_generation = shard.next_generation.max(generation);
            }
        }
    }

    /// Makes every later pid of every shard newer than `pid`: for a pid the journal no
    /// longer holds, whose shard's counter may have been the highest.
    pub(super) fn reserve_everywhere(&self, pid: Pid) {
        let generation = (pid.as_u64() >> (INDEX_BITS + SHARD_BITS)) as u32;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.next_generation = shard.next_generation.max(generation);
        }
    }

    pub(super) fn get(&self, pid: Pid) -> Option<Arc<C>> {
        let (shard, index, generation) = self.split(pid)?;
        let shard = self.shards[shard].lock();
        match shard.slots.get(index) {
            Some(slot) if slot.generation == generation => Some(slot.cell.clone()),
            _ => None,
        }
    }

    /// Whether `pid` is a live process. Takes no reference to its cell, so it never
    /// drops one (see [`Registry::remove`]).
    pub(super) fn contains(&self, pid: Pid) -> bool {
        self.split(pid).is_some_and(|(shard, index, generation)| {
            self.shards[shard].lock().slots.get(index).is_some_and(|slot| slot.generation == generation)
        })
    }

    /// Removes `pid`; false if it was not there (already removed, or a stale pid).
    pub(super) fn remove(&self, pid: Pid) -> bool {
        let Some((shard, index, generation)) = self.split(pid) else { return false };
        let mut shard = self.shards[shard].lock();
        match shard.slots.get(index) {
            Some(slot) if slot.generation == generation => {
                let slot = shard.slots.remove(index);
                // Dropping what may be the last reference to a cell may drop a process:
                // not under the shard lock.
                drop(shard);
                drop(slot);
                true
            }
            _ => false,
        }
    }

    /// Every registered process at some moment during the call.
    pub(super) fn snapshot(&self) -> Vec<Arc<C>> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            all.extend(shard.lock().slots.iter().map(|(_, slot)| slot.cell.clone()));
        }
        all
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.len()).sum()
    }

    fn split(&self, pid: Pid) -> Option<(usize, usize, u32)> {
        let raw = pid.as_u64();
        let shard = ((raw >> INDEX_BITS) & SHARD_MASK) as usize;
        let generation = (raw >> (INDEX_BITS + SHARD_BITS)) as u32;
        (shard < self.shards.len() && generation != 0).then_some((shard, (raw & INDEX_MASK) as usize, generation))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A member that is nothing but its pid.
    struct Entry(Pid);

    impl Member for Entry {
        fn pid(&self) -> Pid {
            self.0
        }
    }

    type Registry = super::Registry<Entry>;

    fn insert(reg: &Registry, shard: usize) -> Pid {
        reg.insert(shard, (), |pid, ()| Entry(pid)).ok().unwrap().pid()
    }

    #[test]
    fn stale_pid_finds_nothing_after_slot_reuse() {
        let reg = Registry::new(2, 0);
        let first = insert(&reg, 1);
        assert!(reg.get(first).is_some());
        assert!(reg.remove(first));
        assert!(!reg.remove(first));
        let second = insert(&reg, 1);
        assert_ne!(first, second);
        assert_eq!(first.as_u64() & INDEX_MASK, second.as_u64() & INDEX_MASK, "slot reused");
        assert!(reg.get(first).is_none());
        assert_eq!(reg.get(second).unwrap().pid(), second);
        assert_eq!(reg.len(), 1);
    }

    #[test]
    fn foreign_and_host_pids_are_rejected() {
        let reg = Registry::new(1, 0);
        assert!(reg.get(Pid::HOST).is_none());
        assert!(reg.get(Pid::from_u64(u64::MAX)).is_none());
        assert!(!reg.remove(Pid::from_u64(1 << 40)));
        let pid = insert(&reg, 5);
        assert_eq!(reg.snapshot().len(), 1);
        assert!(reg.get(pid).is_some());
    }

    #[test]
    fn pids_name_the_node_and_another_nodes_pid_finds_nothing() {
        let reg = Registry::new(1, 9);
        let pid = insert(&reg, 0);
        assert_eq!(pid.node(), 9);
        assert!(reg.get(pid).is_some());
        assert!(reg.get(pid.with_node(8)).is_none(), "same slot and generation on another node");
        assert!(reg.get(pid.with_node(0)).is_none());
    }

    #[test]
    fn the_generation_wraps_within_its_bits_and_skips_zero() {
        // On a cluster node: the 20 bits below the node's.
        let reg = Registry::new(1, 5);
        let mask = (1 << CLUSTER_GENERATION_BITS) - 1;
        reg.shards[0].lock().next_generation = mask - 1;
        let last = insert(&reg, 0);
        reg.remove(last);
        let wrapped = insert(&reg, 0);
        assert_eq!(((last.as_u64() >> 32) as u32) & mask, mask);
        assert_eq!(((wrapped.as_u64() >> 32) as u32) & mask, 1);
        assert_eq!((last.node(), wrapped.node()), (5, 5));

        // Outside a cluster: the whole word.
        let reg = Registry::new(1, 0);
        reg.shards[0].lock().next_generation = u32::MAX - 1;
        let last = insert(&reg, 0);
        reg.remove(last);
        let wrapped = insert(&reg, 0);
        assert_eq!(last.as_u64() >> 32, u64::from(u32::MAX));
        assert_eq!(wrapped.as_u64() >> 32, 1);
    }

    /// The trade-off of the cluster's node bits: 2^20 inserts into a shard after a pid's
    /// process ended, its slot coming round again, the stale pid names the new process on
    /// a cluster node; outside a cluster it still finds nothing.
    #[test]
    fn a_stale_pid_aliases_after_2_pow_20_inserts_only_on_a_cluster_node() {
        for (node, aliases) in [(5, true), (0, false)] {
            let reg = Registry::new(1, node);
            let stale = insert(&reg, 0);
            reg.remove(stale);
            // As if 2^20 - 1 processes had come and gone in this slot since.
            reg.shards[0].lock().next_generation = (1 << CLUSTER_GENERATION_BITS) - 1;
            let new = insert(&reg, 0);
            assert_eq!(stale.as_u64() & INDEX_MASK, new.as_u64() & INDEX_MASK, "the slot came round");
            assert_eq!(stale == new, aliases, "node {node}: {stale:?} and {new:?}");
            assert_eq!(reg.get(stale).is_some(), aliases, "node {node}");
        }
    }
}
