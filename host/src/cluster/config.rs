//! How to join a cluster ([`ClusterConfig`], [`Placement`]), the timings and bounds every
//! node and client keeps, and connecting to the NATS server with the config's
//! credentials and TLS settings.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// How often a node announces itself (its heartbeat).
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// How long a node may go unheard before it is lost: four heartbeats. A monitor of a
/// process on a node that dies gets its `noconnection` exit within this plus one
/// heartbeat.
pub const LOSS_AFTER: Duration = Duration::from_secs(2);
/// How long unacknowledged items wait before they are sent again.
pub const RETRANSMIT_AFTER: Duration = Duration::from_secs(1);
/// The most messages queued or unacknowledged towards other nodes at once; a send past
/// it fails ([`SendError::Cluster`]) instead of
/// growing memory. Picked out of thin air: ~100 MiB of 1 KiB messages.
pub const MAX_BACKLOG: usize = 100_000;
/// The most monitors, terminations and spawns queued for the cluster's thread at once
/// (messages are bounded by [`MAX_BACKLOG`]); one past it fails at once instead of
/// growing memory while the thread is held up. Picked out of thin air, as that.
pub const MAX_QUEUED: usize = 100_000;
/// The most guest lines queued or unacknowledged towards other nodes at once; a line
/// past it is dropped and counted ([`ClusterStats::log_lines_dropped`](super::ClusterStats::log_lines_dropped)), so a process
/// that logs without end cannot grow a node's memory. Picked out of thin air: up to
/// 160 MiB of the longest lines, a few MiB of usual ones.
pub const MAX_LOG_BACKLOG: usize = 10_000;
/// How long the processes of a run whose node left or was lost have to end once
/// cancelled, before they are terminated ([`ClusterConfig::grace`]).
pub const GRACE: Duration = Duration::from_millis(500);
/// How long a joining node listens for the others before it picks its id.
pub(super) const JOIN_WAIT: Duration = Duration::from_millis(300);

/// Checks the name of a JetStream stream or bucket (`what`, as the error names it: "stream",
/// "lease bucket", …) and the replicas it is created with: what the server would refuse
/// less clearly, or accept and then fail on.
///
/// # Errors
///
/// A name that is empty or holds anything but ASCII letters, digits, `-` and `_`, or
/// replicas outside 1 to 5.
pub(super) fn check_stored(what: &str, name: &str, replicas: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "invalid {what} name `{name}`: letters, digits, `-` and `_`"
    );
    anyhow::ensure!((1..=5).contains(&replicas), "a {what} has 1 to 5 replicas, not {replicas}");
    Ok(())
}

/// Where a `spawn` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// Every spawn stays on the spawning node (the default).
    #[default]
    Local,
    /// Every spawn goes to the node with the fewest live processes, this one included.
    LeastLoaded,
}

/// How to join a cluster.
#[derive(Clone)]
pub struct ClusterConfig {
    pub(super) url: String,
    pub(super) name: Option<String>,
    pub(super) secret: Vec<u8>,
    pub(super) token: Option<String>,
    pub(super) creds: Option<PathBuf>,
    pub(super) nkey: Option<PathBuf>,
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) tls_client: Option<(PathBuf, PathBuf)>,
    pub(super) inbox: String,
    pub(super) prefix: String,
    pub(super) placement: Placement,
    pub(super) accepts: bool,
    pub(super) grace: Duration,
    pub(super) share_components: bool,
    pub(super) insecure: bool,
    /// [`MAX_QUEUED`]; lower only in tests, which fill the queue.
    pub(super) max_queued: usize,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("url", &self.redacted_url())
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("placement", &self.placement)
            .field("accepts", &self.accepts)
            .field("grace", &self.grace)
            .field("creds", &self.creds)
            .field("nkey", &self.nkey)
            .field("tls_ca", &self.tls_ca)
            .field("tls_client", &self.tls_client)
            .field("inbox", &self.inbox)
            .field("share_components", &self.share_components)
            .field("insecure", &self.insecure)
            .finish_non_exhaustive()
    }
}

impl ClusterConfig {
    /// The NATS server at `url` (`nats://HOST:PORT`; `nats://USER:PASSWORD@HOST:PORT` for
    /// a server with users; `tls://HOST:PORT` for TLS), with the defaults below.
    pub fn new(url: impl Into<String>) -> Self {
        ClusterConfig {
            url: url.into(),
            name: None,
            secret: Vec::new(),
            token: None,
            creds: None,
            nkey: None,
            tls_ca: None,
            tls_client: None,
            inbox: "_INBOX".to_owned(),
            prefix: "wasmproc".to_owned(),
            placement: Placement::Local,
            accepts: true,
            grace: GRACE,
            share_components: false,
            insecure: false,
            max_queued: MAX_QUEUED,
        }
    }

