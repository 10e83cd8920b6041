//! The writer thread: every write of the store, decided in arrival order and committed in
//! groups (the protocol is in the module docs of `kv`, "Durability").
//!
//! A [`Group`] is one turn of the thread: the writes it took from the queue, applied one
//! after another to an overlay of the store (the keys and answers the group has changed
//! so far), so each write sees every write before it, committed or not. Only
//! [`Group::commit`] touches the disk.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;

use super::store::{self, Answer, Store, Stored, Totals};
use super::{KvSettings, ListQuery, shown};
use crate::handler::Completer;
use crate::provider::{ErrorCode, Failure};
use crate::{Format, Payload};

/// A change one write asks for, with its input checked (key and value sizes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `kv.put`.
    Put { key: String, text: String },
    /// `kv.cas`: the write happens only if `key` is at `expected` (0: absent).
    Cas { key: String, expected: u64, text: String },
    /// `kv.delete`.
    Delete { key: String },
}

/// A durable process's write: its idempotency key and what it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Idempotency {
    pub(super) key: String,
    pub(super) digest: u64,
}

/// What the workers hand the writer thread.
pub(super) enum Job {
    Write { op: Op, idempotency: Option<Idempotency>, done: Completer },
    List { query: ListQuery, done: Completer },
}

/// What one queued job is counted as against the queue's bound, beside the bytes it
/// carries: its completer, its strings' headers and the channel's slot, about this.
pub(super) const JOB_OVERHEAD: usize = 128;

impl Job {
    /// The bytes the job holds while it waits, as the queue's bound counts them.
    pub(super) fn size(&self) -> usize {
        JOB_OVERHEAD
            + match self {
                Job::Write { op: Op::Put { key, text } | Op::Cas { key, text, .. }, idempotency, .. } => {
                    key.len() + text.len() + idempotency.as_ref().map_or(0, |i| i.key.len())
                }
                Job::Write { op: Op::Delete { key }, idempotency, .. } => {
                    key.len() + idempotency.as_ref().map_or(0, |i| i.key.len())
                }
                Job::List { query, .. } => query.prefix.len() + query.after.as_ref().map_or(0, String::len),
            }
    }
}

/// The bytes of the jobs queued for the writer thread, bounded: workers queue writes
/// without waiting, and a flood of them while a group syncs would otherwise wait in
/// memory without limit. An empty queue takes any one job.
pub(super) struct Queued {
    bytes: AtomicUsize,
    max: usize,
}

impl Queued {
    pub(super) fn new(max: usize) -> Queued {
        Queued { bytes: AtomicUsize::new(0), max }
    }

    /// Counts a job of `size` bytes in, or says how many bytes are queued if it would
    /// take the queue past its bound.
    pub(super) fn admit(&self, size: usize) -> Result<(), usize> {
        // Relaxed: the count orders nothing, it only bounds a number.
        let before = self.bytes.fetch_add(size, Ordering::Relaxed);
        if before != 0 && before + size > self.max {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            return Err(before);
        }
        Ok(())
    }

