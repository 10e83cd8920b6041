//! What a node or a client offers others to fetch by hash: the components it holds, with
//! the file names they were loaded from.

use std::sync::Arc;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;

use super::wire::Body;

/// Bytes a chunk carries: under NATS's default 1 MiB frame with room for the header.
pub(super) const CHUNK: usize = 512 << 10;

/// The components a node or a client lets others fetch from it by hash, with the file
/// names they were loaded from (`cluster ls` shows them).
#[derive(Default)]
pub(super) struct CodeStore {
    pub(super) bytes: RwLock<FxHashMap<String, Arc<[u8]>>>,
    names: RwLock<FxHashMap<String, String>>,
}

impl CodeStore {
    /// Lets others fetch `bytes` by `hash`.
    pub(super) fn offer(&self, hash: String, bytes: Arc<[u8]>) {
        self.bytes.write().insert(hash, bytes);
    }

    /// As [`CodeStore::offer`], with the file name the bytes were loaded from.
    pub(super) fn offer_named(&self, hash: String, name: String, bytes: Arc<[u8]>) {
        self.names.write().insert(hash.clone(), name);
        self.offer(hash, bytes);
    }

    /// Names component `hash` `name`, unless it has a name already.
    pub(super) fn name_if_unnamed(&self, hash: &str, name: String) {
        self.names.write().entry(hash.to_owned()).or_insert(name);
    }

    /// The file name component `hash` was loaded from, if known.
    pub(super) fn name(&self, hash: &str) -> Option<String> {
        self.names.read().get(hash).cloned()
    }

    /// The hashes of the components held.
    pub(super) fn hashes(&self) -> Vec<String> {
        self.bytes.read().keys().cloned().collect()
    }

    /// The components held whose file names are known, as (hash, name).
    pub(super) fn named(&self) -> Vec<(String, String)> {
        let bytes = self.bytes.read();
        let names = self.names.read();
        names
            .iter()
            .filter(|(hash, _)| bytes.contains_key(*hash))
            .map(|(hash, name)| (hash.clone(), name.clone()))
            .collect()
    }

    /// The answer to a request for the chunk of component `hash` at `offset`; `holder`
    /// names who answers, for the error of a component it does not hold.
    pub(super) fn answer(&self, hash: &str, offset: u64, holder: &str) -> Body {
        let Some(bytes) = self.bytes.read().get(hash).cloned() else {
            return Body::CodeChunk { result: Err(format!("{holder} does not hold component `{hash}`")) };
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
        let end = (start + CHUNK).min(bytes.len());
        Body::CodeChunk { result: Ok((bytes.len() as u64, bytes[start..end].to_vec())) }
    }
}
