//! The custom commands a scheduler has handlers for, as dispatch finds them: the
//! registered handlers, and each worker's cache of the commands it resolved last.

use std::borrow::Cow;
use std::sync::Arc;

use super::caps::Capabilities;
use crate::handler::Handler;

/// A registered handler and the name it was registered under (`kv.*` for a family's).
pub(super) struct Registered {
    pub(super) name: String,
    pub(super) handler: Arc<dyn Handler>,
}

/// What dispatch needs to know of a custom command before carrying it out: its handler
/// and whether the yielding process may use it. Both depend only on the command's name
/// and the process's capabilities, which are fixed once a scheduler is built and a
/// process spawned, so a resolution never goes stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Resolution {
    /// The handler's place in `Shared::commands`; `None`: no handler, an unknown command.
    pub(super) handler: Option<usize>,
    pub(super) allowed: bool,
}

/// The custom commands one worker resolved last, so that a process yielding the same
/// command step after step (every process that polls a provider or a clock) pays a
/// comparison of its name instead of a hash look-up of the handler and a search of its
/// capabilities for it. Processes spawned alike share one capabilities value, so an entry
/// serves all of them.
pub(super) struct Resolved {
    entries: Vec<Entry>,
    /// The entry the next miss replaces once all [`RESOLVED`] are taken.
    next: usize,
}

/// How many commands a worker keeps resolved: enough for a workflow's handful of
/// commands, few enough that a miss (a hostile guest yielding a new name every step)
/// costs a short scan.
const RESOLVED: usize = 8;

struct Entry {
    /// Held so that the value cannot be freed and another take its address, which is what
    /// `caps` is matched by.
    caps: Arc<Capabilities>,
    /// A command named by a `&'static str` (a native process's) is kept borrowed, so that
    /// its next yield matches by address without comparing bytes.
    name: Cow<'static, str>,
    resolution: Resolution,
}

impl Resolved {
    pub(super) fn new() -> Self {
        Resolved { entries: Vec::with_capacity(RESOLVED), next: 0 }
    }

    /// `name`, yielded by a process granted `caps`: from the cache, or looked up by
    /// `look_up` and kept.
    #[expect(clippy::ptr_arg, reason = "the `Cow` is kept: a borrowed name stays borrowed")]
    pub(super) fn get(
        &mut self,
        caps: &Arc<Capabilities>,
        name: &Cow<'static, str>,
        look_up: impl FnOnce() -> Resolution,
    ) -> Resolution {
        let same = |kept: &str| (kept.as_ptr() == name.as_ptr() && kept.len() == name.len()) || kept == &**name;
        if let Some(entry) = self.entries.iter().find(|e| Arc::ptr_eq(&e.caps, caps) && same(&e.name)) {
            return entry.resolution;
        }
        let resolution = look_up();
        let entry = Entry { caps: caps.clone(), name: name.clone(), resolution };
        if self.entries.len() < RESOLVED {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % RESOLVED;
        }
        resolution
    }
}
