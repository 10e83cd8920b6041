//! Shard leases: which node owns each shard of durable processes, kept in a JetStream
//! key-value bucket ([`Leases`]).
//!
//! A lease is the key `shard.N`, whose value names its owner, written with a time to live
//! (NATS's per-message TTL): the owner renews it well within that time, each renewal
//! conditional on the revision it last wrote, and if it stops renewing (it died, was
//! paused, or lost the server) the server removes the key when its time passes, and
//! another node may take it. So whether a lease has passed is judged by the server's
//! clock alone, never by comparing two machines' clocks.
//!
//! A lease says who *should* write a shard's journal; the journal's own fence
//! ([`JetStreamStore`](super::JetStreamStore)) is what makes sure no one else can. A node
//! that takes a shard opens its journal, which fences the previous owner there; the
//! previous owner learns it lost the lease at its next renewal ([`Renewal::Lost`]) or at
//! its next commit, whichever comes first, and stops the shard's processes.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;

use super::blocking::Io;
use super::config::{ClusterConfig, connect};

/// The bucket [`LeaseOptions`] name unless told otherwise.
pub const DEFAULT_BUCKET: &str = "WASMPROC_LEASES";
/// The longest one request to the server may take.
const PATIENCE: Duration = Duration::from_secs(10);

/// Where and for how long [`Leases`] are held.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    bucket: String,
    ttl: Duration,
    replicas: usize,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions { bucket: DEFAULT_BUCKET.to_owned(), ttl: Duration::from_secs(5), replicas: 1 }
    }
}

impl LeaseOptions {
    /// Leases of 5 s in [`DEFAULT_BUCKET`], one replica.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bucket's name (letters, digits, `-` and `_`).
    pub fn bucket(mut self, name: impl Into<String>) -> Self {
        self.bucket = name.into();
        self
    }

    /// How long a lease lasts unless renewed: whole seconds, at least one (NATS's TTLs
    /// are in seconds). A node lost holds its shards this long before others take them.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The bucket's replicas when it is created here.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }
}

/// A lease held: its shard and the revision its holder last wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    shard: u32,
    revision: u64,
}

impl Lease {
    /// The shard it is for.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The revision of the key its holder last wrote.
    pub fn revision(&self) -> u64 {
        self.revision
    }
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Renewal {
    /// Still held, for another time to live.
    Held,
    /// Passed to another, or expired: the holder must stop the shard's processes now.
    Lost,
}

/// What the lease bucket says at one moment ([`Leases::shares`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    /// Every shard held, and the node holding it.
    pub owners: BTreeMap<u32, String>,
    /// How many nodes take part (each announced within a lease's time).
    pub nodes: usize,
}

/// One node's view of the leases: takes, renews, gives up and lists them.
pub struct Leases {
    io: Io,
    context: jetstream::Context,
    store: kv::Store,
    bucket: String,
    node: String,
    ttl: Duration,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("bucket", &self.bucket)
            .field("node", &self.node)
            .field("ttl", &self.ttl)
            .finish()
    }
}

fn key(shard: u32) -> String {
    format!("shard.{shard}")
}

/// Writes `node` as the holder at `subject` for `ttl`, if the subject's last revision is
/// still `expected` (0: no message at all): the revision written.
async fn write(
    context: &jetstream::Context,
    subject: &str,
    node: &str,
    ttl: Duration,
    expected: u64,
) -> Result<u64, jetstream::context::PublishError> {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Expected-Last-Subject-Sequence", expected.to_string().as_str());
    headers.insert("Nats-TTL", ttl.as_secs().to_string().as_str());
    let ack =
        context.publish_with_headers(subject.to_owned(), headers, node.to_owned().into_bytes().into()).await?.await?;
    Ok(ack.sequence)
}

impl Leases {
    /// Connects to the server of `config` as node `node` and opens the bucket, creating
    /// it if it is missing.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refuses (no JetStream, or a server older than 2.11,
    /// which has no per-message TTL), or the options are invalid.
    pub fn open(config: &ClusterConfig, node: &str, options: &LeaseOptions) -> anyhow::Result<Leases> {
        Ok(Self::connect(config, node, options, true)?.expect("a bucket created if missing"))
    }

    /// As [`Leases::open`], without creating the bucket: `None` if the cluster has none
    /// (no node ran shards on it yet), for what only reads the leases.
    ///
    /// # Errors
    ///
    /// As [`Leases::open`].
    pub fn existing(config: &ClusterConfig, node: &str, options: &LeaseOptions) -> anyhow::Result<Option<Leases>> {
        Self::connect(config, node, options, false)
    }

