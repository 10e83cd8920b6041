//! `kv.*` on a JetStream key-value bucket: [`SharedKv`], the store a cluster's nodes
//! share, so a durable workflow finds its keys on whichever node runs its shard.
//!
//! The commands, their inputs, answers and failures are those of the store of a
//! directory ([`crate::provider::kv`]). What differs:
//!
//! - **Versions** are the bucket's revisions: the sequence of the stream under it, which
//!   only grows, across every key. A key deleted and written again never gets a version
//!   it had, so a compare-and-swap never mistakes a new value for the one it read.
//! - **Compare-and-swap** is the server's: a write says which revision it expects the
//!   key's last message to have (`Nats-Expected-Last-Subject-Sequence`), and the bucket's
//!   leader refuses it otherwise, whichever node sent it. `kv.cas` with version 0 writes
//!   only over no message, or over the key's delete marker, checked the same way.
//! - **Keys** are any non-empty string, as for the local store: a bucket's keys allow
//!   only letters, digits and `-/_=.`, so each is kept under its UTF-8 bytes in base64url.
//!   `kv.list` reads every key of the bucket (as many as its bytes allow) and answers
//!   the page asked for, in the order of the keys' bytes.
//! - **Durability** is the stream's: a write is answered once a quorum of its replicas
//!   stored it, so it outlives the loss of a server (with three replicas) and of any node.
//! - **Quotas**: [`SharedKvOptions::max_bytes`] is the bucket's own limit, which the
//!   server enforces for every node together; a write past it fails `limit`. There is no
//!   count of keys apart from that.
//! - **Idempotency**: a durable process's write carries its idempotency key as its
//!   message id (`Nats-Msg-Id`), so a command carried out again after a crash, on this
//!   node or another, answers as it did the first time and writes nothing more. A
//!   `kv.put` is recognised by the server within the bucket's duplicate window
//!   ([`DUPLICATE_WINDOW`]); a `kv.cas` or `kv.delete` refused as a conflict with its own
//!   earlier write is recognised by the key's last message carrying its id, however
//!   late it comes.
//!
//! Every command is carried out on the store's own runtime: the worker that ran the
//! step goes on at once, and the command completes when the server answered, within 10 s
//! or failing `unavailable`. At most 4,096 commands wait on the server at once; past
//! that a command fails `limit` at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as KEYS;
use futures_util::StreamExt;
use wasmproc_types::{Format, Payload};

use super::blocking::Io;
use super::config::{ClusterConfig, connect};
use crate::handler::{Completer, Request};
use crate::provider::kv::{Command, KvSettings, ListQuery, Op, got, parse, shown};
use crate::provider::{ErrorCode, Failure, Provider};

/// The bucket [`SharedKvOptions`] name unless told otherwise.
pub const DEFAULT_KV_BUCKET: &str = "WASMPROC_KV";
/// How long the bucket's server remembers a write's message id (a stream's default,
/// which a bucket keeps): a write sent again within it is written once.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// The longest one command may wait for the server.
const PATIENCE: Duration = Duration::from_secs(10);
/// The most commands waiting on the server at once.
const MAX_IN_FLIGHT: usize = 4096;
/// How often a `kv.delete` reads the key again when another write came between its read
/// and its delete marker.
const DELETE_TRIES: usize = 8;

/// Where and how large a [`SharedKv`] is.
#[derive(Debug, Clone)]
pub struct SharedKvOptions {
    bucket: String,
    replicas: usize,
    settings: KvSettings,
}

impl Default for SharedKvOptions {
    fn default() -> Self {
        SharedKvOptions { bucket: DEFAULT_KV_BUCKET.to_owned(), replicas: 1, settings: KvSettings::default() }
    }
}

impl SharedKvOptions {
    /// [`DEFAULT_KV_BUCKET`], one replica, and the local store's limits of keys, values,
    /// lists and bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bucket's name (letters, digits, `-` and `_`).
    pub fn bucket(mut self, name: impl Into<String>) -> Self {
        self.bucket = name.into();
        self
    }

    /// The bucket's replicas when it is created here.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// The most bytes the bucket holds (the stream's, headers and old markers
    /// included), for every node together; set when the bucket is created here.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.settings.max_bytes = bytes;
        self
    }

    /// The longest key, the longest value (its JSON text) and the most keys one
    /// `kv.list` answers, as [`KvSettings`] says.
    pub fn limits(mut self, max_key_size: usize, max_value_size: usize, list_limit: usize) -> Self {
        self.settings.max_key_size = max_key_size;
        self.settings.max_value_size = max_value_size;
        self.settings.list_limit = list_limit;
        self
    }
}

/// The `kv` provider on a JetStream bucket: see the module's docs. Cheap to clone; the
/// clones share one connection and runtime.
#[derive(Clone)]
pub struct SharedKv {
    inner: Arc<Inner>,
}

struct Inner {
    io: Io,
    context: jetstream::Context,
    store: kv::Store,
    bucket: String,
    settings: KvSettings,
    in_flight: AtomicUsize,
}

