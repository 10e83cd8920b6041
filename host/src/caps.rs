//! Capabilities: which commands a process may yield.
//!
//! Every yield is checked against the yielding process's grant set before its handler
//! runs; a denied command completes with `permission denied: <command>`. Children get
//! their parent's grants (or fewer), never more.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::codec::{Malformed, Reader, Writer};
use crate::step::{Command, CommandKind};

/// Every built-in's capability bit.
const ALL_BUILTINS: u16 = {
    let mut bits = 0;
    let mut i = 0;
    while i < CommandKind::BUILTINS.len() {
        if let Some(bit) = CommandKind::BUILTINS[i].capability_bit() {
            bits |= bit;
        }
        i += 1;
    }
    bits
};

const BUILTIN_NAMES: [&str; CommandKind::BUILTINS.len()] = {
    let mut names = [""; CommandKind::BUILTINS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = CommandKind::BUILTINS[i].name();
        i += 1;
    }
    names
};

/// A set of granted commands.
///
/// By default every built-in command (`sleep`, `spawn`, `send`, `monitor`, `terminate`,
/// `link`, `unlink`, `demonitor`, `exit`, `trap-exits`)
/// is granted and no custom command is: custom commands reach the embedder's code, so
/// each must be granted by name ([`Capabilities::allow`]), by family (`allow("kv.*")`
/// grants every `kv.<command>`) or all at once ([`Capabilities::allow_all_custom`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    builtins: u16,
    custom: Custom,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Custom {
    All,
    Only(Arc<Granted>),
}

/// Custom commands granted by name, and families granted whole (`kv` for `kv.*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Granted {
    names: BTreeSet<String>,
    families: BTreeSet<String>,
}

impl Granted {
    fn covers(&self, name: &str) -> bool {
        self.names.contains(name) || family(name).is_some_and(|f| self.families.contains(f))
    }

    fn insert(&mut self, grant: &str) {
        match grant.strip_suffix(".*") {
            Some(family) => self.families.insert(family.to_owned()),
            None => self.names.insert(grant.to_owned()),
        };
    }

    fn remove(&mut self, grant: &str) {
        match grant.strip_suffix(".*") {
            Some(family) => self.families.remove(family),
            None => self.names.remove(grant),
        };
    }

    /// What both grant: a name either side grants that the other covers, and the
    /// families both grant.
    fn intersect(&self, other: &Granted) -> Granted {
        let names = self.names.iter().filter(|n| other.covers(n));
        let theirs = other.names.iter().filter(|n| self.covers(n));
        Granted {
            names: names.chain(theirs).cloned().collect(),
            families: self.families.intersection(&other.families).cloned().collect(),
        }
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities { builtins: ALL_BUILTINS, custom: Custom::Only(Arc::default()) }
    }
}

impl Capabilities {
    /// The built-in command names, in the order `--help` lists them.
    pub const BUILTIN: [&str; CommandKind::BUILTINS.len()] = BUILTIN_NAMES;

    /// The built-ins that can end another process: `terminate`, `exit` (an exit signal)
    /// and `link` (a linked process that fails ends its partners). The CLI grants them
    /// only when allowed by name; without them a process may still end, signal and link
    /// its own children (the scheduler checks the target's parent), so a supervisor and a
    /// `spawn` with `link` need no grant.
    pub const OVER_OTHERS: [&str; 3] = ["terminate", "exit", "link"];

    /// Every built-in but [`Capabilities::OVER_OTHERS`]: the grants a process gets from
    /// the CLI before `--allow` and `--deny`.
    pub fn over_self() -> Self {
        Capabilities::OVER_OTHERS.into_iter().fold(Capabilities::default(), Capabilities::deny)
    }

    /// Nothing granted.
    pub fn none() -> Self {
        Capabilities { builtins: 0, custom: Custom::Only(Arc::default()) }
    }

    /// Every built-in and every custom command.
    pub fn all() -> Self {
        Capabilities { builtins: ALL_BUILTINS, custom: Custom::All }
    }

