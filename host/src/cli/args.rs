//! The groups of flags more than one subcommand takes, each a heading of `--help`:
//! [`EngineArgs`] (`run`, `node`, `inspect`, `compile`, `journal`), [`LimitArgs`] and
//! [`GrantArgs`] (`run` and `node`), and [`ClusterArgs`] (`run`, `node`, `cluster`). The
//! providers' flags, which `run` and `node` share too, are `providers.rs`' own.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use wasmproc::cluster::ClusterConfig;
use wasmproc::scheduler::{self, Builder};
use wasmproc::wasm::{self, Config};

use super::{Exit, Failure, units};

/// Engine settings that compiled code depends on: `compile` and `run` must agree.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Engine and compiled code")]
pub(crate) struct EngineArgs {
    /// Linear memory cap of each process, e.g. 64MiB or 1GiB. Also each process's share
    /// of address space: processes × memory must fit in 128 TiB.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(wasm::DEFAULT_MAX_MEMORY), value_parser = units::memory)]
    pub(super) memory: usize,
    /// Total fuel of each process over its life (about one unit per Wasm instruction),
    /// at least 1; a process that uses it up fails. Turns on fuel metering, which slows
    /// guests somewhat. [default: unlimited, no metering]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) fuel: Option<u64>,
    /// Keep compiled code out of the disk cache ($XDG_CACHE_HOME/wasmproc or
    /// ~/.cache/wasmproc): compile afresh and write nothing.
    #[arg(long)]
    pub(super) no_cache: bool,
    /// The largest program file accepted, e.g. 128MiB: a larger file is refused before
    /// it is read or compiled.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(wasm::DEFAULT_MAX_MODULE_SIZE), value_parser = units::size)]
    pub(super) max_module_size: usize,
    /// The most functions compiled for one program (its core modules' functions plus a
    /// component's lifts and lowers); a program with more is refused before compiling.
    #[arg(long, value_name = "N", default_value_t = wasm::DEFAULT_MAX_FUNCTIONS)]
    pub(super) max_functions: u32,
    /// The largest function body compiled, e.g. 1MiB; a program with a larger one is
    /// refused before compiling.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(wasm::DEFAULT_MAX_FUNCTION_SIZE), value_parser = units::size)]
    pub(super) max_function_size: usize,
    /// The most the compiled-code cache may hold, e.g. 1GiB: after each write the least
    /// recently used entries are removed until the rest fit. Also read from
    /// $WASMPROC_CACHE_MAX_SIZE. [default: 1GiB]
    #[arg(long, value_name = "SIZE", value_parser = units::size)]
    pub(super) cache_max_size: Option<usize>,
    /// Load files made by `wasmproc compile` with another user's key (or on another
    /// machine): they are native code, so only files from a source you trust as you
    /// trust a binary.
    #[arg(long)]
    pub(super) trust_precompiled: bool,
}

/// The variable that sets `--cache-max-size` when the flag is not given.
pub(super) const CACHE_MAX_SIZE_VAR: &str = "WASMPROC_CACHE_MAX_SIZE";

/// The cache's size cap: `flag`, else $WASMPROC_CACHE_MAX_SIZE, else `None` (the
/// library's default).
pub(super) fn cache_max_size(flag: Option<usize>) -> Result<Option<u64>, Failure> {
    if let Some(bytes) = flag {
        return Ok(Some(bytes as u64));
    }
    match std::env::var(CACHE_MAX_SIZE_VAR) {
        Ok(text) => units::size(&text)
            .map(|bytes| Some(bytes as u64))
            .map_err(|e| Failure::new(Exit::Usage, format!("${CACHE_MAX_SIZE_VAR}: {e}"))),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Failure::new(Exit::Usage, format!("${CACHE_MAX_SIZE_VAR} is not UTF-8: write a size like 1GiB")))
        }
    }
}

