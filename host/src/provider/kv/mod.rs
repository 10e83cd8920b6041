//! `kv.*`: a persistent key-value store per application.
//!
//! A [`Kv`] is one store in a directory of its own, on the embedded database the journal
//! uses (fjall). Every process granted `kv.*` (or some of its commands) reads and writes
//! the same keys; clones of a `Kv` share the store, so one store can serve several
//! schedulers.
//!
//! # Commands
//!
//! Input and answer are JSON payloads. Keys are non-empty strings of at most
//! [`KvSettings::max_key_size`] bytes, ordered by their UTF-8 bytes. Values are any JSON,
//! stored as their compact JSON text (as `serde_json` reads them: a number past 64 bits
//! becomes a float).
//!
//! - `kv.get {"key"}` → `{"value", "version"}`, or `null` when the key is absent.
//! - `kv.put {"key", "value"}` → `{"version"}`.
//! - `kv.delete {"key"}` → `{"deleted": bool}`.
//! - `kv.list {"prefix": "", "after"?, "limit"?}` → `{"keys": [...], "more": bool}`: the
//!   keys with the prefix, strictly after `after`, in order, at most `limit` of them
//!   (by default and at most [`KvSettings::list_limit`]); `more` says whether others
//!   follow. Page with `after` = the last key returned.
//! - `kv.cas {"key", "version", "value"}` → `{"version"}`: writes only if the key is at
//!   `version` (0: the key must be absent); otherwise fails with `conflict`, saying
//!   which version the key is at: ``conflict: `KEY` is at version M, not N`` (M is 0
//!   when it is absent).
//!
//! Failures are `code: message` (see [`crate::provider`]): `invalid` (input that is not
//! the command's JSON, an empty key), `limit` (a quota or a size limit, named with its
//! setting), `conflict`, `unavailable` (the store failed).
//!
//! **Versions** come from one counter for the whole store, which only grows and is
//! written with every commit: a key deleted and written again gets a version it never
//! had, so a compare-and-swap never mistakes a new value for the one it read (no ABA).
//!
//! # Durability
//!
//! When a write completes without error, it is on disk: synced, it survives a crash of
//! the machine. One thread of the store's carries out every write:
//!
//! 1. `handle`, on the worker that ran the step, checks the input (JSON, sizes), takes
//!    the request's completer and queues the write. The worker goes on at once. What
//!    waits in the queue is bounded ([`KvSettings::max_queued_bytes`]): past it a write
//!    fails `limit` at once instead of waiting in memory.
//! 2. The writer thread takes every write waiting (the group), and applies them one after
//!    another in arrival order, each against the store as the group's earlier writes
//!    leave it, deciding its answer (a version, a conflict, a full quota).
//! 3. It writes what the group changed, the new totals and the answers it keeps (see
//!    Idempotency) in one fjall batch, synced (`fdatasync`).
//! 4. Only then does it complete the group's writes.
//!
//! Why this is right: one thread decides every write, in order, against every write
//! before it, so a compare-and-swap is atomic against all other writes without a lock.
//! A batch is applied all or nothing, also across a crash (fjall's log checksums each
//! batch and drops a torn tail). fjall makes a batch visible to reads only after its log
//! write is synced, so no read sees a write that a crash could still undo; and a write is
//! answered only after the sync. Groups grow with the load: what arrives during a sync
//! forms the next group, so many writes share one sync and none waits for a timer.
//!
//! A commit that fails completes every write of its group with `unavailable`, and the
//! store accepts no more writes (what the failed commit left on the disk is unknown);
//! each later write fails naming the first failure. Reads go on. The failure is logged
//! once, as an error.
//!
//! Commands a process yields in one step are concurrent: their completions may come in
//! any order (a `kv.get` yielded after a `kv.put` in the same step may not see it).
//!
//! # Reads
//!
//! `kv.get` is answered inline, on the worker that ran the step. Measured with the
//! `kv/` benchmark (100 processes, 2 workers, reads from memory), a round trip was
//! 1.2–2.9 M gets/s inline against 0.26–0.49 M through the writer thread, which adds a
//! hand-off between threads and waits behind a group's sync; the store read alone is
//! 3–3.6 M gets/s. An inline read cannot block for long:
//!
//! - it never waits for a write: fjall's log lock, held across a group's sync, is the
//!   writer's alone, and a read looks up the memtables and tables of the tree's current
//!   version;
//! - it takes that version's lock shared, which a flush or a compaction holds exclusively
//!   while it writes and syncs the new version's small manifest file: at worst one such
//!   write and sync (as long as a group's), once per 8 MiB flushed or per compaction;
//! - on a cache miss it reads from the disk: one block per level of the tree (bloom
//!   filters skip the tables without the key), and a value over 1 KiB from its blob file,
//!   at most [`KvSettings::max_value_size`] bytes.
//!
//! `kv.list` may read up to `list_limit` keys, so it runs on the writer thread, after
//! its group's commit (so it sees every write queued before it). It reads keys only:
//! values over 1 KiB are kept apart from the keys (fjall's key-value separation).
//!
//! # Quotas
//!
//! [`KvSettings::max_keys`] and [`KvSettings::max_bytes`] (key bytes plus value JSON
//! bytes) bound what the store holds; a write that would pass one fails `limit` naming
//! it, and a delete frees room. The totals are kept exact across restarts by writing them
//! in the same batch as the writes they count: a batch is all or nothing, so the totals
//! on disk always match the keys on disk, and opening costs one read rather than a count
//! of the whole store. What the store takes on disk is more than `max_bytes` (the log,
//! the answers kept, old versions until compaction).
//!
//! # Idempotency
//!
//! A durable process's yield has an idempotency key
//! ([`Request::idempotency_key`](crate::handler::Request::idempotency_key)): after a host
//! crash, a command whose completion the journal did not record is carried out again
//! with the same key. A write with a key keeps its answer under that key in the same
//! batch as the write, with a digest of the request; the same request with the same key
//! is answered with the kept answer and writes nothing. So a `kv.cas` retried after a
//! crash answers the version it wrote instead of a conflict with itself. A request that
//! differs from the one kept under its key (a later run that reuses pids) is carried out.
//! Failed writes keep nothing: they changed nothing, so carrying them out again is safe.
//!
//! A limit: an idempotency key names a yield by pid, step and tag, which are unique only
//! while the journal holds the process; a host started on an empty journal gives out the
//! same pids again. A later run's write identical to an earlier run's, from the same pid,
//! step and tag, while that answer is kept, is answered with it and not written.
//!
//! The table keeps the newest [`KvSettings::max_answers`] answers (the oldest are removed
//! by the commit that passes the bound): a retry is answered as before as long as fewer
//! than that many keyed writes came after the original. A retry comes as the host starts
//! again, however long it was down, so the bound is a count and not an age.