    /// Counts out jobs of `size` bytes in all, taken from the queue.
    pub(super) fn taken(&self, size: usize) {
        self.bytes.fetch_sub(size, Ordering::Relaxed);
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// The bytes queued now.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A quota a store shares with what its embedder keeps beside it (a service's tenant's
/// storage: its components and its key-value data), for [`Kv::open_sharing`](super::Kv::open_sharing).
/// Its numbers may change at any time; each group of writes reads them as it starts.
#[derive(Debug)]
pub struct SharedQuota {
    /// What the quota is, in a refusal: e.g. ``tenant `acme`'s `storage` ``.
    pub name: String,
    /// How to get more room, in a refusal.
    pub fix: String,
    /// The most bytes the store's keys and values and `others` may take together.
    pub max_bytes: AtomicU64,
    /// The bytes the quota holds beside the store, kept up to date by the embedder.
    pub others: AtomicU64,
    /// The store's own bytes of keys and values, as of its last commit: kept by the store.
    pub used: AtomicU64,
}

impl SharedQuota {
    /// A quota of `max_bytes`, nothing held yet.
    pub fn new(name: impl Into<String>, fix: impl Into<String>, max_bytes: u64) -> SharedQuota {
        SharedQuota {
            name: name.into(),
            fix: fix.into(),
            max_bytes: AtomicU64::new(max_bytes),
            others: AtomicU64::new(0),
            used: AtomicU64::new(0),
        }
    }
}

/// The writer thread's state.
pub(super) struct Writer {
    store: Arc<Store>,
    settings: KvSettings,
    shared: Option<Arc<SharedQuota>>,
    /// As of the last commit.
    totals: Totals,
    /// Why the store accepts no more writes: a commit failed, and what it left on the
    /// disk is unknown.
    stopped: Option<String>,
}

impl Writer {
    pub(super) fn new(
        store: Arc<Store>,
        settings: KvSettings,
        shared: Option<Arc<SharedQuota>>,
        totals: Totals,
    ) -> Writer {
        Writer { store, settings, shared, totals, stopped: None }
    }

    /// Serves the queue until every sender is gone and it is empty, counting what it
    /// takes out of `queued` once it is answered.
    pub(super) fn run(mut self, jobs: Receiver<Job>, queued: &Queued) {
        while let Ok(first) = jobs.recv() {
            // Everything waiting joins the group: the group grows with the load, and no
            // write waits for a timer.
            let group: Vec<Job> = std::iter::once(first).chain(jobs.try_iter()).collect();
            let size = group.iter().map(Job::size).sum();
            self.carry_out(group);
            queued.taken(size);
        }
    }

    fn carry_out(&mut self, jobs: Vec<Job>) {
        let mut group = Group::new(&self.store, &self.settings, self.totals);
        group.shared = self.shared.as_deref();
        let mut writes = Vec::new();
        let mut lists = Vec::new();
        for job in jobs {
            match job {
                Job::Write { op, idempotency, done } => {
                    let result = match &self.stopped {
                        Some(why) => Err(stopped(why)),
                        None => group.apply(&op, idempotency.as_ref()),
                    };
                    writes.push((done, result));
                }
                Job::List { query, done } => lists.push((query, done)),
            }
        }
        match group.commit() {
            Ok(totals) => {
                self.totals = totals;
                if let Some(shared) = &self.shared {
                    shared.used.store(totals.bytes, Ordering::Relaxed);
                }
            }
            Err(failure) => {
                tracing::error!(error = %failure, "the key-value store failed a write; it accepts no more");
                let why = failure.message;
                // Every answer of the group, failures included, was decided against
                // writes that may not have happened.
                for (_, result) in &mut writes {
                    *result = Err(stopped(&why));
                }
                self.stopped = Some(why);
            }
        }
        for (done, result) in writes {
            done.complete(result.map(|body| Payload { format: Format::Json, data: body }).map_err(String::from));
        }
        // After the commit, so that a list sees every write that came before it.
        for (query, done) in lists {
            done.complete(crate::provider::answer(self.store.list(&query)));
        }
    }
}

fn stopped(why: &str) -> Failure {
    Failure::new(ErrorCode::Unavailable, format!("the key-value store accepts no more writes since one failed: {why}"))
}

/// The digest of a write request that an idempotency key's kept answer is checked
/// against: FNV-1a over the command's name, its payload's format and data. Stable across
/// builds (it is stored), unlike the standard library's hashers.
///
/// Idempotency keys name a process's yield by pid, step and tag, and a later run with a
/// fresh journal gives out the same pids again; the digest keeps such a run's different
/// write from being answered with an old one's answer.
pub(super) fn digest(name: &str, payload: &Payload) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let parts: [&[u8]; 3] = [name.as_bytes(), payload.format.as_str().as_bytes(), &payload.data];
    let mut hash = OFFSET;
    for part in parts {
        for &byte in part {
            hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
        }
        // A separator, so that moving bytes between parts changes the digest.
        hash = (hash ^ 0xff).wrapping_mul(PRIME);
    }
    hash
}

/// The writes of one turn of the writer thread, applied to an overlay of the store.
pub(super) struct Group<'a> {
    store: &'a Store,
    settings: &'a KvSettings,
    /// The quota the store shares, if any: it bounds the store instead of `max_bytes`.
    shared: Option<&'a SharedQuota>,
    /// As the group's writes so far leave them.
    totals: Totals,
    /// Each key the group has written: its version and value text, or `None` deleted.
    data: HashMap<String, Option<(u64, String)>>,
    /// The answers the group keeps, by idempotency key.
    answers: HashMap<String, Answer>,
}