impl EngineArgs {
    /// The runtime's settings; `Err` if $WASMPROC_CACHE_MAX_SIZE is not a size.
    pub(super) fn config(&self) -> Result<Config, Failure> {
        let mut config = Config::default()
            .max_memory(self.memory)
            .max_module_size(self.max_module_size)
            .max_functions(self.max_functions)
            .max_function_size(self.max_function_size);
        if self.trust_precompiled {
            // SAFETY: `trust_precompiled` asks that every precompiled file the runtime
            // loads come from a trusted source: the user vouches for that by passing
            // --trust-precompiled, whose help says the files are native code to trust as
            // a binary.
            config = unsafe { config.trust_precompiled(true) };
        }
        if let Some(fuel) = self.fuel {
            config = config.fuel(fuel);
        }
        if self.no_cache {
            config = config.no_disk_cache();
        }
        if let Some(bytes) = cache_max_size(self.cache_max_size)? {
            config = config.max_cache_size(bytes);
        }
        Ok(config)
    }
}

/// The scheduler's limits on the processes of a run (`run`), or of every run a node
/// runs (`node`: a run's own, carried to the node, are clamped to these).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Limits")]
pub(crate) struct LimitArgs {
    /// The most processes alive at once; spawns past it fail (in the spawning process).
    /// With `run --cluster`: the run's processes alive at once on each node (each node
    /// counts its own, under its own --max-processes).
    #[arg(long, value_name = "N", default_value_t = wasm::DEFAULT_MAX_INSTANCES, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) max_processes: u32,
    /// The most live children one process may have; a spawn past it ends that process.
    #[arg(long, value_name = "N", default_value_t = scheduler::DEFAULT_MAX_CHILDREN)]
    pub(super) max_children: usize,
    /// The most processes one process may be linked to at once; a link past it fails
    /// (the `link` command's error names the limit).
    #[arg(long, value_name = "N", default_value_t = scheduler::DEFAULT_MAX_LINKS)]
    pub(super) max_links: usize,
    /// The most commands one step may yield; a step past it ends its process.
    #[arg(long, value_name = "N", default_value_t = scheduler::DEFAULT_MAX_YIELDS_PER_STEP, value_parser = units::positive)]
    pub(super) max_yields: usize,
    /// The largest payload a process may send, spawn with, pass to a command or return,
    /// e.g. 16MiB; past it the process ends.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(scheduler::DEFAULT_MAX_PAYLOAD_SIZE), value_parser = units::size)]
    pub(super) max_payload: usize,
    /// The most bytes one step's commands and result may carry together, e.g. 64MiB; past
    /// it the process ends. At least --max-payload. [default: 4 × --max-payload]
    #[arg(long, value_name = "SIZE", value_parser = units::size)]
    pub(super) max_step_output: Option<usize>,
    /// Messages a process's mailbox holds; a send to a full mailbox fails for the sender.
    #[arg(long, value_name = "N", default_value_t = scheduler::DEFAULT_MAILBOX_CAPACITY, value_parser = units::positive)]
    pub(super) mailbox: usize,
    /// The bytes of undelivered messages (topics and bodies) a process's mailbox holds,
    /// e.g. 64MiB; a send past it fails for the sender, as a send to a full mailbox. An
    /// empty mailbox takes any one message.
    #[arg(long, value_name = "SIZE", default_value = units::size_text(scheduler::DEFAULT_MAILBOX_BYTES), value_parser = units::nonzero_size)]
    pub(super) mailbox_bytes: usize,
    /// How long a process must have waited (for a message, a timer, a command) before
    /// a worker with nothing else to run hibernates it: a Wasm process gives back its
    /// whole instance, keeping only the pages of its memory that differ from its
    /// component's initial image, and its next event makes it again (tens of
    /// microseconds). --stats counts hibernations.
    #[arg(long, value_name = "DURATION", default_value = units::duration_text(scheduler::DEFAULT_HIBERNATE_AFTER), value_parser = units::duration)]
    pub(super) hibernate_after: Duration,
    /// A hibernating Wasm process gives back only its fiber stack's pages and keeps its
    /// instance.
    #[arg(long)]
    pub(super) no_hibernate_instances: bool,
}