mod store;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use anyhow::Context as _;
use serde::Deserialize;

use self::store::Store;
pub(crate) use self::writer::Op;
pub use self::writer::SharedQuota;
use self::writer::{Idempotency, Job, Queued, Writer};
use super::{ErrorCode, Failure, Provider, input, unknown};
use crate::handler::Request;
use crate::{Format, Payload};

const COMMANDS: [&str; 5] = ["get", "put", "delete", "list", "cas"];

/// Limits of a [`Kv`] store.
#[derive(Clone, Debug)]
pub struct KvSettings {
    /// The most keys the store holds. By default 100,000.
    pub max_keys: u64,
    /// The most bytes of keys and values (their JSON text) the store holds. By default
    /// 256 MiB.
    pub max_bytes: u64,
    /// The longest key, in bytes. By default 1 KiB.
    pub max_key_size: usize,
    /// The longest value, in bytes of JSON text. By default 1 MiB.
    pub max_value_size: usize,
    /// The most keys one `kv.list` returns. By default 1,000.
    pub list_limit: usize,
    /// How many write answers are kept for retries of durable processes' writes (the
    /// newest; see the module docs, "Idempotency"). 0 keeps none. By default 100,000: a
    /// host's writes in flight at a crash are far fewer.
    pub max_answers: u64,
    /// The bytes of the writes and lists waiting for the store's thread (their keys and
    /// values, and about 128 for each): past it a command fails `limit` at once, to be
    /// sent again once the writes before it are done. By default 64 MiB.
    pub max_queued_bytes: usize,
}