impl std::fmt::Debug for SharedKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKv").field("bucket", &self.inner.bucket).finish_non_exhaustive()
    }
}

impl SharedKv {
    /// Connects to the server of `config` and opens the bucket, creating it if it is
    /// missing.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses (no JetStream), or the bucket's name is
    /// invalid.
    pub fn open(config: &ClusterConfig, options: &SharedKvOptions) -> anyhow::Result<SharedKv> {
        super::config::check_stored("shared key-value bucket", &options.bucket, options.replicas)?;
        let io = Io::new("wasmproc-shared-kv", PATIENCE)?;
        let bucket_config = kv::Config {
            bucket: options.bucket.clone(),
            history: 1,
            num_replicas: options.replicas,
            max_bytes: i64::try_from(options.settings.max_bytes).unwrap_or(i64::MAX),
            max_value_size: i32::try_from(options.settings.max_value_size).unwrap_or(i32::MAX),
            ..Default::default()
        };
        let (config, bucket) = (config.clone(), options.bucket.clone());
        let (context, store) = io.run(async move {
            let client = connect(&config, None).await?;
            let context = jetstream::new(client);
            let store = match context.get_key_value(&bucket).await {
                Ok(store) => store,
                Err(_) => context
                    .create_key_value(bucket_config)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot create the shared key-value bucket `{bucket}`: {e}"))?,
            };
            Ok::<_, anyhow::Error>((context, store))
        })??;
        Ok(SharedKv {
            inner: Arc::new(Inner {
                io,
                context,
                store,
                bucket: options.bucket.clone(),
                settings: options.settings.clone(),
                in_flight: AtomicUsize::new(0),
            }),
        })
    }

    /// The bucket it serves.
    pub fn bucket(&self) -> &str {
        &self.inner.bucket
    }
}

impl Provider for SharedKv {
    fn family(&self) -> &str {
        "kv"
    }

