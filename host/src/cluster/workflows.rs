//! Durable workflows on a cluster's shards: their records and their code, in JetStream
//! ([`Workflows`]).
//!
//! - **Records.** A workflow is the key `wf.SHARD.ID` of a key-value bucket
//!   ([`DEFAULT_WORKFLOWS_BUCKET`]): its component, entry and input, its state, the pid
//!   of its root process once started, and its result once ended. Its shard is the
//!   FNV-1a hash of its id modulo the cluster's shards (the key `shards`, written once,
//!   by the first node to open the bucket), so any client finds a workflow by its id.
//! - **Starting.** A client creates the record (pending; a second start of the same id
//!   finds the first) and pokes the shards (`PREFIX.wf.start`); the shard's owner spawns
//!   its root process with [`Handle::spawn_admitted`](crate::scheduler::Handle), writing
//!   the pid into the record, conditional on the revision it read, before the spawn is
//!   journaled. A new owner of the shard goes over its records: a running one whose
//!   process its journal resumed is watched again; one whose end is in the journal is
//!   settled from there; one whose spawn never reached the journal starts again. So a
//!   workflow runs once whatever the owner's crashes, and a stale owner (fenced in the
//!   journal) cannot start one twice: its spawn fails to commit.
//! - **Ending.** The owner writes the end of a workflow's root into its record once the
//!   journal holds it; an end the journal did not record (the owner was fenced, or is
//!   stopping) is left for the next owner, which finds it in the journal or resumes it.
//! - **Code.** Components are objects of an object store ([`DEFAULT_CODE_BUCKET`]) named
//!   by their SHA-256, checked against it when read: any node can run any shard.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use async_nats::jetstream::{self, kv, object_store};
use futures_util::StreamExt as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncReadExt as _;

use super::blocking::Io;
use super::config::{ClusterConfig, connect};
use super::shared::Loader;
use crate::handler::{Factory, KindSource};

/// The bucket of workflow records unless told otherwise.
pub const DEFAULT_WORKFLOWS_BUCKET: &str = "WASMPROC_WORKFLOWS";
/// The object store of components unless told otherwise.
pub const DEFAULT_CODE_BUCKET: &str = "WASMPROC_CODE";
/// The largest component kept.
pub const MAX_COMPONENT: usize = 128 << 20;
/// The largest input a workflow is started with (its record is one message).
pub const MAX_INPUT: usize = 256 << 10;
/// The longest workflow id.
pub const MAX_ID: usize = 128;
/// The longest one request to the server may take: a component of [`MAX_COMPONENT`]
/// goes in one.
const PATIENCE: Duration = Duration::from_secs(60);

/// Where a cluster keeps its workflows.
#[derive(Debug, Clone)]
pub struct WorkflowOptions {
    bucket: String,
    code: String,
    replicas: usize,
    shards: Option<u32>,
}

impl Default for WorkflowOptions {
    fn default() -> Self {
        WorkflowOptions {
            bucket: DEFAULT_WORKFLOWS_BUCKET.to_owned(),
            code: DEFAULT_CODE_BUCKET.to_owned(),
            replicas: 1,
            shards: None,
        }
    }
}

impl WorkflowOptions {
    /// The default buckets, one replica each, the shards as the bucket says.
    pub fn new() -> Self {
        Self::default()
    }

    /// The records' bucket.
    pub fn bucket(mut self, name: impl Into<String>) -> Self {
        self.bucket = name.into();
        self
    }

    /// The components' object store.
    pub fn code(mut self, name: impl Into<String>) -> Self {
        self.code = name.into();
        self
    }

    /// The replicas of both when created here.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// The cluster has `shards` shards: written into the bucket if it says nothing yet,
    /// and refused if it says another number. Without it the bucket must say.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = Some(shards);
        self
    }
}

/// Where a workflow is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// Asked for; its shard's owner has not started it yet.
    Pending,
    /// Its root process runs (or is being resumed on another node).
    Running,
    /// Its root process returned normally.
    Completed,
    /// Its root process ended otherwise, or could not start.
    Failed,
}