impl<'a> Group<'a> {
    pub(super) fn new(store: &'a Store, settings: &'a KvSettings, totals: Totals) -> Group<'a> {
        Group { store, settings, shared: None, totals, data: HashMap::new(), answers: HashMap::new() }
    }

    /// Applies one write after the group's earlier ones, and returns its answer's JSON.
    /// A write that fails changes nothing.
    pub(super) fn apply(&mut self, op: &Op, idempotency: Option<&Idempotency>) -> Result<Vec<u8>, Failure> {
        if let Some(idempotency) = idempotency
            && let Some(kept) = self.answer(&idempotency.key)?
            && kept.digest == idempotency.digest
        {
            // The same request carried out again, after a crash lost its completion:
            // it has happened, so it is answered as it was and not written again.
            return Ok(kept.body);
        }
        let body = match op {
            Op::Put { key, text } => {
                let version = self.put(key, text)?;
                serde_json::json!({ "version": version })
            }
            Op::Cas { key, expected, text } => {
                let current = self.stored(key)?.map_or(0, |stored| stored.version);
                if current != *expected {
                    return Err(Failure::new(
                        ErrorCode::Conflict,
                        format!("`{}` is at version {current}, not {expected}", shown(key)),
                    ));
                }
                let version = self.put(key, text)?;
                serde_json::json!({ "version": version })
            }
            Op::Delete { key } => {
                let deleted = self.delete(key)?;
                serde_json::json!({ "deleted": deleted })
            }
        };
        let body = serde_json::to_vec(&body).expect("a JSON value serialises");
        if let Some(idempotency) = idempotency
            && self.settings.max_answers > 0
        {
            let seq = self.totals.answers_next;
            self.totals.answers_next += 1;
            let answer = Answer { seq, digest: idempotency.digest, body: body.clone() };
            self.answers.insert(idempotency.key.clone(), answer);
        }
        Ok(body)
    }

    /// `key` as the group's writes so far leave it.
    fn stored(&self, key: &str) -> Result<Option<Stored>, Failure> {
        match self.data.get(key) {
            Some(written) => Ok(written.as_ref().map(|(version, text)| Stored { version: *version, len: text.len() })),
            None => self.store.stored(key),
        }
    }

    fn answer(&self, key: &str) -> Result<Option<Answer>, Failure> {
        match self.answers.get(key) {
            Some(answer) => Ok(Some(answer.clone())),
            None => self.store.answer(key),
        }
    }

    /// Writes `key` if the quotas allow, and returns its new version.
    fn put(&mut self, key: &str, text: &str) -> Result<u64, Failure> {
        let old = self.stored(key)?;
        let size = |len: usize| (key.len() + len) as u64;
        let kept = self.totals.bytes.saturating_sub(old.map_or(0, |old| size(old.len)));
        let bytes = kept + size(text.len());
        if old.is_none() && self.totals.keys >= self.settings.max_keys {
            return Err(Failure::new(
                ErrorCode::Limit,
                format!(
                    "the store holds {} keys, the most `max_keys` (--kv-max-keys) of {} allows: delete one to add `{}`",
                    self.totals.keys,
                    self.settings.max_keys,
                    shown(key)
                ),
            ));
        }
        // A write that makes the store no larger is let through even past the quota (a
        // store reopened with a smaller `max_bytes` can still shrink its values).
        if let Some(shared) = self.shared {
            // Relaxed: each number stands alone and orders nothing; a check against one a
            // moment old bounds the store as well (an upload racing a write may pass the
            // quota by the smaller of the two, once).
            let (most, others) = (shared.max_bytes.load(Ordering::Relaxed), shared.others.load(Ordering::Relaxed));
            if bytes.saturating_add(others) > most && bytes > self.totals.bytes {
                return Err(Failure::new(
                    ErrorCode::Limit,
                    format!(
                        "writing `{}` would make the store {bytes} bytes of keys and values, which with the {others} \
                         bytes beside it pass {} of {most}: {}",
                        shown(key),
                        shared.name,
                        shared.fix
                    ),
                ));
            }
        } else if bytes > self.settings.max_bytes && bytes > self.totals.bytes {
            return Err(Failure::new(
                ErrorCode::Limit,
                format!(
                    "writing `{}` would make the store {bytes} bytes of keys and values, over `max_bytes` (--kv-max-bytes) of {}",
                    shown(key),
                    self.settings.max_bytes
                ),
            ));
        }
        // Versions come from one counter for the whole store, which only grows: a key
        // deleted and written again never has a version it had before, so a
        // compare-and-swap cannot mistake it for the old one.
        self.totals.version += 1;
        self.totals.keys += u64::from(old.is_none());
        self.totals.bytes = bytes;
        self.data.insert(key.to_owned(), Some((self.totals.version, text.to_owned())));
        Ok(self.totals.version)
    }

    fn delete(&mut self, key: &str) -> Result<bool, Failure> {
        let Some(old) = self.stored(key)? else {
            return Ok(false);
        };
        self.totals.keys = self.totals.keys.saturating_sub(1);
        self.totals.bytes = self.totals.bytes.saturating_sub((key.len() + old.len) as u64);
        self.data.insert(key.to_owned(), None);
        Ok(true)
    }

    /// Writes the group's changes, its totals and the answers it keeps in one batch,
    /// synced, forgetting the oldest answers past `max_answers`; returns the new totals.
    /// A group that changed nothing writes nothing.
    ///
    /// # Errors
    ///
    /// The store failed; nothing of the group may be assumed written.
    pub(super) fn commit(mut self) -> Result<Totals, Failure> {
        if self.data.is_empty() && self.answers.is_empty() {
            return Ok(self.totals);
        }
        let store = self.store;
        let mut batch = store.db.batch().durability(Some(fjall::PersistMode::SyncData));
        // The answers past the bound: the oldest, by number. Those the group itself kept
        // are dropped before they are written; older ones are removed from the disk,
        // unless the group replaces the answer under the same key.
        let keep_from = self.totals.answers_next.saturating_sub(self.settings.max_answers);
        if keep_from > self.totals.answers_first {
            self.answers.retain(|_, answer| answer.seq >= keep_from);
            for (seq, key) in store.ages(self.totals.answers_first, keep_from)? {
                batch.remove(&store.ages, seq.to_be_bytes());
                let current = store.answer(&key)?;
                if !self.answers.contains_key(&key) && current.is_some_and(|answer| answer.seq == seq) {
                    batch.remove(&store.answers, key.as_str());
                }
            }
            self.totals.answers_first = keep_from;
        }
        for (key, written) in &self.data {
            match written {
                Some((version, text)) => batch.insert(&store.data, key.as_str(), store::record(*version, text)),
                None => batch.remove(&store.data, key.as_str()),
            }
        }
        for (key, answer) in &self.answers {
            batch.insert(&store.answers, key.as_str(), answer.encode());
            batch.insert(&store.ages, answer.seq.to_be_bytes(), key.as_str());
        }
        batch.insert(&store.meta, store::TOTALS, self.totals.encode());
        // `SyncData` (`fdatasync`) is enough: fjall preallocates each log file and
        // syncs it and its directory when it creates it, so a commit changes no
        // metadata that reading the log back needs.
        batch.commit().map_err(store::unavailable)?;
        Ok(self.totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("wasmproc-kv-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn put(key: &str, text: &str) -> Op {
        Op::Put { key: key.to_owned(), text: text.to_owned() }
    }

    fn keyed(key: &str, digest: u64) -> Idempotency {
        Idempotency { key: key.to_owned(), digest }
    }

    /// Applies `writes` as one group and commits it.
    fn group(
        store: &Store,
        settings: &KvSettings,
        totals: &mut Totals,
        writes: &[(Op, Option<Idempotency>)],
    ) -> Vec<Result<String, String>> {
        let mut group = Group::new(store, settings, *totals);
        let answers = writes
            .iter()
            .map(|(op, key)| {
                group.apply(op, key.as_ref()).map(|b| String::from_utf8(b).unwrap()).map_err(|f| f.to_string())
            })
            .collect();
        *totals = group.commit().unwrap();
        answers
    }

    #[test]
    fn a_retried_write_is_answered_as_before_and_not_written_again() {
        let dir = scratch("idempotent");
        let (store, mut totals) = Store::open(&dir).unwrap();
        let settings = KvSettings::default();
        let cas = Op::Cas { key: "n".to_owned(), expected: 0, text: "1".to_owned() };
        let first = group(&store, &settings, &mut totals, &[(cas.clone(), Some(keyed("p-1-1", 7)))]);
        assert_eq!(first, [Ok(r#"{"version":1}"#.to_owned())]);
        // The retry, in a later group: the kept answer, no conflict, no write.
        let again = group(&store, &settings, &mut totals, &[(cas.clone(), Some(keyed("p-1-1", 7)))]);
        assert_eq!(again, first);
        assert_eq!(totals.version, 1, "nothing written again");
        // Without a key, or with another request under the key, it is carried out.
        let plain = group(&store, &settings, &mut totals, &[(cas.clone(), None)]);
        assert_eq!(plain, [Err("conflict: `n` is at version 1, not 0".to_owned())]);
        let other = group(&store, &settings, &mut totals, &[(put("n", "5"), Some(keyed("p-1-1", 8)))]);
        assert_eq!(other, [Ok(r#"{"version":2}"#.to_owned())]);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_the_newest_answers_are_kept() {
        let dir = scratch("answers");
        let (store, mut totals) = Store::open(&dir).unwrap();
        let settings = KvSettings { max_answers: 3, ..KvSettings::default() };
        for i in 0..3 {
            group(&store, &settings, &mut totals, &[(put("k", "1"), Some(keyed(&format!("a{i}"), i)))]);
        }
        // Four in one group: the first of them is past the bound before it is written.
        let four: Vec<_> = (3..7).map(|i| (put("k", "2"), Some(keyed(&format!("a{i}"), i)))).collect();
        group(&store, &settings, &mut totals, &four);
        let kept: Vec<bool> = (0..7).map(|i| store.answer(&format!("a{i}")).unwrap().is_some()).collect();
        assert_eq!(kept, [false, false, false, false, true, true, true]);
        assert_eq!((totals.answers_first, totals.answers_next), (4, 7));
        assert_eq!(store.ages(0, 10).unwrap().len(), 3, "the age index holds only what is kept");
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_queue_holds_its_bound_in_bytes() {
        let queued = Queued::new(1000);
        assert_eq!(queued.admit(600), Ok(()));
        assert_eq!(queued.admit(400), Ok(()), "up to the bound exactly");
        assert_eq!(queued.admit(1), Err(1000));
        queued.taken(600);
        assert_eq!(queued.admit(1), Ok(()), "what the writer took is room again");
        queued.taken(401);
        assert_eq!(queued.admit(5000), Ok(()), "an empty queue takes any one job");
        assert_eq!(queued.admit(1), Err(5000));
    }

    #[test]
    fn the_digest_tells_requests_apart() {
        let a = digest("kv.put", &Payload::text("{}"));
        assert_eq!(a, digest("kv.put", &Payload::text("{}")));
        assert_ne!(a, digest("kv.cas", &Payload::text("{}")));
        assert_ne!(a, digest("kv.put", &Payload::bytes(b"{}".to_vec())));
        assert_ne!(digest("ab", &Payload::text("c")), digest("a", &Payload::text("bc")));
    }
}