    /// The bound of the commands queued for the cluster's thread, lowered from
    /// [`MAX_QUEUED`] so that a test can fill the queue.
    #[cfg(test)]
    pub(crate) fn max_queued(mut self, max: usize) -> Self {
        self.max_queued = max;
        self
    }

    /// The node's name, unique in the cluster. By default `HOSTNAME-PID`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The secret every node of the cluster shares: frames are authenticated with it.
    /// By default empty, which authenticates nothing (rely on NATS credentials then).
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.secret = secret.as_ref().to_vec();
        self
    }

    /// A NATS authentication token. By default none.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A NATS credentials file (a user JWT and its NKey seed, as `nsc` writes them). By
    /// default none.
    pub fn creds(mut self, path: impl Into<PathBuf>) -> Self {
        self.creds = Some(path.into());
        self
    }

    /// A file holding a NATS user's NKey seed (`SU…`). By default none.
    pub fn nkey(mut self, path: impl Into<PathBuf>) -> Self {
        self.nkey = Some(path.into());
        self
    }

    /// TLS to the server, trusting the CA certificates in the PEM file `ca`. By default
    /// the system's roots, and TLS only with a `tls://` URL or a server that asks for it.
    pub fn tls_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(ca.into());
        self
    }

    /// A TLS client certificate and its key (PEM files), for a server that verifies
    /// clients. By default none.
    pub fn tls_client(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_client = Some((cert.into(), key.into()));
        self
    }

    /// The prefix of the subjects this connection receives answers on (NATS's inbox
    /// prefix): a server whose users may read only their own answers gives each its
    /// own, e.g. `_INBOX_alice`. By default `_INBOX`.
    pub fn inbox(mut self, prefix: impl Into<String>) -> Self {
        self.inbox = prefix.into();
        self
    }

    /// Whether a component fetched by hash for one run may be spawned by hash in any
    /// other run on this node. By default no: only within the run (process tree) that
    /// brought it.
    pub fn share_components(mut self, shared: bool) -> Self {
        self.share_components = shared;
        self
    }

    /// Whether this node may join with no authentication at all: no secret, no NATS
    /// credentials (token, user and password, NKey, credentials file) and no TLS client
    /// certificate, so that anyone who reaches the server can run code on it. By
    /// default no: [`Cluster::join`] refuses.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// Whether anything authenticates this connection or its frames.
    pub fn authenticates(&self) -> bool {
        !self.secret.is_empty()
            || self.token.is_some()
            || self.creds.is_some()
            || self.nkey.is_some()
            || self.tls_client.is_some()
            || self.url_user().is_some()
    }

    /// The user of a `scheme://USER[:PASSWORD]@HOST` URL.
    fn url_user(&self) -> Option<&str> {
        let rest = self.url.split_once("://").map_or(self.url.as_str(), |(_, rest)| rest);
        let authority = rest.split(['/', ',']).next().unwrap_or(rest);
        authority.rsplit_once('@').map(|(user, _)| user).filter(|user| !user.is_empty())
    }

    /// The URL without its user and password, and those: NATS's convention is
    /// `USER:PASSWORD@` for a user, `TOKEN@` for a token (the client takes neither from
    /// the URL itself).
    pub(crate) fn url_credentials(&self) -> (String, Option<(String, Option<String>)>) {
        match (self.url_user(), self.url.split_once("://")) {
            (Some(user), Some((scheme, rest))) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                let credentials = match user.split_once(':') {
                    Some((name, password)) => (name.to_owned(), Some(password.to_owned())),
                    None => (user.to_owned(), None),
                };
                (format!("{scheme}://{host}"), Some(credentials))
            }
            _ => (self.url.clone(), None),
        }
    }

    /// The URL without its password, to name in messages.
    pub(crate) fn redacted_url(&self) -> String {
        match (self.url_user(), self.url.split_once("://")) {
            (Some(user), Some((scheme, rest))) => {
                let name = user.split_once(':').map_or(user, |(name, _)| name);
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!("{scheme}://{name}:***@{host}")
            }
            _ => self.url.clone(),
        }
    }

    /// Refuses a node that authenticates nothing, unless it is [`insecure`](Self::insecure).
    pub(super) fn check_authenticated(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.insecure || self.authenticates(),
            "this node would join the cluster at `{}` with no authentication at all, so that anyone who \
             reaches the NATS server could run code on it: give NATS credentials (`--cluster-creds`, \
             `--cluster-nkey`, `--cluster-token`, or a user in the URL), a TLS client certificate \
             (`--cluster-cert` and `--cluster-key`), or a shared `--cluster-secret`; or `--insecure` to \
             run it open",
            self.redacted_url()
        );
        Ok(())
    }

    /// The first word of every subject the cluster uses, so several clusters can share
    /// one server. By default `wasmproc`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Where spawns go. By default [`Placement::Local`].
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Whether other nodes may place spawns here. By default yes; a client that only
    /// starts work elsewhere (`wasmproc run --cluster`) says no.
    pub fn accepts_spawns(mut self, accepts: bool) -> Self {
        self.accepts = accepts;
        self
    }

    /// How long the processes here of another node's run have to end, once cancelled
    /// because that node left or was lost, before they are terminated. By default
    /// [`GRACE`].
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
}