impl WorkflowState {
    /// Whether it ended.
    pub fn ended(self) -> bool {
        matches!(self, WorkflowState::Completed | WorkflowState::Failed)
    }
}

/// A workflow's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardWorkflow {
    /// Its id, unique in the cluster.
    pub id: String,
    /// Its shard.
    pub shard: u32,
    /// Its component's hash, `sha256:HEX`.
    pub component: String,
    /// The entry its root runs.
    pub entry: String,
    /// What its entry is given.
    pub input: serde_json::Value,
    /// Where it is.
    pub state: WorkflowState,
    /// Its root process's pid once started (`Pid::as_u64`), else 0.
    pub pid: u64,
    /// What its root returned, once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Why it failed, once failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A cluster's workflow records and components: see the module's docs.
pub struct Workflows {
    io: Io,
    client: async_nats::Client,
    records: kv::Store,
    code: object_store::ObjectStore,
    shards: u32,
    poke: String,
}

impl std::fmt::Debug for Workflows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workflows").field("shards", &self.shards).finish_non_exhaustive()
    }
}

/// FNV-1a of `id`: the shard of a workflow is this modulo the shards.
fn fnv1a(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// Checks a workflow id: it is part of a key and a subject.
pub fn check_id(id: &str) -> anyhow::Result<()> {
    ensure!(
        !id.is_empty() && id.len() <= MAX_ID && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "invalid workflow id `{id}`: 1 to {MAX_ID} letters, digits, `-` and `_`"
    );
    Ok(())
}

/// `sha256:HEX` of `bytes`.
pub fn hash_of(bytes: &[u8]) -> String {
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    let hex = crate::codec::hex(&digest);
    format!("sha256:{hex}")
}

fn key(shard: u32, id: &str) -> String {
    format!("wf.{shard}.{id}")
}

fn object_name(hash: &str) -> anyhow::Result<String> {
    let hex = hash.strip_prefix("sha256:").filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    let hex = hex.ok_or_else(|| anyhow::anyhow!("invalid component hash `{hash}`: `sha256:` and 64 hex digits"))?;
    Ok(format!("sha256-{hex}"))
}

fn decode(bytes: &[u8]) -> anyhow::Result<ShardWorkflow> {
    serde_json::from_slice(bytes).context("a workflow record that is not one")
}

impl Workflows {
    /// Connects to the server of `config` and opens both buckets, creating them if they
    /// are missing.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses, or the shards given are not those the
    /// bucket holds (or none is given and the bucket holds none).
    pub fn open(config: &ClusterConfig, options: &WorkflowOptions) -> anyhow::Result<Workflows> {
        if let Some(shards) = options.shards {
            ensure!((1..=super::MAX_SHARDS).contains(&shards), "a cluster has 1 to {} shards, not {shards}", {
                super::MAX_SHARDS
            });
        }
        super::config::check_stored("workflows' bucket", &options.bucket, options.replicas)?;
        super::config::check_stored("components' object store", &options.code, options.replicas)?;
        let io = Io::new("wasmproc-workflows", PATIENCE)?;
        let config = config.clone();
        let poke = format!("{}.wf.start", config.prefix);
        let options = options.clone();
        let (client, records, code, shards) = io.run(async move {
            let client = connect(&config, None).await?;
            let context = jetstream::new(client.clone());
            let records = match context.get_key_value(&options.bucket).await {
                Ok(store) => store,
                // A client makes nothing: the nodes do, with the cluster's shards.
                Err(error) if options.shards.is_none() => bail!(
                    "the cluster has no workflows' bucket `{}` that this user may read ({error}): start a node \
                     with `--shards N` first",
                    options.bucket
                ),
                Err(_) => context
                    .create_key_value(kv::Config {
                        bucket: options.bucket.clone(),
                        history: 1,
                        num_replicas: options.replicas,
                        max_value_size: (MAX_INPUT + (64 << 10)) as i32,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot create the workflows' bucket `{}`: {e}", options.bucket))?,
            };
            let code = match context.get_object_store(&options.code).await {
                Ok(store) => store,
                Err(error) if options.shards.is_none() => bail!(
                    "the cluster has no components' object store `{}` that this user may read ({error}): start \
                     a node with `--shards N` first",
                    options.code
                ),
                Err(_) => context
                    .create_object_store(object_store::Config {
                        bucket: options.code.clone(),
                        num_replicas: options.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!("cannot create the components' object store `{}`: {e}", options.code)
                    })?,
            };
            let held = records.get("shards").await.map_err(|e| anyhow::anyhow!("cannot read the shards: {e}"))?;
            let held = match held {
                Some(bytes) => Some(
                    std::str::from_utf8(&bytes)
                        .ok()
                        .and_then(|n| n.parse::<u32>().ok())
                        .ok_or_else(|| anyhow::anyhow!("the workflows' bucket holds no number of shards"))?,
                ),
                None => None,
            };
            let shards = match (held, options.shards) {
                (Some(held), Some(asked)) if held != asked => {
                    bail!("the cluster has {held} shards, not {asked}: the number is fixed when the cluster is made")
                }
                (Some(held), _) => held,
                (None, Some(asked)) => match records.create("shards", asked.to_string().into()).await {
                    Ok(_) => asked,
                    Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
                        let held = records.get("shards").await.ok().flatten().unwrap_or_default();
                        let held = String::from_utf8_lossy(&held).parse::<u32>().unwrap_or(0);
                        ensure!(held == asked, "the cluster has {held} shards, not {asked}");
                        asked
                    }
                    Err(error) => bail!("cannot write the number of shards: {error}"),
                },
                (None, None) => bail!(
                    "the cluster has no shards yet: start a node with `--shards N` first (bucket `{}`)",
                    options.bucket
                ),
            };
            Ok::<_, anyhow::Error>((client, records, code, shards))
        })??;
        Ok(Workflows { io, client, records, code, shards, poke })
    }

    /// How many shards the cluster has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard of workflow `id`.
    pub fn shard_of(&self, id: &str) -> u32 {
        (fnv1a(id) % u64::from(self.shards)) as u32
    }

    /// Keeps `bytes` as a component (once, whoever deploys it again); its hash.
    ///
    /// # Errors
    ///
    /// Larger than [`MAX_COMPONENT`], or the server refused.
    pub fn deploy(&self, bytes: &[u8]) -> anyhow::Result<String> {
        ensure!(bytes.len() <= MAX_COMPONENT, "a component is at most {MAX_COMPONENT} bytes, not {}", bytes.len());
        let hash = hash_of(bytes);
        let name = object_name(&hash)?;
        let code = self.code.clone();
        let bytes = bytes.to_vec();
        self.io.run(async move {
            if code.info(&name).await.is_ok_and(|info| !info.deleted && info.size == bytes.len()) {
                return Ok(());
            }
            code.put(name.as_str(), &mut bytes.as_slice())
                .await
                .map(|_| ())
                .map_err(|e| anyhow::anyhow!("cannot keep component `{name}`: {e}"))
        })??;
        Ok(hash)
    }

    /// The bytes of component `hash`, checked against it.
    ///
    /// # Errors
    ///
    /// No such component, or its bytes are not what its hash names.
    pub fn component(&self, hash: &str) -> anyhow::Result<Vec<u8>> {
        let name = object_name(hash)?;
        let code = self.code.clone();
        let bytes = self.io.run(async move {
            let mut object =
                code.get(name.as_str()).await.map_err(|e| anyhow::anyhow!("cannot read component `{name}`: {e}"))?;
            let mut bytes = Vec::new();
            (&mut object)
                .take(MAX_COMPONENT as u64 + 1)
                .read_to_end(&mut bytes)
                .await
                .map_err(|e| anyhow::anyhow!("cannot read component `{name}`: {e}"))?;
            Ok::<_, anyhow::Error>(bytes)
        })??;
        ensure!(bytes.len() <= MAX_COMPONENT, "component `{hash}` is larger than {MAX_COMPONENT} bytes");
        let held = hash_of(&bytes);
        ensure!(held == hash, "the component kept as `{hash}` has hash `{held}`");
        Ok(bytes)
    }

    /// Asks for workflow `id` to run `entry` of component `component` (kept with
    /// [`Workflows::deploy`]) on `input`: its record, and whether this call made it (a
    /// workflow of that id already asked for is returned as it is, if it asked for the
    /// same; otherwise refused).
    ///
    /// # Errors
    ///
    /// An invalid id, an input too large, another workflow of that id, or the server
    /// refused.
    pub fn start(
        &self,
        id: &str,
        component: &str,
        entry: &str,
        input: serde_json::Value,
    ) -> anyhow::Result<(ShardWorkflow, bool)> {
        check_id(id)?;
        object_name(component)?;
        let shard = self.shard_of(id);
        let record = ShardWorkflow {
            id: id.to_owned(),
            shard,
            component: component.to_owned(),
            entry: entry.to_owned(),
            input,
            state: WorkflowState::Pending,
            pid: 0,
            result: None,
            error: None,
        };
        let bytes = serde_json::to_vec(&record)?;
        ensure!(bytes.len() <= MAX_INPUT, "a workflow's input is at most {MAX_INPUT} bytes of JSON");
        let (records, client, poke) = (self.records.clone(), self.client.clone(), self.poke.clone());
        let key = key(shard, id);
        let named = record.id.clone();
        let made = self.io.run(async move {
            match records.create(&key, bytes.into()).await {
                Ok(_) => {
                    // A poke lost is found by the owner's next look at its records.
                    let _ = client.publish(poke, shard.to_string().into()).await;
                    let _ = client.flush().await;
                    Ok(true)
                }
                Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(error) => Err(anyhow::anyhow!("cannot write workflow `{named}`'s record: {error}")),
            }
        })??;
        if made {
            return Ok((record, true));
        }
        let (held, _) = self.get(id)?.ok_or_else(|| anyhow::anyhow!("workflow `{id}` was forgotten as it started"))?;
        ensure!(
            held.component == record.component && held.entry == record.entry && held.input == record.input,
            "workflow `{id}` exists already, started with another component, entry or input"
        );
        Ok((held, false))
    }

    /// Workflow `id`'s record and its revision, if there is one.
    ///
    /// # Errors
    ///
    /// An invalid id, or the server did not answer.
    pub fn get(&self, id: &str) -> anyhow::Result<Option<(ShardWorkflow, u64)>> {
        check_id(id)?;
        let records = self.records.clone();
        let key = key(self.shard_of(id), id);
        let entry = self.io.run(async move { records.entry(key).await })??;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => Ok(Some((decode(&entry.value)?, entry.revision))),
            _ => Ok(None),
        }
    }

    /// Every record of shard `shard`, with its revision.
    ///
    /// # Errors
    ///
    /// The server did not answer.
    pub fn of_shard(&self, shard: u32) -> anyhow::Result<Vec<(ShardWorkflow, u64)>> {
        let (records, client) = (self.records.clone(), self.client.clone());
        let entries = self.io.run(async move {
            let failed = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot list shard {shard}'s workflows: {e}");
            // The last value of each of the shard's keys, as `keys()` lists a bucket; the
            // consumer says at its creation how many it will deliver.
            let consumer = records
                .stream
                .create_consumer(jetstream::consumer::push::OrderedConfig {
                    deliver_subject: client.new_inbox(),
                    filter_subject: format!("{}wf.{shard}.>", records.prefix),
                    replay_policy: jetstream::consumer::ReplayPolicy::Instant,
                    deliver_policy: jetstream::consumer::DeliverPolicy::LastPerSubject,
                    ..Default::default()
                })
                .await
                .map_err(|e| failed(&e))?;
            let mut left = consumer.cached_info().num_pending;
            let mut messages = consumer.messages().await.map_err(|e| failed(&e))?;
            let mut entries = Vec::new();
            while left > 0 {
                let message = match messages.next().await {
                    Some(Ok(message)) => message,
                    Some(Err(error)) => return Err(failed(&error)),
                    None => break,
                };
                let info = message.info().map_err(|e| failed(&e))?;
                left = info.pending;
                let deleted = message.headers.as_ref().and_then(|h| h.get("KV-Operation")).is_some();
                if !deleted {
                    entries.push((message.payload.clone(), info.stream_sequence));
                }
            }
            Ok::<_, anyhow::Error>(entries)
        })??;
        entries.into_iter().map(|(bytes, revision)| Ok((decode(&bytes)?, revision))).collect()
    }

    /// Writes `record` if its revision is still `revision`: its new revision, or `None`
    /// if another wrote it meanwhile.
    ///
    /// # Errors
    ///
    /// The server did not answer or refused otherwise.
    pub fn update(&self, record: &ShardWorkflow, revision: u64) -> anyhow::Result<Option<u64>> {
        let bytes = serde_json::to_vec(record)?;
        let records = self.records.clone();
        let key = key(record.shard, &record.id);
        self.io.run(async move {
            match records.update(&key, bytes.into(), revision).await {
                Ok(revision) => Ok(Some(revision)),
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(error) => Err(anyhow::anyhow!("cannot write workflow record `{key}`: {error}")),
            }
        })?
    }

    /// Waits up to `timeout` for workflow `id` to end; its record then (ended or not).
    ///
    /// # Errors
    ///
    /// No such workflow, or the server did not answer.
    pub fn wait(&self, id: &str, timeout: Duration) -> anyhow::Result<ShardWorkflow> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            // A read that fails while the bucket elects a leader (a server lost) is tried
            // again until the deadline.
            let record = match self.get(id) {
                Ok(Some((record, _))) => record,
                Ok(None) => bail!("no workflow `{id}`"),
                Err(error) if std::time::Instant::now() < deadline => {
                    tracing::info!("cannot read workflow `{id}` yet: {error:#}");
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                Err(error) => return Err(error),
            };
            if record.state.ended() || std::time::Instant::now() >= deadline {
                return Ok(record);
            }
            std::thread::sleep(
                Duration::from_millis(50).min(deadline.saturating_duration_since(std::time::Instant::now())),
            );
        }
    }

    /// Calls `to` with the shard each poke of a new workflow names, until it returns
    /// `false`: for a shard host.
    pub(super) fn pokes(&self, to: impl Fn(u32) -> bool + Send + 'static) -> anyhow::Result<()> {
        let (client, subject) = (self.client.clone(), self.poke.clone());
        let subscription = self.io.run(async move {
            client.subscribe(subject).await.context("cannot subscribe to the workflows' pokes")
        })??;
        self.io.spawn(async move {
            let mut subscription = subscription;
            while let Some(message) = subscription.next().await {
                if let Some(shard) = std::str::from_utf8(&message.payload).ok().and_then(|s| s.parse().ok())
                    && !to(shard)
                {
                    break;
                }
            }
        })?;
        Ok(())
    }
}

