//! The journal on NATS JetStream: [`JetStreamStore`], a [`Store`] whose records live in
//! a replicated JetStream stream instead of a local directory, so a durable process's
//! history outlives the machine that ran it.
//!
//! # Layout
//!
//! A shard's journal is a stream of its own, `WASMPROC_JOURNAL_SHARD` (the name's first
//! part can be chosen), holding one subject, `PREFIX.journal.SHARD`. Each group commit is
//! one message: the batch's removals and puts, encoded as below. A batch larger than what one
//! message may carry (the server's `max_payload`) is cut into parts published as one
//! JetStream *atomic batch* (servers 2.12 and later), so the stream holds all of it or
//! none of it, as [`Store::commit`] promises.
//!
//! # Fencing
//!
//! Every publish says which sequence it expects the stream's last message to have
//! (`Nats-Expected-Last-Sequence`): the last one this store wrote or read. A commit sent
//! while earlier ones await their acknowledgements expects the sequence those will end
//! at (each commit adds as many messages as it has parts, and nothing else writes the
//! stream: this is why a shard has a stream of its own), and also names the message id
//! of the commit just before it (`Nats-Expected-Last-Msg-Id`). A foretold sequence
//! alone would not fence: another store's claim can fill the very sequence a stale
//! store foretold. The ids are this store's own (a random nonce and a counter), so
//! once another store wrote, no commit of this one matches again.
//! Opening a journal reads it and then *claims* it with an empty commit after what it
//! read. Once another store has opened the same journal, this one's next commit is
//! refused by the server, and the store refuses every commit after it: a node that lost
//! the journal to another (its lease expired while it was paused or cut off) can no
//! longer write a single record, and the journal it fed stops, which ends its processes.
//! A commit whose acknowledgement was lost is sent again with the same message id
//! (`Nats-Msg-Id`), which the stream's duplicate window recognises: a retried commit is
//! written once.
//!
//! # Pipelining
//!
//! Up to [`JetStreamOptions::pipeline`] commits are in flight at once ([`Store::begin`]):
//! sent in order by one task, acknowledged in any order, finished in order. A commit
//! refused because one before it was not stored (its expected sequence never came) is
//! sent again, in order, after that one was; a commit refused while every one before it
//! was stored is fenced out. So the stream holds the commits in the order they were
//! begun, with no gap, or the store stops.
//!
//! # Reading and compaction
//!
//! [`Store::scan`] replays the subject from its first message into the records it
//! describes. Removals leave the messages that wrote the removed records in the stream;
//! once those dead bytes outweigh the live ones, the store writes a *snapshot* (every
//! live record, in one atomic batch, flagged so a reader starts afresh from it) and
//! purges the subject's messages before it. So the stream holds about twice the live
//! records at most, and a replay reads that much.
//!
//! # Durability
//!
//! A commit returns once the stream's leader acknowledged it, which it does once a
//! quorum of the stream's replicas (`replicas`, R3 on a three-server cluster) stored it.
//! Each server writes to its disk on its own schedule (`sync_interval` in its
//! configuration; `always` for an `fsync` before every acknowledgement): replication is
//! what makes an acknowledged record survive the loss of a machine.

use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use parking_lot::Mutex;

use super::blocking::Io;
use super::config::{ClusterConfig, connect};
use crate::journal::{Batch, Began, Done, Key, Store};

/// The first part of the journals' streams' names unless told otherwise: shard `S`'s
/// stream is `WASMPROC_JOURNAL_S`.
pub const DEFAULT_STREAM: &str = "WASMPROC_JOURNAL";
/// How many commits a store has in flight at once unless told otherwise: one, since on
/// servers with no cores to spare, commits in flight together shrink the groups and
/// cost more than the round trips they overlap (`docs/perf/jetstream.md`).
pub const DEFAULT_PIPELINE: usize = 1;
/// The most commits a store may have in flight at once.
pub const MAX_PIPELINE: usize = 64;

/// The header that marks a message's place in a commit: `PART/PARTS` (from 1).
const PART: &str = "Wasmproc-Journal-Part";
/// The header of a snapshot's first part: a reader drops what it read before it.
const SNAPSHOT: &str = "Wasmproc-Journal-Snapshot";
/// Room left in a message for its headers.
const HEADROOM: usize = 4 << 10;
/// The most parts one commit may have (JetStream's bound on an atomic batch).
const MAX_PARTS: usize = 1000;
/// Dead bytes the stream may hold before a compaction is considered at all.
const COMPACT_AFTER: u64 = 4 << 20;
/// The longest one request to the server may take.
const PATIENCE: Duration = Duration::from_secs(30);
/// How often an opening store reads and claims its journal again when another store
/// wrote between the two.
const RETRIES: usize = 3;
/// The first byte of every encoded batch: the encoding's version.
const VERSION: u8 = 1;

/// Where a [`JetStreamStore`] keeps its records.
#[derive(Debug, Clone)]
pub struct JetStreamOptions {
    stream: String,
    shard: u32,
    replicas: usize,
    pipeline: usize,
}