    fn handle(&self, request: Request<'_>) {
        let command = match parse(&self.inner.settings, request.name(), request.payload()) {
            Ok(command) => command,
            Err(failure) => return request.complete(Err(failure.into())),
        };
        if self.inner.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
            let failure = Failure::new(
                ErrorCode::Limit,
                format!(
                    "the shared key-value store has {MAX_IN_FLIGHT} commands waiting on the server, the most it may: \
                     send this one again once earlier ones are answered"
                ),
            );
            return request.complete(Err(failure.into()));
        }
        let id = request.idempotency_key();
        let (_, done) = request.into_parts();
        let inner = self.inner.clone();
        let spawned = self.inner.io.spawn(async move {
            let outcome = tokio::time::timeout(PATIENCE, carry_out(&inner, command, id)).await.unwrap_or_else(|_| {
                Err(Failure::new(
                    ErrorCode::Unavailable,
                    format!("the shared key-value store's server did not answer within {PATIENCE:?}"),
                ))
            });
            inner.in_flight.fetch_sub(1, Ordering::AcqRel);
            answer(done, outcome);
        });
        if spawned.is_err() {
            // The runtime is gone: the command's completer, dropped with its task, has
            // answered it with an error.
            self.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn reads_only(&self, name: &str) -> bool {
        matches!(name, "kv.get" | "kv.list")
    }
}

fn answer(done: Completer, outcome: Result<Payload, Failure>) {
    done.complete(outcome.map_err(String::from));
}

fn json(value: &serde_json::Value) -> Payload {
    Payload { format: Format::Json, data: value.to_string().into_bytes() }
}

fn unavailable(what: impl std::fmt::Display) -> Failure {
    Failure::new(ErrorCode::Unavailable, format!("the shared key-value store: {what}"))
}

/// The key `key` is kept under in the bucket.
fn stored(key: &str) -> String {
    KEYS.encode(key.as_bytes())
}

/// The key kept under `name`, if it is one of this store's.
fn key_of(name: &str) -> Option<String> {
    String::from_utf8(KEYS.decode(name).ok()?).ok()
}

/// A key's last message.
struct Last {
    revision: u64,
    /// A value, not a delete marker.
    live: bool,
    value: bytes::Bytes,
    /// The message id it was written with.
    id: Option<String>,
}

impl Last {
    /// Whether it was written by the command of idempotency key `id`: that very command,
    /// carried out before a crash.
    fn written_by(&self, id: Option<&str>) -> bool {
        self.id.is_some() && self.id.as_deref() == id
    }
}

/// The subject `key` is written to.
fn subject(inner: &Inner, key: &str) -> String {
    format!("$KV.{}.{}", inner.bucket, stored(key))
}

/// `key`'s last message, if it has one.
async fn last(inner: &Inner, key: &str) -> Result<Option<Last>, Failure> {
    let message = match inner.store.stream.direct_get_last_for_subject(subject(inner, key)).await {
        Ok(message) => message,
        Err(error) if error.kind() == async_nats::jetstream::stream::DirectGetErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(unavailable(error)),
    };
    let header = |name: &str| message.headers.get(name).map(|value| value.as_str().to_owned());
    let live =
        header("KV-Operation").is_none_or(|operation| operation == "PUT") && header("Nats-Marker-Reason").is_none();
    Ok(Some(Last { revision: message.sequence, live, id: header("Nats-Msg-Id"), value: message.payload }))
}

/// What writing a message found.
enum Written {
    Revision(u64),
    /// The key's last message was not at the revision expected.
    Moved,
}

/// Writes `payload` at `key`, as a delete marker if `delete`, if its last message is at
/// `expected` (with any, if `None`), with message id `id`.
async fn write(
    inner: &Inner,
    key: &str,
    payload: Vec<u8>,
    delete: bool,
    expected: Option<u64>,
    id: Option<&str>,
) -> Result<Written, Failure> {
    let mut headers = HeaderMap::new();
    if let Some(expected) = expected {
        headers.insert("Nats-Expected-Last-Subject-Sequence", expected.to_string().as_str());
    }
    if let Some(id) = id {
        headers.insert("Nats-Msg-Id", id);
    }
    if delete {
        headers.insert("KV-Operation", "DEL");
    }
    let sent = inner.context.publish_with_headers(subject(inner, key), headers, payload.into()).await;
    let acked = match sent {
        Ok(ack) => ack.await,
        Err(error) => Err(error),
    };
    use jetstream::context::PublishErrorKind as Kind;
    match acked {
        Ok(ack) => Ok(Written::Revision(ack.sequence)),
        Err(error) if error.kind() == Kind::WrongLastSequence => Ok(Written::Moved),
        Err(error) => {
            let text = error.to_string();
            if text.contains("maximum bytes") || text.contains("resource limits") {
                Err(Failure::new(
                    ErrorCode::Limit,
                    format!("the shared key-value store is full (its bucket's `max_bytes`): {text}"),
                ))
            } else {
                Err(unavailable(text))
            }
        }
    }
}

async fn carry_out(inner: &Inner, command: Command, id: Option<String>) -> Result<Payload, Failure> {
    let id = id.as_deref();
    match command {
        Command::Get { key } => {
            let found = last(inner, &key).await?.filter(|found| found.live);
            Ok(got(found.as_ref().map(|found| (&found.value[..], found.revision))))
        }
        Command::List(query) => list(inner, query).await,
        Command::Write(Op::Put { key, text }) => match write(inner, &key, text.into_bytes(), false, None, id).await? {
            Written::Revision(version) => Ok(json(&serde_json::json!({ "version": version }))),
            Written::Moved => Err(unavailable("a write that expected nothing was refused as moved")),
        },
        Command::Write(Op::Cas { key, expected, text }) => {
            let version = |version: u64| Ok(json(&serde_json::json!({ "version": version })));
            if let Written::Revision(revision) =
                write(inner, &key, text.clone().into_bytes(), false, Some(expected), id).await?
            {
                return version(revision);
            }
            let found = last(inner, &key).await?;
            if let Some(found) = &found {
                // This very command, carried out before a crash: its answer again.
                if found.written_by(id) {
                    return version(found.revision);
                }
                // Absent with a delete marker: version 0 means over that marker.
                if expected == 0
                    && !found.live
                    && let Written::Revision(revision) =
                        write(inner, &key, text.into_bytes(), false, Some(found.revision), id).await?
                {
                    return version(revision);
                }
            }
            let current = found.filter(|found| found.live).map_or(0, |found| found.revision);
            Err(Failure::new(ErrorCode::Conflict, format!("`{}` is at version {current}, not {expected}", shown(&key))))
        }
        Command::Write(Op::Delete { key }) => {
            let deleted = |deleted: bool| Ok(json(&serde_json::json!({ "deleted": deleted })));
            for _ in 0..DELETE_TRIES {
                let found = match last(inner, &key).await? {
                    Some(found) if found.live => found,
                    // Gone; deleted by this very command if it was carried out before a crash.
                    gone => return deleted(gone.is_some_and(|gone| gone.written_by(id))),
                };
                if let Written::Revision(_) = write(inner, &key, Vec::new(), true, Some(found.revision), id).await? {
                    return deleted(true);
                }
            }
            Err(unavailable(format!(
                "`{}` was written again each of {DELETE_TRIES} times it was to be deleted",
                shown(&key)
            )))
        }
    }
}

async fn list(inner: &Inner, query: ListQuery) -> Result<Payload, Failure> {
    let mut names = inner.store.keys().await.map_err(unavailable)?;
    let mut keys = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.map_err(unavailable)?;
        if let Some(key) = key_of(&name)
            && key.starts_with(&query.prefix)
            && query.after.as_ref().is_none_or(|after| key.as_bytes() > after.as_bytes())
        {
            keys.push(key);
        }
    }
    keys.sort_unstable();
    let more = keys.len() > query.limit;
    keys.truncate(query.limit);
    Ok(json(&serde_json::json!({ "keys": keys, "more": more })))
}