impl LimitArgs {
    /// Refuses a --max-step-output below --max-payload: one payload must fit in a step.
    pub(super) fn check(&self) -> Result<(), Failure> {
        match self.max_step_output {
            Some(bytes) if bytes < self.max_payload => Err(Failure::new(
                Exit::Usage,
                format!(
                    "--max-step-output ({bytes} bytes) must be at least --max-payload ({} bytes)",
                    self.max_payload
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `config` with room for --max-processes instances.
    pub(super) fn runtime(&self, config: Config) -> Config {
        config.max_instances(self.max_processes).hibernate_instances(!self.no_hibernate_instances)
    }

    /// `builder` under these limits.
    pub(super) fn scheduler(&self, builder: Builder) -> Builder {
        let builder = builder
            .max_processes(self.max_processes as usize)
            .max_children(self.max_children)
            .max_links(self.max_links)
            .max_yields_per_step(self.max_yields)
            .max_payload_size(self.max_payload)
            .mailbox_capacity(self.mailbox)
            .mailbox_bytes(self.mailbox_bytes)
            .hibernate_after(self.hibernate_after);
        match self.max_step_output {
            Some(bytes) => builder.max_output_per_step(bytes),
            None => builder,
        }
    }
}

/// The host's directories and environment processes get (and, with `run`, a WASI
/// command).
#[derive(Args, Debug)]
#[command(next_help_heading = "Files and environment")]
pub(crate) struct GrantArgs {
    /// Give the host directory HOST, read-only, as GUEST (default: the same path): to
    /// processes through the `fs.*` commands (on a node, to those of every run), and to
    /// a WASI command (`run`) through WASI. Repeatable.
    #[arg(long, value_name = "HOST[::GUEST]")]
    pub(super) dir: Vec<String>,
    /// As --dir, writable. A WASI command may create symbolic links in it that point
    /// anywhere: it cannot follow them out of the directory, but a host tool that later
    /// walks the directory following links would (see SECURITY.md).
    #[arg(long, value_name = "HOST[::GUEST]")]
    pub(super) dir_rw: Vec<String>,
    /// Set NAME=VALUE, or pass NAME through from the host's environment: what processes
    /// read with `env.get` (on a node, those of every run), and a WASI command's (`run`)
    /// environment. Repeatable.
    #[arg(long, value_name = "NAME[=VALUE]")]
    pub(super) env: Vec<String>,
}

/// How to reach a cluster, and as whom. Each flag but `--cluster`, when not given, is
/// read from its environment variable (`WASMPROC_` and the flag's name in capitals, `-`
/// as `_`).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Cluster")]
pub(crate) struct ClusterArgs {
    /// The NATS server of the cluster, e.g. nats://127.0.0.1:4222; with a user and
    /// password nats://USER:PASSWORD@HOST:PORT; with TLS tls://HOST:PORT.
    #[arg(long = "cluster", value_name = "URL")]
    pub(super) url: Option<String>,
    /// The secret the cluster's nodes (and the clients that run on them) share: every
    /// frame between them is authenticated with it (HMAC-SHA256 over the frame and its
    /// subjects), and a frame that does not verify is dropped. Whoever holds it can act
    /// as a node: give clients NATS client credentials instead where the server can tell
    /// the two apart (see README, "A secured cluster"). Also read from
    /// $WASMPROC_CLUSTER_SECRET. [default: none]
    #[arg(long, value_name = "SECRET")]
    cluster_secret: Option<String>,
    /// A NATS authentication token. Also read from $WASMPROC_CLUSTER_TOKEN.
    #[arg(long, value_name = "TOKEN")]
    cluster_token: Option<String>,
    /// A NATS credentials file: a user's JWT and NKey seed, as `nsc generate creds`
    /// writes it. Also read from $WASMPROC_CLUSTER_CREDS.
    #[arg(long, value_name = "FILE")]
    cluster_creds: Option<PathBuf>,
    /// A file holding a NATS user's NKey seed (SU…), for a server that lists users by
    /// NKey. Also read from $WASMPROC_CLUSTER_NKEY.
    #[arg(long, value_name = "FILE")]
    cluster_nkey: Option<PathBuf>,
    /// TLS to the server, trusting the CA certificate(s) of this PEM file (instead of
    /// the system's roots). Also read from $WASMPROC_CLUSTER_CA.
    #[arg(long, value_name = "FILE")]
    cluster_ca: Option<PathBuf>,
    /// A TLS client certificate (PEM), with --cluster-key, for a server that verifies
    /// its clients. Also read from $WASMPROC_CLUSTER_CERT.
    #[arg(long, value_name = "FILE")]
    cluster_cert: Option<PathBuf>,
    /// The key of --cluster-cert (PEM). Also read from $WASMPROC_CLUSTER_KEY.
    #[arg(long, value_name = "FILE")]
    cluster_key: Option<PathBuf>,
    /// The prefix of the subjects this connection gets its answers on (NATS's inbox
    /// prefix), for a server that lets each user read only its own: e.g. _INBOX_alice
    /// for a user allowed to subscribe to _INBOX_alice.>. Also read from
    /// $WASMPROC_CLUSTER_INBOX. [default: _INBOX]
    #[arg(long, value_name = "PREFIX")]
    cluster_inbox: Option<String>,
}

impl ClusterArgs {
    /// The flag's value, or its environment variable's.
    fn or_env(flag: &Option<String>, var: &str) -> Option<String> {
        flag.clone().or_else(|| std::env::var(var).ok().filter(|v| !v.is_empty()))
    }

    pub(super) fn config(&self) -> Result<ClusterConfig, Failure> {
        let url = self.url.clone().ok_or_else(|| Failure::new(Exit::Usage, "--cluster URL is required"))?;
        let mut config = ClusterConfig::new(url);
        if let Some(secret) = Self::or_env(&self.cluster_secret, "WASMPROC_CLUSTER_SECRET") {
            config = config.secret(secret);
        }
        if let Some(token) = Self::or_env(&self.cluster_token, "WASMPROC_CLUSTER_TOKEN") {
            config = config.token(token);
        }
        let file = |flag: &Option<PathBuf>, name: &str, var: &str| -> Result<Option<PathBuf>, Failure> {
            let path = flag.clone().or_else(|| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from));
            match path {
                Some(path) if !path.is_file() => {
                    Err(Failure::new(Exit::Usage, format!("{name} `{}`: no such file", path.display())))
                }
                path => Ok(path),
            }
        };
        if let Some(path) = file(&self.cluster_creds, "--cluster-creds", "WASMPROC_CLUSTER_CREDS")? {
            config = config.creds(path);
        }
        if let Some(path) = file(&self.cluster_nkey, "--cluster-nkey", "WASMPROC_CLUSTER_NKEY")? {
            config = config.nkey(path);
        }
        if let Some(path) = file(&self.cluster_ca, "--cluster-ca", "WASMPROC_CLUSTER_CA")? {
            config = config.tls_ca(path);
        }
        let cert = file(&self.cluster_cert, "--cluster-cert", "WASMPROC_CLUSTER_CERT")?;
        let key = file(&self.cluster_key, "--cluster-key", "WASMPROC_CLUSTER_KEY")?;
        match (cert, key) {
            (Some(cert), Some(key)) => config = config.tls_client(cert, key),
            (None, None) => {}
            (Some(_), None) => return Err(Failure::new(Exit::Usage, "--cluster-cert needs --cluster-key")),
            (None, Some(_)) => return Err(Failure::new(Exit::Usage, "--cluster-key needs --cluster-cert")),
        }
        if let Some(inbox) = Self::or_env(&self.cluster_inbox, "WASMPROC_CLUSTER_INBOX") {
            config = config.inbox(inbox);
        }
        Ok(config)
    }
}