impl Default for JetStreamOptions {
    fn default() -> Self {
        JetStreamOptions { stream: DEFAULT_STREAM.to_owned(), shard: 0, replicas: 1, pipeline: DEFAULT_PIPELINE }
    }
}

impl JetStreamOptions {
    /// Shard 0 of [`DEFAULT_STREAM`], with one replica.
    pub fn new() -> Self {
        Self::default()
    }

    /// The first part of the streams' names (letters, digits, `-` and `_`): shard `S`'s
    /// stream is `NAME_S`.
    pub fn stream(mut self, name: impl Into<String>) -> Self {
        self.stream = name.into();
        self
    }

    /// The shard whose journal this is: its subject is `PREFIX.journal.SHARD`.
    pub fn shard(mut self, shard: u32) -> Self {
        self.shard = shard;
        self
    }

    /// The stream's replicas when this store creates it (1 to 5; 3 on a cluster of three
    /// servers keeps every record through the loss of any one). An existing stream keeps
    /// its own.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// How many group commits may await their acknowledgements at once (1 to
    /// [`MAX_PIPELINE`]; 1: each waits for the one before).
    pub fn pipeline(mut self, commits: usize) -> Self {
        self.pipeline = commits;
        self
    }

    /// The name of the stream that holds this shard's journal.
    pub fn stream_name(&self) -> String {
        format!("{}_{}", self.stream, self.shard)
    }
}

/// A journal's [`Store`] on a JetStream stream: see the module's docs.
pub struct JetStreamStore {
    io: Io,
    context: jetstream::Context,
    client: async_nats::Client,
    stream: String,
    subject: String,
    /// The largest part of a commit, from the server's `max_payload`.
    part_size: usize,
    /// How many commits may be in flight at once.
    pipeline: usize,
    /// To the task that sends begun commits, in order.
    outgoing: tokio::sync::mpsc::UnboundedSender<Outgoing>,
    state: Mutex<State>,
}

/// What a store knows of its subject.
struct State {
    /// The sequence of the stream's last message, as this store last wrote or read it:
    /// what its next publish expects (the fence) when nothing is in flight.
    last: u64,
    /// What `last` will be once every commit in flight is stored: what the next one sent
    /// expects.
    foretold: u64,
    /// Commits begun and not yet finished.
    in_flight: usize,
    /// The last commit finished had to be sent again: the ones after it were sent
    /// expecting a sequence that came only with that second sending, and a refusal of
    /// theirs is not (yet) a sign of another writer.
    resent: bool,
    /// The replies of the commits in flight, oldest first.
    flying: std::collections::VecDeque<Arc<Reply>>,
    /// The message id of the last commit begun (its first part's).
    last_id: Option<String>,
    /// Commits of several parts in flight: the next commit waits for them (an atomic
    /// batch's last part carries no id a commit after it could name).
    batches_in_flight: usize,
    /// Set once a commit failed: the store refuses every later one (the journal stops
    /// using a store after a failed commit; this makes sure nothing else writes).
    failed: Option<String>,
    /// Each live record's size, to weigh what removals leave dead.
    sizes: std::collections::BTreeMap<Key, u32>,
    live: u64,
    dead: u64,
    /// Message ids: this store's nonce and a counter.
    nonce: String,
    published: u64,
    /// The records as of `last`, as the open (or a scan since the last commit) read them:
    /// a resume scans the journal several times (its processes, then each range of them)
    /// before it commits anything, and each would otherwise read the whole subject again.
    /// Dropped by the next commit.
    replayed: Option<std::sync::Arc<Records>>,
}

/// A journal's records, in key order.
type Records = std::collections::BTreeMap<Key, Vec<u8>>;

impl std::fmt::Debug for JetStreamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamStore").field("stream", &self.stream).field("subject", &self.subject).finish()
    }
}

fn other(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(what.to_string())
}

impl JetStreamStore {
    /// Connects to the NATS server of `config` (its credentials and TLS), creates the
    /// stream if it is missing, reads the journal's subject to its end and claims it.
    /// From then on this store is the subject's writer: a store that opened it before
    /// can no longer commit.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses (no JetStream, no rights on the stream's
    /// API or subjects), an existing stream of that name does not carry the subject or
    /// does not allow atomic batches, or the subject holds what this store cannot read.
    pub fn open(config: &ClusterConfig, options: &JetStreamOptions) -> anyhow::Result<JetStreamStore> {
        let store = Self::connect(config, options, true)?;
        store.claim()?;
        Ok(store)
    }

    /// Opens the journal to read it only (`wasmproc journal ls` and `show` of a running
    /// cluster): it claims nothing, so whoever writes the journal goes on, and every
    /// commit is refused.
    ///
    /// # Errors
    ///
    /// As [`JetStreamStore::open`]; also when the stream does not exist.
    pub fn read_only(config: &ClusterConfig, options: &JetStreamOptions) -> anyhow::Result<JetStreamStore> {
        let store = Self::connect(config, options, false)?;
        store.state.lock().failed = Some("it was opened to be read only".to_owned());
        Ok(store)
    }