impl Default for KvSettings {
    fn default() -> Self {
        KvSettings {
            max_keys: 100_000,
            max_bytes: 256 << 20,
            max_key_size: 1 << 10,
            max_value_size: 1 << 20,
            list_limit: 1_000,
            max_answers: 100_000,
            max_queued_bytes: 64 << 20,
        }
    }
}

/// The `kv` provider: a store in a directory. Cheap to clone; every clone serves the same
/// store with the same writer thread. Dropping the last clone answers what is queued,
/// stops the thread and closes the store; every write was synced as it completed, so
/// there is nothing left to flush.
#[derive(Clone)]
pub struct Kv {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<Store>,
    settings: KvSettings,
    /// `None` once dropping: closing the queue ends the writer thread.
    queue: Option<Sender<Job>>,
    /// What the queue holds, against `max_queued_bytes`.
    queued: Arc<Queued>,
    writer: Option<JoinHandle<()>>,
}

impl Kv {
    /// Opens the store in `dir`, creating it if need be, and starts its writer thread.
    ///
    /// The store decides what processes read, so its directory must be this user's
    /// alone, as a journal's: it is created private (mode 0700), one that another user
    /// owns or can write to is refused, and one that others can only read is made
    /// private, with a warning (its values are the processes' data). Its files are made
    /// 0600 as it opens.
    ///
    /// # Errors
    ///
    /// The directory cannot be created or read, is not private to this user, is in use
    /// by another wasmproc (or another `Kv` of this process), or holds a damaged store;
    /// or the thread could not start.
    pub fn open(dir: &Path, settings: KvSettings) -> anyhow::Result<Kv> {
        Kv::open_gated(dir, settings, None, None)
    }

    /// As [`Kv::open`], for a store bounded by `quota` instead of
    /// [`KvSettings::max_bytes`]: its keys and values together with what the quota
    /// holds beside the store ([`SharedQuota::others`]). The store keeps
    /// [`SharedQuota::used`] at its own bytes.
    ///
    /// # Errors
    ///
    /// As [`Kv::open`].
    pub fn open_sharing(dir: &Path, settings: KvSettings, quota: Arc<SharedQuota>) -> anyhow::Result<Kv> {
        Kv::open_gated(dir, settings, None, Some(quota))
    }

    /// As [`Kv::open`]; with a `gate`, the writer thread takes no job before the gate
    /// says so (or closes), so that a test can fill the queue.
    fn open_gated(
        dir: &Path,
        settings: KvSettings,
        gate: Option<mpsc::Receiver<()>>,
        shared: Option<Arc<SharedQuota>>,
    ) -> anyhow::Result<Kv> {
        crate::journal::private_dir(dir, "the key-value store", "another user could change what processes read")?;
        let (store, totals) = Store::open(dir)?;
        crate::journal::private_contents(dir)
            .with_context(|| format!("cannot make the key-value store in {} private", dir.display()))?;
        let store = Arc::new(store);
        let (queue, jobs) = mpsc::channel();
        let queued = Arc::new(Queued::new(settings.max_queued_bytes));
        if let Some(shared) = &shared {
            shared.used.store(totals.bytes, std::sync::atomic::Ordering::Relaxed);
        }
        let writer = Writer::new(store.clone(), settings.clone(), shared, totals);
        let taken = queued.clone();
        let thread = std::thread::Builder::new()
            .name("wasmproc-kv".to_owned())
            .spawn(move || {
                if let Some(gate) = gate {
                    let _ = gate.recv();
                }
                writer.run(jobs, &taken)
            })
            .context("cannot start the key-value store's thread")?;
        tracing::debug!(dir = %dir.display(), keys = totals.keys, bytes = totals.bytes, "opened the key-value store");
        Ok(Kv { inner: Arc::new(Inner { store, settings, queue: Some(queue), queued, writer: Some(thread) }) })
    }