/// When a peer was last heard from: a node by its heartbeats, a client's session (on a
/// node) and a node's session (on a client) by their keepalives and the answers to
/// them. Every side judges alike: a peer silent for longer than [`LOSS_AFTER`] is lost.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heard(Instant);

impl Heard {
    /// Heard from at `now`.
    pub(super) fn at(now: Instant) -> Self {
        Heard(now)
    }

    /// Heard from again at `now` (or given a fresh allowance then).
    pub(super) fn again(&mut self, now: Instant) {
        self.0 = now;
    }

    /// Whether it has been silent too long at `now`.
    pub(super) fn is_lost(&self, now: Instant) -> bool {
        now.duration_since(self.0) > LOSS_AFTER
    }
}

/// Called with `true` on each (re)connection to the server, `false` on each
/// disconnection.
pub(super) type ConnectionEvents = Arc<dyn Fn(bool) + Send + Sync>;

/// Connects to the server of `config` with its credentials and TLS settings; `events`
/// hears of disconnections and reconnections.
pub(super) async fn connect(
    config: &ClusterConfig,
    events: Option<ConnectionEvents>,
) -> anyhow::Result<async_nats::Client> {
    let mut options = async_nats::ConnectOptions::new()
        .name("wasmproc")
        .connection_timeout(Duration::from_secs(5))
        // Reconnect for ever, quickly: the links resend what a reconnection lost.
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| Duration::from_millis((50 * attempts as u64).min(1000)))
        // Frames a subscription holds before the client drops the next ones (a slow
        // consumer): with frames of at most the server's 1 MiB, what one subject's flood
        // can make a node hold. A node takes frames off far faster than links fill it.
        .subscription_capacity(SUBSCRIPTION_CAPACITY)
        .custom_inbox_prefix(config.inbox.clone());
    let (url, credentials) = config.url_credentials();
    match credentials {
        Some((user, Some(password))) => options = options.user_and_password(user, password),
        Some((token, None)) => options = options.token(token),
        None => {}
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(path) = &config.creds {
        options = options
            .credentials_file(path)
            .await
            .with_context(|| format!("failed to read the NATS credentials file `{}`", path.display()))?;
    }
    if let Some(path) = &config.nkey {
        let seed = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read the NKey seed file `{}`", path.display()))?;
        let seed = seed.lines().map(str::trim).find(|l| l.starts_with("SU")).with_context(|| {
            format!("the NKey seed file `{}` holds no user seed (a line starting with `SU`)", path.display())
        })?;
        options = options.nkey(seed.to_owned());
    }
    if let Some(ca) = &config.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &config.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
    }
    if let Some(events) = events {
        options = options.event_callback(move |event| {
            let events = events.clone();
            async move {
                match event {
                    async_nats::Event::Connected => events(true),
                    async_nats::Event::Disconnected => events(false),
                    async_nats::Event::ServerError(error) => {
                        tracing::warn!(%error, "the NATS server refused something this node did")
                    }
                    other => tracing::debug!(event = %other, "NATS client event"),
                }
            }
        });
    }
    let shown = config.redacted_url();
    let client = tokio::time::timeout(Duration::from_secs(5), options.connect(url.as_str()))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from the NATS server at `{shown}` within 5 s"))?;
    client.map_err(|error| {
        use async_nats::ConnectErrorKind as Kind;
        match error.kind() {
            Kind::AuthorizationViolation | Kind::Authentication => anyhow::anyhow!(
                "authentication failed: the NATS server at `{shown}` refused this connection's credentials ({error})"
            ),
            Kind::Tls => {
                anyhow::anyhow!("authentication failed: TLS with the NATS server at `{shown}` failed ({error})")
            }
            _ => anyhow::Error::new(error).context(format!("failed to connect to the NATS server at `{shown}`")),
        }
    })
}

/// Frames a subscription holds: see [`connect`].
const SUBSCRIPTION_CAPACITY: usize = 8192;