    fn connect(config: &ClusterConfig, options: &JetStreamOptions, create: bool) -> anyhow::Result<JetStreamStore> {
        super::config::check_stored("stream", &options.stream, options.replicas)?;
        anyhow::ensure!(
            (1..=MAX_PIPELINE).contains(&options.pipeline),
            "a journal has 1 to {MAX_PIPELINE} commits in flight, not {}",
            options.pipeline
        );
        let io = Io::new("wasmproc-jetstream", PATIENCE)?;
        let subject = format!("{}.journal.{}", config.prefix, options.shard);
        let subjects = subject.clone();
        let stream_name = options.stream_name();
        let stream_config = stream::Config {
            name: stream_name.clone(),
            subjects: vec![subjects.clone()],
            storage: stream::StorageType::File,
            num_replicas: options.replicas,
            allow_atomic_publish: true,
            allow_direct: true,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        let config = config.clone();
        let (client, context) = io.run(async move {
            let client = connect(&config, None).await?;
            let context = jetstream::new(client.clone());
            let name = stream_config.name.clone();
            let stream = if create {
                context.get_or_create_stream(stream_config).await.map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create or find the journal's stream `{name}` (is JetStream enabled on the server? \
                         does another stream hold its subject `{subjects}`, as the one stream of every shard that \
                         earlier versions made does?): {e}"
                    )
                })?
            } else {
                context.get_stream(&name).await.map_err(|e| {
                    anyhow::anyhow!(
                        "cannot find the journal's stream `{name}` (is JetStream enabled on the server?): {e}"
                    )
                })?
            };
            // What the creation or the look-up answered: asked again at once, a stream
            // just created may not be known yet to the server asked.
            let info = stream.cached_info();
            anyhow::ensure!(
                info.config.subjects == [subjects.clone()],
                "the stream `{}` holds the subjects {:?}, not the journal's `{subjects}` alone: a shard's journal \
                 needs a stream of its own; name another stream",
                info.config.name,
                info.config.subjects
            );
            anyhow::ensure!(
                info.config.allow_atomic_publish,
                "the stream `{}` exists without atomic batches (`allow_atomic`), which the journal needs; \
                 update it (`nats stream edit --allow-batch`) or name another stream",
                info.config.name
            );
            Ok::<_, anyhow::Error>((client, context))
        })??;
        let part_size = (client.server_info().max_payload.saturating_sub(HEADROOM)).max(1024);
        let (outgoing, sending) = tokio::sync::mpsc::unbounded_channel();
        io.spawn(send_in_order(context.clone(), client.clone(), subject.clone(), sending))?;
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("no randomness for the journal's message ids: {e}"))?;
        Ok(JetStreamStore {
            io,
            context,
            client,
            stream: stream_name,
            subject,
            part_size,
            pipeline: options.pipeline,
            outgoing,
            state: Mutex::new(State {
                last: 0,
                foretold: 0,
                in_flight: 0,
                resent: false,
                flying: std::collections::VecDeque::new(),
                last_id: None,
                batches_in_flight: 0,
                failed: None,
                sizes: std::collections::BTreeMap::new(),
                live: 0,
                dead: 0,
                nonce: crate::codec::hex(&nonce),
                published: 0,
                replayed: None,
            }),
        })
    }

    /// Reads the subject to its end and writes an empty commit after what it read: from
    /// then on no store that opened the journal before can write to it, so nothing it
    /// commits can come after what this one resumes from. Tried again if another store
    /// wrote between the read and the claim.
    fn claim(&self) -> anyhow::Result<()> {
        let mut tries = 0;
        loop {
            tries += 1;
            let (records, last) = self.replay()?;
            let mut state = self.state.lock();
            state.last = last;
            state.sizes.clear();
            state.live = 0;
            for (key, value) in &records {
                state.sizes.insert(*key, value.len() as u32);
                state.live += value.len() as u64;
            }
            match self.publish(&mut state, encode(&Batch::default()), false) {
                Ok(sequence) => {
                    state.last = sequence;
                    state.foretold = sequence;
                    // The claim is empty: the records are still those read.
                    state.replayed = Some(std::sync::Arc::new(records));
                    return Ok(());
                }
                Err(error) if is_fenced(&error) && tries < RETRIES => continue,
                Err(error) => {
                    return Err(anyhow::anyhow!("cannot take the journal on `{}`: {error}", self.subject));
                }
            }
        }
    }

    /// The subject this journal lives on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Reads the subject from its start: the records it holds, and its last sequence.
    fn replay(&self) -> io::Result<(Records, u64)> {
        let context = self.context.clone();
        let stream_name = self.stream.clone();
        let subject = self.subject.clone();
        let deadline = std::time::Instant::now() + PATIENCE;
        let (messages, end) = loop {
            let (context, stream_name, subject) = (context.clone(), stream_name.clone(), subject.clone());
            match self.io.run(async move { read_subject(context, stream_name, subject).await }).and_then(|r| r) {
                Ok(read) => break read,
                // A stream without a leader for a moment: just created, or electing one.
                Err(error) if is_transient(&error) && std::time::Instant::now() < deadline => {
                    tracing::debug!(subject = %self.subject, "the journal is read again: {error}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(error),
            }
        };
        let mut records = std::collections::BTreeMap::new();
        let mut last = 0;
        let mut parts: Vec<u8> = Vec::new();
        let mut snapshot = false;
        // The part the next message must be: commits are atomic, so a gap or a subject
        // that ends inside one is damage, never a torn write.
        let mut next = 1;
        for message in messages {
            last = message.sequence;
            let (part, count) = part_of(&message.headers)?;
            if part != next && part != 1 {
                return Err(other(format!(
                    "the journal's message {last} is part {part} of {count}; part {next} was due"
                )));
            }
            if part == 1 {
                parts.clear();
                snapshot = message.headers.as_ref().is_some_and(|h| h.get(SNAPSHOT).is_some());
            }
            parts.extend_from_slice(&message.payload);
            if part < count {
                next = part + 1;
                continue;
            }
            next = 1;
            if snapshot {
                records.clear();
            }
            apply(&mut records, &parts)?;
        }
        if next != 1 {
            return Err(other(format!("the journal's subject ends inside a commit, at message {last}")));
        }
        Ok((records, last.max(end)))
    }

    /// Publishes `payload` as one commit (in parts if it must), expecting the subject's
    /// last sequence to be `state.last`; the sequence of its last part.
    fn publish(&self, state: &mut State, payload: Vec<u8>, snapshot: bool) -> io::Result<u64> {
        let parts = self.parts(&payload)?;
        let id = next_id(state);
        self.send_again(parts, id, state.last, snapshot)
    }

    /// `payload` cut into the messages of one commit.
    fn parts(&self, payload: &[u8]) -> io::Result<Vec<bytes::Bytes>> {
        let parts: Vec<bytes::Bytes> = payload.chunks(self.part_size).map(bytes::Bytes::copy_from_slice).collect();
        if parts.len() > MAX_PARTS {
            return Err(other(format!(
                "a commit of {} bytes needs {} messages, more than an atomic batch may hold ({MAX_PARTS})",
                payload.len(),
                parts.len()
            )));
        }
        Ok(parts)
    }

    /// Sends a commit and waits for its acknowledgement, again while the server does not
    /// answer (with the same message id, so it is written once); the sequence of its
    /// last part.
    fn send_again(&self, parts: Vec<bytes::Bytes>, id: String, expected: u64, snapshot: bool) -> io::Result<u64> {
        let deadline = std::time::Instant::now() + PATIENCE;
        let mut pause = Duration::from_millis(20);
        loop {
            let context = self.context.clone();
            let client = self.client.clone();
            let subject = self.subject.clone();
            let parts = parts.clone();
            let id = id.clone();
            let outcome = self
                .io
                .run(async move { send_commit(&context, &client, subject, &parts, &id, expected, snapshot).await });
            match outcome.and_then(|sent| sent) {
                Ok(sequence) => return Ok(sequence),
                // The stream has no leader for a moment (just created, or electing after
                // the loss of a server), or an acknowledgement was lost: sent again with
                // the same message id, it is written once.
                Err(error) if is_transient(&error) && std::time::Instant::now() + pause < deadline => {
                    tracing::debug!(subject = %self.subject, "a journal commit is sent again: {error}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Writes every live record as a snapshot and purges the messages before it.
    fn compact(&self, state: &mut State) -> io::Result<()> {
        let (records, last) = self.replay()?;
        if last != state.last {
            return Err(fenced(format!(
                "the journal's subject `{}` was written by another store (its last message is {last}, this store \
                 wrote {}): this store no longer owns it",
                self.subject, state.last
            )));
        }
        let payload = encode(&Batch { puts: records.into_iter().collect(), removals: Vec::new() });
        let parts = payload.len().div_ceil(self.part_size) as u64;
        let sequence = self.publish(state, payload, true)?;
        let first = sequence + 1 - parts.max(1);
        state.last = sequence;
        state.foretold = sequence;
        state.dead = 0;
        let stream_name = self.stream.clone();
        let subject = self.subject.clone();
        let context = self.context.clone();
        self.io.run(async move {
            let stream = context.get_stream_no_info(&stream_name).await.map_err(other)?;
            stream.purge().filter(subject).sequence(first).await.map_err(other)?;
            Ok::<_, io::Error>(())
        })??;
        Ok(())
    }
}

impl JetStreamStore {
    /// Counts what `batch` writes and what it leaves dead, for [`Self::compact_if_due`].
    fn account(state: &mut State, batch: &Batch) {
        for &(process, count) in &batch.removals {
            let doomed: Vec<Key> =
                state.sizes.range(Key { process, seq: 0 }..Key { process, seq: count }).map(|(k, _)| *k).collect();
            for key in doomed {
                let size = u64::from(state.sizes.remove(&key).unwrap_or(0));
                state.live -= size;
                state.dead += size;
            }
        }
        for (key, value) in &batch.puts {
            if let Some(old) = state.sizes.insert(*key, value.len() as u32) {
                state.live -= u64::from(old);
                state.dead += u64::from(old);
            }
            state.live += value.len() as u64;
        }
    }

    /// Waits until every commit of `ahead` is answered: the sequence the last one ended
    /// at, or the first failure. They answer within the sending task's patience.
    fn acknowledged(ahead: &[Arc<Reply>]) -> io::Result<u64> {
        let deadline = std::time::Instant::now() + PATIENCE * 2;
        let mut last = 0;
        for reply in ahead {
            loop {
                match &*reply.outcome.lock() {
                    Some(Ok(sequence)) => {
                        last = last.max(*sequence);
                        break;
                    }
                    Some(Err(error)) => return Err(io::Error::new(error.kind(), error.to_string())),
                    None => {}
                }
                if std::time::Instant::now() > deadline {
                    return Err(other("a commit in flight was never answered"));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(last)
    }

    fn compaction_due(state: &State) -> bool {
        state.dead > COMPACT_AFTER && state.dead > state.live
    }

    /// Compacts the journal once its dead bytes outweigh the live ones, with no commit in
    /// flight. A failed compaction loses nothing (the records are all still in the
    /// stream); it is tried again after the next commit.
    fn compact_if_due(&self, state: &mut State) {
        if state.in_flight == 0
            && Self::compaction_due(state)
            && let Err(error) = self.compact(state)
        {
            tracing::warn!(subject = %self.subject, "cannot compact the journal: {error}");
            if is_fenced(&error) {
                state.failed = Some(error.to_string());
            }
        }
    }
}

/// A commit in flight: what [`Store::finish`] needs to send it again.
struct Flight {
    reply: Arc<Reply>,
    parts: Vec<bytes::Bytes>,
    id: String,
}

/// Where the sending task puts a commit's outcome: its last part's sequence.
struct Reply {
    outcome: Mutex<Option<io::Result<u64>>>,
    done: Mutex<Option<Done>>,
}

impl Reply {
    fn tell(&self, outcome: io::Result<u64>) {
        self.outcome.lock().get_or_insert(outcome);
        if let Some(done) = self.done.lock().take() {
            done.call();
        }
    }
}

/// A commit for the sending task: its parts, its message id, the sequence it expects,
/// and where its outcome goes. Dropped unsent (the client's runtime stopped), it says so
/// rather than leave its committer waiting.
struct Outgoing {
    parts: Vec<bytes::Bytes>,
    id: String,
    expected: u64,
    /// The message id of the commit before it, when that one was still in flight.
    expected_id: Option<String>,
    reply: Arc<Reply>,
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        self.reply.tell(Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the JetStream client stopped before the commit was acknowledged",
        )));
    }
}

impl Store for JetStreamStore {
    fn commit(&self, batch: &Batch, _sync: bool) -> io::Result<()> {
        let mut state = self.state.lock();
        state.replayed = None;
        if let Some(failed) = &state.failed {
            return Err(other(format!("the journal on `{}` failed before: {failed}", self.subject)));
        }
        if state.in_flight > 0 {
            return Err(other("a journal commit was made while others were in flight"));
        }
        let sequence = match self.publish(&mut state, encode(batch), false) {
            Ok(sequence) => sequence,
            Err(error) => {
                state.failed = Some(error.to_string());
                return Err(error);
            }
        };
        state.last = sequence;
        state.foretold = sequence;
        // Whatever was sent again is behind this commit, which is stored.
        state.resent = false;
        Self::account(&mut state, batch);
        self.compact_if_due(&mut state);
        Ok(())
    }

    fn depth(&self) -> usize {
        let state = self.state.lock();
        // One at a time while a compaction waits for the commits in flight, after a
        // failure, and while commits sent again catch up.
        if Self::compaction_due(&state) || state.failed.is_some() || state.resent || state.batches_in_flight > 0 {
            1
        } else {
            self.pipeline
        }
    }

    fn begin(&self, batch: &Batch, _sync: bool, done: Done) -> Began {
        let reply = Arc::new(Reply { outcome: Mutex::new(None), done: Mutex::new(Some(done)) });
        let flight = |parts, id| Began(Box::new(Flight { reply: reply.clone(), parts, id }));
        let mut state = self.state.lock();
        state.replayed = None;
        state.in_flight += 1;
        state.flying.push_back(reply.clone());
        if let Some(failed) = &state.failed {
            let failed = other(format!("the journal on `{}` failed before: {failed}", self.subject));
            reply.tell(Err(failed));
            return flight(Vec::new(), String::new());
        }
        let parts = match self.parts(&encode(batch)) {
            Ok(parts) => parts,
            Err(error) => {
                reply.tell(Err(error));
                return flight(Vec::new(), String::new());
            }
        };
        let id = next_id(&mut state);
        let ahead: Vec<Arc<Reply>> = state.flying.iter().take(state.flying.len() - 1).cloned().collect();
        let (expected, expected_id) = if ahead.is_empty() {
            (state.last, None)
        } else if parts.len() > 1 {
            // An atomic batch is sent expecting a sequence known to be stored: the
            // commits ahead of it must be acknowledged first.
            match Self::acknowledged(&ahead) {
                Ok(sequence) => (sequence, None),
                Err(error) => {
                    // Sent again by `finish`, in order, after the ones ahead of it.
                    reply.tell(Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        format!("a commit ahead of this one was not acknowledged: {error}"),
                    )));
                    state.foretold += parts.len() as u64;
                    state.last_id = Some(id.clone());
                    Self::account(&mut state, batch);
                    return flight(parts, id);
                }
            }
        } else {
            (state.foretold, state.last_id.clone())
        };
        state.foretold = expected + parts.len().max(1) as u64;
        state.last_id = Some(id.clone());
        if parts.len() > 1 {
            state.batches_in_flight += 1;
        }
        Self::account(&mut state, batch);
        drop(state);
        let outgoing = Outgoing { parts: parts.clone(), id: id.clone(), expected, expected_id, reply: reply.clone() };
        // A closed channel drops the commit, which tells its reply so.
        let _ = self.outgoing.send(outgoing);
        flight(parts, id)
    }

    fn finish(&self, began: Began) -> io::Result<()> {
        let flight = began
            .0
            .downcast::<Flight>()
            .map_err(|_| other("a commit was finished by a store that did not begin it"))?;
        let outcome = flight.reply.outcome.lock().take().unwrap_or_else(|| Err(other("a commit finished unanswered")));
        let mut state = self.state.lock();
        state.in_flight -= 1;
        state.flying.pop_front();
        if flight.parts.len() > 1 {
            state.batches_in_flight = state.batches_in_flight.saturating_sub(1);
        }
        if let Some(failed) = &state.failed {
            return Err(other(format!("the journal on `{}` failed before: {failed}", self.subject)));
        }
        let outcome = match outcome {
            Ok(sequence) => {
                state.resent = false;
                Ok(sequence)
            }
            // Not stored, or stored unacknowledged; or refused because one before it was
            // not stored when it came. Sent again after the one before, expecting where
            // that one ended: written once, in order, or refused for good.
            Err(error) if is_transient(&error) || is_fenced(&error) && state.resent => {
                tracing::debug!(subject = %self.subject, "a journal commit is sent again: {error}");
                state.resent = true;
                self.send_again(flight.parts.clone(), flight.id.clone(), state.last, false)
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(sequence) => {
                state.last = sequence;
                self.compact_if_due(&mut state);
                Ok(())
            }
            Err(error) => {
                state.failed = Some(error.to_string());
                Err(error)
            }
        }
    }

    fn scan(&self, from: Key, visit: &mut dyn FnMut(Key, &[u8]) -> ControlFlow<()>) -> io::Result<()> {
        let cached = self.state.lock().replayed.clone();
        let records = match cached {
            Some(records) => records,
            None => {
                let (records, last) = self.replay()?;
                let records = std::sync::Arc::new(records);
                let mut state = self.state.lock();
                // Kept only by the journal's owner (a store that only reads knows no last
                // sequence of its own), and only if nothing was committed meanwhile, by
                // it or another store.
                if last != 0 && state.last == last {
                    state.replayed = Some(records.clone());
                }
                records
            }
        };
        for (key, value) in records.range(from..) {
            if visit(*key, value).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// `Wasmproc-Journal-Part: I/N`.
fn part_of(headers: &Option<HeaderMap>) -> io::Result<(usize, usize)> {
    let value = headers
        .as_ref()
        .and_then(|h| h.get(PART))
        .ok_or_else(|| other("a message in the journal's subject is not the journal's (no part header)"))?;
    let (part, count) = value
        .as_str()
        .split_once('/')
        .and_then(|(p, c)| Some((p.parse::<usize>().ok()?, c.parse::<usize>().ok()?)))
        .filter(|&(p, c)| p >= 1 && p <= c)
        .ok_or_else(|| other(format!("a journal message has a damaged part header `{}`", value.as_str())))?;
    Ok((part, count))
}

/// A message of the subject as a replay needs it.
struct Read {
    sequence: u64,
    headers: Option<HeaderMap>,
    payload: bytes::Bytes,
}

/// Every message of `subject`, in order, up to its last at the time of the call, and the
/// stream's last sequence (the subject's, unless the stream was purged to its end).
async fn read_subject(
    context: jetstream::Context,
    stream_name: String,
    subject: String,
) -> io::Result<(Vec<Read>, u64)> {
    let unanswered = |error: &dyn std::fmt::Display| {
        io::Error::new(io::ErrorKind::NotConnected, format!("cannot read the journal's subject `{subject}`: {error}"))
    };
    // The stream's state as its leader tells it. A direct get of the last message may be
    // answered by a replica that has not caught up: a replay that stopped at its answer
    // would miss records the leader acknowledged, and an empty answer would pass for an
    // empty journal, which a claim after it would then fence from its own history.
    let stream = context.get_stream(&stream_name).await.map_err(|e| match e.kind() {
        jetstream::context::GetStreamErrorKind::JetStream(_) => {
            other(format!("cannot read the journal's subject `{subject}`: {e}"))
        }
        _ => unanswered(&e),
    })?;
    let state = stream.cached_info().state.clone();
    if state.messages == 0 {
        return Ok((Vec::new(), state.last_sequence));
    }
    let last = state.last_sequence;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject.clone(),
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| unanswered(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| unanswered(&e))?;
    let mut read = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message.map_err(other)?;
        let sequence = message.info().map_err(other)?.stream_sequence;
        read.push(Read { sequence, headers: message.headers.clone(), payload: message.payload.clone() });
        if sequence >= last {
            break;
        }
    }
    Ok((read, last))
}

/// The next message id of the store whose state is `state`.
fn next_id(state: &mut State) -> String {
    state.published += 1;
    format!("{}.{}", state.nonce, state.published)
}

/// Sends the commits a store began, in the order it began them: a commit of one part is
/// published and its acknowledgement awaited apart, so the next one leaves at once; one
/// of several parts (an atomic batch) is sent whole before the next.
async fn send_in_order(
    context: jetstream::Context,
    client: async_nats::Client,
    subject: String,
    mut sending: tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
) {
    while let Some(out) = sending.recv().await {
        if out.parts.len() > 1 {
            let sent = send_commit(&context, &client, subject.clone(), &out.parts, &out.id, out.expected, false);
            let outcome = tokio::time::timeout(PATIENCE, sent).await.unwrap_or_else(|_| Err(unacknowledged(&subject)));
            out.reply.tell(outcome);
            continue;
        }
        let payload = out.parts.first().cloned().unwrap_or_default();
        let mut headers = headers(0, 1, &out.id, out.expected, false);
        if let Some(id) = &out.expected_id {
            headers.insert("Nats-Expected-Last-Msg-Id", id.as_str());
        }
        match context.publish_with_headers(subject.clone(), headers, payload).await {
            Ok(ack) => {
                let subject = subject.clone();
                tokio::spawn(async move {
                    let outcome = match tokio::time::timeout(PATIENCE, ack).await {
                        Ok(Ok(ack)) => Ok(ack.sequence),
                        Ok(Err(error)) => Err(publish_error(&subject, &error)),
                        Err(_) => Err(unacknowledged(&subject)),
                    };
                    out.reply.tell(outcome);
                });
            }
            Err(error) => out.reply.tell(Err(publish_error(&subject, &error))),
        }
    }
}

fn unacknowledged(subject: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("no acknowledgement for `{subject}` within {PATIENCE:?}"))
}

/// The headers of part `index` (from 0) of a commit of `count` parts.
fn headers(index: usize, count: usize, id: &str, expected: u64, snapshot: bool) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(PART, format!("{}/{count}", index + 1).as_str());
    if index == 0 {
        headers.insert("Nats-Expected-Last-Sequence", expected.to_string().as_str());
        headers.insert("Nats-Msg-Id", id);
        if snapshot {
            headers.insert(SNAPSHOT, "1");
        }
    }
    if count > 1 {
        headers.insert("Nats-Batch-Id", id);
        headers.insert("Nats-Batch-Sequence", (index + 1).to_string().as_str());
        if index + 1 == count {
            headers.insert("Nats-Batch-Commit", "1");
        }
    }
    headers
}

/// Sends one commit: a plain publish when it has one part, an atomic batch otherwise;
/// the sequence of its last part.
async fn send_commit(
    context: &jetstream::Context,
    client: &async_nats::Client,
    subject: String,
    parts: &[bytes::Bytes],
    id: &str,
    expected: u64,
    snapshot: bool,
) -> io::Result<u64> {
    let count = parts.len().max(1);
    let empty = bytes::Bytes::new();
    let mut last_ack = None;
    for index in 0..count {
        let payload = parts.get(index).unwrap_or(&empty).clone();
        let headers = headers(index, count, id, expected, snapshot);
        if index + 1 == count {
            let ack = context
                .publish_with_headers(subject.clone(), headers, payload)
                .await
                .map_err(|e| publish_error(&subject, &e))?
                .await
                .map_err(|e| publish_error(&subject, &e))?;
            last_ack = Some(ack.sequence);
        } else if index == 0 {
            // A batch starts with a request, which the server answers with nothing
            // (or an error).
            let reply = client.request_with_headers(subject.clone(), headers, payload).await.map_err(other)?;
            if !reply.payload.is_empty() {
                return Err(other(format!(
                    "the server refused a journal commit on `{subject}`: {}",
                    String::from_utf8_lossy(&reply.payload)
                )));
            }
        } else {
            client.publish_with_headers(subject.clone(), headers, payload).await.map_err(other)?;
        }
    }
    last_ack.ok_or_else(|| other("a commit with no message"))
}

/// Another store wrote the journal after this one last read or wrote it: this store no
/// longer owns it. Told apart from other failures by its type, not its words.
#[derive(Debug)]
struct Fenced(String);

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fenced {}

fn fenced(message: String) -> io::Error {
    io::Error::other(Fenced(message))
}

fn is_fenced(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<Fenced>())
}

/// Whether a commit that failed so may be sent again: the server did not store it, or
/// may have, and the message id makes a second copy a duplicate.
fn is_transient(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::NotConnected)
}

fn publish_error(subject: &str, error: &jetstream::context::PublishError) -> io::Error {
    use jetstream::context::PublishErrorKind as Kind;
    match error.kind() {
        Kind::StreamNotFound | Kind::BrokenPipe => io::Error::new(
            io::ErrorKind::NotConnected,
            format!("no stream leader took the journal's commit on `{subject}`: {error}"),
        ),
        Kind::WrongLastSequence | Kind::WrongLastMessageId => fenced(format!(
            "the journal's subject `{subject}` was written by another store since this one last wrote it: this \
             store no longer owns it ({error})"
        )),
        Kind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, format!("no acknowledgement for `{subject}`: {error}"))
        }
        _ => other(format!("cannot write the journal on `{subject}`: {error}")),
    }
}

/// A batch as a message's payload: the version, the removals, then the puts, numbers
/// little-endian.
fn encode(batch: &Batch) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 16 + batch.removals.len() * 16 + batch.bytes() + batch.puts.len() * 20);
    out.push(VERSION);
    out.extend_from_slice(&(batch.removals.len() as u64).to_le_bytes());
    for &(process, count) in &batch.removals {
        out.extend_from_slice(&process.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
    out.extend_from_slice(&(batch.puts.len() as u64).to_le_bytes());
    for (key, value) in &batch.puts {
        out.extend_from_slice(&key.process.to_le_bytes());
        out.extend_from_slice(&key.seq.to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// Applies an encoded batch to `records`, as [`Store::commit`] applies one: removals,
/// then puts.
fn apply(records: &mut std::collections::BTreeMap<Key, Vec<u8>>, mut bytes: &[u8]) -> io::Result<()> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
        if bytes.len() < n {
            return Err(other("a journal message ends inside a record"));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    }
    fn number(bytes: &mut &[u8]) -> io::Result<u64> {
        Ok(u64::from_le_bytes(take(bytes, 8)?.try_into().map_err(other)?))
    }
    let version = take(&mut bytes, 1)?[0];
    if version != VERSION {
        return Err(other(format!("a journal message has format version {version}; this wasmproc reads {VERSION}")));
    }
    let removals = number(&mut bytes)?;
    for _ in 0..removals {
        let process = number(&mut bytes)?;
        let count = number(&mut bytes)?;
        let doomed: Vec<Key> =
            records.range(Key { process, seq: 0 }..Key { process, seq: count }).map(|(k, _)| *k).collect();
        for key in doomed {
            records.remove(&key);
        }
    }
    let puts = number(&mut bytes)?;
    for _ in 0..puts {
        let process = number(&mut bytes)?;
        let seq = number(&mut bytes)?;
        let len = u32::from_le_bytes(take(&mut bytes, 4)?.try_into().map_err(other)?) as usize;
        records.insert(Key { process, seq }, take(&mut bytes, len)?.to_vec());
    }
    if !bytes.is_empty() {
        return Err(other("a journal message has bytes after its records"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_batch_applies_as_a_commit_does() {
        let mut records = std::collections::BTreeMap::new();
        let first = Batch {
            puts: vec![
                (Key { process: 1, seq: 0 }, b"spawn".to_vec()),
                (Key { process: 1, seq: 1 }, b"step".to_vec()),
                (Key { process: 2, seq: 0 }, Vec::new()),
            ],
            removals: Vec::new(),
        };
        apply(&mut records, &encode(&first)).unwrap();
        let second = Batch { puts: vec![(Key { process: 1, seq: 0 }, b"again".to_vec())], removals: vec![(1, 2)] };
        apply(&mut records, &encode(&second)).unwrap();
        let held: Vec<_> = records.into_iter().collect();
        assert_eq!(
            held,
            vec![(Key { process: 1, seq: 0 }, b"again".to_vec()), (Key { process: 2, seq: 0 }, Vec::new())]
        );
    }

    #[test]
    fn a_damaged_message_is_refused_not_misread() {
        let encoded = encode(&Batch { puts: vec![(Key { process: 1, seq: 0 }, b"spawn".to_vec())], removals: vec![] });
        let mut records = std::collections::BTreeMap::new();
        for cut in 0..encoded.len() {
            assert!(apply(&mut records, &encoded[..cut]).is_err(), "a message cut at {cut} was read");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(apply(&mut records, &longer).is_err());
        let mut newer = encoded;
        newer[0] = VERSION + 1;
        assert!(apply(&mut records, &newer).unwrap_err().to_string().contains("format version"));
    }
}