    fn connect(
        config: &ClusterConfig,
        node: &str,
        options: &LeaseOptions,
        create: bool,
    ) -> anyhow::Result<Option<Leases>> {
        anyhow::ensure!(
            options.ttl >= Duration::from_secs(1) && options.ttl.subsec_nanos() == 0,
            "a lease lasts whole seconds, at least one, not {:?}",
            options.ttl
        );
        anyhow::ensure!(
            !node.is_empty() && node.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "invalid node name `{node}` for a lease: letters, digits, `-` and `_`"
        );
        super::config::check_stored("lease bucket", &options.bucket, options.replicas)?;
        let io = Io::new("wasmproc-leases", PATIENCE)?;
        let bucket_config = kv::Config {
            bucket: options.bucket.clone(),
            history: 1,
            num_replicas: options.replicas,
            // Keys that expire leave a marker this long, so watchers see the expiry.
            limit_markers: Some(options.ttl),
            ..Default::default()
        };
        let config = config.clone();
        let bucket = options.bucket.clone();
        let opened = io.run(async move {
            let client = connect(&config, None).await?;
            let context = jetstream::new(client);
            let store = match context.get_key_value(&bucket).await {
                Ok(store) => store,
                Err(error) if !create => {
                    use jetstream::context::GetStreamErrorKind as Kind;
                    // The bucket's stream, asked for again to tell "none" from a failure.
                    return match context.get_stream(format!("KV_{bucket}")).await.map(|_| ()) {
                        Err(missing)
                            if matches!(missing.kind(), Kind::JetStream(e)
                                if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
                        {
                            Ok(None)
                        }
                        _ => Err(anyhow::anyhow!("cannot read the lease bucket `{bucket}`: {error}")),
                    };
                }
                Err(_) => context.create_key_value(bucket_config).await.map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create the lease bucket `{bucket}` (JetStream on, and a server of 2.11 or later \
                         for keys that expire?): {e}"
                    )
                })?,
            };
            Ok::<_, anyhow::Error>(Some((context, store)))
        })??;
        let Some((context, store)) = opened else { return Ok(None) };
        Ok(Some(Leases { io, context, store, bucket: options.bucket.clone(), node: node.to_owned(), ttl: options.ttl }))
    }

    /// How long a lease lasts unless renewed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Takes the lease of `shard` if no one holds it; `None` if someone does.
    ///
    /// Every write of a lease carries its time to live, the first one too: a holder that
    /// dies before its first renewal must still lose the lease. (`kv::Store::create_with_ttl`
    /// would not do here: over a key given up or expired before, it writes without one.)
    ///
    /// # Errors
    ///
    /// The server did not answer, or refused otherwise.
    pub fn acquire(&self, shard: u32) -> anyhow::Result<Option<Lease>> {
        let (store, context) = (self.store.clone(), self.context.clone());
        let subject = self.subject(shard);
        let (node, ttl) = (self.node.clone(), self.ttl);
        use jetstream::context::PublishErrorKind as Kind;
        let taken = move |written: Result<u64, jetstream::context::PublishError>| match written {
            Ok(revision) => Ok(Some(Lease { shard, revision })),
            Err(error) if error.kind() == Kind::WrongLastSequence => Ok(None),
            Err(error) => Err(anyhow::anyhow!("cannot take the lease of shard {shard}: {error}")),
        };
        self.io.run(async move {
            // A key never written, or whose end marker has passed too.
            if let Some(lease) = taken(write(&context, &subject, &node, ttl, 0).await)? {
                return Ok(Some(lease));
            }
            let entry = store.entry(key(shard)).await.map_err(|e| anyhow::anyhow!("cannot read a lease: {e}"))?;
            match entry {
                // Given up, or passed: taken over its marker, unless another node was quicker.
                Some(kv::Entry { operation: kv::Operation::Delete | kv::Operation::Purge, revision, .. }) => {
                    taken(write(&context, &subject, &node, ttl, revision).await)
                }
                Some(_) => Ok(None),
                // Its marker passed between the two reads: free, and taken at the next round.
                None => Ok(None),
            }
        })?
    }

    /// Renews `lease` for another time to live, if it is still this node's.
    ///
    /// # Errors
    ///
    /// The server did not answer: the lease may or may not be held (the caller keeps
    /// renewing, and stops the shard if its time to live passes without a renewal).
    pub fn renew(&self, lease: &mut Lease) -> anyhow::Result<Renewal> {
        let context = self.context.clone();
        let subject = self.subject(lease.shard);
        let (node, ttl, revision) = (self.node.clone(), self.ttl, lease.revision);
        let renewed = self.io.run(async move { write(&context, &subject, &node, ttl, revision).await })?;
        use jetstream::context::PublishErrorKind as Kind;
        match renewed {
            Ok(revision) => {
                lease.revision = revision;
                Ok(Renewal::Held)
            }
            Err(error) if error.kind() == Kind::WrongLastSequence => Ok(Renewal::Lost),
            Err(error) => Err(anyhow::anyhow!("cannot renew the lease of shard {}: {error}", lease.shard)),
        }
    }

    /// The subject the lease of `shard` is written to.
    fn subject(&self, shard: u32) -> String {
        format!("$KV.{}.{}", self.bucket, key(shard))
    }

    /// Gives `lease` up at once (a drain), so another node may take it without waiting
    /// for it to expire; nothing if it had passed already.
    ///
    /// # Errors
    ///
    /// The server did not answer.
    pub fn release(&self, lease: Lease) -> anyhow::Result<()> {
        let store = self.store.clone();
        self.io.run(async move {
            match store.delete_expect_revision(key(lease.shard), Some(lease.revision)).await {
                Ok(()) => Ok(()),
                Err(error) if error.kind() == kv::DeleteErrorKind::WrongLastRevision => Ok(()),
                Err(error) => Err(anyhow::anyhow!("cannot give up the lease of shard {}: {error}", lease.shard)),
            }
        })?
    }

    /// Says this node takes part (the key `node.NAME`, living as long as a lease): how
    /// hosts count each other to share the shards fairly. Said again as often as the
    /// leases are renewed, so a node lost stops being counted when its leases pass, and
    /// the others take its shards then rather than a share later.
    ///
    /// # Errors
    ///
    /// The server did not answer or refused.
    pub fn announce(&self) -> anyhow::Result<()> {
        let context = self.context.clone();
        let subject = format!("$KV.{}.node.{}", self.bucket, self.node);
        let ttl = self.ttl;
        self.io.run(async move {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-TTL", ttl.as_secs().to_string().as_str());
            context.publish_with_headers(subject, headers, bytes::Bytes::new()).await?.await?;
            Ok::<_, jetstream::context::PublishError>(())
        })??;
        Ok(())
    }

    /// Says this node takes part no more.
    ///
    /// # Errors
    ///
    /// The server did not answer or refused.
    pub fn leave(&self) -> anyhow::Result<()> {
        let store = self.store.clone();
        let name = format!("node.{}", self.node);
        self.io.run(async move { store.delete(name).await })??;
        Ok(())
    }

    /// Every shard held now, and the node holding it.
    ///
    /// # Errors
    ///
    /// The server did not answer.
    pub fn owners(&self) -> anyhow::Result<BTreeMap<u32, String>> {
        Ok(self.shares()?.owners)
    }

    /// Who holds which shard, and how many nodes take part: one listing of the bucket,
    /// for a host that weighs its fair share.
    ///
    /// # Errors
    ///
    /// The server did not answer.
    pub fn shares(&self) -> anyhow::Result<Shares> {
        let store = self.store.clone();
        self.io.run(async move {
            let mut keys = store.keys().await.map_err(|e| anyhow::anyhow!("cannot list the leases: {e}"))?;
            let mut names = Vec::new();
            while let Some(name) = keys.next().await {
                names.push(name.map_err(|e| anyhow::anyhow!("cannot list the leases: {e}"))?);
            }
            let mut shares = Shares { owners: BTreeMap::new(), nodes: 0 };
            for name in names {
                if name.starts_with("node.") {
                    shares.nodes += 1;
                    continue;
                }
                let Some(shard) = name.strip_prefix("shard.").and_then(|n| n.parse::<u32>().ok()) else { continue };
                if let Some(entry) =
                    store.entry(&name).await.map_err(|e| anyhow::anyhow!("cannot read a lease: {e}"))?
                    && entry.operation == kv::Operation::Put
                {
                    shares.owners.insert(shard, String::from_utf8_lossy(&entry.value).into_owned());
                }
            }
            Ok(shares)
        })?
    }
}
