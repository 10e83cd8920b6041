//! The process kinds a scheduler knows: those registered on its builder, then those a
//! [`KindSource`] resolves when they are first asked for.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::handler::{Factory, KindSource};

/// A kind: its name as recorded (in the process's spec and its journal) and its factory.
pub(crate) type Kind = (Arc<str>, Arc<dyn Factory>);

/// Every kind a scheduler can spawn.
#[derive(Default)]
pub(crate) struct Kinds {
    /// Registered on the builder: fixed once built.
    table: FxHashMap<Arc<str>, Arc<dyn Factory>>,
    /// Asked for names the table lacks.
    source: Option<Arc<dyn KindSource>>,
}

impl Kinds {
    pub(super) fn insert(&mut self, name: Arc<str>, factory: Arc<dyn Factory>) {
        self.table.insert(name, factory);
    }

    pub(super) fn insert_if_absent(&mut self, name: &str, factory: impl FnOnce() -> Arc<dyn Factory>) {
        if !self.table.contains_key(name) {
            self.table.insert(name.into(), factory());
        }
    }

    pub(super) fn set_source(&mut self, source: Arc<dyn KindSource>) {
        self.source = Some(source);
    }

    /// The kind `name` asked for by a process of kind `spawner` (`None`: by the embedder,
    /// or remade on resume, where `name` is the recorded name).
    pub(crate) fn find(&self, name: &str, spawner: Option<&str>) -> Option<Kind> {
        match self.table.get_key_value(name) {
            Some((name, factory)) => Some((name.clone(), factory.clone())),
            None => self.source.as_ref()?.resolve(name, spawner),
        }
    }

    /// The factory of the kind recorded as `name`.
    pub(crate) fn factory(&self, name: &str) -> Option<Arc<dyn Factory>> {
        self.find(name, None).map(|(_, factory)| factory)
    }

    /// The registered kinds (not those a source may resolve): name and identity.
    pub(crate) fn registered(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<dyn Factory>)> {
        self.table.iter()
    }
}
