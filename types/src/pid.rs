//! [`Pid`], a process id.

use core::fmt;

/// A process id.
///
/// Ids are never reused while anyone could confuse them: the host's carry the generation
/// of the registry slot they name, so a message or completion for a finished process finds
/// nothing instead of reaching the slot's next tenant. Guests see the id as a plain number
/// ([`Pid::as_u64`]); with the `serde` feature it serialises as one, so pids can travel
/// inside messages and results.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(u64);

impl Pid {
    /// The sender of messages that come from the embedder rather than from a process.
    /// No process ever has this id.
    pub const HOST: Pid = Pid(0);

    /// Rebuilds a pid from [`Pid::as_u64`] (for example one that came back from a guest).
    pub const fn from_u64(raw: u64) -> Self {
        Pid(raw)
    }

    /// The pid as a number, as guests see it.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
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
    }

    #[cfg(feature = "json")]
    #[test]
    fn serialises_as_a_number() {
        assert_eq!(serde_json::to_string(&Pid::from_u64(7)).unwrap(), "7");
        assert_eq!(serde_json::from_str::<Pid>("7").unwrap(), Pid::from_u64(7));
    }
}
