//! [`Pid`], a process id.

use core::fmt;

/// A process id.
///
/// Ids are never reused while anyone could confuse them: the host's carry the generation
/// of the registry slot they name, so a message or completion for a finished process finds
/// nothing instead of reaching the slot's next tenant. Guests see the id as a plain number
/// ([`Pid::as_u64`]); with the `serde` feature it serialises as one, so pids can travel
/// inside messages and results.
///
/// # The node
///
/// A pid of a cluster node names the node its process lives on: the top
/// [`Pid::NODE_BITS`] bits are the node's id ([`Pid::node`]), the rest the process on
/// that node, and a node decides whether a pid is its own with one compare of
/// [`Pid::node`]. The top 1,024 ids below [`Pid::MAX_NODE`] name *shards* of durable
/// processes rather than nodes (`wasmproc::cluster::shard_node`): a durable process's pid
/// names its shard, and stays valid when another node takes the shard over. The layout of the lower bits is the host's business: its registry
/// packs `generation word:32 | shard:8 | index:24`, and the node's bits are the top of
/// the generation word.
///
/// A host outside any cluster has no node: there every pid is its own, the generation
/// has the whole word, and [`Pid::node`] of its pids means nothing. So a standalone host's
/// pids, and those its journals record, are what they were before clusters existed.
///
/// # The trade-off: node bits against generation bits
///
/// A pid stays stale (finds nothing once its process has ended) until its registry
/// shard's generation wraps and the same slot comes round: after 2^32 spawns into the
/// shard outside a cluster, 2^20 on a cluster node, whose node takes 12 of the 32. The
/// low 32 bits cannot give any back (journals record pids, and a restored pid must name
/// the same shard and slot), so only the node's bits could. They stay 12 because a
/// joining node draws its id at random among the free ones, and nodes that join within
/// the same moment do not see each other's draw (a clash is only reported): with `k`
/// nodes started together the chance of a clash is about `k²/2` over the ids, 7% for 20
/// nodes among the 3,070 below the shards' but more than half among 254 (8 bits). Fewer node bits are sound
/// once ids are handed out without clashes (a claim round at join, or a compare-and-set
/// on the server); 8 would then give the generation 24 (2^24 spawns a shard), and 254
/// nodes is about what heartbeats from every node to every node carry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(u64);

impl Pid {
    /// The sender of messages that come from the embedder rather than from a process.
    /// No process ever has this id.
    pub const HOST: Pid = Pid(0);

    /// How many of the pid's high bits name its node on a cluster node: ids 1 to
    /// 4,094 ([`Pid::MAX_NODE`] is what a client greeting the cluster calls itself; see
    /// "The trade-off" above).
    pub const NODE_BITS: u32 = 12;
    /// Where the node's bits start.
    pub const NODE_SHIFT: u32 = 64 - Self::NODE_BITS;
    /// The largest node id.
    pub const MAX_NODE: u16 = (1 << Self::NODE_BITS) - 1;

    /// The id of the node this pid's process lives on; 0 outside a cluster.
    #[inline]
    pub const fn node(self) -> u16 {
        (self.0 >> Self::NODE_SHIFT) as u16
    }

    /// The pid with its node bits replaced by `node` (taken modulo 2^[`Pid::NODE_BITS`]).
    pub const fn with_node(self, node: u16) -> Self {
        let node = (node as u64) & (Self::MAX_NODE as u64);
        Pid((self.0 & !((Self::MAX_NODE as u64) << Self::NODE_SHIFT)) | (node << Self::NODE_SHIFT))
    }

    /// The pid that names node `node` itself rather than a process on it: a node's
    /// embedder when it sends or watches across the cluster.
    pub const fn node_host(node: u16) -> Self {
        Pid::HOST.with_node(node)
    }

    /// Whether this pid names no process but a node's embedder ([`Pid::HOST`] on node 0).
    pub const fn is_host(self) -> bool {
        self.0 & !((Self::MAX_NODE as u64) << Self::NODE_SHIFT) == 0
    }

    /// Rebuilds a pid from [`Pid::as_u64`] (for example one that came back from a guest).
    pub const fn from_u64(raw: u64) -> Self {
        Pid(raw)
    }

    /// The pid as a number, as guests see it.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

/// As its number, honouring width and alignment (`{:<20}` pads it), so pids line up in
/// tables.
impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pid({})", self.0)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Pid {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Pid {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <u64 as serde::Deserialize>::deserialize(deserializer).map(Pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_its_number() {
        assert_eq!(alloc::format!("{} {:?}", Pid::from_u64(7), Pid::HOST), "7 Pid(0)");
        assert_eq!(alloc::format!("{:<4}|{:>4}|", Pid::from_u64(7), Pid::from_u64(42)), "7   |  42|");
    }

    #[test]
    fn the_node_is_the_high_bits_and_node_zero_changes_nothing() {
        let pid = Pid::from_u64(0x0000_0123_4567_89ab);
        assert_eq!(pid.node(), 0);
        let remote = pid.with_node(7);
        assert_eq!(remote.node(), 7);
        assert_eq!(remote.as_u64(), (7 << 52) | pid.as_u64());
        assert_eq!(remote.with_node(0), pid);
        assert_eq!(Pid::from_u64(u64::MAX).node(), Pid::MAX_NODE);
        assert!(Pid::node_host(3).is_host() && Pid::HOST.is_host() && !remote.is_host());
        assert_eq!(Pid::node_host(3).node(), 3);
    }

    #[cfg(feature = "json")]
    #[test]
    fn serialises_as_a_number() {
        assert_eq!(serde_json::to_string(&Pid::from_u64(7)).unwrap(), "7");
        assert_eq!(serde_json::from_str::<Pid>("7").unwrap(), Pid::from_u64(7));
    }
}