    /// The store's settings.
    pub fn settings(&self) -> &KvSettings {
        &self.inner.settings
    }

    /// Reads `key` from the host, as `kv.get` does for a process: its value's JSON text
    /// and its version, or `None` when it is absent.
    ///
    /// # Errors
    ///
    /// The store failed (`unavailable`).
    pub fn read(&self, key: &str) -> Result<Option<(String, u64)>, Failure> {
        self.inner.store.read(key)
    }

    fn submit(&self, job: Job) {
        let size = job.size();
        if let Err(queued) = self.inner.queued.admit(size) {
            let failure = Failure::new(
                ErrorCode::Limit,
                format!(
                    "the key-value store's queue holds {queued} bytes of commands, and this one's {size} would pass \
                     `max_queued_bytes` ({}): send it again once earlier writes are answered",
                    self.inner.queued.max()
                ),
            );
            let (Job::Write { done, .. } | Job::List { done, .. }) = job;
            return done.complete(Err(failure.into()));
        }
        if let Some(queue) = &self.inner.queue {
            // A send fails only once the thread is gone; the job's completer, dropped
            // with it, then answers with an error.
            let _ = queue.send(job);
        }
    }
}

impl Provider for Kv {
    fn family(&self) -> &str {
        "kv"
    }

    fn handle(&self, request: Request<'_>) {
        let name = request.name();
        match parse(&self.inner.settings, name, request.payload()) {
            Ok(Command::Get { key }) => {
                let result = self.inner.store.get(&key);
                request.complete(result.map_err(String::from));
            }
            Ok(Command::List(query)) => {
                let (_, done) = request.into_parts();
                self.submit(Job::List { query, done });
            }
            Ok(Command::Write(op)) => {
                let idempotency = request
                    .idempotency_key()
                    .map(|key| Idempotency { key, digest: writer::digest(name, request.payload()) });
                let (_, done) = request.into_parts();
                self.submit(Job::Write { op, idempotency, done });
            }
            Err(failure) => request.complete(Err(failure.into())),
        }
    }

    fn reads_only(&self, name: &str) -> bool {
        matches!(name, "kv.get" | "kv.list")
    }
}