/// The kinds of a shard's processes: the components kept in [`Workflows`], by hash
/// (`sha256:HEX`), fetched once and loaded with a [`Loader`].
///
/// Any process of a shard may spawn any component kept in the cluster by its hash: the
/// cluster is one trust domain, and its components are what its clients deployed.
pub struct WorkflowKinds {
    workflows: Arc<Workflows>,
    loader: Loader,
    loaded: Mutex<HashMap<String, Arc<dyn Factory>>>,
}

impl WorkflowKinds {
    /// The kinds `workflows` keeps, loaded with `loader`.
    pub fn new(workflows: Arc<Workflows>, loader: Loader) -> Self {
        WorkflowKinds { workflows, loader, loaded: Mutex::new(HashMap::new()) }
    }
}

impl KindSource for WorkflowKinds {
    fn resolve(&self, name: &str, _spawner: Option<&str>) -> Option<(Arc<str>, Arc<dyn Factory>)> {
        object_name(name).ok()?;
        if let Some(factory) = self.loaded.lock().get(name) {
            return Some((name.into(), factory.clone()));
        }
        let loaded = self.workflows.component(name).and_then(|bytes| (self.loader)(&bytes));
        match loaded {
            Ok(factory) => {
                self.loaded.lock().insert(name.to_owned(), factory.clone());
                Some((name.into(), factory))
            }
            Err(error) => {
                tracing::error!("cannot load component `{name}` for a shard: {error:#}");
                None
            }
        }
    }
}