    /// Grants `command`: a built-in name, a custom command's name, or a family of
    /// custom commands as `family.*`.
    pub fn allow(mut self, command: &str) -> Self {
        match builtin_bit(command) {
            Some(bit) => self.builtins |= bit,
            None => {
                if let Custom::Only(granted) = &mut self.custom {
                    Arc::make_mut(granted).insert(command);
                }
            }
        }
        self
    }

    /// Withdraws `command`, as [`Capabilities::allow`] names it (a family's grant is
    /// withdrawn as `family.*`). Withdrawing one custom command from
    /// [`Capabilities::all`] or from a granted family is not supported: grant custom
    /// commands by name instead.
    pub fn deny(mut self, command: &str) -> Self {
        match builtin_bit(command) {
            Some(bit) => self.builtins &= !bit,
            None => {
                if let Custom::Only(granted) = &mut self.custom {
                    Arc::make_mut(granted).remove(command);
                }
            }
        }
        self
    }

    /// Grants every custom command.
    pub fn allow_all_custom(mut self) -> Self {
        self.custom = Custom::All;
        self
    }

    /// Whether the command named `name` may be yielded.
    pub fn allows(&self, name: &str) -> bool {
        match builtin_bit(name) {
            Some(bit) => self.builtins & bit != 0,
            None => self.allows_custom(name),
        }
    }

    /// Whether the custom command `name` may be yielded (`name` is not a built-in).
    pub(crate) fn allows_custom(&self, name: &str) -> bool {
        match &self.custom {
            Custom::All => true,
            Custom::Only(granted) => granted.covers(name),
        }
    }

    /// Whether the built-in `kind` is granted (a `send` is also the `send` host
    /// function of Wasm guests); false for [`CommandKind::Custom`], granted by name.
    pub(crate) fn allows_builtin(&self, kind: CommandKind) -> bool {
        kind.capability_bit().is_some_and(|bit| self.builtins & bit != 0)
    }

    /// Whether `command` may be yielded; checks built-ins without touching strings.
    pub fn allows_command(&self, command: &Command) -> bool {
        match command.kind() {
            CommandKind::Custom => self.allows(command.name()),
            builtin => self.allows_builtin(builtin),
        }
    }

    /// What both `self` and `other` grant: the most a child of a `self` process may get
    /// when it asks for `other`.
    pub fn intersect(&self, other: &Capabilities) -> Capabilities {
        let custom = match (&self.custom, &other.custom) {
            (Custom::All, c) | (c, Custom::All) => c.clone(),
            (Custom::Only(a), Custom::Only(b)) => Custom::Only(Arc::new(a.intersect(b))),
        };
        Capabilities { builtins: self.builtins & other.builtins, custom }
    }

    /// Each grant of `self` that `other` does not grant whole, as
    /// [`Capabilities::allow`] names it: what `self.intersect(other)` takes away. The
    /// built-ins first, then custom commands by name, then families (`kv.*`), or `*` for
    /// every custom command.
    pub fn not_granted_by(&self, other: &Capabilities) -> Vec<String> {
        let mut lost: Vec<String> = Capabilities::BUILTIN
            .iter()
            .filter(|name| self.allows(name) && !other.allows(name))
            .map(|name| (*name).to_owned())
            .collect();
        match (&self.custom, &other.custom) {
            (_, Custom::All) => {}
            (Custom::All, Custom::Only(_)) => lost.push("*".to_owned()),
            (Custom::Only(mine), Custom::Only(theirs)) => {
                lost.extend(mine.names.iter().filter(|name| !theirs.covers(name)).cloned());
                lost.extend(
                    mine.families.iter().filter(|f| !theirs.families.contains(*f)).map(|family| format!("{family}.*")),
                );
            }
        }
        lost
    }
}