impl std::fmt::Debug for Kv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kv").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has answered what is queued.
        self.queue.take();
        if let Some(thread) = self.writer.take() {
            // The last clone can be dropped on the writer thread itself: a completion it
            // delivers may drop the last scheduler that held this store. That thread
            // then ends by itself once it sees the queue closed; joining it would be
            // joining itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// `kv.list`'s input, checked.
pub(crate) struct ListQuery {
    pub(crate) prefix: String,
    pub(crate) after: Option<String>,
    pub(crate) limit: usize,
}

/// A `kv.*` command's input, checked against a store's settings: what the store of a
/// directory and the one a cluster's nodes share (`cluster::SharedKv`) both carry out.
pub(crate) enum Command {
    Get { key: String },
    List(ListQuery),
    Write(Op),
}

/// Reads command `name`'s input.
///
/// # Errors
///
/// `invalid` for an unknown command, input that is not the command's JSON or an empty
/// key; `limit` for a key, a value or a list's `limit` over the settings'.
pub(crate) fn parse(settings: &KvSettings, name: &str, payload: &Payload) -> Result<Command, Failure> {
    let key = |key: String| check_key(settings, key);
    let text = |key: &str, value: &serde_json::Value| value_text(settings, key, value);
    Ok(match name.strip_prefix("kv.").unwrap_or(name) {
        "get" => {
            let KeyInput { key: k } = input(name, payload)?;
            Command::Get { key: key(k)? }
        }
        "put" => {
            let PutInput { key: k, value } = input(name, payload)?;
            let k = key(k)?;
            Command::Write(Op::Put { text: text(&k, &value)?, key: k })
        }
        "cas" => {
            let CasInput { key: k, version, value } = input(name, payload)?;
            let k = key(k)?;
            Command::Write(Op::Cas { text: text(&k, &value)?, key: k, expected: version })
        }
        "delete" => {
            let KeyInput { key: k } = input(name, payload)?;
            Command::Write(Op::Delete { key: key(k)? })
        }
        "list" => {
            let ListInput { prefix, after, limit } = input(name, payload)?;
            let most = settings.list_limit;
            let limit = limit.unwrap_or(most);
            if limit > most {
                return Err(Failure::new(
                    ErrorCode::Invalid,
                    format!("`limit` {limit} is over the store's `list_limit` ({most})"),
                ));
            }
            Command::List(ListQuery { prefix, after, limit })
        }
        _ => return Err(unknown(name, "kv", &COMMANDS)),
    })
}

/// `kv.get`'s answer: `{"value", "version"}` for a value's JSON text and version, or
/// `null`. Made from the stored text without parsing it: a store keeps only text that
/// `serde_json` wrote, so it is valid JSON.
pub(crate) fn got(value: Option<(&[u8], u64)>) -> Payload {
    let Some((text, version)) = value else {
        return Payload { format: Format::Json, data: b"null".to_vec() };
    };
    let mut data = Vec::with_capacity(text.len() + 40);
    data.extend_from_slice(b"{\"value\":");
    data.extend_from_slice(text);
    data.extend_from_slice(format!(",\"version\":{version}}}").as_bytes());
    Payload { format: Format::Json, data }
}

fn check_key(settings: &KvSettings, key: String) -> Result<String, Failure> {
    let most = settings.max_key_size;
    if key.is_empty() {
        return Err(Failure::new(ErrorCode::Invalid, "a key is a non-empty string"));
    }
    if key.len() > most {
        return Err(Failure::new(
            ErrorCode::Limit,
            format!("the key `{}` is {} bytes, over `max_key_size` ({most})", shown(&key), key.len()),
        ));
    }
    Ok(key)
}

fn value_text(settings: &KvSettings, key: &str, value: &serde_json::Value) -> Result<String, Failure> {
    let text = value.to_string();
    let most = settings.max_value_size;
    if text.len() > most {
        return Err(Failure::new(
            ErrorCode::Limit,
            format!("the value of `{}` is {} bytes of JSON, over `max_value_size` ({most})", shown(key), text.len()),
        ));
    }
    Ok(text)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyInput {
    key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutInput {
    key: String,
    value: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CasInput {
    key: String,
    version: u64,
    value: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListInput {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

/// `key` as error messages show it: keys may be 1 KiB long.
pub(crate) fn shown(key: &str) -> std::borrow::Cow<'_, str> {
    const MOST: usize = 64;
    match key.char_indices().nth(MOST) {
        Some((end, _)) => format!("{}…", &key[..end]).into(),
        None => key.into(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {

    use parking_lot::Mutex;

    use super::writer::JOB_OVERHEAD;
    use super::*;
    use crate::testing::{PATIENCE, wait_until};
    use crate::{Capabilities, Command, Event, Events, Outcome, Port, Process, Scheduler, Status, StepOutput};

    /// Puts `1` under each of its keys in its first step; each answer goes to `answers`
    /// as it comes, with its key's index, and it completes once all are answered.
    struct Putter {
        keys: Vec<String>,
        started: bool,
        answers: Arc<Mutex<Vec<(u64, Outcome)>>>,
    }

    impl Process for Putter {
        fn init(&mut self, _: Port, _: &str, _: Vec<Payload>) -> anyhow::Result<()> {
            Ok(())
        }

        fn step(&mut self, events: Events<'_>, out: &mut StepOutput) -> anyhow::Result<()> {
            if !std::mem::replace(&mut self.started, true) {
                for (tag, key) in self.keys.iter().enumerate() {
                    let payload = Payload::json(&serde_json::json!({ "key": key, "value": 1 }))?;
                    out.yield_command(tag as u64, Command::Custom { name: "kv.put".into(), payload });
                }
            }
            let mut answers = self.answers.lock();
            for event in events {
                if let Event::Completion { tag, result } = event {
                    answers.push((tag, result));
                }
            }
            if answers.len() == self.keys.len() {
                out.complete(Ok(Payload::empty()));
            } else {
                out.set_status(Status::Blocked);
            }
            Ok(())
        }
    }

    /// Writes wait in the queue of the store's thread; with the thread held up, the queue
    /// takes its bound in bytes and a write past it fails `limit` at once, saying why;
    /// those queued are all carried out once the thread goes on, and what they held is
    /// room again.
    #[test]
    fn writes_past_the_queue_bound_fail_at_once_and_those_queued_are_carried_out() {
        const QUEUED: usize = 3;
        const PAST: usize = 2;
        let dir = std::env::temp_dir().join(format!("wasmproc-kv-queue-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A put of key `kN` with the value `1`, as the queue counts it.
        let put = JOB_OVERHEAD + "k0".len() + "1".len();
        let settings = KvSettings { max_queued_bytes: QUEUED * put, ..KvSettings::default() };
        let (go, gate) = mpsc::channel();
        let kv = Kv::open_gated(&dir, settings, Some(gate), None).expect("opens");
        let scheduler = Scheduler::builder()
            .workers(1)
            .provider(kv.clone())
            .capabilities(Capabilities::default().allow("kv.*"))
            .build()
            .expect("starts");
        let putter = |keys: Vec<String>, answers: &Arc<Mutex<Vec<(u64, Outcome)>>>| {
            let putter = Putter { keys, started: false, answers: answers.clone() };
            scheduler.handle().spawn(putter, "main").expect("spawns")
        };
        let keys: Vec<String> = (0..QUEUED + PAST).map(|n| format!("k{n}")).collect();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let process = putter(keys.clone(), &answers);

        wait_until("the writes past the bound fail", || answers.lock().len() >= PAST);
        let refused = format!(
            "limit: the key-value store's queue holds {} bytes of commands, and this one's {put} would pass \
             `max_queued_bytes` ({}): send it again once earlier writes are answered",
            QUEUED * put,
            QUEUED * put
        );
        let expected: Vec<(u64, Outcome)> = (QUEUED..QUEUED + PAST).map(|n| (n as u64, Err(refused.clone()))).collect();
        assert_eq!(*answers.lock(), expected, "only those past the bound are answered while the thread is held up");

        go.send(()).expect("the writer waits for the gate");
        assert_eq!(process.join_timeout(PATIENCE), Some(Ok(Payload::empty())), "every write is answered");
        let answers = answers.lock();
        assert!(answers[PAST..].iter().all(|(_, result)| result.is_ok()), "{answers:?}");
        let mut carried_out: Vec<u64> = answers[PAST..].iter().map(|(tag, _)| *tag).collect();
        carried_out.sort_unstable();
        assert_eq!(carried_out, (0..QUEUED as u64).collect::<Vec<_>>());
        for (n, key) in keys.iter().enumerate() {
            let stored = kv.read(key).expect("reads").map(|(text, _)| text);
            assert_eq!(stored.as_deref(), (n < QUEUED).then_some("1"), "`{key}`");
        }

        wait_until("the writer counts out what it took", || kv.inner.queued.bytes() == 0);
        let again = Arc::new(Mutex::new(Vec::new()));
        let process = putter(keys[QUEUED..].to_vec(), &again);
        assert_eq!(process.join_timeout(PATIENCE), Some(Ok(Payload::empty())));
        let again = again.lock();
        assert!(again.iter().all(|(_, result)| result.is_ok()), "room again for writes: {again:?}");
        drop(scheduler);
        drop(kv);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