impl Capabilities {
    /// Writes the grant set to a journal record or a cluster's spawn.
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u64(u64::from(self.builtins));
        match &self.custom {
            Custom::All => w.u8(0),
            Custom::Only(granted) => {
                w.u8(1);
                w.u64((granted.names.len() + granted.families.len()) as u64);
                for name in &granted.names {
                    w.str(name);
                }
                for family in &granted.families {
                    w.str(&format!("{family}.*"));
                }
            }
        }
    }

    /// Reads back what [`Capabilities::encode`] wrote.
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Capabilities, Malformed> {
        // Bits of built-ins this host does not know are dropped: they grant nothing here.
        let builtins = (r.u64("caps")? & u64::from(ALL_BUILTINS)) as u16;
        let custom = match r.u8("caps")? {
            0 => Custom::All,
            1 => {
                let count = r.count("caps")?;
                let mut granted = Granted::default();
                for _ in 0..count {
                    granted.insert(r.str("caps")?);
                }
                Custom::Only(Arc::new(granted))
            }
            other => return Err(r.invalid("caps", format!("unknown kind of capability set {other}"))),
        };
        Ok(Capabilities { builtins, custom })
    }
}

/// The family of a command name: what comes before its first dot, if anything does.
pub(crate) fn family(name: &str) -> Option<&str> {
    name.split_once('.').map(|(family, _)| family).filter(|family| !family.is_empty())
}

fn builtin_bit(name: &str) -> Option<u16> {
    CommandKind::builtin(name).and_then(CommandKind::capability_bit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_granted_by_names_what_an_intersection_takes_away() {
        let recorded = Capabilities::default().allow("kv.*").allow("http.get").allow("ledger.record");
        let now = Capabilities::default().deny("terminate").allow("kv.*").allow("ledger.*");
        assert_eq!(recorded.not_granted_by(&now), ["terminate", "http.get"]);
        assert_eq!(now.not_granted_by(&recorded), ["ledger.*"]);
        assert!(recorded.not_granted_by(&recorded).is_empty());
        assert_eq!(Capabilities::all().not_granted_by(&Capabilities::none()).last().map(String::as_str), Some("*"));
        assert!(recorded.not_granted_by(&Capabilities::all()).is_empty());
    }

    #[test]
    fn defaults_grant_builtins_and_deny_custom() {
        let caps = Capabilities::default();
        for name in Capabilities::BUILTIN {
            assert!(caps.allows(name), "{name}");
        }
        assert!(!caps.allows("http.get"));
        assert!(caps.clone().allow("http.get").allows("http.get"));
        assert!(!caps.deny("spawn").allows("spawn"));
    }

    #[test]
    fn intersection_never_widens() {
        let parent = Capabilities::none().allow("send").allow("db");
        let asked = Capabilities::all();
        let child = parent.intersect(&asked);
        assert!(child.allows("send") && child.allows("db"));
        assert!(!child.allows("spawn") && !child.allows("http"));
        let narrower = Capabilities::none().allow("db").allow("http");
        let child = parent.intersect(&narrower);
        assert!(child.allows("db") && !child.allows("http") && !child.allows("send"));
    }

    #[test]
    fn families_grant_their_commands_and_intersect_by_coverage() {
        let parent = Capabilities::none().allow("kv.*").allow("http.get");
        assert!(parent.allows("kv.get") && parent.allows("kv.put") && !parent.allows("kvx.get"));
        assert!(!parent.allows("http.post") && !parent.allows("kv"));
        // A child that asks for one kv command and the whole http family gets the kv
        // command and only the http command its parent has.
        let child = parent.intersect(&Capabilities::none().allow("kv.get").allow("http.*"));
        assert!(child.allows("kv.get") && !child.allows("kv.put"));
        assert!(child.allows("http.get") && !child.allows("http.post"));
        let both = parent.intersect(&Capabilities::none().allow("kv.*"));
        assert!(both.allows("kv.delete") && !both.allows("http.get"));
        assert!(!parent.clone().deny("kv.*").allows("kv.get"));
        let mut w = Writer::default();
        parent.encode(&mut w);
        let bytes = w.into_bytes();
        assert_eq!(Capabilities::decode(&mut Reader::new(&bytes, "capability set")).unwrap(), parent);
    }
}
